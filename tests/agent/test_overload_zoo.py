"""An overload drop on a block whose parameters live in the agent's block zoo (issues 13 x
14): a drop of pieces another chain shares is refused with the reason (it would free no
memory); a drop of unshared pieces releases them from the zoo, and the agent's booking
stays within the device: parameters freed = KV pool grown; a restore books the layers it
brought back. Tokens equal transformers after each shift."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest

from tessera import blocks
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import booking, devices, hosting, load_config, overload_shift, tiny_variants
from tessera_agent.engine import errors, sampling
from tests.conftest import hf_greedy

MiB = 1 << 20


@pytest.fixture(scope="module")
def finetune(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_variants.make_tiny_finetune(
        tiny_llama, tmp_path_factory.mktemp("ftz") / "ft", layers=(2,), seed=3, std=0.05
    )


def _shift(op: str, replica: str, start: int, end: int) -> pb.OverloadShiftRequest:
    return pb.OverloadShiftRequest(
        replica_id=replica, stage_index=0, op=op, layer_start=start, layer_end=end
    )


async def _greedy(h: hosting.Hosting, replica: str, prompt: list[int]) -> list[int]:
    params = sampling.SamplingParams(max_tokens=6, ignore_eos=True)
    out = []
    async for ev in h.leader(replica).generate(f"{replica}-x", prompt, params):
        if ev.token is not None:
            out.append(ev.token)
    return out


def test_a_drop_releases_zoo_pieces_and_keeps_the_booking_within_the_device(
    tiny_llama: Path, finetune: Path, prompts: list[list[int]]
) -> None:
    async def run() -> None:
        dev = devices.Device("cpu:0", "cpu", "virtual CPU device", 256 * MiB)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        h = hosting.Hosting("a0", booking.Booking("a0", [dev]), load_config.LoadDefaults(), pool)
        await h.load(blocks.Block(str(tiny_llama), 0, 8, replica_id="base", kv_bytes=4 * MiB))
        await h.load(blocks.Block(str(finetune), 0, 8, replica_id="ft", kv_bytes=4 * MiB))
        with pytest.raises(errors.FailedPreconditionError, match="block zoo"):
            await overload_shift.apply(h, _shift("drop", "base", 0, 8 - 4))
        await h.unload("ft", 0)
        used = dev.capacity_bytes - dev.free_bytes
        zoo_before = h.zoo.param_bytes
        await overload_shift.apply(h, _shift("drop", "base", 0, 4))
        assert h.zoo.param_bytes < zoo_before  # the dropped layers left the zoo
        # freed parameters = grown KV, up to the norm weights the KV sizing leaves out
        assert used - 64 * 1024 <= dev.capacity_bytes - dev.free_bytes <= used
        await overload_shift.apply(h, _shift("restore", "base", 0, 8))
        assert used - 64 * 1024 <= dev.capacity_bytes - dev.free_bytes <= used  # booked again
        assert await _greedy(h, "base", prompts[0]) == hf_greedy(tiny_llama, prompts[0], 6)
        await h.unload("base", 0)
        assert dev.free_bytes == dev.capacity_bytes and h.zoo.param_bytes == 0
        await h.close()

    asyncio.run(run())
