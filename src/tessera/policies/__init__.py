"""Policies: pure decisions over frozen dataclasses, one concept per module.

Each module turns observed or planned state into a decision dataclass; the operator, the
agent servicer and the gateway only apply them (no I/O here, no torch, kopf or grpc).
Modules: ``links`` (the link model a transfer plan is timed with), ``switch_plan`` (which
device sends each parameter shard when a deployment switches), ``switch_bound`` (the LP
lower bound on a switch's time), ``switching`` (whether a forecast pays for a switch).
"""
