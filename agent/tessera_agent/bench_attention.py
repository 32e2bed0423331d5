"""Paged attention per backend on one device: which one a stage should run (issue 29 item 3).

Part of `tessera bench gpu --json` (key `attention`; `--attention-only` runs just it). On
one layer of the 1B shape over a KV pool of noise with pages dealt at random, each backend
that can run here is timed as the engine runs an eager step's attention (metadata, plan,
`LAYERS` calls of KV write + attention), median of `reps` steps: decode at batch 1/16/64
and one mixed prefill step; `max_abs_diff` against native; SDPA's default dispatch against
flash only (`sdpa_prefill`). `bench_gpu` runs `main` in a child process with a time limit.
`choice` picks the fastest backend that agrees with native (`TOLERANCE`) and beats it by
`MARGIN`, else native, and says why. Key meanings: docs/gpu.md.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tessera_agent.engine import attention, attention_backend, paged_tables

LAYERS = 16  # layer calls per step (the 1B shape's)
BATCHES = (1, 16, 64)
CTX = (448, 576)
PROMPT, CONTINUED = 512, 256  # the prefill step: 4 fresh prompts, 2 continued chunks
TINY = 8  # `tiny` divides the contexts and prompts by this (the CPU smoke run)
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-4}
MARGIN = 0.95  # a library backend must take at most this fraction of native's decode time


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Layer:
    """One layer's KV pool of noise and the step inputs drawn over it."""

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        heads: tuple[int, int, int],
        ps: int,
        div: int = 1,
    ) -> None:
        self.device, self.dtype, self.heads, self.ps = device, dtype, heads, ps
        self.layers = LAYERS if div == 1 else 2
        self.ctx = (CTX[0] // div, CTX[1] // div)
        self.prompt, self.continued = PROMPT // div, CONTINUED // div
        self.g = torch.Generator().manual_seed(0)
        per_seq = -(-self.ctx[1] // ps) + 1
        self.pages = max(BATCHES) * per_seq + 6 * (-(-(self.prompt + self.continued) // ps)) + 8
        nkv, hd = heads[1], heads[2]
        shape = (self.pages * ps, nkv, hd)
        self.k = torch.randn(shape, generator=self.g).to(device, dtype)
        self.v = torch.randn(shape, generator=self.g).to(device, dtype)
        self.perm = torch.randperm(self.pages, generator=self.g).tolist()
        self.k0, self.v0 = self.k.clone(), self.v.clone()

    def reset(self) -> None:
        """The pool as drawn (steps write their keys and values into it)."""
        self.k.copy_(self.k0)
        self.v.copy_(self.v0)

    def chunks(self, spec: list[tuple[int, int]]) -> list[attention.ChunkGeometry]:
        """(start, num_tokens) per chunk -> chunks over pages dealt from the shuffled pool."""
        out, at = [], 0
        for start, n in spec:
            k = -(-(start + n) // self.ps)
            out.append(attention.ChunkGeometry(start, n, tuple(self.perm[at : at + k])))
            at += k
        assert at <= self.pages
        return out

    def decode(self, b: int) -> list[attention.ChunkGeometry]:
        lens = torch.randint(self.ctx[0], self.ctx[1] + 1, (b,), generator=self.g).tolist()
        return self.chunks([(n - 1, 1) for n in lens])

    def prefill(self) -> list[attention.ChunkGeometry]:
        p, c = self.prompt, self.continued
        return self.chunks([(0, p)] * 4 + [(p, c)] * 2)

    def qkv(self, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        nh, nkv, hd = self.heads
        return tuple(  # type: ignore[return-value]
            torch.randn(t, n, hd, generator=self.g).to(self.device, self.dtype)
            for n in (nh, nkv, nkv)
        )


def _step(
    layer: Layer,
    backend: attention_backend.Backend | None,
    chunks: list[attention.ChunkGeometry],
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """One eager step's attention as the runner runs it: metadata, plan, a call per layer."""
    md = attention.build_metadata(chunks, layer.ps, layer.device)
    md.decode_mask = md.decode_mask.to(layer.dtype)
    if backend is not None:
        md.kernel = backend.plan(chunks, layer.pages)
        assert md.kernel is not None, "the backend declined the step"
    q, k, v = qkv
    out = q
    for _ in range(layer.layers):
        out = attention.paged_attention(q, k, v, md, layer.k, layer.v, scale)
    return out


def _time(fn: Callable[[], torch.Tensor], device: torch.device, warm: int, reps: int) -> float:
    """Median milliseconds of `reps` calls after `warm`, the device synchronised around each."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def sdpa_prefill(layer: Layer, scale: float, reps: int) -> dict[str, Any]:
    """SDPA on 4 fresh 512-token prompts (causal, grouped heads) as the native path calls
    it, with the default dispatch and with only the flash kernel allowed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    nh, nkv, hd = layer.heads
    g = layer.g
    q = torch.randn(4, nh, 512, hd, generator=g).to(layer.device, layer.dtype)
    k = torch.randn(4, nkv, 512, hd, generator=g).to(layer.device, layer.dtype)
    v = torch.randn(4, nkv, 512, hd, generator=g).to(layer.device, layer.dtype)

    def call() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)

    out: dict[str, Any] = {"default_ms": _time(call, layer.device, 2, reps)}
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out["flash_ms"] = _time(call, layer.device, 2, reps)
    except RuntimeError as exc:
        out["flash_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def choose(results: dict[str, dict[str, Any]], dtype: torch.dtype) -> dict[str, Any]:
    """The backend to run, and why (see the module's docstring). Pure over the results."""
    native = results.get("native", {})
    keys = [f"decode_ms_b{b}" for b in BATCHES]
    if any(native.get(k) is None for k in keys):
        return {"attention_backend": "native", "why": "native was not measured: no comparison"}
    ratios: dict[str, float] = {}
    notes: list[str] = []
    for name, r in results.items():
        if name == "native":
            continue
        if r.get("error"):
            notes.append(f"{name}: did not run ({r['error'][:120]})")
            continue
        diff = r.get("max_abs_diff")
        if diff is None or diff > TOLERANCE[dtype]:
            notes.append(f"{name}: output differs from native by {diff} (> {TOLERANCE[dtype]})")
            continue
        if any(r.get(k) is None for k in keys):
            errs = [str(r[k + "_error"])[:80] for k in keys if r.get(k + "_error")]
            notes.append(f"{name}: not every decode batch measured {errs}")
            continue
        ratios[name] = math.exp(sum(math.log(r[k] / native[k]) for k in keys) / len(keys))
    best = min(ratios, key=ratios.__getitem__, default=None)
    if best is not None and ratios[best] <= MARGIN:
        choice = best
        why = (
            f"{best}'s decode took {ratios[best]:.2f}x native's (geometric mean over batch "
            f"{', '.join(map(str, BATCHES))}), within tolerance of native's output"
        )
    else:
        choice = "native"
        why = (
            "no library backend was at least "
            f"{(1 - MARGIN) * 100:.0f}% faster than native at decode"
            + (f" (best: {best} at {ratios[best]:.2f}x)" if best is not None else "")
        )
    prefill = {
        n: results[n]["prefill_ms"] / native["prefill_ms"]
        for n in ratios
        if results[n].get("prefill_ms") and native.get("prefill_ms")
    }
    return {
        "attention_backend": choice,
        "why": why,
        "decode_vs_native": ratios,
        "prefill_vs_native": prefill,
        "not_considered": notes,
        "flag": f"tessera agent --attention-backend {choice}",
    }


Case = tuple[str, list[attention.ChunkGeometry], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def cases(layer: Layer) -> list[Case]:
    """The steps every backend runs, drawn once: (figure key, chunks, q / k / v)."""
    out: list[Case] = []
    for key, chunks in [(f"decode_ms_b{b}", layer.decode(b)) for b in BATCHES] + [
        ("prefill_ms", layer.prefill())
    ]:
        out.append((key, chunks, layer.qkv(sum(c.num_tokens for c in chunks))))
    return out


def backend_figures(
    name: str,
    layer: Layer,
    steps: list[Case],
    scale: float,
    reps: int,
    ref: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """One backend's figures (and, for native, the reference outputs into `ref`)."""
    t0 = time.perf_counter()
    layer.reset()
    backend = attention_backend.make(name, layer.device, layer.dtype, layer.ps, layer.heads, scale)
    res: dict[str, Any] = {}
    diff = 0.0
    for key, chunks, qkv in steps:
        try:
            first = _step(layer, backend, chunks, qkv, scale)  # compiles flex's kernels
        except Exception as exc:  # one shape failing leaves the others measured
            res[f"{key}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            _sync(layer.device)
            continue
        if key == steps[0][0]:
            res["compile_s"] = time.perf_counter() - t0
        res[key] = _time(
            functools.partial(_step, layer, backend, chunks, qkv, scale),
            layer.device,
            1 if layer.layers == LAYERS else 0,
            reps,
        )
        if name == "native":
            ref[key] = first
        elif key in ref:
            diff = max(diff, float((first.float() - ref[key].float()).abs().max()))
    res["max_abs_diff"] = diff
    return res


def measure(
    device: torch.device, tiny: bool = False, budget_s: float = 120.0, reps: int = 0
) -> dict[str, Any]:
    """Every backend's figures on `device` and the choice (see the module's docstring)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    heads = (4, 2, 64) if tiny else (32, 8, 64)
    reps = reps or (1 if tiny else 3 if device.type != "cuda" else 20)
    scale = 1 / math.sqrt(heads[2])
    layer = Layer(device, dtype, heads, 16, TINY if tiny else 1)
    t0 = time.monotonic()
    out: dict[str, Any] = {
        "shape": {"heads": heads[0], "kv_heads": heads[1], "head_dim": heads[2], "page": 16},
        "decode_ctx": list(layer.ctx),
        "prefill": f"4 x {layer.prompt} fresh + 2 x {layer.continued} after {layer.prompt}",
        "dtype": str(dtype).removeprefix("torch."),
        "layers_per_step": layer.layers,
        "torch": torch.__version__,
        "auto_resolves_to": attention_backend.resolve("auto", device),
    }
    ref: dict[str, torch.Tensor] = {}
    steps = cases(layer)
    results: dict[str, dict[str, Any]] = {}
    for name in ("native", "flashinfer", "flex"):
        if time.monotonic() - t0 > budget_s:
            results[name] = {"error": f"skipped: past the {budget_s:.0f} s attention budget"}
            continue
        try:
            results[name] = backend_figures(name, layer, steps, scale, reps, ref)
        except paged_tables.BackendUnavailable as exc:
            results[name] = {"error": f"unavailable: {exc}"[:400]}
        except Exception as exc:  # a library failing here must not stop the check
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        _sync(device)
    out["backends"] = results
    if device.type == "cuda":
        try:
            out["sdpa_prefill"] = sdpa_prefill(layer, scale, reps)
        except Exception as exc:
            out["sdpa_prefill"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out["choice"] = choose(results, dtype)
    out["wall_s"] = time.monotonic() - t0
    return out


def main() -> int:
    """`python -m tessera_agent.bench_attention --device cuda [--tiny]`: one JSON object."""
    import argparse
    import json

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--budget-s", type=float, default=120.0)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(json.dumps(measure(device, args.tiny, args.budget_s), sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
