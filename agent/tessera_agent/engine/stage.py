"""A loaded block: one layer range of one replica on one device, ready to run steps.

Built by the agent servicer's `LoadBlock` (and by `tessera generate` / tests in-process).
Combines the loader (weights), the KV pool sized from the memory budget left after the
parameters, and the runner. Also provides `LocalDownstream`, an in-process chain of
stages used where no network is wanted (tests of pipelining semantics, the engine bench).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tessera import blocks
from tessera_agent.engine import (
    block_tensors,
    block_zoo,
    dtypes,
    errors,
    kv_cache,
    loader,
    runner,
    step,
    tp,
)
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import options as options_mod

if TYPE_CHECKING:
    from tessera_agent import equivalence, speculate_serve, stitch_serve

DEFAULT_PAGE_SIZE = blocks.DEFAULT_PAGE_SIZE
# What to load: the one block identity (`tessera.blocks.Block`), built positionally as
# `BlockSpec(model_path, start, end, ...)`; `kv_bytes` 0 = all the budget left.
BlockSpec = blocks.Block


def shard(spec: BlockSpec) -> tp.TPShard:
    """The block's slice of its stage's tensor-parallel group."""
    return tp.TPShard(spec.tp_size, spec.tp_rank)


torch_dtype = dtypes.torch_dtype  # a served dtype name's torch dtype


def dtype_of(spec: BlockSpec, cfg: config_mod.ModelConfig) -> torch.dtype:
    """The dtype the block is served in: the spec's, "auto" being the checkpoint's."""
    return dtypes.of_spec(spec.dtype, cfg)


class Stage:
    """A block loaded on a device, with its KV pool and runner."""

    def __init__(
        self,
        spec: BlockSpec,
        cfg: config_mod.ModelConfig,
        runner_: runner.StageRunner,
        param_bytes: int,
        pieces: block_zoo.StagePieces | None = None,
    ) -> None:
        self.spec, self.cfg, self.runner, self.param_bytes = spec, cfg, runner_, param_bytes
        # Its hold on the agent's block zoo (shared parameters); None when not pooled.
        self.pieces = pieces
        # Issue 14: the equivalence report of an opted-in fine-tune (`equivalence_share`).
        self.equivalence: equivalence.ShareReport | None = None
        # Issue 35: a stitched chain's front hands its hidden states on through this stitch.
        self.stitch: stitch_serve.StitchHook | None = None
        # Issue 35: a speculated bottleneck's surrogate; seconds each step is slowed on purpose.
        self.speculate: speculate_serve.SpeculateHook | None = None
        self.slow_s = 0.0

    @property
    def own_param_bytes(self) -> int:
        """Parameter bytes this stage holds outside the zoo (all of them when unpooled; the
        layers an overload restore brought back when pooled, since those bypass the zoo)."""
        if self.pieces is None:
            return self.param_bytes
        pieces = self.pieces
        return max(0, self.param_bytes - sum(pieces.zoo.nbytes(k) for k in pieces.adopted.keys))

    @property
    def dtype(self) -> torch.dtype:
        """The parameter and KV dtype it is served in (the spec's "auto" resolved)."""
        return self.runner.model.dtype_

    @property
    def kv_bytes(self) -> int:
        return self.runner.cache.layout.total_bytes

    @property
    def num_pages(self) -> int:
        return self.runner.cache.layout.num_pages

    def tensor_names(self) -> list[str]:
        return loader.checkpoint_names(self.cfg, self.spec.start, self.spec.end)

    @functools.cached_property
    def _held(self) -> frozenset[str]:
        return frozenset(self.tensor_names())

    def tensor(self, name: str) -> torch.Tensor:
        """A checkpoint tensor of this block, by name (a view of the loaded weights);
        NotFoundError names the layers the block holds when it is not one of them."""
        if name not in self._held:
            raise block_tensors.not_held(self.runner.model, name)
        return block_tensors.tensor(self.runner.model, name)


def plan_bytes(spec: BlockSpec, weights: bool = True) -> tuple[config_mod.ModelConfig, int]:
    """Validate the spec against the checkpoint and return (config, parameter bytes).

    With `weights=False` (a block copied from a peer) only config.json must exist, and the
    bytes come from the shapes it implies."""
    path = Path(spec.model_path)
    if not (path / "config.json").is_file():
        raise errors.NotFoundError(f"model not found: {spec.model_path} has no config.json")
    try:
        cfg = config_mod.ModelConfig.from_path(path)
    except config_mod.ConfigError as exc:
        raise errors.InvalidArgumentError(str(exc)) from exc
    if not 0 <= spec.start < spec.end <= cfg.num_layers:
        raise errors.InvalidArgumentError(
            f"layers: range [{spec.start}, {spec.end}) is invalid for a model of "
            f"{cfg.num_layers} layers (need 0 <= start < end <= {cfg.num_layers})"
        )
    if spec.page_size < 1:
        raise errors.InvalidArgumentError("page_size: must be >= 1")
    why = tp.check(cfg, spec.tp_size)
    if why is not None:
        raise errors.InvalidArgumentError(f"tp_size: {why}")
    dtype = dtype_of(spec, cfg)
    if not weights or spec.tp_size > 1:  # a shard's bytes follow from the shapes
        return cfg, block_tensors.nbytes(cfg, spec.start, spec.end, dtype, shard(spec))
    return cfg, loader.block_bytes(path, cfg, spec.start, spec.end, dtype)


def kv_pages(spec: BlockSpec, cfg: config_mod.ModelConfig, pbytes: int, budget_bytes: int) -> int:
    """KV pages the block gets within `budget_bytes` (parameters plus KV pool);
    ResourceExhaustedError, naming the sizes, when it does not fit."""
    if pbytes > budget_bytes:
        raise errors.ResourceExhaustedError(
            f"block [{spec.start}, {spec.end}) needs {pbytes} bytes of parameters but device "
            f"{spec.device} has {budget_bytes} bytes free"
        )
    kv_budget = spec.kv_bytes or (budget_bytes - pbytes)
    if pbytes + kv_budget > budget_bytes:
        raise errors.ResourceExhaustedError(
            f"block [{spec.start}, {spec.end}) needs {pbytes} bytes of parameters plus "
            f"{kv_budget} of KV cache but device {spec.device} has {budget_bytes} bytes free"
        )
    dtype = dtype_of(spec, cfg)
    n_layers = spec.end - spec.start
    kv_heads = tp.local_sizes(cfg, shard(spec))[1]  # each rank stores its KV heads only
    pages = kv_cache.pages_for_budget(
        kv_budget, n_layers, spec.page_size, kv_heads, cfg.head_dim, dtype
    )
    if pages < 1:
        raise errors.ResourceExhaustedError(
            f"block [{spec.start}, {spec.end}) leaves no room for a single KV page on "
            f"{spec.device} ({kv_budget} bytes left after parameters)"
        )
    return pages


def load_stage(
    spec: BlockSpec,
    device: torch.device,
    budget_bytes: int,
    planned: tuple[config_mod.ModelConfig, int] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
    zoo: block_zoo.BlockZoo | None = None,
    known: Mapping[str, str] | None = None,
    options: options_mod.EngineOptions | None = None,
) -> Stage:
    """Load the block within `budget_bytes` of device memory (parameters plus KV pool),
    from the checkpoint or from `tensors` (by checkpoint name, copied from a peer); its
    runner follows the entry point's engine `options` (None: the defaults).

    With a `zoo` (an unsharded block), pieces whose content the agent already holds are
    shared, not loaded again: only the new ones count against the budget. `known`:
    digests of pieces already known (taken from the host cache), not hashed again."""
    cfg, pbytes = planned or plan_bytes(spec, weights=tensors is None)  # validated by callers
    dtype = dtype_of(spec, cfg)
    if tensors is not None:
        block_tensors.check(cfg, spec.start, spec.end, tensors, shard(spec))
    keys: list[block_zoo.PieceKey] = []
    new_bytes = pbytes
    if zoo is not None and spec.tp_size == 1:
        if tensors is None:
            names = loader.checkpoint_names(cfg, spec.start, spec.end)
            tensors = loader.read_tensors(Path(spec.model_path), names)
        keys = block_zoo.keys(
            cfg, spec.start, spec.end, tensors, dtypes.name_of(dtype), str(device), known
        )
        new_bytes = pbytes - zoo.held_bytes(keys)
    pages = kv_pages(spec, cfg, new_bytes, budget_bytes)
    model = loader.load_stage(
        Path(spec.model_path), cfg, spec.start, spec.end, dtype, device, tensors, shard(spec)
    )
    pieces = None
    if zoo is not None and keys:
        pieces = block_zoo.StagePieces(zoo, zoo.adopt(model, keys))
    try:
        kv_heads = tp.local_sizes(cfg, shard(spec))[1]
        layout = kv_cache.KVLayout(
            spec.end - spec.start, pages, spec.page_size, kv_heads, cfg.head_dim, dtype
        )
        cache = kv_cache.PagedKVCache(layout, device)
        run = runner.StageRunner(model, cache, device, options=options)
        return Stage(spec, cfg, run, pbytes, pieces)
    except BaseException:
        if pieces is not None:  # nothing half-loaded stays referenced in the zoo
            pieces.release()
        raise


class LocalDownstream:
    """Stages after the leader, run in this process on their own single-thread executors."""

    def __init__(self, runners: list[runner.StageRunner]) -> None:
        self.runners = runners
        self.num_pages = min(r.cache.layout.num_pages for r in runners)
        self._pools = [concurrent.futures.ThreadPoolExecutor(1) for _ in runners]
        self.busy_s = [0.0] * len(runners)  # compute seconds per stage (the live bubble)

    async def submit(self, inp: step.StepInput) -> step.StepOutput:
        loop = asyncio.get_running_loop()
        out = step.StepOutput(step_id=inp.step_id)
        cur = inp
        for i, (r, pool) in enumerate(zip(self.runners, self._pools, strict=True)):
            out = await loop.run_in_executor(pool, self._timed, i, r, cur)
            cur = step.next_stage_input(inp, out)
        return out

    def _timed(self, i: int, r: runner.StageRunner, inp: step.StepInput) -> step.StepOutput:
        t0 = time.perf_counter()
        try:
            return r.execute(inp)
        finally:
            self.busy_s[i] += time.perf_counter() - t0

    async def close(self) -> None:
        for p in self._pools:
            p.shutdown(wait=False)
