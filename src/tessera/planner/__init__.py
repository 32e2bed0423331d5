"""Planner: which replicas to run and which share of each workload class each one serves.

Pure code (no I/O besides the thin readers in ``manifest`` and ``cluster`` that turn
already-decoded documents into dataclasses). Callers: the CLI (``tessera plan``), the
operator's reconcile core for ``layout: auto`` (``search.plan``) and the gateway's
per-class routing hook (``Deployment.shares``).

Two levels:

* ``assign`` -- the lower level: an exact LP (HiGHS) that splits each class's demand over
  given replicas, with an optimality certificate; ``assign_flow`` cross-checks it with a
  max-flow (preflow-push) where the flow form is exact.
* ``search`` -- the upper level: heterogeneous replicas with their own GPU count and
  (tp, pp), improved by flow-guided moves; ``exhaustive`` and ``homogeneous`` give the
  optimum and the baseline on small clusters.
"""
