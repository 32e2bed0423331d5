"""Stitching blocks between two widths of a family trained here: the family's equivalence
is real, the stitch beats its least-squares start, it is stored in the zoo with its
quality, and the stitched chain's cached decoding equals its uncached composition."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tessera_agent import stitch, tiny_family


def _load(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def test_the_language_is_seeded_and_heldout_is_unseen() -> None:
    a, b = tiny_family.sample(4, 1), tiny_family.sample(4, 1)
    assert torch.equal(a, b) and a.shape == (4, tiny_family.SEQ)
    assert not torch.equal(tiny_family.heldout(4), a)
    succ = tiny_family.successors()
    ids = a - tiny_family.FIRST_ID
    for row in ids:
        for x, y in itertools.pairwise(row):
            assert y in succ[x]


def test_the_family_learned_the_same_language(family: Path) -> None:
    small, large = _load(family / "small"), _load(family / "large")
    assert (small.config.hidden_size, large.config.hidden_size) == (64, 128)
    cos, top1 = stitch.small_alone(small, large, tiny_family.heldout(8))
    assert top1 > 0.5 and cos > 0.8  # a random pair agrees on ~1/512 of the argmaxes
    record = json.loads((family / "family.json").read_text())
    assert record["small"]["loss_last"] < record["small"]["loss_first"]


def test_stitch_trains_beyond_its_start_and_is_stored_with_quality(
    family: Path, tmp_path: Path
) -> None:
    small, large = _load(family / "small"), _load(family / "large")
    points = stitch.default_points(4, 6)
    assert points == [(1, 2), (2, 3), (3, 4)]
    data, held = tiny_family.sample(48, seed=7), tiny_family.heldout(8)
    start = stitch.train(small, large, data, points, steps_per_point=0, joint_steps=0)
    trained = stitch.train(small, large, data, points, steps_per_point=5, joint_steps=30)
    before = stitch.measure(small, large, start, held, points)
    after = stitch.measure(small, large, trained, held, points)
    assert sum(q.cosine for q in after) > sum(q.cosine for q in before)
    where = stitch.save(tmp_path, family / "small", family / "large", trained, after, {})
    assert where == stitch.zoo_path(tmp_path, family / "small", family / "large")
    loaded, meta = stitch.load(where)
    assert [q["point"] for q in meta["quality"]] == [list(p) for p in points]
    assert meta["quality"][1]["cosine"] == after[1].cosine
    assert meta["large"]["sha256"] == stitch.checkpoint_digest(family / "large")
    h = torch.randn(1, 3, 64)
    assert torch.equal(loaded(h, (2, 3)), trained(h, (2, 3)))
    assert not torch.equal(trained(h, (1, 2)), trained(h, (3, 4)))  # the position counts
    chain = stitch.StitchedChain.from_zoo(tmp_path, family / "small", family / "large", (2, 3))
    assert chain.quality == after[1]  # the chain opted in carries the measured quality
    with pytest.raises(LookupError):
        stitch.StitchedChain.from_zoo(tmp_path, family / "large", family / "small", (2, 3))
    with pytest.raises(ValueError, match="not measured"):
        stitch.StitchedChain.from_zoo(tmp_path, family / "small", family / "large", (2, 2))


def test_stitched_chain_cached_decoding_equals_the_uncached_composition(family: Path) -> None:
    small, large = _load(family / "small"), _load(family / "large")
    st = stitch.train(
        small, large, tiny_family.sample(16, seed=7), [(2, 3)], steps_per_point=2, joint_steps=0
    )
    chain = stitch.StitchedChain(small, large, st, (2, 3))
    prompt = [10, 11, 12]
    tokens, _ = chain.generate(prompt, 10)
    seq = list(prompt)
    tail = stitch.block_parts.Part(large, 3, 6)
    for _ in range(10):
        ids = torch.tensor([seq])
        with torch.inference_mode():
            logits = stitch._tail_logits(tail, st(stitch._hidden(small, ids, 2), (2, 3)))
        seq.append(int(logits[0, -1].argmax()))
    assert tokens == seq[len(prompt) :]
    assert chain.param_bytes < stitch.block_parts.Part(large, 0, 6).param_bytes


def test_model_stitch_command_stores_the_record(family: Path, tmp_path: Path) -> None:
    from tessera.cli import main

    zoo = tmp_path / "zoo"
    rc = main.main(
        [
            "model",
            "stitch",
            str(family / "small"),
            str(family / "large"),
            "--zoo",
            str(zoo),
            "--steps-per-point",
            "2",
            "--joint-steps",
            "4",
        ]
    )
    assert rc == 0
    (entry,) = (zoo / "stitch").iterdir()
    meta = json.loads((entry / "stitch.json").read_text())
    assert len(meta["quality"]) == 3 and meta["d_in"] == 65 and meta["d_out"] == 128


def test_bench_stitch_quick_reports_the_acceptance_keys(family: Path) -> None:
    from tessera_agent import bench_stitch

    parser = argparse.ArgumentParser()
    bench_stitch.add_arguments(parser)
    out = bench_stitch.run(parser.parse_args(["--quick", "--family", str(family)]))
    for key in ("cosine", "top1_agreement", "param_bytes_saved", "tpot_ratio"):
        assert key in out, key
    assert 0.0 <= out["top1_agreement"] <= 1.0 and out["param_bytes_saved"] > 0
    assert out["paper_table3"]["label"].startswith("the paper's")
    assert len(out["paper_table3"]["rows"]) == 5


@pytest.mark.parametrize("bad", [(0, 1)])
def test_default_points_exclude_the_ends(bad: tuple[int, int]) -> None:
    assert bad not in stitch.default_points(4, 6)
