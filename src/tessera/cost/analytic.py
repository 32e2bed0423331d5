"""Analytic cost profiles from datasheet peaks and stated efficiency factors.

Used when no measured profile exists (tests, benchmarks, ``tessera plan`` without
``--profile``). Every profile made here carries ``source="analytic"``; its figures are
model estimates, not measurements. Called by the planner CLI and ``tessera.planner.bench``.

Roofline terms are *added*, not overlapped (a GEMM's weight read and its FLOPs are both
paid), which errs on the slow side by at most 2x near the ridge point.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera import fields
from tessera.cost.model_shape import ModelShape
from tessera.cost.profile import CommSpec, DecodeCoeffs, Link, MemorySpec, PrefillCoeffs, Profile


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet peaks of one GPU type (SXM form factor)."""

    name: str  # cluster gpuType, e.g. "h100-80gb"
    peak_flops: float  # dense BF16/FP16 tensor-core FLOP/s (no sparsity)
    hbm_bytes_per_s: float  # HBM bandwidth
    memory_bytes: int  # HBM capacity
    nvlink_bytes_per_s: float  # NVLink bandwidth per GPU, one direction
    nic_bytes_per_s: float  # inter-node NIC bandwidth per GPU, one direction


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak that real kernels reach; each is stated in docs/planner.md."""

    prefill_gemm: float = 0.60  # large GEMMs in prefill (cuBLAS on long prompts)
    decode_gemm: float = 0.40  # skinny GEMMs in decode (small batch, poor tensor-core use)
    attention: float = 0.50  # FlashAttention-2 forward on H100/A100
    hbm: float = 0.80  # achievable fraction of HBM bandwidth for streaming reads
    link: float = 0.70  # NCCL bus bandwidth / nominal link bandwidth
    prefill_layer_overhead_s: float = 20e-6  # kernel launches per layer, eager prefill
    decode_layer_overhead_s: float = 8e-6  # per layer per step with CUDA graphs
    intra_node_latency_s: float = 8e-6  # NCCL small-message latency over NVLink
    inter_node_latency_s: float = 15e-6  # NCCL small-message latency over InfiniBand

    def __post_init__(self) -> None:
        for name in ("prefill_gemm", "decode_gemm", "attention", "hbm", "link"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise fields.FieldError(name, f"must be in (0, 1], got {value!r}")


# Datasheet figures (NVIDIA A100 and H100 SXM). Bidirectional NVLink is halved.
DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec(
        name="a100-80gb",
        peak_flops=312e12,
        hbm_bytes_per_s=2.039e12,
        memory_bytes=80 * 2**30,
        nvlink_bytes_per_s=300e9,  # NVLink 3: 600 GB/s bidirectional
        nic_bytes_per_s=25e9,  # HDR InfiniBand 200 Gb/s per GPU
    ),
    DeviceSpec(
        name="h100-80gb",
        peak_flops=989e12,
        hbm_bytes_per_s=3.35e12,
        memory_bytes=80 * 2**30,
        nvlink_bytes_per_s=450e9,  # NVLink 4: 900 GB/s bidirectional
        nic_bytes_per_s=50e9,  # NDR InfiniBand 400 Gb/s per GPU
    ),
)


def device_spec(name: str) -> DeviceSpec:
    """Return the datasheet spec of a known GPU type; raise naming the known ones."""
    for spec in DEVICES:
        if spec.name == name:
            return spec
    known = ", ".join(spec.name for spec in DEVICES)
    raise fields.FieldError("device", f"no analytic spec for {name!r} (known: {known})")


def default_comm(spec: DeviceSpec, eff: Efficiency = Efficiency()) -> CommSpec:
    """Return the interconnect implied by a device's datasheet and the link efficiency."""
    return CommSpec(
        intra_node=Link(spec.nvlink_bytes_per_s * eff.link, eff.intra_node_latency_s),
        inter_node=Link(spec.nic_bytes_per_s * eff.link, eff.inter_node_latency_s),
    )


def analytic_profile(model: ModelShape, device: str, eff: Efficiency = Efficiency()) -> Profile:
    """Return the roofline profile of ``model`` on ``device`` (``source="analytic"``).

    Per decoder layer with P parameters, H query heads of width d and dtype size s:

    * prefill: weight read P*s/(HBM*hbm); GEMMs 2P FLOPs per token at prefill_gemm;
      causal attention 2*H*d*n^2 FLOPs at ``attention``.
    * decode: weight read P*s/(HBM*hbm) per step; GEMMs 2P FLOPs per sequence at
      decode_gemm; KV read of kv_bytes per context token at hbm plus 4*H*d FLOPs.
    * lm_head: the same weight-read and GEMM terms with P = vocab * hidden.
    """
    spec = device_spec(device)
    flops, hbm = spec.peak_flops, spec.hbm_bytes_per_s * eff.hbm
    params = model.layer_params
    attn_width = model.num_heads * model.head_dim
    weight_read = params * model.dtype_bytes / hbm
    prefill = PrefillCoeffs(
        fixed=eff.prefill_layer_overhead_s,
        per_tp=weight_read,
        per_token=2 * params / (flops * eff.prefill_gemm),
        per_token_sq=2 * attn_width / (flops * eff.attention),
    )
    decode = DecodeCoeffs(
        fixed=eff.decode_layer_overhead_s,
        per_tp=weight_read,
        per_seq=2 * params / (flops * eff.decode_gemm),
        per_seq_ctx=model.kv_bytes_per_token_per_layer / hbm
        + 4 * attn_width / (flops * eff.attention),
    )
    head_params = model.vocab_size * model.hidden_size
    lm_head = DecodeCoeffs(
        fixed=eff.decode_layer_overhead_s,
        per_tp=head_params * model.dtype_bytes / hbm,
        per_seq=2 * head_params / (flops * eff.decode_gemm),
        per_seq_ctx=0.0,
    )
    assumptions: tuple[tuple[str, str | float], ...] = (
        ("note", "analytic roofline estimate from datasheet peaks; not a measurement"),
        ("peak_flops", spec.peak_flops),
        ("hbm_bytes_per_s", spec.hbm_bytes_per_s),
        ("eff_prefill_gemm", eff.prefill_gemm),
        ("eff_decode_gemm", eff.decode_gemm),
        ("eff_attention", eff.attention),
        ("eff_hbm", eff.hbm),
        ("eff_link", eff.link),
        ("prefill_layer_overhead_s", eff.prefill_layer_overhead_s),
        ("decode_layer_overhead_s", eff.decode_layer_overhead_s),
    )
    return Profile(
        source="analytic",
        device=spec.name,
        model=model,
        prefill=prefill,
        decode=decode,
        lm_head_decode=lm_head,
        memory=MemorySpec.of(model),
        comm=default_comm(spec, eff),
        assumptions=assumptions,
    )
