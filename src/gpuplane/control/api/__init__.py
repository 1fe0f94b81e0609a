"""The control plane's HTTP API: the app (`app.py`), its edge middleware (`edge.py`) and its
OpenAPI document's corrections (`openapi.py`)."""
