"""From real agents' measured step profiles to the switching loop's hysteresis (issue 34):
`tessera profile` on two local agents (tiny checkpoint, CPU), `tessera calibrate
--profiles` fitted on one and judged on the other, the calibration read by the operator,
and its per-layout error deciding a switch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.cli import main as cli
from tessera.cli import operator_cmd
from tessera.cost import profile as cost_profile
from tessera.policies.switching import gain as switching
from tessera_operator import switching_loop
from tests.operator.test_switching_loop_unit import HELD, SNAP, _dep

pytestmark = pytest.mark.slow

ONE = [{"name": "r0", "stages": [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]}]
TWO = [
    {
        "name": "r0",
        "stages": [
            {"agent": "agent-0", "device": "cpu:0", "layers": [0, 4]},
            {"agent": "agent-1", "device": "cpu:0", "layers": [4, 8]},
        ],
    }
]


def _profile(address: str, model: Path, out: Path) -> None:
    args = ["profile", "--agent", address, "--model", str(model), "--out", str(out)]
    args += ["--repeats", "3", "--prefill", "8,32,64,128", "--batches", "1,2,4,8"]
    assert cli.main([*args, "--contexts", "16,64"]) == 0


def test_real_profiles_calibrate_the_switching_threshold(
    agents_factory: Callable[..., list],
    tiny_llama: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a0, a1 = agents_factory(2)
    fit_doc, held_doc = tmp_path / "a0.json", tmp_path / "a1.json"
    _profile(a0.address, tiny_llama, fit_doc)
    _profile(a1.address, tiny_llama, held_doc)
    cal_path, prof_path = tmp_path / "cal.json", tmp_path / "fitted.json"
    capsys.readouterr()
    argv = ["calibrate", "--profiles", str(fit_doc), "--held-out", str(held_doc)]
    argv += ["--layouts", "tp1pp1,tp1pp2", "--out", str(cal_path)]
    assert cli.main([*argv, "--profile-out", str(prof_path)]) == 0
    table = capsys.readouterr().out
    assert "tp1pp1 |" in table and "tp1pp2 |" in table, table

    doc = json.loads(cal_path.read_text())
    by = {e["layout"]: e for e in doc["layouts"]}
    assert set(by) == {"tp1pp1", "tp1pp2"}
    for e in by.values():
        # judged on the other agent's profile: 4 prefills + 8 decodes, all held out
        assert e["held_out"] and e["eval_samples"] == 12 and e["fit_samples"] == 12
        assert 0 <= e["error_median"] <= e["error_max"]
    assert cost_profile.profile_from_json(json.loads(prof_path.read_text())).source == "measured"

    # the operator reads it; the planner's names for these layouts resolve to their shapes
    op = cli.build_parser().parse_args(["operator", "--switching-calibration", str(cal_path)])
    cal = operator_cmd.build_config(op).switching_calibration
    e_one, e_two = cal.error("1x tp1pp1"), cal.error("1x[tp1pp2]")
    assert e_one == pytest.approx(min(0.99, by["tp1pp1"]["error_max"]))
    assert e_two == pytest.approx(min(0.99, by["tp1pp2"]["error_max"]))
    cfg = switching.SwitchingConfig()
    need = switching.gain_threshold(
        cfg,
        switching.DeploymentCost("1x tp1pp1", 3.0, e_one),
        switching.DeploymentCost("1x[tp1pp2]", 1.0, e_two),
    )
    assert need == pytest.approx((1 + e_two) / (1 - e_one) - 1)

    # the loop: a gain just under the threshold stays, one just over switches
    dep, spec = _dep("active")
    names = {"1x tp1pp1": ONE, "1x[tp1pp2]": TWO}

    def cands(gain: float) -> switching_loop.SwitchingCandidates:
        target = {"1x tp1pp1": 3.0, "1x[tp1pp2]": 3.0 / (1 + gain)}
        raw = {n: t / cal.factor(n) for n, t in target.items()}  # priced through the file

        def price(name: str, demand: tuple[float, ...]) -> float:
            return float(cal.price(name, raw[name]))

        return switching_loop.SwitchingCandidates(
            {"A": names["1x tp1pp1"], "B": names["1x[tp1pp2]"]},
            lambda n, d: price("1x tp1pp1" if n == "A" else "1x[tp1pp2]", d),
            lambda a, b: 1.0,
            lambda n: cal.error("1x tp1pp1" if n == "A" else "1x[tp1pp2]"),
        )

    stay = switching_loop.decide(dep, spec, HELD, False, SNAP, cands(need * 0.9), "t")
    assert stay.layout is None and stay.status["reason"] == "Stay", stay.status
    go = switching_loop.decide(dep, spec, HELD, False, SNAP, cands(need * 1.1 + 0.01), "t")
    assert go.layout is not None, go.status
