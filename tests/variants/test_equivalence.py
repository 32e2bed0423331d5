"""Logit-lens equivalence report: identical blocks are shared, near-equal ones are scored,
and a perturbation's size shows in the measured similarity."""

from __future__ import annotations

from pathlib import Path

import torch

from tessera_agent import equivalence, tiny_variants
from tessera_agent import tiny_checkpoint as tc


def test_report_ranks_controlled_perturbations(tmp_path: Path) -> None:
    base = tc.make_tiny(tmp_path / "base", tc.TinySpec(layers=4))
    ft = tiny_variants.make_tiny_finetune(base, tmp_path / "small", layers=[1], std=0.002)
    ft = tiny_variants.make_tiny_finetune(ft, tmp_path / "ft", layers=[2], seed=2, std=0.3)
    g = torch.Generator().manual_seed(0)
    calib = [[0, *torch.randint(5, 500, (24,), generator=g).tolist()] for _ in range(3)]
    rep = {r.start: r for r in equivalence.report(base, ft, calib)}
    assert rep[0].identical and rep[0].cosine > 0.9999
    # Layer 1: weights changed a little: not identical, still equivalent at 0.98.
    assert not rep[1].identical and rep[1].equivalent and rep[1].cosine < 0.99999
    # Layer 2: changed a lot: the measured similarity falls below the threshold.
    assert not rep[2].identical and not rep[2].equivalent and rep[2].cosine < 0.9
    # Layer 3: the same weights (shared), though its input now differs.
    assert rep[3].identical and rep[3].equivalent
    assert rep[3].to_json()["layers"] == [3, 4]
