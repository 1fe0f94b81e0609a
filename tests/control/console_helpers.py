"""The web console through its forms, as a browser uses it: log in with a token, read the
session's CSRF token off a page."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def login(http: TestClient, token: str) -> str:
    """Log `http` into the console with `token`; returns the session's CSRF token."""
    r = http.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return csrf_of(http.get("/ui").text)


def console_client(http: TestClient, token: str | None = None) -> tuple[TestClient, str]:
    """A new browser (its own cookies) on `http`'s app, logged in with `token` if given; its
    CSRF token ("" when not logged in). Redirects are not followed."""
    browser = TestClient(http.app, base_url=str(http.base_url), follow_redirects=False)
    return browser, (login(browser, token) if token else "")
