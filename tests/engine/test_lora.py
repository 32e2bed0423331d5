"""LoRA variants on shared foundation weights: greedy tokens equal transformers + peft,
in mixed batches of several adapters and the foundation, whole and pipelined; adapters
that do not fit are refused with the reason; prefixes are cached per variant."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from tessera_agent import tiny_variants
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors, lora, sampling
from tests.conftest import hf_greedy
from tests.engine import helpers

peft = pytest.importorskip("peft", reason="peft is the LoRA oracle (dev extra)")

NEW = 12


@pytest.fixture(scope="module")
def adapters(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "all": tiny_variants.make_tiny_lora(tiny_llama, root / "all", r=4, seed=1),
        "attn": tiny_variants.make_tiny_lora(
            tiny_llama, root / "attn", r=8, alpha=4, targets=("q_proj", "v_proj"), seed=2
        ),
        "mlp-some": tiny_variants.make_tiny_lora(
            tiny_llama,
            root / "mlp-some",
            r=2,
            targets=("gate_proj", "down_proj"),
            layers=(1, 5, 6),
            seed=3,
        ),
    }


@functools.cache
def _peft_greedy(base: str, adapter: str, prompt: tuple[int, ...], new: int) -> list[int]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    model.eval()
    ids = torch.tensor([list(prompt)])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new,
        pad_token_id=0,
        eos_token_id=None,
    )
    return out[0, len(prompt) :].tolist()  # type: ignore[no-any-return]


def _load(path: Path, splits: list[tuple[int, int]], adapters: dict[str, Path]) -> list:  # type: ignore[type-arg]
    stages = helpers.load(path, splits)
    cfg = stages[0].cfg
    for st, (a, b) in zip(stages, splits, strict=True):
        st.runner.attach_adapters(
            [lora.read_adapter(p, name, cfg, a, b) for name, p in adapters.items()]
        )
    return stages


@pytest.mark.parametrize("splits", [[(0, 8)], [(0, 3), (3, 8)]], ids=["whole", "pipeline"])
def test_mixed_batch_matches_peft(
    tiny_llama: Path,
    adapters: dict[str, Path],
    prompts: list[list[int]],
    splits: list[tuple[int, int]],
) -> None:
    stages = _load(tiny_llama, splits, adapters)
    names = ["all", "", "attn", "mlp-some", "all", "attn", "", "mlp-some"]
    params = sampling.SamplingParams(max_tokens=NEW, ignore_eos=True)
    out, _ = helpers.run(stages, prompts, params, variants=names)
    for prompt, name, got in zip(prompts, names, out, strict=True):
        if name:
            want = _peft_greedy(str(tiny_llama), str(adapters[name]), tuple(prompt), NEW)
        else:
            want = hf_greedy(tiny_llama, prompt, NEW)
        assert got == want, name or "foundation"
    # The adapters change the model: a test of equality with the foundation alone would
    # otherwise pass with every delta dropped.
    assert out[0] != hf_greedy(tiny_llama, prompts[0], NEW)


def test_unknown_variant_is_refused(tiny_llama: Path, adapters: dict[str, Path]) -> None:
    stages = _load(tiny_llama, [(0, 8)], {"all": adapters["all"]})
    params = sampling.SamplingParams(max_tokens=2, ignore_eos=True)
    with pytest.raises(errors.EngineError, match=r"'nope' is not (loaded|served)"):
        helpers.run(stages, [[0, 5, 6]], params, variants=["nope"])


def test_prefix_cache_is_per_variant(tiny_llama: Path, adapters: dict[str, Path]) -> None:
    stages = _load(tiny_llama, [(0, 8)], adapters)
    prompt = [0, *range(10, 60)]  # three full pages of 16
    params = sampling.SamplingParams(max_tokens=4, ignore_eos=True)
    # The second request arrives after the first computed its prompt.
    _, eng = helpers.run(stages, [prompt, prompt], params, variants=["all", "all"], delays=[0, 1])
    assert eng.stats().prefix_hit_tokens == 48  # same adapter: the prefix is reused
    out, eng = helpers.run(
        stages, [prompt, prompt], params, variants=["all", "attn"], delays=[0, 1]
    )
    assert eng.stats().prefix_hit_tokens == 0, "a prefix cached under another adapter was reused"
    assert out[1] == _peft_greedy(str(tiny_llama), str(adapters["attn"]), tuple(prompt), 4)


def test_lora_linear_rows_use_their_own_adapter() -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 5, bias=False)
    a = torch.randn(2, 3, 6)
    b = torch.randn(2, 5, 3)
    ctx = lora.LoraContext()
    layer = lora.LoraLinear(base, ctx, [lora._Part(0, 5, a, b)])
    x = torch.randn(4, 6)
    ctx.token_slots = torch.tensor([1, -1, 0, 1])
    y = layer(x)
    for i, s in enumerate([1, -1, 0, 1]):
        want = base(x[i])
        if s >= 0:
            want = want + b[s] @ (a[s] @ x[i])
        torch.testing.assert_close(y[i], want)


def _cfg(path: Path) -> config_mod.ModelConfig:
    return config_mod.ModelConfig.from_path(path)


def test_misfit_adapters_are_refused_with_the_reason(tiny_llama: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_llama)
    ad = tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "ok", targets=("q_proj",))
    doc = json.loads((ad / "adapter_config.json").read_text())

    def with_config(**changes: object) -> Path:
        d = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "adapter_model.safetensors").write_bytes(
            (ad / "adapter_model.safetensors").read_bytes()
        )
        (d / "adapter_config.json").write_text(json.dumps({**doc, **changes}))
        return d

    cases = {
        "r must be a positive integer": with_config(r=0),
        "embed_tokens": with_config(target_modules=["q_proj", "embed_tokens"]),
        "use_dora": with_config(use_dora=True),
        "modules_to_save": with_config(modules_to_save=["lm_head"]),
        r"do not fit the foundation \(expected \(8,": with_config(r=8),
        "targets q_proj, not in target_modules": with_config(target_modules=["v_proj"]),
    }
    for pattern, path in cases.items():
        with pytest.raises(lora.AdapterError, match=pattern):
            lora.read_adapter(path, "x", cfg)
    with pytest.raises(lora.AdapterError, match="not a PEFT adapter directory"):
        lora.read_adapter(tmp_path, "x", cfg)
