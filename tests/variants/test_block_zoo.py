"""The block zoo on an agent (in process): identical pieces are held once and shared by
every chain; a full fine-tune differing in k layers adds exactly those k layers' bytes;
its tokens through shared blocks equal transformers on the fine-tune; pieces are freed
with their last user, and LoRA adapters on one chain never leak into another."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest

from tessera import blocks
from tessera_agent import booking, devices, hosting, load_config, tiny_variants, variants
from tessera_agent.engine import block_tensors, sampling
from tessera_agent.engine import config as config_mod
from tests.conftest import hf_greedy

MiB = 1 << 20
KV = 4 * MiB
DIFF = (2, 5)  # layers the full fine-tune changes


@pytest.fixture(scope="module")
def finetune(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_variants.make_tiny_finetune(
        tiny_llama, tmp_path_factory.mktemp("ft") / "ft", layers=DIFF, seed=7, std=0.05
    )


def _hosting() -> tuple[hosting.Hosting, devices.Device]:
    dev = devices.Device("cpu:0", "cpu", "virtual CPU device", 256 * MiB)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return hosting.Hosting(
        "a0", booking.Booking("a0", [dev]), load_config.LoadDefaults(), pool
    ), dev


def _block(
    path: Path, replica: str, start: int = 0, end: int = 8, idx: int = 0, n: int = 1
) -> blocks.Block:
    nxt = "127.0.0.1:1" if end < 8 else ""  # not connected: the test runs no steps on it
    return blocks.Block(
        str(path),
        start,
        end,
        replica_id=replica,
        stage_index=idx,
        num_stages=n,
        kv_bytes=KV,
        next_address=nxt,
    )


async def _greedy(h: hosting.Hosting, replica: str, prompt: list[int], new: int = 8) -> list[int]:
    params = sampling.SamplingParams(max_tokens=new, ignore_eos=True)
    out = []
    async for ev in h.leader(replica).generate(f"{replica}-{len(prompt)}", prompt, params):
        if ev.token is not None:
            out.append(ev.token)
    return out


def test_full_finetune_adds_only_its_own_layers(
    tiny_llama: Path, finetune: Path, prompts: list[list[int]]
) -> None:
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    whole = block_tensors.nbytes(cfg, 0, 8, _f32())
    layer = block_tensors.nbytes(cfg, 3, 4, _f32())  # one decoder layer (middle: no ends)

    async def run() -> None:
        h, dev = _hosting()
        await h.load(_block(tiny_llama, "base"))
        assert h.zoo.param_bytes == whole
        assert dev.free_bytes == dev.capacity_bytes - whole - KV
        ft = await h.load(_block(finetune, "ft"))
        # foundation + fine-tune differing in k layers = foundation + k layers
        assert h.zoo.param_bytes == whole + len(DIFF) * layer
        assert dev.free_bytes == dev.capacity_bytes - whole - len(DIFF) * layer - 2 * KV
        assert ft.hosted.stage.pieces is not None
        assert ft.hosted.stage.pieces.adopted.shared_bytes == whole - len(DIFF) * layer
        # the foundation and the fine-tune each hold k pieces of their own
        assert h.zoo.shared() == h.zoo.num_pieces - 2 * len(DIFF)
        # tokens through shared blocks equal transformers on each checkpoint alone
        for p in prompts[:3]:
            assert await _greedy(h, "ft", p) == hf_greedy(finetune, p, 8)
            assert await _greedy(h, "base", p) == hf_greedy(tiny_llama, p, 8)
        assert hf_greedy(finetune, prompts[0], 8) != hf_greedy(tiny_llama, prompts[0], 8)
        # the fine-tune's own pieces go with it; the shared ones stay for the foundation
        await h.unload("ft", 0)
        assert h.zoo.param_bytes == whole and h.zoo.shared() == 0
        assert dev.free_bytes == dev.capacity_bytes - whole - KV
        assert await _greedy(h, "base", prompts[0]) == hf_greedy(tiny_llama, prompts[0], 8)
        await h.unload("base", 0)
        assert h.zoo.param_bytes == 0 and dev.free_bytes == dev.capacity_bytes
        await h.close()

    asyncio.run(run())


def test_pipelined_chains_share_per_stage(tiny_llama: Path, finetune: Path) -> None:
    """A 2-stage fine-tune chain beside a whole foundation: each stage shares its range."""
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    whole = block_tensors.nbytes(cfg, 0, 8, _f32())
    layer = block_tensors.nbytes(cfg, 3, 4, _f32())

    async def run() -> None:
        h, _ = _hosting()
        await h.load(_block(tiny_llama, "base"))
        await h.load(_block(finetune, "ft2", 0, 4, 0, 2))
        await h.load(_block(finetune, "ft2", 4, 8, 1, 2))
        # a pipelined last stage holds a tied head apart from the embedding (its final
        # piece is norm + head), which the whole foundation's final piece (norm) is not
        tail = block_tensors.nbytes(cfg, 7, 8, _f32()) - layer if cfg.tie_embeddings else 0
        assert h.zoo.param_bytes == whole + len(DIFF) * layer + tail
        await h.close()

    asyncio.run(run())


def test_lora_on_one_chain_does_not_leak_into_a_sharing_chain(
    tiny_llama: Path, tmp_path: Path, prompts: list[list[int]]
) -> None:
    adapter = tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "a", r=4, seed=3)

    async def run() -> None:
        h, _ = _hosting()
        await h.load(_block(tiny_llama, "r0"))
        await h.load(_block(tiny_llama, "r1"))  # same content: every piece shared
        assert h.zoo.shared() == h.zoo.num_pieces
        pool = concurrent.futures.ThreadPoolExecutor(1)
        await variants.set_adapters(h.get("r0", 0), [("a", str(adapter))], pool, h.compute)
        assert await _greedy(h, "r1", prompts[0]) == hf_greedy(tiny_llama, prompts[0], 8)
        await h.close()
        pool.shutdown()

    asyncio.run(run())


def _f32():  # type: ignore[no-untyped-def]
    import torch

    return torch.float32
