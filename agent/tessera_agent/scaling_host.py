"""Layer-run replicas this agent holds for other agents' stages (the `ScalingRun*` RPCs).

A replica is loaded with its weights copied from the stage's agent (`block_copy.fetch`:
a data-plane group, else gRPC) or read from the checkpoint, and a KV pool with the
stage's page ids; its memory is booked on the device like a block's. Steps run on the
agent's compute thread, so a replica competes with the agent's own stages for compute,
which is what the owner's measured speed (and so its split) sees. Called by the servicer,
which only translates; the owner side is `run_client.RemoteHolder`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import booking, convert
from tessera_agent.engine import config, dtypes, errors, loader, run_holders
from tessera_agent.transfer import block_copy, group

log = logging.getLogger(__name__)


@dataclass
class HostedRun:
    run_id: str
    device: str
    model: run_holders.RunModel


class RunHost:
    def __init__(
        self,
        agent_id: str,
        memory: booking.Booking,
        compute: concurrent.futures.Executor,
        store_address: str = "",
        load_delay_s: float = 0.0,
        tls: transport.TlsFiles | None = None,  # the agent's mTLS files for block copies
    ) -> None:
        self.agent_id, self.memory, self.compute = agent_id, memory, compute
        self.store_address, self.load_delay_s = store_address, load_delay_s
        self.tls = tls
        self.runs: dict[str, HostedRun] = {}
        self._lock = asyncio.Lock()

    def get(self, run_id: str) -> HostedRun:
        run = self.runs.get(run_id)
        if run is None:
            raise errors.NotFoundError(f"no layer-run replica {run_id!r} on {self.agent_id}")
        return run

    async def load(self, req: pb.ScalingRunLoadRequest) -> pb.ScalingRunLoadReply:
        async with self._lock:
            if req.run_id in self.runs:
                raise errors.FailedPreconditionError(f"run {req.run_id} is already loaded")
            dev = self.memory.device(req.device or next(iter(self.memory.devices)))
            path = Path(req.model_path)
            try:
                cfg = config.ModelConfig.from_path(path)
            except (config.ConfigError, FileNotFoundError) as exc:
                raise errors.NotFoundError(f"model {req.model_path}: {exc}") from exc
            start, end = req.layer_start, req.layer_end
            if not 0 <= start < end <= cfg.num_layers:
                raise errors.InvalidArgumentError(
                    f"layers [{start}, {end}) are outside the model's {cfg.num_layers} layers"
                )
            if req.num_pages < 1 or req.page_size < 1:
                raise errors.InvalidArgumentError("num_pages and page_size: must be >= 1")
            dtype = dtypes.of_spec(req.dtype or "auto", cfg)
            names = [
                n for n in loader.checkpoint_names(cfg, start, end) if n.startswith("model.layers.")
            ]
            loop = asyncio.get_running_loop()
            if req.HasField("source"):
                tensors, moved_by = await block_copy.fetch(
                    req.source, names, self.store_address, dev.torch_device(),
                    group.choose([dev.kind]), tls=self.tls,
                )  # fmt: skip
            else:
                tensors = await loop.run_in_executor(None, loader.read_tensors, path, names)
                moved_by = "checkpoint"
            rm = await loop.run_in_executor(
                None,
                lambda: run_holders.RunModel(
                    cfg, start, end, tensors, dtype, dev.torch_device(), req.num_pages,
                    req.page_size,
                ),
            )  # fmt: skip
            if self.load_delay_s:  # tests (load_config.LoadDefaults.run_load_delay_s)
                await asyncio.sleep(self.load_delay_s)
            need = rm.param_bytes + rm.kv_bytes
            if need > dev.free_bytes:
                raise errors.ResourceExhaustedError(
                    f"layers [{start}, {end}) need {need} bytes (weights and KV) but "
                    f"{dev.id} has {dev.free_bytes} free"
                )
            self.memory.book(dev.id, f"run:{req.run_id}", need)
            self.runs[req.run_id] = HostedRun(req.run_id, dev.id, rm)
            log.info("holding layers [%d, %d) of run %s on %s", start, end, req.run_id, dev.id)
            return pb.ScalingRunLoadReply(
                holder=f"{self.agent_id}/{dev.id}",
                param_bytes=rm.param_bytes,
                kv_bytes=rm.kv_bytes,
                transport=moved_by,
            )

    async def step(self, req: pb.ScalingRunStepRequest) -> pb.ScalingRunStepReply:
        run = self.get(req.run_id)
        inp = convert.step_from_proto(req.step)
        if inp.hidden is None:
            raise errors.InvalidArgumentError("ScalingRunStep: the step carries no hidden states")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await loop.run_in_executor(self.compute, run.model.run, inp.chunks, inp.hidden)
        return pb.ScalingRunStepReply(hidden=convert.tensor_to_proto(out), seconds=loop.time() - t0)

    def _pages(self, run: HostedRun, page_ids: list[int]) -> list[int]:
        n = run.model.cache.layout.num_pages
        bad = [p for p in page_ids if not 0 <= p < n]
        if bad:
            raise errors.InvalidArgumentError(f"page_ids: {bad[0]} is outside the pool of {n}")
        return [int(p) for p in page_ids]

    def export_kv(self, req: pb.ScalingRunKVRequest) -> Iterator[pb.KVLayer]:
        run = self.get(req.run_id)
        pages = self._pages(run, list(req.page_ids))
        for i, (k, v) in enumerate(run.model.export_pages(pages)):
            yield pb.KVLayer(layer=i, k=convert.tensor_to_proto(k), v=convert.tensor_to_proto(v))

    async def import_kv(self, it: AsyncIterator[pb.ScalingRunKVImport]) -> int:
        first = await anext(it, None)
        if first is None or not first.HasField("header"):
            raise errors.InvalidArgumentError("ScalingRunImportKV: the first message is a header")
        run = self.get(first.header.run_id)
        pages = self._pages(run, list(first.header.page_ids))
        kv: run_holders.KV = []
        async for msg in it:
            if not msg.HasField("layer"):
                raise errors.InvalidArgumentError("ScalingRunImportKV: one header, then layers")
            kv.append((_tensor(msg.layer.k), _tensor(msg.layer.v)))
        run.model.import_pages(pages, kv)
        return len(kv)

    async def unload(self, run_id: str) -> None:
        async with self._lock:
            run = self.runs.pop(run_id, None)
            if run is None:
                raise errors.NotFoundError(f"no layer-run replica {run_id!r} on {self.agent_id}")
            self.memory.release(run.device, f"run:{run_id}")
            log.info("dropped run %s", run_id)

    def describe(self) -> list[pb.ScalingHostedRun]:
        return [
            pb.ScalingHostedRun(
                run_id=r.run_id,
                layer_start=r.model.start,
                layer_end=r.model.end,
                device=r.device,
                param_bytes=r.model.param_bytes,
                kv_bytes=r.model.kv_bytes,
            )
            for r in self.runs.values()
        ]


def _tensor(msg: pb.Tensor) -> torch.Tensor:
    try:
        return convert.tensor_from_proto(msg)
    except (AttributeError, RuntimeError, TypeError, ValueError) as exc:
        raise errors.InvalidArgumentError(f"KV tensor: {exc}") from exc
