"""Measured, never served: trace replay (simulate), workload mixes, deployment drills and faults."""
