"""Pure elastic policies: decisions over frozen dataclasses, applied elsewhere.

One concept per module (`overload.py`, `drop_plan.py`, `lookahead.py`,
`module_scaling.py`, `batching.py`, ...). Nothing here does I/O or imports torch, grpc or
kopf, so a cluster simulator can import them; the operator, the agent servicer (and its
scheduler), the gateway and the benches apply the decisions.
"""
