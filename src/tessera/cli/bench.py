"""`tessera bench NAME --json`: benchmarks are commands that print one JSON object.

Each benchmark lives next to the code it measures, in a module exposing
``add_arguments(parser)`` and ``run(args) -> dict``. This module only dispatches and
prints; it never times anything itself.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

# bench name -> module implementing add_arguments(parser) and run(args) -> dict
BENCHES: dict[str, str] = {
    "engine": "tessera_agent.bench_engine",
    "copy": "tessera_agent.bench_copy",
    "prefix": "tessera_agent.bench_prefix",
    "kvmove": "tessera_agent.bench_kvmove",
    "serve": "tessera.cli.bench_serve",
    "planner": "tessera.planner.bench",
    "predictor": "tessera.workload.bench",
    "reconcile": "tessera_operator.bench_reconcile",
    "sim": "tessera.sim.bench",
}


def register(sub: Any) -> None:
    """Add `tessera bench <name>` subcommands for every benchmark module present."""
    parser = sub.add_parser("bench", help="run a benchmark and print one JSON object")
    bsub = parser.add_subparsers(dest="bench", metavar="NAME")
    bsub.required = True
    for name, module_name in BENCHES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # not implemented yet
            raise
        p = bsub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--json", action="store_true", help="print only the JSON object")
        module.add_arguments(p)
        p.set_defaults(func=_runner(module))


def _runner(module: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        result: dict[str, Any] = module.run(args)
        if args.json:
            sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        else:
            sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
        return 0

    return run
