"""Decisions, pure: functions over frozen dataclasses that return decision dataclasses.

One concept per module (`actions.py`, `links.py`, `generation.py`, `transition.py`,
`overload.py`, `drop_plan.py`, `lookahead.py`, `module_scaling.py`, `batching.py`,
`switch_plan.py`, `switching.py`, ...). Nothing here does I/O or imports torch, grpc or kopf
(an import-linter contract keeps it so), so a cluster simulator can import them; the
operator, `tessera up`, the agent servicer (and its scheduler), the gateway and the benches
apply the decisions.
"""
