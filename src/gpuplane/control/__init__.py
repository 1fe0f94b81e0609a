"""The multi-cluster control plane: inventory, quotas, one queue and the scheduler core."""
