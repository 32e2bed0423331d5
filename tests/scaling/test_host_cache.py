"""The host block cache: bounded LRU by content, booked; reloads and variants take from it.

Unit tests of `host_cache.HostCache`, then `hosting.Hosting` in process on the tiny
checkpoint: an unloaded block's pieces stay in host memory, a reload takes every piece
from there (no storage read) and serves transformers' greedy tokens, a copy of the
checkpoint under another path (a variant whose digests are declared) takes them too,
and `offload`/`restore` (the agent side of sleep and wake) go through the cache.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
from pathlib import Path

import pytest
import torch

from tessera import blocks
from tessera_agent import booking, devices, host_cache, hosting, load_config, sleep
from tessera_agent.engine import sampling
from tests.conftest import hf_greedy

MiB = 1 << 20


def _t(n: int, v: float = 1.0) -> torch.Tensor:
    return torch.full((n,), v, dtype=torch.float32)  # 4n bytes


def test_lru_within_the_budget_and_booked() -> None:
    memory = booking.Booking("a", [])
    c = host_cache.HostCache(1000, memory)
    assert c.put("m", "layer.0", "float32", "d0", {"model.layers.0.w": _t(100)})  # 400 B
    assert c.put("m", "layer.1", "float32", "d1", {"model.layers.1.w": _t(100)})
    assert memory.host_bytes == 800
    got, found = c.take("m", ["layer.0"], "float32", torch.device("cpu"))  # 0 is now newest
    assert found == {"layer.0": "d0"} and list(got) == ["model.layers.0.w"]
    assert c.put("m", "layer.2", "float32", "d2", {"model.layers.2.w": _t(100)})  # evicts 1
    assert {x.piece for x in c.contents()} == {"layer.0", "layer.2"}
    assert memory.host_bytes == 800 and c.stats().evicted == 1
    assert not c.put("m", "big", "float32", "dx", {"x": _t(300)})  # 1200 B > the budget
    _, found = c.take("m", ["layer.1", "layer.2"], "float32", torch.device("cpu"))
    st = c.stats()
    assert found == {"layer.2": "d2"} and (st.hits, st.misses) == (2, 1)


def test_same_content_at_another_layer_index_and_path() -> None:
    c = host_cache.HostCache(1 << 20)
    c.put("m", "layer.3", "float32", "same", {"model.layers.3.mlp.w": _t(4, 7.0)})
    c.index_digests("variant", "float32", {"layer.5": "same"})
    got, found = c.take("variant", ["layer.5", "layer.6"], "float32", torch.device("cpu"))
    assert found == {"layer.5": "same"}
    assert torch.equal(got["model.layers.5.mlp.w"], _t(4, 7.0))
    assert c.take("m", ["layer.3"], "bfloat16", torch.device("cpu"))[1] == {}  # other dtype


def _hosting(cache_bytes: int, zoo: bool = True) -> hosting.Hosting:
    dev = devices.Device("cpu:0", "cpu", "virtual CPU device", 256 * MiB)
    defaults = load_config.LoadDefaults(block_zoo=zoo, host_cache_bytes=cache_bytes)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return hosting.Hosting("a0", booking.Booking("a0", [dev]), defaults, pool)


def _block(path: Path, replica: str) -> blocks.Block:
    return blocks.Block(str(path), 0, 8, replica_id=replica, kv_bytes=8 * MiB)


async def _greedy(h: hosting.Hosting, replica: str) -> list[int]:
    params = sampling.SamplingParams(max_tokens=5, ignore_eos=True)
    out = []
    async for ev in h.leader(replica).generate(f"{replica}-req", [3, 1, 4, 1], params):
        if ev.token is not None:
            out.append(ev.token)
    return out


@pytest.mark.parametrize("zoo", [True, False])
def test_reload_takes_every_piece_from_the_cache(tiny_llama: Path, zoo: bool) -> None:
    async def run() -> None:
        h = _hosting(64 * MiB, zoo)
        first = await h.load(_block(tiny_llama, "r0"))
        src = first.hosted.sources
        assert src.storage > 0 and src.host == 0 and src.seconds > 0
        await h.unload("r0", 0)
        stats = h.host_cache.stats()
        assert stats.pieces == 10 and stats.used_bytes == h.memory.host_bytes > 0
        again = await h.load(_block(tiny_llama, "r1"))
        got = again.hosted.sources
        assert got.storage == 0 and got.peer == 0 and got.host == src.storage
        assert h.host_cache.stats().hits == 10
        assert await _greedy(h, "r1") == hf_greedy(tiny_llama, [3, 1, 4, 1], 5)
        await h.close()

    asyncio.run(run())


def test_variant_with_declared_digests_and_offload_restore(
    tiny_llama: Path, tmp_path: Path
) -> None:
    async def run() -> None:
        h = _hosting(64 * MiB)
        await h.load(_block(tiny_llama, "r0"))
        specs = await sleep.offload(h, "r0")  # sleep: blocks to the cache, KV pool released
        assert [b.replica_id for b in specs] == ["r0"] and not h.hosted
        dev = h.memory.devices["cpu:0"]
        assert dev.free_bytes == dev.capacity_bytes
        woke = await sleep.restore(h, specs)  # wake: every piece from the cache
        assert woke[0].hosted.sources.host > 0 and woke[0].hosted.sources.storage == 0
        await h.unload("r0", 0)
        variant = tmp_path / "variant"
        shutil.copytree(tiny_llama, variant)
        digests = {c.piece: c.digest for c in h.host_cache.contents()}
        h.host_cache.index_digests(str(variant), "float32", digests)
        v = await h.load(_block(variant, "v0"))
        assert v.hosted.sources.storage == 0 and v.hosted.sources.host > 0
        assert await _greedy(h, "v0") == hf_greedy(tiny_llama, [3, 1, 4, 1], 5)
        await h.close()

    asyncio.run(run())


def test_no_cache_keeps_nothing(tiny_llama: Path) -> None:
    async def run() -> None:
        h = _hosting(0)
        await h.load(_block(tiny_llama, "r0"))
        await h.unload("r0", 0)
        assert h.host_cache.stats().pieces == 0 and h.memory.host_bytes == 0
        assert (await h.load(_block(tiny_llama, "r1"))).hosted.sources.host == 0
        await h.close()

    asyncio.run(run())


def test_host_copy_keeps_cpu_tensors_and_pins_cuda_ones() -> None:
    t = torch.arange(6, dtype=torch.float32)
    assert devices.host_copy("cpu")(t).data_ptr() == t.data_ptr()  # no copy on a CPU agent
    if torch.cuda.is_available():  # the GPU branch: page-locked host memory
        pinned = devices.host_copy("cuda")(t.cuda())
        assert pinned.is_pinned() and torch.equal(pinned, t)
