"""`tessera demo`: the main job behind `make demo`.

Makes the default tiny checkpoint under `.demo/` (once), then serves it with
`tessera up -f examples/local-tiny.yaml`: two local agents, two replicas (one whole-model,
one 2-stage pipeline) behind the OpenAI-compatible gateway on localhost:8000.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tessera.cli import main as cli_main


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="make a tiny checkpoint and serve it on localhost:8000")
    p.add_argument("--dir", type=Path, default=Path(".demo"))
    p.add_argument("--manifest", type=Path, default=Path("examples/local-tiny.yaml"))
    p.add_argument("up_args", nargs="*", help="extra `tessera up` arguments (after --)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    model = args.dir / "tiny-llama"
    if not (model / "config.json").is_file():
        if cli_main.main(["model", "make-tiny", str(model)]) != 0:
            return 1
    return cli_main.main(["up", "-f", str(args.manifest), *args.up_args])
