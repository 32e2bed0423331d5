"""`tessera bench NAME --json`: benchmarks are commands that print one JSON object.

Each benchmark lives next to the code it measures, in a module exposing
``add_arguments(parser)`` and ``run(args) -> dict``. This module only dispatches and
prints; it never times anything itself. To every JSON it adds `provenance` (machine,
commit, date, the machine's load: `tessera.bench.harness.provenance`) and warns on stderr
when the machine was not quiet. `$TESSERA_TRACE` replaces the default `--trace` of the
benches that replay the shared trace. A benchmark's module is imported only when its
command line is parsed (`tessera bench NAME ...`): most import torch, which the
control-plane image does not have, and `tessera --help` stays light. The listing of
`tessera bench --help` reads each module's docstring from its source, without importing it.
`--record` also writes the JSON to docs/bench-results/NAME.json, and `python -m
tessera.cli.bench` renders those files into docs/benchmarks.md (`tessera.bench.report`).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.bench import harness, report

# bench name -> module implementing add_arguments(parser) and run(args) -> dict
BENCHES: dict[str, str] = {
    "engine": "tessera_agent.bench_engine",
    "copy": "tessera_agent.bench_copy",
    "tp": "tessera_agent.bench_tp",
    "prefix": "tessera_agent.bench_prefix",
    "kvmove": "tessera_agent.bench_kvmove",
    "serve": "tessera.cli.bench_serve",
    "relayout": "tessera.cli.bench_relayout",
    "switch": "tessera.cli.bench_switch",
    "coldstart": "tessera.cli.bench_coldstart",
    "adaptive": "tessera.cli.bench_adaptive",
    "planner": "tessera.planner.bench",
    "predictor": "tessera.workload.bench",
    "reconcile": "tessera_operator.bench_reconcile",
    "chaos": "tessera.cli.bench_chaos",
    "transition": "tessera.policies.transition.plan_bench",
    "sim": "tessera.sim.bench",
    "variants": "tessera.cli.bench_variants",
    "scaling": "tessera.cli.bench_scaling",
    "overload": "tessera.cli.bench_overload",
    "kvdispatch": "tessera.cli.bench_kv_dispatch",
    "prefill": "tessera_agent.bench_prefill",
    "decode-attn": "tessera_agent.bench_decode_attn",
    "speculate": "tessera.cli.bench_speculate",
    "stitch": "tessera.cli.bench_stitch",
    "abuse": "tessera.cli.bench_abuse",
    "gpu": "tessera_agent.bench_gpu",
    "wake": "tessera.cli.bench_wake",
    "autoscale": "tessera.cli.bench_autoscale",
}


def register(sub: Any) -> None:
    """Add `tessera bench <name>` subcommands for every benchmark module present."""
    parser = sub.add_parser("bench", help="run a benchmark and print one JSON object")
    bsub = parser.add_subparsers(dest="bench", metavar="NAME", parser_class=_BenchParser)
    bsub.required = True
    for name, module_name in BENCHES.items():
        summary = _summary(module_name)
        if summary is None:
            continue  # not implemented yet
        p = bsub.add_parser(name, help=summary, module_name=module_name)
        p.set_defaults(func=_runner(module_name))


def _summary(module_name: str) -> str | None:
    """First docstring line of a module, read from its source; None when it does not exist."""
    try:
        spec = importlib.util.find_spec(module_name)
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None:
        return None
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else module_name


class _BenchParser(argparse.ArgumentParser):
    """One benchmark's parser: imports its module and adds its arguments on first use."""

    def __init__(self, *args: Any, module_name: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._module_name = module_name
        self._loaded = not module_name

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            module = importlib.import_module(self._module_name)
            self.add_argument("--json", action="store_true", help="print only the JSON object")
            self.add_argument(
                "--record",
                action="store_true",
                help="also write it to docs/bench-results/NAME.json (then: python -m "
                "tessera.cli.bench rewrites docs/benchmarks.md)",
            )
            module.add_arguments(self)
            trace = os.environ.get("TESSERA_TRACE")
            if trace and any(a.dest == "trace" for a in self._actions):
                self.set_defaults(trace=Path(trace))

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._load()
        return super().format_help()


def _runner(module_name: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        # Agents a bench starts run eagerly unless asked: their decode compiles in the
        # background after each load (issue 16), which would move figures mid-run.
        os.environ.setdefault("TESSERA_COMPILE_DECODE", "0")
        from tessera.rpc import transport

        # the TLS files of the bench's clients of agents it reaches by address (None: plaintext)
        args.tls = transport.tls_from_dir(os.environ.get(transport.TLS_DIR_ENV, ""))
        module = importlib.import_module(module_name)
        result: dict[str, Any] = module.run(args)
        result["provenance"] = harness.provenance()
        # the agents' decode as this bench started them: "0" eager (the benches' default),
        # else the compiled decode's mode (`tessera agent` compiles on CPU by default)
        result["provenance"]["agent_compile_decode"] = os.environ["TESSERA_COMPILE_DECODE"]
        if not result["provenance"]["quiet"]:
            sys.stderr.write(
                f"tessera bench {args.bench}: the machine was busy (load "
                f"{result['provenance']['load_per_cpu']} per cpu): compare ratios only\n"
            )
        if getattr(args, "record", False):
            argv = sys.argv[sys.argv.index(args.bench) + 1 :] if args.bench in sys.argv else []
            command = shlex.join(["tessera", "bench", args.bench, *argv])
            sys.stderr.write(f"recorded in {report.record(args.bench, command, result)}\n")
        if args.json:
            sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        else:
            sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
        return 0

    return run


def report_text() -> str:
    """docs/benchmarks.md as the results files make it (benchmarks in this order)."""
    return report.render(report.load(), [*BENCHES, "vllm-anchor"])


if __name__ == "__main__":  # python -m tessera.cli.bench: rewrite docs/benchmarks.md
    report.DOC.write_text(report_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {report.DOC}\n")
