"""The one reader of a checkpoint's `config.json` (and the JSON files beside it).

Pure (no torch, grpc or I/O beyond the files read): `read_config(model_dir)` decodes
`config.json`; each layer derives its own facts type from that mapping:
`cost.model_shape.ModelShape` (`served_shape` here: the core's dimensions, used by the cost
model, planner, simulator, converge, semantic checks, switching loop, CLI and operator),
`tessera_agent.engine.config.ModelConfig` (the engine's, agent only) and
`tessera.gateway.model_info.ModelInfo` (context length and vocabulary, gateway only).
`policies.serving.gpu_memory.ModelShape` is one rank's slice, built from `ModelConfig`.
Raises FileNotFoundError ("model not found: ...") or ValueError naming the file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tessera import dtypes
from tessera.cost import model_shape

CONFIG = "config.json"


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """`model_dir/config.json` decoded; FileNotFoundError when the file is absent."""
    path = Path(model_dir) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"model not found: no {CONFIG} in {model_dir}")
    return read_object(path)


def read_object(path: str | Path) -> dict[str, Any]:
    """A JSON file that must hold an object (`config.json`, `tokenizer_config.json`, ...);
    ValueError naming the file when it does not."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: invalid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{p}: expected a JSON object")
    return obj


def num_layers(model_dir: str | Path) -> int:
    """The checkpoint's decoder layers (`num_hidden_layers`)."""
    return int(read_config(model_dir)["num_hidden_layers"])


def served_shape(model_dir: str | Path, dtype: str) -> model_shape.ModelShape | None:
    """The model's shape with the size of the dtype a spec's `dtype` serves it in ("auto":
    the checkpoint's, as the agent resolves it); None when config.json is not readable."""
    try:
        cfg = read_config(model_dir)
        shape = model_shape.from_hf_config(cfg, Path(model_dir).name)
    except (OSError, ValueError):
        return None
    return dataclasses.replace(shape, dtype_bytes=dtypes.nbytes(dtypes.resolve(dtype, cfg)))
