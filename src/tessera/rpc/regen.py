"""Regenerates the committed gRPC/protobuf stubs from `proto/` (`make proto`).

Called by `make proto` and by the test that regenerates into a temporary folder and
diffs against the committed stubs, so the contract and the code can never drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTOS = ("tessera/rpc/v1/agent.proto",)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def generate(out_dir: Path, proto_root: Path | None = None) -> list[Path]:
    """Run protoc (from grpcio-tools) for every proto into `out_dir`; return written files."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    root = proto_root or repo_root() / "proto"
    include = Path(protoc.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS:
        args = [
            "protoc",
            f"-I{root}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--pyi_out={out_dir}",
            str(root / proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {proto}")
    return sorted(p for p in out_dir.rglob("*_pb2*.py*"))


def main() -> int:
    written = generate(repo_root() / "src")
    for p in written:
        sys.stdout.write(f"wrote {p}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
