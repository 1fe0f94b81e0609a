"""Alembic migrations of the control-plane store; `gpuplane.control.store` runs them on start."""
