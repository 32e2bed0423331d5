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


def test_share_report_judges_each_layer_where_it_would_be_swapped(tmp_path: Path) -> None:
    """Layer 3 changed a little after layer 2 changed a lot: the whole-model comparison
    scores it low (its input differs), the swap-in score accepts it; the quality of the
    composition served is measured against the fine-tune alone."""
    base = tc.make_tiny(tmp_path / "base", tc.TinySpec(layers=4))
    ft = tiny_variants.make_tiny_finetune(base, tmp_path / "strong", layers=[2], seed=2, std=0.3)
    ft = tiny_variants.make_tiny_finetune(ft, tmp_path / "ft", layers=[3], seed=3, std=0.002)
    calib = equivalence.calibration_set(512)
    assert calib == equivalence.calibration_set(512)  # deterministic
    whole = {r.start: r for r in equivalence.report(base, ft, calib)}
    rep = equivalence.share_report(base, ft)
    by = {s.layer: s for s in rep.layers}
    assert whole[3].cosine < 0.98 <= by[3].cosine and by[3].shared and not by[3].identical
    assert not by[2].shared and by[2].cosine < 0.9
    assert by[0].identical and by[1].identical and rep.equivalent_layers == (3,)
    assert rep.calibration == equivalence.CALIBRATION and rep.calibration_tokens == 128
    assert 0.9 < rep.final_cosine <= 1.0 and 0.5 < rep.top1_agreement <= 1.0
    assert rep.to_json()["layers"][3] == {  # type: ignore[index]
        "layer": 3,
        "cosine": round(by[3].cosine, 6),
        "identical": False,
        "shared": True,
    }
