"""`tessera operator`: run the Kubernetes operator reconciling ServingDeployments (kopf).

Registered by `tessera.cli.main`. Builds `tessera_operator.config.OperatorConfig` once
from flags, each defaulting to a `TESSERA_*` environment variable, and runs
`tessera_operator.runner`. Agents are either a static list (`--agent name=host:port`,
or `TESSERA_AGENTS="a=h:p,b=h:p"`) or the pods matching `--agent-selector`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def register(sub: Any) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    p.add_argument(
        "--agent",
        action="append",
        default=[a for a in _env("TESSERA_AGENTS").split(",") if a.strip()],
        metavar="NAME=HOST:PORT",
        help="a static agent (repeatable; env TESSERA_AGENTS, comma-separated); "
        "none: discover agent pods",
    )
    p.add_argument(
        "--agent-selector",
        default=_env("TESSERA_AGENT_SELECTOR", "app.kubernetes.io/component=agent"),
        help="label selector of the agent pods (env TESSERA_AGENT_SELECTOR)",
    )
    p.add_argument(
        "--agent-namespace",
        default=_env("TESSERA_AGENT_NAMESPACE"),
        help="namespace of the agent pods; empty: all (env TESSERA_AGENT_NAMESPACE)",
    )
    p.add_argument(
        "--agent-port",
        type=int,
        default=int(_env("TESSERA_AGENT_PORT", "50051")),
        help="gRPC port of the agent pods (env TESSERA_AGENT_PORT)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="serve this namespace (repeatable; env TESSERA_NAMESPACES, comma-separated)",
    )
    where.add_argument(
        "-A", "--all-namespaces", action="store_true", help="serve every namespace (default)"
    )
    p.add_argument(
        "--resync",
        type=float,
        default=float(_env("TESSERA_RESYNC_SECONDS", "10")),
        help="seconds between drift-repair passes per deployment (env TESSERA_RESYNC_SECONDS)",
    )
    p.add_argument(
        "--overload-tick",
        type=float,
        default=float(_env("TESSERA_OVERLOAD_TICK_SECONDS", "0.5")),
        help="seconds between overload-loop ticks per deployment (policy on)",
    )
    p.add_argument(
        "--scaling-tick",
        type=float,
        default=float(_env("TESSERA_SCALING_TICK_SECONDS", "5")),
        help="seconds between module-scaling ticks per deployment (policy on)",
    )
    p.add_argument(
        "--gateway-admin-url",
        default=_env("TESSERA_GATEWAY_ADMIN_URL"),
        help="base URL of a deployment's gateway for the loops' signals, {namespace} and "
        "{name} filled (default: the gateway Service)",
    )
    p.add_argument(
        "--gateway-admin-token-file",
        default=_env("TESSERA_GATEWAY_ADMIN_TOKEN_FILE"),
        help="the gateways' admin token (first line), sent on every pull of /admin/ and "
        "/metrics (the gateway's --admin-token-file; env TESSERA_GATEWAY_ADMIN_TOKEN_FILE)",
    )
    p.add_argument(
        "--model-root",
        default=_env("TESSERA_MODEL_ROOT", "/models"),
        help="where PVC checkpoints are mounted (env TESSERA_MODEL_ROOT)",
    )
    p.add_argument(
        "--allowed-model-root",
        action="append",
        default=[r for r in _env("TESSERA_ALLOWED_MODEL_ROOTS").split(",") if r.strip()],
        help="spec.model paths must lie under one of these (repeatable; default: the model "
        "root; env TESSERA_ALLOWED_MODEL_ROOTS, comma-separated)",
    )
    p.add_argument(
        "--allow-load-balancer",
        action="store_true",
        default=_env("TESSERA_ALLOW_LOAD_BALANCER") == "true",
        help="let specs ask for serviceType LoadBalancer (env TESSERA_ALLOW_LOAD_BALANCER=true)",
    )
    p.add_argument(
        "--allow-host-path",
        action="store_true",
        default=_env("TESSERA_ALLOW_HOST_PATH") == "true",
        help="let a checkpoint outside a PVC be mounted into gateways by hostPath "
        "(env TESSERA_ALLOW_HOST_PATH=true)",
    )
    p.add_argument(
        "--gateway-image",
        default=_env("TESSERA_GATEWAY_IMAGE"),
        help="image of the gateway pods (env TESSERA_GATEWAY_IMAGE; overrides the config file)",
    )
    p.add_argument(
        "--gateway-config",
        type=Path,
        default=Path(_env("TESSERA_GATEWAY_CONFIG")) if _env("TESSERA_GATEWAY_CONFIG") else None,
        help="JSON/YAML gateway template (image, resources, ...; see docs/operator.md)",
    )
    p.add_argument("--peering", default=_env("TESSERA_PEERING"), help="kopf peering name")
    p.add_argument("--priority", type=int, default=0, help="kopf peering priority")
    p.add_argument(
        "--liveness", default="", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument("--api-server", default="", help="Kubernetes API URL (default: in-cluster)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("TESSERA_OPERATOR_METRICS_PORT", "0")),
        help="serve the control loops' Prometheus /metrics on this port (0: off)",
    )
    p.add_argument(
        "--switching-calibration",
        type=Path,
        default=Path(_env("TESSERA_SWITCHING_CALIBRATION"))
        if _env("TESSERA_SWITCHING_CALIBRATION")
        else None,
        help="the latency model's calibration (`tessera calibrate --out`): corrected prices "
        "and per-layout errors as the switching hysteresis (env TESSERA_SWITCHING_CALIBRATION)",
    )
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.add_argument("--debug", action="store_true", help="debug logging (as --verbose)")
    p.add_argument("--quiet", action="store_true", help="warnings only")
    p.set_defaults(func=_run)


def _token(path: str) -> str:
    """The first non-empty line of `path` ("" when no path); OSError if unreadable."""
    if not path:
        return ""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return next((x.strip() for x in lines if x.strip()), "")


def build_config(args: argparse.Namespace) -> Any:
    """The validated `OperatorConfig` of the parsed flags."""
    import yaml

    from tessera.control import agents
    from tessera.policies.security import admission
    from tessera.rpc import transport
    from tessera_operator import config

    tmpl: dict[str, Any] = {}
    if args.gateway_config is not None:
        tmpl = yaml.safe_load(args.gateway_config.read_text(encoding="utf-8")) or {}
        if not isinstance(tmpl, dict):
            raise ValueError(f"{args.gateway_config}: expected a mapping")
    if args.gateway_image:
        tmpl["image"] = args.gateway_image
    from tessera.cost import calibration

    cal = None
    path = getattr(args, "switching_calibration", None)
    if path is not None:
        cal = calibration.load(json.loads(path.read_text(encoding="utf-8")))
    namespaces = list(args.namespace)
    if not namespaces and not args.all_namespaces:
        namespaces = [n for n in _env("TESSERA_NAMESPACES").split(",") if n.strip()]
    return config.OperatorConfig(
        agents=tuple(agents.static_agents(args.agent)),
        agent_selector=args.agent_selector,
        agent_namespace=args.agent_namespace,
        agent_port=args.agent_port,
        tls=transport.tls_from_dir(_env(transport.TLS_DIR_ENV)),
        namespaces=tuple(n.strip() for n in namespaces),
        resync_seconds=args.resync,
        overload_tick_seconds=args.overload_tick,
        scaling_tick_seconds=args.scaling_tick,
        gateway_admin_url=args.gateway_admin_url,
        gateway_admin_token=_token(args.gateway_admin_token_file),
        model_root=args.model_root,
        admission=admission.Limits(
            tuple(r.strip() for r in args.allowed_model_root) or (args.model_root,),
            allow_load_balancer=args.allow_load_balancer,
            allow_host_path=args.allow_host_path,
        ),
        gateway=config.GatewayTemplate.from_mapping(tmpl),
        api_server=args.api_server,
        peering=args.peering,
        priority=args.priority,
        liveness=args.liveness,
        switching_calibration=cal,
    )


def _run(args: argparse.Namespace) -> int:
    from tessera.observability import control, tracing

    tracing.configure(os.environ)
    level = (
        logging.DEBUG
        if args.verbose or args.debug
        else logging.WARNING
        if args.quiet
        else logging.INFO
    )
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = build_config(args)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"tessera operator: {exc}\n")
        return 1
    from tessera.rpc import transport
    from tessera_operator import runner

    transport.warn_if_plaintext(logging.getLogger("tessera.operator"), cfg.tls)
    if args.metrics_port:  # reconcile passes, transitions, switches (observability.control)
        control.serve(args.metrics_port)
    logging.getLogger("tessera.operator").info(
        "config: %s",
        json.dumps(
            {"agents": [a.name for a in cfg.agents], "namespaces": list(cfg.namespaces) or "all"}
        ),
    )
    return runner.run(cfg)
