"""Engine throughput against Hugging Face transformers, single agent vs 2-stage pipeline.

`tessera bench engine --json [--quick] [--compile]`. One run on the default tiny checkpoint,
greedy, 64 new tokens per request, EOS ignored on both sides. Keys: `hf_tok_s_b{1,8}` and
`engine_tok_s_b{1,8}` (in this process, same threads); `single_agent_tok_s_b8` (one agent over
gRPC); `pipeline2_tok_s_b8` (two agents, layers 0-4 and 4-8, half the threads each, hidden
states and returned tokens on gloo links); `pipeline2_grpc_tok_s_b8` (the same split without a
data plane; `links_on_vs_off_b8` compares them); `pipeline2_mb3_tok_s_b8` (three microbatches
in flight; `mb3_vs_mb2_b8`); with `--compile`, `compiled_vs_eager_b8`, `compile_s` and
`tokens_match_compiled`. Compared runs are interleaved round by round after one warm-up;
throughputs are medians over rounds, ratios medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch

from tessera.bench import harness
from tessera.cli import local_agents
from tessera.rpc import sampling as rpc_sampling
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import engine_batch, tiny_checkpoint
from tessera_agent.engine import config, decode_graph, omp_teams, sampling, stage

Tokens = engine_batch.Tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_batch.add_arguments(parser, "timed rounds per comparison")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time the engine with compiled decode steps against the eager engine",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="checkpoint to use (default: a fresh default tiny checkpoint)",
    )


def _prompts(n: int, length: int, vocab: int, bos: int) -> Tokens:
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(5, vocab, (n, length), generator=g)
    ids[:, 0] = bos
    return [row.tolist() for row in ids]


def _interleaved(
    a: Callable[[], Tokens], b: Callable[[], Tokens], rounds: int
) -> tuple[Tokens, Tokens, float, float, float]:
    """Time a then b in each round (after a warm-up round): (tokens a, tokens b, median
    seconds a, median seconds b, median of per-round b/a speed ratios)."""
    (out_a, out_b), (ta, tb) = harness.timed_rounds([a, b], rounds)
    return out_a, out_b, statistics.median(ta), statistics.median(tb), harness.median_ratio(ta, tb)


def _hf_generate(model_path: Path, prompts: Tokens, new: int) -> Callable[[int], Tokens]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_path)
    hf.generation_config.eos_token_id = None  # never stop early: fixed token counts
    ids = torch.tensor(prompts)

    def gen(b: int) -> Tokens:
        # Called through Any: transformers' own annotation of generate changes between
        # releases, and a version-dependent `type: ignore` breaks mypy on the next one.
        generate: Callable[..., Any] = cast(Any, hf).generate
        out = generate(
            ids[:b],
            attention_mask=torch.ones_like(ids[:b]),
            do_sample=False,
            max_new_tokens=new,
            pad_token_id=0,
        )
        return [row[ids.shape[1] :].tolist() for row in out]

    return gen


@contextlib.contextmanager
def _engine_generate(
    model_path: Path,
    prompts: Tokens,
    new: int,
    compile_decode: bool | None = None,
    kv_bytes: int = 64 << 20,
) -> Iterator[Callable[..., Tokens]]:
    """Yields `run(b, new=None, prompts=None)`: greedy tokens of the first `b` prompts
    (`prompts` and `new` per call override the defaults given here). `compile_decode`:
    compile decode steps (None: the default options: eager)."""
    cfg = config.ModelConfig.from_path(model_path)
    st = stage.load_stage(
        stage.BlockSpec(str(model_path), 0, cfg.num_layers, kv_bytes=kv_bytes),
        torch.device("cpu"),
        1 << 30,
    )
    if compile_decode is not None:
        r = st.runner
        r.decode_graph = (
            decode_graph.CompiledDecode(r.model, r.device, r.page_size) if compile_decode else None
        )
    graph = st.runner.decode_graph
    if graph is not None and graph.state == "cold":  # warmed up before anything is timed
        graph.warm_up(st.runner.cache.layers())
    omp_teams.release()  # this thread's team: steps run on `pool`'s (see omp_teams)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    counter = iter(range(10**9))

    async def run(b: int, new_: int | None, prompts_: Tokens | None) -> Tokens:
        params = sampling.SamplingParams(max_tokens=new_ or new, ignore_eos=True)
        batch = (prompts if prompts_ is None else prompts_)[:b]
        return await engine_batch.generate(
            st.runner, pool, cfg.max_positions, batch, params, counter
        )

    def call(b: int, new: int | None = None, prompts: Tokens | None = None) -> Tokens:
        return asyncio.run(run(b, new, prompts))

    try:
        yield call
    finally:
        pool.shutdown()


def _compiled_vs_eager(model_path: Path, prompts: Tokens, new: int, rounds: int) -> dict[str, Any]:
    with _engine_generate(model_path, prompts, new, compile_decode=False) as eager:
        t = time.perf_counter()
        with _engine_generate(model_path, prompts, new, compile_decode=True) as compiled:
            compile_s = time.perf_counter() - t  # the warm-up (or Inductor's disk cache)
            compiled(8)
            eager_toks, comp_toks, _, _, ratio = _interleaved(
                lambda: eager(8), lambda: compiled(8), rounds
            )
    return {
        "compiled_vs_eager_b8": round(ratio, 3),
        "compile_s": round(compile_s, 1),
        "tokens_match_compiled": comp_toks == eager_toks,
    }


async def _generate_all(
    address: str, replica_id: str, prompts: Tokens, new: int, tls: Any
) -> Tokens:
    channel = transport.channel(address, tls)
    stub = pb_grpc.AgentStub(channel)
    params = rpc_sampling.to_proto(rpc_sampling.Sampling(max_tokens=new, ignore_eos=True))

    async def one(i: int, p: list[int]) -> list[int]:
        toks: list[int] = []
        async for ch in stub.Generate(
            pb.GenerateRequest(
                replica_id=replica_id,
                request_id=f"{time.monotonic_ns()}-{i}",
                prompt_token_ids=p,
                params=params,
            )
        ):
            toks.extend(ch.token_ids)
        return toks

    try:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    finally:
        await channel.close()


def _links(address: str, tls: Any) -> tuple[str, str]:
    """(activations, results) of the "pipe" replica's leader block, as Describe says."""
    channel = transport.sync_channel(address, tls)
    try:
        d = pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest())
    finally:
        channel.close()
    b = next(b for b in d.blocks if (b.replica_id, b.stage_index) == ("pipe", 0))
    return b.activations, b.results


def run(args: argparse.Namespace) -> dict[str, Any]:
    new = 16 if args.quick else args.new_tokens
    rounds = 2 if args.quick else args.rounds
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        model_path = args.model or tiny_checkpoint.make_tiny(
            Path(tmp) / "tiny", tiny_checkpoint.TinySpec()
        )
        cfg = config.ModelConfig.from_path(model_path)
        prompts = _prompts(8, args.prompt_len, cfg.vocab_size, cfg.bos_token_id or 0)
        hf = _hf_generate(model_path, prompts, new)
        with _engine_generate(model_path, prompts, new) as eng:
            _, _, hf_t1, eng_t1, _ = _interleaved(lambda: hf(1), lambda: eng(1), rounds)
            hf_toks, eng_toks, hf_t8, eng_t8, eng_vs_hf = _interleaved(
                lambda: hf(8), lambda: eng(8), rounds
            )
        compiled = _compiled_vs_eager(model_path, prompts, new, rounds) if args.compile else {}
        half = cfg.num_layers // 2
        with (
            local_agents.local_agents(1, "cpu:1x1GiB", threads, "single") as single,
            local_agents.local_agents(2, "cpu:1x1GiB", max(1, threads // 2), "pipe") as pipe,
            local_agents.local_agents(
                2, "cpu:1x1GiB", max(1, threads // 2), "mb3", ("--pipeline-microbatches", "3")
            ) as mb3,
        ):
            local_agents.load_pipeline(
                single, str(model_path), [(0, cfg.num_layers)], "single", 64 << 20
            )
            split = [(0, half), (half, cfg.num_layers)]
            local_agents.load_pipeline(pipe, str(model_path), split, "pipe", 64 << 20)
            local_agents.load_pipeline(
                pipe, str(model_path), split, "plain", 64 << 20, data_plane=False
            )
            local_agents.load_pipeline(mb3, str(model_path), split, "pipe", 64 << 20)
            deadline = time.monotonic() + 60  # the links form in the background
            while time.monotonic() < deadline:
                links, links3 = (
                    _links(pipe[0].address, pipe[0].tls),
                    _links(mb3[0].address, mb3[0].tls),
                )
                if links == links3 == ("gloo", "gloo"):
                    break
                time.sleep(0.2)
            (single_toks, pipe_toks, plain_toks, mb3_toks), (s_t, p_t, g_t, m_t) = (
                harness.timed_rounds(
                    [
                        lambda: asyncio.run(
                            _generate_all(single[0].address, "single", prompts, new, single[0].tls)
                        ),
                        lambda: asyncio.run(
                            _generate_all(pipe[0].address, "pipe", prompts, new, pipe[0].tls)
                        ),
                        lambda: asyncio.run(
                            _generate_all(pipe[0].address, "plain", prompts, new, pipe[0].tls)
                        ),
                        lambda: asyncio.run(
                            _generate_all(mb3[0].address, "pipe", prompts, new, mb3[0].tls)
                        ),
                    ],
                    rounds,
                )
            )
            links_after = _links(pipe[0].address, pipe[0].tls)
        s_t8, p_t8, g_t8, m_t8 = (statistics.median(t) for t in (s_t, p_t, g_t, m_t))
    return {
        "hf_tok_s_b1": round(new / hf_t1, 1),
        "hf_tok_s_b8": round(8 * new / hf_t8, 1),
        "engine_tok_s_b1": round(new / eng_t1, 1),
        "engine_tok_s_b8": round(8 * new / eng_t8, 1),
        "single_agent_tok_s_b8": round(8 * new / s_t8, 1),
        "pipeline2_tok_s_b8": round(8 * new / p_t8, 1),
        "engine_vs_hf_b8": round(eng_vs_hf, 3),
        "pipeline2_grpc_tok_s_b8": round(8 * new / g_t8, 1),
        "pipeline2_vs_single_b8": round(harness.median_ratio(s_t, p_t), 3),
        "pipeline2_grpc_vs_single_b8": round(harness.median_ratio(s_t, g_t), 3),
        "links_on_vs_off_b8": round(harness.median_ratio(g_t, p_t), 3),
        "pipeline2_mb3_tok_s_b8": round(8 * new / m_t8, 1),
        "mb3_vs_mb2_b8": round(harness.median_ratio(p_t, m_t), 3),
        "tokens_match": eng_toks == hf_toks
        and pipe_toks == hf_toks
        and plain_toks == hf_toks
        and mb3_toks == hf_toks
        and single_toks == hf_toks,
        # what the leader's block reported before and after the timed rounds
        **compiled,
        "pipeline_activations": f"{links[0]}/{links_after[0]}",
        "pipeline_results": f"{links[1]}/{links_after[1]}",
        "new_tokens": new,
        "prompt_len": args.prompt_len,
        "rounds": rounds,
        "torch_threads": threads,
        "machine": harness.machine(f"torch {torch.__version__}"),
    }
