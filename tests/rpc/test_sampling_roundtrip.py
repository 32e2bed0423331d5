"""Sampling settings cross every boundary whole: an HTTP body → `rpc.sampling.Sampling` →
`pb.SamplingParams` (through a `dispatch.Job`, serialized) → the engine's `SamplingParams`,
and engine → proto → engine between stages. Every field is set to a non-default value, so
a field that one converter drops, or that one type gains without the others, fails here."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.gateway import dispatch, request_params
from tessera.rpc import sampling
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import convert
from tessera_agent.engine import sampling as engine_sampling

GATEWAY_ONLY = {"stop", "n"}  # answered by the gateway itself, never sent

BODY = {
    "model": "m",
    "prompt": [1, 2, 3],
    "max_tokens": 9,
    "temperature": 0.5,
    "top_p": 0.75,
    "top_k": 7,
    "seed": -123,
    "stop": ["x", "yy"],
    "ignore_eos": True,
    "logprobs": 3,
    "n": 2,
}


def _engine_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(engine_sampling.SamplingParams)}


def test_the_wire_type_and_the_engine_type_have_the_same_fields() -> None:
    wire = {f.name for f in dataclasses.fields(sampling.Sampling)} - GATEWAY_ONLY
    assert wire == _engine_fields()


def test_every_field_survives_http_to_proto_to_engine() -> None:
    parsed = request_params.parse_completion(BODY, "m").sampling
    assert (parsed.stop, parsed.n) == (("x", "yy"), 2)
    # the gateway fills the stop strings that are one token (`app._Handlers._job`)
    resolved = dataclasses.replace(parsed, stop_token_ids=(11, 12))
    request = dispatch.Job("cmpl-1", (1, 2, 3), resolved, 0.0).request("r0", 0)
    wire = pb.GenerateRequest.FromString(request.SerializeToString()).params
    sent = {f.name for f, _ in wire.ListFields()}
    assert sent == {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}  # nothing left unset

    got = convert.sampling_from_proto(wire)
    default = engine_sampling.SamplingParams()
    for name in _engine_fields():
        value = getattr(got, name)
        assert value == getattr(resolved, name), name
        assert value != getattr(default, name), f"{name}: arrived as the default"


def test_unseeded_and_no_logprobs_stay_absent() -> None:
    plain = sampling.Sampling(max_tokens=4)
    got = convert.sampling_from_proto(sampling.to_proto(plain))
    assert got.seed is None and got.logprobs is None and got.greedy


def test_unresolved_max_tokens_is_never_sent() -> None:
    with pytest.raises(ValueError):
        sampling.to_proto(sampling.Sampling(max_tokens=None))
    with pytest.raises(ValueError):
        dispatch.Job("cmpl-1", (1,), sampling.Sampling(max_tokens=None), 0.0)


def test_every_field_survives_engine_to_proto_to_engine() -> None:
    p = engine_sampling.SamplingParams(
        max_tokens=5,
        temperature=0.25,
        top_k=3,
        top_p=0.5,
        seed=9,
        stop_token_ids=(4, 8),
        ignore_eos=True,
        logprobs=2,
    )
    default = engine_sampling.SamplingParams()
    assert all(getattr(p, n) != getattr(default, n) for n in _engine_fields())
    assert convert.sampling_from_proto(convert.sampling_to_proto(p)) == p
