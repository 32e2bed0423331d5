"""Per-load defaults of an agent, validated once: what a `LoadBlock` leaves unset.

Built by `server.serve` from the agent's configuration and passed to `hosting.Hosting`
and `leader.make_leader`; a request's explicit value always wins over these.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera import blocks
from tessera_agent.engine import scheduler

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LoadDefaults:
    dtype: str = "float32"  # parameter and KV dtype
    page_size: int = blocks.DEFAULT_PAGE_SIZE  # tokens per KV page
    # leader scheduler limits: sequences running at once, tokens per step
    max_num_seqs: int = scheduler.SchedulerConfig.max_num_seqs
    max_batched_tokens: int = scheduler.SchedulerConfig.max_batched_tokens
    prefix_caching: bool = True  # leaders reuse KV pages of prompt prefixes computed before
    block_zoo: bool = True  # identical parameter pieces of blocks held once (block_zoo.py)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {list(DTYPES)}")
        for name in ("page_size", "max_num_seqs", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
