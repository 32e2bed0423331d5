"""Where an agent's compiled decode graphs are cached across restarts, and whether a
warm-up came from that cache.

`configure` points Inductor's on-disk caches at one folder per torch version under
`--compile-cache DIR`, else `default_root(environ)`: `$TESSERA_COMPILE_CACHE`, else
`$XDG_CACHE_HOME/tessera/compile`, created readable by its owner only; what it holds is
code the agent runs, so a folder of another user or one others can write is warned about
(`trust_problems`; docs/security.md). The default (unfrozen) decode graph comes whole from it
("cached"; `decode_aot.py` saves Dynamo's output in `tessera-decode/` there); a frozen one
(`TESSERA_COMPILE_FREEZE=1`) finds only its C++ kernels and the prompt rows' graphs
("warm": torch 2.13 cannot pickle its prepacked weights). `Probe` tells the two apart from
Inductor's hit, miss and bypass counters around a warm-up; `prepare` does a warm-up's
once-per-process work (imports, the CPU ISA probe) on a thread while the agent waits for
its first load. Called by `tessera agent` (at start) and `decode_graph.CompiledDecode`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import stat
import threading
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ENV = "TESSERA_COMPILE_CACHE"
_INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def default_root(environ: Mapping[str, str]) -> Path:
    """`$TESSERA_COMPILE_CACHE`, else `$XDG_CACHE_HOME/tessera/compile`, in `environ`."""
    raw = environ.get(ENV, "").strip()
    if raw:
        return Path(raw).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tessera" / "compile"


def folder(root: Path) -> Path:
    """The cache folder of this torch version under `root` (a torch upgrade starts afresh;
    Inductor's own keys cover the graph, shapes, dtype, device and config)."""
    return root / f"torch-{torch.__version__}"


def configure(root: str | Path | None, environ: MutableMapping[str, str]) -> Path:
    """Point Inductor's on-disk caches (FX graphs, AOT autograd, C++ kernels) at the cache
    folder under `root` (None: `default_root(environ)`) and turn the local caches on;
    Inductor finds the folder in `environ` (the process's: `TORCHINDUCTOR_CACHE_DIR`). Call
    before anything compiles. Returns it."""
    where = folder(Path(root).expanduser() if root else default_root(environ))
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    for problem in trust_problems(where):
        log.warning("compile cache %s: %s", where, problem)
    environ[_INDUCTOR_ENV] = str(where)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    log.info("compiled graphs are cached in %s", where)
    return where


def trust_problems(where: Path) -> list[str]:
    """Why `where` (a compile cache folder) is not trusted as the agent's own: what it
    holds is unpickled and run (saved decode graphs, Inductor's graphs and kernels), so
    another user, or anyone its group or others bits let write, could run code as the
    agent. Empty: owned by this process's user and writable by no one else."""
    st = where.stat()
    out: list[str] = []
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        out.append(f"owned by uid {st.st_uid}, not this agent's user ({os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        out.append(
            f"writable by its group or others (mode {stat.S_IMODE(st.st_mode):o}): whoever "
            "can write it can run code as the agent (its graphs are loaded and run)"
        )
    return out


# What loading or compiling a graph imports first (seconds of imports on this machine).
_PREPARED = ("torch._inductor.compile_fx", "torch._inductor.codecache", "torch._dynamo.aot_compile")


def _prepare() -> None:
    t0 = time.perf_counter()
    try:
        for name in _PREPARED:
            importlib.import_module(name)
        from torch._inductor import cpu_vec_isa

        isa = cpu_vec_isa.pick_vec_isa()  # dry-compiles a program per candidate ISA
    except Exception:  # the warm-up does the same work again, and reports its failure
        log.exception("compile preparation failed")
        return
    log.info("compile prepared in %.1f s (vector ISA %s)", time.perf_counter() - t0, isa)


def prepare() -> threading.Thread:
    """Start, on a daemon thread, what the first warm-up of this process pays before any
    graph (Inductor's and Dynamo's AOT loader's imports, Inductor's probe of the CPU's
    vector ISA: ~6 s on a loaded 2-core machine), so that it overlaps the agent's wait
    for its first load. Returns the thread."""
    thread = threading.Thread(target=_prepare, name="compile-prepare", daemon=True)
    thread.start()
    return thread


def _counts() -> tuple[int, int]:
    """Inductor's FX graph cache hits, and the graphs it compiled instead (misses and
    bypasses: a frozen graph's prepacked MKL weights cannot be pickled, so it bypasses)."""
    from torch._dynamo.utils import counters

    ind = counters["inductor"]
    return ind["fxgraph_cache_hit"], ind["fxgraph_cache_miss"] + ind["fxgraph_cache_bypass"]


@dataclasses.dataclass
class Probe:
    """Inductor's cache hits and misses (bypasses included) over a span of work
    (process-wide counters: a concurrent compile elsewhere in the process counts too)."""

    hits: int = 0
    misses: int = 0
    _at: tuple[int, int] = (0, 0)

    def __enter__(self) -> Probe:
        self._at = _counts()
        return self

    def __exit__(self, *exc: object) -> None:
        hits, misses = _counts()
        self.hits, self.misses = hits - self._at[0], misses - self._at[1]

    @property
    def outcome(self) -> str:
        """ "cached": every graph came from the cache; "warm": at least one was compiled
        (or the cache was bypassed)."""
        return "cached" if self.hits and not self.misses else "warm"
