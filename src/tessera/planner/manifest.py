"""The planner's view of a ServingDeployment manifest, parsed by `tessera.api`.

``planner_inputs_from_manifest`` takes what planning needs from the parsed manifest: the
model's ``config.json`` (found under ``spec.model.path``, relative to ``base_dir``), the GPU
budget, the workload classes and the SLO. Called by ``tessera.cli.plan_cmd``. This module
and the CLI are the only planner code that touches files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera import api, fields, model_facts
from tessera.cost import model_shape
from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.model_shape import ModelShape

LAYOUT_MODES: tuple[str, ...] = api.LAYOUT_MODES


@dataclass(frozen=True)
class PlannerInputs:
    """Everything about the deployment the planner needs besides cluster and profile."""

    name: str  # metadata.name
    model: ModelShape
    gpus: int  # GPU budget to plan with (spec.resources.gpus)
    max_gpus: int  # autoscaling ceiling (spec.resources.maxGpus)
    gpu_memory_bytes: int | None  # per-GPU memory the deployment may use, if limited
    classes: tuple[RequestClass, ...]
    slo: Slo
    layout_mode: str  # "auto": the planner chooses

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise fields.FieldError("spec.resources.gpus", "must be >= 1")
        if self.max_gpus < self.gpus:
            raise fields.FieldError("spec.resources.maxGpus", "must be >= spec.resources.gpus")
        if not self.classes:
            raise fields.FieldError("spec.workload.classes", "must list at least one class")


def read_model_shape(model_dir: Path, name: str) -> ModelShape:
    """Read ``model_dir/config.json`` into a :class:`ModelShape`."""
    path = model_dir / model_facts.CONFIG
    try:
        config = model_facts.read_config(model_dir)
    except FileNotFoundError:
        raise fields.FieldError("spec.model.path", f"{path} does not exist") from None
    except ValueError as exc:
        raise fields.FieldError("spec.model.path", str(exc)) from None
    return model_shape.from_hf_config(config, name, path=str(path))


def planner_inputs_from_manifest(doc: Any, base_dir: Path | str) -> PlannerInputs:
    """The planner's inputs from a decoded ServingDeployment document.

    The document is parsed by `tessera.api` (the one typed manifest); planning additionally
    needs a GPU budget, workload classes and both SLO targets, checked here by field."""
    dep = api.parse(doc)
    spec = dep.spec
    model_path = Path(spec.model.path or spec.model.sub_path)
    if not model_path.is_absolute():
        model_path = Path(base_dir) / model_path
    model = read_model_shape(model_path, spec.model.name)
    if spec.resources.gpus < 1:
        raise fields.FieldError("spec.resources.gpus", "is required for planning (>= 1)")
    if not spec.workload:
        raise fields.FieldError("spec.workload.classes", "is required for planning")
    for j, c in enumerate(spec.workload):
        if any(o.name == c.name for o in spec.workload[:j]):
            raise fields.FieldError(
                f"spec.workload.classes[{j}].name", f"duplicate class name {c.name!r}"
            )
    if not spec.slo.ttft_p99_ms:
        raise fields.FieldError("spec.slo.ttftP99Ms", "is required for planning (> 0)")
    if not spec.slo.tpot_p99_ms:
        raise fields.FieldError("spec.slo.tpotP99Ms", "is required for planning (> 0)")
    memory = None
    if spec.resources.gpu_memory:
        memory = fields.byte_quantity(spec.resources.gpu_memory, "spec.resources.gpuMemory")
    return PlannerInputs(
        name=dep.name,
        model=model,
        gpus=spec.resources.gpus,
        max_gpus=spec.resources.max_gpus or spec.resources.gpus,
        gpu_memory_bytes=memory,
        classes=tuple(
            RequestClass(c.name, c.input_tokens, c.output_tokens, c.rate) for c in spec.workload
        ),
        slo=Slo(ttft_s=spec.slo.ttft_p99_ms / 1e3, tpot_s=spec.slo.tpot_p99_ms / 1e3),
        layout_mode=spec.layout.mode,
    )
