"""`tessera model surrogate`: fit a bottleneck block's surrogate and keep it in the zoo.

`surrogate MODEL --layers A B --zoo DIR` cuts the checkpoint at `[0, A, B, L)`, fits a
low-rank surrogate of the block `[A, B)` on random calibration token sequences
(`tessera_agent.surrogate.fit_low_rank`, the last one held out), stores it with its
measured quality in the zoo folder (`tessera_agent.surrogate_zoo.save`), and prints the
record. A `speculate` variant names this entry (docs/variants.md). Registered by
`tessera.cli.model_cmd`; the agent package is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(msub: Any) -> None:
    p = msub.add_parser("surrogate", help="fit a block's low-rank surrogate into the zoo")
    p.add_argument("model", type=Path)
    p.add_argument("--layers", type=int, nargs=2, required=True, metavar=("A", "B"))
    p.add_argument("--zoo", type=Path, required=True, help="zoo folder to store it in")
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--sequences", type=int, default=9, help="calibration sequences (1 held out)")
    p.set_defaults(func=_surrogate)


def _surrogate(args: argparse.Namespace) -> int:
    import random

    import torch
    from transformers import AutoModelForCausalLM

    from tessera_agent import block_parts, surrogate, surrogate_zoo

    torch.set_num_threads(1)
    auto: Any = AutoModelForCausalLM
    model = auto.from_pretrained(args.model, dtype=torch.float32).eval()
    a, b = args.layers
    layers = model.config.num_hidden_layers
    if not 1 <= a < b < layers:
        sys.stderr.write(f"tessera model surrogate: need 1 <= A < B < {layers} (the model's)\n")
        return 2
    parts = block_parts.cut(model, [0, a, b, layers])
    rng = random.Random(0)
    vocab = model.config.vocab_size
    calib = [[rng.randrange(vocab) for _ in range(64)] for _ in range(max(2, args.sequences))]
    fit = surrogate.fit_low_rank(parts, 1, calib, args.rank)
    where = surrogate_zoo.save(args.zoo, args.model, (a, b), fit)
    record = json.loads((where / "surrogate.json").read_text())
    sys.stdout.write(json.dumps({"zoo_entry": str(where), **record}, sort_keys=True) + "\n")
    return 0
