"""How much of a GPU an agent may book, and what a block reserves beside its KV pool (pure).

Inputs: a GPU's total and free bytes as the device backend measured them at agent start
(`torch.cuda.mem_get_info`: what other processes and this one's CUDA context already hold
is in `total - free`), the utilization knob (`--gpu-memory-utilization`, as vLLM's
`gpu_memory_utilization`), and, per load, the model's shape and step limits. Outputs: a
`DeviceBudget` (the capacity the agent books blocks against, or why none) and a
`LoadReserve` (activations and CUDA-graph pool kept out of the KV pool). With the agent's
rule "KV pool = capacity - bookings - parameters - reserve", a block that takes all the
rest gets KV bytes = utilization x total - in use at start - weights - reserve.
Called by `tessera_agent.gpu_devices` (agent start) and `tessera_agent.hosting` (loads).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_UTILIZATION = 0.9
GIB = 1 << 30
# cuBLAS / cuDNN workspaces and the allocator's fragmentation: kept out of every CUDA load
WORKSPACE_BYTES = 256 << 20
GRAPH_BATCH = 256  # the largest CUDA-graph decode bucket (engine/cuda_graphs.py)


@dataclass(frozen=True)
class DeviceBudget:
    total_bytes: int  # the device's memory
    free_bytes: int  # free when measured (agent start)
    utilization: float  # the fraction of total this agent may use
    capacity_bytes: int  # what blocks may book: utilization x total - in use; 0 when none
    error: str  # "" when the budget is usable, else why not (the agent refuses to start)

    @property
    def in_use_bytes(self) -> int:
        """Held before the agent loads anything (other processes, this CUDA context)."""
        return self.total_bytes - self.free_bytes

    def describe(self) -> str:
        return (
            f"{self.utilization:g} x {self.total_bytes / GIB:.2f} GiB - "
            f"{self.in_use_bytes / GIB:.2f} GiB in use = {self.capacity_bytes / GIB:.2f} GiB"
        )


def check_utilization(utilization: float) -> None:
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization: {utilization} is not in (0, 1]")


def device_budget(total_bytes: int, free_bytes: int, utilization: float) -> DeviceBudget:
    """The bytes an agent may book on one GPU: `utilization x total` less what is already
    in use. As vLLM does, memory other processes hold counts against the fraction, and a
    fraction smaller than what is already taken is an error naming both."""
    check_utilization(utilization)
    if total_bytes <= 0 or not 0 <= free_bytes <= total_bytes:
        raise ValueError(f"device memory: free {free_bytes} of total {total_bytes} is not valid")
    want = int(utilization * total_bytes)
    capacity = want - (total_bytes - free_bytes)
    error = ""
    if capacity <= 0:
        error = (
            f"{(total_bytes - free_bytes) / GIB:.2f} GiB of {total_bytes / GIB:.2f} GiB are "
            f"already in use, more than gpu_memory_utilization {utilization:g} allows "
            f"({want / GIB:.2f} GiB): raise --gpu-memory-utilization or free the device"
        )
        capacity = 0
    return DeviceBudget(total_bytes, free_bytes, utilization, capacity, error)


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    vocab: int
    q_heads: int
    kv_heads: int
    head_dim: int
    layers: int  # in the block


@dataclass(frozen=True)
class LoadReserve:
    activation_bytes: int  # the largest step's temporaries (max_batched_tokens rows)
    graph_bytes: int  # the CUDA-graph pool (largest bucket's temporaries), 0 without graphs
    workspace_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.graph_bytes + self.workspace_bytes


def _step_bytes(shape: ModelShape, rows: int, logit_rows: int, elem: int) -> int:
    """Peak temporaries of one layer's step over `rows` token rows (one layer's are freed
    before the next runs), plus the sampled rows' float32 logits."""
    qkv = (shape.q_heads + 2 * shape.kv_heads) * shape.head_dim
    per_row = (
        2 * shape.hidden  # residual stream + normed input
        + qkv  # packed q / k / v
        + shape.q_heads * shape.head_dim  # attention output
        + 3 * shape.intermediate  # packed gate/up + activation
    )
    return rows * per_row * elem + logit_rows * shape.vocab * 4 * 2  # logits + log-softmax


def load_reserve(
    shape: ModelShape,
    max_batched_tokens: int,
    max_num_seqs: int,
    dtype_bytes: int,
    graphs: bool,
) -> LoadReserve:
    """What a CUDA load keeps out of its KV pool: one step of `max_batched_tokens` rows
    (logits for up to `max_num_seqs` of them), the graph pool when decode is captured
    (the largest bucket's step, which the graphs keep), and a fixed workspace."""
    if max_batched_tokens < 1 or max_num_seqs < 1 or dtype_bytes < 1:
        raise ValueError("load_reserve: max_batched_tokens, max_num_seqs, dtype_bytes >= 1")
    seqs = min(max_num_seqs, max_batched_tokens)
    act = _step_bytes(shape, max_batched_tokens, seqs, dtype_bytes)
    graph_rows = min(GRAPH_BATCH, max_num_seqs)
    graph = _step_bytes(shape, graph_rows, graph_rows, dtype_bytes) if graphs else 0
    return LoadReserve(act, graph, WORKSPACE_BYTES)
