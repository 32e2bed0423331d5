"""Prometheus metrics of an agent — every agent metric is declared here.

Request and token counters are incremented by the servicer's `Generate`; the state
gauges (KV pages, running/waiting sequences, device memory, loaded bytes) are read from
the servicer at scrape time by a collector, so they can never drift from the truth.
Served on `--metrics-port` by `server.py` (0 disables it). Registry per instance: no
global state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class AgentState(Protocol):
    """What the collector reads (the servicer)."""

    agent_id: str
    devices: dict[str, Any]
    hosted: dict[tuple[str, int], Any]
    compute: Any  # the compute executor (`cobatch.CoBatchExecutor` has `stats`)


class _StateCollector(Collector):
    def __init__(self, state: AgentState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        cap = GaugeMetricFamily(
            "tessera_agent_device_capacity_bytes", "Memory budget of a device", labels=["device"]
        )
        free = GaugeMetricFamily(
            "tessera_agent_device_free_bytes",
            "Device budget not held by loaded blocks",
            labels=["device"],
        )
        for d in self.state.devices.values():
            cap.add_metric([d.id], d.capacity_bytes)
            free.add_metric([d.id], d.free_bytes)
        params = GaugeMetricFamily(
            "tessera_agent_block_param_bytes",
            "Parameter bytes of a loaded block",
            labels=["replica", "stage"],
        )
        kvb = GaugeMetricFamily(
            "tessera_agent_block_kv_bytes",
            "KV pool bytes of a loaded block",
            labels=["replica", "stage"],
        )
        total = GaugeMetricFamily(
            "tessera_agent_kv_pages_total",
            "KV pages the replica's scheduler may use",
            labels=["replica"],
        )
        used = GaugeMetricFamily(
            "tessera_agent_kv_pages_used", "KV pages held by running sequences", labels=["replica"]
        )
        running = GaugeMetricFamily(
            "tessera_agent_running_sequences", "Sequences being computed", labels=["replica"]
        )
        waiting = GaugeMetricFamily(
            "tessera_agent_waiting_sequences",
            "Sequences waiting for KV pages or a slot",
            labels=["replica"],
        )
        preempt = CounterMetricFamily(
            "tessera_agent_preemptions", "Sequences preempted for KV pages", labels=["replica"]
        )
        hits = CounterMetricFamily(
            "tessera_agent_prefix_cache_hit_tokens",
            "Prompt tokens whose KV came from the prefix cache",
            labels=["replica"],
        )
        cached = GaugeMetricFamily(
            "tessera_agent_prefix_cache_pages",
            "Full KV pages registered in the prefix cache (held or evictable)",
            labels=["replica"],
        )
        steps = CounterMetricFamily(
            "tessera_agent_replica_steps",
            "Scheduler steps completed by a replica",
            labels=["replica"],
        )
        graph = GaugeMetricFamily(
            "tessera_agent_decode_graph_ready",
            "1 once a stage's compiled decode has warmed up (0: warming, failed or off; "
            "absent: eager by configuration)",
            labels=["replica", "stage", "state"],
        )
        graph_steps = CounterMetricFamily(
            "tessera_agent_decode_graph_steps",
            "Steps whose decode rows ran through a stage's compiled graph (kind: pure "
            "decode, or the decode rows of a split mixed step)",
            labels=["replica", "stage", "kind"],
        )
        graph_compiles = CounterMetricFamily(
            "tessera_agent_decode_graph_compiles",
            "Graphs Inductor built for a stage's compiled decode (3-4 at warm-up; more: a "
            "recompile on a request's step, also logged)",
            labels=["replica", "stage"],
        )
        compile_state = GaugeMetricFamily(
            "tessera_agent_stage_compile",
            "1 for a stage's compiled or captured decode state (compile: warm = built at "
            "load, cached = from the compile cache, compiling = steps eager until done, "
            "eager = none)",
            labels=["replica", "stage", "compile"],
        )
        warmup = GaugeMetricFamily(
            "tessera_agent_decode_graph_warmup_seconds",
            "Wall time of a stage's last compiled-decode warm-up (before its load answered, "
            "by default)",
            labels=["replica", "stage"],
        )
        capture = GaugeMetricFamily(
            "tessera_agent_cuda_graph_capture_seconds",
            "Wall time of a CUDA stage's decode-graph capture at load (before its load answered)",
            labels=["replica", "stage"],
        )
        graph_pool = GaugeMetricFamily(
            "tessera_agent_cuda_graph_pool_bytes",
            "Device memory a CUDA stage's captured decode graphs reserved (booked)",
            labels=["replica", "stage"],
        )
        for (rid, idx), h in list(self.state.hosted.items()):
            params.add_metric([rid, str(idx)], h.stage.param_bytes)
            cg = h.stage.runner.graphs
            if cg is not None and cg.capture_s is not None:
                capture.add_metric([rid, str(idx)], cg.capture_s)
                graph_pool.add_metric([rid, str(idx)], cg.pool_bytes)
            compile_state.add_metric([rid, str(idx), h.compile_status], 1.0)
            g = h.stage.runner.decode_graph
            if g is not None:
                graph.add_metric([rid, str(idx), g.state], 1.0 if g.state == "ready" else 0.0)
                split = h.stage.runner.split_steps
                graph_steps.add_metric([rid, str(idx), "decode"], g.calls - split)
                graph_steps.add_metric([rid, str(idx), "split"], split)
                graph_compiles.add_metric([rid, str(idx)], g.compiles)
                warmup.add_metric([rid, str(idx)], g.warmup_s)
            kvb.add_metric([rid, str(idx)], h.stage.kv_bytes)
            if h.leader is not None:
                s = h.leader.stats()
                total.add_metric([rid], s.kv_pages_total)
                used.add_metric([rid], s.kv_pages_used)
                running.add_metric([rid], s.running)
                waiting.add_metric([rid], s.waiting)
                preempt.add_metric([rid], s.preemptions)
                hits.add_metric([rid], s.prefix_hit_tokens)
                cached.add_metric([rid], s.cached_pages)
                steps.add_metric([rid], h.leader.steps)
        yield from _cobatch(getattr(self.state.compute, "stats", None))
        hosting = getattr(self.state, "hosting", None)
        if hosting is not None:
            yield from _host_cache(hosting.host_cache.stats(), self.state.hosted)
        yield from (
            cap,
            free,
            params,
            kvb,
            total,
            used,
            running,
            waiting,
            preempt,
            hits,
            cached,
            steps,
            graph,
            graph_steps,
            graph_compiles,
            compile_state,
            warmup,
            capture,
            graph_pool,
        )


def _cobatch(stats: Any) -> Iterator[CounterMetricFamily]:
    """The compute thread's per-block batching (`engine/cobatch.py`), when it co-batches."""
    if stats is None:
        return
    steps = CounterMetricFamily(
        "tessera_agent_cobatch_steps",
        "Steps run by the compute thread: alone, or co-batched with other chains' steps",
        labels=["mode"],
    )
    steps.add_metric(["solo"], stats.solo_steps)
    steps.add_metric(["cobatched"], stats.cobatched_steps)
    passes = CounterMetricFamily(
        "tessera_agent_cobatch_passes",
        "Passes of block instances in co-steps: over several chains' rows, or one chain's",
        labels=["rows_of"],
    )
    passes.add_metric(["several"], sum(n for (_, k), n in stats.passes.items() if k > 1))
    passes.add_metric(["one"], sum(n for (_, k), n in stats.passes.items() if k == 1))
    deferred = CounterMetricFamily(
        "tessera_agent_cobatch_deferred",
        "Times a queued step waited for the next co-step (batch limit or its chain busy)",
    )
    deferred.add_metric([], stats.deferred)
    waits = CounterMetricFamily(
        "tessera_agent_cobatch_waits",
        "Waits of the compute thread for chains expected to bring a step to co-batch",
        labels=["outcome"],
    )
    for outcome in ("joined", "timeout"):
        waits.add_metric([outcome], stats.waits[outcome])
    wait_s = CounterMetricFamily(
        "tessera_agent_cobatch_wait_seconds", "Seconds the compute thread waited for partners"
    )
    wait_s.add_metric([], stats.wait_s)
    busy = CounterMetricFamily(
        "tessera_agent_cobatch_busy_seconds", "Seconds the compute thread spent running steps"
    )
    busy.add_metric([], stats.busy_s)
    yield from (steps, passes, deferred, waits, wait_s, busy)


def _host_cache(stats: Any, hosted: dict[tuple[str, int], Any]) -> Iterator[Any]:
    """The host block cache (`host_cache`) and where each loaded block's bytes came from."""
    looks = CounterMetricFamily(
        "tessera_agent_host_cache_lookups",
        "Pieces loads looked for in the host block cache, by result",
        labels=["result"],
    )
    looks.add_metric(["hit"], stats.hits)
    looks.add_metric(["miss"], stats.misses)
    hit_bytes = CounterMetricFamily(
        "tessera_agent_host_cache_hit_bytes", "Bytes loads took from the host block cache"
    )
    hit_bytes.add_metric([], stats.hit_bytes)
    evicted = CounterMetricFamily(
        "tessera_agent_host_cache_evictions", "Pieces the host block cache dropped for room"
    )
    evicted.add_metric([], stats.evicted)
    size = GaugeMetricFamily(
        "tessera_agent_host_cache_bytes", "Host block cache bytes", labels=["kind"]
    )
    size.add_metric(["used"], stats.used_bytes)
    size.add_metric(["budget"], stats.budget_bytes)
    src = GaugeMetricFamily(
        "tessera_agent_block_load_bytes",
        "Bytes of a loaded block by where they came from (peer, host cache, storage)",
        labels=["replica", "stage", "source"],
    )
    ready = GaugeMetricFamily(
        "tessera_agent_block_ready_seconds",
        "Seconds from a block's load request to ready (warm-up included)",
        labels=["replica", "stage"],
    )
    for (rid, idx), h in list(hosted.items()):
        for name in ("peer", "host", "storage"):
            src.add_metric([rid, str(idx), name], getattr(h.sources, name))
        ready.add_metric([rid, str(idx)], h.sources.seconds)
    yield from (looks, hit_bytes, evicted, size, src, ready)


class AgentMetrics:
    def __init__(self, state: AgentState) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tessera_agent_requests",
            "Generate requests by outcome",
            ["replica", "outcome"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "tessera_agent_prompt_tokens",
            "Prompt tokens received",
            ["replica"],
            registry=self.registry,
        )
        self.generated_tokens = Counter(
            "tessera_agent_generated_tokens",
            "Tokens generated",
            ["replica"],
            registry=self.registry,
        )
        self.sleep_wake = Counter(
            "tessera_agent_replica_sleep_wake",
            "Replicas put to sleep or woken (issue 32), by replica and what",
            ["replica", "what"],
            registry=self.registry,
        )
        self.sleep_wake_seconds = Counter(
            "tessera_agent_replica_sleep_wake_seconds",
            "Seconds spent putting replicas to sleep and waking them, by what",
            ["replica", "what"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(state))

    def slept_or_woke(self, replica_id: str, what: str, seconds: float) -> None:
        """`sleep.Sleepers`' callback: one sleep or wake of `replica_id`."""
        self.sleep_wake.labels(replica_id, what).inc()
        self.sleep_wake_seconds.labels(replica_id, what).inc(seconds)

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics over HTTP on a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)
