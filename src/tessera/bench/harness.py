"""The benchmark harness: rounds, ratios, percentiles, a quiet-machine check, provenance.

A shared machine's load drifts between back-to-back runs, so compared runs alternate
within each round (`interleave`) and a speed-up is the median of per-round ratios
(`median_ratio`), never a ratio of medians. `provenance()` says on which machine, at
which commit and when a figure was measured, and whether the machine was quiet; the
`tessera bench` dispatcher (`tessera.cli.bench`) adds it to every JSON a bench prints.
Pure helpers over plain numbers, except `provenance` (reads the load average and asks
git). Called by every `bench_*` module.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[3]  # the checkout, where there is one

# A machine is quiet when its 1-minute load average per core is under this.
QUIET_LOAD_PER_CPU = 0.5


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def latency_ms(ttft: Sequence[float], tpot: Sequence[float]) -> dict[str, float]:
    """A run's latency keys: p99 and p50 TTFT and p50 TPOT (ms) from seconds."""
    return {
        "p99_ttft_ms": pct(ttft, 99) * 1e3,
        "p50_ttft_ms": pct(ttft, 50) * 1e3,
        "p50_tpot_ms": pct(tpot, 50) * 1e3,
    }


def median(values: Sequence[float]) -> float:
    """The median; 0.0 for no values."""
    return statistics.median(values) if values else 0.0


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """The median over rounds of num[k] / den[k] (the rounds were interleaved)."""
    return statistics.median(a / max(b, 1e-12) for a, b in zip(num, den, strict=True))


def interleave(
    modes: Sequence[str], rounds: int, run_one: Callable[[str, int], T]
) -> dict[str, list[T]]:
    """Run every mode once per round, modes alternating: {mode: [round 0, round 1, ...]}."""
    out: dict[str, list[T]] = {m: [] for m in modes}
    for k in range(rounds):
        for mode in modes:
            out[mode].append(run_one(mode, k))
    return out


def timed_rounds(
    fns: Sequence[Callable[[], T]], rounds: int, warm_up: bool = True
) -> tuple[list[T], list[list[float]]]:
    """Call every fn in turn in each round (after one warm-up call each): (the last result
    of each, the seconds of each per round)."""
    if warm_up:
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    outs: list[T] = []
    for _ in range(rounds):
        outs = []
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            outs.append(fn())
            times[i].append(time.perf_counter() - t)
    return outs, times


def machine(extra: str = "") -> str:
    """The `machine` field benches have always reported: architecture and CPU count."""
    base = f"{platform.machine()} {os.cpu_count()} cpus"
    return f"{base}, {extra}" if extra else base


def load_per_cpu() -> float:
    """The 1-minute load average divided by the CPU count."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def quiet() -> bool:
    """Whether the machine is quiet enough for timings to be compared run to run."""
    return load_per_cpu() < QUIET_LOAD_PER_CPU


def commit(root: Path = ROOT) -> str:
    """The checkout's commit (with `-dirty` for uncommitted changes), or "unknown"."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _cpu_name() -> str:
    """The CPU's model name (Linux), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def provenance() -> dict[str, Any]:
    """Machine, commit and date of a run, and the machine's load when it ended."""
    return {
        "machine": f"{_cpu_name()}, {os.cpu_count()} cpus",
        "python": platform.python_version(),
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "load_per_cpu": round(load_per_cpu(), 2),
        "quiet": quiet(),
    }


def note(tag: str, msg: str) -> None:
    """A progress line on stderr (stdout holds the JSON only)."""
    sys.stderr.write(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()
