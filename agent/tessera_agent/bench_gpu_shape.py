"""One checkpoint's figures in `tessera bench gpu`: step time, throughput, TTFT, oracles.

`shape_figures` measures one random-weight shape in this process (`bench_gpu_engine`):
the batch-1 decode step against the bandwidth roofline (graphs and eager), throughput at
batch 16/64/256, TTFT at 2048 tokens, capture time, peak memory and the half-precision
log-prob oracle; `tokens_match_fp32` checks float32 greedy tokens against transformers.
Each part is guarded (`bench_gpu_parts`). Called by `bench_gpu.run`.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch

from tessera_agent import bench_gpu_engine, bench_gpu_parts, random_checkpoint
from tessera_agent.engine import logprob_oracle


def shape_figures(
    name: str, path: Path, device: torch.device, bw: dict[str, Any] | None, tiny: bool
) -> dict[str, Any]:
    """The per-shape figures, each part guarded (errors under "errors")."""
    shape = random_checkpoint.SHAPES[name]
    prompt, new = (16, 16) if tiny else (128, 128)
    batches = (16, 64, 256)
    parts = bench_gpu_parts.Parts(float("inf"))
    out: dict[str, Any] = {"prompt_tokens": prompt, "new_tokens": new}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # KV for the largest batch plus the 2048-token prompt, with a quarter to spare
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    kv = int(1.25 * per_token * (max(batches) * (prompt + new) + 4096))
    eng = bench_gpu_engine.Engine(
        path, device, "auto", kv, fake_graphs=tiny
    )  # "auto": the checkpoint's
    try:
        out["dtype"] = str(eng.stage.dtype).removeprefix("torch.")
        out["param_bytes"] = eng.stage.param_bytes
        out["kv_pages"] = eng.stage.num_pages
        graphs = eng.stage.runner.graphs
        out["graph_capture_s"] = eng.capture_s
        out["graph_buckets"] = None if graphs is None else len(graphs.buckets)
        out["graph_buckets_past_budget"] = None if graphs is None else graphs.skipped
        if graphs is not None and graphs.error:
            parts.errors["graph_capture_s"] = graphs.error
        out["decode_path"] = "cuda graphs" if graphs is not None and graphs.ready else "eager"
        eng.generate(bench_gpu_engine.prompts(2, prompt, shape.vocab, 0), 4)  # warm-up

        def b1() -> float:
            _, times, _, _ = eng.generate(bench_gpu_engine.prompts(1, prompt, shape.vocab, 1), new)
            t = times[0]
            return 1e3 * (t[-1] - t[0]) / (len(t) - 1)

        out["ms_per_step_b1"] = parts.run("ms_per_step_b1", b1)
        if graphs is not None:  # the same, eager
            eng.stage.runner.graphs = None
            try:
                out["ms_per_step_b1_eager"] = parts.run("ms_per_step_b1_eager", b1)
            finally:
                eng.stage.runner.graphs = graphs
        if bw is not None and out["ms_per_step_b1"] is not None:
            roof = 1e3 * eng.stage.param_bytes / bw["measured_copy_bytes_s"]
            out["roofline_ms_b1"] = roof
            out["b1_vs_roofline"] = out["ms_per_step_b1"] / roof
            if bw.get("datasheet_bytes_s"):
                out["roofline_ms_b1_datasheet"] = (
                    1e3 * eng.stage.param_bytes / bw["datasheet_bytes_s"]
                )
        for b in batches:

            def tput(b: int = b) -> float:
                ps = bench_gpu_engine.prompts(b, prompt, shape.vocab, b)
                toks, _, _, wall = eng.generate(ps, new)
                return sum(len(t) for t in toks) / wall

            out[f"tok_s_b{b}"] = parts.run(f"tok_s_b{b}", tput)

        def ttft() -> float:
            p = bench_gpu_engine.prompts(1, 2048, shape.vocab, 7)
            runs = []
            for _ in range(2):  # the second, warm
                _, times, _, _ = eng.generate(p, 1)
                runs.append(times[0][0])
            return 1e3 * runs[-1]

        out["ttft_ms_prompt2048"] = parts.run("ttft_ms_prompt2048", ttft)

        def ratio() -> dict[str, Any]:
            ps = bench_gpu_engine.prompts(4, 32 if not tiny else 12, shape.vocab, 11)
            toks, _, lps, _ = eng.generate(ps, 32 if not tiny else 8, logprobs=5)
            seqs = [p + t for p, t in zip(ps, toks, strict=True)]
            ents = [
                logprob_oracle.entries(len(p), t, lp)
                for p, t, lp in zip(ps, toks, lps, strict=True)
            ]
            cmp_ = logprob_oracle.against_hf(path, eng.stage.dtype, seqs, ents, device)
            return {
                "ratio": cmp_.ratio,
                "engine_mad": cmp_.engine_mad,
                "hf_half_mad": cmp_.hf_half_mad,
            }

        if device.type == "cuda":  # the engine's peak, before transformers loads below
            out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        else:
            out["peak_gib"] = None
            parts.errors["peak_gib"] = "not measured on CPU"
        got = parts.run("logprob_ratio_vs_hf", ratio)
        out["logprob_ratio_vs_hf"] = None if got is None else got["ratio"]
        out["logprob_detail"] = got
    finally:
        eng.close()
    if parts.errors:
        out["errors"] = parts.errors
    return out


def tokens_match_fp32(path: Path, device: torch.device, tiny: bool) -> dict[str, Any]:
    """The engine in float32 against transformers' greedy tokens (EOS ignored)."""
    vocab = random_checkpoint.SHAPES["tiny" if tiny else "1b"].vocab
    prompts = bench_gpu_engine.prompts(4, 16, vocab, 3)
    new = 16
    eng = bench_gpu_engine.Engine(path, device, "float32", (64 << 20) if tiny else (2 << 30))
    try:
        toks, _, _, _ = eng.generate(prompts, new)
    finally:
        eng.close()
    model = logprob_oracle.load_hf(path, torch.float32, device)
    model.generation_config.eos_token_id = None  # type: ignore[union-attr]
    want = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            o = model.generate(  # type: ignore[operator]
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
            )
            want.append(o[0, len(p) :].tolist())
    del model
    gc.collect()
    same = sum(a == b for a, b in zip(toks, want, strict=True))
    return {"match": toks == want, "sequences_equal": same, "sequences": len(prompts)}
