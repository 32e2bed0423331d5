"""Module-level scaling across two agent processes: replicate, evict, migrate mid-decode.

Agent a serves a whole-model replica; agent b is idle. While requests decode, layers
[2, 6) are replicated onto b (weights copied from a), more requests join (some land on
b's copy and keep their K/V there), the replica is evicted (its requests' K/V come back
to a), then a's own copy migrates to b (a's weights for the run are released) and is
replicated back onto a second device of a. Every request gets transformers' tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tessera.cli import local_agents, scaling_status
from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_agent_rpc import _code, _stub, generate, load_replica
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
NEW = 24
LONG = 160


def _wait(cond: Callable[[], bool], timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)


def test_replicate_evict_migrate_mid_decode_match_hf(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    a, b = agents_factory(2, devices="cpu:2x512MiB")
    load_replica([a], tiny_llama, [(0, 8)])
    sa, sb = _stub(a), _stub(b)
    out: dict[int, list[int]] = {}
    new = {0: LONG, 1: LONG}  # two long requests stay in flight through every operation

    def start(i: int) -> threading.Thread:
        def go() -> None:
            out[i] = generate(a, prompts[i], max_tokens=new.get(i, NEW))[0]

        t = threading.Thread(target=go)
        t.start()
        return t

    def op(kind: str, **kw: object) -> pb.ScalingOpReply:
        req = pb.ScalingOpRequest(replica_id="r0", stage_index=0, layer_start=2, layer_end=6, **kw)
        reply: pb.ScalingOpReply = getattr(sa, f"Scaling{kind}")(req)
        return reply

    def placed(holder: str) -> int:
        runs = sa.Describe(pb.DescribeRequest()).scaling_runs
        return sum(h.placed for r in runs for h in r.holders if h.name == holder)

    threads = [start(0), start(1)]
    _wait(lambda: sum(k.running for k in sa.Describe(pb.DescribeRequest()).kv) >= 2)
    rep = op("Replicate", target_address=b.address, self_address=a.address)
    assert rep.target.startswith(b.agent_id) and rep.param_bytes > 0
    threads += [start(i) for i in range(2, 5)]
    _wait(lambda: placed(rep.target) >= 1)  # requests joined b's copy of the run
    assert len(sb.Describe(pb.DescribeRequest()).scaling_hosted) == 1

    ev = op("Evict", holder=rep.target)  # b's requests and their K/V come back to a
    assert ev.target.startswith(a.agent_id)
    _wait(lambda: not sb.Describe(pb.DescribeRequest()).scaling_hosted)
    mig = op("Migrate", target_address=b.address, self_address=a.address)
    assert mig.source.startswith(a.agent_id) and mig.target.startswith(b.agent_id)
    assert mig.requests >= 2 and mig.kv_bytes > 0  # the long requests' K/V moved to b
    back = op("Replicate", target_device="cpu:1")  # a second device of a (checkpoint)
    assert back.target == f"{a.agent_id}/cpu:1"
    threads += [start(i) for i in range(5, 8)]
    for t in threads:
        t.join(timeout=300)
    want = [hf_greedy(tiny_llama, p, new.get(i, NEW)) for i, p in enumerate(prompts)]
    assert [out.get(i) for i in range(8)] == want
    (run,) = sa.Describe(pb.DescribeRequest()).scaling_runs
    assert run.origin == "migrated"
    assert {h.name for h in run.holders} == {mig.target, back.target}
    assert placed(back.target) >= 1
    # `tessera status` lists both holders of the run and says the home migrated
    table = scaling_status.rows([(a.agent_id, a.address), (b.agent_id, b.address)], tls=None)
    assert {(r[2], r[3]) for r in table} == {("[2, 6)", mig.target), ("[2, 6)", back.target)}
    assert any(r[4].startswith("home (migrated from") for r in table)
    # bad requests are refused with the cause
    code, msg = _code(lambda: op("Evict", holder="nobody/cpu:0"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "holders" in msg
    code, msg = _code(
        lambda: sa.ScalingReplicate(
            pb.ScalingOpRequest(replica_id="r0", layer_start=6, layer_end=9)
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not within" in msg

    # Algorithm 2's batch cut: the cap shows in Describe, 0 restores, bad values are refused
    def cut(replica: str, n: int) -> pb.ScalingBatchLimitReply:
        req = pb.ScalingBatchLimitRequest(replica_id=replica, max_num_seqs=n)
        reply: pb.ScalingBatchLimitReply = sa.ScalingBatchLimit(req)
        return reply

    c = cut("r0", 3)
    assert c.max_num_seqs == 3 and c.previous == c.loaded > 3
    assert [k.max_num_seqs for k in sa.Describe(pb.DescribeRequest()).kv] == [3]
    assert cut("r0", 0).max_num_seqs == c.loaded
    code, msg = _code(lambda: cut("r0", -1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_num_seqs" in msg
    code, _ = _code(lambda: cut("nope", 2))
    assert code == grpc.StatusCode.NOT_FOUND
