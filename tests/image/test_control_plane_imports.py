"""The control-plane image's Python side, without building it: its pins and its imports.

The control-plane image installs requirements/control-plane.lock and then the project with
`--no-deps`, so the operator and the gateway must import nothing outside that list — above
all no torch and no transformers. A subprocess hides every installed distribution that is not
pinned there (as if it were absent) and imports the entry points: the `tessera` CLI with its
`operator` and `gateway` commands, every operator and gateway module, the planner and the
gRPC layer. A control import of the agent's engine under the same blocker must fail.
`make image-check` then runs the real image.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.image import control_plane_requirements as cpr

# Runs in a fresh interpreter: argv[1] is the allowed distributions, argv[2:] the modules
# ("pkg:" also imports every submodule; "pkg:a,b" all but pkg.a* and pkg.b*).
_BLOCKED_IMPORT = r"""
import importlib, importlib.abc, importlib.metadata as md, pkgutil, re, sys

preloaded = set(sys.modules)  # the interpreter's start (site, .pth hooks)
allowed = set(sys.argv[1].split(","))
own = {"tessera", "tessera_agent", "tessera_operator"}
canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
blocked = {
    top for top, dists in md.packages_distributions().items()
    if top not in own and not any(canon(d) in allowed for d in dists)
}
assert {"torch", "transformers"} <= blocked, sorted(blocked)


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the image)", name=name)
        return None


sys.meta_path.insert(0, Absent())
for spec in sys.argv[2:]:
    name, walk, excluded = spec.partition(":")
    module = importlib.import_module(name)
    if walk:  # every submodule but the excluded prefixes (comma-separated)
        skip = tuple(f"{name}.{s}" for s in excluded.split(",") if s)
        for info in pkgutil.walk_packages(module.__path__, f"{name}."):
            if not info.name.startswith(skip):
                importlib.import_module(info.name)
if any(a.startswith("tessera.cli") for a in sys.argv[2:]):
    from tessera.cli import main
    for argv in (["--help"], ["operator", "--help"], ["gateway", "--help"], ["bench", "--help"]):
        try:
            main.main(argv)
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code)
    # A command that needs torch says so and exits 2 instead of a traceback.
    assert main.main(["agent", "--devices", "cpu:1x1GiB"]) == 2
leaked = sorted(m for m in set(sys.modules) - preloaded if m.partition(".")[0] in blocked)
assert not leaked, leaked
print("imported", len(sys.modules), "modules")
"""

CONTROL_PLANE_ENTRY = [
    "tessera.cli.main",
    "tessera.cli.operator_cmd",
    "tessera.cli.gateway_cmd",
    "tessera_operator:testing,bench_",  # test support (kmock) and benchmarks stay out
    "tessera.gateway:",
    "tessera.planner:bench",
    "tessera.policies:",  # the elastic policies the operator and the gateway apply
    "tessera.rpc:regen",  # regen needs grpc_tools (dev)
    "tessera.crd",
]


def _run_blocked(*modules: str) -> subprocess.CompletedProcess[str]:
    allowed = ",".join(sorted(cpr.pins()))
    return subprocess.run(
        [sys.executable, "-c", _BLOCKED_IMPORT, allowed, *modules],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_control_plane_entry_points_import_only_pinned_distributions() -> None:
    proc = _run_blocked(*CONTROL_PLANE_ENTRY)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("module", ["tessera_agent.server", "tessera.workload.lstm"])
def test_the_blocker_catches_torch(module: str) -> None:
    proc = _run_blocked(module)
    assert proc.returncode != 0
    assert "'torch'" in proc.stderr


def test_pins_are_exact_and_never_torch_or_transformers() -> None:
    pins = cpr.pins()  # raises on anything but ==
    assert pins
    bad = [n for n in pins if n.startswith(cpr.FORBIDDEN)] + sorted(cpr.excluded() & set(pins))
    assert not bad, bad


def test_pins_are_the_closure_of_the_roots() -> None:
    """Same names as the installed closure: nothing missing for --no-deps, nothing extra."""
    assert set(cpr.pins()) == set(cpr.closure(cpr.roots(), cpr.excluded())), (
        "requirements/control-plane.lock is stale: run `make lock`"
    )


def test_roots_are_project_dependencies_and_pins_satisfy_them() -> None:
    project = tomllib.loads((cpr.ROOT / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    pins = cpr.pins()
    for root in cpr.roots():
        assert root in declared, f"{root} is not a dependency in pyproject.toml"
        assert declared[root].specifier.contains(pins[root]), (root, pins[root])
