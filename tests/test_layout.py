"""Repository layout rules: no package shadows the standard library's `operator`."""

from __future__ import annotations

import operator
import subprocess
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_operator_is_the_standard_library() -> None:
    assert Path(operator.__file__).parent == Path(sysconfig.get_paths()["stdlib"])


def test_operator_and_agent_folders_are_not_packages() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert not (ROOT / "agent" / "__init__.py").exists()


def test_no_large_files_tracked() -> None:
    """Checkpoints are generated at test time, never committed."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    tracked = [ROOT / n for n in out.stdout.decode().split("\0") if n]
    big = [p for p in tracked if p.is_file() and p.stat().st_size > 2 << 20]
    assert not big, big
    assert not [p for p in tracked if p.suffix in (".safetensors", ".bin", ".pt")]
