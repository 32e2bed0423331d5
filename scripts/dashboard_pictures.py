"""Wireframes of the Grafana dashboards for docs/observability.md, drawn from their JSON.

Not Grafana screenshots and no data: each panel is drawn where its gridPos puts it, with
its title, type, unit and queries, so the docs show what each dashboard holds. Run from
the repository root: `python scripts/dashboard_pictures.py` writes docs/img/observability/.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tessera.observability import dashboards

ROW_UNIT = 0.42  # inches per grid row


def draw(d: dict, out: Path) -> None:  # type: ignore[type-arg]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in d["panels"])
    fig = plt.figure(figsize=(16, rows * ROW_UNIT + 1.2))
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.98 * rows * ROW_UNIT / (rows * ROW_UNIT + 1.2)))
    ax.set_xlim(0, 24)
    ax.set_ylim(rows, 0)
    ax.axis("off")
    fig.suptitle(
        f"{d['title']}  —  wireframe drawn from {d['uid']}.json (panel layout and queries; "
        "not a Grafana screenshot, no data)",
        fontsize=12,
        x=0.01,
        ha="left",
    )
    for p in d["panels"]:
        g = p["gridPos"]
        ax.add_patch(
            FancyBboxPatch(
                (g["x"] + 0.15, g["y"] + 0.15),
                g["w"] - 0.3,
                g["h"] - 0.3,
                boxstyle="round,pad=0.02",
                facecolor="#1f2430",
                edgecolor="#3b4252",
            )
        )
        unit = p["fieldConfig"]["defaults"].get("unit", "")
        ax.text(g["x"] + 0.5, g["y"] + 0.8, p["title"], color="white", fontsize=10, weight="bold")
        ax.text(
            g["x"] + g["w"] - 0.5,
            g["y"] + 0.8,
            f"{p['type']} · {unit}",
            color="#9aa5b1",
            fontsize=8,
            ha="right",
        )
        y = g["y"] + 1.6
        for t in p["targets"][:4]:
            for line in textwrap.wrap(t["expr"], width=int(g["w"] * 5.6))[:3]:
                ax.text(g["x"] + 0.5, y, line, color="#8fbcbb", fontsize=7, family="monospace")
                y += 0.55
            ax.text(g["x"] + 0.8, y, f"legend: {t['legendFormat']}", color="#b48ead", fontsize=7)
            y += 0.7
    variables = ", ".join(f"${v['name']}" for v in d["templating"]["list"])
    notes = [a["name"] for a in d["annotations"]["list"] if "expr" in a]
    fig.text(
        0.01,
        0.005,
        f"variables: {variables}    annotations: {', '.join(notes)}",
        fontsize=8,
        color="#555",
    )
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main() -> None:
    out = Path("docs/img/observability")
    out.mkdir(parents=True, exist_ok=True)
    for name, make in dashboards.ALL.items():
        path = out / name.replace(".json", ".png")
        draw(make(), path)
        sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
