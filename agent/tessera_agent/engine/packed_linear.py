"""Prompt rows through prepacked weights: a stage's projections in oneDNN's blocked layout,
packed once instead of on every eager matmul.

`StagePacks` holds every layer projection of a stage packed with
`torch.ops.mkldnn._reorder_linear_weight`; `linear` runs a projection of at least
`MIN_ROWS` rows through `mkldnn._linear_pointwise` over it, rows padded to a multiple of
`ROW_BUCKET` (fewer rows stay on `F.linear`); the compiled decode graph reads the same packs
as inputs (`GraphPacks`). A pack is tied to the weight it was packed from: a swapped layer
runs `F.linear`. Built by `CompiledDecode.warm_up` (CPU, float32, no LoRA, no TP; off with
`EngineOptions.pack_prompts`; kernels warmed beside the graphs: `warm_beside`), dropped with
the graph; its bytes are booked with it (`compile_policy.packed_bytes`). Measured gains:
docs (benchmarks-log, issue 16). Checked against `transformers` in
`tests/engine/test_packed_linear.py`. Called by `model.py` (eager projections;
`AttentionMetadata.packed`, set by `runner.py`) and `decode_graph.py`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tessera_agent.engine import attention, omp_teams

log = logging.getLogger(__name__)

MIN_ROWS = 64  # fewer rows: F.linear (measured no faster packed at 4-32 rows)
# Rows are padded to a multiple of this: oneDNN builds (JIT-compiles) a kernel per row
# count, and a served replica's eager steps have hundreds of distinct counts (unpadded,
# that made packed projections 2-16 % slower than F.linear on varying counts, and served
# throughput 11 % lower); padded to 32, 15-16 % faster (1 thread), 22 % (2 threads).
ROW_BUCKET = 32
_HINT_ROWS = 256  # the batch size oneDNN picks its blocking for (a step's prompt rows)
WARM_FLOPS = 200e9  # GEMM work `StagePacks.warm` may spend building kernels ahead


class Stage(Protocol):
    """What packing needs of a stage (`model.StageModel` has it; declared here so that
    this module, which `model.py` calls, imports no model)."""

    dtype_: torch.dtype

    @property
    def layers(self) -> nn.ModuleList: ...


def packable(model: Stage) -> bool:
    """Stages whose projections this packs: float32 weights on a CPU device."""
    return model.dtype_ == torch.float32 and all(
        p.device.type == "cpu" for p in model.layers.parameters()
    )


def projections(model: Stage) -> list[nn.Linear]:
    """Every projection of the stage's layers (what the packs and the graph's copy hold)."""
    return [m for layer in model.layers for m in layer.modules() if isinstance(m, nn.Linear)]


class StagePacks:
    """Packed copies of one stage's projection weights, by module."""

    def __init__(self, model: Stage) -> None:
        self._packs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (weight, pack)
        with torch.inference_mode():
            for mod in projections(model):
                w = mod.weight.detach()
                self._packs[id(mod)] = (mod.weight, _reorder(w))
        self.nbytes = sum(w.nbytes for w, _ in self._packs.values())
        # The compiled row-wise layer parts over these packs (`prompt_graph.py`), once warm.
        self.graph: attention.PromptRows | None = None

    def warm(self, model: Stage, max_rows: int) -> float:
        """Run each distinct projection shape once per row bucket up to `max_rows`, so that
        oneDNN builds its per-shape kernels here (JIT, ~1-3 ms a shape) rather than on the
        first served steps of each size. Smallest buckets first, within `WARM_FLOPS` of
        GEMMs (the default tiny model's 63 buckets x 4 shapes: ~100 GFLOP, ~1.8 s on the
        warm-up thread); past that a GEMM outweighs its JIT anyway. Returns the seconds."""
        t0 = time.perf_counter()
        shapes: dict[tuple[int, int, bool], tuple[nn.Linear, torch.Tensor]] = {}
        for mod in projections(model):
            pack = self.get(mod)
            key = (mod.in_features, mod.out_features, mod.bias is not None)
            if pack is not None:
                shapes.setdefault(key, (mod, pack))
        per_row = sum(2 * k[0] * k[1] for k in shapes)
        budget = WARM_FLOPS
        # One zero buffer per input width, sliced per bucket (a fresh tensor per GEMM was
        # a parallel fill each: seconds on a loaded machine).
        zeros: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        with torch.inference_mode():
            for rows in range(MIN_ROWS, max_rows + 1, ROW_BUCKET):
                budget -= rows * per_row
                if budget < 0:
                    break
                for mod, pack in shapes.values():
                    width = (mod.in_features, mod.weight.dtype)
                    if width not in zeros:
                        zeros[width] = torch.zeros(max_rows, width[0], dtype=width[1])
                    run_packed(zeros[width][:rows], pack, mod.bias)
        return time.perf_counter() - t0

    def warm_beside(self, model: Stage, max_rows: int, release: bool) -> threading.Thread:
        """`warm` on a thread of its own (GEMMs: the GIL released), beside the caller's
        Python-bound work (a graph's load or trace); the caller joins it. `release`: the
        thread frees its OpenMP team when done (`omp_teams.py`). A failure is logged (the
        kernels are then built by the first steps)."""

        def work() -> None:
            try:
                took = self.warm(model, max_rows)
                log.info("packed kernels built in %.1f s", took)
            except Exception:
                log.exception("packed kernels: warm-up failed")
            finally:
                if release:
                    omp_teams.release()

        thread = threading.Thread(target=work, name="pack-kernels", daemon=True)
        thread.start()
        return thread

    def get(self, mod: nn.Module) -> torch.Tensor | None:
        """The pack of `mod`'s current weight, or None (not packed here, or swapped)."""
        got = self._packs.get(id(mod))
        if got is None or not isinstance(mod, nn.Linear) or got[0] is not mod.weight:
            return None
        return got[1]


class GraphPacks:
    """The packs as the compiled decode graph reads them (`decode_graph.py`, unfrozen):
    every projection of any row count through its pack, rows not padded (the graph's
    batch size is symbolic; oneDNN builds one kernel per batch size, as for the frozen
    graph's own packs). The pack tensors become inputs of the graph, not constants, so
    Inductor's FX graph and AOT autograd caches can hold the graph across restarts: a
    list in projection order, so that the graph's input names (Dynamo names them by
    where it found them) are the same in every process."""

    graph: attention.PromptRows | None = None

    def __init__(self, model: Stage, packs: StagePacks) -> None:
        _register_lowering()
        self._items = [(mod, packs.get(mod)) for mod in projections(model)]

    def get(self, mod: nn.Module) -> torch.Tensor | None:
        for m, pack in self._items:
            if m is mod:
                return pack
        return None


def _reorder(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, _HINT_ROWS)  # type: ignore[no-any-return]


def linear(mod: nn.Module, x: torch.Tensor, packs: attention.PackedRows | None) -> torch.Tensor:
    """`mod(x)`, through the packed weight when there is one and `x` has enough rows."""
    t = x.shape[0]
    whole = isinstance(packs, GraphPacks)  # the compiled decode: every row count, unpadded
    if packs is not None and (whole or t >= MIN_ROWS):
        pack = packs.get(mod)
        if pack is not None:
            bias = mod.bias if isinstance(mod, nn.Linear) else None
            if whole:
                out: torch.Tensor = _decode_linear_op(x, pack, bias)
                return out
            return run_packed(x, pack, bias)
    y: torch.Tensor = mod(x)
    return y


def run_packed(x: torch.Tensor, pack: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x @ W.T + bias` over `pack` (W packed by `StagePacks`), rows padded to the bucket."""
    t = x.shape[0]
    padded = -(-t // ROW_BUCKET) * ROW_BUCKET
    if padded != t:  # zero rows up to the bucket; their outputs are dropped
        x = F.pad(x, (0, 0, 0, padded - t))
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, pack, bias, "none", [], "")
    return out[:t]


# Inductor lowers `mkldnn._linear_pointwise` only over a constant (frozen) weight, so the
# graph calls this op instead; its lowering (`_lower_decode_linear`) makes Inductor's code
# call the oneDNN op directly, as an extern kernel (no Python between them).
@torch.library.custom_op("tessera::decode_linear", mutates_args=())
def _decode_linear_op(
    x: torch.Tensor, pack: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, pack, bias, "none", [], "")
    return out


@_decode_linear_op.register_fake
def _(x: torch.Tensor, pack: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], pack.shape[0])


@functools.cache
def _register_lowering() -> None:
    """Once per process, before the first graph that calls the op compiles."""
    from torch._inductor import lowering

    onednn = torch.ops.mkldnn._linear_pointwise.default
    # (untyped in torch: through a typed name)
    extern: Callable[..., Callable[..., Any]] = vars(lowering)["fallback_handler"]

    @lowering.register_lowering(torch.ops.tessera.decode_linear.default, type_promotion_kind=None)
    def _lower_decode_linear(x: Any, pack: Any, bias: Any) -> Any:
        return extern(onednn, add_to_fallback_set=False)(x, pack, bias, "none", [], "")
