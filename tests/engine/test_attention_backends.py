"""The attention-backend seam (engine/attention_backend.py) and its library backends on CPU.

- `flex` (`flex_paged.py`): PyTorch's `flex_attention` runs here unfused (its eager
  reference, which evaluates the mask function on every slot of the pool), so the block
  masks and the page-table mask are checked against the native paths in float32: a step
  mixing decodes (not leading), fresh prompts of two lengths and a continued chunk, pages
  out of order, a batch of decodes with different contexts, prefill chunks longer than one
  query block, and whole generations through a stage (greedy tokens equal to native).
  The compiled (Triton) kernel is not run here: no GPU.
- `flashinfer` (`flashinfer_paged.py`): a stand-in module records what its wrappers are
  planned with (page tables, indptr arrays, last-page lengths) and attends with the native
  reference, so the driving is checked; FlashInfer's kernels themselves are not run here.
- the option: validation, `auto` is native, a missing library is a clear error.
"""

from __future__ import annotations

import math
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tessera_agent.engine import (
    attention,
    attention_backend,
    flashinfer_paged,
    flex_paged,
    paged_tables,
)
from tessera_agent.engine import options as options_mod

PS, NH, NKV, HD = 4, 4, 2, 8
SCALE = 1 / math.sqrt(HD)
CPU = torch.device("cpu")

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

MIXED = [  # (start, num_tokens, pages): continued, decode, fresh 5, fresh 5, fresh 3, decode
    attention.ChunkGeometry(3, 4, (7, 2)),
    attention.ChunkGeometry(9, 1, (0, 5, 9)),
    attention.ChunkGeometry(0, 5, (1, 3)),
    attention.ChunkGeometry(0, 5, (4, 6)),
    attention.ChunkGeometry(0, 3, (8,)),
    attention.ChunkGeometry(5, 1, (11, 10)),
]


def _step(
    chunks: list[attention.ChunkGeometry], pages: int, seed: int, kernel_of: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(native output, output through `kernel_of(chunks, pages)`) of one layer's step
    over a pool of noise."""
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(pages * PS, NKV, HD, generator=g)
    vc = torch.randn(pages * PS, NKV, HD, generator=g)
    t = sum(c.num_tokens for c in chunks)
    q, k, v = (torch.randn(t, n, HD, generator=g) for n in (NH, NKV, NKV))
    md = attention.build_metadata(chunks, PS, CPU)
    ref = attention.paged_attention(q, k, v, md, kc.clone(), vc.clone(), SCALE)
    md2 = attention.build_metadata(chunks, PS, CPU)
    md2.kernel = kernel_of(chunks, pages)
    assert md2.kernel is not None
    got = attention.paged_attention(q, k, v, md2, kc.clone(), vc.clone(), SCALE)
    return ref, got


def _flex() -> flex_paged.FlexBackend:
    be = attention_backend.make("flex", CPU, torch.float32, PS, (NH, NKV, HD), SCALE)
    assert isinstance(be, flex_paged.FlexBackend)
    return be


def test_flex_api_is_there() -> None:
    assert flex_paged.available() is None


def test_flex_mixed_step_matches_native() -> None:
    ref, got = _step(MIXED, 12, 0, _flex().plan)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_flex_decode_batch_pages_out_of_order() -> None:
    g = torch.Generator().manual_seed(3)
    perm = torch.randperm(40, generator=g).tolist()
    chunks, at = [], 0
    for ctx in (1, 4, 5, 17, 33, 12):  # one partial page, exact pages, several pages
        n = -(-ctx // PS)
        chunks.append(attention.ChunkGeometry(ctx - 1, 1, tuple(perm[at : at + n])))
        at += n
    be = _flex()
    ref, got = _step(chunks, 40, 1, be.plan)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # the block mask lists each sequence's whole pages as full (no mask evaluated there)
    # and its partial last page as partial
    kern = be.plan(chunks, 40)
    assert isinstance(kern, flex_paged.FlexKernel) and kern.dec is not None
    mask = kern.dec[0]
    full = mask.full_kv_num_blocks.view(-1).tolist()
    part = mask.kv_num_blocks.view(-1).tolist()
    assert full == [0, 1, 1, 4, 8, 3] and part == [1, 0, 1, 1, 1, 0]
    assert mask.kv_indices[3, 0, 0, 0].item() == chunks[3].block_table[4]


def test_flex_prefill_longer_than_a_query_block() -> None:
    n = flex_paged.Q_BLOCK + 37  # two query blocks, a chunk continued across them
    chunks = [
        attention.ChunkGeometry(0, 9, tuple(range(60, 63))),
        attention.ChunkGeometry(6, n, tuple(range(59, -1, -1))[: -(-(6 + n) // PS)]),
        attention.ChunkGeometry(20, 1, (63, 64, 65, 66, 67, 68)),
    ]
    ref, got = _step(chunks, 70, 2, _flex().plan)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_shared_page_at_two_positions_falls_back_to_native() -> None:
    chunks = [attention.ChunkGeometry(5, 1, (1, 2)), attention.ChunkGeometry(5, 1, (2, 3))]
    assert _flex().plan(chunks, 4) is None
    shared = [attention.ChunkGeometry(5, 1, (1, 2)), attention.ChunkGeometry(6, 1, (1, 3))]
    ref, got = _step(shared, 4, 4, _flex().plan)  # a shared prefix page: same index
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_step_tables() -> None:
    t = paged_tables.step_tables(MIXED, PS)
    assert t.decode.chunks == (1, 5) and t.decode.rows == (4, 18)
    assert t.decode.kv_indptr == (0, 3, 5) and t.decode.kv_indices == (0, 5, 9, 11, 10)
    assert t.decode.kv_last_page_len == (2, 2) and t.decode.kv_lens == (10, 6)
    assert t.prefill.chunks == (0, 2, 3, 4)
    assert t.prefill.rows == (0, 1, 2, 3, *range(5, 18))
    assert t.prefill.qo_indptr == (0, 4, 9, 14, 17)
    assert t.prefill.kv_indices == (7, 2, 1, 3, 4, 6, 8)
    assert t.prefill.kv_last_page_len == (3, 1, 1, 3) and not t.decode_leading
    apart = paged_tables.step_tables(MIXED, PS, fresh_apart=True)  # as flex plans
    assert apart.prefill.chunks == (0,) and apart.fresh == ((5, 2, 5), (15, 1, 3))
    assert apart.decode == t.decode


class _FakeWrapper:
    """Records `plan`; `run` attends with plain per-sequence attention over the NHD pages."""

    def __init__(self, workspace: torch.Tensor, layout: str, **kw: Any) -> None:
        assert layout == "NHD" and workspace.dtype == torch.uint8
        self.kw: dict[str, Any] = kw
        self.plans: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def plan(self, *args: Any, **kw: Any) -> None:
        self.plans.append((args, kw))

    def run(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        args, kw = self.plans[-1]
        if "causal" in kw:  # the prefill wrapper's plan
            qo, indptr, indices, last = (a.tolist() for a in args[:4])
        else:
            indptr, indices, last = (a.tolist() for a in args[:3])
            qo = list(range(len(indptr)))
        k4, v4 = kv
        out = []
        for i in range(len(indptr) - 1):
            pages = indices[indptr[i] : indptr[i + 1]]
            ctx = (len(pages) - 1) * PS + last[i]
            kk = k4[pages].reshape(-1, NKV, HD)[:ctx].transpose(0, 1)
            vv = v4[pages].reshape(-1, NKV, HD)[:ctx].transpose(0, 1)
            qs = q[qo[i] : qo[i + 1]].transpose(0, 1)
            n = qs.shape[1]
            mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
            o = F.scaled_dot_product_attention(
                qs, kk, vv, attn_mask=mask, scale=kw["sm_scale"], enable_gqa=True
            )
            out.append(o.transpose(0, 1))
        return torch.cat(out)


@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = _FakeWrapper  # type: ignore[attr-defined]
    mod.BatchPrefillWithPagedKVCacheWrapper = _FakeWrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    return mod


def test_flashinfer_wrappers_driven_with_the_page_tables(fake_flashinfer: Any) -> None:
    be = flashinfer_paged.FlashInferBackend(
        CPU, torch.bfloat16, PS, (NH, NKV, HD), SCALE, require_cuda=False
    )
    ref, got = _step(MIXED, 12, 5, be.plan)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    (dargs, dkw), (pargs, pkw) = be.decode.plans[-1], be.prefill.plans[-1]
    assert [a.tolist() for a in dargs[:3]] == [[0, 3, 5], [0, 5, 9, 11, 10], [2, 2]]
    assert dargs[3:] == (NH, NKV, HD, PS) and all(a.dtype == torch.int32 for a in dargs[:3])
    assert dkw["sm_scale"] == SCALE and dkw["q_data_type"] == torch.bfloat16
    assert [a.tolist() for a in pargs[:4]] == [
        [0, 4, 9, 14, 17],
        [0, 2, 4, 6, 7],
        [7, 2, 1, 3, 4, 6, 8],
        [3, 1, 1, 3],
    ]
    assert pkw["causal"] is True and pargs[4:] == (NH, NKV, HD, PS)
    assert be.decode.kw == {"use_tensor_cores": False}  # 2 query heads per KV head


def test_flashinfer_absent_or_unfit_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import fails
    with pytest.raises(paged_tables.BackendUnavailable, match=r"tessera\[gpu\]"):
        attention_backend.make("flashinfer", CPU, torch.bfloat16, PS, (NH, NKV, HD), SCALE)
    with pytest.raises(paged_tables.BackendUnavailable, match="float16 / bfloat16"):
        attention_backend.make("flashinfer", CPU, torch.float32, PS, (NH, NKV, HD), SCALE)


def test_flashinfer_needs_cuda(fake_flashinfer: Any) -> None:
    with pytest.raises(paged_tables.BackendUnavailable, match="CUDA"):
        attention_backend.make("flashinfer", CPU, torch.bfloat16, PS, (NH, NKV, HD), SCALE)


def test_option_names() -> None:
    assert attention_backend.resolve("auto", CPU) == "native"
    assert attention_backend.resolve("auto", torch.device("cuda", 0)) == "native"
    assert attention_backend.make("native", CPU, torch.float32, PS, (NH, NKV, HD), SCALE) is None
    with pytest.raises(ValueError, match="not one of"):
        options_mod.EngineOptions(attention_backend="paged")
    with pytest.raises(ValueError, match="not one of"):
        attention_backend.resolve("fast", CPU)


def test_agent_flag_reaches_engine_options() -> None:
    import argparse

    from tessera.cli import agent_cmd

    parser = argparse.ArgumentParser()
    agent_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["agent", "--attention-backend", "flex"])
    assert args.attention_backend == "flex"


def test_stage_generates_as_native_through_flex(tiny_llama: Path) -> None:
    """Whole generations through a stage whose runner plans every eager step with flex:
    prompts of different lengths arriving together (mixed prefill + decode steps, chunked
    prompts), greedy tokens equal to the native stage's in float32."""
    from tessera_agent.engine import sampling, stage
    from tests.engine import helpers

    def load(backend: str) -> stage.Stage:
        spec = stage.BlockSpec(str(tiny_llama), 0, 8, kv_bytes=16 << 20, page_size=PS)
        opts = options_mod.EngineOptions(attention_backend=backend)
        return stage.load_stage(spec, CPU, 1 << 30, options=opts)

    prompts = [[1, 5, 9, 13, 2, 7, 11], [3] * 19, [4, 8, 15, 16, 23, 42], [6, 2] * 11]
    params = sampling.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex_stage = load("flex")
        assert isinstance(flex_stage.runner.attention, flex_paged.FlexBackend)
        assert flex_stage.runner.decode_graph is None
        be = flex_stage.runner.attention
        planned: list[bool] = []
        plan = be.plan

        def counted(chunks: Any, pages: int) -> Any:
            k = plan(chunks, pages)
            planned.append(k is not None and k.pre is not None and k.dec is not None)
            return k

        be.plan = counted  # type: ignore[method-assign]
        got, _ = helpers.run([flex_stage], prompts, params, max_batched_tokens=24)
    assert len(planned) >= 12 and any(planned)  # every step, some of them mixed
    native = load("native")
    assert native.runner.attention is None
    want, _ = helpers.run([native], prompts, params, max_batched_tokens=24)
    assert got == want


def test_bench_choice_is_measured_and_explained() -> None:
    from tessera_agent import bench_attention as ba

    native = {"decode_ms_b1": 1.0, "decode_ms_b16": 2.0, "decode_ms_b64": 4.0, "prefill_ms": 8.0}
    fast = {"decode_ms_b1": 0.5, "decode_ms_b16": 1.0, "decode_ms_b64": 2.0, "prefill_ms": 4.0}
    res = {
        "native": native,
        "flex": {**fast, "max_abs_diff": 0.01},
        "flashinfer": {"error": "unavailable: not installed"},
    }
    got = ba.choose(res, torch.bfloat16)
    assert got["attention_backend"] == "flex" and got["decode_vs_native"]["flex"] == 0.5
    assert got["prefill_vs_native"] == {"flex": 0.5} and "0.50x" in got["why"]
    assert any(n.startswith("flashinfer: did not run") for n in got["not_considered"])
    # wrong output, or not faster by the margin: native stays
    res["flex"]["max_abs_diff"] = 0.5
    assert ba.choose(res, torch.bfloat16)["attention_backend"] == "native"
    res["flex"] = {**native, "max_abs_diff": 0.0}
    got = ba.choose(res, torch.bfloat16)
    assert got["attention_backend"] == "native" and "best: flex at 1.00x" in got["why"]
    assert ba.choose({}, torch.bfloat16)["attention_backend"] == "native"


def test_bench_attention_tiny_on_cpu() -> None:
    """The measuring code runs on CPU (tiny shapes, flex unfused): figures present, flex
    agreeing with native, every backend starting from the same pool."""
    from tessera_agent import bench_attention as ba

    layer = ba.Layer(CPU, torch.float32, (4, 2, 16), 16, div=16)
    steps = [c for c in ba.cases(layer) if c[0] in ("decode_ms_b16", "prefill_ms")]
    ref: dict[str, torch.Tensor] = {}
    native = ba.backend_figures("native", layer, steps, 0.25, 1, ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = ba.backend_figures("flex", layer, steps, 0.25, 1, ref)
    assert native["decode_ms_b16"] > 0 and flex["prefill_ms"] > 0
    assert set(ref) == {"decode_ms_b16", "prefill_ms"} and flex["max_abs_diff"] < 1e-5
