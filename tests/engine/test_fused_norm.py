"""Residual add + RMSNorm (`fused_norm.add_rms_norm`): on CPU exactly today's two eager
steps; the function CUDA compiles gives the same values (compiled here by Inductor's CPU
backend); a failed compile falls back to eager for good."""

from __future__ import annotations

import pytest
import torch

from tessera_agent.engine import fused_norm, model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_path_is_the_eager_add_then_norm_bitwise(dtype: torch.dtype) -> None:
    norm = model.RMSNorm(64, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64) + 0.5)
    x, d = torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype)
    h, n = fused_norm.add_rms_norm(x, d, norm)
    assert torch.equal(h, x + d) and torch.equal(n, norm(x + d))


@pytest.mark.slow
def test_the_compiled_function_gives_the_eager_values() -> None:
    w = torch.rand(64) + 0.5
    x, d = torch.randn(7, 64), torch.randn(7, 64)
    got = fused_norm._Compiled()(x, d, w, 1e-6)
    assert got is not None
    h, n = got
    torch.testing.assert_close(h, x + d)
    norm = model.RMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(w)
    torch.testing.assert_close(n, norm(x + d))


def test_a_failed_compile_falls_back_once_and_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    c = fused_norm._Compiled()

    def boom(*a: object) -> object:
        raise RuntimeError("no triton")

    c.fn = boom  # type: ignore[assignment]
    w = torch.ones(4)
    assert c(torch.ones(1, 4), torch.ones(1, 4), w, 1e-6) is None
    assert "no triton" in c.broken
    c.fn = None
    assert c(torch.ones(1, 4), torch.ones(1, 4), w, 1e-6) is None and c.fn is None
