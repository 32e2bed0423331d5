"""The JSON input and output of ``tessera plan assign``.

Input (documented in docs/planner.md, "tessera plan assign")::

    {"classes":  [{"name": "short", "demand": 4.0}, ...],
     "replicas": [{"name": "r0", "capacity": [30.0, 2.5], "limits": [null, 1.0]}, ...]}

``capacity[j]`` is the replica's req/s for class j alone; ``limits`` (optional, ``null``
= unlimited) caps the rate of class j on that replica. Errors name the field, e.g.
``replicas[1].capacity[2]: must be >= 0``. Called by ``tessera.cli.plan_cmd``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera import fields
from tessera.planner import assign, assign_flow


@dataclass(frozen=True)
class AssignInput:
    """A parsed assignment input: names plus the numeric problem."""

    class_names: tuple[str, ...]
    replica_names: tuple[str, ...]
    problem: assign.AssignmentProblem


def parse(doc: Any) -> AssignInput:
    """Validate and convert a decoded input document."""
    root = fields.mapping(doc, "")
    classes = fields.sequence(fields.require(root, "classes", ""), "classes")
    replicas = fields.sequence(fields.require(root, "replicas", ""), "replicas")
    if not classes:
        raise fields.FieldError("classes", "must list at least one class")
    names: list[str] = []
    demand: list[float] = []
    for j, item in enumerate(classes):
        path = f"classes[{j}]"
        obj = fields.mapping(item, path)
        name = fields.string(obj.get("name", f"class-{j}"), fields.join(path, "name"))
        if name in names:
            raise fields.FieldError(fields.join(path, "name"), f"duplicate class name {name!r}")
        names.append(name)
        demand.append(
            fields.number(fields.require(obj, "demand", path), f"{path}.demand", minimum=0)
        )
    replica_names: list[str] = []
    capacity: list[tuple[float, ...]] = []
    limits: list[tuple[float | None, ...]] = []
    any_limit = False
    for k, item in enumerate(replicas):
        path = f"replicas[{k}]"
        obj = fields.mapping(item, path)
        replica_names.append(fields.string(obj.get("name", f"replica-{k}"), f"{path}.name"))
        caps = fields.sequence(fields.require(obj, "capacity", path), f"{path}.capacity")
        if len(caps) != len(names):
            raise fields.FieldError(
                f"{path}.capacity",
                f"expected {len(names)} values (one per class), got {len(caps)}",
            )
        capacity.append(
            tuple(fields.number(c, f"{path}.capacity[{j}]", minimum=0) for j, c in enumerate(caps))
        )
        raw_limits = obj.get("limits")
        if raw_limits is None:
            limits.append(tuple(None for _ in names))
            continue
        any_limit = True
        seq = fields.sequence(raw_limits, f"{path}.limits")
        if len(seq) != len(names):
            raise fields.FieldError(
                f"{path}.limits", f"expected {len(names)} values (one per class), got {len(seq)}"
            )
        limits.append(
            tuple(
                None if v is None else fields.number(v, f"{path}.limits[{j}]", minimum=0)
                for j, v in enumerate(seq)
            )
        )
    problem = assign.AssignmentProblem(
        demand=tuple(demand),
        capacity=tuple(capacity),
        limits=tuple(limits) if any_limit else None,
    )
    return AssignInput(tuple(names), tuple(replica_names), problem)


def result_json(data: AssignInput, result: assign.Assignment) -> dict[str, Any]:
    """Return the output document of ``tessera plan assign``."""
    cert = result.certificate
    out: dict[str, Any] = {
        "objective": result.objective,
        "value": result.value,
        "status": "optimal" if cert.optimal else "suboptimal",
        "classes": list(data.class_names),
        "replicas": [
            {
                "name": name,
                "rates": dict(zip(data.class_names, result.rates[k], strict=True)),
                "shares": dict(zip(data.class_names, result.shares()[k], strict=True)),
                "utilization": result.utilization[k],
                "price": result.replica_prices[k],
            }
            for k, name in enumerate(data.replica_names)
        ],
        "served": dict(zip(data.class_names, result.served, strict=True)),
        "class_prices": dict(zip(data.class_names, result.class_prices, strict=True)),
        "certificate": {
            "primal": cert.primal,
            "dual": cert.dual,
            "gap": cert.gap,
            "dual_residual": cert.dual_residual,
            "primal_violation": cert.primal_violation,
            "tolerance": cert.tolerance,
            "optimal": cert.optimal,
        },
    }
    if result.objective == "throughput":
        bounds = assign_flow.flow_bounds(data.problem)
        out["flow_check"] = {
            "method": "preflow_push",
            "lower": bounds.lower,
            "upper": bounds.upper,
            "exact": bounds.exact,
        }
    return out
