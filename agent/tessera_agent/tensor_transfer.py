"""Block copy between agents over gRPC: a hosted block's tensors out in chunks, and back in.

`chunks()` serves the servicer's `FetchTensors` (the source side); `fetch()` is what
`LoadBlock` with a `source` calls on the target agent. Tensors travel by checkpoint name,
so a target can copy any sub-range of the layers a source holds, and the target checks
every shape against its own `config.json` (`engine.block_tensors.check`). This is the
CPU transport (gRPC); an NCCL transport for GPU agents would slot in beside it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc
import torch

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent.engine import dtypes, errors, stage

DEFAULT_CHUNK_BYTES = 4 << 20
DTYPES = dtypes.TORCH


def held(st: stage.Stage, names: Sequence[str]) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of a hosted block; NotFoundError names the first one it lacks."""
    if not names:
        raise errors.InvalidArgumentError("names: at least one tensor name is required")
    return [(name, st.tensor(name)) for name in names]


def chunks(tensors: list[tuple[str, torch.Tensor]], chunk_bytes: int) -> Iterator[pb.TensorChunk]:
    """Each tensor as row-major bytes, in chunks of at most `chunk_bytes`, in order."""
    if chunk_bytes < 0:
        raise errors.InvalidArgumentError(f"chunk_bytes: {chunk_bytes} must be >= 0")
    size = chunk_bytes or DEFAULT_CHUNK_BYTES
    for name, t in tensors:
        raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        total, offset = raw.numel(), 0
        dtype, shape = str(t.dtype).removeprefix("torch."), list(t.shape)
        while True:
            piece = raw[offset : offset + size]
            yield pb.TensorChunk(
                name=name,
                dtype=dtype,
                shape=shape,
                total_bytes=total,
                offset=offset,
                data=piece.numpy().tobytes(),
            )
            offset += piece.numel()
            if offset >= total:
                break


def error(source: pb.BlockSource, exc: grpc.aio.AioRpcError) -> errors.EngineError:
    where = f"copy source {source.replica_id}/{source.stage_index} at {source.address}"
    code, details = exc.code(), exc.details() or ""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return errors.UnavailableError(f"{where} unreachable: {code.name}: {details}")
    if code == grpc.StatusCode.NOT_FOUND:
        return errors.NotFoundError(f"{where}: {details}")
    return errors.FailedPreconditionError(f"{where} failed: {code.name}: {details}")


class _Assembly:
    """One tensor being received: its metadata and the bytes so far."""

    def __init__(self, first: pb.TensorChunk) -> None:
        if first.dtype not in DTYPES:
            raise errors.FailedPreconditionError(
                f"tensor {first.name}: unsupported dtype {first.dtype!r} from the copy source"
            )
        self.name, self.dtype, self.shape = first.name, DTYPES[first.dtype], tuple(first.shape)
        self.buf = bytearray(first.total_bytes)
        self.received = 0

    def add(self, ch: pb.TensorChunk) -> None:
        end = ch.offset + len(ch.data)
        if ch.offset != self.received or end > len(self.buf):
            raise errors.FailedPreconditionError(
                f"tensor {self.name}: chunk at byte {ch.offset} out of order or past its end"
            )
        self.buf[ch.offset : end] = ch.data
        self.received = end

    def tensor(self) -> torch.Tensor:
        if self.received != len(self.buf):
            raise errors.FailedPreconditionError(
                f"tensor {self.name}: received {self.received} of {len(self.buf)} bytes"
            )
        raw = torch.frombuffer(self.buf, dtype=torch.uint8) if self.buf else torch.empty(0)
        return raw.view(self.dtype).reshape(self.shape)


class Assembler:
    """Tensors rebuilt from a `chunks()` stream: `add()` each chunk, then `result()`."""

    def __init__(self) -> None:
        self._done: dict[str, torch.Tensor] = {}
        self._current: _Assembly | None = None

    def add(self, ch: pb.TensorChunk) -> None:
        if self._current is None or ch.name != self._current.name:
            self._finish()
            self._current = _Assembly(ch)
        self._current.add(ch)

    def _finish(self) -> None:
        if self._current is not None:
            self._done[self._current.name] = self._current.tensor()
            self._current = None

    def result(self) -> dict[str, torch.Tensor]:
        self._finish()
        return self._done


async def fetch(
    source: pb.BlockSource,
    names: Sequence[str],
    timeout: float = 600.0,
    chunk_bytes: int = 0,
    *,
    tls: transport.TlsFiles | None,
) -> dict[str, torch.Tensor]:
    """Copy the named tensors from the block `source` hosts; engine errors name the cause
    (UnavailableError when the source cannot be reached)."""
    if not source.address:
        raise errors.InvalidArgumentError("source.address: required to copy a block")
    received = Assembler()
    channel = transport.channel(source.address, tls)
    try:
        stream = pb_grpc.AgentStub(channel).FetchTensors(
            pb.FetchTensorsRequest(
                replica_id=source.replica_id,
                stage_index=source.stage_index,
                names=list(names),
                chunk_bytes=chunk_bytes,
            ),
            timeout=timeout,
        )
        async for ch in stream:
            received.add(ch)
    except grpc.aio.AioRpcError as exc:
        raise error(source, exc) from exc
    finally:
        await channel.close()
    return received.result()
