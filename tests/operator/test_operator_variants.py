"""The operator serves variants (issue 14), against the KMock API server: a LoRA adapter
declared in `spec.variants` is attached to the foundation's stages and published in the
gateway routes; a spec edit removes it and adds a full fine-tune (its own chain, sharing
every identical block) and an adapter that does not fit, without reloading the
foundation; `status.variants` says where each is loaded, whether it is ready, and why not."""

from __future__ import annotations

import json
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

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
ONE = [{"name": "r0", "stages": [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]}]
BASE = "default.var.r0.g1"


def _variants(kube: client.ApiClient) -> dict[str, dict[str, Any]]:
    obj = get_sd(kube, "var") or {}
    return {v["name"]: v for v in (obj.get("status") or {}).get("variants") or []}


def _routes(kube: client.ApiClient) -> dict[str, Any]:
    cm = client.CoreV1Api(kube).read_namespaced_config_map("var-gateway-routes", "default")
    doc: dict[str, Any] = json.loads(cm.data["routes.json"])
    return doc


def test_operator_adds_and_removes_variants(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    tmp_path: Path,
) -> None:
    legal = tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "legal", r=4, seed=31)
    med = tiny_variants.make_tiny_finetune(tiny_llama, tmp_path / "med", layers=(2,), seed=32)
    bad = tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "bad", r=4, seed=33)
    cfg = bad / "adapter_config.json"
    cfg.write_text(cfg.read_text().replace('"use_dora": false', '"use_dora": true'))
    procs = agents_factory(1)
    stub = pb_grpc.AgentStub(transport.sync_channel(procs[0].address, tls=None))
    start_operator(refs(procs))
    body = manifest("var", tiny_llama, ONE)
    body["spec"]["layout"]["kvCacheBytes"] = 8 << 20
    body["spec"]["variants"] = [{"name": "legal", "adapter": str(legal)}]
    create(kube, body)
    wait_for("Ready", lambda: ready(kube, "var"), timeout=180)
    v = wait_for("legal ready", lambda: _variants(kube).get("legal", {}).get("ready"))
    v = _variants(kube)["legal"]
    assert v["kind"] == "lora" and v["loadedOn"] == [f"agent-0/{BASE}/0"]
    assert wait_for("routes", lambda: _routes(kube).get("variants")) == [
        {"name": "legal", "kind": "lora"}
    ]
    (held,) = stub.ListBlocks(pb.ListBlocksRequest(), timeout=5).blocks
    assert held.replica_id == BASE and list(held.variants) == ["legal"]

    custom(kube).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "var",
        {
            "spec": {
                "variants": [
                    {"name": "med", "checkpoint": str(med)},
                    {"name": "bad", "adapter": str(bad)},
                ]
            }
        },
    )
    wait_for("med ready", lambda: _variants(kube).get("med", {}).get("ready"), timeout=180)
    st = wait_for("bad reported", lambda: _variants(kube).get("bad", {}).get("message"))
    got = _variants(kube)
    assert "legal" not in got
    assert got["bad"]["ready"] is False and got["bad"]["reason"] == "InvalidAdapter"
    assert "use_dora" in st
    med_rid = "default.var.r0-med.g1"
    assert got["med"]["loadedOn"] == [med_rid]
    routes = _routes(kube)
    assert routes["variants"] == [{"name": "med", "kind": "full", "replicas": [med_rid]}]
    assert [r["id"] for r in routes["replicas"]] == [BASE, med_rid]
    by_id = {b.replica_id: b for b in stub.ListBlocks(pb.ListBlocksRequest(), timeout=5).blocks}
    assert set(by_id) == {BASE, med_rid}  # the foundation kept its block (same id)
    assert list(by_id[BASE].variants) == []  # legal removed, bad never attached
    assert by_id[med_rid].shared_param_bytes > 0.8 * by_id[med_rid].param_bytes
    prompt = [0, 44, 45, 46]
    assert local_agents.generate_tokens(stub, med_rid, prompt, 8) == hf_greedy(med, prompt, 8)
    assert local_agents.generate_tokens(stub, BASE, prompt, 8) == hf_greedy(tiny_llama, prompt, 8)
