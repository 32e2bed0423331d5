"""The host-memory block cache: an agent's unloaded pieces kept in host RAM, LRU, bounded.

A block unloaded from a device leaves its zoo pieces here, keyed by the zoo's content digest
(`block_zoo.digest`) and serving dtype. An index `(model path, piece, dtype) -> digest` lets a
later load (a reload, or a variant declaring the same digests, `index_digests`) find a piece
without reading or hashing its checkpoint. At most `budget_bytes`; past it the least recently
used pieces are evicted. Entries are booked as host memory (`booking.Booking.book_host`);
tensors are pinned when the devices are CUDA (`devices.host_copy`), kept as they are on CPU.
One per agent (`hosting.Hosting`), filled by its unload and read by its loads; contents are
reported in `Describe` (for sourcing), counters in metrics.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from tessera_agent import booking

_LAYER = re.compile(r"^(model\.layers\.)(\d+|\*)(\.)")

HostCopy = Callable[[torch.Tensor], torch.Tensor]  # a device tensor -> its host copy


def generic(name: str) -> str:
    """A checkpoint name with its layer index replaced by `*` (a piece's names at any index)."""
    return _LAYER.sub(r"\1*\3", name)


def specific(name: str, layer: int | None) -> str:
    """A generic name at layer `layer` (names outside the layers are returned as they are)."""
    return name if layer is None else _LAYER.sub(rf"\g<1>{layer}\3", name)


def layer_of(piece: str) -> int | None:
    """`layer.3` -> 3; `embed`/`final` -> None."""
    return int(piece.split(".")[1]) if piece.startswith("layer.") else None


@dataclass(frozen=True)
class Key:
    """A cached piece's identity: its content digest and the dtype it is held in."""

    digest: str
    dtype: str

    @property
    def holder(self) -> str:
        """Its name in the agent's memory booking."""
        return f"host-cache:{self.dtype}:{self.digest[:16]}"


@dataclass(frozen=True)
class Cached:
    """One piece in the cache, as `Describe` reports it."""

    model_path: str  # the checkpoint it was last loaded from
    piece: str  # "embed", "layer.<i>" or "final"
    dtype: str
    digest: str
    nbytes: int


@dataclass
class _Entry:
    tensors: dict[str, torch.Tensor]  # generic checkpoint name -> host tensor
    nbytes: int


@dataclass(frozen=True)
class Stats:
    hits: int  # pieces a load took from the cache
    misses: int  # pieces a load looked for and did not find
    hit_bytes: int
    evicted: int  # pieces dropped to make room
    used_bytes: int
    budget_bytes: int
    pieces: int


class HostCache:
    """Per agent: content key -> a piece's host tensors, least recently used first out."""

    def __init__(self, budget_bytes: int, memory: booking.Booking | None = None) -> None:
        if budget_bytes < 0:
            raise ValueError("host cache budget: must be >= 0 bytes")
        self.budget_bytes = budget_bytes
        self._memory = memory
        self._entries: collections.OrderedDict[Key, _Entry] = collections.OrderedDict()
        self._index: dict[tuple[str, str, str], str] = {}  # (model, piece, dtype) -> digest
        self._lock = threading.Lock()  # puts on the loader thread, reads anywhere
        self._hits = self._misses = self._hit_bytes = self._evicted = 0
        self._used = 0

    # -- filling ----------------------------------------------------------------------
    def put(
        self,
        model_path: str,
        piece: str,
        dtype: str,
        digest: str,
        tensors: Mapping[str, torch.Tensor],
        host_copy: HostCopy = lambda t: t.detach().cpu(),
    ) -> bool:
        """Keep one piece (checkpoint-named tensors, copied to the host by `host_copy`);
        False when it does not fit the budget at all. Already held: only refreshed."""
        key = Key(digest, dtype)
        with self._lock:
            self._index[(model_path, piece, dtype)] = digest
            have = self._entries.get(key)
            if have is not None:
                self._entries.move_to_end(key)
                return True
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if nbytes > self.budget_bytes:
            return False
        held = {generic(n): host_copy(t) for n, t in tensors.items()}
        with self._lock:
            self._make_room(nbytes)
            self._entries[key] = _Entry(held, nbytes)
            self._used += nbytes
            if self._memory is not None:
                self._memory.book_host(key.holder, nbytes)
        return True

    def index_digests(self, model_path: str, dtype: str, digests: Mapping[str, str]) -> None:
        """Say which content `model_path`'s pieces have (`{piece: digest}`, e.g. a
        variant's declared digests) so its loads find what the cache already holds."""
        with self._lock:
            for piece, digest in digests.items():
                self._index[(model_path, piece, dtype)] = digest

    def _make_room(self, nbytes: int) -> None:
        while self._entries and self._used + nbytes > self.budget_bytes:
            key, entry = self._entries.popitem(last=False)
            self._used -= entry.nbytes
            self._evicted += 1
            if self._memory is not None:
                self._memory.release_host(key.holder)

    # -- reading ----------------------------------------------------------------------
    def digest_of(self, model_path: str, piece: str, dtype: str) -> str | None:
        """The content digest known for a piece of a checkpoint, if any."""
        with self._lock:
            return self._index.get((model_path, piece, dtype))

    def take(
        self,
        model_path: str,
        pieces: Iterable[str],
        dtype: str,
        device: torch.device,
    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The checkpoint-named tensors of every piece of `pieces` held here, on `device`,
        and `{piece: digest}` of those found. The entries stay (a copy is handed out):
        the cache lets go of a piece only when the budget needs the room."""
        out: dict[str, torch.Tensor] = {}
        found: dict[str, str] = {}
        with self._lock:
            for piece in pieces:
                digest = self._index.get((model_path, piece, dtype))
                entry = None if digest is None else self._entries.get(Key(digest, dtype))
                if entry is None or digest is None:
                    self._misses += 1
                    continue
                self._entries.move_to_end(Key(digest, dtype))
                layer = layer_of(piece)
                for name, t in entry.tensors.items():
                    out[specific(name, layer)] = t
                found[piece] = digest
                self._hits += 1
                self._hit_bytes += entry.nbytes
        on_device = {
            n: t if t.device == device else t.to(device, non_blocking=True) for n, t in out.items()
        }
        return on_device, found

    def contents(self) -> list[Cached]:
        """Every cached piece under every (model path, piece) it is known as."""
        with self._lock:
            out = []
            for (model, piece, dtype), digest in sorted(self._index.items()):
                entry = self._entries.get(Key(digest, dtype))
                if entry is not None:
                    out.append(Cached(model, piece, dtype, digest, entry.nbytes))
            return out

    def stats(self) -> Stats:
        with self._lock:
            return Stats(
                self._hits,
                self._misses,
                self._hit_bytes,
                self._evicted,
                self._used,
                self.budget_bytes,
                len(self._entries),
            )

    def clear(self) -> None:
        with self._lock:
            self._make_room(self.budget_bytes + 1)
