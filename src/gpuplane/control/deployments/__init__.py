"""Deployments: model versions served by engine instances that are jobs of the control plane.

`spec.py` (the YAML a user applies) → `reconcile.py` (pure: what to start, drain and stop) →
`controller.py` (the shell in the service: store rows, submit and cancel instance jobs, the
endpoints the gateway watches) → `routes.py` (the API, included by `control/api.py`).
"""
