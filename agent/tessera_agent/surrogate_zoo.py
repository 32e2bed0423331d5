"""A bottleneck block's surrogate kept in the zoo folder, for a deployment to opt in to.

`save(zoo, checkpoint, layers, fit)` writes a fitted low-rank surrogate (`surrogate.Fit`)
of the checkpoint's layers `[a, b)` to `zoo/surrogate/<sha16(checkpoint)>-<a>-<b>/`:
`surrogate.safetensors` (its four tensors) and `surrogate.json` (the checkpoint's path and
SHA-256, the layers, the rank and the held-out quality). `open_zoo` finds it again and
refuses one fitted for another checkpoint. `save_pseudo` records the paper's pseudo
surrogate instead (kind "pseudo": the block's own copy, made right, wrong or half right on
purpose; tests and benches measure speculation's bounds with it). Callers: `tessera
validate`/`tessera up` (`cli/variant_check`, a `speculate` variant's check), the agent
(`speculate_serve.prepare`), tests. The digest is the stitch's
(`stitch.checkpoint_digest`), so both kinds of zoo entry name a checkpoint the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from tessera_agent import stitch, surrogate

TENSORS = ("mean_in", "a", "b", "mean_up")


def zoo_path(zoo: Path, checkpoint: Path, layers: tuple[int, int]) -> Path:
    """Where the surrogate of these layers of this checkpoint lives in the zoo folder."""
    digest = stitch.checkpoint_digest(checkpoint)[:16]
    return zoo / "surrogate" / f"{digest}-{layers[0]}-{layers[1]}"


def save(zoo: Path, checkpoint: Path, layers: tuple[int, int], fit: surrogate.Fit) -> Path:
    """Write the surrogate and its record (module docstring); returns its folder."""
    out = zoo_path(zoo, checkpoint, layers)
    out.mkdir(parents=True, exist_ok=True)
    s = fit.surrogate
    tensors = dict(zip(TENSORS, (s.mean_in, s.a, s.b, s.mean_up), strict=True))
    save_file(
        {k: v.detach().contiguous() for k, v in tensors.items()}, str(out / "surrogate.safetensors")
    )
    meta = {
        "checkpoint": {"path": str(checkpoint), "sha256": stitch.checkpoint_digest(checkpoint)},
        "layers": list(layers),
        "kind": "low_rank",
        "rank": fit.rank,
        "quality": {"cosine": fit.cosine, "max_abs_diff": fit.max_abs_diff},
    }
    (out / "surrogate.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def save_pseudo(zoo: Path, checkpoint: Path, layers: tuple[int, int], wrong: str) -> Path:
    """Record a pseudo surrogate of these layers, wrong "never", "always" or "half" the time
    (module docstring); returns its folder."""
    if wrong not in ("never", "always", "half"):
        raise ValueError(f"wrong: {wrong!r} is not never, always or half")
    out = zoo_path(zoo, checkpoint, layers)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "checkpoint": {"path": str(checkpoint), "sha256": stitch.checkpoint_digest(checkpoint)},
        "layers": list(layers),
        "kind": "pseudo",
        "wrong": wrong,
    }
    (out / "surrogate.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def open_zoo(
    zoo: Path, checkpoint: Path, layers: tuple[int, int]
) -> tuple[surrogate.LowRank | None, dict[str, Any]]:
    """The surrogate the zoo holds for these layers of this checkpoint (None for a pseudo
    one: the agent loads the block's copy) and its record: LookupError when none was saved
    for them, ValueError when the record names another checkpoint's digest or other layers."""
    folder = zoo_path(zoo, checkpoint, layers)
    if not (folder / "surrogate.json").exists():
        raise LookupError(f"no surrogate in {zoo} for layers {list(layers)} of {checkpoint}")
    meta: dict[str, Any] = json.loads((folder / "surrogate.json").read_text())
    if meta["checkpoint"]["sha256"] != stitch.checkpoint_digest(checkpoint):
        raise ValueError(f"{folder}: the surrogate was fitted for another checkpoint")
    if tuple(meta["layers"]) != tuple(layers):
        raise ValueError(f"{folder}: the surrogate was fitted for layers {meta['layers']}")
    if meta.get("kind") == "pseudo":
        return None, meta
    t = load_file(str(folder / "surrogate.safetensors"))
    return surrogate.LowRank(*(t[k] for k in TENSORS)), meta
