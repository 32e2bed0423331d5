"""Compiled decode: a stage's pure-decode forward (`decode_trace.forward`) through
`torch.compile`, warmed up off the request path.

Inductor fuses a decode step's elementwise work and traces decode attention as slot-indexed
reductions. On CPU the projections run over the eager rows' prepacked weights passed as
graph inputs (`packed_linear.GraphPacks`), so Inductor's caches keep the graph across
restarts; unfrozen, its graphs are saved whole and loaded on a restart without Dynamo's
trace (`decode_aot.py`); `compile_freeze` compiles it frozen. `CompiledDecode` warms up on a
background thread (`start`) or at once (`warm_up`), runs steps eagerly until `ready`, never
recompiles on a request's step, turns itself off loudly on a failure, rebuilds when a memory
shift swaps its layers, and runs eagerly (`dropped`) after a drop left fewer until they
change again. Its packs cost `packed_bytes` (booked by `hosting.py`); when it is on:
`compile_policy.py`. Called by `runner.py`, `compile_policy.begin`, `bench_engine.py`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any, cast

import torch
import torch._inductor.config as inductor_config

from tessera.policies.serving import batching
from tessera_agent.engine import (
    attention,
    compile_cache,
    compile_policy,
    decode_aot,
    decode_trace,
    packed_linear,
    prompt_graph,
)
from tessera_agent.engine import model as model_mod
from tessera_agent.engine import options as options_mod

log = logging.getLogger(__name__)

KV = decode_trace.KV
Step = tuple[torch.Tensor, torch.Tensor | None]  # hidden states; logits on a last stage


_warmups: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def warming() -> bool:
    """Whether a background warm-up is compiling in this process now."""
    return any(t.is_alive() for t in list(_warmups))


class CompiledDecode:
    """The compiled pure-decode forward of one stage model."""

    def __init__(
        self,
        model: model_mod.StageModel,
        device: torch.device,
        page_size: int,
        options: options_mod.EngineOptions | None = None,
    ) -> None:
        """`options`: the entry point's engine options (None: the defaults)."""
        self.model, self.device, self.page_size = model, device, page_size
        self.options = options or options_mod.EngineOptions()
        self.calls = 0  # steps run compiled
        self.compiles = 0  # graphs Inductor built (warm-up: 3-4 measured; more is logged)
        self.warmup_s = 0.0  # wall time of the last warm-up (mostly compiling)
        self.state = "cold"  # cold -> warming -> ready | failed | off; dropped (eager)
        self.warmed = False  # the last warm-up is over (decode and prompt rows' graphs)
        self.cached = False  # and its graphs all came from the compile cache
        # How the decode graphs were obtained (`decode_aot.Obtained.how`, one per graph;
        # empty: traced by `torch.compile` at its first call, as without `decode_aot`).
        self.origin: list[str] = []
        self.reason = ""  # why failed/off
        self._gen = 0  # bumped by every rebuild; a stale warm-up does not publish
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # The eager rows' packed projections (`packed_linear.py`): built first thing in
        # the warm-up, dropped with the graph.
        self.packs: packed_linear.StagePacks | None = None
        self.with_packs = True  # False: its bytes were not reserved (`drop_packs`)
        # Attention traced as fused slot-indexed reductions (`attention._decode_fused`),
        # or as eager's gather + SDPA (`TESSERA_DECODE_ATTN=gather`, for A/B). CPU only:
        # measured with Inductor's C++ backend; its Triton counterpart was never run.
        self.fused_attention = self.options.fused_decode_attn and device.type == "cpu"
        self._build()

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        # A private copy of the code object: dynamo keeps compiled code per code object,
        # so this instance's graphs (and frozen weights) live and die with it.
        self.packs = None
        self._graph_packs: packed_linear.GraphPacks | None = None
        self.freeze = compile_policy.freeze(self.options, self.device)  # read once per graph
        self.aot = compile_policy.aot(self.options, self.device)  # graphs saved whole
        fwd = decode_trace.forward
        fn = types.FunctionType(fwd.__code__.replace(), fwd.__globals__, "_forward")
        self._traced = fn
        backend = compile_policy.counting_backend(self)
        if self.device.type == "cuda":  # CUDA graphs captured and replayed per shape
            self._fn: Callable[..., Step] = torch.compile(fn, dynamic=True, mode="reduce-overhead")
        else:
            self._fn = torch.compile(fn, dynamic=True, backend=backend)
        self._for = decode_trace.fingerprint(self.model)
        self._layers = len(self.model.layers)  # the layers a warm-up covers

    def _config(self) -> contextlib.AbstractContextManager[Any]:
        # Compiling happens inside the call; `freezing` must be set then (passed as
        # `torch.compile(options=...)` it did not take effect here).
        if self.device.type == "cuda" or inductor_config.freezing == self.freeze:
            return contextlib.nullcontext()  # a patch costs ~13 us a step (a class built)
        freeze = self.freeze
        patched: contextlib.AbstractContextManager[Any] = inductor_config.patch(freezing=freeze)
        return patched

    @staticmethod
    def usable(model: model_mod.StageModel, has_lora: bool) -> bool:
        """Stages this path serves: no LoRA wrappers, no TP all-reduce inside a layer."""
        return not has_lora and model.shard.size == 1

    @property
    def packed_bytes(self) -> int:
        if self.device.type != "cpu":
            return 0
        return compile_policy.packed_bytes(self.model, self.options, self.with_packs)

    def disable(self, reason: str) -> None:
        """Turn the path off for this stage (every step eager from now on)."""
        with self._lock:
            self._gen += 1
            self.state, self.reason = "off", reason
            self.packs = self._graph_packs = None
        log.warning("compiled decode off for layers [%d, %d): %s", *self._range(), reason)

    def drop_packs(self, reason: str) -> None:
        """Keep the graph but not the eager rows' packed projections (`packed_linear.py`)."""
        with self._lock:
            self.with_packs, self.packs, self._graph_packs = False, None, None
        log.info("packed prompt projections off for layers [%d, %d): %s", *self._range(), reason)

    def _range(self) -> tuple[int, int]:
        return self.model.start, self.model.end

    # -- warm-up --------------------------------------------------------------------------
    def _saved_graphs(self, kv_like: KV, b: int, ctx: int, slots: int) -> decode_aot.Graphs:
        """Batch 1's graph and the general one, each loaded whole when saved by an earlier
        run (`decode_aot.py`), else compiled and saved; each run once here so that its
        first request does not build oneDNN's kernels."""
        got: list[decode_aot.Obtained] = []
        for batch in (1, b):
            x, md, scratch = decode_trace.synthetic(
                self.model, self.page_size, self.device, kv_like, batch, ctx, slots
            )
            args = self._args(x, md, scratch)
            name = decode_aot.key(
                self.model, self._graph_packs, self.page_size, self.fused_attention, batch == 1
            )
            one = decode_aot.obtain(self._traced, args, name)
            self.compiles += 0 if one.loaded else 1
            with self._config():
                one.fn(*args)
            log.info(
                "decode graph (batch %s) of layers [%d, %d): %s in %.1f s",
                "1" if batch == 1 else "n",
                *self._range(),
                one.how,
                one.seconds,
            )
            got.append(one)
        self.origin = [one.how for one in got]
        return decode_aot.Graphs(got[0].fn, got[1].fn, self.fused_attention, self._graph_packs)

    def warm_up(self, kv_like: KV) -> float:
        """Compile now (batch 1 and the general shape), on the calling thread; returns the
        seconds it took. Raises what compiling raises."""
        if self.device.type == "cpu" and self.model.dtype_ != torch.float32:
            # Inductor cannot lower it in half precision (torch 2.13): refused before a
            # minute of tracing ends in a dtype error (`start` logs it; steps run eagerly)
            raise ValueError(
                f"the CPU's compiled decode serves float32 stages only, not {self.model.dtype_}"
            )
        with self._lock:
            gen = self._gen
            self.state, self.warmed = "warming", False
        t0 = time.perf_counter()
        kernels: threading.Thread | None = None
        with compile_cache.Probe() as probe:
            on = self.with_packs and compile_policy.pack_prompts(self.options, self.device)
            if on and packed_linear.packable(self.model):
                packs = packed_linear.StagePacks(self.model)
                # oneDNN's kernels built beside the graphs' load or trace (joined below)
                kernels = packs.warm_beside(
                    self.model, batching.BatchLimits.max_batched_tokens, self.options.omp_release
                )
                with self._lock:
                    if gen == self._gen and self.with_packs:
                        self.packs = packs
                if not self.freeze:
                    self._graph_packs = packed_linear.GraphPacks(self.model, packs)
            b, ctx, slots = decode_trace.shapes(self.model, self.page_size, kv_like)
            with torch.inference_mode():
                if self.aot:
                    graphs = self._saved_graphs(kv_like, b, ctx, slots)
                    with self._lock:
                        if gen == self._gen:  # not rebuilt meanwhile
                            # (`Graphs` returns what `decode_trace.forward` does: a Step)
                            self._fn = cast(Callable[..., Step], graphs)
                else:
                    self._invoke(
                        *decode_trace.synthetic(
                            self.model, self.page_size, self.device, kv_like, 1, ctx, slots
                        )
                    )
                    self._invoke(
                        *decode_trace.synthetic(
                            self.model, self.page_size, self.device, kv_like, b, ctx, slots
                        )
                    )
            took = time.perf_counter() - t0
            with self._lock:
                if gen == self._gen:
                    self.state, self.warmup_s = "ready", took
            log.info(
                "compiled decode ready for layers [%d, %d) in %.1f s (%d graphs, %d packed bytes)",
                *self._range(),
                took,
                self.compiles,
                self.packed_bytes,
            )
            self._warm_prompts(gen)
            if kernels is not None:
                kernels.join()
        with self._lock:
            if gen == self._gen:  # the prompt rows' graphs exist too: the warm-up is over
                if self.aot:  # prompt rows' graphs, if any, from Inductor's cache
                    loaded = all(how == "loaded" for how in self.origin)
                    self.cached = loaded and not probe.misses
                else:
                    self.cached = probe.outcome == "cached"
                self.warmed = True
        log.info(
            "compiled graphs of layers [%d, %d) %s in %.1f s (%d cache hits, %d misses)%s",
            *self._range(),
            "came from the compile cache" if self.cached else "compiled",
            time.perf_counter() - t0,
            probe.hits,
            probe.misses,
            f"; decode graphs: {', '.join(self.origin)}" if self.origin else "",
        )
        return took

    @property
    def status(self) -> str:
        """What the stage's agent reports (`compile`): "compiling" (steps run eagerly until
        it is done), "warm" (compiled at this load), "cached" (its graphs came from the
        compile cache) or "eager" (off or failed; `reason` says why)."""
        if self.state == "ready" and self.warmed:
            return "cached" if self.cached else "warm"
        if self.state in ("cold", "warming", "ready"):
            return "compiling"
        return "eager"

    def _warm_prompts(self, gen: int) -> None:
        """Compile the packs' many-row layer parts (`prompt_graph.py`); a failure leaves
        prompt rows eager (packed), logged, and the decode graph as it is."""
        packs = self.packs
        if packs is None or not compile_policy.compile_prompts(self.options, self.device):
            return
        graph = prompt_graph.PromptGraph(self.model)
        try:
            took = graph.warm_up(self.model, packs)
        except Exception:
            log.exception(
                "compiled prompt rows: warm-up failed for layers [%d, %d); they stay eager",
                *self._range(),
            )
            return
        with self._lock:
            if gen == self._gen and self.packs is packs:
                packs.graph = graph
        log.info("compiled prompt rows ready for layers [%d, %d) in %.1f s", *self._range(), took)

    def start(self, kv_like: KV) -> None:
        """Warm up on a background thread; steps run eagerly until it is done."""
        with self._lock:
            if self.state != "cold":
                return
            self.state = "warming"

        def work() -> None:
            try:
                self.warm_up(kv_like)
            except Exception as exc:  # any compile failure: eager from now on, loudly
                log.exception(
                    "compiled decode warm-up failed for layers [%d, %d); running eagerly",
                    *self._range(),
                )
                with self._lock:
                    self.state, self.reason = "failed", f"warm-up failed: {exc!r}"

        self._thread = threading.Thread(target=work, name="decode-graph-warmup", daemon=True)
        _warmups.add(self._thread)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> str:
        """Block until a background warm-up ends; returns the state."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.state

    # -- serving --------------------------------------------------------------------------
    def _invoke(
        self,
        x: torch.Tensor,
        md: attention.AttentionMetadata,
        kv: KV,
    ) -> Step:
        with self._config():
            out: Step = self._fn(*self._args(x, md, kv))
            return out

    def _args(self, x: torch.Tensor, md: attention.AttentionMetadata, kv: KV) -> tuple[Any, ...]:
        """`decode_trace.forward`'s arguments for a step."""
        cos, sin = self.model.rope_tables(md.positions, md.max_position)
        return (
            self.model,
            x,
            md.positions,
            md.slot_mapping,
            md.decode_rows,
            # Contiguous whatever the context length (a slice of the page table when it is
            # not a whole number of pages): Dynamo guards on strides.
            md.decode_gather.contiguous(),
            md.decode_mask,
            cos,
            sin,
            kv,
            self.fused_attention,
            self._graph_packs,
        )

    def __call__(
        self,
        x: torch.Tensor,
        md: attention.AttentionMetadata,
        kv: KV,
    ) -> torch.Tensor | None:
        """The step's hidden states, or None: run it eagerly (as `decode`)."""
        out = self.decode(x, md, kv)
        return None if out is None else out[0]

    def decode(
        self,
        x: torch.Tensor,
        md: attention.AttentionMetadata,
        kv: KV,
    ) -> Step | None:
        """The step's hidden states and, on a last stage, every row's logits (None on
        other stages); None: run it eagerly (not warm yet, dropped, an uncovered shape, off)."""
        if decode_trace.fingerprint(self.model) != self._for:  # layers dropped or swapped since
            with self._lock:
                if self.state in ("off", "failed"):
                    return None
                self._gen += 1
                shrunk = len(self.model.layers) < self._layers  # a drop: no warm-up by a burst
                self.state = "dropped" if shrunk else "cold"
            what = "eager until restored" if shrunk else "warming up again"
            log.info("compiled decode: layers of [%d, %d) changed, %s", *self._range(), what)
            self._build()  # (the old graph and packs go)
        if self.state == "cold":
            self.start(kv)
            return None
        if self.state != "ready" or md.decode_gather.shape[1] < 2:  # (also "dropped")
            return None  # a one-token context is a shape of its own: eager, not compiled
        before = self.compiles
        t0 = time.perf_counter()
        try:
            out = self._invoke(x, md, kv)
        except Exception as exc:
            log.exception(
                "compiled decode step failed for layers [%d, %d); running eagerly from now on",
                *self._range(),
            )
            with self._lock:
                self.state, self.reason = "failed", f"step failed: {exc!r}"
            return None
        if self.compiles != before:
            log.warning(
                "compiled decode recompiled on a step (batch %d, context %d): %.1f s",
                md.decode_rows.numel(),
                md.decode_gather.shape[1],
                time.perf_counter() - t0,
            )
        self.calls += 1
        return out
