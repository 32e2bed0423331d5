"""OpenMP teams of helper threads are released after their work (omp_teams)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tessera_agent.engine import omp_teams

# Run in a fresh process: a clean OpenMP state, two intra-op threads on any machine.
PROBE = """
import concurrent.futures, json, os, sys, time, torch
from tessera_agent.engine import omp_teams
torch.set_num_threads(2)
def tasks():
    return len(os.listdir("/proc/self/task"))
def work():
    torch.ones(1 << 22).mul_(2).sum()  # a parallel region: this thread gets a team
    return tasks()
def settled(n):
    deadline = time.monotonic() + 5  # released workers exit asynchronously
    while tasks() > n and time.monotonic() < deadline:
        time.sleep(0.01)
    return tasks()
plain = concurrent.futures.ThreadPoolExecutor(1)
base = plain.submit(tasks).result()
team = plain.submit(work).result()
kept = settled(base)
rel = omp_teams.ReleasingPool(1, release=sys.argv[1] == "1")
rel_base = rel.submit(tasks).result()
rel.submit(work).result()
print(json.dumps({"base": base, "team": team, "kept": kept, "rel_base": rel_base,
                  "after_release": settled(rel_base)}))
"""


def _probe(release: bool) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "1" if release else "0"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_releasing_pool_frees_the_team_a_job_built() -> None:
    import torch  # noqa: F401  (loads torch's libgomp into this process)

    if omp_teams._pause() is None:
        pytest.skip("no libgomp in this torch build: nothing to release")
    got = _probe(True)
    assert got["team"] > got["base"]  # a plain pool thread keeps its team ...
    assert got["kept"] == got["team"]
    assert got["after_release"] == got["rel_base"]  # ... a releasing pool's does not
    off = _probe(False)
    assert off["after_release"] > off["rel_base"]  # release=False (TESSERA_OMP_RELEASE=0) keeps it
