"""The command-line options several benchmarks share, declared once.

Each benchmark's `add_arguments(parser)` calls these for the knobs it has in common with
others (the workload seed, the arrival rate, the tiny checkpoint's size) and declares only
its scenario's own. Defaults stay the benchmark's: they are arguments here. Called by the
`tessera.cli.bench_*` and `tessera_agent.bench_*` modules.
"""

from __future__ import annotations

import argparse


def add_seed(parser: argparse.ArgumentParser) -> None:
    """`--seed` (default 0): the workload's random seed."""
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload")


def add_rate(parser: argparse.ArgumentParser, default: float, what: str = "requests") -> None:
    """`--rate`: arrivals of `what` per second."""
    parser.add_argument("--rate", type=float, default=default, help=f"{what} per second")


def add_tiny_model(parser: argparse.ArgumentParser, *, hidden: int, layers: int) -> None:
    """`--hidden` and `--layers` of the tiny checkpoint the benchmark builds."""
    parser.add_argument("--hidden", type=int, default=hidden, help="tiny model's hidden size")
    parser.add_argument("--layers", type=int, default=layers, help="tiny model's layers")


def add_via(parser: argparse.ArgumentParser, local: str, local_help: str, op_help: str) -> None:
    """`--via LOCAL|operator` (default LOCAL): who runs the loop under test."""
    parser.add_argument(
        "--via",
        choices=(local, "operator"),
        default=local,
        help=f"{local}: {local_help}; operator: {op_help}",
    )


def add_tls(parser: argparse.ArgumentParser) -> None:
    """`args.tls` (no flag), None: the TLS files of the agents the benchmark reaches by
    address; None is plaintext. `tessera bench` fills it from the environment, so a caller
    that parses a benchmark's own arguments gets plaintext unless it sets it."""
    parser.set_defaults(tls=None)
