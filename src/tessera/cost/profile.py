"""The per-layer cost profile of one model on one device, and its JSON form.

A :class:`Profile` is what the planner prices deployments with: analytic
(``tessera.cost.analytic``, ``"source": "analytic"``) or fitted to measured layer timings
(``tessera.cost.fit``, ``"source": "measured"``), stored as the JSON document of
docs/planner.md ("Profile schema"); parse errors name the field
(``layer.decode_s.per_seq: must be >= 0``). One decoder layer at TP degree ``tp``, seconds::

    prefill(n, tp)    = fixed + (per_tp + per_token * n + per_token_sq * n**2) / tp
    decode(b, c, tp)  = fixed + (per_tp + per_seq * b + per_seq_ctx * b * c) / tp

``n``: prompt length; ``b``: sequences in a decode step; ``c``: their context length. The
TP all-reduce is not included: ``tessera.cost.latency`` adds it from ``comm`` or the links.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera import fields
from tessera.cost.model_shape import ModelShape

SCHEMA = "tessera.profile/v1"
SOURCES: tuple[str, ...] = ("analytic", "measured")


def _check_nonnegative(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value >= 0:  # also rejects NaN
            raise fields.FieldError(name, f"must be >= 0, got {value!r}")


@dataclass(frozen=True)
class PrefillCoeffs:
    """Prefill seconds of one layer for one prompt of ``n`` tokens (see module docstring)."""

    fixed: float  # launch/synchronisation overhead, independent of tp
    per_tp: float  # weight read, split across tp ranks
    per_token: float  # GEMM FLOPs per token, split across tp ranks
    per_token_sq: float  # causal attention FLOPs (quadratic in n), split across tp ranks

    def __post_init__(self) -> None:
        _check_nonnegative(self, ("fixed", "per_tp", "per_token", "per_token_sq"))

    def seconds(self, tokens: float, tp: int) -> float:
        """Return the layer's prefill time for a ``tokens``-long prompt at degree ``tp``."""
        return (
            self.fixed + (self.per_tp + tokens * (self.per_token + self.per_token_sq * tokens)) / tp
        )


@dataclass(frozen=True)
class DecodeCoeffs:
    """Decode-step seconds of one layer for ``b`` sequences of context ``c``."""

    fixed: float  # launch overhead, independent of tp
    per_tp: float  # weight read (memory bound), split across tp ranks
    per_seq: float  # GEMM FLOPs per sequence, split across tp ranks
    per_seq_ctx: float  # KV-cache read per sequence and context token, split across tp ranks

    def __post_init__(self) -> None:
        _check_nonnegative(self, ("fixed", "per_tp", "per_seq", "per_seq_ctx"))

    def seconds(self, batch: float, context: float, tp: int) -> float:
        """Return one decode step's time for ``batch`` sequences of ``context`` tokens."""
        return self.fixed + (self.per_tp + batch * (self.per_seq + self.per_seq_ctx * context)) / tp


@dataclass(frozen=True)
class Link:
    """A point-to-point link class: per-GPU bandwidth and per-message latency."""

    bandwidth_bytes_per_s: float  # per direction, per GPU
    latency_s: float  # per message (NCCL step)

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise fields.FieldError("bandwidth_bytes_per_s", "must be > 0")
        _check_nonnegative(self, ("latency_s",))

    def transfer_seconds(self, nbytes: float) -> float:
        """Return the time to send ``nbytes`` over this link."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class CommSpec:
    """Interconnect used for TP all-reduces (intra-node) and PP hops (either)."""

    intra_node: Link  # NVLink / NVSwitch
    inter_node: Link  # InfiniBand / RoCE NIC per GPU
    allreduce_per_layer: int = 2  # after attention and after the MLP (Megatron-style TP)

    def __post_init__(self) -> None:
        if self.allreduce_per_layer < 0:
            raise fields.FieldError("allreduce_per_layer", "must be >= 0")


@dataclass(frozen=True)
class MemorySpec:
    """Bytes the model occupies; divided by tp on each rank of a stage."""

    layer_param_bytes: int  # one decoder layer's weights
    kv_bytes_per_token: int  # one token's K and V in one layer
    activation_bytes_per_token: int  # hidden state of one token (all-reduce / hop payload)
    embedding_param_bytes: int  # token embedding, on the first stage
    lm_head_param_bytes: int  # final norm + output projection, on the last stage

    def __post_init__(self) -> None:
        _check_nonnegative(
            self,
            (
                "layer_param_bytes",
                "kv_bytes_per_token",
                "activation_bytes_per_token",
                "embedding_param_bytes",
                "lm_head_param_bytes",
            ),
        )

    @staticmethod
    def of(model: ModelShape) -> MemorySpec:
        """Return the memory figures implied by a model's shape and dtype."""
        return MemorySpec(
            layer_param_bytes=model.layer_params * model.dtype_bytes,
            kv_bytes_per_token=model.kv_bytes_per_token_per_layer,
            activation_bytes_per_token=model.activation_bytes_per_token,
            embedding_param_bytes=model.embedding_params * model.dtype_bytes,
            lm_head_param_bytes=model.lm_head_params * model.dtype_bytes,
        )


@dataclass(frozen=True)
class Profile:
    """Cost profile of one model on one device type."""

    source: str  # "analytic" (derived from datasheet peaks) or "measured" (fitted)
    device: str  # GPU type, matched against the cluster's gpuType, e.g. "h100-80gb"
    model: ModelShape
    prefill: PrefillCoeffs  # per decoder layer
    decode: DecodeCoeffs  # per decoder layer
    lm_head_decode: DecodeCoeffs  # logits for b sequences (per_seq_ctx unused, 0)
    memory: MemorySpec
    comm: CommSpec  # defaults; a cluster file's interconnect section overrides it
    # Free-form provenance: efficiency factors, peak figures, sample counts.
    assumptions: tuple[tuple[str, str | float], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise fields.FieldError("source", f"must be one of {', '.join(SOURCES)}")
        if not self.device:
            raise fields.FieldError("device", "must be a non-empty string")

    def to_json(self) -> dict[str, Any]:
        """Return the profile as the documented JSON object."""
        return {
            "schema": SCHEMA,
            "source": self.source,
            "device": self.device,
            "model": self.model.to_json(),
            "layer": {
                "prefill_s": _coeffs_json(self.prefill),
                "decode_s": _coeffs_json(self.decode),
                "param_bytes": self.memory.layer_param_bytes,
                "kv_bytes_per_token": self.memory.kv_bytes_per_token,
                "activation_bytes_per_token": self.memory.activation_bytes_per_token,
            },
            "embedding": {"param_bytes": self.memory.embedding_param_bytes},
            "lm_head": {
                "param_bytes": self.memory.lm_head_param_bytes,
                "decode_s": _coeffs_json(self.lm_head_decode),
            },
            "comm": {
                "allreduce_per_layer": self.comm.allreduce_per_layer,
                "intra_node": _link_json(self.comm.intra_node),
                "inter_node": _link_json(self.comm.inter_node),
            },
            "assumptions": dict(self.assumptions),
        }


def _coeffs_json(coeffs: PrefillCoeffs | DecodeCoeffs) -> dict[str, float]:
    return {name: float(value) for name, value in vars(coeffs).items()}


def _link_json(link: Link) -> dict[str, float]:
    return {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "latency_s": link.latency_s}


def profile_from_json(doc: Any) -> Profile:
    """Parse and validate a profile JSON object; errors name the offending field."""
    root = fields.mapping(doc, "")
    schema = root.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise fields.FieldError("schema", f"must be {SCHEMA!r}, got {schema!r}")
    source = fields.string(fields.require(root, "source", ""), "source", choices=SOURCES)
    device = fields.string(fields.require(root, "device", ""), "device")
    model = ModelShape.from_json(fields.require(root, "model", ""), "model")
    layer = fields.mapping(fields.require(root, "layer", ""), "layer")
    embedding = fields.mapping(fields.require(root, "embedding", ""), "embedding")
    head = fields.mapping(fields.require(root, "lm_head", ""), "lm_head")
    comm = fields.mapping(fields.require(root, "comm", ""), "comm")

    def nonneg_int(obj: Mapping[str, Any], key: str, path: str) -> int:
        return fields.integer(fields.require(obj, key, path), fields.join(path, key), minimum=0)

    memory = MemorySpec(
        layer_param_bytes=nonneg_int(layer, "param_bytes", "layer"),
        kv_bytes_per_token=nonneg_int(layer, "kv_bytes_per_token", "layer"),
        activation_bytes_per_token=nonneg_int(layer, "activation_bytes_per_token", "layer"),
        embedding_param_bytes=nonneg_int(embedding, "param_bytes", "embedding"),
        lm_head_param_bytes=nonneg_int(head, "param_bytes", "lm_head"),
    )
    assumptions_doc = fields.mapping(root.get("assumptions", {}), "assumptions")
    assumptions: list[tuple[str, str | float]] = []
    for key, value in assumptions_doc.items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise fields.FieldError(f"assumptions.{key}", "must be a string or a number")
        assumptions.append((str(key), value if isinstance(value, str) else float(value)))
    return Profile(
        source=source,
        device=device,
        model=model,
        prefill=_prefill_from_json(fields.require(layer, "prefill_s", "layer"), "layer.prefill_s"),
        decode=_decode_from_json(fields.require(layer, "decode_s", "layer"), "layer.decode_s"),
        lm_head_decode=_decode_from_json(
            fields.require(head, "decode_s", "lm_head"), "lm_head.decode_s"
        ),
        memory=memory,
        comm=CommSpec(
            intra_node=link_from_json(
                fields.require(comm, "intra_node", "comm"), "comm.intra_node"
            ),
            inter_node=link_from_json(
                fields.require(comm, "inter_node", "comm"), "comm.inter_node"
            ),
            allreduce_per_layer=fields.integer(
                comm.get("allreduce_per_layer", 2), "comm.allreduce_per_layer", minimum=0
            ),
        ),
        assumptions=tuple(assumptions),
    )


def _coeff_values(doc: Any, path: str, names: tuple[str, ...]) -> dict[str, float]:
    obj = fields.mapping(doc, path)
    return {
        name: fields.number(fields.require(obj, name, path), fields.join(path, name), minimum=0)
        for name in names
    }


def _prefill_from_json(doc: Any, path: str) -> PrefillCoeffs:
    return PrefillCoeffs(
        **_coeff_values(doc, path, ("fixed", "per_tp", "per_token", "per_token_sq"))
    )


def _decode_from_json(doc: Any, path: str) -> DecodeCoeffs:
    return DecodeCoeffs(**_coeff_values(doc, path, ("fixed", "per_tp", "per_seq", "per_seq_ctx")))


def link_from_json(doc: Any, path: str) -> Link:
    """Parse a ``{"bandwidth_bytes_per_s", "latency_s"}`` object."""
    obj = fields.mapping(doc, path)
    return Link(
        bandwidth_bytes_per_s=fields.number(
            fields.require(obj, "bandwidth_bytes_per_s", path),
            fields.join(path, "bandwidth_bytes_per_s"),
            positive=True,
        ),
        latency_s=fields.number(
            fields.require(obj, "latency_s", path), fields.join(path, "latency_s"), minimum=0
        ),
    )
