"""Pure elastic policies: decisions over frozen dataclasses, applied elsewhere.

One concept per module: ``overload``, ``drop_plan``, ``lookahead``, ``module_scaling``,
``batching`` (what a replica runs next), ``routing`` (which replica serves a request),
``links`` (the link model a transfer plan is timed with), ``switch_plan`` (which device
sends each parameter shard when a deployment switches), ``switch_bound`` (the LP lower
bound on a switch's time), ``switching`` (whether a forecast pays for a switch), ...
Nothing here does I/O or imports torch, grpc or kopf (an import-linter contract keeps it
so), so a cluster simulator can import them; the operator, ``tessera up``, the agent
servicer (and its scheduler), the gateway and the benches apply the decisions.
"""
