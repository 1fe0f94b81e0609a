"""The web console at `/ui`, above the tiers like the CLI: its pages (`pages.py`), the fleet's
(`fleet.py`: deployments, batch runs), batch runs read from disk (`runs.py`), the login sessions
(`sessions.py`) and the Jinja2 templates (`templates/`)."""
