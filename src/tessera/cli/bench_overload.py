"""Overload benchmark (KunServe): drop duplicated layers under a burst vs preempting.

`tessera bench overload --json [--via replay|operator]`: the tiny checkpoint on 4 local
agents, each a whole-model replica with a small KV pool (`--pool-pages`), replays the
shared trace's first `--requests` rows with a burst whose rate is a multiple of the
capacity measured first (`bench_overload_scenario`). Two runs on fresh agents: off (a full
pool preempts and recomputes) and on (the product's overload loop, `control/overload.py`,
drops layers and restores them: ticked as `tessera up` ticks it beside this process's
router, `bench_overload_replay`, or by the operator behind a gateway,
`bench_overload_operator`).
Keys: p99/p50 TTFT on and off and `p99_ttft_ratio` (off / on), `p50_tpot_on_vs_off`,
drops, restores, lost, exchange_ms, paused_ms, `tokens_match` (transformers' greedy
tokens), the live pipeline bubble of lookahead vs token-count splits
(`bench_overload_bubble`) and, on the replay path, Eq. 1's model of it; docs/overload.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.bench import options, oracle, trace
from tessera.cli import bench_overload_bubble, local_agents
from tessera.cli import bench_overload_replay as replay_mod
from tessera.cli import bench_overload_scenario as scenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace.add_arguments(
        parser,
        requests=160,
        input_scale=0.05,
        output_scale=0.1,
        max_input=48,
        max_output=24,
    )
    parser.add_argument(
        "--burst",
        type=float,
        nargs=2,
        default=(0.35, 0.75),
        help="the replay's fraction [a, b) whose arrival rate is doubled",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="divide the trace's arrival gaps by this (default: calibrated, --overload-multiple)",
    )
    parser.add_argument(
        "--overload-multiple",
        type=float,
        default=scenario.DEFAULT_MULTIPLE,
        help="the burst arrives at this multiple of the capacity measured first",
    )
    parser.add_argument("--calibration-requests", type=int, default=48)
    parser.add_argument("--pool-pages", type=int, default=6)
    parser.add_argument("--tick-ms", type=float, default=50.0)
    parser.add_argument(
        "--agent-nice",
        type=local_agents.niceness,
        default=scenario.AGENT_NICE,
        help="the agents' niceness (0: as every other process); see docs/overload.md",
    )
    options.add_seed(parser)
    options.add_via(
        parser,
        "replay",
        "this process routes and runs the loop (as `tessera up`)",
        "the operator runs it against the test API server, requests go through a gateway",
    )
    parser.add_argument("--check-tokens", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--bubble-rounds", type=_positive, default=3, help="live bubble runs per split (>= 1)"
    )
    parser.add_argument("--bubble-requests", type=_positive, default=24, help="(>= 1)")
    parser.add_argument(
        "--bubble-only", action="store_true", help="measure the live bubble only (no replay)"
    )


def _positive(text: str) -> int:
    """`--bubble-rounds`, `--bubble-requests`: at least 1 (the bubble's median needs a run)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import tiny_checkpoint as tc
    from tessera_agent.engine import config, kv_cache

    reqs = _rows(args, args.time_scale or 1.0)  # sizes; arrivals once the scale is chosen
    rng = random.Random(args.seed)
    prompts = [[0] + [rng.randrange(5, 500) for _ in range(n - 1)] for _, n, _ in reqs]
    with tempfile.TemporaryDirectory(prefix="tessera-overload-") as tmp:
        model = tc.make_tiny(Path(tmp) / "tiny-llama", tc.TinySpec())
        cfg = config.ModelConfig.from_path(model)
        per_page = kv_cache.KVLayout(
            8, 1, scenario.PAGE, cfg.num_kv_heads, cfg.head_dim
        ).bytes_per_page
        i0 = int(args.burst[0] * len(reqs))
        sel = list(range(i0, min(len(reqs), i0 + args.bubble_requests)))
        b_prompts, b_news = [prompts[i] for i in sel], [reqs[i][2] for i in sel]
        bub = bench_overload_bubble.measure(model, b_prompts, b_news, args.bubble_rounds)
        if args.check_tokens:
            bub["bubble_tokens_match"] = bub["bubble_tokens"] == _reference(
                model, b_prompts, b_news
            )
        del bub["bubble_tokens"]
        if args.bubble_only:
            return {
                "bench": "overload",
                "machine": f"{platform.node()} ({os.cpu_count()} cpus)",
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                **bub,
            }
        reqs, scen = scenario.choose(
            args, model, args.pool_pages * per_page, lambda x: _rows(args, x)
        )
        replay = trace.Replay(model, reqs, prompts)
        if args.via == "operator":
            return {**_via_operator(replay, args, per_page, bub), **scen}
        off, _ = replay_mod.run_once(replay, args, per_page, False)
        on, cost = replay_mod.run_once(replay, args, per_page, True)
        match = None
        if args.check_tokens:
            want = _reference(model, prompts, [o for _, _, o in reqs])
            match = all(
                r.tokens == w
                for res in (off, on)
                for r, w in zip(res["requests"], want, strict=True)
                if r.done
            )
    stats: replay_mod.Stats = on["stats"]
    assert cost is not None
    la, tcb, mbs = bench_overload_bubble.model_bubbles(on["queue_at_drop"], cost)
    return {
        "bench": "overload",
        **_compared(args, len(reqs), off, on),
        "drops": stats.drops,
        "restores": stats.restores,
        "fallbacks": stats.fallbacks,
        "lost": on["lost"] + off["lost"],
        "exchange_ms": round(stats.exchange_s * 1e3, 1),
        "paused_ms": round(stats.paused_s * 1e3, 1),
        "tokens_match": match,
        "wall_on_s": round(on["wall_s"], 1),
        "wall_off_s": round(off["wall_s"], 1),
        **bub,
        "bubble_fraction_lookahead_model": round(la, 3),
        "bubble_fraction_token_count_model": round(tcb, 3),
        "bubble_model_basis": (
            f"model: Eq. 1 fitted to this run's prefill timings (alpha={cost.alpha:.3g}, "
            f"beta={cost.beta:.3g}, gamma={cost.gamma:.3g}), the deepest queue while dropped "
            f"({len(on['queue_at_drop'])} prompts) in {mbs} microbatches on 2 stages"
        ),
        "events": stats.events[:8],
        "shifts_on_s": on["shifts"],
        **scen,
    }


def _rows(args: argparse.Namespace, scale: float) -> list[tuple[float, int, int]]:
    """The replay's rows at time scale `scale`, the burst applied."""
    return scenario.burst(
        trace.load(argparse.Namespace(**{**vars(args), "time_scale": scale})), *args.burst
    )


def _reference(model: Path, prompts: list[list[int]], news: list[int]) -> list[list[int]]:
    """transformers' greedy tokens of each prompt (EOS ignored)."""
    return oracle.greedy_tokens(model, list(zip(prompts, news, strict=True)))


def _compared(
    args: argparse.Namespace, requests: int, off: dict[str, Any], on: dict[str, Any]
) -> dict[str, Any]:
    """The keys both paths report first: the run, and latency with the policy on vs off."""
    return {
        "machine": f"{platform.node()} ({os.cpu_count()} cpus)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "requests": requests,
        "replicas": 4,
        "pool_pages": args.pool_pages,
        "agent_nice": args.agent_nice,
        "page_size": scenario.PAGE,
        "p99_ttft_on_ms": round(on["p99_ttft_ms"], 1),
        "p99_ttft_off_ms": round(off["p99_ttft_ms"], 1),
        "p99_ttft_ratio": round(off["p99_ttft_ms"] / on["p99_ttft_ms"], 2),
        "p50_ttft_on_ms": round(on["p50_ttft_ms"], 1),
        "p50_ttft_off_ms": round(off["p50_ttft_ms"], 1),
        "p50_tpot_on_vs_off": round(on["p50_tpot_ms"] / off["p50_tpot_ms"], 2),
        "ttft_slowest_off": off["slowest"],
        "ttft_slowest_on": on["slowest"],
    }


def _via_operator(
    replay: trace.Replay,
    args: argparse.Namespace,
    per_page: int,
    bub: dict[str, Any],
) -> dict[str, Any]:
    """Both runs through the operator and a gateway (`bench_overload_operator`); the keys
    of the replay path, the bubble model's left out (no queue is seen from here)."""
    from tessera.cli import bench_overload_operator as via

    kv = args.pool_pages * per_page
    off = via.run_once(replay, kv, False, args.tick_ms / 1e3, args.agent_nice)
    on = via.run_once(replay, kv, True, args.tick_ms / 1e3, args.agent_nice)
    match = None
    if args.check_tokens:
        outs = [o for _, _, o in replay.reqs]
        texts = oracle.greedy_texts(replay.model, list(zip(replay.prompts, outs, strict=True)))
        match = all(
            r.text == w
            for res in (off, on)
            for r, w in zip(res["requests"], texts, strict=True)
            if r.ok
        )
    return {
        "bench": "overload",
        "via": "operator",
        **_compared(args, len(replay.reqs), off, on),
        "drops": on["drops"],
        "restores": on["restores"],
        "fallbacks": on["fallbacks"],
        "lost": on["lost"] + off["lost"],
        "exchange_ms": round(on["exchange_ms"], 1),
        "paused_ms": round(on["paused_ms"], 1),
        "drop_routes_ms": round(on["drop_routes_ms"], 1),
        "drop_drain_ms": round(on["drop_drain_ms"], 1),
        "tokens_match": match,
        "wall_on_s": round(on["wall_s"], 1),
        "wall_off_s": round(off["wall_s"], 1),
        **bub,
        "bubble_fraction_lookahead_model": None,
        "bubble_fraction_token_count_model": None,
        "bubble_model_basis": "not computed via the operator (no queue is seen here)",
        "events": on["events"][:8],
        "shifts_on_s": on["shifts"],
        "slowest_on": on["slowest_phased"],
    }
