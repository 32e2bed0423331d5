"""The `shareEquivalent` opt-in on an agent (in process), on controlled perturbations: a
layer perturbed below the threshold-crossing noise is served from the foundation's zoo
piece (the agent's parameter bytes drop by exactly that layer), a layer perturbed strongly
keeps its own weights; the tokens served equal transformers on the composition served,
the report measures the quality against the fine-tune alone, and without the opt-in
nothing changes (tokens equal transformers on the fine-tune)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tessera import blocks
from tessera.rpc import blocks as rpc_blocks
from tessera_agent import booking, devices, equivalence, hosting, load_config, tiny_variants
from tessera_agent import variants as agent_variants
from tessera_agent.engine import block_tensors, errors, sampling
from tessera_agent.engine import config as config_mod
from tests.conftest import hf_greedy

MiB = 1 << 20
KV = 4 * MiB
SMALL, STRONG = 2, 5  # the layer perturbed a little (shared), the one perturbed a lot


@pytest.fixture(scope="module")
def finetune(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("eqft")
    ft = tiny_variants.make_tiny_finetune(tiny_llama, d / "a", layers=[SMALL], seed=3, std=0.002)
    return tiny_variants.make_tiny_finetune(ft, d / "ft", layers=[STRONG], seed=4, std=0.05)


def composed(base: Path, ft: Path, layers: list[int], out: Path) -> Path:
    """`ft` with `layers` taken from `base`: what the opted-in chain should serve."""
    shutil.copytree(ft, out)
    prefixes = tuple(f"model.layers.{i}." for i in layers)
    for file in sorted(out.glob("*.safetensors")):
        mine, theirs = load_file(str(file)), load_file(str(base / file.name))
        for name in mine:
            if name.startswith(prefixes):
                mine[name] = theirs[name]
        save_file(mine, str(file), metadata={"format": "pt"})
    return out


def _hosting() -> tuple[hosting.Hosting, devices.Device]:
    dev = devices.Device("cpu:0", "cpu", "virtual CPU device", 256 * MiB)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    return hosting.Hosting(
        "a0", booking.Booking("a0", [dev]), load_config.LoadDefaults(), pool
    ), dev


def _block(path: Path, rid: str, share: Path | None = None, **kw: object) -> blocks.Block:
    b = blocks.Block(str(path), 0, 8, replica_id=rid, kv_bytes=KV)
    if share is not None:
        b = dataclasses.replace(b, share_from=str(share), share_threshold=0.98)
    return dataclasses.replace(b, **kw)  # type: ignore[arg-type]


async def _greedy(h: hosting.Hosting, rid: str, prompt: list[int], new: int = 8) -> list[int]:
    params = sampling.SamplingParams(max_tokens=new, ignore_eos=True)
    out = []
    async for ev in h.leader(rid).generate(f"{rid}-{len(prompt)}", prompt, params):
        if ev.token is not None:
            out.append(ev.token)
    return out


def test_opt_in_shares_equivalent_layers_only(
    tiny_llama: Path, finetune: Path, tmp_path: Path, prompts: list[list[int]]
) -> None:
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    whole = block_tensors.nbytes(cfg, 0, 8, torch.float32)
    layer = block_tensors.nbytes(cfg, 3, 4, torch.float32)
    served = composed(tiny_llama, finetune, [SMALL], tmp_path / "served")

    async def run() -> None:
        h, dev = _hosting()
        await h.load(_block(tiny_llama, "base"))
        await h.load(_block(finetune, "own"))  # no opt-in: today's behaviour
        assert h.zoo.param_bytes == whole + 2 * layer
        eq = await h.load(_block(finetune, "eq", share=tiny_llama))
        # the opted-in chain adds only the strongly perturbed layer's bytes (it shares the
        # `own` chain's copy of it: the same content), not the equivalent one's
        assert h.zoo.param_bytes == whole + 2 * layer
        assert eq.hosted.stage.pieces is not None
        assert eq.hosted.stage.pieces.adopted.new_bytes == 0
        assert eq.hosted.stage.pieces.adopted.shared_bytes == whole
        rep = eq.hosted.stage.equivalence
        assert rep is not None
        by = {s.layer: s for s in rep.layers}
        assert not by[SMALL].identical and by[SMALL].shared and by[SMALL].cosine >= 0.98
        assert not by[STRONG].identical and not by[STRONG].shared and by[STRONG].cosine < 0.98
        assert all(by[i].identical and by[i].shared for i in set(range(8)) - {SMALL, STRONG})
        assert rep.equivalent_layers == (SMALL,)
        # the measured quality of the composition served vs the fine-tune alone
        assert 0.9 < rep.final_cosine <= 1.0 and 0.0 < rep.top1_agreement <= 1.0
        assert rep.calibration == equivalence.CALIBRATION and rep.calibration_tokens == 128
        # reported truthfully on the block listing (proto fields 52-53)
        held = dict(((b.replica_id, b.stage_index), (b, st)) for b, st in h.held())
        b, st = held[("eq", 0)]
        msg = agent_variants.annotate(rpc_blocks.to_proto(b), st)
        assert msg.share.threshold == pytest.approx(0.98)
        assert [x.shared for x in msg.equivalence.layers][SMALL] is True
        assert rpc_blocks.from_proto(msg) == b  # the opt-in round-trips as identity
        assert not agent_variants.annotate(
            rpc_blocks.to_proto(held[("own", 0)][0]), held[("own", 0)][1]
        ).HasField("equivalence")
        agree = total = 0
        for p in prompts[:4]:
            got = await _greedy(h, "eq", p)
            # the oracle: transformers on exactly what is served
            assert got == hf_greedy(served, p, 8)
            # everything not opted in still equals transformers on its own checkpoint
            assert await _greedy(h, "own", p) == hf_greedy(finetune, p, 8)
            assert await _greedy(h, "base", p) == hf_greedy(tiny_llama, p, 8)
            alone = hf_greedy(finetune, p, 8)
            agree += sum(a == b for a, b in zip(got, alone, strict=True))
            total += len(got)
        print(f"greedy token agreement with the fine-tune alone: {agree}/{total}")
        # one report per pair of checkpoints: a second opted-in chain reuses it
        await h.load(_block(finetune, "eq2", share=tiny_llama))
        assert h.shares.computed == 1
        await h.unload("own", 0)
        await h.unload("eq2", 0)
        # only the opted-in chain holds the strong layer now: foundation + 1 layer
        assert h.zoo.param_bytes == whole + layer
        assert dev.free_bytes == dev.capacity_bytes - whole - layer - 2 * KV
        await h.close()

    asyncio.run(run())


def test_opt_in_alone_costs_only_the_layers_below_threshold(
    tiny_llama: Path, finetune: Path
) -> None:
    """Foundation + opted-in fine-tune = foundation + the one non-equivalent layer."""
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    whole = block_tensors.nbytes(cfg, 0, 8, torch.float32)
    layer = block_tensors.nbytes(cfg, 3, 4, torch.float32)

    async def run() -> None:
        h, _ = _hosting()
        await h.load(_block(tiny_llama, "base"))
        await h.load(_block(finetune, "eq", share=tiny_llama))
        assert h.zoo.param_bytes == whole + layer
        # a stricter threshold shares nothing beyond identity: + both layers
        await h.load(
            dataclasses.replace(_block(finetune, "strict", share=tiny_llama), share_threshold=1.0)
        )
        assert h.zoo.param_bytes == whole + 2 * layer
        with pytest.raises(errors.InvalidArgumentError, match="threshold"):
            await h.load(
                dataclasses.replace(_block(finetune, "bad", share=tiny_llama), share_threshold=0)
            )
        await h.close()

    asyncio.run(run())


def test_overload_restore_serves_what_the_load_served(
    tiny_llama: Path, finetune: Path, tmp_path: Path, prompts: list[list[int]]
) -> None:
    """An opted-in chain alone drops layers [0, 4), keeping [4, 8) (its alias of the
    foundation's layer 2 has no other user), and restores them from storage: the
    foundation's layer comes back, not the fine-tune's own (tokens equal transformers on
    the composition served)."""
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera_agent import overload_shift

    served = composed(tiny_llama, finetune, [SMALL], tmp_path / "served")
    differs = [p for p in prompts if hf_greedy(served, p, 8) != hf_greedy(finetune, p, 8)]
    assert differs  # otherwise the test could not tell the two apart

    def shift(op: str, start: int, end: int) -> pb.OverloadShiftRequest:
        return pb.OverloadShiftRequest(
            replica_id="eq", stage_index=0, op=op, layer_start=start, layer_end=end
        )

    async def run() -> None:
        h, _ = _hosting()
        await h.load(_block(finetune, "eq", share=tiny_llama))
        await overload_shift.apply(h, shift("drop", 4, 8))
        assert h.get("eq", 0).stage.spec.start == 4
        await overload_shift.apply(h, shift("restore", 0, 8))
        assert await _greedy(h, "eq", differs[0]) == hf_greedy(served, differs[0], 8)
        await h.close()

    asyncio.run(run())
