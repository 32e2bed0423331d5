"""How `tessera up` shares the host's CPU cores between its gateway and its local agents.

Pure and torch-free. `tessera up` runs the gateway (HTTP, SSE, detokenizing, the gRPC
client) in its own process beside the agents it starts; on a CPU-only host the agents'
model threads and the gateway then compete for the same cores. A model step's OpenMP
threads wait for each other at every parallel region, so one that the OS deschedules to
run the gateway stalls the whole step. So, unless told otherwise, the agents leave one
core to the gateway (as vLLM's CPU backend reserves one for its API server), where the
host has more cores than agents; the rest are shared out evenly.

Measured on the 2-core VM (docs/benchmarks-log.md, "Issue 16 (seventh stop)"): one model thread
instead of two gave the same saturated throughput at 64 req/s and a lower median TPOT at
8 req/s (6.3-7.5 ms against 8.9-10.8 ms).
"""

from __future__ import annotations


def agent_threads(cpus: int, agents: int, requested: int = 0) -> int:
    """Torch threads per local agent: `requested` when set (> 0), else the host's cores
    less one for the gateway (when there are more cores than agents), split evenly,
    at least one."""
    if requested > 0:
        return requested
    if agents < 1:
        raise ValueError("agents: must be >= 1")
    cores = max(1, cpus)
    spare = cores - 1 if cores > agents else cores
    return max(1, spare // agents)
