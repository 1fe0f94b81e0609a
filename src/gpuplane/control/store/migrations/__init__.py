"""Alembic migrations of the control-plane store; `store/store.py` runs them on start."""
