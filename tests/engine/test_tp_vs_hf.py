"""Tensor parallelism: greedy tokens equal transformers' for tp=2, tp=2 x pp=2 and tp=4,
with rank 0 here and the other ranks in a spawned process, all over gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera_agent import tp_local
from tessera_agent.engine import errors, sampling, stage
from tests.conftest import hf_greedy
from tests.engine import helpers

NEW = 8
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_gqa(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 q heads over 4 KV heads, head_dim 32 while hidden / heads is 24 (q width 256 !=
    hidden 192): the q/o shapes are not square, so any mix-up of the two shows."""
    from tessera_agent import tiny_checkpoint as tc

    spec = tc.TinySpec(
        arch="qwen2",
        layers=4,
        hidden=192,
        heads=8,
        kv_heads=4,
        head_dim=32,
        intermediate=256,
        seed=5,
    )
    return tc.make_tiny(tmp_path_factory.mktemp("ckpt") / "tiny-gqa", spec)


def _check(path: Path, splits: list[tuple[int, int]], tp: int, prompts: list[list[int]]) -> None:
    rep = tp_local.TPReplica(path, splits, tp)
    try:
        out, eng = helpers.run(rep.stages, prompts, GREEDY)
    finally:
        rep.close()
    assert out == [hf_greedy(path, p, NEW) for p in prompts]
    assert eng.steps >= NEW


@pytest.mark.parametrize(
    ("splits", "tp"), [([(0, 8)], 2), ([(0, 4), (4, 8)], 2)], ids=["tp2", "tp2xpp2"]
)
def test_tiny_llama_tp(
    tiny_llama: Path, prompts: list[list[int]], splits: list[tuple[int, int]], tp: int
) -> None:
    _check(tiny_llama, splits, tp, prompts[:4])


@pytest.mark.parametrize(
    ("splits", "tp"), [([(0, 4)], 4), ([(0, 1), (1, 4)], 2)], ids=["tp4", "tp2xpp2"]
)
def test_gqa_head_dim_tp(
    tiny_gqa: Path, prompts: list[list[int]], splits: list[tuple[int, int]], tp: int
) -> None:
    _check(tiny_gqa, splits, tp, prompts[:4])


def test_tp_that_does_not_divide_the_heads_is_refused(tiny_llama: Path) -> None:
    spec = stage.BlockSpec(str(tiny_llama), 0, 8, tp_size=3)
    with pytest.raises(errors.InvalidArgumentError, match="tp=3 does not divide the model's 4"):
        stage.plan_bytes(spec)
    spec = stage.BlockSpec(str(tiny_llama), 0, 8, tp_size=4, tp_rank=0)
    with pytest.raises(errors.InvalidArgumentError, match="2 KV heads"):
        stage.plan_bytes(spec)


def test_shard_bytes_and_kv_heads(tiny_llama: Path) -> None:
    """Each of 2 ranks holds about half the layer weights and half the KV heads."""
    whole = stage.load_stage(
        stage.BlockSpec(str(tiny_llama), 0, 8, kv_bytes=1 << 20),
        __import__("torch").device("cpu"),
        1 << 30,
    )
    half = stage.load_stage(
        stage.BlockSpec(str(tiny_llama), 0, 8, kv_bytes=1 << 20, tp_size=2, tp_rank=1),
        __import__("torch").device("cpu"),
        1 << 30,
    )
    assert half.runner.cache.layout.kv_heads == whole.runner.cache.layout.kv_heads // 2
    assert half.num_pages == 2 * whole.num_pages  # same bytes, half the heads per page
    assert half.param_bytes < whole.param_bytes
    assert half.param_bytes == sum(p.numel() * 4 for p in half.runner.model.parameters())
