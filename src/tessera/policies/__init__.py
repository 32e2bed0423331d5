"""Decisions, pure: functions over frozen dataclasses that return decision dataclasses.

One concept per module (`actions.py`, `links.py`, `transition.py`, ...). The operator,
`tessera up`, the agents and the gateway only apply what these return. No I/O, no torch,
kopf or grpc (an import-linter contract keeps it so).
"""
