"""The OpenAI-compatible HTTP gateway: a client of the agents' `Generate` RPC.

Entry points: `tessera.gateway.server.start_gateway` (called in-process by `tessera up`
and by `tessera gateway`) with a `tessera.gateway.config.GatewayConfig`. The package never
imports torch, transformers, kopf, the agent or the operator: tokenization uses the
`tokenizers` library and agents are reached only over gRPC. See docs/gateway.md.
"""
