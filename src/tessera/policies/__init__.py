"""Pure decision functions of the elastic control loops (one concept per module).

Each module takes frozen dataclasses describing what is observed and wanted and returns a
decision dataclass; the operator, the agents, the gateway and `tessera up` only apply
them. Nothing here does I/O or imports torch, kopf or grpc (import-linter enforces it).
"""
