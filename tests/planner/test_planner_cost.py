"""Cost model: model shapes, analytic profiles, stage latency and replica capacity."""

from __future__ import annotations

import dataclasses

import pytest
from planner_helpers import CLASSES, SLO, h100, shape

from tessera import fields
from tessera.cost import analytic, capacity, latency, model_shape
from tessera.cost.capacity import CapacityOptions, ReplicaLayout, RequestClass, Slo

PUBLISHED_BILLIONS = {
    "llama-2-7b": 6.74,
    "llama-2-13b": 13.02,
    "llama-2-70b": 68.98,
    "llama-3-8b": 8.03,
    "llama-3-70b": 70.55,
    "qwen2.5-14b": 14.77,
    "qwen2.5-72b": 72.71,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_example_configs_give_published_parameter_counts(name: str) -> None:
    m = shape(name)
    assert m.total_params / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], abs=0.01)
    assert m.dtype_bytes == 2


def test_hf_config_defaults_and_field_errors() -> None:
    base = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
    }
    m = model_shape.from_hf_config(base, "tiny")
    assert (m.num_kv_heads, m.head_dim, m.dtype_bytes) == (4, 16, 2)
    with pytest.raises(fields.FieldError, match=r"config.json.vocab_size: is required"):
        model_shape.from_hf_config({k: v for k, v in base.items() if k != "vocab_size"}, "x")
    with pytest.raises(fields.FieldError, match=r"num_key_value_heads"):
        model_shape.from_hf_config({**base, "num_key_value_heads": 3}, "x")
    with pytest.raises(fields.FieldError, match=r"torch_dtype"):
        model_shape.from_hf_config({**base, "torch_dtype": "int3"}, "x")


def test_analytic_profile_is_labelled_and_uses_stated_peaks() -> None:
    prof = h100("llama-2-13b")
    assert prof.source == "analytic"
    assert prof.to_json()["source"] == "analytic"
    spec = analytic.device_spec("h100-80gb")
    eff = analytic.Efficiency()
    m = prof.model
    assert prof.decode.per_tp == pytest.approx(
        m.layer_params * 2 / (spec.hbm_bytes_per_s * eff.hbm)
    )
    assert dict(prof.assumptions)["eff_hbm"] == eff.hbm
    with pytest.raises(fields.FieldError, match="device"):
        analytic.analytic_profile(m, "tpu-v5")


def test_a100_is_slower_than_h100() -> None:
    m = shape("llama-2-13b")
    a100 = analytic.analytic_profile(m, "a100-80gb")
    h100_prof = analytic.analytic_profile(m, "h100-80gb")
    assert a100.decode.seconds(32, 1000, 1) > h100_prof.decode.seconds(32, 1000, 1)
    assert a100.prefill.seconds(1000, 1) > h100_prof.prefill.seconds(1000, 1)


def test_layer_time_grows_with_work_and_shrinks_with_tp() -> None:
    prof = h100("llama-2-70b")
    assert prof.prefill.seconds(2000, 1) > prof.prefill.seconds(1000, 1)
    assert prof.prefill.seconds(1000, 4) < prof.prefill.seconds(1000, 2)
    assert prof.decode.seconds(64, 1000, 1) > prof.decode.seconds(32, 1000, 1)
    assert prof.decode.seconds(32, 2000, 1) > prof.decode.seconds(32, 1000, 1)
    assert prof.decode.seconds(32, 1000, 8) < prof.decode.seconds(32, 1000, 2)


def test_allreduce_ring_cost() -> None:
    link = h100("llama-2-13b").comm.intra_node
    assert latency.allreduce_seconds(1e6, 1, link) == 0.0
    two = latency.allreduce_seconds(1e6, 2, link)
    assert two == pytest.approx(2 * link.latency_s + 2 * 0.5e6 / link.bandwidth_bytes_per_s)
    assert latency.allreduce_seconds(1e6, 8, link) > two


def _layout(name: str, tp: int, pp: int, memory: int = 80 * 2**30) -> ReplicaLayout:
    prof = h100(name)
    layers = prof.model.num_layers
    per = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
    stages = tuple(
        latency.StageSpec(n, s == 0, s == pp - 1, None if s == pp - 1 else prof.comm.intra_node)
        for s, n in enumerate(per)
    )
    return ReplicaLayout(tp, stages, memory, prof.comm.intra_node)


def _rate(name: str, tp: int, pp: int, cls: RequestClass, slo: Slo = SLO, **kw: int) -> float:
    return capacity.replica_capacity(h100(name), _layout(name, tp, pp, **kw), cls, slo).rate


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (2, 2), (4, 1)])
def test_capacity_monotone_in_slo_and_memory(tp: int, pp: int) -> None:
    for cls in CLASSES:
        tight = _rate("llama-2-13b", tp, pp, cls, Slo(1.0, 0.05))
        base = _rate("llama-2-13b", tp, pp, cls)
        loose = _rate("llama-2-13b", tp, pp, cls, Slo(4.0, 0.2))
        assert tight <= base <= loose
        small = _rate("llama-2-13b", tp, pp, cls, memory=40 * 2**30)
        assert small <= base


def test_capacity_decreases_with_prompt_length() -> None:
    rates = [_rate("llama-2-13b", 1, 1, RequestClass("c", n, 100)) for n in (100, 500, 2000, 4000)]
    assert rates == sorted(rates, reverse=True)
    assert rates[-1] > 0


def test_capacity_respects_slo_and_memory() -> None:
    prof = h100("llama-2-13b")
    lay = _layout("llama-2-13b", 2, 1)
    opts = CapacityOptions()
    for cls in CLASSES:
        cap = capacity.replica_capacity(prof, lay, cls, SLO, opts)
        assert cap.rate > 0
        assert cap.tpot_s <= SLO.tpot_s * opts.slo_headroom
        assert cap.ttft_s <= SLO.ttft_s * opts.slo_headroom
        limit = capacity.kv_batch_limit(prof, lay, cls.input_tokens + cls.output_tokens, opts)
        assert 1 <= cap.batch <= min(limit, opts.max_batch)
        assert cap.limited_by in ("memory", "tpot", "ttft", "max_batch")


def test_capacity_zero_when_slo_unreachable_or_weights_do_not_fit() -> None:
    impossible = capacity.replica_capacity(
        h100("llama-2-13b"), _layout("llama-2-13b", 1, 1), CLASSES[1], Slo(0.001, 0.1)
    )
    assert impossible.rate == 0.0 and impossible.limited_by == "ttft"
    no_room = capacity.replica_capacity(
        h100("llama-2-70b"), _layout("llama-2-70b", 1, 1), CLASSES[0], SLO
    )
    assert no_room.rate == 0.0 and no_room.limited_by == "memory"


def test_short_outputs_favour_data_parallel_long_favour_model_parallel() -> None:
    short, long = CLASSES[0], CLASSES[1]
    # per GPU: two tp1 replicas vs one tp2 replica
    assert 2 * _rate("llama-2-13b", 1, 1, short) > _rate("llama-2-13b", 2, 1, short)
    assert 2 * _rate("llama-2-13b", 1, 1, long) < _rate("llama-2-13b", 2, 1, long)


def test_dataclass_validation_names_fields() -> None:
    with pytest.raises(fields.FieldError, match="outputTokens"):
        RequestClass("x", 10, 0)
    with pytest.raises(fields.FieldError, match="tpotP99Ms"):
        Slo(1.0, 0.0)
    with pytest.raises(fields.FieldError, match="slo_headroom"):
        CapacityOptions(slo_headroom=1.5)
    with pytest.raises(fields.FieldError, match="per_seq"):
        dataclasses.replace(h100("llama-2-13b").decode, per_seq=-1.0)
