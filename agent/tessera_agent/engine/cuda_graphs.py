"""Pure-decode steps replayed from CUDA graphs captured once per (batch, context) bucket.

As in vLLM's `capture_model`: a decode step of B sequences with longest context L is padded to
the smallest captured bucket (B', L') and replayed from its graph. Each bucket owns static input
buffers (ids or hidden states, positions, slots to write, gather table and additive mask) that
the step's metadata is copied into; the KV pool is the stage's own and is never reallocated
while graphs are held. Context lengths are data, so no step compiles a graph. Padded rows
repeat row 0; padded context columns read slot 0 under a -inf mask.
Capture runs on the step thread (`StageRunner.capture_graphs` or the first pure-decode step);
the graph API is injectable (`FakeGraphs` runs it on CPU in tests). Used by `runner.py` on
CUDA unless `TESSERA_CUDA_GRAPHS=0` (`options.EngineOptions`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from tessera_agent.engine import attention
from tessera_agent.engine import model as model_mod

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
MIN_CONTEXT_BUCKET = 256
# Capture stops after this many seconds (the buckets left run eagerly): a load is never
# held up for long by graphs (2.8 s for the 66 buckets of a 16-layer stage on an H200).
CAPTURE_BUDGET_S = 30.0
# Buckets of more (batch x context) than this are not captured (their gathered K/V would
# hold gigabytes of the graph pool); such steps run eagerly.
MAX_BUCKET_TOKENS = 256 * 2048
KV = list[tuple[torch.Tensor, torch.Tensor]]


def enabled(device: torch.device) -> bool:
    """For CUDA stages (unless the entry point's `EngineOptions.cuda_graphs` is off:
    `TESSERA_CUDA_GRAPHS=0`, checked by `runner.py`)."""
    return device.type == "cuda"


def context_buckets(max_len: int, page_size: int) -> tuple[int, ...]:
    """Context buckets: powers of two from `MIN_CONTEXT_BUCKET` up to one covering
    `max_len`, each a whole number of pages."""
    out: list[int] = []
    c = MIN_CONTEXT_BUCKET
    while True:
        out.append(-(-c // page_size) * page_size)
        if c >= max_len:
            return tuple(out)
        c *= 2


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """`BATCH_BUCKETS` up to the first one covering `max_batch`."""
    out = [b for b in BATCH_BUCKETS if b < max_batch]
    out.append(next((b for b in BATCH_BUCKETS if b >= max_batch), max_batch))
    return tuple(out)


def pick(buckets: tuple[int, ...], n: int) -> int | None:
    """The smallest bucket holding `n`, or None."""
    return next((b for b in buckets if b >= n), None)


class GraphAPI(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Record `fn`; return a replay callable and the output tensor replays write."""
        ...


class CudaGraphs:
    """torch.cuda.CUDAGraph, warmed up on a side stream, all graphs in one memory pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        # (looked up by name: its constructor is unannotated in some torch releases)
        stream = getattr(torch.cuda, "Stream")(self.device)  # noqa: B009
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph.replay, out


class FakeGraphs:
    """CPU stand-in: replay re-runs the function into the captured output."""

    def __init__(self) -> None:
        self.captured = 0
        self.replays = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        out = fn()
        self.captured += 1

        def replay() -> None:
            self.replays += 1
            out.copy_(fn())

        return replay, out


@dataclass
class Bucket:
    """Static buffers and the graph of one (batch, context) bucket."""

    batch: int
    context: int
    x: torch.Tensor  # [B] token ids (first stage) or [B, hidden] hidden states
    positions: torch.Tensor  # [B]
    slots: torch.Tensor  # [B] KV slot each row writes
    gather: torch.Tensor  # [B, L] KV slots each row reads
    mask: torch.Tensor  # [B, 1, 1, L] additive, in the model's dtype
    replay: Callable[[], None] | None = None
    out: torch.Tensor | None = None  # [B, vocab] logits on the last stage, else [B, hidden]


class DecodeGraphs:
    """The captured buckets of one stage; `run` replays a pure-decode step or says no."""

    def __init__(
        self,
        model: model_mod.StageModel,
        device: torch.device,
        max_batch: int,
        max_context: int,
        page_size: int,
        api: GraphAPI | None = None,
    ) -> None:
        self.model, self.device = model, device
        self.batches = batch_buckets(max_batch)
        self.contexts = context_buckets(max_context, page_size)
        self.max_context = self.contexts[-1]
        self.api = api
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self.capture_s: float | None = None
        self.pool_bytes = 0  # device memory the capture reserved (CUDA)
        self.budget_s = CAPTURE_BUDGET_S
        self.skipped = 0  # buckets left uncaptured when the budget ran out
        self.replays = 0
        self.error: str | None = None

    @property
    def ready(self) -> bool:
        return self.capture_s is not None and self.error is None

    def _buffers(self, b: int, length: int) -> Bucket:
        dev, m = self.device, self.model
        x = (
            torch.zeros(b, dtype=torch.long, device=dev)
            if m.is_first
            else torch.zeros(b, m.cfg.hidden_size, dtype=m.dtype_, device=dev)
        )
        return Bucket(
            b,
            length,
            x,
            torch.zeros(b, dtype=torch.long, device=dev),
            torch.zeros(b, dtype=torch.long, device=dev),
            torch.zeros(b, length, dtype=torch.long, device=dev),
            torch.zeros(b, 1, 1, length, dtype=m.dtype_, device=dev),
        )

    def _forward(self, bk: Bucket, kv: KV) -> torch.Tensor:
        md = attention.AttentionMetadata(
            positions=bk.positions,
            slot_mapping=bk.slots,
            decode_rows=torch.arange(bk.batch, device=self.device),
            decode_gather=bk.gather,
            decode_mask=bk.mask,
            prefill=[],
            decode_leading=True,
            max_position=self.max_context - 1,
        )
        hidden = self.model(bk.x, md, kv)
        return self.model.logits(hidden) if self.model.is_last else hidden

    @torch.inference_mode()
    def capture(self, kv: KV) -> float:
        """Capture every bucket (largest first, so the pool's blocks are reused); run on
        the thread that will replay. Writes only slot 0 of the pool: call before any
        sequence holds pages (at load), or between steps: slot 0 is restored after."""
        t0 = time.perf_counter()
        cuda = self.device.type == "cuda"
        reserved = torch.cuda.memory_reserved(self.device) if cuda else 0
        api = self.api or CudaGraphs(self.device)
        # The RoPE table covers every bucket's positions before anything is recorded.
        self.model.rope_tables(
            torch.zeros(1, dtype=torch.long, device=self.device), self.max_context
        )
        # Warm-up and capture write slot 0 of every layer: keep what it holds.
        saved = [(k[0].clone(), v[0].clone()) for k, v in kv]
        try:
            for b in sorted(self.batches, reverse=True):
                for length in sorted(self.contexts, reverse=True):
                    if b * length > MAX_BUCKET_TOKENS:
                        continue
                    if time.perf_counter() - t0 > self.budget_s:
                        self.skipped += 1
                        continue
                    bk = self._buffers(b, length)
                    bk.replay, bk.out = api.capture(functools.partial(self._forward, bk, kv))
                    self.buckets[(b, length)] = bk
        finally:
            for (k, v), (k0, v0) in zip(kv, saved, strict=True):
                k[0].copy_(k0)
                v[0].copy_(v0)
        if cuda:  # what the graphs' pool holds, for the agent's memory accounting
            self.pool_bytes = max(0, torch.cuda.memory_reserved(self.device) - reserved)
        self.capture_s = time.perf_counter() - t0
        return self.capture_s

    def bucket_for(self, b: int, lmax: int) -> Bucket | None:
        nb, nl = pick(self.batches, b), pick(self.contexts, lmax)
        if nb is None or nl is None:
            return None
        return self.buckets.get((nb, nl))

    def run(self, x: torch.Tensor, md: attention.AttentionMetadata) -> torch.Tensor | None:
        """The step's output rows (logits on the last stage, hidden states otherwise)
        replayed from its bucket; None when the step is not a pure decode that fits."""
        b = md.decode_rows.numel()
        if not self.ready or b == 0 or md.prefill or md.fresh or not md.decode_leading:
            return None
        if b != md.positions.numel():
            return None
        lmax = md.decode_gather.shape[1]
        bk = self.bucket_for(b, lmax)
        if bk is None or bk.replay is None or bk.out is None:
            return None
        pad = bk.batch - b
        bk.x[:b].copy_(x)
        bk.positions[:b].copy_(md.positions)
        bk.slots[:b].copy_(md.slot_mapping)
        bk.gather[:b, :lmax].copy_(md.decode_gather)
        bk.gather[:b, lmax:].zero_()
        bk.mask[:b, ..., :lmax].copy_(md.decode_mask)
        bk.mask[:b, ..., lmax:].fill_(float("-inf"))
        if pad:
            for t in (bk.x, bk.positions, bk.slots, bk.gather, bk.mask):
                t[b:].copy_(t[:1].expand_as(t[b:]))
        bk.replay()
        self.replays += 1
        return bk.out[:b].clone()
