"""The layout as a picture: replicas' stages on agents and devices, drawn as SVG. Pure.

One row per (agent, device); the x axis is the model's layers. Every stage is a box over
the layers [start, end) it holds, in its replica's colour, labelled `replica sN`, with a
bar under it for the KV pages its replica uses (leaders report them). A stage whose
layers overlap another block of the same checkpoint on the same agent is marked shared
(hatched, `data-shared="1"`): the block zoo holds those parameter pieces once. Leaving
replicas (a cut-over in progress) are drawn dashed. Every box carries `data-replica`,
`data-stage`, `data-agent` and `data-device`, which the status page test reads.

Built from a `plan.Plan` (`from_plan`: `tessera plan --svg`) or from what the agents
report (`from_observed`: the gateway's status page, `tessera.gateway.status_page`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera import blocks, observed
from tessera import plan as plan_mod
from tessera.planner import deployment

ROW_H, BOX_H, LEFT, RIGHT, TOP, LAYER_W_MAX, WIDTH = 46, 30, 210, 20, 54, 60, 1000
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)


@dataclass(frozen=True)
class StageBox:
    """One stage (or tensor-parallel rank) as drawn."""

    replica: str
    stage: int
    agent: str
    device: str
    start: int
    end: int
    tp_rank: int = 0
    tp: int = 1
    shared: bool = False  # overlaps another block of the same checkpoint on its agent
    leaving: bool = False  # its replica is leaving (a cut-over in progress)
    kv_used: int = 0  # pages its replica uses (leader stage only; 0 = unknown)
    kv_total: int = 0


@dataclass(frozen=True)
class Layout:
    """What the picture shows."""

    num_layers: int
    boxes: tuple[StageBox, ...]
    devices: tuple[tuple[str, str], ...]  # (agent, device) rows, in order
    title: str = ""

    def lanes(self) -> tuple[dict[int, int], dict[tuple[str, str], int]]:
        """Per box (index) its lane within its device's row, and per device its lanes:
        boxes whose layers overlap on one device (a transition, shared layers) stack."""
        lane_of: dict[int, int] = {}
        used: dict[tuple[str, str], list[list[tuple[int, int]]]] = {}
        for i, b in enumerate(self.boxes):
            lanes = used.setdefault((b.agent, b.device), [])
            for n, spans in enumerate(lanes):
                if all(b.end <= s or e <= b.start for s, e in spans):
                    spans.append((b.start, b.end))
                    lane_of[i] = n
                    break
            else:
                lanes.append([(b.start, b.end)])
                lane_of[i] = len(lanes) - 1
        return lane_of, {d: max(1, len(used.get(d, []))) for d in self.devices}


def from_plan(p: plan_mod.Plan, num_layers: int = 0, title: str = "") -> Layout:
    """The planned layout: every stage (and TP rank) of every replica."""
    boxes: list[StageBox] = []
    for r in p.replicas:
        for i, s in enumerate(r.stages):
            for rank, (agent, device) in enumerate(s.placements()):
                boxes.append(StageBox(r.replica_id, i, agent, device, s.start, s.end, rank, s.tp))
    layers = num_layers or max((b.end for b in boxes), default=1)
    return _finish(boxes, layers, title or f"plan generation {p.generation} ({p.source})", ())


def from_deployment(d: deployment.Deployment, num_layers: int = 0) -> Layout:
    """The planner's deployment (`tessera plan --svg`): a row per node GPU."""
    boxes = [
        StageBox(r.name, i, node, f"gpu:{idx}", s.layers[0], s.layers[1], rank, r.tp)
        for r in d.replicas
        for i, s in enumerate(r.stages)
        for rank, (node, idx) in enumerate(s.gpus)
    ]
    layers = num_layers or max((b.end for b in boxes), default=1)
    title = f"{d.model} on {sum(len(r.gpus) for r in d.replicas)} x {d.device} ({d.method})"
    return _finish(boxes, layers, title, ())


def deployment_shares(d: deployment.Deployment) -> dict[str, dict[str, float]]:
    """{class: {replica: share}} of a planner deployment."""
    return {c: d.class_shares(c) for c in d.classes}


def from_observed(
    obs: observed.Observed,
    leaving: Iterable[str] = (),
    num_layers: int = 0,
    title: str = "",
    shared_bytes: Mapping[tuple[str, str, int, int], int] | None = None,
) -> Layout:
    """What the agents hold now, with each replica's KV use and the leaving replicas.
    `shared_bytes`: per (agent, replica, stage, tp rank) the parameter bytes a block holds
    in pieces another block loaded (`BlockInfo.shared_param_bytes`); without it, blocks of
    one checkpoint overlapping on a device are taken as shared (what the zoo does)."""
    gone = set(leaving)
    kv = {k.replica_id: k for a in obs.agents for k in a.kv}
    boxes: list[StageBox] = []
    for a in obs.agents:
        for b in a.blocks:
            load = kv.get(b.replica_id) if b.stage_index == 0 and b.tp_rank == 0 else None
            boxes.append(
                StageBox(
                    b.replica_id,
                    b.stage_index,
                    a.name,
                    b.device,
                    b.start,
                    b.end,
                    b.tp_rank,
                    b.tp_size,
                    shared=(
                        shared_bytes.get((a.name, b.replica_id, b.stage_index, b.tp_rank), 0) > 0
                        if shared_bytes is not None
                        else _overlaps(b, a.blocks)
                    ),
                    leaving=b.replica_id in gone,
                    kv_used=load.pages_used if load else 0,
                    kv_total=load.pages_total if load else 0,
                )
            )
    rows = tuple((a.name, d.id) for a in obs.agents for d in a.devices)
    layers = num_layers or max((b.end for b in boxes), default=1)
    return _finish(boxes, layers, title, rows)


def _overlaps(b: blocks.Block, others: Iterable[blocks.Block]) -> bool:
    src = b.share_from or b.model_path
    for o in others:
        if o.replica_id == b.replica_id or o.device != b.device:
            continue
        if (o.share_from or o.model_path) == src and o.start < b.end and b.start < o.end:
            return True
    return False


def _finish(
    boxes: list[StageBox], layers: int, title: str, rows: tuple[tuple[str, str], ...]
) -> Layout:
    seen = list(rows)
    for b in boxes:
        if (b.agent, b.device) not in seen:
            seen.append((b.agent, b.device))
    return Layout(max(1, layers), tuple(boxes), tuple(seen), title)


def colours(replicas: Iterable[str]) -> dict[str, str]:
    """A colour per replica, distinct for up to ten, in sorted order (so a page keeps them
    while its replicas stay)."""
    return {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(sorted(set(replicas)))}


def render(layout: Layout, shares: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """The SVG document (a string)."""
    layer_w = min(LAYER_W_MAX, (WIDTH - LEFT - RIGHT) / layout.num_layers)
    width = LEFT + layer_w * layout.num_layers + RIGHT
    replicas = sorted({b.replica for b in layout.boxes})
    fill = colours(replicas)
    legend_h = 22 * len(replicas) + 30
    lane_of, lanes = layout.lanes()
    row_y: dict[tuple[str, str], int] = {}
    y_next = TOP
    for d in layout.devices:
        row_y[d] = y_next
        y_next += ROW_H * lanes[d]
    rows_h = max(ROW_H, y_next - TOP)
    height = TOP + rows_h + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'viewBox="0 0 {width:.0f} {height}" font-family="sans-serif" font-size="12" '
        'class="tessera-layout">',
        '<defs><pattern id="shared" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="3" height="6" fill="#ffffff" '
        'fill-opacity="0.45"/></pattern></defs>',
        f'<text x="8" y="18" font-size="14" font-weight="bold">{_e(layout.title)}</text>',
    ]
    for i in range(layout.num_layers + 1):
        x = LEFT + i * layer_w
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP - 8}" x2="{x:.1f}" y2="{TOP + rows_h}" stroke="#e4e4e4"/>'
        )
        if i < layout.num_layers and (layout.num_layers <= 40 or i % 4 == 0):
            out.append(
                f'<text x="{x + layer_w / 2:.1f}" y="{TOP - 12}" text-anchor="middle" '
                f'fill="#888" font-size="10">{i}</text>'
            )
    for (agent, device), y in row_y.items():
        out.append(
            f'<text x="8" y="{y + BOX_H / 2 + 4}" data-agent="{_e(agent)}">'
            f"{_e(agent)} / {_e(device)}</text>"
        )
    for i, b in enumerate(layout.boxes):
        out.append(
            _box(b, row_y[(b.agent, b.device)] + ROW_H * lane_of[i], layer_w, fill[b.replica])
        )
    y = TOP + rows_h + 16
    for r in replicas:
        share = ""
        if shares:
            parts = [f"{c} {s[r]:.0%}" for c, s in sorted(shares.items()) if r in s]
            share = f" — class shares: {', '.join(parts)}" if parts else ""
        out.append(
            f'<rect x="8" y="{y - 11}" width="14" height="14" fill="{fill[r]}"/>'
            f'<text x="28" y="{y}" data-legend="{_e(r)}">{_e(r)}{_e(share)}</text>'
        )
        y += 22
    out.append(
        f'<text x="8" y="{y}" fill="#666" font-size="11">hatched: layers shared '
        "with another block on the device; dashed: not routed (leaving or loading); "
        "bar: KV pages used</text>"
    )
    out.append("</svg>")
    return "\n".join(out)


def _box(b: StageBox, y: int, layer_w: float, colour: str) -> str:
    x = LEFT + b.start * layer_w
    w = max(2.0, (b.end - b.start) * layer_w - 2)
    label = f"{b.replica} s{b.stage}" + (f" tp{b.tp_rank}/{b.tp}" if b.tp > 1 else "")
    dash = ' stroke-dasharray="5,3"' if b.leaving else ""
    parts = [
        f'<g class="stage" data-replica="{_e(b.replica)}" data-stage="{b.stage}" '
        f'data-agent="{_e(b.agent)}" data-device="{_e(b.device)}" data-layers="{b.start}-{b.end}" '
        f'data-shared="{int(b.shared)}" data-leaving="{int(b.leaving)}">',
        f"<title>{_e(label)}: layers {b.start}-{b.end} on {_e(b.agent)}/{_e(b.device)}</title>",
        f'<rect x="{x + 1:.1f}" y="{y}" width="{w:.1f}" height="{BOX_H}" rx="4" '
        f'fill="{colour}" stroke="#333"{dash}/>',
    ]
    if b.shared:
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{y}" width="{w:.1f}" height="{BOX_H}" rx="4" '
            'fill="url(#shared)"/>'
        )
    parts.append(
        f'<text x="{x + 6:.1f}" y="{y + 19}" fill="#fff" font-size="11" '
        f'clip-path="inset(0)">{_e(label)}</text>'
    )
    if b.kv_total:
        frac = min(1.0, b.kv_used / b.kv_total)
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{y + BOX_H + 2}" width="{w:.1f}" height="5" '
            'fill="#ddd"/>'
            f'<rect x="{x + 1:.1f}" y="{y + BOX_H + 2}" width="{w * frac:.1f}" height="5" '
            f'fill="#c0392b" data-kv="{b.kv_used}/{b.kv_total}"/>'
        )
    parts.append("</g>")
    return "".join(parts)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
