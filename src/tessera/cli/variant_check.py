"""Checks a deployment's `spec.variants` against the checkpoints, before anything is served.

Called by `tessera validate` (validation time) and by `tessera up` (at start and on each
manifest edit, which is refused with the reasons while the running deployment keeps
serving). A LoRA adapter is read and validated against the foundation's config exactly as
the agent does at load (`tessera_agent.engine.lora.read_adapter`: rank, target modules,
shapes, unsupported PEFT options); a full fine-tune must be a checkpoint of the same
architecture; a speculated model's zoo must hold a surrogate of its bottleneck block,
which must have a block before and after it (`variant_spec.refusal`). Paths resolve as
the converge pass resolves them (relative to the folder holding the model). Returns
messages `spec.variants[i].adapter: <reason>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera import model_facts

ARCH_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def check(dep: Any, model_path: str) -> list[str]:
    from tessera.control import variants as variant_ops
    from tessera_agent.engine import config as config_mod
    from tessera_agent.engine import lora

    errors: list[str] = []
    resolved = variant_ops.resolve(dep.spec.variants, model_path)
    if not resolved:
        return errors
    try:
        cfg = config_mod.ModelConfig.from_path(Path(model_path))
        base = model_facts.read_config(model_path)
    except (OSError, ValueError) as exc:
        return [f"spec.model.path: cannot read the foundation's config ({exc})"]
    for i, v in enumerate(resolved):
        where = f"spec.variants[{i}].{'adapter' if v.kind == 'lora' else 'checkpoint'}"
        if v.kind == "lora":
            try:
                lora.read_adapter(Path(v.path), v.name, cfg)
            except lora.AdapterError as exc:
                errors.append(f"{where}: {exc}")
            except OSError as exc:
                errors.append(f"{where}: {v.path}: {exc}")
            continue
        if v.kind == "stitch":
            errors += _stitch(v, model_path, f"spec.variants[{i}].stitch", cfg.num_layers)
            continue
        if v.kind == "speculate":
            errors += _speculate(v, model_path, f"spec.variants[{i}].speculate", cfg.num_layers)
            continue
        try:
            other = model_facts.read_config(v.path)
        except (OSError, ValueError) as exc:
            errors.append(f"{where}: no readable config.json in {v.path} ({exc})")
            continue
        differ = [k for k in ARCH_KEYS if other.get(k) != base.get(k)]
        if differ:
            errors.append(
                f"{where}: not the foundation's architecture ({', '.join(differ)} differ); "
                "a full fine-tune shares blocks only with a checkpoint of the same shape"
            )
    return errors


def _stitch(v: Any, model_path: str, where: str, layers: int) -> list[str]:
    """A stitched chain's checks, the ones its agent runs at load (`stitch.open_zoo`):
    the zoo holds a stitch trained for these two checkpoints, measured at the point."""
    from tessera_agent import stitch

    i, j = v.point
    try:
        small = model_facts.read_config(v.path)
    except (OSError, ValueError) as exc:
        return [f"{where}.small: no readable config.json in {v.path} ({exc})"]
    if i >= int(small.get("num_hidden_layers", 0)) or j >= layers:
        return [
            f"{where}.point: [{i}, {j}] needs i below the small model's "
            f"{small.get('num_hidden_layers')} layers and j below the model's {layers}"
        ]
    try:
        stitch.open_zoo(Path(v.zoo), Path(v.path), Path(model_path), (i, j))
    except (LookupError, ValueError, OSError) as exc:
        return [f"{where}: {exc} (train one: tessera model stitch SMALL LARGE --zoo DIR)"]
    return []


def _speculate(v: Any, model_path: str, where: str, layers: int) -> list[str]:
    """A speculated model's checks: the block lies inside the model with blocks before and
    after it (`variant_spec.refusal`), and the zoo holds its surrogate
    (`surrogate_zoo.open_zoo`, the check its agent runs at load)."""
    from tessera import variant_spec
    from tessera_agent import surrogate_zoo

    field, why = variant_spec.refusal(v, layers)
    if field:
        return [f"{where}.{field}: {why}"]
    try:
        surrogate_zoo.open_zoo(Path(v.zoo), Path(model_path), v.layers)
    except (LookupError, ValueError, OSError) as exc:
        return [f"{where}: {exc} (fit one: tessera model surrogate MODEL --layers A B --zoo DIR)"]
    return []
