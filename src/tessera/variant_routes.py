"""Variants in the routes document: which model names a gateway serves, and on which replicas.

A deployment serves its foundation plus variants (issue 14). A LoRA variant runs on the
foundation's own replicas (the request carries the adapter name to the agent); a full
fine-tune runs on its own replicas, whose blocks share every layer identical to the
foundation's on each agent (the block zoo). JSON form, the `variants` key of the routes
document (`tessera.routes_doc`):

    "variants": [{"name": "legal", "kind": "lora"},
                 {"name": "med", "kind": "full", "replicas": ["ns.dep.med-r0.g1"]}]

The foundation's replicas are the document's replicas that no full variant claims.
Written by `tessera up` and the operator once a variant is ready; read by the gateway
(`tessera.gateway.variants`). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("lora", "full")


@dataclass(frozen=True)
class RouteVariant:
    name: str
    kind: str  # "lora" or "full"
    replicas: tuple[str, ...] = ()  # a full fine-tune's own replicas; () for LoRA

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.replicas:
            out["replicas"] = list(self.replicas)
        return out


def parse(v: object, foundation: str = "") -> tuple[RouteVariant, ...]:
    """Validate the `variants` list; ValueError naming the bad field."""
    if not isinstance(v, list):
        raise ValueError("variants: expected a list of {name, kind, replicas}")
    out: list[RouteVariant] = []
    for i, item in enumerate(v):
        if not isinstance(item, dict):
            raise ValueError(f"variants[{i}]: expected an object")
        name, kind = item.get("name"), item.get("kind", "lora")
        if not isinstance(name, str) or not name:
            raise ValueError(f"variants[{i}].name: expected a non-empty string")
        if kind not in KINDS:
            raise ValueError(f"variants[{i}].kind: expected one of {list(KINDS)}, got {kind!r}")
        reps = item.get("replicas", [])
        if not isinstance(reps, list) or not all(isinstance(r, str) and r for r in reps):
            raise ValueError(f"variants[{i}].replicas: expected a list of replica ids")
        if kind == "lora" and reps:
            raise ValueError(f"variants[{i}].replicas: a LoRA variant runs on the foundation's")
        out.append(RouteVariant(name, kind, tuple(reps)))
    names = [x.name for x in out] + ([foundation] if foundation else [])
    if len(set(names)) != len(names):
        raise ValueError(f"variants: duplicate model names in {names}")
    return tuple(out)
