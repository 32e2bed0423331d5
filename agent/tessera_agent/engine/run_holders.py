"""The holders of a replicated layer run: the stage's own layers, or a copy of them.

`OriginHolder` runs the stage's own layers of the run inline on the compute thread;
`LocalHolder` runs a `RunModel` (the layers without embedding or head, with a KV pool of
the stage's page ids) on another device of this agent, on a thread of its own; the
agent's `run_client.RemoteHolder` runs one on another agent. Each implements `Holder`:
run a step's sub-batch, move K/V pages out and in, close. Used by `layer_run.py` (the
run), `scaling_ops.py` (building holders) and the agent's `scaling_host` (remote copies).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from tessera_agent.engine import attention, config, errors, kv_cache, loader, step, tp
from tessera_agent.engine import model as model_mod

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer of the run: K and V of the pages


class Holder(Protocol):
    """One holder of a run's layers (the origin, or a replica)."""

    name: str  # unique within the run, e.g. "agent-1/cpu:0"
    param_bytes: int
    kv_bytes: int

    def submit(
        self, step_id: int, chunks: list[step.SeqChunk], hidden: torch.Tensor
    ) -> concurrent.futures.Future[tuple[torch.Tensor, float]]:
        """Run the sub-batch through the run's layers: (hidden out, seconds taken)."""
        ...

    def export_pages(self, pages: list[int]) -> KV: ...

    def import_pages(self, pages: list[int], kv: KV) -> None: ...

    def close(self) -> None: ...


class RunModel:
    """Layers [start, end) of a model and a KV pool for them, without embedding or head."""

    def __init__(
        self,
        cfg: config.ModelConfig,
        start: int,
        end: int,
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        num_pages: int,
        page_size: int,
    ) -> None:
        with torch.device("meta"):
            m = model_mod.StageModel(cfg, start, end)
        m.embed_tokens = m.norm = m.lm_head = None
        m.is_first = m.is_last = False
        m = m.to_empty(device=device).to(dtype)
        m.dtype_ = dtype
        m.inv_freq = model_mod.rope_inv_freq(cfg.head_dim, cfg.rope).to(device)
        missing, unexpected = m.load_state_dict(
            loader.layer_state(cfg, start, end, tensors), strict=False
        )
        missing = [k for k in missing if k != "inv_freq"]
        if missing or unexpected:
            raise errors.FailedPreconditionError(
                f"layer run tensors: missing {missing}, unexpected {unexpected}"
            )
        m.eval()
        self.model, self.device, self.start, self.end = m, device, start, end
        kv_heads = tp.local_sizes(cfg, tp.SINGLE)[1]
        layout = kv_cache.KVLayout(end - start, num_pages, page_size, kv_heads, cfg.head_dim, dtype)
        self.cache = kv_cache.PagedKVCache(layout, device)
        self.param_bytes = sum(p.numel() * p.element_size() for p in m.parameters())

    @property
    def kv_bytes(self) -> int:
        return self.cache.layout.total_bytes

    @torch.inference_mode()
    def run(self, chunks: Sequence[step.SeqChunk], hidden: torch.Tensor) -> torch.Tensor:
        md = attention.build_metadata(chunks, self.cache.layout.page_size, self.device)
        x = hidden.to(self.device, self.model.dtype_)
        return self.model.forward_layers(x, md, self.cache.layers(), 0, self.end - self.start)

    def export_pages(self, pages: list[int]) -> KV:
        return export_pages(self.cache, range(self.end - self.start), pages)

    def import_pages(self, pages: list[int], kv: KV) -> None:
        import_pages(self.cache, range(self.end - self.start), pages, kv)


def layer_tensors(model: model_mod.StageModel, start: int, end: int) -> dict[str, torch.Tensor]:
    """Checkpoint-named tensors of decoder layers [start, end) of a loaded stage (views)."""
    from tessera_agent.engine import block_tensors

    names = [
        n for n in loader.checkpoint_names(model.cfg, start, end) if n.startswith("model.layers.")
    ]
    return {n: block_tensors.tensor(model, n) for n in names}


def export_pages(cache: kv_cache.PagedKVCache, layers: range, pages: list[int]) -> KV:
    n = len(pages) * cache.layout.page_size
    return [cache.export_sequence(i, pages, n) for i in layers]


def import_pages(cache: kv_cache.PagedKVCache, layers: range, pages: list[int], kv: KV) -> None:
    if len(kv) != len(layers):
        raise errors.InvalidArgumentError(f"KV for {len(kv)} layers, the run has {len(layers)}")
    for i, (k, v) in zip(layers, kv, strict=True):
        cache.import_sequence(i, pages, k, v)


def kv_nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


class LocalHolder:
    """A replica of the run on another device of this agent, on a thread of its own."""

    def __init__(self, name: str, run_model: RunModel) -> None:
        self.name, self.run_model = name, run_model
        self.param_bytes, self.kv_bytes = run_model.param_bytes, run_model.kv_bytes
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"run-{name}")

    def _run(self, chunks: list[step.SeqChunk], hidden: torch.Tensor) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        out = self.run_model.run(chunks, hidden)
        return out, time.perf_counter() - t0

    def submit(
        self, step_id: int, chunks: list[step.SeqChunk], hidden: torch.Tensor
    ) -> concurrent.futures.Future[tuple[torch.Tensor, float]]:
        return self._pool.submit(self._run, chunks, hidden)

    def export_pages(self, pages: list[int]) -> KV:
        return self.run_model.export_pages(pages)

    def import_pages(self, pages: list[int], kv: KV) -> None:
        self.run_model.import_pages(pages, kv)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


class VacatedLayer(nn.Module):
    """Stands in for a layer whose run migrated away (its weights are released)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, *args: object) -> torch.Tensor:
        raise RuntimeError(f"layer {self.index} migrated away from this stage")


class OriginHolder:
    """The stage's own layers of the run, computed inline on the compute thread."""

    def __init__(
        self, name: str, model: model_mod.StageModel, cache: kv_cache.PagedKVCache, lo: int, hi: int
    ) -> None:
        self.name, self.model, self.cache, self.lo, self.hi = name, model, cache, lo, hi
        self.param_bytes = sum(
            p.numel() * p.element_size() for m in model.layers[lo:hi] for p in m.parameters()
        )
        self.kv_bytes = (hi - lo) * cache.layout.total_bytes // max(1, cache.layout.num_layers)

    def submit(
        self, step_id: int, chunks: list[step.SeqChunk], hidden: torch.Tensor
    ) -> concurrent.futures.Future[tuple[torch.Tensor, float]]:
        fut: concurrent.futures.Future[tuple[torch.Tensor, float]] = concurrent.futures.Future()
        t0 = time.perf_counter()
        md = attention.build_metadata(chunks, self.cache.layout.page_size, hidden.device)
        out = self.model.forward_layers(hidden, md, self.cache.layers(), self.lo, self.hi)
        fut.set_result((out, time.perf_counter() - t0))
        return fut

    def export_pages(self, pages: list[int]) -> KV:
        return export_pages(self.cache, range(self.lo, self.hi), pages)

    def import_pages(self, pages: list[int], kv: KV) -> None:
        import_pages(self.cache, range(self.lo, self.hi), pages, kv)

    def close(self) -> None:
        """Release the run's weights and KV on the stage (after a migration away)."""
        for i in range(self.lo, self.hi):
            self.model.layers[i] = VacatedLayer(self.model.start + i)
            self.cache.k[i] = self.cache.k[i].new_empty((0, *self.cache.k[i].shape[1:]))
            self.cache.v[i] = self.cache.v[i].new_empty((0, *self.cache.v[i].shape[1:]))
