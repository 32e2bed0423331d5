"""Which replica or block instance serves a request, and where a failed attempt goes.

Per-class shares, KV-owner-first dispatch (BlockLLM), block dispatch and retry classification.
Used by the gateway and the agents' block dispatch.
"""
