"""`tessera profile --agent ADDR --out FILE`: a measured cost profile from a real agent.

Asks the agent to time one decoder layer and the LM head of the checkpoint on one of its
devices (`Profile` RPC), fits the planner's cost model to the samples
(`tessera.cost.fit.fit_profile`) and writes the profile JSON (`"source": "measured"`).
On a GPU node the command is the same; there the interconnect comes from the analytic
device spec. For CPU devices the pipeline-hop link is the loopback gRPC path: its latency
is measured here with Describe round trips, its bandwidth is a stated nominal figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LOOPBACK_BANDWIDTH = 1e9  # bytes/s, nominal for gRPC over loopback (stated, not measured)


def register(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure a cost profile on an agent")
    p.add_argument("--agent", required=True, help="agent address host:port")
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="checkpoint directory (default: the model of the agent's first block)",
    )
    p.add_argument("--device", default="", help="agent device (default: its first)")
    p.add_argument(
        "--device-type",
        default="",
        help="profile device name (default: the agent's device kind, e.g. cpu)",
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--prefill", default="16,32,64,128,256")
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--contexts", default="32,128,512")
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(func=_run)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _loopback_latency(stub: Any) -> float:
    from tessera.rpc.v1 import agent_pb2 as pb

    samples = []
    for _ in range(20):
        t = time.perf_counter()
        stub.Describe(pb.DescribeRequest(), timeout=10)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _run(args: argparse.Namespace) -> int:
    import grpc

    from tessera import fields, model_facts
    from tessera.cost import fit, model_shape, profile
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    stub = pb_grpc.AgentStub(transport.sync_channel(args.agent))
    if args.model is None:
        try:
            blocks = stub.ListBlocks(pb.ListBlocksRequest(), timeout=30).blocks
        except grpc.RpcError as exc:
            sys.stderr.write(
                f"tessera profile: agent {args.agent}: {exc.code().name}: {exc.details()}\n"
            )
            return 1
        if not blocks:
            sys.stderr.write("tessera profile: the agent holds no block; pass --model DIR\n")
            return 1
        args.model = Path(blocks[0].model_path)
    try:
        config = model_facts.read_config(args.model)
        shape = model_shape.from_hf_config(config, args.model.name)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"tessera profile: --model {args.model}: {exc}\n")
        return 1
    try:
        reply = stub.Profile(
            pb.ProfileRequest(
                model_path=str(args.model.resolve()),
                device=args.device,
                prefill_tokens=_ints(args.prefill),
                decode_batches=_ints(args.batches),
                context_lens=_ints(args.contexts),
                repeats=args.repeats,
            ),
            timeout=1800,
        )
        latency = _loopback_latency(stub)
    except grpc.RpcError as exc:
        sys.stderr.write(
            f"tessera profile: agent {args.agent}: {exc.code().name}: {exc.details()}\n"
        )
        return 1
    device = args.device_type or reply.device_kind
    samples = [
        fit.LayerTiming(t.kind, t.size, t.context_len, t.tp, t.seconds_per_layer)
        for t in reply.timings
    ]
    comm = None
    if reply.device_kind == "cpu":
        link = profile.Link(bandwidth_bytes_per_s=LOOPBACK_BANDWIDTH, latency_s=latency)
        comm = profile.CommSpec(intra_node=link, inter_node=link, allreduce_per_layer=0)
    try:
        prof = fit.fit_profile(samples, shape, device, comm)
    except fields.FieldError as exc:
        sys.stderr.write(f"tessera profile: {exc}\n")
        return 1
    doc = prof.to_json()
    doc.setdefault(
        "measurement",
        {
            "agent": args.agent,
            "device": reply.device,
            "torch_threads": reply.torch_threads,
            "pp_hop_latency_s": latency,
            "pp_hop_bandwidth": "nominal 1 GB/s loopback (not measured)"
            if reply.device_kind == "cpu"
            else "analytic",
            "samples": [
                {
                    "kind": s.kind,
                    "size": s.size,
                    "context_len": s.context_len,
                    "seconds_per_layer": s.seconds_per_layer,
                }
                for s in samples
            ],
        },
    )
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    sys.stdout.write(
        f"wrote measured profile for {shape.name} on {device} "
        f"({len(samples)} samples) to {args.out}\n"
    )
    return 0
