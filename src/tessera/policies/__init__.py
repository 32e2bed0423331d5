"""Decisions, pure: functions over frozen dataclasses that return decision dataclasses.

One concept per module (`actions.py`, `links.py`, `transition.py`, `overload.py`,
`drop_plan.py`, `lookahead.py`, `module_scaling.py`, `switch_plan.py`, `switching.py`,
...). The operator, `tessera up`, the agent servicer, the gateway and the benches only
apply what these return. No I/O, no torch, kopf or grpc (an import-linter contract keeps
it so).
"""
