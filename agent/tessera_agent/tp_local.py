"""A tensor-parallel replica across local processes, without agents (tests, `bench tp`).

The calling process drives: it holds rank 0 of every stage (the replica leader and, for a
pipeline, the later stages chained in-process). One spawned process holds every other
rank, each on its own thread, loaded from the same checkpoint and joined to its stage's
gloo group through a TCPStore served here. Used by the engine's TP oracle tests and by
`tessera bench tp`.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera_agent.engine import stage, tp_runner
from tessera_agent.transfer import group, store


@dataclass(frozen=True)
class Rank:
    """One rank of one stage."""

    model_path: str
    start: int
    end: int
    stage_index: int
    tp_size: int
    tp_rank: int
    group_name: str
    store_address: str
    timeout_s: float = 60.0
    kv_bytes: int = 16 << 20


def load(r: Rank) -> stage.Stage:
    spec = stage.BlockSpec(
        r.model_path,
        r.start,
        r.end,
        stage_index=r.stage_index,
        kv_bytes=r.kv_bytes,
        tp_size=r.tp_size,
        tp_rank=r.tp_rank,
    )
    return stage.load_stage(spec, torch.device("cpu"), 1 << 30)


def join(r: Rank) -> group.Group:
    spec = group.GroupSpec(r.store_address, r.group_name, r.tp_rank, r.tp_size, "gloo", r.timeout_s)
    return group.form(spec, torch.device("cpu"))


def _follower(r: Rank) -> None:
    st = load(r)
    tp_runner.follow(st.runner, join(r))


def followers_main(ranks: list[Rank], threads: int = 1) -> None:
    """Entry point of the follower process: one thread per rank, until rank 0 says stop."""
    torch.set_num_threads(threads)
    workers = [threading.Thread(target=_follower, args=(r,)) for r in ranks]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


class TPReplica:
    """Stages [(start, end)] of `model_path`, each sharded over `tp` ranks; rank 0 here."""

    def __init__(
        self,
        model_path: Path,
        splits: list[tuple[int, int]],
        tp: int,
        kv_bytes: int = 16 << 20,
        follower_threads: int = 1,
        timeout_s: float = 60.0,
    ) -> None:
        self.server = store.serve()
        address = f"127.0.0.1:{self.server.port}"
        nonce = uuid.uuid4().hex[:8]
        self.ranks = [
            [
                Rank(
                    str(model_path),
                    a,
                    b,
                    i,
                    tp,
                    k,
                    f"local-{nonce}/s{i}",
                    address,
                    timeout_s=timeout_s,
                    kv_bytes=kv_bytes,
                )
                for k in range(tp)
            ]
            for i, (a, b) in enumerate(splits)
        ]
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(
            target=followers_main,
            args=([r for s in self.ranks for r in s[1:]], follower_threads),
            daemon=True,
        )
        self.proc.start()
        self.stages: list[stage.Stage] = []
        for ranks in self.ranks:
            st = load(ranks[0])
            drv = tp_runner.TPRunner(st.runner)
            drv.attach(join(ranks[0]), ping_s=timeout_s / 4)
            st.runner = drv
            self.stages.append(st)

    def close(self) -> None:
        """Stop every rank: rank 0 says stop, the follower process then exits."""
        alive = self.proc.is_alive()
        for st in self.stages:
            assert isinstance(st.runner, tp_runner.TPRunner)
            st.runner.close()
        if not alive:
            return
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()
            raise RuntimeError("follower process did not stop after rank 0 said stop")
