"""Page bookkeeping of a replicated run: every request's K/V is where it is served.

Fake holders store one number per page (what a page "holds"); the run's moves and
prefix copies are checked against them without a model.
"""

from __future__ import annotations

import concurrent.futures

import torch

from tessera_agent.engine import layer_run, run_holders, sampling, step


class FakeHolder:
    def __init__(self, name: str) -> None:
        self.name, self.param_bytes, self.kv_bytes = name, 0, 0
        self.pages: dict[int, float] = {}
        self.closed = False
        self.lo, self.hi = 0, 2  # as an OriginHolder: stage-local layers

    def submit(
        self, step_id: int, chunks: list[step.SeqChunk], hidden: torch.Tensor
    ) -> concurrent.futures.Future[tuple[torch.Tensor, float]]:
        fut: concurrent.futures.Future[tuple[torch.Tensor, float]] = concurrent.futures.Future()
        for c in chunks:  # "compute": write the sequence's pages, read its context
            for p in c.block_table:
                self.pages.setdefault(p, float(p))
        fut.set_result((hidden + 1, 0.001))
        return fut

    def export_pages(self, pages: list[int]) -> run_holders.KV:
        t = torch.tensor([self.pages[p] for p in pages])
        return [(t, t.clone())]

    def import_pages(self, pages: list[int], kv: run_holders.KV) -> None:
        for p, x in zip(pages, kv[0][0].tolist(), strict=True):
            self.pages[p] = x

    def close(self) -> None:
        self.closed = True


def _run(*names: str, live: set[int]) -> tuple[layer_run.ReplicatedRun, dict[str, FakeHolder]]:
    hs = {n: FakeHolder(n) for n in names}
    origin = hs[names[0]]
    run = layer_run.ReplicatedRun.__new__(layer_run.ReplicatedRun)
    layer_run.ReplicatedRun.__init__(
        run,
        origin,
        0,
        4,
        live_pages=lambda: live,  # type: ignore[arg-type]
    )
    for n in names[1:]:
        run.add(hs[n])  # type: ignore[arg-type]
    return run, hs


def _chunk(seq: str, start: int, n: int, pages: tuple[int, ...]) -> step.SeqChunk:
    return step.SeqChunk(seq, start, n, pages, False, sampling.SamplingParams())


def test_a_page_copied_for_a_prefix_hit_survives_evicting_its_writer() -> None:
    run, hs = _run("o", "a", "b", live={0, 1, 2})
    run.assignment = {"w": "a"}  # "w" is served on a and wrote page 0 there
    run.execute([_chunk("w", 0, 4, (0,))], torch.zeros(4, 2))
    assert run.copies(0) == {"a"}
    run.assignment["r"] = "b"  # "r" shares the cached page 0, served on b
    run.execute([_chunk("r", 4, 2, (0, 1))], torch.zeros(2, 2))
    assert run.copies(0) == {"a", "b"} and hs["b"].pages[0] == 0.0
    pages, _ = run.move("a", "o")  # evict a: its only-held pages go home
    assert run.copies(0) == {"b", "o"} and "a" not in run.holders and hs["a"].closed
    assert pages == 1 and run.assignment["w"] == "o"
    pages, _ = run.move("b", "o")  # evict b: page 0 is home already, page 1 is copied
    assert pages == 1 and run.copies(1) == {"o"} and run.assignment["r"] == "o"


def test_a_write_makes_other_copies_stale_and_migration_moves_home() -> None:
    run, hs = _run("o", "a", live={0, 1})
    run.assignment = {"x": "o", "y": "a"}
    run.execute([_chunk("x", 0, 3, (0,)), _chunk("y", 0, 3, (1,))], torch.zeros(6, 2))
    assert run.copies(0) == {"o"} and run.copies(1) == {"a"}
    assert run.counts() == {"o": 1, "a": 1}
    hs["t"] = FakeHolder("t")
    run.add(hs["t"])  # type: ignore[arg-type]
    pages, _ = run.move("o", "t")  # migrate the origin's copy to t
    assert run.home == "t" and pages == 1 and run.assignment["x"] == "t"
    assert run.holder_names() == ["t", "a"]
