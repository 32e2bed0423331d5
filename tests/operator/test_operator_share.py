"""The operator with a full fine-tune opted in to `shareEquivalent` (issue 14), against the
KMock API server, on a foundation pipelined over two agents: each agent computes the
equivalence report at load, serves the layer perturbed a little from the foundation's
zoo piece (its parameter bytes do not grow) and keeps the strongly perturbed one;
`status.variants[].equivalence` shows the per-layer cosine, shared or not, and the quality
measured; the chain's tokens equal transformers on exactly the composition served."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import tiny_variants
from tests.conftest import hf_greedy
from tests.operator.conftest import GROUP, PLURAL, VERSION, create, custom, get_sd
from tests.operator.test_operator_lifecycle import manifest, ready, refs, wait_for
from tests.variants.test_equivalence_share import composed

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
PIPE = [
    {
        "name": "r0",
        "stages": [
            {"agent": "agent-0", "device": "cpu:0", "layers": [0, 4]},
            {"agent": "agent-1", "device": "cpu:0", "layers": [4, 8]},
        ],
    }
]


def _variants(kube: client.ApiClient) -> dict[str, dict[str, Any]]:
    obj = get_sd(kube, "share") or {}
    return {v["name"]: v for v in (obj.get("status") or {}).get("variants") or []}


def _zoo(stub: pb_grpc.AgentStub) -> int:
    return int(stub.Describe(pb.DescribeRequest(), timeout=5).zoo.param_bytes)


def test_operator_shares_equivalent_layers_when_opted_in(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    tmp_path: Path,
) -> None:
    small = tiny_variants.make_tiny_finetune(tiny_llama, tmp_path / "a", layers=[2], std=0.002)
    med = tiny_variants.make_tiny_finetune(small, tmp_path / "med", layers=[5], seed=4, std=0.05)
    procs = agents_factory(2)
    stubs = [pb_grpc.AgentStub(transport.sync_channel(p.address, tls=None)) for p in procs]
    start_operator(refs(procs))
    body = manifest("share", tiny_llama, PIPE)
    body["spec"]["layout"]["kvCacheBytes"] = 8 << 20
    create(kube, body)
    wait_for("Ready", lambda: ready(kube, "share"), timeout=180)
    base_bytes = [_zoo(s) for s in stubs]

    custom(kube).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "share",
        {"spec": {"variants": [{"name": "med", "checkpoint": str(med), "shareEquivalent": True}]}},
    )
    v = wait_for(
        "med reported", lambda: _variants(kube).get("med", {}).get("equivalence"), timeout=240
    )
    wait_for("med ready", lambda: _variants(kube).get("med", {}).get("ready"), timeout=120)
    by = {row["layer"]: row for row in v["layers"]}
    assert by[2]["shared"] and not by[2]["identical"] and by[2]["cosine"] >= 0.98
    assert not by[5]["shared"] and by[5]["cosine"] < 0.98
    assert all(by[i]["identical"] for i in (0, 1, 3, 4, 6, 7))
    assert v["threshold"] == 0.98 and v["calibrationTokens"] == 128
    assert 0.0 < v["top1Agreement"] <= 1.0
    msg = _variants(kube)["med"]["message"]
    assert "equivalent layers shared [2], own [5]" in msg and "top-1 agreement" in msg
    # agent-0 (layers 0-3) adds nothing: layer 2 is the foundation's piece; agent-1 adds
    # exactly layer 5 (a decoder layer's bytes: the chain's stage-1 block minus shared)
    med_rid = "default.share.r0-med.g1"
    assert _zoo(stubs[0]) == base_bytes[0]
    (tail,) = [
        b
        for b in stubs[1].ListBlocks(pb.ListBlocksRequest(), timeout=5).blocks
        if b.replica_id == med_rid
    ]
    assert _zoo(stubs[1]) == base_bytes[1] + tail.param_bytes - tail.shared_param_bytes
    assert 0 < tail.param_bytes - tail.shared_param_bytes < tail.param_bytes // 4
    assert tail.HasField("share") and tail.equivalence.layers[5].shared is False
    served = composed(tiny_llama, med, [2], tmp_path / "served")
    prompt = [0, 44, 45, 46]
    assert local_agents.generate_tokens(stubs[0], med_rid, prompt, 8) == hf_greedy(
        served, prompt, 8
    )
    base = "default.share.r0.g1"
    assert local_agents.generate_tokens(stubs[0], base, prompt, 8) == hf_greedy(
        tiny_llama, prompt, 8
    )
    # steady: the chains priced by their own layers (planner) are not drift, nothing reloads
    wait_for("steady", lambda: ready(kube, "share", generation=2), timeout=120)
    again = list(stubs[1].ListBlocks(pb.ListBlocksRequest(), timeout=5).blocks)
    assert [(b.replica_id, b.param_bytes) for b in again if b.replica_id == med_rid] == [
        (med_rid, tail.param_bytes)
    ]
    assert _zoo(stubs[1]) == base_bytes[1] + tail.param_bytes - tail.shared_param_bytes
