"""The eager rows' prepacked projections (`engine/packed_linear.py`): a packed projection
agrees with `F.linear`, small or swapped ones are left alone, and a pipeline whose
many-row steps run through the packs keeps transformers' greedy tokens and
log-probabilities (no compiling here: the graph stays "warming", every step eager)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from tessera_agent.engine import compile_policy, decode_graph, options, packed_linear, sampling
from tests.conftest import hf_greedy, hf_greedy_logprobs
from tests.engine import helpers

ON = options.EngineOptions(compile_decode="on")


class _Counting(packed_linear.StagePacks):
    """Counts the projections that ran through a pack."""

    hits = 0

    def get(self, mod: nn.Module) -> torch.Tensor | None:
        got = super().get(mod)
        self.hits += got is not None
        return got


def test_packed_projection_matches_linear_and_falls_back(tiny_qwen2: Path) -> None:
    (st,) = helpers.load(tiny_qwen2, [(0, 2)])
    m = st.runner.model
    packs = packed_linear.StagePacks(m)
    weights = sum(mod.weight.nbytes for mod in packed_linear.projections(m))
    assert packs.nbytes == weights <= compile_policy.packed_bytes(m, ON)  # booked with the graph
    qkv = m.layers[0].self_attn.qkv_proj  # Qwen2: a biased projection
    assert qkv.bias is not None and packs.get(qkv) is not None
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        x = torch.randn(packed_linear.MIN_ROWS + 5, qkv.in_features, generator=g)
        got = packed_linear.linear(qkv, x, packs)
        assert torch.allclose(got, qkv(x), atol=1e-5, rtol=1e-5)
        small = x[: packed_linear.MIN_ROWS - 1]  # too few rows: F.linear itself
        assert torch.equal(packed_linear.linear(qkv, small, packs), qkv(small))
        qkv.weight = nn.Parameter(qkv.weight.detach().clone() * 2)  # swapped since packed
        assert packs.get(qkv) is None
        assert torch.equal(packed_linear.linear(qkv, x, packs), qkv(x))
        assert packs.get(nn.Linear(4, 4)) is None  # not one of the stage's


def test_pack_switch() -> None:
    cpu = torch.device("cpu")
    frozen = dataclasses.replace(ON, compile_freeze=True)  # a frozen graph's copy, then the packs
    assert compile_policy.copies(frozen, torch.float32, cpu) == 2
    assert compile_policy.copies(frozen, torch.bfloat16, cpu) == 1  # packs are float32 only
    assert not compile_policy.pack_prompts(ON, torch.device("cuda"))
    off = options.EngineOptions.from_env({options.PACK_ENV: "0", options.FREEZE_ENV: "1"})
    assert compile_policy.copies(off, torch.float32, cpu) == 1


def test_packed_eager_steps_match_hf(tiny_llama: Path, prompts: list[list[int]]) -> None:
    stages = helpers.load(tiny_llama, [(0, 4), (4, 8)])
    packs = []
    for st in stages:
        r = st.runner
        g = decode_graph.CompiledDecode(r.model, r.device, r.page_size)
        g.state = "warming"  # never compiles here: every step eager, through the packs
        g.packs = _Counting(r.model)
        r.decode_graph = g
        packs.append(g.packs)
    n = 8
    params = sampling.SamplingParams(max_tokens=n, ignore_eos=True, logprobs=0)
    sink: dict[int, list] = {}  # type: ignore[type-arg]
    delays = [0.0] * 4 + [0.01] * 4  # the late four meet the first four mid-decode
    out, _ = helpers.run(stages, prompts, params, delays=delays, sink=sink)
    assert out == [hf_greedy(tiny_llama, p, n) for p in prompts]
    assert all(p.hits > 0 for p in packs)  # both stages ran many-row steps packed
    for i, p in enumerate(prompts):
        _, ref = hf_greedy_logprobs(tiny_llama, p, n)
        got = torch.tensor([ev.logprobs.logprob for ev in sink[i]])
        want = torch.tensor([float(ref[j, t]) for j, t in enumerate(out[i])])
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_warm_runs_each_shape_once_per_bucket(
    tiny_qwen2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`StagePacks.warm` runs every distinct projection shape over each row bucket (so
    oneDNN's per-shape kernels are built at warm-up, not on served steps), and leaves
    results as they were."""
    (st,) = helpers.load(tiny_qwen2, [(0, 2)])
    m = st.runner.model
    packs = packed_linear.StagePacks(m)
    ran: list[tuple[int, int]] = []
    real = packed_linear.run_packed

    def counting(x: torch.Tensor, pack: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ran.append((x.shape[0], x.shape[1]))
        return real(x, pack, bias)

    monkeypatch.setattr(packed_linear, "run_packed", counting)
    shapes = {
        (mod.in_features, mod.out_features, mod.bias is not None)
        for mod in packed_linear.projections(m)
    }
    assert packs.warm(m, 256) >= 0
    buckets = list(range(packed_linear.MIN_ROWS, 256 + 1, packed_linear.ROW_BUCKET))
    assert len(ran) == len(shapes) * len(buckets) == 4 * 7
    assert sorted({rows for rows, _ in ran}) == buckets
    qkv = m.layers[1].self_attn.qkv_proj
    with torch.inference_mode():
        x = torch.randn(100, qkv.in_features, generator=torch.Generator().manual_seed(5))
        assert torch.allclose(packed_linear.linear(qkv, x, packs), qkv(x), atol=1e-5, rtol=1e-5)
