"""Variants: shared blocks (LoRA batched + block zoo) vs one full copy per variant, same memory.

`tessera bench variants --json`. For 3, 6 and 12 variants of a tiny foundation (a third full
fine-tunes differing in `--diff-layers` layers, the rest LoRA adapters), one mixed Poisson
stream is served twice on a local agent with the same memory budget: shared (one foundation
replica serving every adapter, one chain per fine-tune sharing blocks through the zoo; the
budget is exactly what this needs) and per model (`--no-block-zoo`, one full copy per variant;
copies that do not fit are swapped in LRU on demand). Clients call the leader's `Generate`
(greedy, EOS ignored, `--new` tokens each). Per size: `param_bytes_shared`,
`param_bytes_per_model`, `throughput_ratio` and `p95_latency_ratio` (shared / per model),
`swaps`, `tokens_match`. The shared run is repeated without co-batching (`--no-cobatch`):
`cobatch_throughput_ratio`, `cobatch_p95_latency_ratio` (on / off), `*_no_cobatch`, `cobatch_*`
counts from `/metrics`, and `cobatch_in_process` (`bench_variants_cobatch`, without gRPC).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.bench import options
from tessera.cli import bench_variants_share
from tessera.cli.bench_agent_proc import AgentProc

MiB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="3,6,12", help="variant counts, comma-separated")
    p.add_argument("--requests-per-variant", type=int, default=6)
    options.add_rate(p, 8.0, "request arrivals")
    p.add_argument("--new", type=int, default=12, help="tokens generated per request")
    p.add_argument("--diff-layers", type=int, default=2, help="layers a full fine-tune changes")
    p.add_argument("--kv-mib", type=int, default=4, help="KV pool per replica (MiB)")
    options.add_tiny_model(p, hidden=256, layers=8)
    options.add_seed(p)
    p.add_argument(
        "--cobatch-rounds",
        type=int,
        default=3,
        help="rounds of the in-process co-batching A/B (0: skip it)",
    )
    p.add_argument(
        "--cobatch-linger-ms", type=float, default=-1.0, help="the agents' (-1: their default)"
    )
    p.add_argument(
        "--share-equivalent",
        action="store_true",
        help="also load the full fine-tunes with shareEquivalent and report their bytes",
    )


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "lora" or "full"
    path: str


@dataclass(frozen=True)
class Request:
    at: float  # arrival, seconds after the stream starts
    variant: str
    prompt: tuple[int, ...]


@dataclass
class Served:
    latencies: list[float] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    span_s: float = 0.0
    swaps: int = 0


def _stream(names: list[str], args: argparse.Namespace, vocab: int) -> list[Request]:
    rng = random.Random(args.seed)
    t, out = 0.0, []
    for _ in range(args.requests_per_variant * len(names)):
        t += rng.expovariate(args.rate)
        n = rng.randint(8, 32)
        prompt = (0, *(rng.randrange(3, vocab) for _ in range(n - 1)))
        out.append(Request(t, rng.choice(names), prompt))
    return out


def _variants(base: Path, root: Path, n: int, args: argparse.Namespace) -> list[Variant]:
    from tessera_agent import tiny_variants

    out = []
    for i in range(n):
        if i % 3 == 2:  # every third variant a full fine-tune
            rng = random.Random(args.seed * 1000 + i)
            layers = sorted(rng.sample(range(args.layers), args.diff_layers))
            if args.share_equivalent:  # its first layer changed only a little
                path = bench_variants_share.make_finetune(base, root / f"ft{i}", layers, i)
            else:
                path = tiny_variants.make_tiny_finetune(
                    base, root / f"ft{i}", layers=layers, seed=i
                )
            out.append(Variant(f"ft{i}", "full", str(path)))
        else:
            path = tiny_variants.make_tiny_lora(base, root / f"lora{i}", r=8, seed=i)
            out.append(Variant(f"lora{i}", "lora", str(path)))
    return out


async def _replay(
    stream: list[Request], route: Any, n: int, before: Any = None, after: Any = None
) -> Served:
    """Send the stream at its arrival times; `route(req)` is an async (agent call) → tokens."""
    out = Served()
    start = time.monotonic()

    async def one(i: int, r: Request) -> None:
        await asyncio.sleep(max(0.0, start + r.at - time.monotonic()))
        arrived = start + r.at
        out.tokens[i] = await route(r)
        out.latencies.append(time.monotonic() - arrived)

    await asyncio.gather(*(one(i, r) for i, r in enumerate(stream)))
    out.span_s = time.monotonic() - start
    return out


async def _shared(
    base: str, variants: list[Variant], stream: list[Request], args: Any, cobatch: bool = True
) -> tuple[Served, int, int, dict[str, int]]:
    from tessera_agent.engine import block_tensors
    from tessera_agent.engine import config as config_mod

    kv = args.kv_mib * MiB
    cfg = config_mod.ModelConfig.from_path(Path(base))
    import torch

    model = block_tensors.nbytes(cfg, 0, cfg.num_layers, torch.float32)
    full = [v for v in variants if v.kind == "full"]
    layer = block_tensors.nbytes(cfg, 1, 2, torch.float32)
    # the budget shared blocks need: foundation + each full fine-tune's own layers + KV
    capacity = model + len(full) * args.diff_layers * layer + (1 + len(full)) * kv + 8 * MiB
    agent = AgentProc("var-shared", capacity, True, cobatch, args.cobatch_linger_ms)
    try:
        await agent.load("base", base, kv)
        lora = [(v.name, v.path) for v in variants if v.kind == "lora"]
        await agent.adapters("base", lora)
        for v in full:
            await agent.load(f"chain-{v.name}", v.path, kv)
        d = await agent.describe()
        adapter_bytes = sum(_adapter_bytes(p) for _, p in lora)
        kinds = {v.name: v.kind for v in variants}

        async def route(r: Request) -> list[int]:
            if kinds[r.variant] == "full":
                return await agent.generate(f"chain-{r.variant}", "", r.prompt, args.new)
            return await agent.generate("base", r.variant, r.prompt, args.new)

        served = await _replay(stream, route, args.new)
        counts = agent.cobatch_counts()
        # how busy the compute thread was over the stream (is it the bottleneck?)
        busy = counts.pop("busy_ms", 0) / 1000
        counts["thread_busy_pct"] = round(100 * busy / served.span_s)
        return served, int(d.zoo.param_bytes) + adapter_bytes, capacity, counts
    finally:
        await agent.close()


def _adapter_bytes(path: str) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(str(Path(path) / "adapter_model.safetensors"), framework="pt") as f:
        for k in f.keys():
            t = f.get_slice(k)
            n = 1
            for d in t.get_shape():
                n *= d
            total += 4 * n
    return total


async def _per_model(
    base: str, variants: list[Variant], stream: list[Request], capacity: int, args: Any
) -> tuple[Served, int]:
    """One copy per variant within `capacity`; copies swapped in on demand (LRU, idle)."""
    import torch

    from tessera_agent.engine import block_tensors
    from tessera_agent.engine import config as config_mod

    kv = args.kv_mib * MiB
    cfg = config_mod.ModelConfig.from_path(Path(base))
    copy = block_tensors.nbytes(cfg, 0, cfg.num_layers, torch.float32)
    slots = max(1, (capacity - 8 * MiB) // (copy + kv))
    agent = AgentProc("var-per-model", capacity, zoo=False)
    by_name = {v.name: v for v in variants}
    resident: dict[str, float] = {}  # variant -> last use
    loading: set[str] = set()
    busy: dict[str, int] = {}
    changed = asyncio.Condition()
    swaps = 0

    async def ensure(name: str) -> None:
        """Wait until `name` is resident (swapping it in if needed) and mark it busy."""
        nonlocal swaps
        while True:
            async with changed:
                if name in resident:
                    busy[name] = busy.get(name, 0) + 1
                    resident[name] = time.monotonic()
                    return
                if name in loading:
                    await changed.wait()
                    continue
                victim = None
                if len(resident) + len(loading) >= slots:
                    idle = [n for n in resident if not busy.get(n)]
                    if not idle:
                        await changed.wait()
                        continue
                    victim = min(idle, key=lambda n: resident[n])
                    del resident[victim]
                loading.add(name)
            if victim is not None:  # outside the lock: resident copies keep serving
                await agent.unload(f"pm-{victim}")
            v = by_name[name]
            await agent.load(f"pm-{name}", base if v.kind == "lora" else v.path, kv)
            if v.kind == "lora":
                await agent.adapters(f"pm-{name}", [(name, v.path)])
            async with changed:
                loading.discard(name)
                resident[name] = time.monotonic()
                swaps += 1
                changed.notify_all()

    async def done(name: str) -> None:
        async with changed:
            busy[name] -= 1
            changed.notify_all()

    async def route(r: Request) -> list[int]:
        await ensure(r.variant)
        try:
            v = by_name[r.variant]
            variant = r.variant if v.kind == "lora" else ""
            return await agent.generate(f"pm-{r.variant}", variant, r.prompt, args.new)
        finally:
            await done(r.variant)

    try:
        served = await _replay(stream, route, args.new)
        served.swaps = swaps
        per_model = len(variants) * copy + sum(
            _adapter_bytes(v.path) for v in variants if v.kind == "lora"
        )
        return served, per_model
    finally:
        await agent.close()


def _p95(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(0.95 * len(s)))]


async def _one_size(base: Path, root: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    variants = _variants(base, root / f"n{n}", n, args)
    stream = _stream([v.name for v in variants], args, 512)
    # co-batching on and off on the same stream, back to back (order alternates by size)
    runs: dict[bool, tuple[Served, int, int, dict[str, int]]] = {}
    for on in (True, False) if n % 2 == 0 else (False, True):
        runs[on] = await _shared(str(base), variants, stream, args, cobatch=on)
    shared, shared_bytes, capacity, counts = runs[True]
    alone = runs[False][0]
    per, per_bytes = await _per_model(str(base), variants, stream, capacity, args)
    extra: dict[str, Any] = {}
    if args.share_equivalent:
        extra = await _share_equivalent(str(base), variants, capacity, args)
    tokens = sum(len(t) for t in shared.tokens.values())
    thr_s, thr_p, thr_a = tokens / shared.span_s, tokens / per.span_s, tokens / alone.span_s
    p95_s, p95_a = _p95(shared.latencies), _p95(alone.latencies)
    return {
        "variants": n,
        "full_finetunes": sum(v.kind == "full" for v in variants),
        "lora": sum(v.kind == "lora" for v in variants),
        "requests": len(stream),
        "memory_budget_bytes": capacity,
        "param_bytes_shared": shared_bytes,
        "param_bytes_per_model": per_bytes,
        "throughput_shared_tok_s": round(thr_s, 2),
        "throughput_per_model_tok_s": round(thr_p, 2),
        "throughput_ratio": round(thr_s / thr_p, 3),
        "p95_latency_shared_s": round(_p95(shared.latencies), 3),
        "p95_latency_per_model_s": round(_p95(per.latencies), 3),
        "p95_latency_ratio": round(_p95(shared.latencies) / _p95(per.latencies), 3),
        "per_model_swaps": per.swaps,
        "tokens_match": shared.tokens == per.tokens == alone.tokens,
        # per-block batching (engine/cobatch.py): shared blocks with co-batching off
        "throughput_shared_no_cobatch_tok_s": round(thr_a, 2),
        "p95_latency_shared_no_cobatch_s": round(p95_a, 3),
        "cobatch_throughput_ratio": round(thr_s / thr_a, 3),
        "cobatch_p95_latency_ratio": round(p95_s / p95_a, 3),
        "throughput_ratio_no_cobatch": round(thr_a / thr_p, 3),
        "p95_latency_ratio_no_cobatch": round(p95_a / _p95(per.latencies), 3),
        **{f"cobatch_{k}": v for k, v in counts.items()},
        **extra,
    }


async def _share_equivalent(
    base: str, variants: list[Variant], capacity: int, args: argparse.Namespace
) -> dict[str, Any]:
    agent = AgentProc("var-share-eq", capacity, zoo=True)
    try:
        full = [(v.name, v.path) for v in variants if v.kind == "full"]
        lora = sum(_adapter_bytes(v.path) for v in variants if v.kind == "lora")
        return await bench_variants_share.measure(agent, base, full, args.kv_mib * MiB, lora)
    finally:
        await agent.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import tiny_checkpoint

    sizes = [int(x) for x in str(args.sizes).split(",") if x]
    with tempfile.TemporaryDirectory(prefix="tessera-bench-variants-") as tmp:
        root = Path(tmp)
        spec = tiny_checkpoint.TinySpec(layers=args.layers, hidden=args.hidden, seed=args.seed)
        base = tiny_checkpoint.make_tiny(root / "base", spec)
        results = [asyncio.run(_one_size(base, root, n, args)) for n in sizes]
        in_process = None
        if args.cobatch_rounds > 0:
            from tessera.cli import bench_variants_cobatch

            in_process = bench_variants_cobatch.run(root, base, 5, 4, 24, args.cobatch_rounds)
    return {
        "bench": "variants",
        "model": f"tiny llama, {args.layers} layers, hidden {args.hidden}, float32",
        "stream": {
            "requests_per_variant": args.requests_per_variant,
            "rate_per_s": args.rate,
            "new_tokens": args.new,
        },
        "kv_bytes_per_replica": args.kv_mib * MiB,
        "results": results,
        "cobatch_in_process": in_process,
        "tokens_match": all(r["tokens_match"] for r in results)
        and (in_process is None or in_process["tokens_match"]),
    }
