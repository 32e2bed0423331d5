"""Shared builders for planner tests (a uniquely named helper module, not a conftest)."""

from __future__ import annotations

import json
from pathlib import Path

from tessera.cost import analytic, model_shape
from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.model_shape import ModelShape
from tessera.cost.profile import Profile
from tessera.planner.problem import PlanningProblem, PoolNode

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"

CLASSES = (
    RequestClass("short", 300, 40, 4.0),
    RequestClass("long", 1500, 400, 1.0),
    RequestClass("mid", 1000, 200, 2.0),
)
SLO = Slo(ttft_s=2.0, tpot_s=0.1)


def shape(name: str) -> ModelShape:
    config = json.loads((MODELS / name / "config.json").read_text())
    return model_shape.from_hf_config(config, name)


def h100(name: str) -> Profile:
    return analytic.analytic_profile(shape(name), "h100-80gb")


def problem(
    name: str = "llama-2-13b",
    nodes: int = 2,
    gpus: int = 4,
    classes: tuple[RequestClass, ...] = CLASSES,
) -> PlanningProblem:
    prof = h100(name)
    pool = tuple(PoolNode(f"n{i}", tuple(range(gpus))) for i in range(nodes))
    return PlanningProblem(prof, pool, 80 * 2**30, prof.comm, classes, SLO)
