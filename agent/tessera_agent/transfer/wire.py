"""The data plane's message format: a fixed binary header, a JSON body, raw tensor bytes.

`group.Group.broadcast_object` sends every control message of a data-plane group (a TP
step, a KV move's header) as one frame made here, and decodes what a peer sends with
`decode`. Nothing a peer sends is ever executed: the body is JSON whose values are plain
scalars, lists, and tagged objects (`{"t": [...]}` a tuple, `{"d": [[k, v], ...]}` a dict,
`{"c": name, "f": {...}}` one of the `ALLOWED` dataclasses built through its constructor,
so its own checks run, `{"x": i}` the i-th tensor). A frame is refused (WireError) before
any of it is interpreted when its header is wrong (magic, version, sizes over the limits),
and while decoding when the JSON is deeper than `MAX_DEPTH`, names a class or dtype
outside the allow-lists, or a tensor's shape does not match its bytes.

Frame: `MAGIC` (4 bytes) · version (u8) · body length (u32) · tensor count (u32), then the
body, then per tensor its byte length (u64) and bytes. Little-endian throughout.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import struct
from typing import Any

import torch

MAGIC = b"TSW\x01"
VERSION = 1
HEADER = struct.Struct("<4sBII")
TENSOR_LEN = struct.Struct("<Q")
MAX_BODY_BYTES = 16 << 20  # the JSON part of one frame
MAX_FRAME_BYTES = 4 << 30  # a whole frame, tensors included (a TP step's hidden states)
MAX_TENSORS = 64
MAX_DEPTH = 32
# Dataclasses a peer may name, by module and qualified name; nothing else is constructed.
ALLOWED = frozenset(
    {
        "tessera_agent.engine.step.StepInput",
        "tessera_agent.engine.step.SeqChunk",
        "tessera_agent.engine.step.StepOutput",
        "tessera_agent.engine.sampling.SamplingParams",
        "tessera_agent.engine.sampling.TokenLogprobs",
    }
)
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


_PLAIN = frozenset({int, float, str, bool, type(None)})  # JSON's scalars (floats: finite)
_INT_OR_STR = frozenset({int, str})


class WireError(ValueError):
    """A frame that does not follow the format (or breaks a limit); nothing was built."""


def encode(obj: object) -> bytes:
    """One frame holding `obj` (scalars, lists, tuples, dicts, allowed dataclasses,
    tensors); WireError for anything else."""
    tensors: list[torch.Tensor] = []
    body = json.dumps(_to_json(obj, tensors, 0), separators=(",", ":")).encode()
    if len(body) > MAX_BODY_BYTES:
        raise WireError(f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    parts = [HEADER.pack(MAGIC, VERSION, len(body), len(tensors)), body]
    for t in tensors:
        raw = _tensor_bytes(t)
        parts += [TENSOR_LEN.pack(len(raw)), raw]
    frame = b"".join(parts)
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    return frame


def check_size(size: int) -> None:
    """Refuse a frame length announced by a peer before any buffer is allocated."""
    if not HEADER.size <= size <= MAX_FRAME_BYTES:
        raise WireError(f"frame length {size} outside [{HEADER.size}, {MAX_FRAME_BYTES}]")


def decode(frame: bytes, device: torch.device | None = None) -> object:
    """The object a frame holds; tensors land on `device` (CPU when None)."""
    check_size(len(frame))
    magic, version, body_len, count = HEADER.unpack_from(frame, 0)
    if magic != MAGIC or version != VERSION:
        raise WireError(f"not a data-plane frame (magic {magic!r}, version {version})")
    if body_len > MAX_BODY_BYTES or count > MAX_TENSORS:
        raise WireError(f"frame header: body {body_len} bytes, {count} tensors: over the limits")
    pos = HEADER.size + body_len
    if pos > len(frame):
        raise WireError("frame shorter than its header says")
    raw_tensors: list[bytes] = []
    for _ in range(count):
        if pos + TENSOR_LEN.size > len(frame):
            raise WireError("frame ends inside a tensor length")
        (n,) = TENSOR_LEN.unpack_from(frame, pos)
        pos += TENSOR_LEN.size
        if pos + n > len(frame):
            raise WireError("frame ends inside a tensor")
        raw_tensors.append(frame[pos : pos + n])
        pos += n
    if pos != len(frame):
        raise WireError(f"{len(frame) - pos} trailing bytes after the last tensor")
    try:
        body = json.loads(frame[HEADER.size : HEADER.size + body_len])
    except (ValueError, RecursionError) as exc:
        raise WireError(f"frame body is not JSON: {exc}") from exc
    return _from_json(body, raw_tensors, device, 0)


# -- encoding ---------------------------------------------------------------------------


def _to_json(obj: object, tensors: list[torch.Tensor], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"object nested deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj  # NaN and infinities too (Python's JSON reads its own NaN back)
    if isinstance(obj, list | tuple):
        if _INT_OR_STR.issuperset(map(type, obj)):  # the common case, checked in C
            items = list(obj)
        else:
            items = [_to_json(v, tensors, depth + 1) for v in obj]
        return items if isinstance(obj, list) else {"t": items}
    if isinstance(obj, dict):
        return {"d": [[_to_json(k, tensors, depth + 1), _to_json(v, tensors, depth + 1)]
                      for k, v in obj.items()]}  # fmt: skip
    if isinstance(obj, torch.Tensor):
        if len(tensors) >= MAX_TENSORS:
            raise WireError(f"more than {MAX_TENSORS} tensors in one frame")
        tensors.append(obj)
        dtype = str(obj.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise WireError(f"tensor dtype {dtype} cannot be sent")
        return {"x": len(tensors) - 1, "dtype": dtype, "shape": list(obj.shape)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        if name not in ALLOWED:
            raise WireError(f"{name} is not a data-plane message")
        fields = {}
        for k in _fields(type(obj)):
            v = getattr(obj, k)
            fields[k] = v if type(v) in _PLAIN else _to_json(v, tensors, depth + 1)
        return {"c": name, "f": fields}
    raise WireError(f"{type(obj).__name__} cannot be sent on the data plane")


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


# -- decoding ---------------------------------------------------------------------------


def _from_json(v: Any, raw: list[bytes], device: torch.device | None, depth: int) -> object:
    if depth > MAX_DEPTH:
        raise WireError(f"frame body nested deeper than {MAX_DEPTH}")
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list):
        if _PLAIN.issuperset(map(type, v)):  # the common case, checked in C
            return v
        return [_from_json(x, raw, device, depth + 1) for x in v]
    if not isinstance(v, dict) or len(v) not in (1, 2, 3):
        raise WireError("frame body: unknown value")
    if set(v) == {"t"} and isinstance(v["t"], list):
        items = v["t"]
        if _PLAIN.issuperset(map(type, items)):
            return tuple(items)
        return tuple(_from_json(x, raw, device, depth + 1) for x in items)
    if set(v) == {"d"} and isinstance(v["d"], list):
        out: dict[Any, Any] = {}
        for pair in v["d"]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise WireError("frame body: a dict entry is not a [key, value] pair")
            key = _from_json(pair[0], raw, device, depth + 1)
            if not isinstance(key, str | int | float | bool | tuple) and key is not None:
                raise WireError("frame body: unhashable dict key")
            out[key] = _from_json(pair[1], raw, device, depth + 1)
        return out
    if set(v) == {"x", "dtype", "shape"}:
        return _tensor(v, raw, device)
    if set(v) == {"c", "f"} and isinstance(v["f"], dict):
        return _dataclass(v["c"], v["f"], raw, device, depth)
    raise WireError(f"frame body: unknown tag {sorted(v)}")


def _tensor(v: dict[str, Any], raw: list[bytes], device: torch.device | None) -> torch.Tensor:
    index, dtype, shape = v["x"], v["dtype"], v["shape"]
    if not (isinstance(index, int) and 0 <= index < len(raw)):
        raise WireError(f"tensor index {index!r} outside the frame's {len(raw)} tensors")
    if dtype not in DTYPES:
        raise WireError(f"tensor dtype {dtype!r} is not allowed")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise WireError(f"tensor shape {shape!r} is not a list of sizes")
    dt = DTYPES[dtype]
    size = math.prod(shape) * torch.empty((), dtype=dt).element_size()
    data = raw[index]
    if size != len(data):
        raise WireError(f"tensor {dtype}{shape} needs {size} bytes, the frame has {len(data)}")
    if size == 0:
        t = torch.empty(shape, dtype=dt)
    else:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape)
    return t if device is None or device.type == "cpu" else t.to(device)


def _dataclass(
    name: object, fields: dict[str, Any], raw: list[bytes], device: torch.device | None, depth: int
) -> object:
    if not isinstance(name, str) or name not in ALLOWED:
        raise WireError(f"frame names {name!r}, not a data-plane message")
    cls = _class(name)
    qualname = cls.__qualname__
    if not fields.keys() <= _fields(cls):
        raise WireError(f"{qualname}: unknown fields {sorted(set(fields) - _fields(cls))}")
    values = {
        k: x if type(x) in _PLAIN else _from_json(x, raw, device, depth + 1)
        for k, x in fields.items()
    }
    try:
        return cls(**values)
    except Exception as exc:  # the class's own checks (engine errors included)
        raise WireError(f"{qualname}: {exc}") from exc


@functools.cache
def _class(name: str) -> type:
    """An `ALLOWED` dataclass by name (the caller checked the allow-list)."""
    module, _, qualname = name.rpartition(".")
    cls: type = getattr(importlib.import_module(module), qualname)
    return cls


@functools.cache
def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
