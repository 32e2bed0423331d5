"""Where an agent's compiled decode graphs are cached across restarts, and whether a warm-up
came from that cache.

`configure` points Inductor's on-disk caches (FX graphs, AOT autograd, C++ kernels) at one
folder per torch version under `--compile-cache DIR`, else `default_root(environ)`:
`$TESSERA_COMPILE_CACHE`, else `$XDG_CACHE_HOME/tessera/compile`. The default decode graph
(unfrozen, its packed weights graph inputs: `compile_policy.freeze`) comes whole from the
cache ("cached": Dynamo's trace only); a frozen one (`TESSERA_COMPILE_FREEZE=1`) bypasses
the FX graph and AOT autograd caches (torch 2.13 cannot pickle its prepacked weights), so a
restart finds only its C++ kernels and the prompt rows' graphs ("warm"). `Probe` tells the
two apart from Inductor's process-wide hit, miss and bypass counters around a warm-up.
Called by `tessera agent` (at start, with its environment) and
`decode_graph.CompiledDecode`.
"""

from __future__ import annotations

import dataclasses
import logging
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
    where.mkdir(parents=True, exist_ok=True)
    environ[_INDUCTOR_ENV] = str(where)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    log.info("compiled graphs are cached in %s", where)
    return where


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
