"""Figures of the reproduced tables (every one titled "simulation", the paper's figure
beside it where it has one): OServe Tables 1-2 speedup vs CV, CoCoServe throughput and
latency vs load, BlockLLM throughput and P95 vs variants.

Input: the JSON object `tessera bench sim --json` printed. Output: PNG paths. Called by
`tessera bench sim --plots DIR` and from the command line:
`python -m tessera.sim.seed_plots BENCH.json DIR` (the figures in docs/simulation.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tessera.sim.plots import _plt


def plot_tables(out: dict[str, Any], folder: Path) -> list[Path]:
    """Write one PNG per reproduced table present in `out`."""
    plt = _plt()
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        paths.append(folder / name)

    t1 = out.get("oserve_table1")
    if t1:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        cv = [r["cv"] for r in t1]
        ax.plot(cv, [r["speedup_sim"] for r in t1], "o-", label="simulation")
        ax.plot(cv, [r["speedup_model"] for r in t1], "s--", label="latency model")
        ax.plot([r["paper_cv"] for r in t1], [r["paper_speedup"] for r in t1], "^:", label="paper")
        ax.set_xlabel("class-mix CV")
        ax.set_ylabel("P99 latency speedup")
        ax.set_title("OServe Table 1: heterogeneous vs best homogeneous (simulation)")
        ax.legend()
        save(fig, "oserve_table1.png")
    t2 = out.get("oserve_table2")
    if t2:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        ax.plot(
            [r["cv"] for r in t2],
            [r["speedup_sim"] for r in t2],
            "o-",
            label="simulation: switch plan's time",
        )
        if all(r.get("speedup_transition_sim") for r in t2):
            ax.plot(
                [r["cv"] for r in t2],
                [r["speedup_transition_sim"] for r in t2],
                "s--",
                label="simulation: transition planner",
            )
        ax.plot([r["paper_cv"] for r in t2], [r["paper_speedup"] for r in t2], "^:", label="paper")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("trace CV (mean per-class CV across spans)")
        ax.set_ylabel("P99 latency speedup over static")
        ax.set_title("OServe Table 2: switching on shifting mixes (simulation)")
        ax.legend()
        save(fig, "oserve_table2.png")
    coco = out.get("cocoserve_load")
    if coco:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
        for mode in dict.fromkeys(r["mode"] for r in coco):
            rows = [r for r in coco if r["mode"] == mode]
            x = [r["rate_rps"] for r in rows]
            a1.plot(x, [r["throughput_tok_s"] for r in rows], "o-", label=mode)
            a2.plot(x, [r["p50_latency_s"] for r in rows], "o-", label=mode)
        a1.set_xlabel("offered load (req/s)")
        a1.set_ylabel("throughput (tok/s)")
        a2.set_xlabel("offered load (req/s)")
        a2.set_ylabel("p50 request latency (s)")
        a2.set_yscale("log")
        a1.set_title("CoCoServe: throughput (simulation)")
        a2.set_title("CoCoServe: latency (simulation)")
        a1.legend()
        save(fig, "cocoserve_load.png")
    blk = out.get("blockllm_variants")
    if blk:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
        for mode in ("per_model", "shared_blocks"):
            rows = [r for r in blk if r["mode"] == mode]
            x = [r["variants"] for r in rows]
            a1.plot(x, [r["throughput_tok_s"] for r in rows], "o-", label=mode)
            a2.plot(x, [r["p95_latency_s"] for r in rows], "o-", label=mode)
        a1.set_xlabel("variants")
        a1.set_ylabel("throughput (tok/s)")
        a2.set_xlabel("variants")
        a2.set_ylabel("P95 request latency (s)")
        a1.set_title("BlockLLM: throughput (simulation)")
        a2.set_title("BlockLLM: P95 (simulation)")
        a1.legend()
        save(fig, "blockllm_variants.png")
    return paths


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tessera.sim.seed_plots BENCH.json DIR", file=sys.stderr)
        return 2
    for p in plot_tables(json.loads(Path(argv[0]).read_text()), Path(argv[1])):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
