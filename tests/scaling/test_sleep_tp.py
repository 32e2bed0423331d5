"""Sleep and wake of a tensor-parallel replica (issue 32): one agent process with two CPU
devices serves tp=2 over gloo (rank 0 on cpu:0, rank 1 on cpu:1). SleepReplica releases
both ranks' device memory in the agent's accounting (their slices kept in host memory,
booked there); Describe still lists both ranks; WakeReplica restores both from those
slices (no storage read), the group re-forms, and the tokens equal transformers'. A tp=2
stage with a rank on another agent is refused, and keeps serving."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_tp_agents import NEW, Start, _free, _generate, _stub, load_tp
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow


def test_tp2_replica_sleeps_on_every_rank_and_wakes(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    (a,) = agents_factory(1, devices="cpu:2x512MiB")
    empty = _free(a)
    load_tp([[a, a]], tiny_llama, [(0, 8)], "tps", devices=[["cpu:0", "cpu:1"]])
    want = hf_greedy(tiny_llama, prompts[0], NEW)
    assert _generate(a, "tps", prompts[0]) == want
    used = _free(a)
    assert all(used[d] < empty[d] for d in ("cpu:0", "cpu:1"))

    slept = _stub(a).SleepReplica(pb.SleepReplicaRequest(replica_id="tps"))
    assert slept.offloaded_bytes > 0
    assert _free(a) == empty  # both ranks' device memory released
    d = _stub(a).Describe(pb.DescribeRequest())
    assert sorted((b.tp_rank, b.device) for b in d.blocks) == [(0, "cpu:0"), (1, "cpu:1")]
    assert [k.sleeping for k in d.kv if k.replica_id == "tps"] == [True]

    woke = _stub(a).WakeReplica(pb.WakeReplicaRequest(replica_id="tps"))
    assert woke.restored_bytes > 0
    d = _stub(a).Describe(pb.DescribeRequest())
    loads = {b.tp_rank: b.load for b in d.blocks if b.replica_id == "tps"}
    assert sorted(loads) == [0, 1]
    assert all(ld.storage_bytes == 0 and ld.host_bytes > 0 for ld in loads.values()), loads
    assert _free(a) == used
    for p in prompts[:2]:  # the re-formed group serves
        assert _generate(a, "tps", p) == hf_greedy(tiny_llama, p, NEW)
    # a second round: sleep and wake again
    _stub(a).SleepReplica(pb.SleepReplicaRequest(replica_id="tps"))
    assert _free(a) == empty
    _stub(a).WakeReplica(pb.WakeReplicaRequest(replica_id="tps"))
    assert _generate(a, "tps", prompts[0]) == want


def test_tp2_with_a_rank_elsewhere_is_refused(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    a, b = agents_factory(2)
    load_tp([[a, b]], tiny_llama, [(0, 8)], "tpx")
    with pytest.raises(grpc.RpcError) as err:
        _stub(a).SleepReplica(pb.SleepReplicaRequest(replica_id="tpx"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "1 of its 2 TP ranks" in (err.value.details() or "")
    assert _generate(a, "tpx", prompts[0]) == hf_greedy(tiny_llama, prompts[0], NEW)
