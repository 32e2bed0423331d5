"""`tessera up` watching its manifest (`cli.up_watch`), without agents: a changed layout
is returned once with a bumped generation, bad changes are reported and ignored, and the
loop runs converge passes right after a change and until the transition is done."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

from tessera import api
from tessera.cli import bench_relayout, up_watch


def _write(path: Path, doc: object, stamp: int) -> None:
    path.write_text(yaml.safe_dump(doc))
    os.utime(path, ns=(stamp, stamp))  # distinct mtimes even on coarse clocks


def test_watcher_returns_valid_changes_once_and_reports_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    first = bench_relayout.manifest(tmp_path / "model", 0)
    _write(path, first, 1)
    w = up_watch.ManifestWatcher(path, api.parse(first))
    assert w.poll() is None  # unchanged
    _write(path, first, 2)
    assert w.poll() is None  # touched, same spec
    _write(path, bench_relayout.manifest(tmp_path / "model", 1), 3)
    new = w.poll()
    assert new is not None and new.generation == 1 and w.current is new
    assert [len(r.stages) for r in new.spec.layout.replicas] == [1, 2]
    assert w.poll() is None
    path.write_text("spec: [unclosed")
    os.utime(path, ns=(4, 4))
    with pytest.raises(up_watch.ManifestError, match="keeping the running layout"):
        w.poll()
    assert w.poll() is None  # reported once per change
    other = bench_relayout.manifest(tmp_path / "model", 2)
    other["metadata"]["name"] = "other"
    _write(path, other, 5)
    with pytest.raises(up_watch.ManifestError, match="restart"):
        w.poll()
    model = bench_relayout.manifest(tmp_path / "elsewhere", 2)
    _write(path, model, 6)
    with pytest.raises(up_watch.ManifestError, match=r"spec\.model"):
        w.poll()
    assert w.current is new  # nothing bad was taken


async def test_loop_converges_after_a_change_until_the_transition_is_done(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.yaml"
    _write(path, bench_relayout.manifest(tmp_path / "model", 0), 1)
    w = up_watch.ManifestWatcher(path, api.parse(yaml.safe_load(path.read_text())))
    stop = asyncio.Event()
    passes: list[int] = []
    notes: list[str] = []

    async def converge_pass(dep: api.ServingDeployment) -> bool:
        passes.append(dep.generation)
        if len(passes) >= 3:
            stop.set()
        return len(passes) < 3  # the transition takes three passes

    loop = asyncio.create_task(
        up_watch.run_loop(stop, w, converge_pass, notes.append, 3600.0, 0.01)
    )
    await asyncio.sleep(0.05)
    assert passes == []  # nothing changed, the reconcile interval is long
    _write(path, bench_relayout.manifest(tmp_path / "model", 1), 2)
    await asyncio.wait_for(loop, 30)
    assert passes == [1, 1, 1]
    assert notes == ["manifest changed: applying generation 1"]
