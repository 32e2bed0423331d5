"""An agent's part in a tensor-parallel stage: one rank, its group, its state.

Created by the servicer's `LoadBlock` for a block with tp_size > 1, after the weights are
loaded. Joining the group blocks until every rank has loaded, so it runs on a thread of
its own and `LoadBlock` returns at once: rank 0 wraps the stage's runner in a
`tp_runner.TPRunner` (steps wait for the group, then broadcast to the other ranks), and
every other rank follows on its thread until rank 0 stops or the group fails. `state`
and `reason` are what `Describe` reports (`forming`, `ready`, `failed` and why); a failed
rank stays failed until the block is unloaded and loaded again, which forms a new group.
"""

from __future__ import annotations

import logging
import threading

import torch

from tessera_agent.engine import runner, stage, tp_runner
from tessera_agent.transfer import group

log = logging.getLogger(__name__)


class TPMember:
    """Rank `spec.rank` of a stage's TP group, formed in the background."""

    def __init__(self, st: stage.Stage, spec: group.GroupSpec, device: torch.device) -> None:
        self.spec, self._device = spec, device
        self.state = "forming"
        self.reason = ""
        self._group: group.Group | None = None
        self._base: runner.StageRunner = st.runner
        self.driver: tp_runner.TPRunner | None = None
        if spec.rank == 0:
            self.driver = tp_runner.TPRunner(st.runner)
            st.runner = self.driver  # the leader / stage server run it like any stage
        self._thread = threading.Thread(
            target=self._run, name=f"tp-{spec.name}-r{spec.rank}", daemon=True
        )
        self._thread.start()

    @property
    def backend(self) -> str:
        return self.spec.backend

    def status(self) -> tuple[str, str]:
        """(state, reason): the driver's view wins once it has seen a failure."""
        if self.driver is not None and self.state == "ready" and not self.driver.ready:
            return "failed", self.driver.reason
        return self.state, self.reason

    def _run(self) -> None:
        try:
            g = group.form(self.spec, self._device)
        except group.GroupError as exc:
            self._failed(str(exc))
            return
        self._group = g
        self.state = "ready"
        log.info(
            "TP group %s formed: rank %d of %d over %s",
            self.spec.name,
            self.spec.rank,
            self.spec.size,
            self.spec.backend,
        )
        if self.driver is not None:
            self.driver.attach(g, ping_s=max(0.5, self.spec.timeout_s / 4))
            return
        why = tp_runner.follow(self._base, g)
        if self.state != "closed":
            self._failed(why)

    def _failed(self, reason: str) -> None:
        self.state, self.reason = "failed", reason
        if self.driver is not None:
            self.driver.fail(reason)
        log.warning("TP rank %d of %s: %s", self.spec.rank, self.spec.name, reason)

    def close(self) -> None:
        """At unload: rank 0 tells the followers to stop; a follower lets its group go
        (rank 0's next collective then fails with the reason)."""
        self.state = "closed"
        if self.driver is not None:
            self.driver.close()
        elif self._group is not None:
            self._group.close()
