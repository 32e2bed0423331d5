"""The planner's view of a ServingDeployment manifest (a minimal, temporary parser).

``planner_inputs_from_manifest`` reads only what planning needs: the model's
``config.json`` (found under ``spec.model.path``, relative to ``base_dir``), the GPU budget,
the workload classes and the SLO. The operator's typed ``tessera.api`` will replace this
parser; the lead swaps it by building :class:`PlannerInputs` from the API object instead.
Called by ``tessera.cli.plan_cmd``. This module and the CLI are the only planner code
that touches files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera import fields
from tessera.cost import model_shape
from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.model_shape import ModelShape

LAYOUT_MODES: tuple[str, ...] = ("auto", "manual")


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
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise fields.FieldError("spec.model.path", f"{path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise fields.FieldError("spec.model.path", f"{path}: invalid JSON ({exc})") from None
    return model_shape.from_hf_config(config, name, path=str(path))


def planner_inputs_from_manifest(doc: Any, base_dir: Path | str) -> PlannerInputs:
    """Parse the planner subset of a decoded ServingDeployment document."""
    root = fields.mapping(doc, "")
    kind = root.get("kind")
    if kind != "ServingDeployment":
        raise fields.FieldError("kind", f"must be ServingDeployment, got {kind!r}")
    meta = fields.mapping(root.get("metadata", {}), "metadata")
    name = fields.string(meta.get("name", "deployment"), "metadata.name")
    spec = fields.mapping(fields.require(root, "spec", ""), "spec")

    model_doc = fields.mapping(fields.require(spec, "model", "spec"), "spec.model")
    model_name = fields.string(fields.require(model_doc, "name", "spec.model"), "spec.model.name")
    model_path = Path(
        fields.string(fields.require(model_doc, "path", "spec.model"), "spec.model.path")
    )
    if not model_path.is_absolute():
        model_path = Path(base_dir) / model_path
    model = read_model_shape(model_path, model_name)

    res = fields.mapping(fields.require(spec, "resources", "spec"), "spec.resources")
    gpus = fields.integer(
        fields.require(res, "gpus", "spec.resources"), "spec.resources.gpus", minimum=1
    )
    max_gpus = fields.integer(res.get("maxGpus", gpus), "spec.resources.maxGpus", minimum=1)
    memory = None
    if res.get("gpuMemory") is not None:
        memory = fields.byte_quantity(res["gpuMemory"], "spec.resources.gpuMemory")

    layout = fields.mapping(spec.get("layout", {}), "spec.layout")
    mode = fields.string(layout.get("mode", "auto"), "spec.layout.mode", choices=LAYOUT_MODES)

    workload = fields.mapping(fields.require(spec, "workload", "spec"), "spec.workload")
    raw_classes = fields.sequence(
        fields.require(workload, "classes", "spec.workload"), "spec.workload.classes"
    )
    classes: list[RequestClass] = []
    for j, item in enumerate(raw_classes):
        path = f"spec.workload.classes[{j}]"
        obj = fields.mapping(item, path)
        cls_name = fields.string(obj.get("name", f"class-{j}"), f"{path}.name")
        if any(c.name == cls_name for c in classes):
            raise fields.FieldError(f"{path}.name", f"duplicate class name {cls_name!r}")
        classes.append(
            RequestClass(
                name=cls_name,
                input_tokens=fields.integer(
                    fields.require(obj, "inputTokens", path), f"{path}.inputTokens", minimum=1
                ),
                output_tokens=fields.integer(
                    fields.require(obj, "outputTokens", path), f"{path}.outputTokens", minimum=1
                ),
                rate=fields.number(obj.get("rate", 0.0), f"{path}.rate", minimum=0),
            )
        )

    slo_doc = fields.mapping(fields.require(spec, "slo", "spec"), "spec.slo")
    slo = Slo(
        ttft_s=fields.number(
            fields.require(slo_doc, "ttftP99Ms", "spec.slo"), "spec.slo.ttftP99Ms", positive=True
        )
        / 1e3,
        tpot_s=fields.number(
            fields.require(slo_doc, "tpotP99Ms", "spec.slo"), "spec.slo.tpotP99Ms", positive=True
        )
        / 1e3,
    )
    return PlannerInputs(
        name=name,
        model=model,
        gpus=gpus,
        max_gpus=max_gpus,
        gpu_memory_bytes=memory,
        classes=tuple(classes),
        slo=slo,
        layout_mode=mode,
    )
