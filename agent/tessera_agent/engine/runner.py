"""Runs one step of one stage: builds attention metadata, runs the layers, samples if last.

Called on the agent's compute thread by `replica.py` (leader) and by the stage stream
servicer (later stages). Pure computation over the stage's model and KV pool; it never
decides what to schedule.
"""

from __future__ import annotations

import logging

import torch

from tessera_agent.engine import (
    attention,
    attention_backend,
    compile_policy,
    cuda_graphs,
    decode_graph,
    decode_trace,
    dtypes,
    errors,
    layer_run,
    lora,
    packed_linear,
    sampling,
    step,
)
from tessera_agent.engine import kv_cache as kv_mod
from tessera_agent.engine import model as model_mod
from tessera_agent.engine import options as options_mod

log = logging.getLogger(__name__)

MAX_GRAPH_BATCH = 256  # largest decode batch replayed from a CUDA graph (the scheduler's)


def sample_rows(
    chunks: list[step.SeqChunk],
) -> tuple[list[int], list[str], list[sampling.SamplingParams]]:
    """The rows a step samples (each sampling chunk's last token), their sequences and
    sampling parameters, in row order."""
    rows, ids, params = [], [], []
    end = 0
    for c in chunks:
        end += c.num_tokens
        if c.sample:
            rows.append(end - 1)
            ids.append(c.seq_id)
            params.append(c.params)
    return rows, ids, params


class StageRunner:
    """A loaded stage model plus its KV pool and (on the last stage) a sampler."""

    def __init__(
        self,
        model: model_mod.StageModel,
        cache: kv_mod.PagedKVCache,
        device: torch.device,
        compile_decode: bool | None = None,
        options: options_mod.EngineOptions | None = None,
    ) -> None:
        """`compile_decode`: run pure-decode steps through `decode_graph` once it has
        warmed up (None: as `compile_policy.mode` says of `options`; "wait" warms up here).
        `options`: the entry point's engine options (None: the defaults)."""
        self.model, self.cache, self.device = model, cache, device
        opts = options or options_mod.EngineOptions()
        attention.configure(device)
        mode = compile_policy.mode(opts, device)
        if compile_decode is not None:
            mode = "on" if compile_decode else "off"
        # A kernel library's attention for eager steps (`attention_backend.py`; None:
        # native). The CPU's compiled decode traces the native paths, so a library
        # backend turns it off; CUDA graphs replay the native decode (docs/gpu.md).
        self.attention = self._attention_backend(opts.attention_backend)
        if self.attention is not None:
            mode = "off"
        self.decode_graph = (
            decode_graph.CompiledDecode(model, device, cache.layout.page_size, opts)
            # float32 only: Inductor fails to lower the fused decode in bfloat16 on CPU
            # (`LoweringException: NotImplementedError: Pointwise`, torch 2.13), so half
            # precision stages run eagerly (docs/gpu.md)
            if mode != "off" and model.shard.size == 1 and model.dtype_ == torch.float32
            else None
        )
        if self.decode_graph is None and mode != "off" and model.dtype_ != torch.float32:
            log.warning(
                "compiled decode off for layers [%d, %d): %s stages run eagerly (the CPU's "
                "compiled decode, saved graphs included, serves float32 only)",
                model.start,
                model.end,
                dtypes.name_of(model.dtype_),
            )
        self.split_min_decodes = opts.split_min_decodes
        self.split_steps = 0  # mixed steps run as compiled decode rows + eager prefill
        if self.decode_graph is not None and mode == "wait":
            self.decode_graph.warm_up(cache.layers())
        # Pure-decode steps replayed from CUDA graphs (`cuda_graphs.py`); captured on the
        # thread that runs the steps: `capture_graphs`, or the first pure-decode step.
        self.graphs = (
            cuda_graphs.DecodeGraphs(
                model, device, MAX_GRAPH_BATCH, model.cfg.max_positions, cache.layout.page_size
            )
            if opts.cuda_graphs and cuda_graphs.enabled(device) and model.shard.size == 1
            else None
        )
        self.sampler = sampling.Sampler() if model.is_last else None
        self.block_tables: dict[str, tuple[int, ...]] = {}  # last seen, for KV export
        # LoRA variants attached to this stage (see lora.attach): context and name -> slot.
        self.lora: tuple[lora.LoraContext, dict[str, int]] | None = None
        self.adapters: tuple[lora.Adapter, ...] = ()  # what `lora` was built from
        # Replicated layer runs of this stage (CoCoServe; layer_run.py, scaling_ops.py).
        self.runs: list[layer_run.ReplicatedRun] = []

    def _attention_backend(self, name: str) -> attention_backend.Backend | None:
        layers = list(self.model.layers)
        if not layers:
            return None
        a = layers[0].self_attn
        assert isinstance(a, model_mod.Attention)
        return attention_backend.make(
            name,
            self.device,
            self.model.dtype_,
            self.cache.layout.page_size,
            (a.nh, a.nkv, a.hd),
            a.scale,
        )

    def _plan_attention(self, md: attention.AttentionMetadata, chunks: list[step.SeqChunk]) -> None:
        """Plan the step's attention with the stage's library backend (none: native)."""
        if self.attention is None or self.runs:
            return
        pool = self.cache.layers()[0][0]
        md.kernel = self.attention.plan(chunks, pool.shape[0] // self.page_size)

    def attach_adapters(self, adapters: list[lora.Adapter]) -> None:
        """Serve these LoRA adapters on this stage (replaces the previous set)."""
        ctx, slots = lora.attach(self.model, self.model.cfg, adapters, self.model.dtype_)
        self.lora = (ctx, slots) if adapters else None
        self.adapters = tuple(adapters)

    def _set_variants(self, chunks: list[step.SeqChunk]) -> None:
        if self.lora is None:
            if any(c.variant for c in chunks):  # the common case costs one pass, no set
                named = sorted({c.variant for c in chunks if c.variant})
                raise errors.InvalidArgumentError(f"variant(s) {named} are not loaded here")
            return
        ctx, slots = self.lora
        ids: list[int] = []
        for c in chunks:
            slot = -1
            if c.variant:
                got = slots.get(c.variant)
                if got is None:
                    raise errors.InvalidArgumentError(
                        f"variant {c.variant!r} is not loaded on this stage "
                        f"(loaded: {sorted(slots)})"
                    )
                slot = got
            ids.extend([slot] * c.num_tokens)
        ctx.token_slots = torch.tensor(ids, dtype=torch.long, device=self.device)

    @property
    def page_size(self) -> int:
        return self.cache.layout.page_size

    def forget_finished(self, finished: list[str]) -> None:
        """Drop what the step's finished sequences left here (block tables, sampler and
        replicated-run state)."""
        for seq_id in finished:
            self.forget(seq_id)
        for run in self.runs:
            run.forget(finished)

    def step_input(self, inp: step.StepInput) -> tuple[attention.AttentionMetadata, torch.Tensor]:
        """The step's metadata and input rows (token ids on a first stage, else hidden
        states), LoRA slots set: what every forward starts from (`execute`, and each
        chain's part of a co-step, `costep.py`)."""
        md = self._metadata(inp.chunks)
        md.packed = self._packs()
        self._set_variants(inp.chunks)
        if self.model.is_first:
            if inp.token_ids is None:
                raise ValueError("the first stage needs token ids")
            return md, torch.tensor(inp.token_ids, dtype=torch.long, device=self.device)
        if inp.hidden is None:
            raise ValueError("a later stage needs hidden states")
        return md, inp.hidden.to(self.device, self.model.dtype_)

    def sampled(
        self,
        step_id: int,
        logits: torch.Tensor,
        ids: list[str],
        params: list[sampling.SamplingParams],
    ) -> step.StepOutput:
        """The step's output from the logits of its sampled rows (`ids` in row order):
        tokens, and log-probabilities where asked (`execute`, and co-steps)."""
        out = step.StepOutput(step_id=step_id)
        assert self.sampler is not None
        tokens, lps = self.sampler.sample_step(logits, ids, params)  # one host copy
        out.sampled = dict(zip(ids, tokens, strict=True))
        if lps:
            out.logprobs = {ids[i]: lp for i, lp in lps.items()}
        return out

    def capture_graphs(self) -> float | None:
        """Capture the stage's decode graphs now (on the calling thread, which must be
        the one that runs the steps); seconds taken, None when off or failed (the
        reason in `graphs.error`; steps then run eagerly)."""
        g = self.graphs
        if g is None or g.error is not None:
            return None
        if g.capture_s is None:
            try:
                g.capture(self.cache.layers())
            except Exception as exc:  # eager steps still serve
                g.error = f"{type(exc).__name__}: {exc}"
                g.buckets.clear()
                log.warning("CUDA graph capture failed, decode runs eagerly: %s", g.error)
                return None
        return g.capture_s

    def _graphed(self, x: torch.Tensor, md: attention.AttentionMetadata) -> torch.Tensor | None:
        """A pure-decode step's output replayed from its CUDA graph, or None."""
        g = self.graphs
        if g is None or self.runs or self.lora is not None or not decode_trace.is_pure_decode(md):
            return None
        if g.capture_s is None and self.capture_graphs() is None:
            return None
        return g.run(x, md)

    @torch.inference_mode()
    def execute(self, inp: step.StepInput) -> step.StepOutput:
        self.forget_finished(inp.finished)
        if not inp.chunks:
            return step.StepOutput(step_id=inp.step_id)
        md, x = self.step_input(inp)
        graphed = self._graphed(x, md)
        if graphed is not None:
            if not self.model.is_last:
                return step.StepOutput(step_id=inp.step_id, hidden=graphed)
            rows, ids, params = sample_rows(inp.chunks)
            if not rows:
                return step.StepOutput(step_id=inp.step_id)
            if len(rows) != graphed.shape[0]:
                graphed = graphed[torch.tensor(rows, device=self.device)]
            return self.sampled(inp.step_id, graphed.float(), ids, params)
        self._plan_attention(md, inp.chunks)
        compiled = None if self.runs else self._compiled(x, md, inp.chunks)
        head_logits = None  # the compiled rows' logits, when the graph made them
        if compiled is not None:
            hidden, head_logits = compiled
        elif self.runs:
            hidden = layer_run.forward(
                self.model, x, md, self.cache.layers(), inp.chunks, self.runs
            )
        else:
            hidden = self.model(x, md, self.cache.layers())
        if not self.model.is_last:
            return step.StepOutput(step_id=inp.step_id, hidden=hidden)
        rows, ids, params = sample_rows(inp.chunks)
        if not rows:
            return step.StepOutput(step_id=inp.step_id)
        if head_logits is not None:
            return self.sampled(
                inp.step_id, self._row_logits(rows, hidden, head_logits), ids, params
            )
        # A decode-only step samples every row: no gather of the rows to sample.
        every = len(rows) == hidden.shape[0]
        picked = hidden if every else hidden[torch.tensor(rows, device=self.device)]
        return self.sampled(inp.step_id, self.model.logits(picked).float(), ids, params)

    def _row_logits(
        self, rows: list[int], hidden: torch.Tensor, head: torch.Tensor
    ) -> torch.Tensor:
        """The logits of the sampled `rows` (ascending), in row order: those of the rows
        the compiled graph covered (the first `len(head)`) from `head`, the others through
        the eager final norm and LM head."""
        n = head.shape[0]
        first = [r for r in rows if r < n]
        parts = []
        if first:
            parts.append(head if len(first) == n else head[torch.tensor(first, device=self.device)])
        rest = rows[len(first) :]
        if rest:
            parts.append(self.model.logits(hidden[torch.tensor(rest, device=self.device)]))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.float()

    def _packs(self) -> packed_linear.StagePacks | None:
        """The stage's packed projections for eager rows, when its compiled decode holds
        them (`packed_linear.py`; a pack of a swapped weight is not used)."""
        g = self.decode_graph
        return g.packs if g is not None else None

    def _compiled(
        self, x: torch.Tensor, md: attention.AttentionMetadata, chunks: list[step.SeqChunk]
    ) -> decode_graph.Step | None:
        """The step through the compiled decode graph (hidden states, and on a last
        stage the logits of the rows the graph ran), or None: run it eagerly.

        A mixed step whose leading decode rows are many (`split_min_decodes`, the steps
        of a saturated replica) runs as two passes: the decode rows through the graph,
        the prefill chunks eagerly after them. Rows of different sequences never meet
        (each attends to its own pages), so the split changes no result; it costs one
        more eager dispatch of the layers, which the compiled decode rows pay back."""
        graph = self.decode_graph
        if graph is None or not graph.usable(self.model, self.lora is not None):
            return None
        kv = self.cache.layers()
        if decode_trace.is_pure_decode(md):
            return graph.decode(x, md, kv)
        b = md.decode_rows.numel()
        if not md.decode_leading or b < self.split_min_decodes or graph.state != "ready":
            return None
        ps = self.page_size
        decode_md = attention.build_metadata(chunks[:b], ps, self.device)
        head = graph.decode(x[:b], decode_md, kv)
        if head is None:
            return None
        tail_md = attention.build_metadata(chunks[b:], ps, self.device)
        tail_md.packed = self._packs()
        tail = self.model(x[b:], tail_md, kv)
        self.split_steps += 1
        return torch.cat((head[0], tail)), head[1]

    def forget(self, seq_id: str) -> None:
        self.block_tables.pop(seq_id, None)
        if self.sampler is not None:
            self.sampler.forget(seq_id)

    def _metadata(self, chunks: list[step.SeqChunk]) -> attention.AttentionMetadata:
        for c in chunks:
            self.block_tables[c.seq_id] = c.block_table
        md = attention.build_metadata(chunks, self.page_size, self.device)
        if md.decode_mask.dtype != self.model.dtype_:  # SDPA's fused kernels want q's dtype
            md.decode_mask = md.decode_mask.to(self.model.dtype_)
        return md
