"""Plot of the planner benchmark: sustainable throughput against composition skew.

One panel per (cluster, model). Each colour is the class the mix is skewed towards
(skew 0 is the shared uniform mix); solid lines are the heterogeneous plan, dashed lines
the homogeneous baseline. Called by ``tessera.planner.bench`` when ``--plot PATH`` is
given; uses the Agg backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def plot_skew(cases: Sequence[dict[str, Any]], path: str, classes: Sequence[str] = ()) -> None:
    """Write the skew plot of benchmark ``cases`` to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(c["cluster"], c["model"]) for c in cases})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.3 * len(panels), 3.8), squeeze=False)
    dominants = sorted({c["dominant_class"] for c in cases})
    colours = plt.get_cmap("tab10")
    for ax, (cluster, model) in zip(axes[0], panels, strict=True):
        mine = [c for c in cases if c["cluster"] == cluster and c["model"] == model]
        uniform = [c for c in mine if c["skew"] == 0]
        gains = [c["heuristic_rps"] / c["homogeneous_rps"] for c in mine if c["homogeneous_rps"]]
        for d in dominants:
            series = sorted(
                uniform + [c for c in mine if c["skew"] > 0 and c["dominant_class"] == d],
                key=lambda c: c["skew"],
            )
            xs = [c["skew"] for c in series]
            name = classes[d] if d < len(classes) else f"class {d}"
            ax.plot(
                xs,
                [c["heuristic_rps"] for c in series],
                "o-",
                color=colours(d),
                label=f"{name}: hetero",
            )
            ax.plot(
                xs,
                [c["homogeneous_rps"] for c in series],
                "s--",
                color=colours(d),
                alpha=0.7,
                label=f"{name}: homo",
            )
        ax.set_yscale("log")
        ax.set_title(
            f"{model}, {cluster} H100\nmean hetero/homo {sum(gains) / len(gains):.3f}", fontsize=9
        )
        ax.set_xlabel("skew towards one class")
        ax.set_ylabel("sustainable req/s (log)")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(
        "Planner: throughput vs class-mix skew (analytic cost model, simulated)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
