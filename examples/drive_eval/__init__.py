"""The reference driving-evaluation workload: synthetic clips, a NumPy perception model, checks."""
