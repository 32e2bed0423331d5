"""Memory booking: which hosted block holds how many bytes of which device.

The agent's devices are declared (or probed) once; every loaded block books its
parameters plus KV pool on its device, and releases them when unloaded, so `free_bytes`
(reported by `Describe`, checked by every load) is always capacity minus bookings.
Host memory the agent keeps outside its devices (the host block cache, `host_cache`) is
booked apart, by holder, in `host`. Used by `hosting.Hosting`; pure bookkeeping, no
torch allocation happens here.
"""

from __future__ import annotations

from collections.abc import Iterable

from tessera_agent import devices
from tessera_agent.engine import errors


class Booking:
    def __init__(self, agent_id: str, devs: Iterable[devices.Device]) -> None:
        self.agent_id = agent_id
        self.devices = {d.id: d for d in devs}
        self.host: dict[str, int] = {}  # holder -> host bytes (the host block cache)

    def device(self, device_id: str) -> devices.Device:
        """The device, or NotFoundError naming the ones this agent has."""
        dev = self.devices.get(device_id)
        if dev is None:
            raise errors.NotFoundError(
                f"device {device_id!r} is not on agent {self.agent_id} "
                f"(devices: {', '.join(self.devices)})"
            )
        return dev

    def book(self, device_id: str, holder: str, nbytes: int) -> None:
        self.device(device_id).used[holder] = nbytes

    def release(self, device_id: str, holder: str) -> None:
        dev = self.devices.get(device_id)
        if dev is not None:
            dev.used.pop(holder, None)

    def book_host(self, holder: str, nbytes: int) -> None:
        self.host[holder] = nbytes

    def release_host(self, holder: str) -> None:
        self.host.pop(holder, None)

    @property
    def host_bytes(self) -> int:
        """Host memory booked outside the devices."""
        return sum(self.host.values())
