"""Sampling makes one device-to-host copy per step (`sampling.to_host`), whatever the
rows ask: tokens and log-probabilities are chosen and gathered on the device.

The logits live on the `meta` device, where any hidden read of a value (`.tolist()`,
`.item()`, `int(t)`) raises, so the only way out is the counted `to_host`, which returns
the values a CPU run of the same step gives.
"""

from __future__ import annotations

import pytest
import torch

from tessera_agent.engine import sampling

V = 50


def _step(n: int) -> tuple[torch.Tensor, list[sampling.SamplingParams]]:
    logits = torch.randn(n, V, generator=torch.Generator().manual_seed(n))
    params = [sampling.SamplingParams(logprobs=(3 if i % 2 else None)) for i in range(n)]
    return logits, params


def test_greedy_with_logprobs_is_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    logits, params = _step(5)
    ids = [f"s{i}" for i in range(5)]
    want_tokens, want_lps = sampling.Sampler().sample_step(logits, ids, params)  # on CPU
    cpu_packed = sampling._gather(logits, logits.argmax(-1), [1, 3], [3, 3])[
        0
    ]  # what the device would hand over
    copies: list[tuple[int, ...]] = []

    def to_host(t: torch.Tensor) -> torch.Tensor:
        assert t.device.type == "meta"
        copies.append(tuple(t.shape))
        return cpu_packed

    monkeypatch.setattr(sampling, "to_host", to_host)
    tokens, lps = sampling.Sampler().sample_step(logits.to("meta"), ids, params)
    assert copies == [tuple(cpu_packed.shape)]  # one copy: 5 tokens + 2 x (1 + 3 + 3)
    assert cpu_packed.shape == (5 + 2 * 7,)
    assert tokens == want_tokens == logits.argmax(-1).tolist()
    assert lps == want_lps and sorted(lps) == [1, 3]
    ref = torch.log_softmax(logits, -1)
    assert lps[1].logprob == float(ref[1, tokens[1]])
    assert [i for i, _ in lps[3].top] == ref[3].topk(3).indices.tolist()


def test_tokens_only_is_one_copy_of_the_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = torch.randn(4, V)
    copies: list[torch.Tensor] = []

    def to_host(t: torch.Tensor) -> torch.Tensor:
        copies.append(t)
        return t.cpu()

    monkeypatch.setattr(sampling, "to_host", to_host)
    p = sampling.SamplingParams()
    assert sampling.Sampler().sample(logits, list("abcd"), [p] * 4) == logits.argmax(-1).tolist()
    assert len(copies) == 1 and copies[0].shape == (4,)


def test_random_rows_stay_on_the_device_and_match_the_seeds() -> None:
    """Seeded rows give the same tokens alone or beside others (the draw is per row)."""
    logits = torch.randn(3, V)
    seeded = sampling.SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=11, logprobs=2)
    mixed = [sampling.SamplingParams(), seeded, sampling.SamplingParams(temperature=1.0)]
    toks, lps = sampling.Sampler().sample_step(logits, ["a", "b", "c"], mixed)
    alone, _ = sampling.Sampler().sample_step(logits[1:2], ["b"], [seeded])
    assert toks[1] == alone[0] and toks[0] == int(logits[0].argmax())
    assert list(lps) == [1] and len(lps[1].top) == 2
    assert lps[1].logprob == float(torch.log_softmax(logits[1], -1)[toks[1]])
