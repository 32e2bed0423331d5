"""Per-load defaults of an agent, validated once: what a `LoadBlock` leaves unset.

Built by `server.serve` from the agent's configuration and passed to `hosting.Hosting`
and `leader.make_leader`; a request's explicit value always wins over these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera import blocks, dtypes
from tessera.policies.overload import microbatch
from tessera.rpc import transport
from tessera_agent.engine import options as options_mod
from tessera_agent.engine import scheduler

DTYPES = dtypes.CHOICES


@dataclass(frozen=True)
class LoadDefaults:
    dtype: str = dtypes.AUTO  # parameter and KV dtype ("auto": the checkpoint's)
    page_size: int = blocks.DEFAULT_PAGE_SIZE  # tokens per KV page
    # leader scheduler limits: sequences running at once, tokens per step
    max_num_seqs: int = scheduler.SchedulerConfig.max_num_seqs
    max_batched_tokens: int = scheduler.SchedulerConfig.max_batched_tokens
    prefix_caching: bool = True  # leaders reuse KV pages of prompt prefixes computed before
    block_zoo: bool = True  # identical parameter pieces of blocks held once (block_zoo.py)
    # microbatches a pipelined replica keeps in flight; 0 = one per stage (at least 2)
    pipeline_microbatches: int = 0
    # checkpoint reads take at least bytes / this (a declared storage speed); 0 = unthrottled
    storage_bytes_per_s: float = 0.0
    # tests: a layer-run replica loaded here answers no sooner than this (seconds), so an
    # operator can be killed while a replication is in flight
    run_load_delay_s: float = 0.0
    # host memory kept for unloaded blocks' pieces (`host_cache`); 0 = no host cache
    host_cache_bytes: int = 0
    # how a pipelined leader cuts microbatches (lookahead while dropped and deep; issue 13)
    microbatch_split: microbatch.SplitConfig = field(default_factory=microbatch.SplitConfig)
    # the engine switches of the agent's entry point (split threshold, CUDA graphs)
    engine: options_mod.EngineOptions = field(default_factory=options_mod.EngineOptions)
    # settle the heap after loads and unloads (gc_heap): agents only, which own their heap
    gc_settle: bool = False
    # benches: "start,end,ms" makes that block's steps slow on purpose (speculate_serve.slow_s)
    slow_block: str = ""
    # the agent's mTLS files, for its channels to other agents; None = plaintext
    tls: transport.TlsFiles | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {list(DTYPES)}")
        if self.storage_bytes_per_s < 0:
            raise ValueError("storage_bytes_per_s: must be >= 0")
        if self.run_load_delay_s < 0:
            raise ValueError("run_load_delay_s: must be >= 0")
        if self.host_cache_bytes < 0:
            raise ValueError("host_cache_bytes: must be >= 0")
        for name in ("page_size", "max_num_seqs", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        if self.pipeline_microbatches < 0:
            raise ValueError("pipeline_microbatches: must be >= 0")
