"""Profile JSON schema (round trip, field-naming errors) and fitting from timings."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from planner_helpers import h100, shape

from tessera import fields
from tessera.cost import fit, latency, profile
from tessera.cost.fit import LayerTiming
from tessera.cost.profile import Profile


def test_json_round_trip_is_exact() -> None:
    prof = h100("qwen2.5-14b")
    doc = json.loads(json.dumps(prof.to_json()))
    assert profile.profile_from_json(doc) == prof
    assert doc["schema"] == profile.SCHEMA and doc["source"] == "analytic"
    assert doc["model"]["attention_bias"] is True


def _doc() -> dict[str, Any]:
    return copy.deepcopy(h100("llama-2-13b").to_json())


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda d: d["layer"]["decode_s"].update(per_seq=-1),
            r"^layer\.decode_s\.per_seq: must be >= 0",
        ),
        (
            lambda d: d["layer"]["prefill_s"].pop("per_token"),
            r"^layer\.prefill_s\.per_token: is required",
        ),
        (lambda d: d.update(source="guessed"), r"^source: must be one of analytic, measured"),
        (
            lambda d: d["comm"]["inter_node"].update(bandwidth_bytes_per_s=0),
            r"^comm\.inter_node\.bandwidth_bytes_per_s: must be > 0",
        ),
        (lambda d: d["model"].update(num_layers="many"), r"^model\.num_layers: must be an integer"),
        (lambda d: d.pop("lm_head"), r"^lm_head: is required"),
        (
            lambda d: d["layer"].update(kv_bytes_per_token=1.5),
            r"^layer\.kv_bytes_per_token: must be an integer",
        ),
        (lambda d: d.update(schema="other/v9"), r"^schema: must be"),
    ],
)
def test_errors_name_the_field(edit: Any, message: str) -> None:
    doc = _doc()
    edit(doc)
    with pytest.raises(fields.FieldError, match=message):
        profile.profile_from_json(doc)


def _samples(prof: Profile, noise: float, seed: int = 0) -> list[LayerTiming]:
    rng = random.Random(seed)
    comm = prof.comm
    act = prof.memory.activation_bytes_per_token
    out = []
    for tp in (1, 2, 4, 8):
        for n in (64, 256, 1024, 4096):
            t = prof.prefill.seconds(n, tp) + comm.allreduce_per_layer * latency.allreduce_seconds(
                n * act, tp, comm.intra_node
            )
            out.append(LayerTiming("prefill", n, 0, tp, t * (1 + rng.gauss(0, noise))))
        for b in (1, 8, 32, 128):
            for ctx in (256, 2048):
                t = prof.decode.seconds(
                    b, ctx, tp
                ) + comm.allreduce_per_layer * latency.allreduce_seconds(
                    b * act, tp, comm.intra_node
                )
                out.append(LayerTiming("decode", b, ctx, tp, t * (1 + rng.gauss(0, noise))))
    return out


def test_fit_recovers_known_coefficients_exactly_without_noise() -> None:
    truth = h100("llama-2-13b")
    fitted = fit.fit_profile(_samples(truth, 0.0), truth.model, "h100-80gb")
    assert fitted.source == "measured"
    for got, want in ((fitted.prefill, truth.prefill), (fitted.decode, truth.decode)):
        for name, value in vars(want).items():
            assert getattr(got, name) == pytest.approx(value, rel=1e-5, abs=1e-12), name
    assert float(dict(fitted.assumptions)["decode_fit_rel_rms"]) < 1e-6


def test_fit_with_noise_predicts_within_a_few_percent() -> None:
    truth = h100("llama-2-70b")
    fitted = fit.fit_profile(_samples(truth, 0.02, seed=3), truth.model, "h100-80gb")
    for n, tp in ((500, 2), (3000, 4)):
        assert fitted.prefill.seconds(n, tp) == pytest.approx(
            truth.prefill.seconds(n, tp), rel=0.05
        )
    for b, ctx, tp in ((16, 1000, 2), (96, 3000, 8)):
        assert fitted.decode.seconds(b, ctx, tp) == pytest.approx(
            truth.decode.seconds(b, ctx, tp), rel=0.05
        )
    assert profile.profile_from_json(json.loads(json.dumps(fitted.to_json()))) == fitted


def test_fit_uses_lm_head_samples_when_given() -> None:
    truth = h100("llama-2-7b")
    head = [
        LayerTiming("lm_head", b, 0, tp, truth.lm_head_decode.seconds(b, 0, tp))
        for b in (1, 16, 64)
        for tp in (1, 2)
    ]
    fitted = fit.fit_profile(_samples(truth, 0.0) + head, truth.model, "h100-80gb")
    assert fitted.lm_head_decode.per_tp == pytest.approx(truth.lm_head_decode.per_tp, rel=1e-5)


def test_fit_rejects_bad_inputs() -> None:
    m = shape("llama-2-7b")
    few = [LayerTiming("prefill", 100 * (i + 1), 0, 1, 1e-3 * (i + 1)) for i in range(3)]
    with pytest.raises(fields.FieldError, match="need at least 4 prefill samples"):
        fit.fit_profile(few, m, "h100-80gb")
    with pytest.raises(fields.FieldError, match="comm"):
        fit.fit_profile(few, m, "cpu")
    with pytest.raises(fields.FieldError, match="kind"):
        LayerTiming("train", 1, 0, 1, 1.0)
    with pytest.raises(fields.FieldError, match="seconds_per_layer"):
        LayerTiming("decode", 1, 0, 1, 0.0)
