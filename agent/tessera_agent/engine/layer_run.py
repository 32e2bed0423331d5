"""A replicated run of consecutive decoder layers: the batch split between holders.

CoCoServe (§3.1): a run of layers [start, end) is replicated onto other devices and each step's
batch is split between the holders in proportion to their measured speed; a sub-batch's hidden
states stay on its holder through the run and come back in order. The split is sticky per
request (`policies.scaling.request_split`): a holder keeps the K/V of its requests for the run,
so a request moves only with its K/V (`move`). Holders (`run_holders.py`): the stage's own
layers, a copy on another device, or another agent's (`run_client.RemoteHolder`); all use the
leader's page ids, and `page_copies` records which holders hold a valid copy of each page.
Prefix-cached pages are copied to a request's holder on arrival. Called by
`runner.StageRunner.execute` (`forward`) and `scaling_ops` (attach, move) on the compute thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tessera.policies.scaling import request_split
from tessera_agent.engine import attention, errors, run_holders, step
from tessera_agent.engine import model as model_mod

Holder = run_holders.Holder
KV = run_holders.KV


class ReplicatedRun:
    """Stage-local layers [lo, hi) (global [start, end)) served by several holders."""

    def __init__(
        self,
        origin: run_holders.OriginHolder,
        start: int,
        page_size: int,
        live_pages: Callable[[], set[int]] | None = None,
        num_pages: int = 0,
        running: Sequence[str] = (),
    ) -> None:
        self.lo, self.hi = origin.lo, origin.hi
        self.start, self.end = start, start + (origin.hi - origin.lo)
        self.page_size = page_size
        self.holders: dict[str, Holder] = {origin.name: origin}
        self.home = origin.name  # where requests of an evicted holder go back to
        self.origin = origin.name
        # request -> holder (sticky); requests already running keep the origin's K/V
        self.assignment: dict[str, str] = dict.fromkeys(running, origin.name)
        self.speeds: dict[str, float] = {}  # holder -> tokens/s (EWMA of measured steps)
        # page -> holders with a valid copy of its K/V (default: the origin's alone)
        self.page_copies: dict[int, frozenset[str]] = {}
        self._live = live_pages or (lambda: set(range(num_pages)))
        self.steps = 0
        self.copied_pages = 0  # prefix-cache pages copied to a request's holder
        # holder -> requests placed on it (cumulative; those running at the start count
        # for the origin)
        self.placed: dict[str, int] = {origin.name: len(self.assignment)} if running else {}

    # -- the step -------------------------------------------------------------------------
    def holder_names(self) -> list[str]:
        return [self.home, *(h for h in self.holders if h != self.home)]

    def _speeds(self) -> dict[str, float]:
        known = [s for s in self.speeds.values() if s > 0]
        default = sum(known) / len(known) if known else 1.0
        return {h: self.speeds.get(h, default) for h in self.holders}

    def copies(self, page: int) -> frozenset[str]:
        return self.page_copies.get(page, frozenset((self.origin,)))

    def _copy(self, pages: list[int], dst: str) -> int:
        """Copy the pages `dst` lacks onto it, each from a holder that has it; bytes."""
        by_src: dict[str, list[int]] = {}
        for p in pages:
            have = self.copies(p)
            if dst not in have:
                src = self.origin if self.origin in have else min(have)
                by_src.setdefault(src, []).append(p)
        nbytes = 0
        for src, ps in by_src.items():
            kv = self.holders[src].export_pages(ps)
            nbytes += run_holders.kv_nbytes(kv)
            self.holders[dst].import_pages(ps, kv)
            for p in ps:
                self.page_copies[p] = self.copies(p) | {dst}
        return nbytes

    def _place(self, c: step.SeqChunk) -> str:
        """The holder of a request first seen at this run (sticky afterwards)."""
        split = request_split.assign(
            self.holder_names(), self._speeds(), self.assignment, joined=[c.seq_id]
        )
        return split.assignment[c.seq_id]

    def _ensure_context(self, c: step.SeqChunk, holder: str) -> None:
        """K/V of the positions before the chunk (from the prefix cache) onto `holder`."""
        if c.start == 0:
            return
        pages = list(c.block_table[: -(-c.start // self.page_size)])
        lacking = [p for p in pages if holder not in self.copies(p)]
        if lacking:
            self._copy(lacking, holder)
            self.copied_pages += len(lacking)

    def forget(self, finished: Sequence[str]) -> None:
        for s in finished:
            self.assignment.pop(s, None)

    def execute(self, chunks: Sequence[step.SeqChunk], x: torch.Tensor) -> torch.Tensor:
        """The run over the step: split by holder, compute (replicas first, so they work
        while the origin computes), gather back in order."""
        groups: dict[str, tuple[list[step.SeqChunk], list[int]]] = {}
        row = 0
        for c in chunks:
            h = self.assignment.get(c.seq_id)
            if h is None or h not in self.holders:
                h = self._place(c)
                self._ensure_context(c, h)
                self.assignment[c.seq_id] = h
                self.placed[h] = self.placed.get(h, 0) + 1
            elif c.num_tokens > 1:
                self._ensure_context(c, h)
            sub, rows = groups.setdefault(h, ([], []))
            sub.append(c)
            rows.extend(range(row, row + c.num_tokens))
            row += c.num_tokens
            last = (c.start + c.num_tokens - 1) // self.page_size
            for p in c.block_table[c.start // self.page_size : last + 1]:
                self.page_copies[p] = frozenset((h,))  # written here: other copies are stale
        if len(groups) == 1 and self.home in groups:  # the whole batch at home: no copy
            out, secs = self.holders[self.home].submit(0, groups[self.home][0], x).result()
            self._measure(self.home, x.shape[0], secs)
            self.steps += 1
            return out
        index = {
            h: torch.tensor(rows, dtype=torch.long, device=x.device)
            for h, (_, rows) in groups.items()
        }
        order = sorted(groups, key=lambda h: h == self.origin)  # the inline origin last
        futs = {
            h: self.holders[h].submit(self.steps, groups[h][0], x.index_select(0, index[h]))
            for h in order
        }
        out = torch.empty_like(x)
        for h, fut in futs.items():
            y, secs = fut.result()
            out.index_copy_(0, index[h], y.to(x.device, x.dtype))
            self._measure(h, len(groups[h][1]), secs)
        self.steps += 1
        return out

    def _measure(self, holder: str, tokens: int, seconds: float) -> None:
        if seconds <= 0 or tokens <= 0:
            return
        rate = tokens / seconds
        prev = self.speeds.get(holder)
        self.speeds[holder] = rate if prev is None else 0.8 * prev + 0.2 * rate

    # -- changes (between steps, on the compute thread) -------------------------------------
    def add(self, holder: Holder) -> None:
        if holder.name in self.holders:
            raise errors.FailedPreconditionError(
                f"layers [{self.start}, {self.end}) already have a holder {holder.name}"
            )
        self.holders[holder.name] = holder

    def move(self, src: str, dst: str) -> tuple[int, int]:
        """Hand `src`'s requests and the K/V it holds to `dst` and drop `src` (an
        eviction when `dst` is home, a migration when `dst` is new); returns (pages,
        bytes) copied."""
        if src not in self.holders or dst not in self.holders or src == dst:
            raise errors.FailedPreconditionError(
                f"move {src} -> {dst}: holders of layers [{self.start}, {self.end}) are "
                f"{sorted(self.holders)}"
            )
        # every live page only `src` holds goes to `dst`; `src`'s copies are forgotten
        pages = sorted(p for p in self._live() if src in self.copies(p))
        lacking = [p for p in pages if dst not in self.copies(p)]
        nbytes = self._copy(lacking, dst) if lacking else 0
        for p in pages:
            self.page_copies[p] = (self.copies(p) - {src}) or frozenset((dst,))
        for r, h in self.assignment.items():
            if h == src:
                self.assignment[r] = dst
        if self.home == src:
            self.home = dst
        gone = self.holders.pop(src)
        self.speeds.pop(src, None)
        gone.close()
        return len(lacking), nbytes

    def counts(self, running: set[str] | None = None) -> dict[str, int]:
        """Requests per holder (only those in `running` when given: the last step's
        finished requests are forgotten at the next step)."""
        out = dict.fromkeys(self.holders, 0)
        for r, h in self.assignment.items():
            if h in out and (running is None or r in running):
                out[h] += 1
        return out


def forward(
    model: model_mod.StageModel,
    x: torch.Tensor,
    md: attention.AttentionMetadata,
    kv: list[tuple[torch.Tensor, torch.Tensor]],
    chunks: Sequence[step.SeqChunk],
    runs: Sequence[ReplicatedRun],
) -> torch.Tensor:
    """The stage's forward with its replicated runs cut out of the layer loop."""
    if model.embed_tokens is not None:
        x = model.embed_tokens(x)
    pos = 0
    for run in sorted(runs, key=lambda r: r.lo):
        if run.lo > pos:
            x = model.forward_layers(x, md, kv, pos, run.lo)
        x = run.execute(chunks, x)
        pos = run.hi
    if pos < len(model.layers):
        x = model.forward_layers(x, md, kv, pos, len(model.layers))
    return x


def close_runs(runs: Sequence[ReplicatedRun]) -> None:
    """Let every replica of the runs go (the stage is being unloaded)."""
    for run in runs:
        for name, h in run.holders.items():
            if name != run.origin:
                h.close()
