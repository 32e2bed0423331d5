"""The compiled decode path (`engine/decode_graph.py`) keeps transformers' greedy tokens and
log-probabilities; the eager fused ops (RMSNorm, RoPE) are bitwise the reference formulas."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import types
from pathlib import Path

import pytest
import torch

from tessera import blocks
from tessera_agent import booking, devices, hosting, load_config, metrics, tiny_checkpoint
from tessera_agent.engine import (
    attention,
    compile_policy,
    config,
    decode_graph,
    decode_trace,
    model,
    options,
    sampling,
)
from tests.conftest import hf_greedy, hf_greedy_logprobs
from tests.engine import helpers

NEW = 10
MiB = 1 << 20


def _hf_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _hf_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


@pytest.mark.parametrize("hidden", [64, 96, 200, 256])
def test_fused_rmsnorm_and_rope_are_bitwise_the_reference(hidden: int) -> None:
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(13, hidden, generator=g) * 3
    norm = model.RMSNorm(hidden, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=g))
        assert torch.equal(norm(x), _hf_rms(x, norm.weight, 1e-6))
    hd = 64
    q = torch.randn(13, 6, hd, generator=g)
    ang = torch.rand(13, hd // 2, generator=g) * 100
    emb = torch.cat((ang, ang), dim=-1)
    got = model.apply_rope(q, emb.cos(), model.signed_sin(emb.sin()))
    assert torch.equal(got, _hf_rope(q, emb.cos(), emb.sin()))


def test_pure_decode_detection() -> None:
    mk = attention.ChunkGeometry
    cpu = torch.device("cpu")
    decode = attention.build_metadata([mk(5, 1, (0,)), mk(3, 1, (1,))], 16, cpu)
    mixed = attention.build_metadata([mk(5, 1, (0,)), mk(0, 4, (1,))], 16, cpu)
    assert decode_trace.is_pure_decode(decode)
    assert not decode_trace.is_pure_decode(mixed)


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Two layers: compiling is the slow part of this test and grows with the layers.
    spec = tiny_checkpoint.TinySpec(layers=2, seed=5)
    return tiny_checkpoint.make_tiny(tmp_path_factory.mktemp("ckpt") / "small", spec)


@pytest.mark.slow
@pytest.mark.parametrize("freeze", ["0", "1"])
def test_compiled_decode_matches_hf(
    small_llama: Path, prompts: list[list[int]], freeze: str
) -> None:
    """Staggered arrivals over a 2-stage pipeline: pure-decode steps run compiled on both
    stages (first stage from token ids, second from hidden states), and the mixed step of
    the late arrival splits (running decodes compiled, its prompt eagerly); greedy tokens
    equal transformers', log-probabilities within the oracle's tolerance; the warm-up
    covered every step's shape (nothing compiled on a request's step). Both graphs: the
    default (unfrozen, the eager rows' packs as inputs) and the frozen one."""
    opts = options.EngineOptions.from_env({options.FREEZE_ENV: freeze})
    stages = helpers.load(small_llama, [(0, 1), (1, 2)])
    graphs = []
    for st in stages:
        r = st.runner
        g = decode_graph.CompiledDecode(r.model, r.device, r.page_size, opts)
        g.warm_up(r.cache.layers())
        # compiled here, or (unfrozen) both graphs loaded whole from an earlier run's save
        assert g.state == "ready" and (g.compiles >= 2 or g.origin == ["loaded", "loaded"])
        assert g.freeze == (freeze == "1") and (g._graph_packs is None) == g.freeze
        r.decode_graph = g
        r.split_min_decodes = 1  # the late arrival's step: 3 decodes + 1 prompt
        graphs.append((g, g.compiles))
    # The first three decode long enough that the late arrival (10 ms later) always meets
    # them mid-decode: with 10 tokens each, a quiet machine finished them within the
    # 50 ms the late one used to wait, and no step was mixed (a flake in CI).
    lengths = [4 * NEW, 4 * NEW, 4 * NEW, NEW]
    params = [sampling.SamplingParams(max_tokens=n, ignore_eos=True, logprobs=0) for n in lengths]
    sink: dict[int, list] = {}  # type: ignore[type-arg]
    delays = [0.0, 0.0, 0.0, 0.01]
    out, _ = helpers.run(stages, prompts[:4], params, delays=delays, sink=sink)
    assert out == [hf_greedy(small_llama, p, n) for p, n in zip(prompts[:4], lengths, strict=True)]
    for g, warmed in graphs:
        assert g.calls > 0 and g.compiles == warmed  # batch 1..4, contexts 2..60: no recompile
    assert all(st.runner.split_steps > 0 for st in stages)
    for i, p in enumerate(prompts[:4]):
        _, ref = hf_greedy_logprobs(small_llama, p, lengths[i])
        got = torch.tensor([ev.logprobs.logprob for ev in sink[i]])
        want = torch.tensor([float(ref[j, t]) for j, t in enumerate(out[i])])
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    # Batches and contexts far past the ones above (the saturated replica's), contexts
    # mixed within a batch, pages scattered over the pool: the compiled graph agrees with
    # the eager step and compiles nothing new.
    g, warmed = graphs[0]
    r = stages[0].runner
    for b, ctx in ((256, 300), (7, 2), (1, 300), (130, 97)):
        kv = _scattered_pool(r, b * (-(-ctx // r.page_size)) + 3)
        gen = torch.Generator().manual_seed(b + ctx)
        chunks = _decode_chunks(b, ctx, r.page_size, kv[0][0].shape[0], gen)
        with torch.inference_mode():  # made as the runner makes its inputs
            x = torch.randint(0, 500, (b,), generator=gen)
            want_h = r.model(x, attention.build_metadata(chunks, r.page_size, r.device), kv)
            got_h = g(x, attention.build_metadata(chunks, r.page_size, r.device), kv)
        assert got_h is not None and g.compiles == warmed, (b, ctx)
        assert torch.allclose(got_h, want_h, atol=1e-4), (b, ctx, (got_h - want_h).abs().max())


def _scattered_pool(r: object, pages: int) -> decode_graph.KV:
    k0 = r.cache.layers()[0][0]  # type: ignore[attr-defined]
    slots = pages * r.page_size  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(pages)
    return [
        (
            torch.randn(slots, *k0.shape[1:], generator=g),
            torch.randn(slots, *k0.shape[1:], generator=g),
        )
        for _ in r.cache.layers()  # type: ignore[attr-defined]
    ]


def _decode_chunks(
    b: int, ctx: int, ps: int, slots: int, gen: torch.Generator
) -> list[attention.ChunkGeometry]:
    """`b` decode rows, the first with `ctx` tokens of context and the rest 2..ctx, on
    pages drawn at random from the pool (no page shared)."""
    perm = torch.randperm(slots // ps, generator=gen).tolist()
    lens = [ctx, *torch.randint(min(2, ctx), ctx + 1, (b - 1,), generator=gen).tolist()]
    out, at = [], 0
    for n in lens:
        npages = -(-n // ps)
        out.append(attention.ChunkGeometry(n - 1, 1, tuple(perm[at : at + npages])))
        at += npages
    return out


def test_fused_decode_attention_is_gather_and_sdpa() -> None:
    """`attention._decode_fused` (what the compiled graph traces) computes what eager's
    gather + SDPA does: grouped heads, contexts of different lengths, padding masked."""
    gen = torch.Generator().manual_seed(3)
    ps, nh, nkv, hd = 16, 6, 2, 32
    kc, vc = (
        torch.randn(40 * ps, nkv, hd, generator=gen),
        torch.randn(40 * ps, nkv, hd, generator=gen),
    )
    chunks = _decode_chunks(5, 37, ps, kc.shape[0], gen)  # batch 1 keeps the gather
    md = attention.build_metadata(chunks, ps, torch.device("cpu"))
    md.reuse_gather = False
    q = torch.randn(5, nh, hd, generator=gen)
    want = attention._decode(q, md, kc, vc, 0.3, nkv)
    md.decode_fused = True
    got = attention._decode(q, md, kc, vc, 0.3, nkv)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_decode_attention_switch() -> None:
    assert options.EngineOptions.from_env({}).fused_decode_attn
    assert not options.EngineOptions.from_env({options.DECODE_ATTN_ENV: "gather"}).fused_decode_attn
    with pytest.raises(ValueError, match="fused"):
        options.EngineOptions.from_env({options.DECODE_ATTN_ENV: "paged"})


def test_env_switch_and_default() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def opts(raw: str | None, default: bool = False) -> options.EngineOptions:
        env = {} if raw is None else {options.COMPILE_ENV: raw}
        return options.EngineOptions.from_env(env, compile_default=default)

    assert compile_policy.mode(opts("1"), cpu) == "on" and compile_policy.enabled(opts("1"), cuda)
    assert compile_policy.mode(opts("wait"), cpu) == "wait"
    assert not compile_policy.enabled(opts("bogus"), cpu)
    assert not compile_policy.enabled(opts(None), cpu)  # in-process engines: off by default
    assert not compile_policy.enabled(options.EngineOptions(), cpu)
    assert compile_policy.mode(opts(None, True), cpu) == "on"  # what `tessera agent` does
    assert not compile_policy.enabled(opts(None, True), cuda)  # CUDA: only when asked
    assert not compile_policy.enabled(opts("0", True), cpu)  # the off switch beats the default


def test_packed_copies_frozen_and_unfrozen() -> None:
    """The frozen graph holds its own packed copy; the unfrozen one reads the eager rows'."""
    f32, bf16 = torch.float32, torch.bfloat16
    on = options.EngineOptions(compile_decode="on")
    assert not compile_policy.freeze(on, torch.device("cpu"))  # the default: unfrozen
    assert compile_policy.copies(on, f32) == 1 and compile_policy.copies(on, f32, packs=False) == 0
    assert compile_policy.copies(on, bf16) == 0  # packs are float32 only
    frozen = options.EngineOptions.from_env({options.FREEZE_ENV: "1"}, compile_default=True)
    assert frozen.compile_freeze
    assert compile_policy.copies(frozen, f32) == 2
    assert compile_policy.copies(frozen, f32, packs=False) == 1
    assert compile_policy.copies(frozen, bf16) == 1
    assert not compile_policy.freeze(frozen, torch.device("cuda"))
    assert compile_policy.copies(dataclasses.replace(frozen, pack_prompts=False), f32) == 1
    with pytest.raises(ValueError, match=options.FREEZE_ENV):
        options.EngineOptions.from_env({options.FREEZE_ENV: "bogus"})


def test_load_reserve_books_the_packed_copy_only_where_it_fits(tiny_llama: Path) -> None:
    cfg = config.ModelConfig.from_path(tiny_llama)
    # frozen: two copies, the graph's and the packs
    on = options.EngineOptions(compile_decode="on", compile_freeze=True)
    need = compile_policy.planned_packed_bytes(cfg, 0, 8, torch.float32, on)
    stages = helpers.load(tiny_llama, [(0, 8)])
    assert need == compile_policy.packed_bytes(stages[0].runner.model, on)  # the loaded layers'
    args = (cfg, 0, 8, torch.float32)
    cpu = torch.device("cpu")
    assert compile_policy.load_reserve(*args, 1, cpu, 10 * need, 0, on) == need
    assert compile_policy.load_reserve(*args, 1, cpu, 2 * need, 0, on) == need  # half the rest
    one = compile_policy.planned_packed_bytes(cfg, 0, 8, torch.float32, on, packs=False)
    assert one * 2 == need  # the graph's copy and the eager rows' packs
    assert compile_policy.load_reserve(*args, 1, cpu, 2 * need - 1, 0, on) == one
    assert compile_policy.load_reserve(*args, 1, cpu, 2 * one - 1, 0, on) == 0
    assert compile_policy.load_reserve(*args, 1, cpu, need + 8, 8, on) == need  # fixed KV
    assert compile_policy.load_reserve(*args, 1, cpu, need + 8, 9, on) == one  # the graph's
    assert compile_policy.load_reserve(*args, 1, cpu, one + 8, 9, on) == 0
    assert compile_policy.load_reserve(*args, 2, cpu, 10 * need, 0, on) == 0  # TP: eager
    off = options.EngineOptions()
    assert compile_policy.load_reserve(*args, 1, cpu, 10 * need, 0, off) == 0


class _Stub(decode_graph.CompiledDecode):
    """Records warm-up starts instead of compiling (the booking and fallback tests)."""

    def start(self, kv_like: decode_graph.KV) -> None:
        self.started = getattr(self, "started", 0) + 1
        self.state = "warming"


def test_not_ready_or_uncovered_steps_run_eagerly_and_failures_are_loud(
    tiny_llama: Path, prompts: list[list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    stages = helpers.load(tiny_llama, [(0, 8)])
    r = stages[0].runner
    g = _Stub(r.model, r.device, r.page_size)
    r.decode_graph = g
    params = sampling.SamplingParams(max_tokens=6, ignore_eos=True)
    want = [hf_greedy(tiny_llama, p, 6) for p in prompts[:3]]
    out, _ = helpers.run(stages, prompts[:3], params)
    assert out == want and g.started == 1 and g.calls == 0  # warming: every step eager

    def broken(*a: object, **k: object) -> torch.Tensor:
        raise RuntimeError("inductor blew up")

    g.state, g._fn = "ready", broken  # a compiled step that raises: eager, logged, off
    with caplog.at_level("ERROR", logger=decode_graph.__name__):
        out, _ = helpers.run(stages, prompts[:3], params)
    assert out == want and g.state == "failed" and "step failed" in g.reason
    assert "running eagerly" in caplog.text
    g2 = _Stub(r.model, r.device, r.page_size)
    g2.state = "ready"
    one = attention.build_metadata([attention.ChunkGeometry(0, 1, (0,))], 16, r.device)
    assert g2(torch.zeros(1, dtype=torch.long), one, r.cache.layers()) is None  # context 1
    assert g2.calls == 0 and g2.state == "ready"
    # A memory shift swaps layer objects: the compiled code is dropped, warmed up again.
    r.model.layers[0] = copy.deepcopy(r.model.layers[0])
    two = attention.build_metadata([attention.ChunkGeometry(1, 1, (0,))], 16, r.device)
    assert g2(torch.zeros(1, dtype=torch.long), two, r.cache.layers()) is None
    assert g2.state == "warming" and g2.started == 1


def test_a_drop_runs_eagerly_without_a_warm_up_until_restored(tiny_llama: Path) -> None:
    """An overload drop leaves the stage fewer layers: its steps run eagerly and nothing
    warms up beside the burst; the restore (the layers back) warms up again."""
    r = helpers.load(tiny_llama, [(0, 8)])[0].runner
    g = _Stub(r.model, r.device, r.page_size)
    g.state = "ready"
    two = attention.build_metadata([attention.ChunkGeometry(1, 1, (0,))], 16, r.device)

    def step() -> object:
        return g(torch.zeros(1, dtype=torch.long), two, r.cache.layers())

    layers = list(r.model.layers)
    r.model.layers = torch.nn.ModuleList(layers[:4])  # as `memory_shift.drop_layers`
    assert step() is None and g.state == "dropped" and g.packs is None
    assert step() is None and g.state == "dropped" and not hasattr(g, "started")
    r.model.layers = torch.nn.ModuleList(layers)  # restored
    assert step() is None and g.state == "warming" and g.started == 1


def test_agent_books_the_packed_copy_and_starts_the_warm_up(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent with the path on (its default) holds the packed copy's bytes back from
    the KV pool, books them beside the block, starts the warm-up at load (not on a
    request) and gives the bytes back at unload; a copy that does not fit turns it off.
    Frozen: two copies, the graph's and the eager rows' packs (unfrozen, the default, the
    graph reads the packs: one copy, `test_packed_copies_frozen_and_unfrozen`)."""
    on = options.EngineOptions(compile_decode="on", compile_freeze=True)
    monkeypatch.setattr(decode_graph, "CompiledDecode", _Stub)
    dev = devices.Device("cpu:0", "cpu", "virtual CPU device", 256 * MiB)
    hs = hosting.Hosting(
        "a0",
        booking.Booking("a0", [dev]),
        load_config.LoadDefaults(engine=on),
        concurrent.futures.ThreadPoolExecutor(1),
    )
    cfg = config.ModelConfig.from_path(tiny_llama)
    need = compile_policy.planned_packed_bytes(cfg, 0, 8, torch.float32, on)

    async def run() -> None:
        loaded = await hs.load(blocks.Block(str(tiny_llama), 0, 8, replica_id="r0"))
        st = loaded.hosted.stage
        g = st.runner.decode_graph
        assert isinstance(g, _Stub) and g.started == 1 and g.state == "warming"
        assert dev.used["r0/0/decode-graph"] == need
        assert dev.free_bytes < st.runner.cache.layout.bytes_per_page  # the pool: the rest
        assert st.kv_bytes <= 256 * MiB - st.param_bytes - need
        state = types.SimpleNamespace(
            agent_id="a0", devices={dev.id: dev}, hosted=hs.hosted, compute=None
        )
        fams = {f.name: f for f in metrics._StateCollector(state).collect()}
        (sample,) = fams["tessera_agent_decode_graph_ready"].samples
        assert sample.labels["state"] == "warming" and sample.value == 0.0
        served = {
            s.labels["kind"]: s.value for s in fams["tessera_agent_decode_graph_steps"].samples
        }
        assert served == {"decode": 0.0, "split": 0.0}  # no request yet
        (built,) = fams["tessera_agent_decode_graph_compiles"].samples
        assert built.value == 0.0
        await hs.unload("r0", 0)
        assert dev.used == {}
        one = need // 2  # the graph's copy; the eager rows' packs are the other half
        tight = 256 * MiB - st.param_bytes - one  # fixed KV leaves room for one copy only
        mid = await hs.load(blocks.Block(str(tiny_llama), 0, 8, replica_id="r1", kv_bytes=tight))
        g = mid.hosted.stage.runner.decode_graph
        assert isinstance(g, _Stub) and g.started == 1 and not g.with_packs
        assert dev.used["r1/0/decode-graph"] == one == g.packed_bytes
        await hs.unload("r1", 0)
        tighter = 256 * MiB - st.param_bytes - one // 2  # fixed KV leaves no room for it
        small = await hs.load(
            blocks.Block(str(tiny_llama), 0, 8, replica_id="r2", kv_bytes=tighter)
        )
        g = small.hosted.stage.runner.decode_graph
        assert g is not None and g.state == "off" and "do not fit" in g.reason
        assert "r2/0/decode-graph" not in dev.used

    asyncio.run(run())


def test_split_threshold_from_env() -> None:
    """`tessera agent` reads it (`EngineOptions.from_env`); a runner is handed it."""
    from tessera_agent.engine import options

    def split(env: dict[str, str]) -> int:
        return options.EngineOptions.from_env(env).split_min_decodes

    assert split({}) == options.SPLIT_MIN_DECODES
    assert split({options.SPLIT_ENV: "8"}) == 8
    assert split({options.SPLIT_ENV: "0"}) > 1 << 40  # off: no step has that many decodes
    with pytest.raises(ValueError, match="not an integer"):
        split({options.SPLIT_ENV: "many"})
