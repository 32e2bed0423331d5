"""`tessera gateway`: run the OpenAI-compatible HTTP gateway in front of running agents.

Registered by `tessera.cli.main`. Builds a `GatewayConfig` from the flags, starts the
gateway and serves until SIGINT/SIGTERM. Replicas come from `--replica ID=HOST:PORT`
(the replica's leader agent) or from a `--routes` JSON file re-read when it changes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tessera.gateway import config as gateway_config


def register(sub: Any) -> None:
    p = sub.add_parser("gateway", help="run the OpenAI-compatible HTTP gateway")
    p.add_argument("--model-name", default="", help="served model name (the `model` field)")
    p.add_argument("--model-path", default="", help="checkpoint directory (tokenizer, config)")
    p.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="ID=HOST:PORT",
        help="a replica and its leader agent (repeatable)",
    )
    p.add_argument("--routes", default="", metavar="FILE", help="routes JSON, re-read on change")
    p.add_argument(
        "--live-classes",
        default="",
        metavar="FILE",
        help="live classifier JSON typing arrivals (docs/switching.md); default: route classes",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls")
    p.add_argument(
        "--api-keys-file",
        default=os.environ.get("TESSERA_API_KEYS_FILE", ""),
        help="accepted API keys, one per line (KEY or NAME KEY); unset: no authentication",
    )
    p.add_argument(
        "--admin-token-file",
        default=os.environ.get("TESSERA_ADMIN_TOKEN_FILE", ""),
        help="the operator's token for /admin/ (its first line); with API keys on and none "
        "given, /admin/ answers 403",
    )
    p.add_argument("--max-body-bytes", type=int, default=2 << 20)
    p.add_argument("--max-prompt-tokens", type=int, default=0, help="0: the model's context")
    p.add_argument("--max-tokens-limit", type=int, default=0, help="largest max_tokens (0: any)")
    p.add_argument("--max-n", type=int, default=0, help="largest n (0: the parser's bound)")
    p.add_argument("--max-concurrent-per-key", type=int, default=0, help="0: unlimited")
    p.add_argument(
        "--max-in-flight-per-replica",
        type=int,
        default=256,
        help="429 with Retry-After beyond this many requests per ready replica (0: off)",
    )
    p.add_argument(
        "--no-kv-dispatch",
        action="store_true",
        help="route by least outstanding tokens instead of KV owner first (docs/variants.md)",
    )
    p.add_argument(
        "--generate-mux",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one multiplexed GenerateMux stream per replica instead of one Generate call per "
        "request (default: on, unless TESSERA_GENERATE_MUX=0; docs/gateway.md)",
    )
    p.add_argument(
        "--hold-max",
        type=int,
        default=256,
        help="requests held while no replica is awake (503 beyond; 0: no holding)",
    )
    p.add_argument(
        "--hold-deadline",
        type=float,
        default=60.0,
        help="seconds a request is held for a replica to wake (then 503 + Retry-After)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tessera.gateway import config, hold, limits
    from tessera.observability import tracing
    from tessera.rpc import transport

    tracing.configure(os.environ)
    try:
        cfg = config.GatewayConfig(
            model_name=args.model_name,
            model_path=args.model_path,
            host=args.host,
            port=args.port,
            replicas=tuple(config.parse_replica(r) for r in args.replica),
            routes_file=args.routes,
            live_classes_file=args.live_classes,
            poll_interval_s=args.poll_interval,
            max_body_bytes=args.max_body_bytes,
            api_keys_file=args.api_keys_file,
            admin_token_file=args.admin_token_file,
            kv_dispatch=not args.no_kv_dispatch,
            generate_mux=(
                config.generate_mux_from(os.environ)
                if args.generate_mux is None
                else args.generate_mux
            ),
            hold=hold.HoldConfig(max_held=args.hold_max, deadline_s=args.hold_deadline),
            tls=transport.tls_from_dir(os.environ.get(transport.TLS_DIR_ENV, "")),
            limits=limits.Limits(
                max_prompt_tokens=args.max_prompt_tokens,
                max_tokens=args.max_tokens_limit,
                max_n=args.max_n,
                max_concurrent_per_key=args.max_concurrent_per_key,
                max_in_flight_per_replica=args.max_in_flight_per_replica,
            ),
        )
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        from tessera import event_loop

        transport.warn_if_plaintext(logging.getLogger("tessera.gateway"), cfg.tls)

        return event_loop.run(_serve(cfg))
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"tessera gateway: {exc}\n")
        return 1


async def _serve(cfg: gateway_config.GatewayConfig) -> int:
    from tessera import gc_heap
    from tessera.gateway import server

    settle = None
    if gc_heap.wanted(os.environ):  # this process owns its heap (see gc_heap)
        settle = functools.partial(gc_heap.settle, "gateway started")
    # settled before its first poll can make `/health` say OK
    handle = await server.start_gateway(cfg, before_ready=settle)
    sys.stdout.write(f"gateway listening on {handle.url}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await handle.stop()
    return 0
