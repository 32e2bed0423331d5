"""The data plane's pieces in one process: groups formed on demand on one store, many at
once, a block pushed through a 2-rank group, and a group that cannot form failing fast."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Iterator

import pytest
import torch

from tessera_agent.transfer import block_copy, group, store


@pytest.fixture(scope="module")
def store_address() -> Iterator[str]:
    server = store.serve()  # lives as long as this fixture
    yield f"127.0.0.1:{server.port}"
    del server


def _spec(address: str, name: str, rank: int, size: int = 2, t: float = 10.0) -> group.GroupSpec:
    return group.GroupSpec(address, name, rank, size, "gloo", t, form_timeout_s=max(t, 60.0))


def test_groups_form_and_close_on_demand(store_address: str) -> None:
    """Two groups at once on one store, closed, then formed again under the same names:
    no global init_process_group, nothing restarted, no stale rendezvous keys read."""
    pool = concurrent.futures.ThreadPoolExecutor(4)
    names = [f"g-{uuid.uuid4().hex}" for _ in range(2)]
    for _ in range(2):  # the second time under the same names: closing forgot the keys
        futs = [
            pool.submit(group.form, _spec(store_address, n, r), torch.device("cpu"))
            for n in names
            for r in (0, 1)
        ]
        groups = [f.result(timeout=60) for f in futs]
        sums = [pool.submit(g.all_reduce, torch.full((3,), float(g.rank + 1))) for g in groups]
        for s in sums:
            assert s.result(timeout=60).tolist() == [3.0, 3.0, 3.0]
        for g in groups:
            g.close()
        with pytest.raises(group.GroupError, match="closed"):
            groups[0].all_reduce(torch.ones(1))
    pool.shutdown()


def test_push_tensors_through_a_group(store_address: str) -> None:
    name = f"copy-{uuid.uuid4().hex}"
    tensors = [("a", torch.randn(4, 5)), ("b", torch.arange(7, dtype=torch.float16))]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        got = pool.submit(block_copy._receive, _spec(store_address, name, 1), torch.device("cpu"))
        sent = block_copy.push(tensors, _spec(store_address, name, 0))
        out = got.result(timeout=60)
    assert sent == 4 * 5 * 4 + 7 * 2
    assert set(out) == {"a", "b"}
    assert torch.equal(out["a"], tensors[0][1]) and torch.equal(out["b"], tensors[1][1])
    assert out["b"].dtype == torch.float16


def test_a_rank_that_never_comes_fails_the_formation_in_time(store_address: str) -> None:
    t = time.monotonic()
    with pytest.raises(group.GroupError, match="could not join"):
        group.form(
            group.GroupSpec(store_address, f"lonely-{uuid.uuid4().hex}", 0, 2, "gloo", 2.0, 2.0),
            torch.device("cpu"),
        )
    assert time.monotonic() - t < 30


def test_backend_choice() -> None:
    assert group.choose(["cuda", "cuda"]) == "nccl"
    assert group.choose(["cuda", "cpu"]) == "gloo"
    assert group.choose(["cpu"]) == "gloo"


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs 2 CUDA devices for two NCCL ranks (none on this machine)",
)
def test_nccl_all_reduce(store_address: str) -> None:  # pragma: no cover - no GPU in CI
    name = f"nccl-{uuid.uuid4().hex}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = [
            pool.submit(
                group.form,
                group.GroupSpec(store_address, name, r, 2, "nccl", 30.0),
                torch.device(f"cuda:{r}"),
            )
            for r in (0, 1)
        ]
        groups = [f.result(timeout=120) for f in futs]
        outs = [pool.submit(g.all_reduce, torch.ones(2, device=g.device)) for g in groups]
        assert [o.result(timeout=60).tolist() for o in outs] == [[2.0, 2.0], [2.0, 2.0]]


def test_an_operation_that_fails_when_posted_fails_the_group() -> None:
    """A peer that restarted closes the socket: gloo raises when the send is posted, not
    while waiting. The group must still be marked failed, so a stage link stops being
    `ready` and the gRPC stream carries the activations (found by `bench chaos`)."""
    g = group.Group.__new__(group.Group)
    g.spec = group.GroupSpec("127.0.0.1:1", "t", 0, 2)
    g.failed = None

    def post() -> object:
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(group.GroupError, match="failed in send"):
        g._run("send", post)  # type: ignore[arg-type]
    assert g.failed is not None and "Connection closed by peer" in g.failed
