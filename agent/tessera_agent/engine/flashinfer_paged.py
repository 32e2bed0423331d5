"""Paged attention with FlashInfer: its decode and prefill wrappers over the engine's pool.

The pool `[num_slots, nkv, hd]` is FlashInfer's "NHD" paged layout once viewed as
`[num_pages, page_size, nkv, hd]` (no copy). Per step, `plan` hands each wrapper the CSR
page table of its group (`paged_tables.step_tables`: `kv_indptr`, `kv_indices`,
`kv_last_page_len`, and `qo_indptr` for prefill), and every layer's `attend` runs them:
`BatchDecodeWithPagedKVCacheWrapper` for the one-token rows, and
`BatchPrefillWithPagedKVCacheWrapper` (causal, queries aligned to the end of each context,
as a chunk's are) for every prompt chunk, fresh or continued.
FlashInfer (`flashinfer-python`, the `gpu` extra) is optional: imported only when a stage
asks for this backend; absent, or on a device or dtype it does not serve (CUDA, float16 /
bfloat16), the stage's load fails with `BackendUnavailable` saying so.
Made by `attention_backend.make`; planned per step by the runner; run by every layer.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from tessera_agent.engine import attention, paged_tables

WORKSPACE_BYTES = 128 << 20  # per wrapper, FlashInfer's recommended size
INSTALL = "pip install 'tessera[gpu]' (flashinfer-python; docs/gpu.md for an offline machine)"


def load(module: str = "flashinfer") -> ModuleType:
    """The FlashInfer module, or `BackendUnavailable` naming how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise paged_tables.BackendUnavailable(
            f"attention backend 'flashinfer' needs FlashInfer ({exc}): {INSTALL}"
        ) from exc


class FlashInferKernel:
    """One step: the wrappers planned with its tables; `attend` is run by every layer."""

    def __init__(
        self,
        backend: FlashInferBackend,
        tables: paged_tables.StepTables,
        decode_rows: torch.Tensor | None,
        prefill_rows: torch.Tensor | None,
    ) -> None:
        self.b, self.tables = backend, tables
        self.decode_rows, self.prefill_rows = decode_rows, prefill_rows

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        ps = self.b.ps
        nkv, hd = k_cache.shape[1], k_cache.shape[2]
        kv = (k_cache.view(-1, ps, nkv, hd), v_cache.view(-1, ps, nkv, hd))
        od = op = None
        t = q.shape[0]
        if self.decode_rows is not None:
            rows = self.decode_rows
            lead = self.tables.decode_leading and rows.numel() == t
            # (q is a view into the packed q/k projection: made contiguous for the kernel)
            od = self.b.decode.run(q.contiguous() if lead else q.index_select(0, rows), kv)
        if self.prefill_rows is not None:
            rows = self.prefill_rows
            op = self.b.prefill.run(
                q.contiguous() if rows.numel() == t else q.index_select(0, rows), kv
            )
        return paged_tables.assemble(
            self.tables.num_tokens, q, self.tables, self.decode_rows, self.prefill_rows, od, op
        )


class FlashInferBackend:
    """A stage's FlashInfer wrappers (one decode, one prefill, each with its workspace)."""

    name = "flashinfer"

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        page_size: int,
        heads: tuple[int, int, int],
        scale: float,
        require_cuda: bool = True,
    ) -> None:
        """`require_cuda`: False only in tests driving a stand-in module on CPU."""
        if dtype not in (torch.float16, torch.bfloat16):
            raise paged_tables.BackendUnavailable(
                f"attention backend 'flashinfer' serves float16 / bfloat16 stages, not {dtype}"
            )
        fi = load()
        if device.type != "cuda" and require_cuda:
            raise paged_tables.BackendUnavailable(
                f"attention backend 'flashinfer' runs on CUDA devices, not {device}"
            )
        self.device, self.dtype, self.ps, self.heads, self.scale = (
            device, dtype, page_size, heads, scale,
        )  # fmt: skip

        def workspace() -> torch.Tensor:
            # zeroed: FlashInfer requires it for the first use
            return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

        # Tensor cores for decode when query heads share a KV head four or more ways
        # (grouped queries fill an MMA tile), as vLLM chooses.
        tc = heads[0] // heads[1] >= 4
        self.decode: Any = fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace(), "NHD", use_tensor_cores=tc
        )
        self.prefill: Any = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")

    def _i32(self, xs: Sequence[int], on_device: bool = False) -> torch.Tensor:
        """An int32 plan array: offsets and lengths on the host (FlashInfer plans from
        host copies, as vLLM passes them), page indices on the device (read by kernels)."""
        t = torch.tensor(xs, dtype=torch.int32)
        return t.to(self.device) if on_device else t

    def plan(
        self, chunks: Sequence[attention.Chunk], num_pages: int
    ) -> attention.StepKernel | None:
        tables = paged_tables.step_tables(chunks, self.ps)
        nh, nkv, hd = self.heads
        common = {"q_data_type": self.dtype, "kv_data_type": self.dtype, "sm_scale": self.scale}
        dec_rows = pre_rows = None
        d, p = tables.decode, tables.prefill
        if d.chunks:
            self.decode.plan(
                self._i32(d.kv_indptr),
                self._i32(d.kv_indices, on_device=True),
                self._i32(d.kv_last_page_len),
                nh,
                nkv,
                hd,
                self.ps,
                pos_encoding_mode="NONE",
                **common,
            )
            dec_rows = torch.tensor(d.rows, dtype=torch.long, device=self.device)
        if p.chunks:
            self.prefill.plan(
                self._i32(p.qo_indptr),
                self._i32(p.kv_indptr),
                self._i32(p.kv_indices, on_device=True),
                self._i32(p.kv_last_page_len),
                nh,
                nkv,
                hd,
                self.ps,
                causal=True,
                pos_encoding_mode="NONE",
                **common,
            )
            pre_rows = torch.tensor(p.rows, dtype=torch.long, device=self.device)
        return FlashInferKernel(self, tables, dec_rows, pre_rows)
