"""Which kernels attend over the paged KV pool: the seam between the engine and a library.

`EngineOptions.attention_backend` names one of `NAMES`; `StageRunner` calls `make` once per
stage and the returned backend's `plan` once per eager step, whose `StepKernel` rides on
the step's `AttentionMetadata.kernel` and is run by every layer (`attention.paged_attention`),
as FlashInfer's wrappers are planned once and run per layer:
- `native`: the engine's own paths (`attention.py`: gathered pages + SDPA for decode, SDPA
  over a prompt's own keys or a gathered context for prefill). No plan, no kernel.
- `flex`: PyTorch's `flex_attention` reading the pool in place through a block mask whose
  blocks are the sequences' pages (`flex_paged.py`).
- `flashinfer`: FlashInfer's paged decode and prefill wrappers (`flashinfer_paged.py`), an
  optional dependency (`pip install 'tessera[gpu]'`) imported only when asked for.
- `auto`: `native` on every device until a GPU run of `tessera bench gpu` measures a
  better one (docs/gpu.md); then pass the winner explicitly.
Both libraries take their page tables from `paged_tables.step_tables`.
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
