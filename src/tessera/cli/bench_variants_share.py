"""`tessera bench variants --share-equivalent`: the opted-in configuration's parameter bytes.

With the flag, each full fine-tune of the bench changes its first `--diff-layers` layer
only a little (noise std 0.002, below the 0.98 threshold's crossing) and the others as
usual (std 0.02). Besides the two configurations of `bench_variants`, this loads the
foundation and every full fine-tune's chain with `shareEquivalent` (threshold 0.98) on one
more agent and reports, per size: `param_bytes_shared_equivalent` (the zoo's bytes plus the
adapters, as `param_bytes_shared`), the layers shared beyond identity, and the quality the
agents measured (lowest `top1_agreement` and `final_cosine` over the fine-tunes). No
request stream runs on it: its tokens differ from the fine-tunes' by design (the report
measures how much). Called by `bench_variants` when the flag is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EQUIVALENT_STD = 0.002  # noise of a full fine-tune's first changed layer with the flag


def make_finetune(base: Path, out: Path, layers: list[int], seed: int) -> Path:
    """A fine-tune whose first layer in `layers` changes a little, the others as usual."""
    from tessera_agent import tiny_variants

    first = tiny_variants.make_tiny_finetune(
        base, out.with_name(out.name + "-eq"), layers=layers[:1], seed=seed, std=EQUIVALENT_STD
    )
    return tiny_variants.make_tiny_finetune(first, out, layers=layers[1:], seed=seed + 1)


async def measure(
    agent: Any, base: str, full: list[tuple[str, str]], kv: int, adapter_bytes: int
) -> dict[str, Any]:
    """Load `base` and each (name, checkpoint) of `full` opted in on `agent` (a
    `bench_agent_proc.AgentProc`), and report the bytes and the measured quality."""
    from tessera import blocks
    from tessera.rpc import blocks as rpc_blocks
    from tessera.rpc.v1 import agent_pb2 as pb

    layers = agent._layers(base)
    await agent.load("base", base, kv)
    shared: dict[str, list[int]] = {}
    top1, cosine = [], []
    for name, path in full:
        b = blocks.Block(
            path,
            0,
            layers,
            replica_id=f"eq-{name}",
            kv_bytes=kv,
            share_from=base,
            share_threshold=0.98,
        )
        reply = await agent.stub.LoadBlock(rpc_blocks.load_request(b), timeout=600)
        eq = reply.block.equivalence
        shared[name] = [x.layer for x in eq.layers if x.shared and not x.identical]
        top1.append(eq.top1_agreement)
        cosine.append(eq.final_cosine)
    d: pb.DescribeReply = await agent.describe()
    return {
        "param_bytes_shared_equivalent": int(d.zoo.param_bytes) + adapter_bytes,
        "equivalent_layers_shared": shared,
        "equivalence_top1_agreement_min": round(min(top1), 4) if top1 else None,
        "equivalence_final_cosine_min": round(min(cosine), 6) if cosine else None,
    }
