"""`tessera model make-family` and `tessera model stitch`: BlockLLM's stitching blocks.

`make-family OUT` trains the tiny two-width family (`tessera_agent.tiny_family`) into
OUT/small and OUT/large. `stitch SMALL LARGE --zoo DIR` trains a stitching block between
two checkpoints of that family (`tessera_agent.stitch`), measures it on held-out sequences
against the large model alone, stores it in the zoo folder with its quality, and prints
the record. Registered by `tessera.cli.model_cmd`; the agent package is imported only
when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(msub: Any) -> None:
    p = msub.add_parser("make-family", help="train the tiny two-width family (about a minute)")
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=200)
    p.set_defaults(func=_make_family)
    p = msub.add_parser("stitch", help="train a stitching block between two widths")
    p.add_argument("small", type=Path)
    p.add_argument("large", type=Path)
    p.add_argument("--zoo", type=Path, required=True, help="zoo folder to store it in")
    p.add_argument("--steps-per-point", type=int, default=20)
    p.add_argument("--joint-steps", type=int, default=240)
    p.set_defaults(func=_stitch)


def _make_family(args: argparse.Namespace) -> int:
    import torch

    from tessera_agent import tiny_family

    torch.set_num_threads(1)
    report = tiny_family.make_family(args.out, steps=args.steps)
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    return 0


def _stitch(args: argparse.Namespace) -> int:
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from tessera_agent import stitch, tiny_family

    torch.set_num_threads(1)
    auto: Any = AutoModelForCausalLM
    small = auto.from_pretrained(args.small, dtype=torch.float32).eval()
    large = auto.from_pretrained(args.large, dtype=torch.float32).eval()
    if small.config.vocab_size != large.config.vocab_size:
        sys.stderr.write("tessera model stitch: the two checkpoints' vocabularies differ\n")
        return 2
    points = stitch.default_points(small.config.num_hidden_layers, large.config.num_hidden_layers)
    began = time.perf_counter()
    st = stitch.train(
        small,
        large,
        tiny_family.sample(128, seed=7),
        points,
        steps_per_point=args.steps_per_point,
        joint_steps=args.joint_steps,
    )
    train_s = round(time.perf_counter() - began, 1)
    quality = stitch.measure(small, large, st, tiny_family.heldout(32), points)
    extra = {"heldout": "markov-heldout-seed2-32x64", "train_s": train_s}
    where = stitch.save(args.zoo, args.small, args.large, st, quality, extra)
    record = json.loads((where / "stitch.json").read_text())
    sys.stdout.write(json.dumps({"zoo_entry": str(where), **record}, sort_keys=True) + "\n")
    return 0
