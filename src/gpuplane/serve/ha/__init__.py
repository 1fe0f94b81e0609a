"""Gateway high availability: lease stores for primary/standby and the shared slot table of
multi-active gateways (`shared.py`)."""
