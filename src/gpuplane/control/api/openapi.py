"""The control API's OpenAPI document, made true where FastAPI's default is not.

FastAPI documents every 422 as its request validation error (`detail`: a list of errors). This
API's own 422s (a spec that can never run, a bad duration, a cluster that cannot be added:
`api.py`'s one error handler) carry `detail` as one message that names the fix, and an
infeasible job its `reasons` too. A client reading the document, and the schemathesis pass
over it (`tests/control/api/test_api_fuzz.py`), see both shapes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

ERROR = "HTTPValidationError"  # FastAPI's name for its 422 body, which every 422 refers to


def document_errors(app: FastAPI) -> None:
    """Serve `app`'s document with the 422 body as the API sends it (see the module)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        document = generate()  # built once, then FastAPI's cached copy
        schemas = document.get("components", {}).get("schemas", {})
        if ERROR in schemas:
            schemas[ERROR] = _error_body()
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def _error_body() -> dict[str, Any]:
    return {
        "title": ERROR,
        "type": "object",
        "required": ["detail"],
        "properties": {
            "detail": {
                "title": "Detail",
                "anyOf": [
                    {"type": "string", "description": "what was wrong and what to do"},
                    {"type": "array", "items": {"$ref": "#/components/schemas/ValidationError"}},
                ],
            },
            "reasons": {
                "title": "Reasons",
                "type": "array",
                "items": {"type": "object"},
                "description": "an infeasible job: why no cluster can ever run it",
            },
        },
    }
