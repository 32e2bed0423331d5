"""What a loaded block wires up before it answers: its CUDA graphs and its stage links.

`capture_graphs` captures a CUDA-graph runner's buckets on the compute thread (the thread
that replays them) and books the graphs' pool and the rest of the load's reserve;
`link_stages` opens, in the background, rank 0's data-plane links to the neighbouring
stages and the sampled tokens' way back to the leader. Called by `hosting.Hosting._load`
after the stage is built and booked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from tessera import blocks
from tessera.policies.serving import gpu_memory
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import booking, hosted, stage_link
from tessera_agent.transfer import group

log = logging.getLogger("tessera_agent.hosting")


async def capture_graphs(
    h: hosted.Hosted,
    memory: booking.Booking,
    device_id: str,
    reserve: gpu_memory.LoadReserve | None,
    compute: concurrent.futures.Executor,
) -> None:
    """Capture `h`'s CUDA graphs on `compute` and book what they hold on `device_id`."""
    runner = h.stage.runner
    took = await asyncio.get_running_loop().run_in_executor(compute, runner.capture_graphs)
    g = runner.graphs
    assert g is not None  # the caller checked: a CUDA-graph runner
    log.info(
        "%s: %d CUDA graphs captured in %s s (%d past the budget; error: %s)",
        h.holder,
        len(g.buckets),
        "-" if took is None else f"{took:.1f}",
        g.skipped,
        g.error,
    )
    if g.pool_bytes:
        memory.book(device_id, f"{h.holder}/cuda-graphs", g.pool_bytes)
    if reserve is not None and g.capture_s is not None:
        left = reserve.total_bytes - reserve.graph_bytes
        memory.book(device_id, f"{h.holder}/reserve", left)


def link_stages(h: hosted.Hosted, spec: blocks.Block, data_plane: pb.DataPlane | None) -> None:
    """Rank 0's stage links over the data plane (formed in the background), if it has one."""
    if data_plane is not None and data_plane.store_address and spec.tp_rank == 0:
        t = data_plane.timeout_s or group.DEFAULT_TIMEOUT_S
        dp = (data_plane.store_address, data_plane.group)
        if not spec.is_last:  # stage links: rank 0 to rank 0, formed in the background
            h.link_down = stage_link.StageLink(stage_link.link_spec(*dp, spec.stage_index, 0, t))
        if spec.stage_index > 0:
            h.link_up = stage_link.StageLink(stage_link.link_spec(*dp, spec.stage_index - 1, 1, t))
        if spec.num_stages > 1 and (spec.is_last or spec.stage_index == 0):
            # the sampled tokens' way back: last stage (rank 0) to leader (rank 1)
            back = stage_link.StageLink(stage_link.return_spec(*dp, 0 if spec.is_last else 1, t))
            if spec.is_last:
                h.result_out = back
            else:
                h.result_in = back
