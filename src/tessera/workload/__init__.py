"""Workload modelling: request traces, k-means request classes, per-class arrival forecasts.

Pure code over plain dataclasses and numpy arrays. The planner calls ``traces`` and
``classes`` to learn the request mix it plans for; the gateway writes Tessera's own JSONL
trace (``traces.append_jsonl``) and types requests with ``classes.WorkloadClasses``; the
``bench`` module (``tessera bench predictor``) measures the forecasters. ``torch`` is
imported only by ``lstm``; import modules, not names (``from tessera.workload import traces``).
"""
