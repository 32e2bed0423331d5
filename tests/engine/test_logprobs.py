"""Log-probabilities of generated tokens against transformers' raw logits.

Greedy tokens and their log-probabilities (and the top-N alternatives) must match the
log-softmax of `transformers`' logits at every step, on one stage and on a pipeline;
requests that did not ask get none; sampled tokens get the log-probability of the token
actually drawn.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessera_agent.engine import errors, sampling, scheduler
from tests.conftest import hf_greedy_logprobs
from tests.engine import helpers

NEW = 6


@pytest.mark.parametrize("splits", [[(0, 8)], [(0, 3), (3, 8)]], ids=["one-stage", "pipeline"])
def test_greedy_logprobs_match_hf(
    tiny_llama: Path, prompts: list[list[int]], splits: list[tuple[int, int]]
) -> None:
    stages = helpers.load(tiny_llama, splits)
    asked = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=3)
    plain = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)
    params = [asked, plain, asked, asked]
    sink: dict[int, list[scheduler.TokenEvent]] = {}
    out, _ = helpers.run(stages, prompts[:4], params, sink=sink)
    for i, p in enumerate(params):
        tokens, hf_lp = hf_greedy_logprobs(tiny_llama, prompts[i], NEW)
        assert out[i] == list(tokens)
        events = sink[i]
        if p.logprobs is None:
            assert all(ev.logprobs is None for ev in events)
            continue
        for t, ev in enumerate(events):
            lp = ev.logprobs
            assert lp is not None
            assert lp.logprob == pytest.approx(float(hf_lp[t, tokens[t]]), abs=1e-4)
            want = torch.topk(hf_lp[t], 3)
            assert [i for i, _ in lp.top] == want.indices.tolist()
            assert [v for _, v in lp.top] == pytest.approx(want.values.tolist(), abs=1e-4)
            assert lp.top[0][0] == tokens[t]  # greedy: the best alternative is the token


def test_sampled_tokens_get_their_own_logprob(tiny_llama: Path, prompts: list[list[int]]) -> None:
    (whole,) = helpers.load(tiny_llama, [(0, 8)])
    params = sampling.SamplingParams(
        max_tokens=NEW, ignore_eos=True, temperature=1.5, seed=3, logprobs=0
    )
    sink: dict[int, list[scheduler.TokenEvent]] = {}
    out, _ = helpers.run([whole], prompts[:1], params, sink=sink)
    # the model's log-probabilities of the drawn tokens, by teacher forcing in transformers
    from tests.conftest import _hf_model

    seq = torch.tensor([prompts[0] + out[0]])
    with torch.no_grad():
        logits = _hf_model(str(tiny_llama))(seq).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    n = len(prompts[0])
    for t, ev in enumerate(sink[0]):
        assert ev.logprobs is not None and ev.logprobs.top == ()
        assert ev.logprobs.logprob == pytest.approx(float(lp[n - 1 + t, out[0][t]]), abs=1e-4)


def test_logprobs_count_is_bounded() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="logprobs"):
        sampling.SamplingParams(logprobs=21)
    with pytest.raises(errors.InvalidArgumentError, match="logprobs"):
        sampling.SamplingParams(logprobs=-1)
