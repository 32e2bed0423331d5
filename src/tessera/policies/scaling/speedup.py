"""CoCoServe's speedup model of layer replication (§4.1, Eqs. 1-4).

Input: a `Placement` (per layer of one replica, the devices holding a copy besides the origin),
the devices' compute capacity and link bandwidth to the origin, and the workload shape (hidden
d, batch bs, length l). Output: S(P) = W(P0) / (W(P) + T(P)) with
``W(P) = sum_i max_j d^2 * bs_ij * l / C_ij`` (Eq. 1) and
``T(P) = delta * sum_i sum_{j>1} d * bs_ij * l / B_ij`` (Eq. 2). The batch at a layer is split
in proportion to capacity (as `request_split.py` does); on identical devices S reduces to Eq. 4,
``1 / (gamma + (1 - gamma) / n * sum_i 1/p_i)`` (tested). gamma is measured
(`gamma_from_times`, `gamma_from_profile`), not guessed. Used by `module_scaling.py` and
`tessera bench scaling`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera.cost import profile as profile_mod


@dataclass(frozen=True)
class Device:
    """A device that can host layer replicas."""

    name: str
    capacity: float  # relative compute speed C (any unit shared by all devices)
    bandwidth: float = float("inf")  # bytes/s of its link to the origin device, B
    free_bytes: int = 0  # memory available for replicas
    idle_fraction: float = 0.0  # share of its compute currently idle, [0, 1]

    def __post_init__(self) -> None:
        if not self.capacity > 0:
            raise ValueError(f"device {self.name}: capacity must be > 0")
        if not self.bandwidth > 0:
            raise ValueError(f"device {self.name}: bandwidth must be > 0")
        if not 0.0 <= self.idle_fraction <= 1.0:
            raise ValueError(f"device {self.name}: idle_fraction must be in [0, 1]")


@dataclass(frozen=True)
class Placement:
    """P: the origin device of a replica's n layers and each layer's extra holders."""

    origin: str
    replicas: tuple[tuple[str, ...], ...]  # per layer: devices holding a replica

    @staticmethod
    def initial(origin: str, num_layers: int) -> Placement:
        return Placement(origin, tuple(() for _ in range(num_layers)))

    @property
    def num_layers(self) -> int:
        return len(self.replicas)

    @property
    def degrees(self) -> tuple[int, ...]:
        """The vector P of the paper: p_i = 1 + replicas of layer i."""
        return tuple(1 + len(r) for r in self.replicas)

    def add(self, layer: int, device: str) -> Placement:
        if device == self.origin or device in self.replicas[layer]:
            raise ValueError(f"layer {layer} already runs on {device}")
        reps = list(self.replicas)
        reps[layer] = (*reps[layer], device)
        return Placement(self.origin, tuple(reps))

    def remove(self, layer: int, device: str) -> Placement:
        if device not in self.replicas[layer]:
            raise ValueError(f"layer {layer} has no replica on {device}")
        reps = list(self.replicas)
        reps[layer] = tuple(d for d in reps[layer] if d != device)
        return Placement(self.origin, tuple(reps))

    def on(self, device: str) -> list[int]:
        """Layers with a replica on `device`."""
        return [i for i, r in enumerate(self.replicas) if device in r]


@dataclass(frozen=True)
class Workload:
    """The shape terms of Eqs. 1-2 and the constant delta."""

    hidden: int  # d
    batch: int  # bs
    seq_len: int  # l
    delta: float = 1.0  # communication events per replicated layer (Eq. 2)


def speedup_homogeneous(degrees: Sequence[int], gamma: float) -> float:
    """Eq. 4: S = 1 / (gamma + (1 - gamma)/n * sum 1/p_i)."""
    if not degrees or any(p < 1 for p in degrees):
        raise ValueError("degrees: need n >= 1 layers, each with p_i >= 1")
    n = len(degrees)
    return 1.0 / (gamma + (1.0 - gamma) / n * sum(1.0 / p for p in degrees))


def compute_time(state: Placement, devices: Mapping[str, Device], wl: Workload) -> float:
    """W(P), Eq. 1, with the batch split in proportion to capacity."""
    total = 0.0
    for holders in _holders(state):
        caps = sum(devices[h].capacity for h in holders)
        total += max(
            wl.hidden**2
            * (wl.batch * devices[h].capacity / caps)
            * wl.seq_len
            / devices[h].capacity
            for h in holders
        )
    return total


def transfer_time(state: Placement, devices: Mapping[str, Device], wl: Workload) -> float:
    """T(P), Eq. 2: each replica's share of the batch goes out and back over its link."""
    total = 0.0
    for holders in _holders(state):
        caps = sum(devices[h].capacity for h in holders)
        for h in holders[1:]:
            share = wl.batch * devices[h].capacity / caps
            total += wl.hidden * share * wl.seq_len / devices[h].bandwidth
    return wl.delta * total


def speedup(state: Placement, devices: Mapping[str, Device], wl: Workload) -> float:
    """Eq. 3: S(P) = W(P0) / (W(P) + T(P))."""
    base = compute_time(Placement.initial(state.origin, state.num_layers), devices, wl)
    return base / (compute_time(state, devices, wl) + transfer_time(state, devices, wl))


def _holders(state: Placement) -> list[tuple[str, ...]]:
    return [(state.origin, *r) for r in state.replicas]


def gamma_from_times(
    layer_compute_s: float, activation_transfer_s: float, delta: float = 1.0
) -> float:
    """gamma = delta*C/(d*B) = delta x transfer time / compute time of one layer's batch."""
    if not layer_compute_s > 0:
        raise ValueError("layer_compute_s: must be > 0")
    return delta * activation_transfer_s / layer_compute_s


def gamma_from_profile(
    prof: profile_mod.Profile,
    link: profile_mod.Link,
    batch: int,
    context: int,
    delta: float = 1.0,
) -> float:
    """gamma for a decode step of `batch` sequences from a cost profile and a link."""
    compute = prof.decode.seconds(batch, context, 1)
    transfer = link.transfer_seconds(batch * prof.memory.activation_bytes_per_token)
    return gamma_from_times(compute, transfer, delta)
