"""The one table of parameter / KV dtypes Tessera serves in, by name, and how "auto" resolves.

Pure (no torch): the API's `model.dtype`, the agent's load defaults, the operator's sizing
and the cost model read names and element sizes from here; the agent maps the same names
to torch dtypes (`tessera_agent.engine.dtypes`). "auto", the default, means the
checkpoint's own `torch_dtype` from config.json (float32 when it names none or one the
engine does not serve).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

AUTO = "auto"  # the checkpoint's torch_dtype
# Served dtypes and bytes per element (parameters and KV cache).
BYTES: Mapping[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
NAMES: tuple[str, ...] = tuple(BYTES)
CHOICES: tuple[str, ...] = (AUTO, *NAMES)  # what a spec may say
# Dtypes a checkpoint may be stored in (bytes per element) beyond the served ones.
STORED_BYTES: Mapping[str, int] = {**BYTES, "float8_e4m3fn": 1, "float8_e5m2": 1}


def check(name: str, what: str = "dtype") -> str:
    """`name` when it is one of `CHOICES`; ValueError naming them otherwise."""
    if name not in CHOICES:
        raise ValueError(f"{what}: {name!r} is not one of {list(CHOICES)}")
    return name


def checkpoint_dtype(config: Mapping[str, Any]) -> str:
    """The served dtype a decoded config.json asks for: its `torch_dtype` (or `dtype`)
    when served, else float32."""
    raw = str(config.get("torch_dtype") or config.get("dtype") or "").removeprefix("torch.")
    return raw if raw in BYTES else "float32"


def resolve(name: str, config: Mapping[str, Any]) -> str:
    """A spec's dtype made concrete: "auto" becomes the checkpoint's (`checkpoint_dtype`)."""
    check(name)
    return checkpoint_dtype(config) if name == AUTO else name


def nbytes(name: str) -> int:
    """Bytes per element of a served or stored dtype name ("torch." prefix allowed)."""
    key = name.removeprefix("torch.")
    if key not in STORED_BYTES:
        raise ValueError(f"dtype {name!r} is not one of {sorted(STORED_BYTES)}")
    return STORED_BYTES[key]
