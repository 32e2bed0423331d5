"""Where an eager decode step's time goes on a GPU, and which steps of a batch replay
graphs (a one-off diagnosis for docs/gpu.md; not part of the bench)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from tessera_agent import bench_gpu_engine, random_checkpoint

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
tiny = dev.type == "cpu"
shape = (
    random_checkpoint.SHAPES["tiny"]
    if tiny
    else random_checkpoint.Shape(layers=4, hidden=2048, heads=32, kv_heads=8, intermediate=8192)
)
with tempfile.TemporaryDirectory() as tmp:
    path = random_checkpoint.make(Path(tmp) / "m", shape, "bfloat16", dev.type)
    eng = bench_gpu_engine.Engine(path, dev, "auto", 2 << 30, fake_graphs=tiny)
    r = eng.stage.runner
    steps: list[tuple[int, bool, float, int]] = []
    orig = r.execute

    profs: list = []  # type: ignore[type-arg]
    prof_on = [False]

    def timed(inp):  # type: ignore[no-untyped-def]
        g = r.graphs
        before = g.replays if g is not None else 0
        t = time.perf_counter()
        if prof_on[0]:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
            with profile(activities=acts) as prof:
                out = orig(inp)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
            profs.append(prof)
        else:
            out = orig(inp)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        steps.append(
            (
                len(inp.chunks),
                (g.replays if g else 0) > before,
                1e3 * (time.perf_counter() - t),
                inp.num_tokens,
            )
        )
        return out

    r.execute = timed  # type: ignore[method-assign]
    p = bench_gpu_engine.prompts
    eng.generate(p(2, 128, shape.vocab, 0), 4)
    for b in (1, 64):
        steps.clear()
        _tokens, times, _logprobs, wall = eng.generate(p(b, 128, shape.vocab, b), 32)
        t0 = times[0]
        print(f"b{b}: token to token {1e3 * (t0[-1] - t0[1]) / (len(t0) - 2):.3f} ms")
        g = [s[2] for s in steps if s[1]]
        e = [(s[0], s[3], round(s[2], 2)) for s in steps if not s[1]]
        print(
            f"b{b}: wall {wall:.3f}s steps {len(steps)} graphed {len(g)} "
            f"mean {sum(g) / max(1, len(g)):.2f}ms; eager (seqs, tokens, ms): {e[:12]}"
        )
    graphs = r.graphs
    r.graphs = None
    steps.clear()
    eng.generate(p(1, 128, shape.vocab, 9), 16)
    print("eager b1 step ms:", [round(s[2], 2) for s in steps])
    prof_on[0] = True
    eng.generate(p(1, 128, shape.vocab, 10), 4)
    prof_on[0] = False
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    last = profs[-1]
    print(
        last.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=45
        )
    )
    print(last.key_averages().table(sort_by=key, row_limit=10, max_name_column_width=45))
    print("threads", torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
    r.graphs = graphs
    eng.close()
