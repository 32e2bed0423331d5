"""Planner: which replicas to run and which share of each workload class each one serves.

Pure code (no I/O besides the thin readers in ``manifest`` and ``cluster`` that turn
already-decoded documents into dataclasses). Callers: the CLI (``tessera plan``), the
operator's reconcile core for ``layout: auto`` (``search.plan``) and the gateway's
per-class routing hook (``Deployment.shares``). Two levels: ``assign``, an exact LP (HiGHS)
splitting each class's demand over given replicas, with an optimality certificate
(``assign_flow`` cross-checks it by max-flow where that form is exact); and ``search``,
heterogeneous replicas with their own GPU count and (tp, pp) improved by flow-guided moves
(``exhaustive`` and ``homogeneous``: the optimum and the baseline on small clusters).
Design and figures: docs/planner.md.
"""
