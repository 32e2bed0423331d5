"""Pure elastic policies: decisions over frozen dataclasses, applied elsewhere.

One concept per module (`overload.py`, `drop_plan.py`, `lookahead.py`,
`module_scaling.py`, ...). Nothing here does I/O or imports torch, grpc or kopf; the
operator, the agent servicer, the gateway and the benches apply the decisions.
"""
