"""CUDA-graph decode logic on CPU: buckets, static buffers, padding and capture, with a
fake graph API whose replay re-runs the captured function into the same output buffer.

Tokens must equal transformers' (float32) with every pure-decode step replayed from a
bucket, batches and contexts padded; steps that fit no bucket run eagerly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessera_agent.engine import cuda_graphs, sampling
from tests.conftest import hf_greedy
from tests.engine import helpers

NEW = 8
GREEDY = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)


def test_buckets() -> None:
    assert cuda_graphs.batch_buckets(256)[-1] == 256
    assert cuda_graphs.batch_buckets(5) == (1, 2, 4, 8)
    assert cuda_graphs.context_buckets(1024, 16) == (256, 512, 1024)
    assert cuda_graphs.context_buckets(300, 48) == (288, 528)  # whole pages
    assert cuda_graphs.pick((1, 2, 4, 8), 3) == 4
    assert cuda_graphs.pick((1, 2, 4, 8), 9) is None


def test_enabled_only_on_cuda_unless_turned_off() -> None:
    from tessera_agent.engine import options

    assert not cuda_graphs.enabled(torch.device("cpu"))
    assert cuda_graphs.enabled(torch.device("cuda"))
    assert options.EngineOptions.from_env({}).cuda_graphs
    assert not options.EngineOptions.from_env({options.CUDA_GRAPHS_ENV: "0"}).cuda_graphs


def _graphed(path: Path, splits: list[tuple[int, int]], max_batch: int) -> tuple[list, list]:  # type: ignore[type-arg]
    stages = helpers.load(path, splits)
    fakes = []
    for st in stages:
        fake = cuda_graphs.FakeGraphs()
        r = st.runner
        r.graphs = cuda_graphs.DecodeGraphs(
            r.model, r.device, max_batch, 512, r.page_size, api=fake
        )
        fakes.append(fake)
    return stages, fakes


@pytest.mark.parametrize("splits", [[(0, 8)], [(0, 3), (3, 8)]], ids=["whole", "pipeline"])
def test_replayed_decode_matches_hf(
    tiny_llama: Path, prompts: list[list[int]], splits: list[tuple[int, int]]
) -> None:
    stages, fakes = _graphed(tiny_llama, splits, 4)
    # captured on the compute thread before any request (as at load): slot 0 kept
    k0 = stages[0].runner.cache.k[0][0].clone()
    for st in stages:
        assert st.runner.capture_graphs() is not None
    assert torch.equal(stages[0].runner.cache.k[0][0], k0)
    # 3 prompts: batch 3 padded to the bucket of 4, contexts padded to 256
    out, _ = helpers.run(stages, prompts[:3], GREEDY)
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in prompts[:3]]
    for st, fake in zip(stages, fakes, strict=True):
        g = st.runner.graphs
        assert g is not None and g.ready
        assert fake.captured == len(g.buckets) == 3 * 2  # batches 1,2,4 x contexts 256,512
        assert g.replays >= NEW - 1 and fake.replays == g.replays


def test_batches_past_the_largest_bucket_run_eagerly(
    tiny_llama: Path, prompts: list[list[int]]
) -> None:
    stages, _ = _graphed(tiny_llama, [(0, 8)], 2)  # buckets 1, 2; then 5 rows eager
    out, _ = helpers.run(stages, prompts[:5], GREEDY)  # captured lazily at the first decode
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in prompts[:5]]
    g = stages[0].runner.graphs
    assert g is not None and g.capture_s is not None
    assert g.replays < NEW  # some steps (all 5 decoding) did not fit


def test_a_failed_capture_leaves_eager_steps(tiny_llama: Path, prompts: list[list[int]]) -> None:
    class Broken:
        def capture(self, fn):  # type: ignore[no-untyped-def]
            raise RuntimeError("no graphs here")

    (st,) = helpers.load(tiny_llama, [(0, 8)])
    r = st.runner
    r.graphs = cuda_graphs.DecodeGraphs(r.model, r.device, 4, 512, r.page_size, api=Broken())
    assert r.capture_graphs() is None
    assert r.graphs.error is not None and "no graphs here" in r.graphs.error
    out, _ = helpers.run([st], prompts[:2], GREEDY)
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in prompts[:2]]


def test_capture_stops_at_its_budget(tiny_llama: Path, prompts: list[list[int]]) -> None:
    """Past the capture budget the remaining buckets are skipped; their steps run eagerly."""
    (st,) = helpers.load(tiny_llama, [(0, 8)])
    r = st.runner
    fake = cuda_graphs.FakeGraphs()
    r.graphs = cuda_graphs.DecodeGraphs(r.model, r.device, 4, 512, r.page_size, api=fake)
    r.graphs.budget_s = 0.0  # spent before the first bucket
    assert r.capture_graphs() is not None
    assert len(r.graphs.buckets) == 0 and r.graphs.skipped == 6
    out, _ = helpers.run([st], prompts[:2], GREEDY)
    assert out == [hf_greedy(tiny_llama, p, NEW) for p in prompts[:2]]
    assert r.graphs.replays == 0 and fake.captured == 0
