"""`tessera calibrate`: fit the latency model's calibration and report its error per layout.

Registered by `tessera.cli.main`. Input, one of: `--profiles FILE... --held-out FILE...`
(real agents' `tessera profile` documents, or a GPU bench's; judged per layout
`--layouts tp1pp1,...` by `cost.profile_calibration`; `--profile-out FILE` writes the fitted
cost profile), or `--samples FILE` (a JSON list of `{"layout", "predicted_s",
"measured_s", "split", "point", "note"}` measurements). Output: the calibration
(`cost.calibration.dump`, `--out FILE`), read by the operator's `--switching-calibration`,
and the per-layout error table (`--json`: the document).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit the latency model's calibration to measured runs")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--samples", type=Path, help="JSON list of measurements")
    src.add_argument(
        "--profiles", type=Path, nargs="+", help="measured profiles to fit (tessera profile)"
    )
    p.add_argument(
        "--held-out", type=Path, nargs="+", default=[], help="measured profiles to judge on"
    )
    p.add_argument("--layouts", default="", help="with --profiles: e.g. tp1pp1,tp1pp2")
    p.add_argument("--profile-out", type=Path, default=None, help="write the fitted profile")
    p.add_argument("--out", type=Path, default=None, help="write the calibration here")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.set_defaults(func=_run)


def samples_from_json(doc: Any) -> list[Any]:
    """Samples from a JSON list (ValueError naming the entry that is not one)."""
    from tessera.cost import calibration

    if not isinstance(doc, list):
        raise ValueError("samples: expected a JSON list")
    out = []
    for i, s in enumerate(doc):
        try:
            out.append(
                calibration.Sample(
                    str(s["layout"]),
                    float(s["predicted_s"]),
                    float(s["measured_s"]),
                    str(s.get("split", "fit")),
                    str(s.get("note", "")),
                    tuple(float(x) for x in s.get("point", ())),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"samples[{i}]: {exc}") from exc
    return out


def _run(args: argparse.Namespace) -> int:
    from tessera.cost import calibration

    try:
        if args.profiles:
            cal = _from_profiles(args)
        else:
            cal = calibration.fit(samples_from_json(json.loads(args.samples.read_text())))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"tessera calibrate: {exc}\n")
        return 1
    doc = calibration.dump(cal)
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return 0
    sys.stdout.write("layout | fit / held-out | raw median / max | calibrated median / max\n")
    for e in cal.layouts.values():
        sys.stdout.write(
            f"{e.layout} | {e.fit_samples} / {e.eval_samples} | "
            f"{e.raw_median:.1%} / {e.raw_max:.1%} | {e.median:.1%} / {e.max:.1%}\n"
        )
    return 0


def _from_profiles(args: argparse.Namespace) -> Any:
    """The calibration of the cost profile fitted to `--profiles`, judged on `--held-out`
    (ValueError: unreadable, or no held-out profile)."""
    from tessera.cost import profile_calibration as pc

    if not args.held_out:
        raise ValueError("--profiles needs --held-out (the error is measured on them)")

    def read(paths: list[Path]) -> list[Any]:
        return [pc.measured_from_json(json.loads(p.read_text()), p.name) for p in paths]

    names = [x.strip() for x in args.layouts.split(",") if x.strip()]
    res = pc.calibrate(read(args.profiles), read(args.held_out), names)
    if args.profile_out is not None:
        args.profile_out.write_text(json.dumps(res.profile.to_json(), indent=2) + "\n")
    return res.calibration
