"""Which model names the gateway serves and where each runs: the foundation and its variants.

The OpenAI `model` field of a request chooses the foundation or one of its variants
(issue 14). `VariantTable.resolve` maps it to a `Target`: the adapter name the agent
applies (LoRA variants run on the foundation's replicas) and the replicas allowed to serve
it (a full fine-tune has its own replicas; the foundation and its LoRA variants use every
replica no full variant claims). An unknown name is a 404 naming the served ones
(`request_params.check_model`). Updated from the routes document (`server.py`); read by
the handlers (`app.py`) and `/v1/models`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera import variant_routes


@dataclass(frozen=True)
class Target:
    """Where a model name runs."""

    model: str
    variant: str = ""  # adapter name sent to the agent; "" = none
    replicas: frozenset[str] | None = None  # allowed replicas (a full fine-tune's own)
    exclude: frozenset[str] = frozenset()  # replicas of full fine-tunes (not the foundation)
    kind: str = "foundation"  # "foundation", "lora" or "full"

    def allows(self, replica_id: str) -> bool:
        if self.replicas is not None:
            return replica_id in self.replicas
        return replica_id not in self.exclude


class VariantTable:
    """The foundation plus the variants the routes document lists."""

    def __init__(self, foundation: str) -> None:
        self.foundation = foundation
        self._variants: tuple[variant_routes.RouteVariant, ...] = ()

    def update(self, variants: Sequence[variant_routes.RouteVariant]) -> None:
        self._variants = tuple(v for v in variants if v.name != self.foundation)

    def names(self) -> list[str]:
        """Every served model name, the foundation first."""
        return [self.foundation, *(v.name for v in self._variants)]

    @property
    def variants(self) -> tuple[variant_routes.RouteVariant, ...]:
        return self._variants

    def resolve(self, model: str) -> Target:
        """The target of a served name (callers check the name first: `names()`)."""
        full = frozenset(r for v in self._variants if v.kind == "full" for r in v.replicas)
        for v in self._variants:
            if v.name != model:
                continue
            if v.kind == "full":
                return Target(model, "", frozenset(v.replicas), kind="full")
            return Target(model, v.name, None, full, kind="lora")
        return Target(model, "", None, full)
