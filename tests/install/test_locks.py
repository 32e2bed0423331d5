"""The locks agree with pyproject.toml, carry hashes, and are what the venv holds (issue 28)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.install import locks


def _requirements(*groups: str) -> list[Requirement]:
    project = tomllib.loads((locks.ROOT / "pyproject.toml").read_text())["project"]
    out = []
    for group in groups:
        raw = project["dependencies"] if group == "" else project["optional-dependencies"][group]
        out.extend(Requirement(r) for r in raw)
    return out


def test_pyproject_has_not_changed_since_the_locks_were_made() -> None:
    recorded = locks.STAMP.read_text().split()[-1]
    assert recorded == locks.fingerprint(), (
        "pyproject.toml's dependencies (or requirements/control-plane.*) changed since the "
        f"locks were made: {locks.FIX}"
    )


@pytest.mark.parametrize(
    ("lock", "groups"), [(locks.DEV_LOCK, ("", "dev")), (locks.AGENT_LOCK, ("",))]
)
def test_every_declared_requirement_is_pinned_within_its_range(
    lock: Path, groups: tuple[str, ...]
) -> None:
    pins = locks.pins(lock)
    wrong = []
    for req in _requirements(*groups):
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        pin = pins.get(locks.canonical(req.name))
        if pin is None or not req.specifier.contains(pin, prereleases=True):
            wrong.append(f"{req} -> {pin}")
    assert not wrong, f"{lock.name} does not satisfy pyproject.toml: {wrong}; {locks.FIX}"


@pytest.mark.parametrize("lock", locks.LOCKS, ids=lambda p: p.name)
def test_every_pin_has_a_hash(lock: Path) -> None:
    assert locks.pins(lock)
    assert locks.unhashed(lock) == []


@pytest.mark.parametrize("lock", [locks.AGENT_LOCK, locks.CONTROL_PLANE_LOCK], ids=lambda p: p.name)
def test_image_locks_hold_the_versions_the_tests_run_against(lock: Path) -> None:
    dev = locks.pins(locks.DEV_LOCK)
    differ = {n: (v, dev.get(n)) for n, v in locks.pins(lock).items() if dev.get(n) != v}
    assert not differ, f"{lock.name} differs from dev.lock: {differ}; {locks.FIX}"


def test_torch_is_the_cpu_wheel_everywhere_it_is_locked() -> None:
    assert locks.pins(locks.DEV_LOCK)["torch"] == "2.13.0+cpu"
    assert locks.pins(locks.AGENT_LOCK)["torch"] == "2.13.0+cpu"
    assert "torch" not in locks.pins(locks.CONTROL_PLANE_LOCK)


def test_no_lock_pulls_the_gpu_extra_or_cuda_packages() -> None:
    """CPU installs never pull CUDA: the `gpu` extra (FlashInfer) stays out of every lock,
    as do CUDA runtimes and Triton (docs/gpu.md)."""
    gpu = {locks.canonical(r.split(">")[0].split("=")[0]) for r in _extra("gpu")}
    assert gpu == {"flashinfer-python"}
    for lock in locks.LOCKS:
        names = set(locks.pins(lock))
        cuda = {n for n in names if n.startswith(("nvidia-", "cuda-", "triton", "flashinfer"))}
        assert not (names & gpu) and cuda <= {"nvidia-ml-py"}, (lock.name, cuda)


def _extra(name: str) -> list[str]:
    pyproject = tomllib.loads((locks.ROOT / "pyproject.toml").read_text())
    extra: list[str] = pyproject["project"]["optional-dependencies"][name]
    return extra


def test_the_venv_holds_exactly_the_dev_lock() -> None:
    """What the tests import is what the lock says (a stale .venv shows up here)."""
    wrong = {}
    for name, version in locks.pins(locks.DEV_LOCK).items():
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"installed differs from dev.lock: {wrong}; run `make clean test`"


def test_a_changed_range_is_detected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The fingerprint moves when a range moves, even one the pinned version still meets."""
    text = (locks.ROOT / "pyproject.toml").read_text()
    assert '"numpy>=' in text
    fake = tmp_path / "pyproject.toml"
    fake.write_text(text.replace('"numpy>=', '"numpy!=0.0.1,>=', 1))
    for name in ("control-plane.in", "control-plane.overrides"):
        (tmp_path / "requirements").mkdir(exist_ok=True)
        (tmp_path / "requirements" / name).write_text((locks.REQ / name).read_text())
    before = locks.fingerprint()
    monkeypatch.setattr(locks, "ROOT", tmp_path)
    monkeypatch.setattr(locks, "REQ", tmp_path / "requirements")
    assert locks.fingerprint() != before


def _fake_wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel of `name==version` (what a newer release on the index, or
    a tampered file, would look like to pip)."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        raw = hashlib.sha256(data).digest()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    record = "".join(f"{p},sha256={digest(d)},{len(d)}\n" for p, d in files.items())
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(p, d)
        zf.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return path


def _lock_entry(lock: Path, name: str) -> str:
    lines = lock.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name}=="))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), None)
    return "\n".join(lines[start:end]) + "\n"


def _pip_dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's pip.conf adds indexes and caps
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    cmd += ["--no-index", "--no-deps"]
    cmd += ["--find-links", str(tmp_path), "--report", "-", "--quiet", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_the_lock_ignores_a_newer_release_and_a_tampered_file(tmp_path: Path) -> None:
    """Offline: an index whose newest `rich` is 99.0.0 gives 99.0.0 to an unlocked install,
    and nothing to the locked one (it wants the locked version with its hash); a file of the
    locked version with other contents fails the hash check."""
    locked = locks.pins(locks.DEV_LOCK)["rich"]
    _fake_wheel(tmp_path, "rich", "99.0.0")
    unlocked = _pip_dry_run(tmp_path, "rich>=13")
    assert unlocked.returncode == 0, unlocked.stderr
    report = json.loads(unlocked.stdout)
    assert [i["metadata"]["version"] for i in report["install"]] == ["99.0.0"]

    lock = tmp_path / "one.lock"
    lock.write_text(_lock_entry(locks.DEV_LOCK, "rich"))
    refused = _pip_dry_run(tmp_path, "--require-hashes", "-r", str(lock))
    assert refused.returncode != 0
    assert f"rich=={locked}" in refused.stderr, refused.stderr

    _fake_wheel(tmp_path, "rich", locked)  # the locked version, other bytes
    tampered = _pip_dry_run(tmp_path, "--require-hashes", "-r", str(lock))
    assert tampered.returncode != 0
    assert "HASHES" in tampered.stderr.upper(), tampered.stderr
