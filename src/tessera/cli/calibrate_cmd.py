"""`tessera calibrate`: fit the latency model's calibration and report its error per layout.

Registered by `tessera.cli.main`. Input: `--samples FILE`, a JSON list of measurements
(`{"layout", "predicted_s", "measured_s", "split": "fit"|"eval", "point": [class shares
..., load], "note"}`: the planner's P99 for a layout at a demand beside the P99 measured
running it there, on agents or in the simulator). Output: the calibration
(`cost.calibration.dump`, `--out FILE`), which the operator reads with
`--switching-calibration FILE`, and the per-layout error table on stdout (`--json`: the
document itself). The fit is `cost.calibration.fit`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit the latency model's calibration to measured runs")
    p.add_argument("--samples", type=Path, required=True, help="JSON list of measurements")
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
