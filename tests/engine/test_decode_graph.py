"""The compiled decode path (`engine/decode_graph.py`) keeps transformers' greedy tokens and
log-probabilities; the eager fused ops (RMSNorm, RoPE) are bitwise the reference formulas."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessera_agent import tiny_checkpoint
from tessera_agent.engine import attention, decode_graph, model, sampling
from tests.conftest import hf_greedy, hf_greedy_logprobs
from tests.engine import helpers

NEW = 10


def _hf_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _hf_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


@pytest.mark.parametrize("hidden", [64, 96, 200, 256])
def test_fused_rmsnorm_and_rope_are_bitwise_the_reference(hidden: int) -> None:
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(13, hidden, generator=g) * 3
    norm = model.RMSNorm(hidden, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=g))
        assert torch.equal(norm(x), _hf_rms(x, norm.weight, 1e-6))
    hd = 64
    q = torch.randn(13, 6, hd, generator=g)
    ang = torch.rand(13, hd // 2, generator=g) * 100
    emb = torch.cat((ang, ang), dim=-1)
    got = model.apply_rope(q, emb.cos(), model.signed_sin(emb.sin()))
    assert torch.equal(got, _hf_rope(q, emb.cos(), emb.sin()))


def test_pure_decode_detection() -> None:
    mk = attention.ChunkGeometry
    cpu = torch.device("cpu")
    decode = attention.build_metadata([mk(5, 1, (0,)), mk(3, 1, (1,))], 16, cpu)
    mixed = attention.build_metadata([mk(5, 1, (0,)), mk(0, 4, (1,))], 16, cpu)
    assert decode_graph.is_pure_decode(decode)
    assert not decode_graph.is_pure_decode(mixed)


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Two layers: compiling is the slow part of this test and grows with the layers.
    spec = tiny_checkpoint.TinySpec(layers=2, seed=5)
    return tiny_checkpoint.make_tiny(tmp_path_factory.mktemp("ckpt") / "small", spec)


@pytest.mark.slow
def test_compiled_decode_matches_hf(small_llama: Path, prompts: list[list[int]]) -> None:
    """Staggered arrivals over a 2-stage pipeline: pure-decode steps run compiled on both
    stages (first stage from token ids, second from hidden states), mixed steps eagerly;
    greedy tokens equal transformers', log-probabilities within the oracle's tolerance."""
    stages = helpers.load(small_llama, [(0, 1), (1, 2)])
    for st in stages:
        st.runner.decode_graph = decode_graph.CompiledDecode(st.runner.model, st.runner.device)
    params = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=0)
    sink: dict[int, list] = {}  # type: ignore[type-arg]
    delays = [0.0, 0.0, 0.0, 0.05]
    out, _ = helpers.run(stages, prompts[:4], params, delays=delays, sink=sink)
    assert out == [hf_greedy(small_llama, p, NEW) for p in prompts[:4]]
    for st in stages:
        assert st.runner.decode_graph is not None and st.runner.decode_graph.calls > 0
    for i, p in enumerate(prompts[:4]):
        _, ref = hf_greedy_logprobs(small_llama, p, NEW)
        got = torch.tensor([ev.logprobs.logprob for ev in sink[i]])
        want = torch.tensor([float(ref[j, t]) for j, t in enumerate(out[i])])
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(decode_graph.ENV, "1")
    assert decode_graph.enabled_from_env()
    monkeypatch.setenv(decode_graph.ENV, "0")
    assert not decode_graph.enabled_from_env()
    monkeypatch.delenv(decode_graph.ENV)
    assert not decode_graph.enabled_from_env()
