"""Pure elastic policies: decisions over frozen dataclasses, applied elsewhere.

Grouped by the loop they serve: ``switching/`` (OServe), ``transition/`` (live
reconfiguration), ``overload/`` (KunServe), ``scaling/`` (CoCoServe and replica autoscaling),
``routing/``, ``variants/`` (BlockLLM), ``serving/`` (what an agent runs next) and
``security/``; ``placement``, ``links``, ``device_links`` and ``pass_reason`` are shared.
Nothing here does I/O or imports torch, grpc or kopf (an import-linter contract keeps it so),
so the simulator can import them; the control loops, the agent, the gateway and the benches
apply the decisions.
"""
