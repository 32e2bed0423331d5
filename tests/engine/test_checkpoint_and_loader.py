"""Tiny checkpoints (deterministic, loadable by transformers offline) and range loading."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tessera.cli import main as cli
from tessera_agent.engine import config, errors, loader, stage


def _digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_make_tiny_cli_deterministic_and_hf_loadable(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert cli.main(["model", "make-tiny", str(a), "--seed", "3"]) == 0
    assert cli.main(["model", "make-tiny", str(b), "--seed", "3"]) == 0
    assert cli.main(["model", "make-tiny", str(c), "--seed", "4"]) == 0
    assert _digest(a) == _digest(b)
    assert _digest(a)["model.safetensors"] != _digest(c)["model.safetensors"]
    names = {p.name for p in a.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(a, local_files_only=True)
    cfg = json.loads((a / "config.json").read_text())
    assert (
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["vocab_size"],
    ) == (8, 256, 4, 2, 512)
    assert len(tok) == 512 and model.config.num_hidden_layers == 8
    ids = tok("Hello, world!")["input_ids"]
    assert (
        ids[0] == cfg["bos_token_id"]
        and tok.decode(ids, skip_special_tokens=True) == "Hello, world!"
    )


def test_make_tiny_rejects_bad_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["model", "make-tiny", str(tmp_path / "x"), "--heads", "3"]) == 2
    assert "hidden" in capsys.readouterr().err


def test_reads_only_the_range_tensors(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config.ModelConfig.from_path(tiny_llama)
    seen: list[str] = []
    real = loader.read_tensors

    def spy(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
        seen.extend(names)
        return real(path, names)

    monkeypatch.setattr(loader, "read_tensors", spy)
    st = stage.load_stage(stage.BlockSpec(str(tiny_llama), 2, 5), torch.device("cpu"), 1 << 30)
    assert all(
        n.startswith(("model.layers.2.", "model.layers.3.", "model.layers.4.")) for n in seen
    )
    assert len(seen) == 3 * 9
    assert st.runner.model.embed_tokens is None and st.runner.model.lm_head is None
    last = loader.checkpoint_names(cfg, 6, 8)
    assert "model.norm.weight" in last and "lm_head.weight" in last
    assert "model.embed_tokens.weight" in loader.checkpoint_names(cfg, 0, 1)


def test_block_bytes_from_headers(tiny_llama: Path) -> None:
    cfg = config.ModelConfig.from_path(tiny_llama)
    total = sum(t.numel() * 4 for t in load_file(str(tiny_llama / "model.safetensors")).values())
    parts = [loader.block_bytes(tiny_llama, cfg, a, b, torch.float32) for a, b in ((0, 3), (3, 8))]
    assert sum(parts) == total


def test_sharded_checkpoint_reads_index(tiny_llama3_sharded: Path) -> None:
    assert (tiny_llama3_sharded / "model.safetensors.index.json").is_file()
    assert not (tiny_llama3_sharded / "model.safetensors").exists()
    cfg = config.ModelConfig.from_path(tiny_llama3_sharded)
    assert cfg.rope.rope_type == "llama3" and cfg.tie_embeddings
    st = stage.load_stage(
        stage.BlockSpec(str(tiny_llama3_sharded), 2, 4), torch.device("cpu"), 1 << 30
    )
    assert st.runner.model.lm_head is not None


def test_missing_tensor_is_not_found(tiny_llama: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_llama.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.5.mlp.up_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    stage.load_stage(stage.BlockSpec(str(broken), 0, 5), torch.device("cpu"), 1 << 30)
    with pytest.raises(errors.NotFoundError, match=r"model\.layers\.5\.mlp\.up_proj\.weight"):
        stage.load_stage(stage.BlockSpec(str(broken), 5, 8), torch.device("cpu"), 1 << 30)


@pytest.mark.parametrize("start, end", [(0, 9), (4, 4), (-1, 3), (6, 2)])
def test_bad_range_is_invalid_argument(tiny_llama: Path, start: int, end: int) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="layers"):
        stage.load_stage(stage.BlockSpec(str(tiny_llama), start, end), torch.device("cpu"), 1 << 30)


def test_budget_too_small_is_resource_exhausted(tiny_llama: Path) -> None:
    with pytest.raises(errors.ResourceExhaustedError, match="parameters"):
        stage.load_stage(stage.BlockSpec(str(tiny_llama), 0, 8), torch.device("cpu"), 1 << 20)


def test_unknown_model_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(errors.NotFoundError, match="model not found"):
        stage.load_stage(
            stage.BlockSpec(str(tmp_path / "nope"), 0, 1), torch.device("cpu"), 1 << 30
        )


def test_kv_export_import_roundtrip(tiny_llama: Path) -> None:
    st = stage.load_stage(
        stage.BlockSpec(str(tiny_llama), 0, 2, kv_bytes=4 << 20), torch.device("cpu"), 1 << 30
    )
    cache = st.runner.cache
    k = torch.randn(20, 2, 64)
    v = torch.randn(20, 2, 64)
    cache.import_sequence(1, [3, 7], k, v)
    k2, v2 = cache.export_sequence(1, [3, 7], 20)
    assert torch.equal(k, k2) and torch.equal(v, v2)
    assert cache.k[0].abs().sum() == 0  # other layers untouched
