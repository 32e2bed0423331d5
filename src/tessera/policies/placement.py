"""Where a deployment's parameters live: replicas, stages, layer ranges and devices.

The switch planner's input vocabulary. A stage holds decoder layers ``[start, end)`` on
``tp`` devices of one node; rank ``r`` of ``tp`` holds the slice ``[r/tp, (r+1)/tp)`` of
every tensor of those layers (Megatron-style: each rank a 1/tp share of the bytes). The
first stage also holds the token embedding and the last the final norm and lm_head,
split by tp the same way (vocabulary-parallel), as ``tessera.cost.latency`` prices them.
Parameters are indexed by *units*: 0 is the embedding, 1..L the decoder layers, L+1 the
lm_head. Built by callers from a planner :class:`~tessera.planner.deployment.Deployment`
(:func:`from_deployment`) or by hand; read by ``tessera.policies.switching.switch_plan``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from tessera import fields
from tessera.cost.profile import Profile
from tessera.planner.deployment import Deployment

GpuRef = tuple[str, int]  # (node name, device index on that node)


@dataclass(frozen=True)
class ModelBytes:
    """Parameter bytes of one model: per decoder layer, embedding and lm_head."""

    num_layers: int
    layer_bytes: float
    embedding_bytes: float = 0.0
    lm_head_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise fields.FieldError("num_layers", "must be >= 1")
        for name in ("layer_bytes", "embedding_bytes", "lm_head_bytes"):
            if not getattr(self, name) >= 0:
                raise fields.FieldError(name, "must be >= 0")

    def unit_bytes(self, unit: int) -> float:
        """Bytes of one unit (0 embedding, 1..L layers, L+1 lm_head)."""
        if unit == 0:
            return self.embedding_bytes
        if unit == self.num_layers + 1:
            return self.lm_head_bytes
        return self.layer_bytes

    @property
    def total_bytes(self) -> float:
        """The whole model."""
        return self.num_layers * self.layer_bytes + self.embedding_bytes + self.lm_head_bytes


def model_bytes(profile: Profile) -> ModelBytes:
    """Parameter bytes from a cost profile's memory section."""
    mem = profile.memory
    return ModelBytes(
        num_layers=profile.model.num_layers,
        layer_bytes=float(mem.layer_param_bytes),
        embedding_bytes=float(mem.embedding_param_bytes),
        lm_head_bytes=float(mem.lm_head_param_bytes),
    )


@dataclass(frozen=True)
class StagePlacement:
    """One pipeline stage: its decoder layers and its tp devices (rank order, one node)."""

    layers: tuple[int, int]  # [start, end)
    devices: tuple[GpuRef, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.layers[0] < self.layers[1]:
            raise fields.FieldError("layers", f"must be a non-empty [start, end): {self.layers}")
        if not self.devices:
            raise fields.FieldError("devices", "a stage needs at least one device")
        if len(set(self.devices)) != len(self.devices):
            raise fields.FieldError("devices", f"repeated device in {self.devices}")
        if len({node for node, _ in self.devices}) != 1:
            raise fields.FieldError("devices", "a stage's tp devices must share one node")

    @property
    def tp(self) -> int:
        """Tensor-parallel degree."""
        return len(self.devices)

    def units(self, num_layers: int) -> tuple[int, int]:
        """Unit range ``[start, end)`` this stage holds (embedding / lm_head included)."""
        start, end = self.layers
        if end > num_layers:
            raise fields.FieldError("layers", f"end {end} exceeds the model's {num_layers} layers")
        return (0 if start == 0 else start + 1, num_layers + 2 if end == num_layers else end + 1)

    def slice_of(self, rank: int) -> tuple[Fraction, Fraction]:
        """The share ``[r/tp, (r+1)/tp)`` of each tensor that rank ``r`` holds."""
        return Fraction(rank, self.tp), Fraction(rank + 1, self.tp)


@dataclass(frozen=True)
class ReplicaPlacement:
    """One replica: its stages in pipeline order."""

    name: str
    stages: tuple[StagePlacement, ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise fields.FieldError("stages", f"replica {self.name!r} has no stage")
        for prev, nxt in zip(self.stages, self.stages[1:], strict=False):
            if prev.layers[1] != nxt.layers[0]:
                raise fields.FieldError("stages", f"replica {self.name!r}: stages not contiguous")


def check(
    replicas: tuple[ReplicaPlacement, ...], num_layers: int, what: str, complete: bool = True
) -> None:
    """No device serves two stages, no stage passes the last layer; with ``complete``
    every replica covers all layers (a source may hold a part: dropped parameters)."""
    seen: dict[GpuRef, str] = {}
    for replica in replicas:
        covers = replica.stages[0].layers[0] == 0 and replica.stages[-1].layers[1] == num_layers
        if complete and not covers:
            raise fields.FieldError(
                f"{what}.{replica.name}", f"must cover layers [0, {num_layers})"
            )
        for stage in replica.stages:
            stage.units(num_layers)
            for device in stage.devices:
                if device in seen:
                    raise fields.FieldError(
                        f"{what}.{replica.name}",
                        f"device {device} already holds a stage of {seen[device]!r}",
                    )
                seen[device] = replica.name


def from_deployment(deployment: Deployment) -> tuple[ReplicaPlacement, ...]:
    """The placement of a planner deployment (its replicas' stages and GPUs)."""
    return tuple(
        ReplicaPlacement(r.name, tuple(StagePlacement(s.layers, tuple(s.gpus)) for s in r.stages))
        for r in deployment.replicas
    )


def devices(replicas: tuple[ReplicaPlacement, ...]) -> tuple[GpuRef, ...]:
    """Every device of a placement, sorted."""
    return tuple(sorted({d for r in replicas for s in r.stages for d in s.devices}))
