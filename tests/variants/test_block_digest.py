"""Content addresses of layers: equal across checkpoints and shardings, changed by any edit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera_agent import tiny_checkpoint as tc
from tessera_agent import tiny_variants
from tessera_agent.engine import block_digest


def test_same_layers_same_digest_whatever_the_sharding(tmp_path: Path) -> None:
    one = tc.make_tiny(tmp_path / "one", tc.TinySpec(layers=4, seed=5))
    sharded = tc.make_tiny(tmp_path / "sharded", tc.TinySpec(layers=4, seed=5, shards=3))
    other = tc.make_tiny(tmp_path / "other", tc.TinySpec(layers=4, seed=6))
    d1, d2 = block_digest.layer_digests(one), block_digest.layer_digests(sharded)
    assert d1 == d2
    assert len(set(d1.values())) == 4  # different layers, different digests
    assert not set(d1.values()) & set(block_digest.layer_digests(other).values())


def test_finetune_differs_exactly_in_its_changed_layers(tiny_llama: Path, tmp_path: Path) -> None:
    ft = tiny_variants.make_tiny_finetune(tiny_llama, tmp_path / "ft", layers=[2, 5], seed=1)
    assert block_digest.diff_layers(tiny_llama, ft) == [2, 5]
    assert block_digest.diff_layers(tiny_llama, tiny_llama) == []


def test_different_architectures_share_nothing(tiny_llama: Path, tmp_path: Path) -> None:
    small = tc.make_tiny(tmp_path / "small", tc.TinySpec(layers=2))
    with pytest.raises(ValueError, match="not the same architecture"):
        block_digest.diff_layers(tiny_llama, small)
