"""Fit a cost profile to measured per-layer timings (``"source": "measured"``).

``tessera profile --agent ADDR --out FILE`` (the CLI, wired by the lead) times single
layers on the real engine at several prompt lengths, batch sizes, context lengths and TP
degrees, and hands the raw samples to :func:`fit_profile`. The fit is a non-negative least
squares on the features of ``tessera.cost.profile`` with relative (1/y) weights, so short
and long samples count alike. Measured times include the TP all-reduce; the modeled
all-reduce (``tessera.cost.latency``) is subtracted before fitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize

from tessera import fields
from tessera.cost import analytic, latency
from tessera.cost.model_shape import ModelShape
from tessera.cost.profile import CommSpec, DecodeCoeffs, MemorySpec, PrefillCoeffs, Profile

KINDS: tuple[str, ...] = ("prefill", "decode", "lm_head")


@dataclass(frozen=True)
class LayerTiming:
    """One measurement: seconds one layer took for one prefill or decode step.

    ``kind="prefill"``: ``size`` is the prompt length (``context_len`` is ignored).
    ``kind="decode"``: ``size`` is the batch, ``context_len`` the sequences' context.
    ``kind="lm_head"``: ``size`` is the batch of logits; the time is the lm_head's.
    """

    kind: str
    size: int  # prompt tokens (prefill) or batch (decode, lm_head)
    context_len: int  # decode context tokens per sequence
    tp: int  # tensor-parallel degree the layer ran at
    seconds_per_layer: float

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise fields.FieldError("kind", f"must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.size < 1:
            raise fields.FieldError("size", "must be >= 1")
        if self.context_len < 0:
            raise fields.FieldError("context_len", "must be >= 0")
        if self.tp < 1:
            raise fields.FieldError("tp", "must be >= 1")
        if not self.seconds_per_layer > 0:
            raise fields.FieldError("seconds_per_layer", "must be > 0")


def _features(sample: LayerTiming) -> list[float]:
    inv = 1.0 / sample.tp
    n = float(sample.size)
    if sample.kind == "prefill":
        return [1.0, inv, n * inv, n * n * inv]
    if sample.kind == "decode":
        return [1.0, inv, n * inv, n * sample.context_len * inv]
    return [1.0, inv, n * inv]


def _nnls(rows: list[list[float]], targets: list[float]) -> tuple[list[float], float]:
    """Relative-error NNLS; returns coefficients and the relative RMS residual."""
    a: npt.NDArray[np.float64] = np.asarray(rows, dtype=np.float64)
    y: npt.NDArray[np.float64] = np.asarray(targets, dtype=np.float64)
    weighted = a / y[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    coef_scaled, _ = optimize.nnls(weighted / scale, np.ones_like(y))
    coef = coef_scaled / scale
    rel = (a @ coef - y) / y
    return [float(c) for c in coef], float(np.sqrt(np.mean(rel**2)))


def fit_profile(
    samples: Sequence[LayerTiming],
    model: ModelShape,
    device: str,
    comm: CommSpec | None = None,
) -> Profile:
    """Fit per-layer prefill/decode coefficients to ``samples``.

    ``comm`` gives the links used to strip the TP all-reduce from the samples and becomes
    the profile's default interconnect; it defaults to the device's analytic interconnect
    and is required for devices without an analytic spec. At least 4 prefill and 4 decode
    samples are needed; use two or more TP degrees to separate fixed overhead from weight
    read. Without ``lm_head`` samples the lm_head cost is scaled from the decode fit by
    the ratio of lm_head to layer parameters.
    """
    if comm is None:
        try:
            comm = analytic.default_comm(analytic.device_spec(device))
        except fields.FieldError:
            raise fields.FieldError(
                "comm", f"required: device {device!r} has no analytic interconnect"
            ) from None
    memory = MemorySpec.of(model)
    by_kind: dict[str, tuple[list[list[float]], list[float]]] = {k: ([], []) for k in KINDS}
    for i, sample in enumerate(samples):
        if not isinstance(sample, LayerTiming):
            raise fields.FieldError(f"samples[{i}]", "must be a LayerTiming")
        seconds = sample.seconds_per_layer
        if sample.kind != "lm_head":
            tokens = float(sample.size)
            nbytes = tokens * memory.activation_bytes_per_token
            seconds -= comm.allreduce_per_layer * latency.allreduce_seconds(
                nbytes, sample.tp, comm.intra_node
            )
            if seconds <= 0:
                raise fields.FieldError(
                    f"samples[{i}].seconds_per_layer",
                    "is below the modeled all-reduce time; check comm or the measurement",
                )
        rows, targets = by_kind[sample.kind]
        rows.append(_features(sample))
        targets.append(seconds)
    for kind in ("prefill", "decode"):
        count = len(by_kind[kind][1])
        if count < 4:
            raise fields.FieldError("samples", f"need at least 4 {kind} samples, got {count}")
    pre, pre_err = _nnls(*by_kind["prefill"])
    dec, dec_err = _nnls(*by_kind["decode"])
    decode = DecodeCoeffs(fixed=dec[0], per_tp=dec[1], per_seq=dec[2], per_seq_ctx=dec[3])
    assumptions: list[tuple[str, str | float]] = [
        ("note", "fitted by non-negative least squares to measured layer timings"),
        ("prefill_samples", float(len(by_kind["prefill"][1]))),
        ("decode_samples", float(len(by_kind["decode"][1]))),
        ("prefill_fit_rel_rms", pre_err),
        ("decode_fit_rel_rms", dec_err),
    ]
    if len(by_kind["lm_head"][1]) >= 3:
        head, head_err = _nnls(*by_kind["lm_head"])
        lm_head = DecodeCoeffs(fixed=head[0], per_tp=head[1], per_seq=head[2], per_seq_ctx=0.0)
        assumptions.append(("lm_head_fit_rel_rms", head_err))
    else:
        ratio = (model.vocab_size * model.hidden_size) / model.layer_params
        lm_head = DecodeCoeffs(
            fixed=decode.fixed,
            per_tp=decode.per_tp * ratio,
            per_seq=decode.per_seq * ratio,
            per_seq_ctx=0.0,
        )
        assumptions.append(("lm_head", "scaled from the decode fit by parameter ratio"))
    return Profile(
        source="measured",
        device=device,
        model=model,
        prefill=PrefillCoeffs(fixed=pre[0], per_tp=pre[1], per_token=pre[2], per_token_sq=pre[3]),
        decode=decode,
        lm_head_decode=lm_head,
        memory=memory,
        comm=comm,
        assumptions=tuple(assumptions),
    )
