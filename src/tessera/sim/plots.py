"""Matplotlib plots of a simulation (each titled "simulation"): TTFT over time, KV memory
and queue over time, and the deployment (replica shapes) over time.

Input: a `engine.SimResult` and an output directory. Output: PNG paths. Called by
`tessera sim --plots DIR` and the bench's documentation figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.sim.engine import SimResult
from tessera.sim.report import latency_series


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(res: SimResult, out: Path, label: str = "", window_s: float = 10.0) -> list[Path]:
    """Write latency.png, memory.png and deployment.png under `out`."""
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    tag = f" ({label})" if label else ""
    paths = []
    series = latency_series(res, window_s)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([s[0] for s in series], [s[1] for s in series], label="p50 TTFT")
    ax.plot([s[0] for s in series], [s[2] for s in series], label="p99 TTFT")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title(f"Simulation: TTFT over time{tag}")
    ax.legend()
    paths.append(_save(fig, out / "latency.png"))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    t = [s.time for s in res.samples]
    ax.plot(t, [s.kv_used for s in res.samples], label="KV pages in use (fraction)")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("time (s)")
    ax2 = ax.twinx()
    ax2.plot(t, [s.waiting for s in res.samples], color="tab:red", label="queued requests")
    ax2.set_ylabel("queued")
    ax.set_title(f"Simulation: KV memory and queue{tag}")
    ax.legend(loc="upper left")
    ax2.legend(loc="upper right")
    paths.append(_save(fig, out / "memory.png"))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    shapes = sorted({s.deployment for s in res.samples})
    ax.step(t, [s.replicas for s in res.samples], where="post", label="replicas")
    for when, _ in res.actions[:20]:
        ax.axvline(when, color="grey", lw=0.5)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("replicas")
    ax.set_title(f"Simulation: deployment over time{tag}")
    ax.text(0.01, 0.02, "\n".join(shapes[:4]), transform=ax.transAxes, fontsize=7)
    paths.append(_save(fig, out / "deployment.png"))
    return paths


def plot_rows(
    rows: Sequence[dict[str, float]],
    x: str,
    ys: Sequence[str],
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    logy: bool = False,
) -> Path:
    """A line per key of `ys` over `x` (a reproduced table), titled as a simulation."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for y in ys:
        ax.plot([r[x] for r in rows], [r[y] for r in rows], marker="o", label=y)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("Simulation: " + title)
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
