"""Decode graphs saved whole (`engine/decode_aot.py`): a second warm-up on a filled compile
cache loads them without Dynamo tracing a frame, says so (`origin`, status "cached"), and
agrees with the eager model; a corrupt saved graph is compiled afresh, logged, and rewritten;
anything the dropped guards checked changes the saved graph's name."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch._dynamo.utils

from tessera_agent import tiny_checkpoint
from tessera_agent.engine import attention, compile_cache, decode_aot, decode_graph, options
from tests.engine import helpers

# The decode graph alone (the prompt rows' graphs have their own cache): faster.
OPTS = options.EngineOptions(compile_decode="on", pack_prompts=False)


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = tiny_checkpoint.TinySpec(layers=1, seed=13)
    return tiny_checkpoint.make_tiny(tmp_path_factory.mktemp("ckpt") / "one", spec)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    return compile_cache.configure(tmp_path / "cache", os.environ)


def _frames() -> int:
    return int(torch._dynamo.utils.counters["frames"]["total"])


def _agrees_with_eager(g: decode_graph.CompiledDecode, r: object) -> None:
    """Batch 1 and a general batch, contexts over a page boundary: the graph's hidden
    states are the eager model's."""
    ps = r.page_size  # type: ignore[attr-defined]
    kv = r.cache.layers()  # type: ignore[attr-defined]
    for b, ctx in ((1, 40), (5, 19), (9, 2)):
        chunks = [
            attention.ChunkGeometry(ctx - 1, 1, tuple(range(i * 4, i * 4 + -(-ctx // ps))))
            for i in range(b)
        ]
        with torch.inference_mode():
            x = torch.randint(0, 500, (b,), generator=torch.Generator().manual_seed(b))
            want = r.model(x, attention.build_metadata(chunks, ps, r.device), kv)  # type: ignore[attr-defined]
            got = g(x, attention.build_metadata(chunks, ps, r.device), kv)  # type: ignore[attr-defined]
        assert got is not None and torch.allclose(got, want, atol=1e-4), (b, ctx)


@pytest.mark.slow
def test_restart_loads_saved_graphs_without_tracing(one_layer: Path, cache: Path) -> None:
    (st,) = helpers.load(one_layer, [(0, 1)])
    r = st.runner
    first = decode_graph.CompiledDecode(r.model, r.device, r.page_size, OPTS)
    assert first.aot
    first.warm_up(r.cache.layers())
    assert first.origin == ["compiled", "compiled"] and first.compiles == 2
    assert first.status == "warm"
    saved = sorted((cache / decode_aot.FOLDER).glob("*.bin"))
    assert len(saved) == 2
    _agrees_with_eager(first, r)

    # A restart: a new stage model of the same shape (its own weights' objects) and a new
    # graph over it; nothing traced, nothing compiled.
    (st2,) = helpers.load(one_layer, [(0, 1)])
    r2 = st2.runner
    again = decode_graph.CompiledDecode(r2.model, r2.device, r2.page_size, OPTS)
    frames = _frames()
    again.warm_up(r2.cache.layers())
    assert _frames() == frames, "Dynamo traced a frame on a filled cache"
    assert again.origin == ["loaded", "loaded"] and again.compiles == 0
    assert again.status == "cached"
    _agrees_with_eager(again, r2)

    # A corrupt saved graph: compiled afresh, said so, and saved again (then it loads).
    for path in saved:
        path.write_bytes(b"not a pickle")
    third = decode_graph.CompiledDecode(r2.model, r2.device, r2.page_size, OPTS)
    third.warm_up(r2.cache.layers())
    assert all(how.startswith("compiled (saved graph unusable") for how in third.origin)
    assert third.status == "warm" and third.compiles == 2
    _agrees_with_eager(third, r2)
    fourth = decode_graph.CompiledDecode(r2.model, r2.device, r2.page_size, OPTS)
    fourth.warm_up(r2.cache.layers())
    assert fourth.origin == ["loaded", "loaded"] and fourth.status == "cached"

    # Called over other attention than it was built for (what a guard checked): the step
    # runs eagerly and the path turns off, loudly.
    fourth.fused_attention = not fourth.fused_attention
    x = torch.zeros(2, dtype=torch.long)
    chunks = [attention.ChunkGeometry(5, 1, (0,)), attention.ChunkGeometry(5, 1, (1,))]
    with torch.inference_mode():
        md = attention.build_metadata(chunks, r2.page_size, r2.device)
        assert fourth(x, md, r2.cache.layers()) is None
    assert fourth.state == "failed" and fourth.status == "eager"


def test_saved_graph_name_covers_what_guards_checked(tiny_llama: Path) -> None:
    stages = helpers.load(tiny_llama, [(0, 1), (1, 2)])
    m0, m1 = stages[0].runner.model, stages[1].runner.model
    base = decode_aot.key(m0, None, 16, True, False)
    assert base == decode_aot.key(m0, None, 16, True, False)
    others = {
        decode_aot.key(m0, None, 16, True, True),  # batch 1's graph
        decode_aot.key(m0, None, 16, False, False),  # attention not fused
        decode_aot.key(m0, None, 32, True, False),  # page size
        decode_aot.key(m1, None, 16, True, False),  # no embedding, other layers
    }
    assert base not in others and len(others) == 4
    eps = m0.layers[0].input_layernorm.eps
    m0.layers[0].input_layernorm.eps = eps * 2  # a scalar the graph took as a constant
    assert decode_aot.key(m0, None, 16, True, False) != base
    m0.layers[0].input_layernorm.eps = eps
    m0.dtype_ = torch.bfloat16
    assert decode_aot.key(m0, None, 16, True, False) != base
    m0.dtype_ = torch.float32
    # Off where the graph cannot be pickled (frozen) or on request.
    from tessera_agent.engine import compile_policy

    cpu = torch.device("cpu")
    assert compile_policy.aot(OPTS, cpu)
    assert not compile_policy.aot(dataclasses.replace(OPTS, compile_freeze=True), cpu)
    assert not compile_policy.aot(dataclasses.replace(OPTS, compile_aot=False), cpu)
    off = options.EngineOptions.from_env({options.AOT_ENV: "0"})
    assert not off.compile_aot
