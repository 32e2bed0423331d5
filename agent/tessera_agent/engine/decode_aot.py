"""Decode graphs saved whole, Dynamo's trace included, so that a restart skips tracing.

Inductor's caches (`compile_cache.py`) hold a compiled graph's code, but a restart still
paid Dynamo's trace of the decode forward (about 2.3 s per graph on a quiet 2-core machine,
most of a warm restart). Here each of a CPU stage's unfrozen decode graphs (batch 1 and the
general batch: Dynamo specializes a size of 1) is compiled with torch 2.13's ahead-of-time
path (`torch.compile(...).aot_compile`, full graph, every guard dropped as vLLM does) and
saved as one file per graph beside Inductor's caches (`<cache>/tessera-decode/<key>.bin`).
`key` covers what the dropped guards checked: the stage's module structure (types, scalar
attributes, parameter shapes and dtypes), its packs, dtype, page size, fused attention,
the batch case, torch and Python versions, the CPU's vector ISA and the engine's own source.
`obtain` loads the file when it is there and falls back to compiling (and saving) on any
load error, saying why (`Obtained.how`); `Graphs` dispatches a step by its batch size.
Called by `decode_graph.CompiledDecode.warm_up` (CPU, unfrozen, `options.compile_aot`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo.config as dynamo_config

from tessera_agent.engine import model as model_mod
from tessera_agent.engine import packed_linear

log = logging.getLogger(__name__)

FOLDER = "tessera-decode"  # under Inductor's cache folder (`compile_cache.configure`)
_SCALARS = (bool, int, float, str, type(None))


def folder() -> Path:
    """Where saved decode graphs live: beside Inductor's own caches (its folder is read
    from the process's environment at each call, as Inductor reads it)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / FOLDER


@functools.cache
def _source_digest() -> str:
    """The engine package's source: a change to any module a graph traces through (the
    model, attention, the packs' ops) makes every saved graph stale."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _structure(model: model_mod.StageModel) -> list[object]:
    """Every module of the stage: its name, type, scalar attributes (Dynamo traced them as
    constants) and its parameters' and buffers' shapes and dtypes."""
    out: list[object] = []
    for name, mod in model.named_modules():
        scalars = sorted((k, repr(v)) for k, v in vars(mod).items() if isinstance(v, _SCALARS))
        tensors = [
            (n, list(t.shape), str(t.dtype))
            for n, t in (*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False))
        ]
        out.append([name, type(mod).__qualname__, scalars, tensors])
    return out


def key(
    model: model_mod.StageModel,
    packs: packed_linear.GraphPacks | None,
    page_size: int,
    fused: bool,
    batch_one: bool,
) -> str:
    """The saved graph's name: a digest of everything the compiled code assumed."""
    pack_shapes: list[object] = []
    if packs is not None:
        for mod in packed_linear.projections(model):
            pack = packs.get(mod)
            pack_shapes.append(None if pack is None else list(pack.shape))
    parts = {
        "torch": torch.__version__,
        "python": sys.version,
        "machine": platform.machine(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "cfg": repr(dataclasses.asdict(model.cfg)),
        "layers": [model.start, model.end],
        "dtype": str(model.dtype_),
        "structure": _structure(model),
        "packs": pack_shapes if packs is not None else "none",
        "page_size": page_size,
        "fused": fused,
        "batch_one": batch_one,
        "source": _source_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


def _no_guards(entries: list[Any]) -> list[bool]:
    # Every guard dropped: the pack tensors' guards cannot be pickled (oneDNN layout), and
    # `key` stands for the rest (the module structure, dtypes, sizes).
    return [False] * len(entries)


@dataclasses.dataclass
class Obtained:
    """A decode graph and how it was obtained: "loaded" (Dynamo skipped), "compiled" (no
    saved file), or "compiled (saved graph unusable: ...)"."""

    fn: Callable[..., torch.Tensor]
    how: str
    seconds: float

    @property
    def loaded(self) -> bool:
        return self.how == "loaded"


def _compile(fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> Any:
    # Floats specialized: with them symbolic, AOT autograd's tensorify pass restarts the
    # trace (paid twice per graph by plain `torch.compile`; an error in `aot_compile`).
    with dynamo_config.patch(specialize_float=True):
        compiled: Any = torch.compile(
            fn, dynamic=True, fullgraph=True, options={"guard_filter_fn": _no_guards}
        )
        return compiled.aot_compile((args, {}))


def obtain(fn: Callable[..., torch.Tensor], args: tuple[Any, ...], name: str) -> Obtained:
    """The saved graph `name` (a `key`) when it loads, else `fn` compiled for `args` and
    saved under that name (a save that fails is logged: the graph still serves)."""
    t0 = time.perf_counter()
    path = folder() / f"{name}.bin"
    how = "compiled"
    if path.exists():
        try:
            with path.open("rb") as f:
                loaded = torch.compiler.load_compiled_function(f)
            return Obtained(loaded, "loaded", time.perf_counter() - t0)
        except Exception as exc:  # a corrupt or incompatible file: compile afresh
            how = f"compiled (saved graph unusable: {type(exc).__name__}: {exc})"[:300]
            log.warning("saved decode graph %s could not be loaded; compiling: %r", path, exc)
    compiled = _compile(fn, args)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        compiled.save_compiled_function(str(path))
    except Exception:
        log.exception("saved decode graph %s: could not write it", path)
    return Obtained(compiled, how, time.perf_counter() - t0)


class Graphs:
    """A stage's decode graphs as one callable: batch 1 to its own graph, every other
    batch to the general one (the guards that chose between them are dropped). A step over
    other packs or attention than the graphs were built for raises (Dynamo's guards would
    have recompiled; the caller then runs eagerly, loudly)."""

    def __init__(
        self,
        one: Callable[..., torch.Tensor],
        general: Callable[..., torch.Tensor],
        fused: bool,
        packs: packed_linear.GraphPacks | None,
    ) -> None:
        self.one, self.general, self.fused, self.packs = one, general, fused, packs

    def __call__(self, model: model_mod.StageModel, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        # `decode_trace.forward`'s last two arguments: fused attention, the graph's packs
        if rest[-2] is not self.fused or rest[-1] is not self.packs:
            raise RuntimeError("decode graphs built over other packs or attention")
        fn = self.one if x.shape[0] == 1 else self.general
        return fn(model, x, *rest)
