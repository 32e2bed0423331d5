"""Compiled prompt rows (`engine/prompt_graph.py`): many-row eager steps through the compiled
row-wise layer parts keep transformers' greedy tokens and log-probabilities on a 2-stage
pipeline (Llama, and Qwen2's biased qkv projection), with no recompile after the warm-up;
and every fallback (switched off, not warmed, a swapped layer, a failed warm-up) leaves
the step eager. Compiling is the slow part: 2-layer models, one warm-up per test."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from tessera_agent import tiny_checkpoint
from tessera_agent.engine import (
    attention,
    compile_policy,
    decode_graph,
    model,
    options,
    packed_linear,
    prompt_graph,
    sampling,
)
from tests.conftest import hf_greedy, hf_greedy_logprobs
from tests.engine import helpers


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def two_layers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = tiny_checkpoint.TinySpec(layers=2, seed=5, arch=request.param)
    return tiny_checkpoint.make_tiny(tmp_path_factory.mktemp("ckpt") / request.param, spec)


def _packed(st_runner: object) -> decode_graph.CompiledDecode:
    """A decode graph that never compiles (every step eager) but holds the stage's packs."""
    from tessera_agent.engine.runner import StageRunner

    assert isinstance(st_runner, StageRunner)
    r = st_runner
    g = decode_graph.CompiledDecode(r.model, r.device, r.page_size)
    g.state = "warming"
    g.packs = packed_linear.StagePacks(r.model)
    r.decode_graph = g
    return g


@pytest.mark.slow
def test_compiled_prompt_rows_match_hf(two_layers: Path, prompts: list[list[int]]) -> None:
    """Both stages (token ids in, hidden states in) run their many-row steps compiled:
    whole prefill steps and steps mixing late prompts into running decodes; the second
    stage reuses the first's compiled pair (same shapes); nothing compiles after it."""
    stages = helpers.load(two_layers, [(0, 1), (1, 2)])
    graphs = []
    for st in stages:
        g = _packed(st.runner)
        g._warm_prompts(g._gen)  # what the decode warm-up does after its own graphs
        assert g.packs is not None and g.packs.graph is not None
        assert g.packs.graph.state == "ready"
        graphs.append(g.packs.graph)
    warmed = graphs[0].compiles
    assert graphs[1].compiles == warmed  # one compiled pair for both stages
    n = 6
    params = sampling.SamplingParams(max_tokens=n, ignore_eos=True, logprobs=0)
    sink: dict[int, list] = {}  # type: ignore[type-arg]
    delays = [0.0] * 4 + [0.01] * 4  # the late four meet the first four mid-decode
    out, _ = helpers.run(stages, prompts, params, delays=delays, sink=sink)
    assert out == [hf_greedy(two_layers, p, n) for p in prompts]
    assert all(pg.calls > 0 for pg in graphs)
    assert graphs[0].compiles == warmed  # other row counts, layers, stages: no recompile
    for i, p in enumerate(prompts):
        _, ref = hf_greedy_logprobs(two_layers, p, n)
        got = torch.tensor([ev.logprobs.logprob for ev in sink[i]])
        want = torch.tensor([float(ref[j, t]) for j, t in enumerate(out[i])])
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_prompt_switch() -> None:
    cpu = torch.device("cpu")

    def opts(env: dict[str, str]) -> options.EngineOptions:
        return options.EngineOptions.from_env(env)

    assert compile_policy.compile_prompts(opts({}), cpu)
    assert not compile_policy.compile_prompts(opts({}), torch.device("cuda"))
    no_packs = opts({options.PACK_ENV: "0"})  # no packs, nothing to compile over
    assert not compile_policy.compile_prompts(no_packs, cpu)
    assert not compile_policy.compile_prompts(opts({options.PROMPT_ENV: "0"}), cpu)


def test_fallbacks_leave_steps_eager(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing here compiles: an off switch or a failed warm-up attaches no graph (the
    decode graph is left as it was); a graph not warmed up, or a step with a swapped
    layer, returns None and the model runs the step eagerly, to the same bits."""
    (st,) = helpers.load(tiny_llama, [(0, 8)])
    r = st.runner
    g = _packed(r)
    assert g.packs is not None
    g.options = dataclasses.replace(g.options, compile_prompts=False)
    g._warm_prompts(g._gen)
    assert g.packs.graph is None
    g.options = dataclasses.replace(g.options, compile_prompts=True)

    def broken(self: prompt_graph.PromptGraph, *a: object) -> float:
        raise RuntimeError("inductor blew up")

    monkeypatch.setattr(prompt_graph.PromptGraph, "warm_up", broken)
    with caplog.at_level("ERROR", logger=decode_graph.__name__):
        g._warm_prompts(g._gen)
    assert g.packs.graph is None and g.state == "warming" and "stay eager" in caplog.text

    m = r.model
    layers = [layer for layer in m.layers if isinstance(layer, model.DecoderLayer)]
    pg = prompt_graph.PromptGraph(m)  # cold: not warmed up
    chunks = [attention.ChunkGeometry(0, 40, (0, 1, 2)), attention.ChunkGeometry(0, 40, (3, 4, 5))]
    with torch.inference_mode():
        md = attention.build_metadata(chunks, r.page_size, r.device)
        md.packed = g.packs
        md.cos, md.sin = m.rope_tables(md.positions, md.max_position)
        x = torch.randn(80, m.cfg.hidden_size)
        kv = r.cache.layers()
        assert pg.forward(layers, x, md, kv, g.packs) is None
        pg.state = "ready"  # as if warmed up; a swapped layer must still send it eager
        assert all(prompt_graph.layer_args(layer, g.packs) is not None for layer in layers)
        qkv = layers[3].self_attn.qkv_proj
        qkv.weight = nn.Parameter(qkv.weight.detach().clone())
        assert prompt_graph.layer_args(layers[3], g.packs) is None
        assert pg.forward(layers, x, md, kv, g.packs) is None and pg.calls == 0
        ids = torch.randint(5, 500, (80,), generator=torch.Generator().manual_seed(0))
        g.packs.graph = pg
        got = m(ids, md, kv)  # through `_run_layers`: the graph declines, eager
        g.packs.graph = None
        want = m(ids, md, kv)
    assert torch.equal(got, want) and pg.calls == 0


@pytest.mark.slow
def test_bench_prefill_quick(capsys: pytest.CaptureFixture[str]) -> None:
    """`tessera bench prefill --quick` runs; both paths give the same tokens (no timing
    asserted)."""
    import json

    from tessera.cli import main as cli

    assert cli.main(["bench", "prefill", "--json", "--quick", "--batch", "8"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens_match"] is True and out["compiled_steps"] > 0
    assert out["eager_cpu_s"] > 0 and out["compiled_cpu_s"] > 0 and out["recompiles"] == 0


def test_malloc_tune_switch() -> None:
    """The agent's malloc thresholds: off by the variable (read by `tessera agent`); on
    glibc both are taken."""
    import platform

    from tessera_agent.engine import host_malloc, options

    off = options.EngineOptions.from_env({options.MALLOC_ENV: "0"})
    assert not off.malloc_tune and not host_malloc.tune(off.malloc_tune)
    assert options.EngineOptions.from_env({}).malloc_tune
    if platform.libc_ver()[0] == "glibc":
        assert host_malloc.tune()
