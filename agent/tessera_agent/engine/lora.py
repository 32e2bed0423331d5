"""LoRA adapters served beside their foundation: PEFT files in, batched per-token deltas out.

A LoRA variant adds `scale · B(A x)` to some linear projections. `attach()` wraps a stage's
fused projections (qkv, o, gate/up, down) in `LoraLinear`: the base matmul once for the batch,
then each token's adapter delta in one gathered pass (S-LoRA / Punica in plain torch: A and B
stacked per projection, zero-padded to the largest rank, `index_select`ed by the token's slot;
slot -1 is the foundation alone). Inputs: PEFT's saved format (`adapter_config.json` +
`adapter_model.safetensors`); `read_adapter()` validates one against the foundation's config
and names what does not fit (rank, targets, shapes, unsupported options). Called by the stage
loader for replicas serving variants; the runner sets `LoraContext.token_slots` before each
forward. Works over any base module keeping the full output layout (sharded linears included).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from tessera_agent.engine import config as config_mod

# PEFT module name -> (fused engine projection, the output slice of it it adds to)
TARGETS: dict[str, tuple[str, str]] = {
    "q_proj": ("self_attn.qkv_proj", "q"),
    "k_proj": ("self_attn.qkv_proj", "k"),
    "v_proj": ("self_attn.qkv_proj", "v"),
    "o_proj": ("self_attn.o_proj", "o"),
    "gate_proj": ("mlp.gate_up_proj", "gate"),
    "up_proj": ("mlp.gate_up_proj", "up"),
    "down_proj": ("mlp.down_proj", "down"),
}
_PREFIX = "base_model.model.model.layers."
_FUSED = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class AdapterError(ValueError):
    """An adapter that does not fit the foundation; the message says why."""


@dataclass(frozen=True)
class AdapterConfig:
    """The parts of PEFT's `adapter_config.json` that change inference."""

    r: int
    alpha: float
    target_modules: tuple[str, ...]
    use_rslora: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def parse_config(doc: Mapping[str, object], where: str = "adapter_config.json") -> AdapterConfig:
    """Validate PEFT's config; refuse options whose inference math Tessera does not run."""
    if doc.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{where}: peft_type {doc.get('peft_type')!r} is not LORA")
    for key, ok in (
        ("use_dora", False),
        ("fan_in_fan_out", False),
    ):
        if bool(doc.get(key, ok)) != ok:
            raise AdapterError(f"{where}: {key}={doc.get(key)!r} is not supported")
    if doc.get("bias", "none") != "none":
        raise AdapterError(f"{where}: bias={doc.get('bias')!r} is not supported (only 'none')")
    if doc.get("modules_to_save"):
        raise AdapterError(
            f"{where}: modules_to_save={doc.get('modules_to_save')!r} would replace foundation "
            "modules; serve it as a full fine-tune instead"
        )
    for key in ("rank_pattern", "alpha_pattern"):
        if doc.get(key):
            raise AdapterError(f"{where}: per-module {key} is not supported")
    r = doc.get("r")
    if not isinstance(r, int) or r <= 0:
        raise AdapterError(f"{where}: r must be a positive integer, got {r!r}")
    alpha = doc.get("lora_alpha", r)
    if not isinstance(alpha, int | float) or alpha <= 0:
        raise AdapterError(f"{where}: lora_alpha must be positive, got {alpha!r}")
    targets = doc.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets:
        raise AdapterError(f"{where}: target_modules must list module names, got {targets!r}")
    unknown = sorted(set(map(str, targets)) - set(TARGETS))
    if unknown:
        raise AdapterError(
            f"{where}: target_modules {unknown} are not LoRA-servable projections "
            f"(supported: {', '.join(TARGETS)})"
        )
    return AdapterConfig(
        r=r,
        alpha=float(alpha),
        target_modules=tuple(sorted(map(str, targets))),
        use_rslora=bool(doc.get("use_rslora", False)),
    )


def _shapes(cfg: config_mod.ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target module in the foundation."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    f = cfg.intermediate_size
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, f),
        "up_proj": (h, f),
        "down_proj": (f, h),
    }


@dataclass
class Adapter:
    """One LoRA adapter's matrices for a layer range: (layer, module) -> (A [r,in], B [out,r])."""

    name: str
    config: AdapterConfig
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def read_adapter(
    path: Path, name: str, cfg: config_mod.ModelConfig, start: int = 0, end: int | None = None
) -> Adapter:
    """Read and validate a PEFT LoRA adapter directory for layers [start, end)."""
    end = cfg.num_layers if end is None else end
    cfg_file = path / "adapter_config.json"
    if not cfg_file.is_file():
        raise AdapterError(f"{path}: no adapter_config.json (not a PEFT adapter directory)")
    acfg = parse_config(json.loads(cfg_file.read_text()), str(cfg_file))
    wfile = path / "adapter_model.safetensors"
    if not wfile.is_file():
        raise AdapterError(f"{path}: no adapter_model.safetensors")
    shapes = _shapes(cfg)
    out = Adapter(name, acfg)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(str(wfile), framework="pt") as f:
        for key in f.keys():
            if not key.startswith(_PREFIX):
                raise AdapterError(f"{wfile}: tensor {key!r} is not a decoder-layer LoRA weight")
            rest = key[len(_PREFIX) :].split(".")
            # <layer>.<self_attn|mlp>.<module>.<lora_A|lora_B>.weight
            if len(rest) != 5 or rest[3] not in ("lora_A", "lora_B") or rest[4] != "weight":
                raise AdapterError(f"{wfile}: unexpected tensor name {key!r}")
            layer, module = int(rest[0]), rest[2]
            if module not in acfg.target_modules:
                raise AdapterError(f"{wfile}: {key!r} targets {module}, not in target_modules")
            if not 0 <= layer < cfg.num_layers:
                raise AdapterError(
                    f"{wfile}: {key!r} names layer {layer}; the foundation has "
                    f"{cfg.num_layers} layers"
                )
            if start <= layer < end:
                pairs.setdefault((layer, module), {})[rest[3]] = f.get_tensor(key)
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise AdapterError(f"{wfile}: layer {layer} {module} lacks lora_A or lora_B")
        a, b = ab["lora_A"], ab["lora_B"]
        fin, fout = shapes[module]
        if a.shape != (acfg.r, fin) or b.shape != (fout, acfg.r):
            raise AdapterError(
                f"{wfile}: layer {layer} {module}: lora_A {tuple(a.shape)} / lora_B "
                f"{tuple(b.shape)} do not fit the foundation (expected ({acfg.r}, {fin}) / "
                f"({fout}, {acfg.r}) for r={acfg.r})"
            )
        out.weights[(layer, module)] = (a, b)
    return out


class LoraContext:
    """Per-stage, per-step: each flattened token's adapter slot (-1 = none).

    Set by the runner before a forward, read by every `LoraLinear` of the stage; a stage
    runs one step at a time on its compute thread, so one context per stage suffices.
    """

    def __init__(self) -> None:
        self.token_slots: torch.Tensor | None = None  # [T] long


@dataclass
class _Part:
    """One LoRA target inside a fused projection: output columns [lo, hi)."""

    lo: int
    hi: int
    a: torch.Tensor  # [S, rmax, in] stacked over slots, zero-padded
    b: torch.Tensor  # [S, out_part, rmax] (scaling folded in)


class LoraLinear(nn.Module):
    """A base projection plus per-token LoRA deltas over slices of its output."""

    def __init__(self, base: nn.Module, ctx: LoraContext, parts: Sequence[_Part]) -> None:
        super().__init__()
        self.base, self.ctx, self.parts = base, ctx, list(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.base(x)
        return self.add_delta(x, y)

    def add_delta(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Add each row's adapter delta to `y` = base(x) in place (a co-step runs the
        base over several chains' rows and calls this on this chain's rows)."""
        slots = self.ctx.token_slots
        if slots is None or not self.parts:
            return y
        active = slots >= 0
        if not bool(active.any()):
            return y
        rows = active.nonzero().squeeze(1)
        xs = x.index_select(0, rows)  # [n, in]
        sel = slots.index_select(0, rows)
        for p in self.parts:
            a = p.a.index_select(0, sel)  # [n, r, in]
            b = p.b.index_select(0, sel)  # [n, out, r]
            h = torch.bmm(a, xs.unsqueeze(2))  # [n, r, 1]
            delta = torch.bmm(b, h).squeeze(2)  # [n, out]
            y[:, p.lo : p.hi].index_add_(0, rows, delta.to(y.dtype))
        return y


def _slices(cfg: config_mod.ModelConfig) -> dict[str, tuple[int, int]]:
    q, kv, f = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    h = cfg.hidden_size
    return {
        "q": (0, q),
        "k": (q, q + kv),
        "v": (q + kv, q + 2 * kv),
        "gate": (0, f),
        "up": (f, 2 * f),
        "o": (0, h),
        "down": (0, h),
    }


def attach(
    model: nn.Module,
    cfg: config_mod.ModelConfig,
    adapters: Sequence[Adapter],
    dtype: torch.dtype = torch.float32,
) -> tuple[LoraContext, dict[str, int]]:
    """Wrap the stage's projections so that slot i applies `adapters[i]`.

    Returns the context the runner fills each step and the {adapter name: slot} map.
    Re-attaching (after adding or removing an adapter) rebuilds the stacks on the base
    modules; the foundation's weights are never copied.
    """
    ctx = LoraContext()
    slots = {a.name: i for i, a in enumerate(adapters)}
    rmax = max((a.config.r for a in adapters), default=0)
    sl = _slices(cfg)
    layers = getattr(model, "layers")  # noqa: B009 (StageModel or a compatible module)
    for layer in layers:
        idx = int(layer.index)
        for fused_path in (
            "self_attn.qkv_proj",
            "self_attn.o_proj",
            "mlp.gate_up_proj",
            "mlp.down_proj",
        ):
            owner_name, attr = fused_path.split(".")
            owner = getattr(layer, owner_name)
            mod = getattr(owner, attr)
            base = mod.base if isinstance(mod, LoraLinear) else mod
            parts: list[_Part] = []
            for peft_name, (path, which) in TARGETS.items():
                if path != fused_path:
                    continue
                present = [a for a in adapters if (idx, peft_name) in a.weights]
                if not present:
                    continue
                lo, hi = sl[which]
                fin = present[0].weights[(idx, peft_name)][0].shape[1]
                a_stack = torch.zeros(len(adapters), rmax, fin, dtype=dtype)
                b_stack = torch.zeros(len(adapters), hi - lo, rmax, dtype=dtype)
                for s, ad in enumerate(adapters):
                    w = ad.weights.get((idx, peft_name))
                    if w is None:
                        continue
                    a_w, b_w = w
                    r = a_w.shape[0]
                    a_stack[s, :r] = a_w.to(dtype)
                    b_stack[s, :, :r] = b_w.to(dtype) * ad.config.scaling
                parts.append(_Part(lo, hi, a_stack, b_stack))
            setattr(owner, attr, LoraLinear(base, ctx, parts) if parts else base)
    return ctx, slots
