"""One torch.distributed group formed on demand, used by TP ranks and pipeline stages.

`form(spec)` reaches the rendezvous store the plan handed out, builds the backend (NCCL
when every rank is a CUDA device, gloo otherwise) over a key prefix unique to this
formation, and returns a `Group` with the few operations the engine needs: all-reduce
(TP), broadcast of a step to the other ranks, and point-to-point tensors. No
`init_process_group`: an agent holds as many groups as it hosts replicas, each closed at
unload. Every operation has the group's timeout, so a dead rank fails the group instead of
hanging it. Objects cross as `wire` frames (a fixed binary header, a JSON body, raw tensor
bytes; a frame length over `wire.MAX_FRAME_BYTES` is refused before a buffer is allocated):
nothing a peer sends is unpickled. Every key a rank touches in the store is deleted when it
closes its group, so a group formed again under the same name (a replica reloaded after a
failure) never reads a dead rank's address. Called by `tessera_agent.tp_member`,
`transfer.block_copy` and tests.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._C import _distributed_c10d as c10d

from tessera_agent.transfer import gloo, nccl, store, wire

DEFAULT_TIMEOUT_S = 30.0
FORM_TIMEOUT_S = 180.0  # to wait for every rank to join: ranks load their weights first


@dataclass(frozen=True)
class GroupSpec:
    """Where and how to form a group."""

    store_address: str  # host:port of the rendezvous TCPStore (the plan hands it out)
    name: str  # key prefix unique to this formation (replica, generation, stage)
    rank: int
    size: int
    backend: str = "gloo"  # "gloo" or "nccl" (see `choose`)
    timeout_s: float = DEFAULT_TIMEOUT_S  # per collective (all-reduce, broadcast)
    form_timeout_s: float = FORM_TIMEOUT_S  # to wait for the other ranks to join

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"group {self.name}: rank {self.rank} outside [0, {self.size})")
        if self.backend not in (gloo.NAME, nccl.NAME):
            raise ValueError(f"group {self.name}: backend {self.backend!r} is not gloo or nccl")


def choose(device_kinds: list[str]) -> str:
    """The backend for ranks on these device kinds: NCCL only when all are CUDA."""
    if device_kinds and all(k == "cuda" for k in device_kinds):
        return nccl.NAME
    return gloo.NAME


class _Recording(c10d.Store):
    """A store that remembers every key its group reads or writes (to delete at close)."""

    def __init__(self, inner: c10d.Store) -> None:
        super().__init__()
        self.inner = inner
        self.keys: set[str] = set()

    def set(self, key: str, value: Any) -> None:
        self.keys.add(key)
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.keys.add(key)
        return self.inner.get(key)

    def add(self, key: str, value: int) -> int:
        self.keys.add(key)
        return self.inner.add(key, value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self.keys.add(key)
        return self.inner.compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self.keys.update(keys)
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: Any) -> None:
        self.inner.set_timeout(timeout)

    def forget_all(self) -> None:
        for key in list(self.keys):  # ranks may still add keys from their threads
            try:
                self.inner.delete_key(key)
            except Exception:  # the store's agent may be gone with its keys
                return
        self.keys.clear()


class GroupError(RuntimeError):
    """The group failed (a rank died, timed out, or the group was closed)."""


class Group:
    """A formed group; operations are serialized (one in flight per group)."""

    def __init__(
        self, spec: GroupSpec, pg: c10d.Backend, device: torch.device, st: _Recording
    ) -> None:
        # The backend's collectives are bound in C++ and missing from torch's stubs.
        self._pg: Any
        self.spec, self._pg, self.device, self._store = spec, pg, device, st
        self._timeout = datetime.timedelta(seconds=spec.timeout_s)
        self._lock = threading.Lock()
        self.failed: str | None = None

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def size(self) -> int:
        return self.spec.size

    def _run(self, what: str, start: Callable[[], c10d.Work]) -> None:
        """Start an operation and wait for it; any failure, raised when the operation is
        posted (a peer's socket already closed) or while waiting, fails the group for good,
        so callers see `failed` and fall back instead of retrying a dead group."""
        try:
            start().wait()
        except Exception as exc:
            self.failed = f"group {self.spec.name} failed in {what}: {exc}"
            raise GroupError(self.failed) from exc

    def _check(self) -> None:
        if self.failed is not None:
            raise GroupError(self.failed)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` across the ranks, in place; returns `t`."""
        with self._lock:
            self._check()
            opts = c10d.AllreduceOptions()
            opts.timeout = self._timeout
            self._run("all_reduce", lambda: self._pg.allreduce([t], opts))
        return t

    def _bcast(self, t: torch.Tensor, root: int) -> c10d.Work:
        opts = c10d.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = root, 0, self._timeout
        work: c10d.Work = self._pg.broadcast([t], opts)
        return work

    def broadcast_object(self, obj: object, root: int = 0) -> object:
        """`obj` from rank `root` to every rank (a `wire` frame); others pass anything.
        A malformed frame fails the group (GroupError) without being interpreted."""
        with self._lock:
            self._check()
            if self.rank == root:
                data = wire.encode(obj)
                size = torch.tensor([len(data)], dtype=torch.long, device=self.device)
                self._run("broadcast", lambda: self._bcast(size, root))
                buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
                self._run("broadcast", lambda: self._bcast(buf, root))
                return obj
            size = torch.zeros(1, dtype=torch.long, device=self.device)
            self._run("broadcast", lambda: self._bcast(size, root))
            try:
                wire.check_size(int(size.item()))
            except wire.WireError as exc:
                self.failed = f"group {self.spec.name}: rank {root} sent a bad frame: {exc}"
                raise GroupError(self.failed) from exc
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
            self._run("broadcast", lambda: self._bcast(buf, root))
            return self.decode_frame(buf.cpu().numpy().tobytes(), root)

    def decode_frame(self, frame: bytes, root: int) -> object:
        """A peer's frame → object; a bad one fails the group for good."""
        try:
            return wire.decode(frame, self.device)
        except wire.WireError as exc:
            self.failed = f"group {self.spec.name}: rank {root} sent a bad frame: {exc}"
            raise GroupError(self.failed) from exc

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        with self._lock:
            self._check()
            self._run("send", lambda: self._pg.send([t.contiguous()], dst, tag))

    def recv(self, t: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        with self._lock:
            self._check()
            self._run("recv", lambda: self._pg.recv([t], src, tag))
        return t

    def send_all(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> None:
        """Send every tensor, in order: all posted before any is waited on, so the stream
        never stops for a round trip between two tensors."""
        self._many(
            "send", [t.contiguous() for t in tensors], lambda t: self._pg.send([t], dst, tag)
        )

    def recv_all(self, bufs: Sequence[torch.Tensor], src: int, tag: int = 0) -> None:
        """Receive into every buffer, in order (the pair of `send_all`)."""
        self._many("recv", list(bufs), lambda t: self._pg.recv([t], src, tag))

    def _many(
        self, what: str, tensors: list[torch.Tensor], post: Callable[[torch.Tensor], c10d.Work]
    ) -> None:
        with self._lock:
            self._check()
            try:
                works = [post(t) for t in tensors]
                for w in works:
                    w.wait()
            except Exception as exc:
                self.failed = f"group {self.spec.name} failed in {what}: {exc}"
                raise GroupError(self.failed) from exc

    def close(self) -> None:
        """Let the group go; later operations fail with the reason."""
        if self.failed is None:
            self.failed = f"group {self.spec.name} was closed"
        shutdown = getattr(self._pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # a half-dead group may refuse; it is gone either way
                pass
        self._store.forget_all()


def form(spec: GroupSpec, device: torch.device) -> Group:
    """Join the group `spec` names; returns once every rank has joined, or raises
    GroupError after `spec.form_timeout_s`."""
    wait = max(spec.form_timeout_s, spec.timeout_s)
    try:
        client = store.connect(spec.store_address, wait)
        prefixed = _Recording(c10d.PrefixStore(f"tessera/{spec.name}/", client))
        if spec.backend == nccl.NAME:
            pg = nccl.make(prefixed, spec.rank, spec.size, wait, device)
        else:
            pg = gloo.make(prefixed, spec.rank, spec.size, wait)
            device = torch.device("cpu")
    except Exception as exc:
        raise GroupError(
            f"group {spec.name}: rank {spec.rank} of {spec.size} could not join at "
            f"{spec.store_address} ({spec.backend}): {exc}"
        ) from exc
    return Group(spec, pg, device, prefixed)
