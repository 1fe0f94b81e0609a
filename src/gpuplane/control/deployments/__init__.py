"""Deployments: model versions served by engine instances that are jobs of the control plane.

`spec.py` (the YAML a user applies) → `reconcile.py` (pure: what to start, drain and stop) →
`controller.py` (the shell in the service: store rows, carry plans out, handed `instances.py`
(start, discover, back-off), `loads.py` (the gateways' reports, autoscaling) and `spread.py`
(where a move goes)) → `watch.py` (the endpoints the gateway watches) → `routes.py` (the API,
included by `control/api.py`).
"""
