"""Scaling: CoCoServe's module scaling (layer replication and migration) and replica autoscaling.

Module-scaling algorithms, their signal and speedup model, layer-run operations and request
splits; the replica autoscaler and where a new replica's blocks come from. Run by control/.
"""
