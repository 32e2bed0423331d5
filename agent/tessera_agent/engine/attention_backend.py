"""Which kernels attend over the paged KV pool: the seam between the engine and a library.

`EngineOptions.attention_backend` names one of `NAMES`; `StageRunner` calls `make` once per
stage and the backend's `plan` once per eager step; the plan's `StepKernel` rides on
`AttentionMetadata.kernel` and every layer runs it (`attention.paged_attention`). Backends:
`native` (the engine's own gathers + SDPA), `flex` (`flex_paged.py`), `flashinfer`
(`flashinfer_paged.py`, optional `tessera[gpu]`, imported only when asked for), and `auto`
(native until a GPU run of `tessera bench gpu` measures a better one; docs/gpu.md). Both
libraries take their page tables from `paged_tables.step_tables`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from tessera_agent.engine import attention
from tessera_agent.engine import options as options_mod

NAMES = options_mod.ATTENTION_BACKENDS


class Backend(Protocol):
    """A stage's attention library: `plan` turns a step's chunks into the kernel its
    layers run (None: this step takes the native paths)."""

    name: str

    def plan(
        self, chunks: Sequence[attention.Chunk], num_pages: int
    ) -> attention.StepKernel | None: ...


def resolve(name: str, device: torch.device) -> str:
    """The backend a stage on `device` runs for the option `name` (ValueError names a bad
    one). `auto` is `native` everywhere: the library kernels are unmeasured on a GPU
    (docs/gpu.md), and the CPU's native paths are the ones its tokens were proven on."""
    if name not in NAMES:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(NAMES)}")
    return "native" if name == "auto" else name


def make(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    page_size: int,
    heads: tuple[int, int, int],
    scale: float,
) -> Backend | None:
    """The stage's backend for the option `name` (None: native). `heads` is (query heads,
    KV heads, head dim) of this stage's shard. A library that is absent or cannot serve
    the stage raises `paged_tables.BackendUnavailable`, naming what to install or change."""
    chosen = resolve(name, device)
    if chosen == "flex":
        from tessera_agent.engine import flex_paged

        return flex_paged.FlexBackend(device, page_size, heads, scale)
    if chosen == "flashinfer":
        from tessera_agent.engine import flashinfer_paged

        return flashinfer_paged.FlashInferBackend(device, dtype, page_size, heads, scale)
    return None
