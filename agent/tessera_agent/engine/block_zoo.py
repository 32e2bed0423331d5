"""The block zoo: content-addressed parameters, loaded once per agent and shared by chains.

A stage's parameters are cut into pieces (each decoder layer, the embedding, the final norm
plus LM head). A piece's address is the SHA-256 of its checkpoint tensors (`block_digest`:
names with the layer index as `*`, dtype, shape, bytes) with the layer index, serving dtype
and device. `BlockZoo.adopt` points each piece already held at the held `nn.Parameter`s and
registers the others; pieces are reference-counted per stage and freed with the last
(`release`). So a fine-tune differing from its foundation in k layers adds only k layers.
Only parameters are shared, never modules (a LoRA wrapper on one chain never appears in
another); tensor-parallel shards are not pooled.
One zoo per agent (`hosting.Hosting`); called by `stage.load_stage` and at unload.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from tessera_agent.engine import config as config_mod
from tessera_agent.engine import loader
from tessera_agent.engine import model as model_mod

_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\.)")


@dataclass(frozen=True)
class PieceKey:
    """The address of one piece: what it is, where, served how, and its content digest."""

    piece: str  # "layer.<i>", "embed" or "final"
    digest: str
    dtype: str
    device: str

    @property
    def holder(self) -> str:
        """Its name in the agent's memory booking."""
        return f"zoo:{self.piece}:{self.dtype}:{self.digest[:16]}"


@dataclass
class _Entry:
    params: dict[str, nn.Parameter]  # name inside the piece's module -> the shared tensor
    nbytes: int
    refs: int = 0


@dataclass(frozen=True)
class Adopted:
    """What `adopt` did for one stage: the pieces it holds, and which were new."""

    keys: tuple[PieceKey, ...]
    new: tuple[PieceKey, ...]
    new_bytes: int  # bytes the agent holds now that it did not before
    shared_bytes: int  # bytes of the stage already held for another stage


def digest(tensors: Mapping[str, torch.Tensor], names: list[str]) -> str:
    """SHA-256 over `names` (layer index replaced by `*`), in name order."""
    h = hashlib.sha256()
    for name in sorted(names):
        t = tensors[name]
        h.update(_LAYER.sub(r"\1*\3", name).encode())
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        flat = t.detach().contiguous().view(-1).view(dtype=torch.uint8).cpu()
        h.update(flat.numpy().data)  # the bytes in place: no copy of a large tensor
    return h.hexdigest()


def piece_names(cfg: config_mod.ModelConfig, start: int, end: int) -> list[tuple[str, list[str]]]:
    """(piece name, its checkpoint tensor names) of layer range [start, end)."""
    out: list[tuple[str, list[str]]] = []
    if start == 0:
        out.append(("embed", ["model.embed_tokens.weight"]))
    for i in range(start, end):
        names = [n for n in loader.checkpoint_names(cfg, i, i + 1) if _LAYER.match(n)]
        out.append((f"layer.{i}", names))
    if end == cfg.num_layers:
        tied = cfg.tie_embeddings and start == 0  # the head is the embedding's table
        head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
        out.append(("final", ["model.norm.weight"] + ([] if tied else [head])))
    return out


def keys(
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    tensors: Mapping[str, torch.Tensor],
    dtype: str,
    device: str,
    known: Mapping[str, str] | None = None,
) -> list[PieceKey]:
    """The addresses of the range's pieces, from its checkpoint tensors; `known` digests
    (`{piece: digest}`, e.g. of pieces taken from the host cache) are not computed again."""
    known = known or {}
    return [
        PieceKey(piece, known.get(piece) or digest(tensors, names), dtype, device)
        for piece, names in piece_names(cfg, start, end)
    ]


def _module(stage: model_mod.StageModel, piece: str) -> nn.Module:
    if piece == "embed":
        assert stage.embed_tokens is not None
        return stage.embed_tokens
    if piece == "final":
        assert stage.norm is not None and stage.lm_head is not None
        tied = stage.cfg.tie_embeddings and stage.embed_tokens is not None
        return _Final(stage.norm, None if tied else stage.lm_head)
    return stage.layers[int(piece.split(".")[1]) - stage.start]


class _Final(nn.Module):
    """The final norm and (untied) LM head seen as one piece."""

    def __init__(self, norm: nn.Module, head: nn.Module | None) -> None:
        super().__init__()
        self.norm = norm
        if head is not None:
            self.head = head


def _set_param(root: nn.Module, name: str, p: nn.Parameter) -> None:
    *path, leaf = name.split(".")
    mod = root
    for part in path:
        mod = getattr(mod, part)
    setattr(mod, leaf, p)


class BlockZoo:
    """Per agent: piece address -> shared parameters with a reference count."""

    def __init__(self) -> None:
        self._entries: dict[PieceKey, _Entry] = {}
        self._lock = threading.Lock()  # loads run on the loader thread, reads anywhere

    def adopt(self, stage: model_mod.StageModel, piece_keys: list[PieceKey]) -> Adopted:
        """Point every piece of `stage` already held at the held parameters; register
        the others. `piece_keys` come from `keys()` on the stage's tensors."""
        new: list[PieceKey] = []
        new_bytes = shared_bytes = 0
        with self._lock:
            for key in piece_keys:
                mod = _module(stage, key.piece)
                entry = self._entries.get(key)
                if entry is None:
                    params = dict(mod.named_parameters())
                    nbytes = sum(p.nbytes for p in params.values())
                    entry = self._entries[key] = _Entry(params, nbytes)
                    new.append(key)
                    new_bytes += nbytes
                else:
                    for name, p in entry.params.items():
                        _set_param(mod, name, p)
                    shared_bytes += entry.nbytes
                entry.refs += 1
            if stage.cfg.tie_embeddings and stage.embed_tokens is not None:
                if stage.lm_head is not None:  # re-tie to the (possibly shared) table
                    stage.lm_head.weight = stage.embed_tokens.weight
        return Adopted(tuple(piece_keys), tuple(new), new_bytes, shared_bytes)

    def held_bytes(self, keys: list[PieceKey]) -> int:
        """Bytes of `keys` the zoo already holds (a load would not add them)."""
        with self._lock:
            return sum(e.nbytes for k in keys if (e := self._entries.get(k)) is not None)

    def release(self, keys: tuple[PieceKey, ...]) -> list[PieceKey]:
        """A stage let go of its pieces; returns those no stage uses any more (freed)."""
        freed: list[PieceKey] = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                entry.refs -= 1
                if entry.refs <= 0:
                    del self._entries[key]
                    freed.append(key)
        return freed

    def nbytes(self, key: PieceKey) -> int:
        with self._lock:
            e = self._entries.get(key)
            return 0 if e is None else e.nbytes

    def refs(self, key: PieceKey) -> int:
        with self._lock:
            e = self._entries.get(key)
            return 0 if e is None else e.refs

    @property
    def param_bytes(self) -> int:
        """Parameter bytes the agent holds in pieces (each counted once)."""
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    @property
    def num_pieces(self) -> int:
        with self._lock:
            return len(self._entries)

    def shared(self) -> int:
        """Pieces used by more than one stage."""
        with self._lock:
            return sum(1 for e in self._entries.values() if e.refs > 1)


@dataclass
class StagePieces:
    """A loaded stage's hold on the zoo (kept on the `Stage`, released at unload)."""

    zoo: BlockZoo
    adopted: Adopted
    released: bool = field(default=False)

    def release(self) -> list[PieceKey]:
        if self.released:
            return []
        self.released = True
        return self.zoo.release(self.adopted.keys)
