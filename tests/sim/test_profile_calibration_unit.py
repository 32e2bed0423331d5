"""The cost model calibrated to measured step profiles, per layout (issue 34), without
agents: synthetic `tessera profile` documents whose timings follow known coefficients."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.cost import fit, profile, profile_calibration
from tessera.cost.model_shape import ModelShape

SHAPE = ModelShape("tiny", 256, 704, 8, 4, 2, 512, 64, 4)
LINK = profile.Link(1e9, 5e-4)
COMM = profile.CommSpec(intra_node=LINK, inter_node=LINK, allreduce_per_layer=0)


def _timings(scale: float) -> list[fit.LayerTiming]:
    out = [fit.LayerTiming("prefill", n, 0, 1, scale * (1e-4 + 2e-6 * n)) for n in (8, 32, 64, 128)]
    out += [
        fit.LayerTiming("decode", b, c, 1, scale * (5e-5 + 1e-6 * b + 1e-8 * b * c))
        for b in (1, 2, 4, 8)
        for c in (16, 64)
    ]
    out += [fit.LayerTiming("lm_head", b, 0, 1, scale * (4e-5 + 3e-6 * b)) for b in (1, 2, 4, 8)]
    return out


def _doc(scale: float, hop: float = 5e-4) -> dict[str, Any]:
    ts = _timings(scale)
    doc = fit.fit_profile(ts, SHAPE, "cpu", COMM).to_json()
    samples = [
        {
            "kind": t.kind,
            "size": t.size,
            "context_len": t.context_len,
            "seconds_per_layer": t.seconds_per_layer,
        }
        for t in ts
    ]
    doc["measurement"] = {"pp_hop_latency_s": hop, "samples": samples}
    return doc


def test_error_per_layout_is_measured_on_the_held_out_profiles() -> None:
    fit_on = [profile_calibration.measured_from_json(_doc(1.0), "a0")]
    held = [profile_calibration.measured_from_json(_doc(1.1), "a1")]
    res = profile_calibration.calibrate(fit_on, held, ["tp1pp1", "tp1pp2"])
    by = res.calibration.layouts
    assert set(by) == {"tp1pp1", "tp1pp2"}
    for e in by.values():
        assert e.held_out and e.fit_samples == 12 and e.eval_samples == 12
        # the fit profiles follow the model exactly: no correction; the held-out agent is
        # 10 % slower in every layer, so the error there is about 1 - 1 / 1.1
        assert e.factor == pytest.approx(1.0, abs=0.02)
        assert e.max == pytest.approx(0.1 / 1.1, abs=0.02)
    # composed steps: the pipeline pays one measured hop (and the hidden states' bytes)
    # per stage boundary
    m = held[0]
    t = m.timings[0]
    one = profile_calibration.measured_step(m, "tp1pp1", t)
    two = profile_calibration.measured_step(m, "tp1pp2", t)
    assert (
        one is not None
        and two is not None
        and two - one == pytest.approx(5e-4 + t.size * 1024 / 1e9)
    )


def test_bad_inputs_say_why() -> None:
    doc = _doc(1.0)
    del doc["measurement"]
    with pytest.raises(ValueError, match="not a measured profile"):
        profile_calibration.measured_from_json(doc, "x")
    m = profile_calibration.measured_from_json(_doc(1.0), "a0")
    with pytest.raises(ValueError, match="held-out"):
        profile_calibration.calibrate([m], [])
    assert profile_calibration.layer_split(8, 3) == (3, 3, 2)
    assert profile_calibration.layouts(8, 2) == ("tp1pp1", "tp1pp2")
