"""`tessera model make-tiny`: write a tiny Llama-family checkpoint made locally (and the
stitching commands of `stitch_cmd`, the surrogate command of `surrogate_cmd`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tessera.cli import stitch_cmd, surrogate_cmd


def register(sub: Any) -> None:
    parser = sub.add_parser("model", help="model utilities")
    msub = parser.add_subparsers(dest="model_command", metavar="ACTION")
    msub.required = True
    p = msub.add_parser("make-tiny", help="write a tiny random-weight HF checkpoint")
    p.add_argument("out", type=Path)
    p.add_argument("--arch", choices=["llama", "qwen2", "mistral"], default="llama")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument(
        "--head-dim", type=int, default=0, help="attention head width (0 = hidden / heads)"
    )
    p.add_argument("--intermediate", type=int, default=0, help="MLP width (0 = ~2.75x hidden)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-positions", type=int, default=1024)
    p.add_argument("--rope-scaling", choices=["none", "llama3"], default="none")
    p.add_argument("--shards", type=int, default=1, help="write a sharded checkpoint")
    p.set_defaults(func=_make_tiny)
    stitch_cmd.register(msub)
    surrogate_cmd.register(msub)


def _make_tiny(args: argparse.Namespace) -> int:
    from tessera_agent import tiny_checkpoint as tc

    try:
        spec = tc.TinySpec(
            arch=args.arch,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            intermediate=args.intermediate,
            vocab=args.vocab,
            seed=args.seed,
            max_positions=args.max_positions,
            rope_scaling=args.rope_scaling,
            shards=args.shards,
        )
    except ValueError as exc:
        sys.stderr.write(f"tessera model make-tiny: {exc}\n")
        return 2
    out = tc.make_tiny(args.out, spec)
    sys.stdout.write(
        f"wrote {spec.arch} checkpoint ({spec.layers} layers, hidden "
        f"{spec.hidden}, vocab {spec.vocab}, seed {spec.seed}) to {out}\n"
    )
    return 0
