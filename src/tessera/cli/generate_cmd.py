"""`tessera generate MODEL --prompt TEXT`: run the block engine in this process.

A quick way to see a checkpoint generate through Tessera's own engine (optionally cut
into pipeline stages) without starting agents or a gateway.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text with the engine in-process")
    p.add_argument("model", type=Path, help="Hugging Face checkpoint directory")
    p.add_argument("--prompt", default="The quick brown fox")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stages", default="", help="layer ranges, e.g. 0:4,4:8 (default: one stage)")
    p.set_defaults(func=_run)


def _splits(text: str, num_layers: int) -> list[tuple[int, int]]:
    if not text:
        return [(0, num_layers)]
    out = []
    for part in text.split(","):
        a, _, b = part.partition(":")
        out.append((int(a), int(b)))
    return out


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from tokenizers import Tokenizer

    from tessera_agent.engine import config, errors, sampling
    from tessera_agent.engine import generate as gen

    try:
        cfg = config.ModelConfig.from_path(args.model)
        tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
        params = sampling.SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
        )
        prompt = tok.encode(args.prompt).ids
        tokens = asyncio.run(
            gen.generate_in_process(
                args.model, _splits(args.stages, cfg.num_layers), prompt, params
            )
        )
    except (errors.EngineError, FileNotFoundError, ValueError) as exc:
        sys.stderr.write(f"tessera generate: {exc}\n")
        return 1
    sys.stdout.write(args.prompt + tok.decode(tokens, skip_special_tokens=True) + "\n")
    return 0
