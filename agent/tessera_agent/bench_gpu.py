"""GPU check of the block engine: speed against the memory-bandwidth roofline, half precision.

`tessera bench gpu --json` on one H100 / H200 with no network makes its own random-weight
bfloat16 checkpoints (the 1B and 3B shapes) and prints one JSON object: per shape the
decode step at batch 1 against the roofline, throughput at batch 16/64/256, TTFT at 2048
tokens, graph capture time, peak memory and the half-precision log-prob oracle; once the
float32 token match and the served throughput at 64 concurrent requests; first, the
attention backends' times and choice (`bench_attention.py`, in a child process). Each
part is guarded (a failure becomes a string under `errors`). Keys and their meaning:
docs/gpu.md. `--device cpu --tiny` runs the same parts on a tiny shape (CI smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import gc
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tessera.bench import harness
from tessera_agent import bench_gpu_serve, random_checkpoint
from tessera_agent.engine import (
    config,
    cuda_graphs,
    logprob_oracle,
    replica,
    sampling,
    scheduler,
    stage,
)

Tokens = list[list[int]]

# Vendors' datasheet memory bandwidths (bytes/s), by a substring of the device name: the
# roofline's second opinion beside the measured copy.
DATASHEET_BW: tuple[tuple[str, float], ...] = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("A100-SXM4-80GB", 2.04e12),
    ("A100", 1.555e12),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny shape and short runs (the CPU smoke test)"
    )
    parser.add_argument("--shapes", default="", help="comma list of 1b, 3b, tiny (default: 1b,3b)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="skip parts after this")
    parser.add_argument("--skip-serve", action="store_true", help="no `tessera up` part")
    parser.add_argument(
        "--attention-only",
        action="store_true",
        help="only the attention backends' part (`attention`, bench_attention.py)",
    )
    parser.add_argument(
        "--attention-timeout-s",
        type=float,
        default=150.0,
        help="time limit of the attention backends' child process",
    )


class Parts:
    """Runs named parts of the check, each guarded: a failure or an exhausted time budget
    records a string under `errors`, never stops the run."""

    def __init__(self, budget_s: float) -> None:
        self.t0, self.budget_s = time.monotonic(), budget_s
        self.errors: dict[str, str] = {}

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        if time.monotonic() - self.t0 > self.budget_s:
            self.errors[key] = f"skipped: past the {self.budget_s:.0f} s budget"
            return None
        try:
            return fn()
        except Exception as exc:
            self.errors[key] = f"{type(exc).__name__}: {exc}"[:400]
            return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention(device: torch.device, tiny: bool, timeout_s: float) -> dict[str, Any]:
    """The attention backends' figures and choice (`bench_attention.py`), measured in a
    child process with a time limit: a library that hangs compiling, or faults the CUDA
    context, costs this part only."""
    cmd = [sys.executable, "-m", "tessera_agent.bench_attention", "--device", str(device)]
    cmd += ["--budget-s", str(max(timeout_s - 30.0, 10.0))] + (["--tiny"] if tiny else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-600:]
        raise RuntimeError(f"bench_attention ran past {timeout_s:.0f} s: {tail!r}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"bench_attention exited {done.returncode}: {done.stderr[-600:]}")
    res: dict[str, Any] = json.loads(lines[-1])
    return res


def bandwidth(device: torch.device) -> dict[str, Any]:
    """Memory bandwidth: a measured device-to-device copy (bytes read plus written / time,
    best of 5 timings of 5 copies of 1 GiB; 256 MiB on CPU) and the datasheet's."""
    n = (1 << 30) if device.type == "cuda" else (256 << 20)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(5):
        _sync(device)
        t = time.perf_counter()
        for _ in range(5):
            b.copy_(a)
        _sync(device)
        best = min(best, (time.perf_counter() - t) / 5)
    del a, b
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    sheet = next((bw for key, bw in DATASHEET_BW if key in name), None)
    return {"measured_copy_bytes_s": 2 * n / best, "datasheet_bytes_s": sheet, "name": name}


class Engine:
    """One whole-model stage on `device`, driven in this process like an agent's leader
    (one compute thread, `ReplicaEngine`), timing every token."""

    def __init__(
        self, path: Path, device: torch.device, dtype: str, kv_bytes: int, fake_graphs: bool = False
    ) -> None:
        budget = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 40
        layers = config.ModelConfig.from_path(path).num_layers
        self.spec = stage.BlockSpec(
            str(path), 0, layers, device=str(device), dtype=dtype, kv_bytes=kv_bytes
        )
        self.stage = stage.load_stage(self.spec, device, budget)
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        self.counter = 0
        r = self.stage.runner
        if device.type == "cpu" and fake_graphs:  # the graph logic, replayed eagerly
            r.graphs = cuda_graphs.DecodeGraphs(
                r.model, device, 256, 1024, r.page_size, api=cuda_graphs.FakeGraphs()
            )
        # CUDA graphs captured at load, on the thread that runs the steps.
        self.capture_s = self.pool.submit(self.stage.runner.capture_graphs).result()

    def generate(
        self, prompts: Tokens, new: int, logprobs: int | None = None
    ) -> tuple[Tokens, list[list[float]], list[list[sampling.TokenLogprobs]], float]:
        """Greedy tokens, each token's arrival time (s after the start), log-probabilities
        when asked, and the wall time of the whole batch."""
        params = sampling.SamplingParams(max_tokens=new, ignore_eos=True, logprobs=logprobs)
        cfg = scheduler.SchedulerConfig(max_model_len=self.stage.cfg.max_positions)

        async def main() -> tuple[list[tuple[list[int], list[float], list[Any]]], float]:
            eng = replica.ReplicaEngine(self.stage.runner, self.pool, cfg)
            t0 = time.perf_counter()

            async def one(p: list[int]) -> tuple[list[int], list[float], list[Any]]:
                self.counter += 1
                toks: list[int] = []
                times: list[float] = []
                lps: list[Any] = []
                async for ev in eng.generate(f"g{self.counter}", p, params):
                    if ev.error:
                        raise RuntimeError(ev.error)
                    if ev.token is not None:
                        toks.append(ev.token)
                        times.append(time.perf_counter() - t0)
                        lps.append(ev.logprobs)
                return toks, times, lps

            try:
                got = list(await asyncio.gather(*(one(p) for p in prompts)))
                return got, time.perf_counter() - t0
            finally:
                await eng.close()

        got, wall = asyncio.run(main())
        return [g[0] for g in got], [g[1] for g in got], [g[2] for g in got], wall

    def close(self) -> None:
        self.pool.shutdown()
        del self.stage
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _prompts(n: int, length: int, vocab: int, seed: int) -> Tokens:
    g = torch.Generator().manual_seed(seed)
    return [[1, *torch.randint(3, vocab, (length - 1,), generator=g).tolist()] for _ in range(n)]


def shape_figures(
    name: str, path: Path, device: torch.device, bw: dict[str, Any] | None, tiny: bool
) -> dict[str, Any]:
    """The per-shape figures, each part guarded (errors under "errors")."""
    shape = random_checkpoint.SHAPES[name]
    prompt, new = (16, 16) if tiny else (128, 128)
    batches = (16, 64, 256)
    parts = Parts(float("inf"))
    out: dict[str, Any] = {"prompt_tokens": prompt, "new_tokens": new}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # KV for the largest batch plus the 2048-token prompt, with a quarter to spare
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    kv = int(1.25 * per_token * (max(batches) * (prompt + new) + 4096))
    eng = Engine(path, device, "auto", kv, fake_graphs=tiny)  # "auto": the checkpoint's
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
        eng.generate(_prompts(2, prompt, shape.vocab, 0), 4)  # warm-up

        def b1() -> float:
            _, times, _, _ = eng.generate(_prompts(1, prompt, shape.vocab, 1), new)
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
                toks, _, _, wall = eng.generate(_prompts(b, prompt, shape.vocab, b), new)
                return sum(len(t) for t in toks) / wall

            out[f"tok_s_b{b}"] = parts.run(f"tok_s_b{b}", tput)

        def ttft() -> float:
            p = _prompts(1, 2048, shape.vocab, 7)
            runs = []
            for _ in range(2):  # the second, warm
                _, times, _, _ = eng.generate(p, 1)
                runs.append(times[0][0])
            return 1e3 * runs[-1]

        out["ttft_ms_prompt2048"] = parts.run("ttft_ms_prompt2048", ttft)

        def ratio() -> dict[str, Any]:
            ps = _prompts(4, 32 if not tiny else 12, shape.vocab, 11)
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
    prompts = _prompts(4, 16, vocab, 3)
    new = 16
    eng = Engine(path, device, "float32", (64 << 20) if tiny else (2 << 30))
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    parts = Parts(args.budget_s)
    out: dict[str, Any] = {
        "device": args.device,
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "machine": harness.machine(),
    }
    parts.run("run", lambda: _run(args, parts, out))
    out["errors"] = parts.errors
    out["wall_s"] = time.monotonic() - parts.t0
    return out


def _run(args: argparse.Namespace, parts: Parts, out: dict[str, Any]) -> None:
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    shapes = [s for s in (args.shapes or ("tiny" if args.tiny else "1b,3b")).split(",") if s]
    unknown = [s for s in shapes if s not in random_checkpoint.SHAPES]
    if unknown:
        raise ValueError(f"--shapes: {unknown} not in {sorted(random_checkpoint.SHAPES)}")
    if device.type == "cuda":
        out["device_name"] = parts.run("device_name", lambda: torch.cuda.get_device_name(device))
    # Which attention backend to run (issue 29 item 3): early, so the budget never skips it.
    att = parts.run("attention", lambda: attention(device, args.tiny, args.attention_timeout_s))
    out["attention"] = att
    out["attention_backend_choice"] = None if att is None else att["choice"]["attention_backend"]
    if args.attention_only:
        return
    bw = parts.run("bandwidth", lambda: bandwidth(device))
    out["bandwidth"] = bw
    out["roofline_bandwidth"] = "measured device copy (bytes read + written / time)"
    with tempfile.TemporaryDirectory(prefix="tessera-gpu-check-") as tmp:

        def one_shape(name: str) -> Path | None:
            t = time.perf_counter()
            made: Path | None = parts.run(
                f"{name}.checkpoint",
                functools.partial(
                    random_checkpoint.make,
                    Path(tmp) / name,
                    random_checkpoint.SHAPES[name],
                    "bfloat16",
                    device.type,
                ),
            )
            if made is not None:
                res = parts.run(
                    name, functools.partial(shape_figures, name, made, device, bw, args.tiny)
                )
                if res is not None:
                    res["checkpoint_s"] = time.perf_counter() - t
                    out[name] = res
            return made

        # The first shape, then the once-only parts on its checkpoint, then the others
        # (the largest last: a budget running out skips the least).
        first = one_shape(shapes[0]) if shapes else None
        match = None
        if first is not None:
            match = parts.run(
                "tokens_match_fp32", lambda: tokens_match_fp32(first, device, args.tiny)
            )
        out["tokens_match_fp32"] = None if match is None else match["match"]
        out["tokens_match_detail"] = match
        srv = None
        if first is not None and not args.skip_serve:
            srv = parts.run(
                "served_tok_s_c64",
                lambda: bench_gpu_serve.served(first, device, args.tiny, Path(tmp), args.tls),
            )
        out["served_tok_s_c64"] = None if srv is None else srv["tok_s"]
        out["served_detail"] = srv
        out["served_kv_pool_gib"] = None if srv is None else srv["memory"]["kv_pool_gib"]
        inproc = out.get(shapes[0], {}).get("tok_s_b64") if shapes else None
        if srv is not None and inproc:
            out["served_vs_inprocess_c64"] = srv["tok_s"] / inproc
        for name in shapes[1:]:
            one_shape(name)


def main() -> int:  # `python -m tessera_agent.bench_gpu`: the same, without the CLI
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--json", action="store_true")
    print(json.dumps(run(parser.parse_args()), sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
