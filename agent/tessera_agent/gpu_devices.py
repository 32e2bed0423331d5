"""The GPUs' memory budgets at agent start, measured through a device backend.

`TorchCuda` asks torch (`torch.cuda.mem_get_info`, which also creates this process's CUDA
context, so the context counts as in use); tests pass a fake backend. `measure` turns a
GPU's (free, total) into the pure policy's budget (`tessera.policies.serving.gpu_memory`:
utilization x total less what is in use). Called by `devices.parse_devices`, which sets
each NVML-probed GPU's capacity to its budget and refuses to start on an empty one;
`load_reserve` (called by `hosting.Hosting` per CUDA load) sizes what a block keeps out
of its KV pool for activations and the CUDA-graph pool.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tessera.policies.serving import gpu_memory
from tessera_agent.engine import config, cuda_graphs


class Backend(Protocol):
    def is_available(self) -> bool: ...

    def device_count(self) -> int: ...

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device `index`."""
        ...


class TorchCuda:
    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def mem_get_info(self, index: int) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total)


def backend_problem(backend: Backend, count: int) -> str | None:
    """Why the backend cannot drive the `count` GPUs NVML sees, or None."""
    if not backend.is_available():
        return (
            f"NVML sees GPUs but this torch build has no CUDA support (torch "
            f"{torch.__version__}); install a CUDA build of torch"
        )
    if backend.device_count() < count:
        return (
            f"NVML sees {count} GPUs but torch sees {backend.device_count()} "
            "(check CUDA_VISIBLE_DEVICES)"
        )
    return None


def measure(index: int, utilization: float, backend: Backend) -> gpu_memory.DeviceBudget:
    """GPU `index`'s budget now: `utilization` x total less what is in use."""
    free, total = backend.mem_get_info(index)
    return gpu_memory.device_budget(total, free, utilization)


def load_reserve(
    cfg: config.ModelConfig,
    start: int,
    end: int,
    dtype: torch.dtype,
    tp_size: int,
    max_batched_tokens: int,
    max_num_seqs: int,
    device: torch.device,
) -> gpu_memory.LoadReserve | None:
    """What a load on a CUDA device keeps out of its KV pool (None elsewhere: CPU loads
    book parameters and KV only)."""
    if device.type != "cuda":
        return None
    shape = gpu_memory.ModelShape(
        hidden=cfg.hidden_size,
        intermediate=cfg.intermediate_size // tp_size,
        vocab=cfg.vocab_size,
        q_heads=cfg.num_heads // tp_size,
        kv_heads=max(1, cfg.num_kv_heads // tp_size),
        head_dim=cfg.head_dim,
        layers=end - start,
    )
    graphs = cuda_graphs.enabled(device) and tp_size == 1
    itemsize = torch.empty((), dtype=dtype).element_size()
    return gpu_memory.load_reserve(shape, max_batched_tokens, max_num_seqs, itemsize, graphs)
