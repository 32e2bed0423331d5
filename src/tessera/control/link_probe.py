"""Measured links between agents, probed once per pair and cached (issue 32).

The sourcing policy (`tessera.policies.scaling.replica_sources`, the switch plan's tiers) reads a
`links.LinkModel`; `LinkProbe.links` fills it with rates the agents measured: each
reachable agent is asked (`ProbeLinks`) to pull a short transfer from every peer it has
no rate for yet and to time a read of the model's checkpoint through its own reader (its
declared storage bandwidth included). Rates are cached by (agent name, address) pairs, so
a pair is probed at the first pass that sees both (agent discovery or first use) and again
only when an agent comes back at another address. A peer or checkpoint the agent could
not reach is cached as 0 (the base figures stand for it); an agent that did not answer
the probe is asked again at the next pass. One per operator (`reconciler.Context`) or
`tessera up` process, handed to `converge` through `Rollout.probe`.
"""

from __future__ import annotations

import grpc

from tessera import observed
from tessera.policies import links
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

PROBE_BYTES = 8 << 20

Agent = tuple[str, str]  # (name, address)


class LinkProbe:
    def __init__(
        self, tls: transport.TlsFiles | None, nbytes: int = PROBE_BYTES, timeout_s: float = 60.0
    ) -> None:
        self.tls = tls  # the process's TLS files for the probes' channels
        self.nbytes, self.timeout_s = nbytes, timeout_s
        self.pairs: dict[tuple[Agent, Agent], float] = {}  # (source, target) -> bytes/s
        self.storage: dict[tuple[Agent, str], float] = {}  # (agent, model path) -> bytes/s
        self.probes = 0  # ProbeLinks calls made (tests read it)

    async def links(
        self, base: links.LinkModel, obs: observed.Observed, model_path: str
    ) -> links.LinkModel:
        """`base` with every measured rate among the reachable agents of `obs`."""
        up = [(a.name, a.address) for a in obs.agents if a.reachable]
        for target in up:
            peers = [s for s in up if s != target and (s, target) not in self.pairs]
            store = (target, model_path) not in self.storage
            if peers or store:
                await self._probe(target, peers, model_path if store else "")
        names = {a for a in up}
        pairs = {(s[0], t[0]): r for (s, t), r in self.pairs.items() if s in names and t in names}
        storage = {a[0]: r for (a, m), r in self.storage.items() if a in names and m == model_path}
        return links.measured(base, pairs, storage)

    async def _probe(self, target: Agent, peers: list[Agent], model_path: str) -> None:
        by_address = {p[1]: p for p in peers}
        channel = transport.channel(target[1], self.tls)
        self.probes += 1
        try:
            reply = await pb_grpc.AgentStub(channel).ProbeLinks(
                pb.ProbeLinksRequest(
                    peers=list(by_address), nbytes=self.nbytes, model_path=model_path
                ),
                timeout=self.timeout_s,
            )
        except grpc.aio.AioRpcError:
            return  # an agent that cannot probe keeps the base figures; tried again next pass
        finally:
            await channel.close()
        for rate in reply.peers:
            source = by_address.get(rate.address)
            if source is not None:
                self.pairs[(source, target)] = max(0.0, rate.bytes_per_s)
        if model_path:
            self.storage[(target, model_path)] = max(0.0, reply.storage_bytes_per_s)
