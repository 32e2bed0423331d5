"""The data plane's frames (`transfer.wire`): round trips, and crafted frames refused
without being deserialized (a pickle payload never runs)."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from tessera_agent.engine import sampling, step
from tessera_agent.transfer import group, wire


class _Boom:
    """Unpickling this writes a file: proof that a payload ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (Path(self.path), "pwned"))


def _frame(body: Any, tensors: tuple[bytes, ...] = (), magic: bytes = wire.MAGIC) -> bytes:
    raw = json.dumps(body).encode()
    parts = [wire.HEADER.pack(magic, wire.VERSION, len(raw), len(tensors)), raw]
    for t in tensors:
        parts += [wire.TENSOR_LEN.pack(len(t)), t]
    return b"".join(parts)


def test_a_step_round_trips() -> None:
    params = sampling.SamplingParams(max_tokens=3, temperature=0.5, seed=7, stop_token_ids=(2,))
    chunk = step.SeqChunk("s", 0, 2, (1, 2), True, params)
    hidden = torch.randn(2, 4, dtype=torch.bfloat16)
    inp = step.StepInput(3, [chunk], hidden=hidden, finished=["x"])
    out = wire.decode(wire.encode(("step", inp)))
    assert isinstance(out, tuple) and out[0] == "step"
    got = out[1]
    assert isinstance(got, step.StepInput)
    assert got.chunks == [chunk] and got.finished == ["x"] and got.step_id == 3
    assert got.hidden is not None and torch.equal(got.hidden, hidden)
    assert wire.decode(wire.encode({"a": (1, 2.5, None), 3: [float("inf")]})) == {
        "a": (1, 2.5, None),
        3: [float("inf")],
    }


def test_a_pickle_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps(_Boom(str(marker)))
    with pytest.raises(wire.WireError):
        wire.decode(payload)
    # a pickle behind a valid header is still only bytes to the JSON parser
    framed = wire.HEADER.pack(wire.MAGIC, wire.VERSION, len(payload), 0) + payload
    with pytest.raises(wire.WireError):
        wire.decode(framed)
    assert not marker.exists()


def test_a_pickle_payload_fails_the_group(tmp_path: Path) -> None:
    """The receiving side of a group: a crafted frame fails the group, nothing runs."""
    marker = tmp_path / "ran"
    g = group.Group.__new__(group.Group)  # only the decoding half is exercised
    g.spec = group.GroupSpec("127.0.0.1:1", "evil", 1, 2)
    g.device, g.failed = torch.device("cpu"), None
    with pytest.raises(group.GroupError, match="bad frame"):
        g.decode_frame(pickle.dumps(_Boom(str(marker))), root=0)
    assert g.failed is not None and not marker.exists()


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x80\x04K\x01.",  # pickle of 1
        _frame(1, magic=b"XXXX"),
        _frame({"c": "os.system", "f": {"command": "true"}}),
        _frame({"c": "builtins.eval", "f": {}}),
        _frame({"c": "tessera_agent.engine.step.SeqChunk", "f": {"evil": 1}}),
        _frame({"c": "tessera_agent.engine.sampling.SamplingParams", "f": {"max_tokens": 0}}),
        _frame({"x": 0, "dtype": "float32", "shape": [4]}, (b"\0" * 8,)),  # 16 bytes needed
        _frame({"x": 1, "dtype": "float32", "shape": [1]}, (b"\0" * 4,)),
        _frame({"x": 0, "dtype": "object", "shape": [1]}, (b"\0" * 8,)),
        _frame({"x": 0, "dtype": "float32", "shape": [-1]}, (b"",)),
        _frame({"zz": 1}),
        _frame({"d": [[1]]}),
        _frame(json.loads("[" * 40 + "]" * 40)),
        _frame(1) + b"trailing",
        wire.HEADER.pack(wire.MAGIC, wire.VERSION, 1 << 30, 0),
        wire.HEADER.pack(wire.MAGIC, wire.VERSION, 2, 10_000) + b"{}",
    ],
)
def test_crafted_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(frame)


def test_announced_sizes_are_checked_before_allocating() -> None:
    with pytest.raises(wire.WireError):
        wire.check_size(wire.MAX_FRAME_BYTES + 1)
    with pytest.raises(wire.WireError):
        wire.check_size(-1)


def test_only_allowed_objects_are_sent() -> None:
    with pytest.raises(wire.WireError):
        wire.encode(_Boom("x"))
    with pytest.raises(wire.WireError):
        wire.encode(struct)


def test_header_is_fixed_size() -> None:
    assert wire.HEADER.size == 13
    frame = wire.encode(None)
    assert frame[:4] == wire.MAGIC and len(frame) == wire.HEADER.size + len(b"null")


def test_a_kv_import_meets_only_on_the_agents_own_store() -> None:
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera_agent.engine import errors
    from tessera_agent.transfer import kv_copy

    own = "10.0.0.5:29500"
    dp = pb.DataPlane(store_address="evil.example:1", group="kv/x")
    with pytest.raises(errors.InvalidArgumentError, match="own store"):
        kv_copy.pair_spec(dp, kv_copy.IMPORTER, own)
    ok = kv_copy.pair_spec(pb.DataPlane(store_address=own, group="kv/x"), kv_copy.IMPORTER, own)
    assert ok.store_address == own and ok.rank == kv_copy.IMPORTER


@pytest.mark.parametrize(
    "header",
    [
        "not a list",
        [("w", "float32")],
        [("other", "float32", (2,))],
        [("w", "float32", (2,)), ("w", "float32", (2,))],
        [("w", "object", (2,))],
        [("w", "float32", (-1,))],
        [("w", "float32", [2])],
        [("w", "float32", (1 << 30, 1 << 30))],
    ],
)
def test_a_block_copy_header_is_schema_checked(header: object) -> None:
    from tessera_agent.transfer import block_copy

    with pytest.raises(group.GroupError):
        block_copy.check_header(header, ["w", "b"])


def test_a_good_block_copy_header_passes() -> None:
    from tessera_agent.transfer import block_copy

    header = [("w", "bfloat16", (2, 3)), ("b", "float32", ())]
    assert block_copy.check_header(header, ["w", "b"]) == header


def test_every_dataclass_a_step_can_hold_is_allowed_on_the_wire() -> None:
    """A new dataclass inside StepInput/StepOutput must be added to `wire.ALLOWED`, or TP
    steps would fail to encode."""
    import dataclasses
    import typing

    seen: set[type] = set()

    def walk(tp: object) -> None:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if tp in seen:
                return
            seen.add(tp)
            for hint in typing.get_type_hints(tp).values():
                walk(hint)
        for arg in typing.get_args(tp):
            walk(arg)

    walk(step.StepInput)
    walk(step.StepOutput)
    names = {f"{t.__module__}.{t.__qualname__}" for t in seen}
    assert names <= wire.ALLOWED, names - wire.ALLOWED
