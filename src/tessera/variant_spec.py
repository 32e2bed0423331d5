"""`spec.variants` of a ServingDeployment: the fine-tunes served beside the foundation.

Each entry has a `name` (chosen by the OpenAI `model` field of a request) and one of:
`adapter` (a PEFT LoRA directory, served on the foundation's own replicas); `checkpoint` (a full
fine-tune of the same architecture on replicas of its own, sharing identical layers through the
agents' block zoo; `shareEquivalent` / `threshold` opt in to equivalent ones); `stitch` (`small`,
`point`, `zoo`: the requests through a smaller model's front blocks and a stitching block);
`speculate` (`layers`, `zoo`: the model itself, its bottleneck block speculated; `refusals`
needs a block before and after it). Relative paths resolve like `spec.model.path`. Parsed by
`api.parse`; checked against the checkpoints by `tessera validate`/`tessera up`
(`cli/variant_check`); applied by `tessera up` and the operator. Pure; docs/variants.md has
the YAML and why variants are not a resource of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tessera import fields

FIELDS = ("name", "adapter", "checkpoint", "shareEquivalent", "threshold", "stitch", "speculate")
STITCH_FIELDS = ("small", "point", "zoo")
SPECULATE_FIELDS = ("layers", "zoo")
KINDS = ("adapter", "checkpoint", "stitch", "speculate")  # exactly one per entry
THRESHOLD = 0.98  # BlockLLM's equivalence threshold (§6)
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1123: part of replica ids


@dataclass(frozen=True)
class VariantSpec:
    name: str
    kind: str  # "lora", "full", "stitch" or "speculate"
    # adapter directory, checkpoint directory, (stitch) the small checkpoint, (speculate) ""
    path: str
    # Full fine-tunes only: serve layers whose logit-lens cosine against the foundation's
    # reaches `threshold` from the foundation's weights (docs/variants.md). Off by default:
    # then only bit-identical layers are shared.
    share_equivalent: bool = False
    threshold: float = THRESHOLD
    # Stitched chains only (issue 35): the small model's layers [0, i) answer, through the
    # stitching block the zoo holds for (small, model), then the model's layers [j, L).
    point: tuple[int, int] = (0, 0)  # (i, j)
    zoo: str = ""  # folder holding `stitch/<digests>/` (relative paths as for `path`)
    # Speculated models only (issue 35): the bottleneck block, the model's layers [a, b),
    # whose surrogate the zoo folder holds (`surrogate/<digest>-<a>-<b>/`).
    layers: tuple[int, int] = (0, 0)

    def to_json(self) -> dict[str, object]:
        if self.kind == "speculate":
            return {"name": self.name, "speculate": {"layers": list(self.layers), "zoo": self.zoo}}
        if self.kind == "stitch":
            return {
                "name": self.name,
                "stitch": {"small": self.path, "point": list(self.point), "zoo": self.zoo},
            }
        out: dict[str, object] = {
            "name": self.name,
            "adapter" if self.kind == "lora" else "checkpoint": self.path,
        }
        if self.share_equivalent:
            out["shareEquivalent"] = True
            out["threshold"] = self.threshold
        return out


def parse(doc: Any, foundation: str, path: str = "spec.variants") -> tuple[VariantSpec, ...]:
    """The list, or `fields.FieldError` naming the first bad entry."""
    if not isinstance(doc, list):
        raise fields.FieldError(path, "must be a list of {name, adapter | checkpoint}")
    out: list[VariantSpec] = []
    seen = {foundation}
    for i, item in enumerate(doc):
        where = f"{path}[{i}]"
        m = fields.mapping(item, where)
        extra = sorted(set(m) - set(FIELDS))
        if extra:
            raise fields.FieldError(
                f"{where}.{extra[0]}", f"unknown field (allowed: {', '.join(FIELDS)})"
            )
        name = fields.string(fields.require(m, "name", where), f"{where}.name")
        if not NAME.match(name):
            raise fields.FieldError(
                f"{where}.name",
                f"{name!r} must be a DNS-1123 label (a-z, 0-9, '-'; it names replicas)",
            )
        if name in seen:
            raise fields.FieldError(
                f"{where}.name", f"{name!r} is already served (the model or another variant)"
            )
        seen.add(name)
        has = [k for k in KINDS if m.get(k) not in (None, "")]
        if len(has) != 1:
            raise fields.FieldError(
                where, "give exactly one of adapter (LoRA), checkpoint, stitch or speculate"
            )
        if has[0] in ("stitch", "speculate"):
            if "shareEquivalent" in m or "threshold" in m:
                raise fields.FieldError(
                    f"{where}.shareEquivalent", "applies to full fine-tunes (checkpoint) only"
                )
            parse_one = _stitch if has[0] == "stitch" else _speculate
            out.append(parse_one(name, m[has[0]], f"{where}.{has[0]}"))
            continue
        kind = "lora" if has[0] == "adapter" else "full"
        share, threshold = _share(m, where, kind)
        out.append(
            VariantSpec(name, kind, fields.string(m[has[0]], f"{where}.{has[0]}"), share, threshold)
        )
    return tuple(out)


def _share(m: Any, where: str, kind: str) -> tuple[bool, float]:
    """`shareEquivalent` and `threshold` of one entry (full fine-tunes only)."""
    share = m.get("shareEquivalent", False)
    if not isinstance(share, bool):
        raise fields.FieldError(f"{where}.shareEquivalent", "must be true or false")
    if "threshold" in m:
        if not share:
            raise fields.FieldError(f"{where}.threshold", "applies only with shareEquivalent: true")
        threshold = fields.number(m["threshold"], f"{where}.threshold", positive=True)
        if threshold > 1.0:
            raise fields.FieldError(f"{where}.threshold", "must be <= 1 (a cosine similarity)")
    else:
        threshold = THRESHOLD
    if share and kind != "full":
        raise fields.FieldError(
            f"{where}.shareEquivalent",
            "applies to full fine-tunes (checkpoint) only; a LoRA adapter shares the "
            "foundation's weights already",
        )
    return share, threshold


def _stitch(name: str, doc: Any, where: str) -> VariantSpec:
    """A stitched chain's entry: `{small, point: [i, j], zoo}`."""
    m = fields.mapping(doc, where)
    fields.known_only(m, STITCH_FIELDS, where)
    small = fields.string(fields.require(m, "small", where), f"{where}.small")
    zoo = fields.string(fields.require(m, "zoo", where), f"{where}.zoo")
    point = fields.require(m, "point", where)
    if (
        not isinstance(point, list)
        or len(point) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in point)
        or point[0] < 1
        or point[1] < 1
    ):
        raise fields.FieldError(
            f"{where}.point",
            "must be [i, j]: the small model's first i layers, then the model's from j (both >= 1)",
        )
    return VariantSpec(name, "stitch", small, point=(point[0], point[1]), zoo=zoo)


def _speculate(name: str, doc: Any, where: str) -> VariantSpec:
    """A speculated model's entry: `{layers: [a, b], zoo}` (the bottleneck block)."""
    m = fields.mapping(doc, where)
    fields.known_only(m, SPECULATE_FIELDS, where)
    zoo = fields.string(fields.require(m, "zoo", where), f"{where}.zoo")
    layers = fields.require(m, "layers", where)
    if (
        not isinstance(layers, list)
        or len(layers) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
        or not 0 <= layers[0] < layers[1]
    ):
        raise fields.FieldError(
            f"{where}.layers", "must be [a, b] with 0 <= a < b: the bottleneck block's layers"
        )
    return VariantSpec(name, "speculate", "", zoo=zoo, layers=(layers[0], layers[1]))


def refusal(v: VariantSpec, num_layers: int) -> tuple[str, str]:
    """Why a `speculate` entry cannot be served on a model of `num_layers` layers, as (the
    field under `.speculate`, or "" for the entry, the reason): the block must have hidden
    states in and a block after it (`[a, b)` with a >= 1, b < L); ("", "") when it can."""
    a, b = v.layers
    if a < 1 or b >= num_layers:
        return "layers", (
            f"[{a}, {b}] must lie inside the model's {num_layers} layers with a block before "
            "it (a >= 1: a surrogate guesses from hidden states) and one after it "
            f"(b < {num_layers}: the last block's output cannot be corrected)"
        )
    return "", ""


def refusals(variants: tuple[VariantSpec, ...], num_layers: int) -> list[fields.FieldError]:
    """`refusal` of every `speculate` entry, by field (`api_semantics.check_semantics`)."""
    out = []
    for i, v in enumerate(variants):
        if v.kind == "speculate":
            field, why = refusal(v, num_layers)
            if not why:
                continue
            where = f"spec.variants[{i}].speculate"
            out.append(fields.FieldError(f"{where}.{field}" if field else where, why))
    return out
