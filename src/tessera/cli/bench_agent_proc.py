"""A local agent process and an async stub to it, for the benches that drive agents
directly (no gateway): `tessera bench variants` and its parts.

`AgentProc` starts `tessera agent` (one torch thread, a metrics port of its own), loads and
unloads blocks, registers adapters, generates, and reads the co-batching counters from the
agent's /metrics.
"""

from __future__ import annotations

from typing import Any


class AgentProc:
    """One local agent process and an async stub to it."""

    def __init__(
        self, name: str, capacity: int, zoo: bool, cobatch: bool = True, linger_ms: float = -1.0
    ) -> None:
        from tessera.cli import local_agents
        from tessera.rpc import transport
        from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

        extra = [] if zoo else ["--no-block-zoo"]
        if not cobatch:
            extra.append("--no-cobatch")
        elif linger_ms >= 0:
            extra += ["--cobatch-linger-ms", str(linger_ms)]
        self.metrics_port = free_port()
        extra += ["--metrics-port", str(self.metrics_port)]
        self.proc = local_agents.start_agent(name, f"cpu:1x{capacity}B", 1, extra_args=extra)
        self.channel = transport.channel(self.proc.address)
        self.stub = pb_grpc.AgentStub(self.channel)

    async def load(self, rid: str, path: str, kv: int) -> None:
        from tessera import blocks
        from tessera.rpc import blocks as rpc_blocks

        b = blocks.Block(path, 0, self._layers(path), replica_id=rid, kv_bytes=kv)
        await self.stub.LoadBlock(rpc_blocks.load_request(b), timeout=120)

    @staticmethod
    def _layers(path: str) -> int:
        from tessera import model_facts

        return model_facts.num_layers(path)

    async def adapters(self, rid: str, pairs: list[tuple[str, str]]) -> None:
        from tessera.rpc.v1 import agent_pb2 as pb

        req = pb.VariantAdaptersRequest(
            replica_id=rid, adapters=[pb.VariantAdapter(name=n, path=p) for n, p in pairs]
        )
        await self.stub.VariantAdapters(req, timeout=120)

    async def unload(self, rid: str) -> None:
        from tessera.rpc.v1 import agent_pb2 as pb

        await self.stub.UnloadBlock(pb.UnloadBlockRequest(replica_id=rid), timeout=60)

    async def generate(self, rid: str, variant: str, prompt: tuple[int, ...], n: int) -> list[int]:
        from tessera.rpc import sampling as rpc_sampling
        from tessera.rpc.v1 import agent_pb2 as pb

        params = rpc_sampling.to_proto(rpc_sampling.Sampling(max_tokens=n, ignore_eos=True))
        req = pb.GenerateRequest(
            replica_id=rid, prompt_token_ids=list(prompt), params=params, variant=variant
        )
        out: list[int] = []
        async for ch in self.stub.Generate(req, timeout=600):
            out.extend(ch.token_ids)
        return out

    async def describe(self) -> Any:
        from tessera.rpc.v1 import agent_pb2 as pb

        return await self.stub.Describe(pb.DescribeRequest(), timeout=30)

    def cobatch_counts(self) -> dict[str, int]:
        """The compute thread's co-batching counters, from the agent's /metrics."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        out = {"cobatched_steps": 0, "solo_steps": 0, "shared_passes": 0}
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name == "tessera_agent_cobatch_steps_total":
                    key = "cobatched_steps" if smp.labels["mode"] == "cobatched" else "solo_steps"
                    out[key] = int(smp.value)
                elif smp.name == "tessera_agent_cobatch_passes_total":
                    if smp.labels["rows_of"] == "several":
                        out["shared_passes"] = int(smp.value)
                elif smp.name == "tessera_agent_cobatch_waits_total":
                    out[f"waits_{smp.labels['outcome']}"] = int(smp.value)
                elif smp.name == "tessera_agent_cobatch_busy_seconds_total":
                    out["busy_ms"] = round(1000 * smp.value)
        return out

    async def close(self) -> None:
        from tessera.cli import local_agents

        await self.channel.close()
        local_agents.stop_agent(self.proc)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
