"""Stitching blocks between models of different widths (BlockLLM §4.4).

A stitching block is one linear layer from the small model's hidden size (+1: the stitching
point's position, normalised) to the large model's, so one stitch serves every point. A
*stitched chain* runs the small model's embedding and layers [0, i), the stitch, then the
large model's layers [j, L), final norm and head (`block_parts`). `train` keeps both models
frozen: a least-squares start over every point, then distillation (KL to the large model's
next-token distribution) from the shallowest point to the deepest. `measure` scores it on
held-out sequences (LM head cosine, Table 3's measure, and top-1 agreement). `save`/`load`
keep it in the zoo folder, addressed by both checkpoints' digests, with its quality;
`StitchedChain.from_zoo` serves through it. Callers: `tessera model stitch`, `tessera bench
stitch`, tests.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tessera_agent import block_parts

Point = tuple[int, int]  # (layers of the small model kept, first layer of the large model)


class Stitch(torch.nn.Module):
    """`Linear(d_small + 1, d_large)`, the +1 being the stitching point's position."""

    def __init__(self, d_small: int, d_large: int, depth: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(d_small + 1, d_large)
        self.depth = depth  # small layers + large layers: normalises the position

    def forward(self, h: torch.Tensor, point: Point) -> torch.Tensor:
        pos = torch.full((*h.shape[:-1], 1), sum(point) / self.depth, dtype=h.dtype)
        out: torch.Tensor = self.linear(torch.cat([h, pos], dim=-1))
        return out

    @property
    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def default_points(small_layers: int, large_layers: int) -> list[Point]:
    """One point per inner small layer, at the same relative depth in the large model."""
    return [(i, round(i * large_layers / small_layers)) for i in range(1, small_layers)]


def _hidden(model: Any, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """The residual stream entering `layer` (pre-norm), without a cache."""
    with torch.inference_mode():
        out = model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
    h: torch.Tensor = out.hidden_states[layer].clone()
    return h


def _tail_logits(tail: block_parts.Part, h: torch.Tensor) -> torch.Tensor:
    """The large model's tail part on hidden states `h`, without a cache (grad flows)."""
    out = tail.model.model(inputs_embeds=h, use_cache=False)
    logits: torch.Tensor = tail.model.lm_head(out.last_hidden_state)
    return logits


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model(input_ids=ids, use_cache=False).logits
    return out


def train(
    small: Any,
    large: Any,
    sequences: torch.Tensor,
    points: Sequence[Point],
    steps_per_point: int = 20,
    joint_steps: int = 240,
    lr: float = 3e-3,
) -> Stitch:
    """Fit a stitch for `points` (module docstring); both models stay frozen."""
    ls, ll = small.config.num_hidden_layers, large.config.num_hidden_layers
    st = Stitch(small.config.hidden_size, large.config.hidden_size, ls + ll)
    xs, ys = [], []
    for i, j in points:
        hs = _hidden(small, sequences, i).flatten(0, 1)
        pos = torch.full((hs.shape[0], 1), (i + j) / (ls + ll))
        xs.append(torch.cat([hs, pos, torch.ones(hs.shape[0], 1)], dim=1))
        ys.append(_hidden(large, sequences, j).flatten(0, 1))
    sol = torch.linalg.lstsq(torch.cat(xs), torch.cat(ys)).solution
    with torch.no_grad():
        st.linear.weight.copy_(sol[:-1].T)
        st.linear.bias.copy_(sol[-1])
    opt = torch.optim.Adam(st.parameters(), lr=lr)
    target = torch.log_softmax(_logits(large, sequences), dim=-1)
    batch = min(16, sequences.shape[0])
    hidden = {(i, j): _hidden(small, sequences, i) for i, j in points}
    tails = {}
    for i, j in points:
        tails[(i, j)] = block_parts.Part(large, j, ll)
        for p in tails[(i, j)].model.parameters():
            p.requires_grad_(False)
    # shallow first, moving deeper (the paper's schedule); then every point in turn, so
    # the last point trained does not win over the others
    ordered = sorted(points)
    schedule = [pt for pt in ordered for _ in range(steps_per_point)]
    schedule += [ordered[s % len(ordered)] for s in range(joint_steps)]
    for step, pt in enumerate(schedule):
        rows = torch.arange(step * batch, (step + 1) * batch) % sequences.shape[0]
        out = torch.log_softmax(_tail_logits(tails[pt], st(hidden[pt][rows], pt)), dim=-1)
        loss = torch.nn.functional.kl_div(out, target[rows], log_target=True, reduction="batchmean")
        opt.zero_grad()
        torch.autograd.backward(loss)
        opt.step()
    return st


@dataclass(frozen=True)
class Quality:
    """The stitched chain against the large model alone, on held-out sequences."""

    point: Point
    cosine: float  # mean over tokens: cosine of the two next-token distributions
    top1_agreement: float  # share of tokens whose argmax is the same


def _agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    pa, pb = torch.softmax(a, dim=-1), torch.softmax(b, dim=-1)
    cos = torch.nn.functional.cosine_similarity(pa, pb, dim=-1).mean()
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean()
    return float(cos), float(top1)


def measure(
    small: Any, large: Any, st: Stitch, heldout: torch.Tensor, points: Sequence[Point]
) -> list[Quality]:
    """Quality per point (module docstring)."""
    ref = _logits(large, heldout)
    out = []
    for i, j in points:
        tail = block_parts.Part(large, j, large.config.num_hidden_layers)
        with torch.inference_mode():
            got = _tail_logits(tail, st(_hidden(small, heldout, i), (i, j)))
        cos, top1 = _agreement(got, ref)
        out.append(Quality((i, j), round(cos, 4), round(top1, 4)))
    return out


def small_alone(small: Any, large: Any, heldout: torch.Tensor) -> tuple[float, float]:
    """The small model alone against the large one: the floor a stitch must beat."""
    return _agreement(_logits(small, heldout), _logits(large, heldout))


def checkpoint_digest(path: Path) -> str:
    """SHA-256 of a checkpoint's config.json and safetensors files."""
    h = hashlib.sha256()
    for f in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def zoo_path(zoo: Path, small: Path, large: Path) -> Path:
    """Where the stitch between two checkpoints lives in the zoo folder."""
    return zoo / "stitch" / f"{checkpoint_digest(small)[:16]}-{checkpoint_digest(large)[:16]}"


def save(
    zoo: Path,
    small: Path,
    large: Path,
    st: Stitch,
    quality: Sequence[Quality],
    extra: dict[str, Any],
) -> Path:
    """Write `stitch.safetensors` and `stitch.json` (sources, points, quality) to the zoo."""
    out = zoo_path(zoo, small, large)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in st.state_dict().items()}
    save_file(state, str(out / "stitch.safetensors"))
    meta = {
        "small": {"path": str(small), "sha256": checkpoint_digest(small)},
        "large": {"path": str(large), "sha256": checkpoint_digest(large)},
        "d_in": st.linear.in_features,
        "d_out": st.linear.out_features,
        "depth": st.depth,
        "param_bytes": st.param_bytes,
        "quality": [
            {"point": list(q.point), "cosine": q.cosine, "top1_agreement": q.top1_agreement}
            for q in quality
        ],
        **extra,
    }
    (out / "stitch.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def load(folder: Path) -> tuple[Stitch, dict[str, Any]]:
    """A stitch and its record from the zoo folder `save` wrote."""
    meta: dict[str, Any] = json.loads((folder / "stitch.json").read_text())
    st = Stitch(meta["d_in"] - 1, meta["d_out"], meta["depth"])
    st.load_state_dict(load_file(str(folder / "stitch.safetensors")))
    return st, meta


def open_zoo(
    zoo: Path, small_path: Path, large_path: Path, point: Point
) -> tuple[Stitch, Quality, Path]:
    """The stitch the zoo holds for these two checkpoints, its quality at `point` and its
    folder: LookupError when none was trained for them, ValueError when the record names
    another checkpoint's digest or the point was not measured. Used by the in-process chain
    and by the agents (`stitch_serve.prepare`)."""
    folder = zoo_path(zoo, small_path, large_path)
    if not (folder / "stitch.json").exists():
        raise LookupError(f"no stitch in {zoo} for {small_path} -> {large_path}")
    st, meta = load(folder)
    for role, path in (("small", small_path), ("large", large_path)):
        if meta[role]["sha256"] != checkpoint_digest(path):
            raise ValueError(f"{folder}: the stitch was trained for another {role} model")
    measured = {tuple(q["point"]): q for q in meta["quality"]}
    if tuple(point) not in measured:
        raise ValueError(f"point {list(point)} was not measured; known: {sorted(measured)}")
    q = measured[tuple(point)]
    return st, Quality((point[0], point[1]), q["cosine"], q["top1_agreement"]), folder


class StitchedChain:
    """Small front `[0, i)` -> stitch -> large tail `[j, L)`, each part with its KV cache."""

    def __init__(
        self, small: Any, large: Any, st: Stitch, point: Point, quality: Quality | None = None
    ) -> None:
        self.front = block_parts.Part(small, 0, point[0])
        self.tail = block_parts.Part(large, point[1], large.config.num_hidden_layers)
        self.stitch, self.point = st, point
        self.quality = quality  # what the zoo measured for this point (None: not measured)

    @classmethod
    def from_zoo(cls, zoo: Path, small_path: Path, large_path: Path, point: Point) -> StitchedChain:
        """The chain opted in to the stitch the zoo holds for these two checkpoints (refused
        as `open_zoo` says); the chain carries the measured quality, to be shown with it."""
        from transformers import AutoModelForCausalLM

        st, quality, _ = open_zoo(zoo, small_path, large_path, point)
        auto: Any = AutoModelForCausalLM
        small = auto.from_pretrained(small_path, dtype=torch.float32).eval()
        large = auto.from_pretrained(large_path, dtype=torch.float32).eval()
        return cls(small, large, st, point, quality)

    def generate(self, prompt: Sequence[int], max_new: int) -> tuple[list[int], list[float]]:
        """Greedy tokens and the seconds each took."""
        self.front.reset()
        self.tail.reset()
        x = torch.tensor([list(prompt)])
        out, times = [], []
        for _ in range(max_new):
            began = time.perf_counter()
            with torch.inference_mode():
                logits = self.tail(self.stitch(self.front(x), self.point))
            tok = int(logits[0, -1].argmax())
            times.append(time.perf_counter() - began)
            out.append(tok)
            x = torch.tensor([[tok]])
        return out, times

    @property
    def param_bytes(self) -> int:
        return self.front.param_bytes + self.stitch.param_bytes + self.tail.param_bytes
