"""`tessera` console script: builds the argument parser from one module per command group.

Each command module exposes ``register(subparsers)`` which adds its parser and sets
``func`` (a callable taking the parsed namespace and returning an exit code). This is the
only place that composes the core, the agent and the operator packages, and it does so
lazily so that ``tessera --help`` stays fast and light.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Command groups, in help order. Each module has `register(subparsers) -> None`.
COMMAND_MODULES: tuple[str, ...] = (
    "tessera.cli.model_cmd",
    "tessera.cli.generate_cmd",
    "tessera.cli.agent_cmd",
    "tessera.cli.gateway_cmd",
    "tessera.cli.up_cmd",
    "tessera.cli.validate_cmd",
    "tessera.cli.operator_cmd",
    "tessera.cli.plan_cmd",
    "tessera.cli.profile_cmd",
    "tessera.cli.calibrate_cmd",
    "tessera.cli.sim_cmd",
    "tessera.cli.workload_cmd",
    "tessera.cli.bench",
    "tessera.cli.demo_cmd",
)


_OWN_PACKAGES = frozenset({"tessera", "tessera_agent", "tessera_operator"})


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every available command group registered."""
    parser = argparse.ArgumentParser(
        prog="tessera", description="Block-granular LLM serving control plane."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command group not written yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tessera` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        code = args.func(args)
    except ModuleNotFoundError as exc:
        # The control-plane image (Dockerfile) installs only what `tessera operator` and
        # `tessera gateway` import: no torch, no transformers.
        top = (exc.name or "").partition(".")[0]
        if not top or top in _OWN_PACKAGES:
            raise
        sys.stderr.write(
            f"tessera: this command needs the Python module {top!r}, which is not installed "
            "here (the control-plane image has only what `tessera operator` and "
            "`tessera gateway` need; run it from the agent image)\n"
        )
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
