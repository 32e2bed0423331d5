"""Stage-to-stage hidden states over the data plane: a 2-rank group per pipeline link.

A replica loaded with a `data_plane` forms, in the background, the group `<group>/link<i>`
between the rank-0 blocks of stages i and i+1 (rank 0 sends). The step itself and the sampled
tokens still travel on the `StageStream` gRPC stream, which orders everything; a step whose
hidden states follow on the link says so (`StageStep.hidden_on_link`) and the receiver posts a
receive tagged with the step id. Sends and receives each run on one thread, in stream order.
Until the link forms, after it fails, or without a data plane, hidden states travel in the gRPC
message. A `<group>/return` link carries sampled token ids from the last stage to the leader
(`StageStep.result_on_link`); its gRPC result is then an empty acknowledgement.
Created by `hosting.Hosting.load`; used by `stage_client` (send) and `stage_server` (receive).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

import torch

from tessera_agent.transfer import group

log = logging.getLogger(__name__)

_TAG_MOD = 1 << 30


class StageLink:
    """One end of the link between two adjacent stages."""

    def __init__(self, spec: group.GroupSpec) -> None:
        self.spec = spec
        self.group: group.Group | None = None
        self.reason = ""
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stage-link")
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._settled = asyncio.Event()  # formed or failed; waiters wake in arrival order
        threading.Thread(target=self._form, name=f"link-{spec.name}", daemon=True).start()

    @property
    def ready(self) -> bool:
        return self.group is not None and self.group.failed is None and not self._closed

    def _form(self) -> None:
        try:
            g = group.form(self.spec, torch.device("cpu"))
        except group.GroupError as exc:
            self.reason = str(exc)
            log.warning(
                "stage link %s not formed (gRPC carries the activations): %s", self.spec.name, exc
            )
        else:
            if self._closed:
                g.close()
            else:
                self.group = g
        self._loop.call_soon_threadsafe(self._settled.set)

    async def settled(self) -> None:
        """Wait until the link is formed or has failed (the peer may finish forming first)."""
        await asyncio.wait_for(self._settled.wait(), self.spec.timeout_s)

    def send(self, hidden: torch.Tensor, step_id: int) -> asyncio.Future[None]:
        """Queue `hidden` for the next stage (in call order); the future ends when sent."""
        g = self.group
        assert g is not None
        t = hidden.detach().to("cpu").contiguous()  # gloo over TCP (an NCCL link: not built)
        return asyncio.wrap_future(self._io.submit(g.send, t, 1, step_id % _TAG_MOD))

    def receive(
        self, shape: tuple[int, ...], dtype: torch.dtype, step_id: int
    ) -> asyncio.Future[torch.Tensor]:
        """Post the receive of a step's hidden states (in call order)."""
        g = self.group
        if g is None:
            raise group.GroupError(f"stage link {self.spec.name} is not formed")
        buf = torch.empty(shape, dtype=dtype)
        return asyncio.wrap_future(self._io.submit(g.recv, buf, 0, step_id % _TAG_MOD))

    def close(self) -> None:
        self._closed = True
        if self.group is not None:
            self.group.close()
        self._io.shutdown(wait=False, cancel_futures=True)


def link_spec(
    dp_store: str, dp_group: str, index: int, rank: int, timeout_s: float, backend: str = "gloo"
) -> group.GroupSpec:
    """The group of link `index` (between stages index and index+1); rank 0 sends."""
    return group.GroupSpec(dp_store, f"{dp_group}/link{index}", rank, 2, backend, timeout_s)


def return_spec(
    dp_store: str, dp_group: str, rank: int, timeout_s: float, backend: str = "gloo"
) -> group.GroupSpec:
    """The group carrying sampled tokens from the last stage (rank 0) to the leader (rank 1)."""
    return group.GroupSpec(dp_store, f"{dp_group}/return", rank, 2, backend, timeout_s)
