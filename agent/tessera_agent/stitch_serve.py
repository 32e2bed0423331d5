"""Serving a stitched chain on the agents (BlockLLM §4.4, issue 35): the front's hand-off.

A stitched chain is a replica whose first blocks are a small model's layers `[0, i)` and
whose later blocks are a large model's layers `[j, L)` (`tessera.policies.variants.stitch_chains`).
The last front block carries the stitch (`Block.stitch_zoo`, `stitch_to`, `stitch_at`):
at load `prepare` finds the stitch the zoo holds for (its model, the large one) and is
refused when none was trained for these checkpoints or the point `(i, j)` was not
measured (`stitch.open_zoo`); every step's hidden states then go through it before they
leave for the next stage (`Stitched`, a `replica.Downstream` around the link, the stitch
run on the agent's compute thread). The next stage is a plain block of the large model:
it shares the large model's pieces in the zoo and co-batches with its chains. The hello
names the large model and `j`, so the next stage's checks hold as for any chain.
Callers: `hosting.Hosting.load` (prepare), `leader.connector` and `stage_server.serve`
(wrap, hello), `variants.annotate` (the report in `BlockInfo.stitch`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera import blocks
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors, replica, step


@dataclass
class StitchHook:
    """A loaded stitch at one point, on the front block's device and dtype."""

    linear: torch.nn.Linear
    position: float  # the point's position input: (i + j) / (small + large layers)
    point: tuple[int, int]
    cosine: float  # the zoo's measured quality at `point`, vs the large model alone
    top1_agreement: float
    folder: str
    param_bytes: int

    def apply(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states of the small model [T, d_small] -> the large model's [T, d_large]."""
        with torch.inference_mode():
            h = hidden.to(self.linear.weight.dtype)
            pos = torch.full((h.shape[0], 1), self.position, dtype=h.dtype, device=h.device)
            out: torch.Tensor = self.linear(torch.cat([h, pos], dim=-1))
            return out


def prepare(
    spec: blocks.Block, cfg: config_mod.ModelConfig, device: torch.device, dtype: torch.dtype
) -> StitchHook:
    """The stitch a front block hands its hidden states through (module docstring);
    NotFoundError / FailedPreconditionError naming why it cannot serve."""
    from tessera_agent import stitch  # transformers: only agents that serve a stitch

    large = Path(spec.stitch_to)
    if not (large / "config.json").is_file():
        raise errors.NotFoundError(f"stitch: the next model {spec.stitch_to} has no config.json")
    try:
        large_cfg = config_mod.ModelConfig.from_path(large)
    except config_mod.ConfigError as exc:
        raise errors.InvalidArgumentError(f"stitch: {exc}") from exc
    if not 0 < spec.stitch_at < large_cfg.num_layers:
        raise errors.InvalidArgumentError(
            f"stitch: the next stage's first layer {spec.stitch_at} is outside "
            f"[1, {large_cfg.num_layers}) of {spec.stitch_to}"
        )
    if spec.end >= cfg.num_layers:
        raise errors.InvalidArgumentError(
            f"stitch: the front block ends at layer {spec.end}, the small model's last; "
            "a stitched front keeps the small model's head off"
        )
    point = (spec.end, spec.stitch_at)
    try:
        st, quality, folder = stitch.open_zoo(
            Path(spec.stitch_zoo), Path(spec.model_path), large, point
        )
    except LookupError as exc:
        raise errors.NotFoundError(f"stitch: {exc}") from exc
    except ValueError as exc:
        raise errors.FailedPreconditionError(f"stitch: {exc}") from exc
    lin = st.linear.to(device=device, dtype=dtype).eval()
    for p in lin.parameters():
        p.requires_grad_(False)
    return StitchHook(
        lin,
        sum(point) / st.depth,
        point,
        quality.cosine,
        quality.top1_agreement,
        str(folder),
        st.param_bytes,
    )


def hello(spec: blocks.Block, hook: StitchHook | None) -> pb.StageHello:
    """The hello to the next stage: the large model and `j` after a stitch, else this
    block's model and end."""
    if hook is None:
        return pb.StageHello(
            replica_id=spec.replica_id,
            stage_index=spec.stage_index + 1,
            layer_start=spec.end,
            model_path=spec.model_path,
        )
    return pb.StageHello(
        replica_id=spec.replica_id,
        stage_index=spec.stage_index + 1,
        layer_start=spec.stitch_at,
        model_path=spec.stitch_to,
    )


class Stitched:
    """The next stages seen through the stitch: hidden states are stitched, then sent."""

    def __init__(
        self,
        inner: replica.Downstream,
        hook: StitchHook,
        compute: concurrent.futures.Executor,
    ) -> None:
        self.inner, self.hook, self.compute = inner, hook, compute
        self.num_pages = inner.num_pages

    async def submit(self, inp: step.StepInput) -> step.StepOutput:
        if inp.hidden is not None:
            loop = asyncio.get_running_loop()
            hidden = await loop.run_in_executor(self.compute, self.hook.apply, inp.hidden)
            inp = dataclasses.replace(inp, hidden=hidden)
        return await self.inner.submit(inp)

    async def close(self) -> None:
        await self.inner.close()


def to_proto(spec: blocks.Block, hook: StitchHook) -> pb.BlockStitch:
    """`BlockInfo.stitch`: as loaded, with the quality the zoo measured at its point."""
    return pb.BlockStitch(
        zoo=spec.stitch_zoo,
        next_model_path=spec.stitch_to,
        next_layer_start=spec.stitch_at,
        cosine=hook.cosine,
        top1_agreement=hook.top1_agreement,
        param_bytes=hook.param_bytes,
        folder=hook.folder,
    )
