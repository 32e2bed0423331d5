"""The committed gRPC stubs are exactly what protoc generates from proto/."""

from __future__ import annotations

from pathlib import Path

from tessera.rpc import regen

ROOT = Path(__file__).resolve().parents[1]


def test_stubs_match_proto(tmp_path: Path) -> None:
    written = regen.generate(tmp_path)
    assert written
    for path in written:
        rel = path.relative_to(tmp_path)
        committed = ROOT / "src" / rel
        assert committed.is_file(), f"{rel} is generated but not committed; run `make proto`"
        assert committed.read_text() == path.read_text(), f"{rel} is stale; run `make proto`"
