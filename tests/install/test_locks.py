"""The locks agree with pyproject.toml, carry hashes, and are what the venv holds (issue 28)."""

from __future__ import annotations

import importlib.metadata as md
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
    assert '"numpy>=1.26"' in text
    fake = tmp_path / "pyproject.toml"
    fake.write_text(text.replace('"numpy>=1.26"', '"numpy>=1.27"'))
    for name in ("control-plane.in", "control-plane.overrides"):
        (tmp_path / "requirements").mkdir(exist_ok=True)
        (tmp_path / "requirements" / name).write_text((locks.REQ / name).read_text())
    before = locks.fingerprint()
    monkeypatch.setattr(locks, "ROOT", tmp_path)
    monkeypatch.setattr(locks, "REQ", tmp_path / "requirements")
    assert locks.fingerprint() != before
