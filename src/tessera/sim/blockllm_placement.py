"""BlockLLM's locality-aware placement through a simulation: bytes across servers and P95
latency with `policies.variants.locality.place` on (locality) and off (frag-min).

Input: the analytic Llama-2-7B profile (H100), Azure-trace request lengths. The zoo:
`FAMILIES` foundations of 4 blocks of 8 layers plus `VARIANTS` fine-tunes replacing the last
block; a request's chain is (b0, b1, b2, last), family uniform, variant by Zipf(1). The
chains' traffic feeds the placement; `SERVERS` servers each hold 1.1x the zoo's bytes /
`SERVERS`, so some chains must cross. Per request and step, each block adds its profile
seconds (no batching contention) and each hop sends the hidden states: over the intra-node
link inside a server, else through the sender's one FIFO egress link. Two inter-server
links: the profile's InfiniBand and an assumed 25 Gb/s TCP (`TCP`). Every figure is a
simulation. Called by `tessera.sim.bench` (part `blockllm`, key `blockllm_placement`);
results in docs/variants.md, "Locality-aware placement".
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from typing import Any

from tessera.cost.profile import Link, Profile
from tessera.policies.variants import locality as placement_locality
from tessera.workload import traces

FAMILIES = 4
VARIANTS = 6
BLOCK_LAYERS = 8
SERVERS = 5
# An assumed commodity link between servers: 25 Gb/s and 200 us per message (a TCP / gRPC
# hop), beside the profile's InfiniBand (35 GB/s, 15 us). An assumption, not a measurement.
TCP = Link(bandwidth_bytes_per_s=25e9 / 8, latency_s=200e-6)
PAPER = (
    "BlockLLM §7.3, Fig. 26 (paper, 12 A100s): frag-min placement raises median latency "
    "+12.6 %, P95 +18.2 %, communication per request +73.4 %; locality-aware placement "
    "cuts inter-server communication by 72.3 %"
)


def zoo(profile: Profile) -> tuple[dict[str, float], list[tuple[tuple[str, ...], float]]]:
    """Block bytes, and every chain with its popularity (module docstring)."""
    mem = profile.memory
    layer = float(mem.layer_param_bytes) * BLOCK_LAYERS
    blocks: dict[str, float] = {}
    chains: list[tuple[tuple[str, ...], float]] = []
    raw = [1.0 / (k + 1) for k in range(VARIANTS + 1)]
    pop = [r / sum(raw) / FAMILIES for r in raw]
    for f in range(FAMILIES):
        names = [f"f{f}.b{i}" for i in range(4)]
        for i, n in enumerate(names):
            blocks[n] = layer + (mem.embedding_param_bytes if i == 0 else 0.0)
            blocks[n] += mem.lm_head_param_bytes if i == 3 else 0.0
        chains.append((tuple(names), pop[0]))
        for v in range(VARIANTS):
            own = f"f{f}.v{v}"
            blocks[own] = layer + mem.lm_head_param_bytes
            chains.append(((*names[:3], own), pop[v + 1]))
    return blocks, chains


def simulate(
    profile: Profile,
    requests: Sequence[tuple[float, int, int, tuple[str, ...]]],
    server_of: dict[str, str],
    inter: Link,
) -> dict[str, float]:
    """Event simulation of the requests (arrival, prompt, output, chain) on a placement."""
    act = float(profile.memory.activation_bytes_per_token)
    intra = profile.comm.intra_node
    egress: dict[str, float] = {}
    cross_bytes = 0.0
    done: list[float] = []
    # (time, seq, request index, step index, hop index, phase): phase 0 = the step's
    # hidden states reach block `hop`, phase 1 = that block has computed them. The egress
    # link is taken at phase 1's time, so transfers queue in the order they are ready.
    events: list[tuple[float, int, int, int, int, int]] = []
    for i, (t, _p, _o, _c) in enumerate(requests):
        heapq.heappush(events, (t, i, i, 0, 0, 0))
    seq = len(requests)
    while events:
        now, _, i, step, hop, phase = heapq.heappop(events)
        arrival, prompt, output, chain = requests[i]
        tokens = prompt if step == 0 else 1
        seq += 1
        if phase == 0:
            if step == 0:
                compute = BLOCK_LAYERS * profile.prefill.seconds(tokens, 1)
            else:
                compute = BLOCK_LAYERS * profile.decode.seconds(1, prompt + step, 1)
            heapq.heappush(events, (now + compute, seq, i, step, hop, 1))
        elif hop + 1 < len(chain):
            src, dst = server_of[chain[hop]], server_of[chain[hop + 1]]
            nbytes = tokens * act
            if src == dst:
                nxt = now + intra.transfer_seconds(nbytes)
            else:
                start = max(now, egress.get(src, 0.0))
                egress[src] = start + nbytes / inter.bandwidth_bytes_per_s
                nxt = egress[src] + inter.latency_s
                cross_bytes += nbytes
            heapq.heappush(events, (nxt, seq, i, step, hop + 1, 0))
        elif step + 1 < output:
            heapq.heappush(events, (now, seq, i, step + 1, 0, 0))
        else:
            done.append(now - arrival)
    done.sort()
    return {
        "p50_latency_s": done[len(done) // 2],
        "p95_latency_s": done[min(len(done) - 1, int(0.95 * len(done)))],
        "cross_server_bytes": cross_bytes,
    }


def placement_rows(profile: Profile, trace: str, quick: bool, rate: float) -> list[dict[str, Any]]:
    """Locality on vs off on the same request stream (module docstring)."""
    blocks, chains = zoo(profile)
    capacity = 1.1 * sum(blocks.values()) / SERVERS
    servers = {f"server{s}": capacity for s in range(SERVERS)}
    pool = traces.read_trace(trace)
    rng = random.Random(0)
    count = 150 if quick else 600
    out_cap = 64 if quick else 256
    stream: list[tuple[float, int, int, tuple[str, ...]]] = []
    t = 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        r = pool[rng.randrange(len(pool))]
        chain = rng.choices([c for c, _ in chains], [w for _, w in chains])[0]
        stream.append((t, max(1, r.input_tokens), max(1, min(out_cap, r.output_tokens)), chain))
    # the planner's view: each chain's traffic as the stream sends it
    seen: dict[tuple[str, ...], list[float]] = {}
    for _t, p, o, chain in stream:
        use = seen.setdefault(chain, [0.0, 0.0])
        use[0] += 1
        use[1] += (p + o - 1) * profile.memory.activation_bytes_per_token
    uses = [placement_locality.ChainUse(c, n, b / n) for c, (n, b) in sorted(seen.items())]
    links = {"profile_infiniband": profile.comm.inter_node, "tcp_25g": TCP}
    rows: list[dict[str, Any]] = []
    for link_name, link in links.items():
        got: dict[str, dict[str, Any]] = {}
        for locality in (False, True):
            plan = placement_locality.place(blocks, servers, uses, locality=locality)
            if plan.unplaced:
                raise ValueError(f"{plan.policy}: unplaced blocks {plan.unplaced}")
            res = simulate(profile, stream, dict(plan.server_of), link)
            row = {
                "label": "simulation",
                "placement": plan.policy,
                "inter_server_link": link_name,
                "servers": SERVERS,
                "blocks": len(blocks),
                "requests": len(stream),
                "rate_rps": rate,
                "cross_server_bytes": round(res["cross_server_bytes"]),
                "cross_server_hops": round(plan.cross_server_hops),
                "p50_latency_s": round(res["p50_latency_s"], 4),
                "p95_latency_s": round(res["p95_latency_s"], 4),
            }
            got[plan.policy] = row
            rows.append(row)
        off, on = got["frag_min"], got["locality"]
        cut = 1 - on["cross_server_bytes"] / off["cross_server_bytes"]
        rows.append(
            {
                "label": "simulation",
                "placement": "ratio",
                "inter_server_link": link_name,
                "cross_server_bytes_cut": round(cut, 3) if off["cross_server_bytes"] else None,
                "p95_latency_ratio_off_vs_on": round(off["p95_latency_s"] / on["p95_latency_s"], 3),
                "p50_latency_ratio_off_vs_on": round(off["p50_latency_s"] / on["p50_latency_s"], 3),
                "paper": PAPER,
            }
        )
    return rows
