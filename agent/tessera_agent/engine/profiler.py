"""Times one decoder layer and the LM head of a checkpoint for the planner's cost profile.

Called by the agent servicer's `Profile` RPC (driven by `tessera profile`). Loads a
temporary single-layer stage (a middle layer, so no embedding) and a last-layer stage for
the head, runs synthetic prefill and decode steps through the same runner that serves
traffic, and reports median seconds per layer. Nothing is kept loaded afterwards.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera_agent.engine import config, errors, kv_cache, sampling, stage, step


@dataclass(frozen=True)
class Timing:
    kind: str
    size: int
    context_len: int
    seconds_per_layer: float


def _median(fn: object, repeats: int) -> float:
    assert callable(fn)
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile(
    model_path: str,
    device: torch.device,
    prefill_tokens: list[int],
    decode_batches: list[int],
    context_lens: list[int],
    repeats: int = 5,
    page_size: int = 16,
) -> list[Timing]:
    cfg = config.ModelConfig.from_path(Path(model_path))
    layer = 1 if cfg.num_layers > 2 else 0
    need = max([*prefill_tokens, 1]) + max(
        b * (c + 1) for b in decode_batches or [1] for c in context_lens or [1]
    )
    pages = -(-need // page_size) + max(decode_batches or [1])
    kv = pages * kv_cache.KVLayout(1, 1, page_size, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    st = stage.load_stage(
        stage.BlockSpec(model_path, layer, layer + 1, kv_bytes=kv, page_size=page_size),
        device,
        1 << 40,
    )
    greedy = sampling.SamplingParams()
    out: list[Timing] = []
    hidden = cfg.hidden_size

    def run(chunks: list[step.SeqChunk]) -> None:
        n = sum(c.num_tokens for c in chunks)
        st.runner.execute(step.StepInput(0, chunks, hidden=torch.randn(n, hidden)))

    for n in prefill_tokens:
        if n < 1 or n > cfg.max_positions:
            raise errors.InvalidArgumentError(
                f"prefill_tokens: {n} is outside [1, {cfg.max_positions}]"
            )
        table = tuple(range(-(-n // page_size)))
        chunk = [step.SeqChunk("p", 0, n, table, False, greedy)]
        out.append(Timing("prefill", n, 0, _median(lambda c=chunk: run(c), repeats)))
    for b in decode_batches:
        for ctx in context_lens:
            per = -(-(ctx + 1) // page_size)
            chunks = [
                step.SeqChunk(f"d{i}", ctx, 1, tuple(range(i * per, (i + 1) * per)), False, greedy)
                for i in range(b)
            ]
            out.append(Timing("decode", b, ctx, _median(lambda c=chunks: run(c), repeats)))
    head = stage.load_stage(
        stage.BlockSpec(
            model_path, cfg.num_layers - 1, cfg.num_layers, kv_bytes=kv, page_size=page_size
        ),
        device,
        1 << 40,
    )
    for b in decode_batches:
        h = torch.randn(b, hidden)
        with torch.inference_mode():
            t = _median(lambda h=h: head.runner.model.logits(h), repeats)
        out.append(Timing("lm_head", b, 0, t))
    return out
