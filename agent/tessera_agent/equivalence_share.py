"""Sharing equivalent layers of a full fine-tune with its foundation, at load.

A fine-tune's block loaded with `share_from` (the user's `shareEquivalent` opt-in) reads every
decoder layer the equivalence report accepts (`equivalence.share_report`: bit-identical, or
logit-lens cosine >= the threshold) from the foundation's checkpoint, so its content address is
the foundation piece's and the block zoo aliases it at no cost. Other layers keep the
fine-tune's weights; embedding and final norm + head are shared only when identical. The report
runs on the agent (it holds both checkpoints and torch), once per pair: `ReportCache` keys it by
both checkpoints' digests, the threshold and the calibration set. The loaded stage keeps it; the
servicer reports it in `BlockInfo.equivalence` (`to_proto`).
Called by `hosting.Hosting.load` (on its loader thread) and the servicer's block listing.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch

from tessera import blocks
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import equivalence
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors, loader


def checkpoint_digest(path: Path) -> str:
    """SHA-256 over a checkpoint's config.json and safetensors files (in name order)."""
    h = hashlib.sha256()
    files = [path / "config.json", *sorted(set(loader.weight_map(path).values()))]
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


class ReportCache:
    """Per agent: (foundation digest, fine-tune digest, threshold, calibration) -> report."""

    def __init__(self) -> None:
        self._reports: dict[tuple[str, str, float, str], equivalence.ShareReport] = {}
        self._lock = threading.Lock()
        self.computed = 0  # reports computed (not served from the cache)

    def get(self, foundation: Path, variant: Path, threshold: float) -> equivalence.ShareReport:
        key = (
            checkpoint_digest(foundation),
            checkpoint_digest(variant),
            threshold,
            equivalence.CALIBRATION,
        )
        with self._lock:  # one computation per key, even when two stages load at once
            got = self._reports.get(key)
            if got is None:
                got = equivalence.share_report(foundation, variant, threshold)
                self._reports[key] = got
                self.computed += 1
            return got


def check(spec: blocks.Block, cfg: config_mod.ModelConfig) -> None:
    """InvalidArgumentError when the opt-in cannot apply to `spec`."""
    if not 0.0 < spec.share_threshold <= 1.0:
        raise errors.InvalidArgumentError(
            f"share.threshold: {spec.share_threshold} must be in (0, 1]"
        )
    if spec.tp_size > 1:
        raise errors.InvalidArgumentError(
            "share: equivalent layers are shared on unsharded stages only (tp_size 1)"
        )
    base = Path(spec.share_from)
    if not (base / "config.json").is_file():
        raise errors.NotFoundError(f"share.foundation_path: {base} has no config.json")
    other = config_mod.ModelConfig.from_path(base)
    if other.num_layers != cfg.num_layers or other.hidden_size != cfg.hidden_size:
        raise errors.InvalidArgumentError(
            f"share.foundation_path: {base} is not the same architecture as {spec.model_path}"
        )


def prepare(
    cache: ReportCache,
    spec: blocks.Block,
    cfg: config_mod.ModelConfig,
    tensors: dict[str, torch.Tensor] | None,
) -> tuple[equivalence.ShareReport, dict[str, torch.Tensor]]:
    """The report, and the block's tensors with every accepted (non-identical) layer of its
    range taken from the foundation. `tensors` are the block's own if already fetched
    (a peer copy, a throttled read), else read from the fine-tune's checkpoint."""
    check(spec, cfg)
    try:
        report = cache.get(Path(spec.share_from), Path(spec.model_path), spec.share_threshold)
    except ValueError as exc:
        raise errors.InvalidArgumentError(f"share: {exc}") from exc
    names = loader.checkpoint_names(cfg, spec.start, spec.end)
    out = (
        dict(tensors) if tensors is not None else loader.read_tensors(Path(spec.model_path), names)
    )
    swap = [i for i in report.equivalent_layers if spec.start <= i < spec.end]
    if swap:
        wanted = [
            n for i in swap for n in loader.checkpoint_names(cfg, i, i + 1) if _in_layer(n, i)
        ]
        out.update(loader.read_tensors(Path(spec.share_from), wanted))
    return report, out


def _in_layer(name: str, layer: int) -> bool:
    return name.startswith(f"model.layers.{layer}.")


def to_proto(report: equivalence.ShareReport) -> pb.VariantEquivalence:
    return pb.VariantEquivalence(
        threshold=report.threshold,
        layers=[
            pb.VariantEquivalenceLayer(
                layer=s.layer, cosine=s.cosine, identical=s.identical, shared=s.shared
            )
            for s in report.layers
        ],
        final_cosine=report.final_cosine,
        top1_agreement=report.top1_agreement,
        calibration=report.calibration,
        calibration_tokens=report.calibration_tokens,
    )


def restore_tensors(
    spec: blocks.Block,
    cfg: config_mod.ModelConfig,
    report: equivalence.ShareReport,
    start: int,
    end: int,
    tensors: dict[str, torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """The tensors an opted-in block needs to hold [start, end) again after an overload
    drop (`overload_shift`): accepted layers from the foundation's checkpoint, the others
    from `tensors` (copied from a peer) or the fine-tune's, so a restore serves what the
    load served."""
    names = [
        n
        for a, b in ((start, spec.start), (spec.end, end))
        if a < b
        for n in loader.checkpoint_names(cfg, a, b)
    ]
    out = {n: t for n, t in (tensors or {}).items() if n in names}
    accepted = [i for i in report.equivalent_layers if start <= i < end]
    theirs = [n for n in names if any(_in_layer(n, i) for i in accepted)]
    if theirs:
        out.update(loader.read_tensors(Path(spec.share_from), theirs))
    missing = [n for n in names if n not in out]
    if missing:
        out.update(loader.read_tensors(Path(spec.model_path), missing))
    return out
