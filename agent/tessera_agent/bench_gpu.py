"""GPU check of the block engine: speed against the memory-bandwidth roofline, half precision.

`tessera bench gpu --json` on one H100 / H200 with no network makes its own random-weight
bfloat16 checkpoints (the 1B and 3B shapes) and prints one JSON object: per shape the
decode step at batch 1 against the roofline, throughput at batch 16/64/256, TTFT at 2048
tokens, graph capture time, peak memory and the half-precision log-prob oracle; once the
float32 token match and the served throughput at 64 concurrent requests; first, the
attention backends' times and choice (`bench_attention.py`, in a child process). Each
part is guarded (a failure becomes a string under `errors`). Keys and their meaning:
docs/gpu.md. `--device cpu --tiny` runs the same parts on a tiny shape (CI smoke test).
One shape's figures are `bench_gpu_shape`'s, the served part `bench_gpu_serve`'s.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tessera.bench import harness
from tessera_agent import bench_gpu_parts, bench_gpu_serve, bench_gpu_shape, random_checkpoint

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


def run(args: argparse.Namespace) -> dict[str, Any]:
    parts = bench_gpu_parts.Parts(args.budget_s)
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


def _run(args: argparse.Namespace, parts: bench_gpu_parts.Parts, out: dict[str, Any]) -> None:
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
                    name,
                    functools.partial(
                        bench_gpu_shape.shape_figures, name, made, device, bw, args.tiny
                    ),
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
                "tokens_match_fp32",
                lambda: bench_gpu_shape.tokens_match_fp32(first, device, args.tiny),
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
