"""A block copied from another block takes its pieces' digests from the holder (issue 32).

In process, on the tiny checkpoint: replica r1 is assembled from r0's block on the same
agent (a `local` part of a switch plan); the zoo's digests are not computed again (the
hash function is made to fail), r1's pieces are r0's, and `digests_of` is what
`Describe` reports (`BlockInfo.piece_digests`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import load_sources
from tessera_agent.engine import block_zoo
from tests.scaling.test_host_cache import _block, _hosting


def test_local_copy_reuses_the_holders_digests(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def run() -> None:
        h = _hosting(0, zoo=True)
        r0 = await h.load(_block(tiny_llama, "r0"))
        want = load_sources.digests_of(r0.hosted.stage)
        assert len(want) == 10

        def no_hashing(*_: object) -> str:
            raise AssertionError("a copied piece was hashed again")

        monkeypatch.setattr(block_zoo, "digest", no_hashing)
        part = pb.SwitchSource(
            source=pb.BlockSource(
                address="self", replica_id="r0", stage_index=0, transport="local"
            ),
            unit_start=0,
            unit_end=10,
        )
        r1 = await h.load(_block(tiny_llama, "r1"), parts=[part])
        assert load_sources.digests_of(r1.hosted.stage) == want
        assert r1.hosted.sources.peer > 0 and r1.hosted.sources.storage == 0
        assert h.zoo.shared() == 10  # every piece is r0's, held once
        await h.close()

    asyncio.run(run())
