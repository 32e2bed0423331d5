"""BlockLLM through the simulator: throughput and P95 latency with 3 to 20 fine-tuned
variants, shared blocks vs one copy per model.

Input: the analytic Llama-2-7B profile on 8 H100s (one instance per GPU, tp1), request
lengths from the shared Azure conversation trace, each request tagged with a variant of
Zipf(1) popularity. Output: the `blockllm_variants` rows of `tessera bench sim`; called by
`tessera.sim.bench`. Modes (memory from the cost model's `MemorySpec`): `per_model`, full
copies, ceil(V / 8) per GPU (`per_model_copies`), each variant in a step run through its
own weights; `shared_blocks`, variants share all but the last `SPECIFIC_LAYERS`, each GPU
holds the shared blocks once and several variants' specific ones (`shared_placement`), a
step batching everything through the shared blocks. Both dispatch new requests with the
real `policies.block_dispatch.choose`; running requests stay with their KV. Per-model
engines on a GPU share one KV pool and scheduler (optimistic for them). Every figure is a
simulation; results and reading: docs/simulation.md, "BlockLLM".
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from tessera.cost.latency import StageSpec
from tessera.cost.profile import Profile
from tessera.policies.routing import block_dispatch
from tessera.policies.serving import batching
from tessera.sim import arrivals, engine, report, setup
from tessera.sim.replica import SimReplica, SimRequest
from tessera.sim.steptime import StageCost, StepModel, layer_and_head, scaled
from tessera.workload import traces

GPUS = 8
GPU_MEMORY = 80 * 2**30
SPECIFIC_LAYERS = 4  # fine-tuned (unshared) layers per variant, of the model's 32


class VariantReplica(SimReplica):
    """One GPU serving several variants (module docstring)."""

    def __init__(
        self,
        name: str,
        profile: Profile,
        weight_bytes: int,
        shared_layers: int,
        limits: batching.BatchLimits,
    ) -> None:
        L = profile.model.num_layers
        link = profile.comm.intra_node
        pb = setup.page_bytes(profile, L)
        usable = int(GPU_MEMORY * setup.MEMORY_UTILIZATION) - weight_bytes
        if usable < pb:
            raise ValueError(f"{name}: the weights leave no KV page")
        model = StepModel(profile, [StageSpec(L, True, True, None)], 1, link)
        super().__init__(name, model, usable // pb, setup.PAGE_SIZE, pb, limits)
        layer, head = layer_and_head(profile, 1, link)
        self.shared = scaled(layer, shared_layers) if shared_layers else None
        own = scaled(layer, L - shared_layers)
        self.own = StageCost(
            own.const + head.const, own.per_token, own.per_pair, own.per_ctx, head.per_logit
        )

    def step_seconds(
        self,
        chosen: list[tuple[SimRequest, int]],
        decodes: int,
        ctx: int,
        chunks: list[tuple[int, int]],
        logits: int,
    ) -> float:
        per: dict[str, list[float]] = {}
        for req, n in chosen:
            w = per.setdefault(req.tag, [0.0, 0.0, 0.0, 0.0])
            w[0] += n
            if req.generated and n == 1 and req.pending == 1:
                w[2] += req.computed + 1
            else:
                k = req.computed
                w[1] += (k + n) * (k + n) - k * k
            if req.computed + n == req.prompt + req.generated:
                w[3] += 1
        total = 0.0
        if self.shared is not None:
            pairs = sum(w[1] for w in per.values())
            ctx_all = sum(w[2] for w in per.values())
            tok = sum(w[0] for w in per.values())
            total += _seconds(self.shared, tok, pairs, ctx_all, logits)
        for w in per.values():
            total += _seconds(self.own, w[0], w[1], w[2], w[3])
        return total


def _seconds(c: StageCost, tokens: float, pairs: float, ctx: float, logits: float) -> float:
    return (
        c.const
        + c.per_token * tokens
        + c.per_pair * pairs
        + c.per_ctx * ctx
        + (c.per_logit * logits)
    )


def popularity(variants: int) -> list[float]:
    """Zipf(1) shares of the variants."""
    raw = [1.0 / (k + 1) for k in range(variants)]
    return [r / sum(raw) for r in raw]


def per_model_copies(variants: int, pop: Sequence[float]) -> list[list[int]]:
    """Variants held by each GPU under per-model provisioning (module docstring)."""
    slots = math.ceil(variants / GPUS) * GPUS
    copies = [1] * variants
    for _ in range(slots - variants):
        v = max(range(variants), key=lambda i: (pop[i] / copies[i], -i))
        copies[v] += 1
    order = sorted(range(variants), key=lambda i: -copies[i])
    held: list[list[int]] = [[] for _ in range(GPUS)]
    g = 0
    for v in order:
        for _ in range(copies[v]):
            while v in held[g % GPUS] or len(held[g % GPUS]) >= slots // GPUS:
                g += 1
            held[g % GPUS].append(v)
            g += 1
    return held


def shared_placement(variants: int, pop: Sequence[float]) -> list[list[int]]:
    """Variants whose specific blocks each GPU holds under block sharing: variant v on
    min(GPUS, max(2, ceil(2 GPUS pop_v))) GPUs (popular blocks scaled out, BlockLLM's
    O3), each copy on the GPU holding the fewest so far."""
    held: list[list[int]] = [[] for _ in range(GPUS)]
    for v in sorted(range(variants), key=lambda i: -pop[i]):
        copies = min(GPUS, max(2, math.ceil(2 * GPUS * pop[v])))
        for g in sorted(range(GPUS), key=lambda g: (len(held[g]), g))[:copies]:
            held[g].append(v)
    return held


def build(
    profile: Profile, variants: int, mode: str, limits: batching.BatchLimits
) -> tuple[list[VariantReplica], dict[str, list[str]]]:
    """The GPUs and, per variant, the instances that can serve it."""
    mem = profile.memory
    L = profile.model.num_layers
    full = mem.layer_param_bytes * L + mem.embedding_param_bytes + mem.lm_head_param_bytes
    hosts: dict[str, list[str]] = {f"v{v}": [] for v in range(variants)}
    reps = []
    if mode == "per_model":
        for g, held in enumerate(per_model_copies(variants, popularity(variants))):
            reps.append(VariantReplica(f"gpu{g}", profile, full * len(held), 0, limits))
            for v in held:
                hosts[f"v{v}"].append(f"gpu{g}")
    else:
        shared = L - SPECIFIC_LAYERS
        spec = SPECIFIC_LAYERS * mem.layer_param_bytes
        for g, held in enumerate(shared_placement(variants, popularity(variants))):
            reps.append(VariantReplica(f"gpu{g}", profile, full + len(held) * spec, shared, limits))
            for v in held:
                hosts[f"v{v}"].append(f"gpu{g}")
    return reps, hosts


def dispatcher(hosts: dict[str, list[str]], tokens_per_s: float, kv_per_token: int) -> Any:
    """`block_dispatch.choose` over the instances holding the request's variant."""

    def dispatch(eng: engine.Engine, a: arrivals.Arrival, ready: list[str]) -> str:
        options = [h for h in hosts[a.tag] if h in eng.replicas]
        insts = []
        for h in options:
            r = eng.replicas[h]
            queued = sum(q.pending + q.output - q.generated for q in r.waiting)
            insts.append(
                block_dispatch.BlockInstance(
                    h, len(r.running), r.limits.max_num_seqs, queued, tokens_per_s
                )
            )
        return block_dispatch.choose(
            insts, a.prompt + a.output, a.prompt * kv_per_token, None
        ).instance

    return dispatch


def tagged(
    rate: float, duration: float, pool: Sequence[traces.Request], pop: Sequence[float], seed: int
) -> list[arrivals.Arrival]:
    """Poisson arrivals with trace lengths, each tagged with a variant by popularity."""
    rng = random.Random(seed)
    names = [f"v{i}" for i in range(len(pop))]
    out, t = [], rng.expovariate(rate)
    while t < duration:
        r = pool[rng.randrange(len(pool))]
        v = rng.choices(names, pop)[0]
        out.append(arrivals.Arrival(t, max(1, r.input_tokens), max(1, r.output_tokens), v))
        t += rng.expovariate(rate)
    return out


def variant_rows(profile: Profile, trace: str, quick: bool, rate: float) -> list[dict[str, Any]]:
    """Per variant count and mode: throughput and P95 (module docstring)."""
    pool = traces.read_trace(trace)
    counts = (3, 20) if quick else (3, 6, 12, 20)
    span, warm = (90.0, 20.0) if quick else (180.0, 30.0)
    limits = batching.BatchLimits()
    tok_s = limits.max_num_seqs / max(1e-9, _decode_step(profile, limits.max_num_seqs))
    rows: list[dict[str, Any]] = []
    for v in counts:
        pop = popularity(v)
        arr = tagged(rate, span, pool, pop, seed=v)
        got = {}
        for mode in ("per_model", "shared_blocks"):
            reps, hosts = build(profile, v, mode, limits)
            eng = engine.Engine(reps, setup.router_for(None, []))
            eng.dispatch = dispatcher(hosts, tok_s, profile.memory.kv_bytes_per_token)
            res = eng.run(arr, until=span)
            s = report.summary(res, (warm, span))
            got[mode] = {
                "label": "simulation",
                "variants": v,
                "mode": mode,
                "rate_rps": rate,
                "kv_pages_per_gpu": min(r.alloc.num_pages for r in reps),
                "throughput_tok_s": round(s["throughput_tok_s"], 1),
                "p50_latency_s": round(s["e2e_p50_s"], 3),
                "p95_latency_s": round(s["e2e_p95_s"], 3),
                "requests": s["requests"],
                "unfinished": s["unfinished"],
                "preemptions": s["preemptions"],
            }
            rows.append(got[mode])
        pm, bl = got["per_model"], got["shared_blocks"]
        rows.append(
            {
                "label": "simulation",
                "variants": v,
                "mode": "ratio",
                "throughput_gain": round(bl["throughput_tok_s"] / pm["throughput_tok_s"], 3)
                if pm["throughput_tok_s"]
                else None,
                "p95_reduction": round(1 - bl["p95_latency_s"] / pm["p95_latency_s"], 3)
                if pm["p95_latency_s"]
                else None,
                "paper": "BlockLLM §7: throughput 1.71x per-model provisioning, P95 -33.5 %; "
                "30 applications: 1.85x, -37.4 % (12 A100s)",
            }
        )
    return rows


def _decode_step(profile: Profile, batch: int) -> float:
    L = profile.model.num_layers
    model = StepModel(profile, [StageSpec(L, True, True, None)], 1, profile.comm.intra_node)
    return model.seconds(batch, batch * 1000, [], batch)
