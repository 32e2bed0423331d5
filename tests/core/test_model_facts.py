"""The one reader of config.json: its errors name the file, "auto" serves the checkpoint's
dtype, and no other module decodes a config.json itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tessera import model_facts

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "torch_dtype": "bfloat16",
}


def test_reads_the_config_and_serves_its_dtype(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert model_facts.read_config(tmp_path) == CONFIG
    assert model_facts.num_layers(tmp_path) == 3
    auto = model_facts.served_shape(tmp_path, "auto")
    assert auto is not None and auto.dtype_bytes == 2 and auto.num_kv_heads == 2
    wide = model_facts.served_shape(tmp_path, "float32")
    assert wide is not None and wide.dtype_bytes == 4


def test_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model not found: no config\.json"):
        model_facts.read_config(tmp_path)
    assert model_facts.served_shape(tmp_path, "auto") is None
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config\.json: expected a JSON object"):
        model_facts.read_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"config\.json: invalid JSON"):
        model_facts.read_config(tmp_path)


def test_no_other_module_decodes_a_config_json() -> None:
    decodes = re.compile(r"json\.loads?\(.*config\.json|open\(.*config\.json")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for top in ("src", "agent", "operator")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path.name != "model_facts.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if decodes.search(line)
    ]
    assert found == []
