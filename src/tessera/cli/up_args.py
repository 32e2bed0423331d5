"""The flags of `tessera up` (all but `--state-file`, which `tessera status` shares).

`add_arguments(parser)` declares them with their defaults and help; `up_cmd.register`
calls it. What each flag does is `up_cmd._serve`'s, the loops' and docs/cli.md's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tessera.cli import local_agents

# The local agents' niceness (`--agent-nice`); why: docs/overload.md, "The gateway starved
# of CPU".
UP_AGENT_NICE = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`tessera up`'s flags on the `up` sub-parser `p`."""
    p.add_argument("-f", "--file", type=Path, required=True, help="ServingDeployment manifest")
    p.add_argument(
        "--agents",
        type=int,
        default=0,
        help="local agents to start (default: as many as the layout names, or 2)",
    )
    p.add_argument(
        "--devices",
        default="cpu:1x2GiB",
        help="devices of each local agent (cpu:1x2GiB, cuda, cuda:N; see `tessera agent`)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="fraction of each GPU's memory a local agent may use (its flag of that name)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per local agent (default: the cores less one for the gateway / agents)",
    )
    p.add_argument(
        "--agent-nice",
        type=local_agents.niceness,
        default=UP_AGENT_NICE,
        help="niceness of the local agents (0-19): the gateway and the control loops, which "
        "serve their requests, get the cores first (docs/overload.md, 'The gateway starved "
        "of CPU')",
    )
    p.add_argument(
        "--agent",
        action="append",
        default=[],
        help="use a running agent NAME=HOST:PORT instead of local ones (repeat)",
    )
    p.add_argument(
        "--model-root",
        type=Path,
        default=None,
        help="folder the local agents may load checkpoints from (their --model-root; "
        "default: the one holding the model and every variant of the manifest)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="gateway port (default: manifest)")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="cost profile JSON (from `tessera profile`) for layout: auto",
    )
    p.add_argument("--reconcile-interval", type=float, default=10.0)
    p.add_argument(
        "--scaling-interval",
        type=float,
        default=5.0,
        help="seconds between module-scaling ticks (when spec.policies.scaling.enabled)",
    )
    p.add_argument(
        "--arrival-span", type=float, default=10.0, help="span of the gateway's arrival counts (s)"
    )
    p.add_argument(
        "--watch-interval",
        type=float,
        default=1.0,
        help="seconds between checks of the manifest (a saved change is applied)",
    )
    p.add_argument(
        "--drain-deadline",
        type=float,
        default=30.0,
        help="seconds a leaving replica's requests may finish there before they move",
    )
    p.add_argument(
        "--sourcing",
        choices=("switch", "block", "storage"),
        default="switch",
        help="where a transition's loads copy parameters from: switch (the OServe switch "
        "plan: parts from peers, same agent first), block (one peer holding all), storage",
    )
