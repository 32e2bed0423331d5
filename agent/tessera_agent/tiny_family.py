"""A tiny model family of two widths trained here on the same data, so that their blocks
are equivalent for a reason (they learned one language), not by chance.

The data is a synthetic language: a first-order Markov chain over `STATES` token ids, each
id followed by one of 4 successors with probabilities 0.55 / 0.25 / 0.15 / 0.05, all drawn
from a seeded generator. `make_family(out)` writes `out/small` (hidden 64, 4 layers) and
`out/large` (hidden 128, 6 layers), both `tiny_checkpoint` Llama checkpoints with the same
tokenizer, trained for `steps` AdamW steps on sequences of that language (float32, CPU,
about half a minute each on a quiet core). `heldout(n)` draws sequences the training never
saw (another seed). Callers: `tessera model make-family`, `tessera bench stitch`, tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tessera_agent import tiny_checkpoint

STATES = 256
FIRST_ID = 3  # ids below are the tokenizer's specials
PROBS = (0.55, 0.25, 0.15, 0.05)
SEQ = 64
TRAIN_SEED = 1
HELDOUT_SEED = 2


@dataclass(frozen=True)
class Member:
    """One width of the family."""

    name: str
    hidden: int
    layers: int
    heads: int = 4
    kv_heads: int = 2


SMALL = Member("small", 64, 4)
LARGE = Member("large", 128, 6)


def successors() -> torch.Tensor:
    """`STATES x 4` successor ids of every state (fixed: seed 0)."""
    gen = torch.Generator().manual_seed(0)
    return torch.stack([torch.randperm(STATES, generator=gen)[:4] for _ in range(STATES)])


def sample(n: int, seed: int, length: int = SEQ) -> torch.Tensor:
    """`n` sequences of the language (token ids), from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    succ = successors()
    probs = torch.tensor(PROBS)
    state = torch.randint(0, STATES, (n,), generator=gen)
    cols = [state]
    for _ in range(length - 1):
        pick = torch.multinomial(probs.expand(n, -1), 1, generator=gen)[:, 0]
        state = succ[state, pick]
        cols.append(state)
    return torch.stack(cols, dim=1) + FIRST_ID


def heldout(n: int) -> torch.Tensor:
    """Sequences no training step saw."""
    return sample(n, HELDOUT_SEED)


def train(path: Path, steps: int, batch: int = 16, lr: float = 3e-3) -> list[float]:
    """Train the checkpoint at `path` in place on the language; the loss per step."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    data = sample(steps * batch, TRAIN_SEED)
    losses = []
    for s in range(steps):
        ids = data[s * batch : (s + 1) * batch]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    for f in path.glob("*.safetensors"):
        f.unlink()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "model.safetensors.index.json").unlink(missing_ok=True)
    return losses


def make_family(out: Path, steps: int = 200) -> dict[str, Any]:
    """Write and train `out/small` and `out/large`; return what was done (losses)."""
    report: dict[str, Any] = {"language": f"markov-{STATES}-states-seed0", "steps": steps}
    for m in (SMALL, LARGE):
        spec = tiny_checkpoint.TinySpec(
            layers=m.layers, hidden=m.hidden, heads=m.heads, kv_heads=m.kv_heads, seed=1
        )
        path = tiny_checkpoint.make_tiny(out / m.name, spec)
        losses = train(path, steps)
        report[m.name] = {
            "path": str(path),
            "hidden": m.hidden,
            "layers": m.layers,
            "loss_first": round(losses[0], 4),
            "loss_last": round(sum(losses[-10:]) / 10, 4),
        }
    (out / "family.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report
