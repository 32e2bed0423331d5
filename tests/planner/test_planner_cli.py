"""`tessera plan` and `tessera plan assign` through the real argument parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from planner_helpers import ROOT

from tessera.cli import main as cli

EXAMPLES = ROOT / "examples"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("objective", ["throughput", "makespan"])
def test_plan_assign_example(objective: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "planner" / "assign-input.json"
    code, out, _ = _run(["plan", "assign", "--input", str(path), "--objective", objective], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["status"] == "optimal" and doc["certificate"]["optimal"]
    assert doc["certificate"]["primal"] == pytest.approx(doc["certificate"]["dual"], rel=1e-7)
    assert [r["name"] for r in doc["replicas"]] == ["tp1-a", "tp1-b", "tp2", "tp2pp2"]
    assert doc["replicas"][1]["rates"]["long"] <= 0.5 + 1e-9  # the limit holds
    if objective == "throughput":
        flow = doc["flow_check"]
        assert flow["lower"] <= doc["value"] + 1e-6 <= flow["upper"] + 2e-6
    else:
        assert max(r["utilization"] for r in doc["replicas"]) == pytest.approx(doc["value"])


def _write(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    "doc,message",
    [
        (
            {
                "classes": [{"demand": 1}, {"demand": 1}, {"demand": 1}],
                "replicas": [{"capacity": [1, 1, 1]}, {"capacity": [1, 1, -2]}],
            },
            "replicas[1].capacity[2]: must be >= 0",
        ),
        ({"classes": [{"demand": "lots"}], "replicas": []}, "classes[0].demand: must be a number"),
        (
            {"classes": [{"demand": 1}], "replicas": [{"capacity": [1, 2]}]},
            "replicas[0].capacity: expected 1 values",
        ),
        (
            {"classes": [{"demand": 1}], "replicas": [{"capacity": [1], "limits": ["x"]}]},
            "replicas[0].limits[0]: must be a number",
        ),
        ({"classes": [{"demand": 1}]}, "replicas: is required"),
        ([1, 2], "must be an object"),
    ],
)
def test_plan_assign_malformed_input(
    doc: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["plan", "assign", "--input", _write(tmp_path, doc)], capsys)
    assert code == 1 and out == ""
    assert message in err


def test_plan_assign_infeasible_and_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {"classes": [{"demand": 5}], "replicas": [{"capacity": [0]}]}
    code, _, err = _run(
        ["plan", "assign", "--input", _write(tmp_path, doc), "--objective", "makespan"], capsys
    )
    assert code == 1 and "classes[0].demand" in err
    (tmp_path / "bad.json").write_text("{nope")
    code, _, err = _run(["plan", "assign", "--input", str(tmp_path / "bad.json")], capsys)
    assert code == 1 and "not valid JSON" in err


def test_plan_manifest_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    base = [
        "plan",
        "-f",
        str(EXAMPLES / "planner" / "llama2-13b-h100.yaml"),
        "--cluster",
        str(EXAMPLES / "clusters" / "2x8-h100.yaml"),
    ]
    code, out, _ = _run(base, capsys)
    assert code == 0
    assert "profile: analytic" in out and "routing shares" in out and "[0," in out
    code, out, _ = _run([*base, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["profile_source"] == "analytic" and doc["model"] == "llama-2-13b"
    gpus = [tuple(g) for r in doc["replicas"] for g in r["gpus"]]
    assert len(gpus) == len(set(gpus)) <= 16
    for replica in doc["replicas"]:
        assert replica["stages"][0]["layers"][0] == 0 and replica["stages"][-1]["layers"][1] == 40
    for name in ("short", "long"):
        assert sum(r["shares"][name] for r in doc["replicas"]) == pytest.approx(1.0)


def test_plan_with_profile_file_and_a100(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tessera.cost import analytic
    from tessera.planner import manifest

    shape = manifest.read_model_shape(EXAMPLES / "models" / "llama-2-13b", "llama-2-13b")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(analytic.analytic_profile(shape, "a100-80gb").to_json()))
    argv = [
        "plan",
        "-f",
        str(EXAMPLES / "planner" / "llama2-13b-h100.yaml"),
        "--cluster",
        str(EXAMPLES / "clusters" / "2x8-a100.yaml"),
        "--profile",
        str(prof),
        "--json",
    ]
    code, out, _ = _run(argv, capsys)
    assert code == 0 and json.loads(out)["device"] == "a100-80gb"
    # an H100 profile does not match an A100 cluster
    argv[4] = str(EXAMPLES / "clusters" / "2x4-h100.yaml")
    code, _, err = _run(argv, capsys)
    assert code == 1 and "gpuType 'a100-80gb'" in err


def _manifest(tmp_path: Path, edit: Any) -> str:
    doc = yaml.safe_load((EXAMPLES / "planner" / "llama2-13b-h100.yaml").read_text())
    doc["spec"]["model"]["path"] = str(EXAMPLES / "models" / "llama-2-13b")
    edit(doc)
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda d: d["spec"]["workload"]["classes"][1].update(outputTokens=0),
            "spec.workload.classes[1].outputTokens: must be >= 1",
        ),
        (lambda d: d["spec"]["slo"].pop("tpotP99Ms"), "spec.slo.tpotP99Ms: is required"),
        (lambda d: d["spec"]["model"].update(path="/nonexistent"), "spec.model.path"),
        (
            lambda d: d["spec"]["resources"].update(gpus=0),
            "spec.resources.gpus: is required for planning (>= 1)",
        ),
        (lambda d: d.update(kind="Deployment"), "kind: must be ServingDeployment"),
    ],
)
def test_plan_malformed_manifest(
    edit: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "plan",
        "-f",
        _manifest(tmp_path, edit),
        "--cluster",
        str(EXAMPLES / "clusters" / "2x4-h100.yaml"),
    ]
    code, out, err = _run(argv, capsys)
    assert code == 1 and out == ""
    assert message in err


def test_plan_malformed_cluster_and_missing_args(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = yaml.safe_load((EXAMPLES / "clusters" / "2x4-h100.yaml").read_text())
    cluster["spec"]["nodes"][1]["gpus"] = -1
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    argv = ["plan", "-f", _manifest(tmp_path, lambda d: None), "--cluster", str(path)]
    code, _, err = _run(argv, capsys)
    assert code == 1 and "spec.nodes[1].gpus: must be >= 0" in err
    code, _, err = _run(["plan"], capsys)
    assert code == 1 and "--cluster" in err


def test_cluster_examples_parse() -> None:
    from tessera.planner import cluster

    for path in sorted((EXAMPLES / "clusters").glob("*.yaml")):
        spec = cluster.cluster_from_doc(yaml.safe_load(path.read_text()))
        gpu_nodes = [n for n in spec.nodes if n.gpus]
        assert len(gpu_nodes) == 2 and all(n.gpu_memory_bytes == 80 * 2**30 for n in gpu_nodes)


def test_cli_choices_match_the_planner_and_core_stays_light() -> None:
    import subprocess
    import sys

    from tessera.cli import plan_cmd
    from tessera.planner import assign, search

    assert plan_cmd.METHODS == search.METHODS
    assert plan_cmd.OBJECTIVES == assign.OBJECTIVES
    code = (
        "import sys, tessera.planner.search, tessera.planner.bench, tessera.cost.fit, "
        "tessera.cli.plan_cmd\n"
        "bad = {'torch', 'grpc', 'kopf', 'tessera_agent', 'tessera_operator'} & set(sys.modules)\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
