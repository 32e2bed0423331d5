"""`tessera demo`: the main job behind `make demo`.

Makes the default tiny checkpoint under `.demo/` (once) and generates from it through the
block engine, split into two pipeline stages. (Serving over HTTP arrives with
`tessera up`.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tessera.cli import main as cli_main


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="make a tiny checkpoint and run it")
    p.add_argument("--dir", type=Path, default=Path(".demo"))
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    model = args.dir / "tiny-llama"
    if not (model / "config.json").is_file():
        if cli_main.main(["model", "make-tiny", str(model)]) != 0:
            return 1
    sys.stdout.write("generating through a 2-stage pipeline (layers 0-4, 4-8):\n")
    return cli_main.main(
        [
            "generate",
            str(model),
            "--prompt",
            "Once upon a time",
            "--stages",
            "0:4,4:8",
            "--max-tokens",
            "24",
        ]
    )
