"""A loaded block's weights by checkpoint name, and blocks built from copied tensors.

Every checkpoint tensor read back from a loaded (fused) block equals the file's; shapes
and bytes derived from config.json alone equal the checkpoint's; a block assembled from
another block's tensors (a sub-range, through the chunked wire format) generates the same
greedy tokens as `transformers`; a short or misshapen copy is refused by name.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tessera_agent import tensor_transfer
from tessera_agent.engine import block_tensors, config, errors, loader, sampling, stage
from tests.conftest import hf_greedy
from tests.engine import helpers


def _file_tensors(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, file in loader.weight_map(path).items():
        with safe_open(str(file), framework="pt") as f:
            out[name] = f.get_tensor(name)
    return out


@pytest.mark.parametrize("ckpt", ["tiny_llama", "tiny_qwen2", "tiny_llama3_sharded"])
def test_every_checkpoint_tensor_reads_back_from_the_fused_block(
    ckpt: str, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(ckpt)
    files = _file_tensors(path)
    cfg = config.ModelConfig.from_path(path)
    (whole,) = helpers.load(path, [(0, cfg.num_layers)])
    names = whole.tensor_names()
    assert names == list(block_tensors.shapes(cfg, 0, cfg.num_layers))
    for name in names:
        got = whole.tensor(name)
        assert torch.equal(got, files[name]), name
        assert tuple(got.shape) == block_tensors.shapes(cfg, 0, cfg.num_layers)[name]
    for a, b in [(0, 1), (1, cfg.num_layers), (0, cfg.num_layers)]:
        assert block_tensors.nbytes(cfg, a, b, torch.float32) == loader.block_bytes(
            path, cfg, a, b, torch.float32
        )


def test_a_block_holds_only_its_range(tiny_llama: Path) -> None:
    (mid,) = helpers.load(tiny_llama, [(2, 5)])
    assert torch.equal(
        mid.tensor("model.layers.4.mlp.up_proj.weight"),
        _file_tensors(tiny_llama)["model.layers.4.mlp.up_proj.weight"],
    )
    for name in ("model.layers.5.mlp.up_proj.weight", "model.embed_tokens.weight", "bogus"):
        with pytest.raises(errors.NotFoundError, match=r"tensor not held: .*layers \[2, 5\)"):
            mid.tensor(name)


def _copied(src: stage.Stage, spec: stage.BlockSpec, chunk_bytes: int) -> stage.Stage:
    """Build `spec` from `src`'s tensors, sent through the wire format in small chunks."""
    names = loader.checkpoint_names(src.cfg, spec.start, spec.end)
    received = tensor_transfer.Assembler()
    for ch in tensor_transfer.chunks(tensor_transfer.held(src, names), chunk_bytes):
        received.add(ch)
    return stage.load_stage(spec, torch.device("cpu"), 1 << 30, tensors=received.result())


def test_blocks_built_from_copied_tensors_match_hf(
    tiny_llama: Path, prompts: list[list[int]], tmp_path: Path
) -> None:
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    shutil.copy(tiny_llama / "config.json", only_config / "config.json")
    (whole,) = helpers.load(tiny_llama, [(0, 8)])
    # a 2-stage pipeline whose stages are copies of sub-ranges, with no weights on disk
    first = _copied(whole, stage.BlockSpec(str(only_config), 0, 3, kv_bytes=16 << 20), 1000)
    second = _copied(
        whole, stage.BlockSpec(str(only_config), 3, 8, stage_index=1, kv_bytes=16 << 20), 4096
    )
    params = sampling.SamplingParams(max_tokens=8, ignore_eos=True)
    out, _ = asyncio.run(helpers.generate_many([first, second], prompts[:4], params))
    assert out == [hf_greedy(tiny_llama, p, 8) for p in prompts[:4]]


def test_a_short_or_misshapen_copy_is_refused(tiny_llama: Path, tmp_path: Path) -> None:
    (whole,) = helpers.load(tiny_llama, [(0, 8)])
    spec = stage.BlockSpec(str(tiny_llama), 6, 8, stage_index=1, kv_bytes=1 << 20)
    names = loader.checkpoint_names(whole.cfg, 6, 8)
    tensors = {n: whole.tensor(n).clone() for n in names}
    del tensors["model.norm.weight"]
    with pytest.raises(errors.FailedPreconditionError, match=r"missing from the copy: model\.norm"):
        stage.load_stage(spec, torch.device("cpu"), 1 << 30, tensors=tensors)
    tensors["model.norm.weight"] = torch.ones(3)
    with pytest.raises(errors.FailedPreconditionError, match=r"model.norm.weight has shape \(3,\)"):
        stage.load_stage(spec, torch.device("cpu"), 1 << 30, tensors=tensors)
    # out-of-order chunks are refused rather than assembled into garbage
    chunks = list(tensor_transfer.chunks([("x", torch.arange(1000.0))], 1000))
    received = tensor_transfer.Assembler()
    received.add(chunks[0])
    with pytest.raises(errors.FailedPreconditionError, match="out of order"):
        received.add(chunks[2])
    with pytest.raises(errors.InvalidArgumentError, match="chunk_bytes"):
        list(tensor_transfer.chunks([("x", torch.zeros(2))], -1))
