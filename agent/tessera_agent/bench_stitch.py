"""A stitched chain across two widths against the large model alone (BlockLLM §4.4).

`tessera bench stitch --json [--quick] [--family DIR] [--zoo DIR]`. In this process, CPU,
float32: the tiny family (`tiny_family`, or `--family` from `tessera model make-family`), a
stitching block trained between its two widths (`stitch.train`) and stored in the zoo. On
held-out sequences, per point: `cosine` (LM head cosine, the paper's Table 3 measure) and
`top1_agreement` against the large model, the small model alone as the floor. At the served
(middle) point: `param_bytes_saved`, `param_bytes_ratio` (chain / large model), greedy
`tpot_ratio` (stitched / large, one thread) and the greedy tokens' agreement. The paper's
Table 3 stands beside it, labelled as the paper's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tessera_agent import engine_batch

PROMPTS = [[10, 11, 12, 13], [40, 90, 7], [200, 201], [5, 6, 7, 8, 9]]

PAPER_TABLE3 = [
    {"stitching_block": [2048, 4096], "gpu_hours": 2.01, "lm_head_cosine": 0.9634},
    {"stitching_block": [4096, 5120], "gpu_hours": 4.33, "lm_head_cosine": 0.9732},
    {"stitching_block": [5120, 4096], "gpu_hours": 4.84, "lm_head_cosine": 0.9683},
    {"stitching_block": [4096, 8192], "gpu_hours": 6.32, "lm_head_cosine": 0.9798},
    {"stitching_block": [5120, 8192], "gpu_hours": 5.85, "lm_head_cosine": 0.9612},
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="short training, few tokens")
    parser.add_argument("--family", help="folder from `tessera model make-family`")
    parser.add_argument("--zoo", help="zoo folder to keep the stitch in (default: temporary)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")


def _tpot(gen: Any, new: int) -> tuple[list[float], list[list[int]]]:
    times, tokens = [], []
    for prompt in PROMPTS:
        toks, t = gen(prompt, new)
        tokens.append(toks)
        times.extend(t[1:])
    return times, tokens


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from tessera_agent import block_parts, stitch, tiny_family

    torch.set_num_threads(1)  # a shared 2-core machine: intra-op threads only contend
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        family = Path(args.family) if args.family else Path(tmp) / "family"
        if not args.family:
            tiny_family.make_family(family, steps=80 if args.quick else 200)
        family_s = time.perf_counter() - began
        auto: Any = AutoModelForCausalLM
        small = auto.from_pretrained(family / "small", dtype=torch.float32).eval()
        large = auto.from_pretrained(family / "large", dtype=torch.float32).eval()
        ls, ll = small.config.num_hidden_layers, large.config.num_hidden_layers
        points = stitch.default_points(ls, ll)
        began = time.perf_counter()
        st = stitch.train(
            small,
            large,
            tiny_family.sample(128, seed=7),
            points,
            steps_per_point=5 if args.quick else 20,
            joint_steps=30 if args.quick else 240,
        )
        train_s = time.perf_counter() - began
        heldout = tiny_family.heldout(32)
        quality = stitch.measure(small, large, st, heldout, points)
        zoo = Path(args.zoo) if args.zoo else Path(tmp) / "zoo"
        where = stitch.save(
            zoo,
            family / "small",
            family / "large",
            st,
            quality,
            {"heldout": "markov-heldout-seed2-32x64", "train_s": round(train_s, 1)},
        )
        floor = stitch.small_alone(small, large, heldout)
        served = points[len(points) // 2]
        chain = stitch.StitchedChain.from_zoo(zoo, family / "small", family / "large", served)
    whole = [block_parts.Part(large, 0, ll)]
    new = 8 if args.quick else args.tokens
    # alternate the two, three times, so drift in the machine's load hits both alike;
    # the median decode step of each is its TPOT
    large_t: list[float] = []
    stitched_t: list[float] = []
    for _ in range(3):
        t, large_tokens = _tpot(
            lambda p, n: engine_batch.greedy_parts(whole, p, n, inference=True), new
        )
        large_t += t
        t, stitched_tokens = _tpot(chain.generate, new)
        stitched_t += t
    tpot_large, tpot_stitched = statistics.median(large_t), statistics.median(stitched_t)
    same = sum(
        a == b
        for x, y in zip(large_tokens, stitched_tokens, strict=True)
        for a, b in zip(x, y, strict=True)
    )
    front_large = block_parts.Part(large, 0, served[1]).param_bytes
    at = chain.quality
    if at is None:
        raise RuntimeError("the zoo's record has no quality for the served point")
    return {
        "label": "measured on this machine's CPU, float32, tiny family trained here",
        "family": {
            "small": {"hidden": small.config.hidden_size, "layers": ls},
            "large": {"hidden": large.config.hidden_size, "layers": ll},
            "made_s": round(family_s, 1),
        },
        "zoo_entry": where.name,
        "train_s": round(train_s, 1),
        "points": [
            {"point": list(q.point), "cosine": q.cosine, "top1_agreement": q.top1_agreement}
            for q in quality
        ],
        "served_point": list(served),
        "cosine": at.cosine,
        "top1_agreement": at.top1_agreement,
        "small_alone": {"cosine": round(floor[0], 4), "top1_agreement": round(floor[1], 4)},
        "greedy_token_agreement": round(same / (len(PROMPTS) * new), 4),
        "param_bytes_large": block_parts.Part(large, 0, ll).param_bytes,
        "param_bytes_saved": front_large - st.param_bytes,
        "stitch_param_bytes": st.param_bytes,
        "param_bytes_ratio": round(chain.param_bytes / whole[0].param_bytes, 3),
        "tpot_ms_large": round(tpot_large * 1000, 3),
        "tpot_ms_stitched": round(tpot_stitched * 1000, 3),
        "tpot_ratio": round(tpot_stitched / tpot_large, 3),
        "paper_table3": {
            "label": "the paper's (BlockLLM Table 3: LLaMA stitching blocks, A100 GPU hours, "
            "LM head cosine similarity with the large model)",
            "rows": PAPER_TABLE3,
        },
        "paper_fig13": "the paper's Fig. 13 plots accuracy and TPOT after stitching LLaMA "
        "1.1B / 7B / 13B at different layers; its values are not in the paper's text, so "
        "none are quoted here",
    }
