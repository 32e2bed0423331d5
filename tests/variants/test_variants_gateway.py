"""Variants end to end through the gateway, on real agent processes.

One foundation replica pipelined over two agents (layers 0-4, 4-8), two LoRA adapters
attached to its stages at run time (`VariantAdapters`), and a full fine-tune's chain on the
same agents sharing every identical block (the zoo: the agents' parameter bytes grow by the
differing layers only). Mixed concurrent requests of all four models through the OpenAI
`model` field give transformers' (+ peft's) greedy text; `/v1/models` lists them; an
unknown model is a 404 naming the served ones; an adapter that does not fit is refused with
the reason; removing an adapter with a request in flight lets it finish.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
import torch
from tokenizers import Tokenizer

from tessera import variant_routes
from tessera.cli import local_agents
from tessera.gateway import config, routes
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import tiny_variants
from tessera_agent.engine import block_tensors
from tessera_agent.engine import config as config_mod
from tests.agent.test_agent_rpc import load_replica
from tests.conftest import hf_greedy
from tests.gateway import helpers

pytestmark = pytest.mark.slow
peft = pytest.importorskip("peft", reason="peft is the LoRA oracle (dev extra)")

C = "/v1/completions"
NEW = 10
DIFF = (1, 6)  # layers the full fine-tune changes: one per stage


@pytest.fixture(scope="module")
def made(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("variants")
    return {
        "legal": tiny_variants.make_tiny_lora(tiny_llama, root / "legal", r=4, seed=11),
        "code": tiny_variants.make_tiny_lora(
            tiny_llama, root / "code", r=2, targets=("q_proj", "down_proj"), seed=12
        ),
        "med": tiny_variants.make_tiny_finetune(
            tiny_llama, root / "med", layers=DIFF, seed=13, std=0.05
        ),
        "bad": tiny_variants.make_tiny_lora(tiny_llama, root / "bad", r=4, seed=14),
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


def _stub(address: str) -> pb_grpc.AgentStub:
    return pb_grpc.AgentStub(transport.sync_channel(address, tls=None))


def _set(agents: list[local_agents.AgentProcess], adapters: dict[str, Path]) -> None:
    """Attach exactly `adapters` to both stages (followers first on adding)."""
    for idx in (1, 0):
        _stub(agents[idx].address).VariantAdapters(
            pb.VariantAdaptersRequest(
                replica_id="one",
                stage_index=idx,
                adapters=[pb.VariantAdapter(name=n, path=str(p)) for n, p in adapters.items()],
            ),
            timeout=60,
        )


@pytest.fixture(scope="module")
def cluster(tiny_llama: Path, made: dict[str, Path]) -> Iterator[list[local_agents.AgentProcess]]:
    agents: list[local_agents.AgentProcess] = []
    try:
        for i in range(2):
            agents.append(local_agents.start_agent(f"var-{i}", "cpu:1x512MiB", 1))
        load_replica(agents, tiny_llama, [(0, 4), (4, 8)], "one", kv_bytes=8 << 20)
        load_replica(agents, made["med"], [(0, 4), (4, 8)], "one-med", kv_bytes=8 << 20)
        _set(agents, {"legal": made["legal"], "code": made["code"]})
        yield agents
    finally:
        for a in agents:
            local_agents.stop_agent(a)


def _routes(agents: list[local_agents.AgentProcess], lora: tuple[str, ...]) -> routes.Routes:
    return routes.Routes(
        replicas=(
            config.ReplicaEndpoint("one", agents[0].address),
            config.ReplicaEndpoint("one-med", agents[0].address),
        ),
        variants=(
            *(variant_routes.RouteVariant(n, "lora") for n in lora),
            variant_routes.RouteVariant("med", "full", ("one-med",)),
        ),
    )


def test_zoo_holds_the_finetune_s_differing_layers_only(
    cluster: list[local_agents.AgentProcess], tiny_llama: Path
) -> None:
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    layer = block_tensors.nbytes(cfg, 3, 4, torch.float32)
    for agent, (a, b) in zip(cluster, [(0, 4), (4, 8)], strict=True):
        d = _stub(agent.address).Describe(pb.DescribeRequest(), timeout=10)
        stage = block_tensors.nbytes(cfg, a, b, torch.float32)
        # foundation stage + the fine-tune's one differing layer in this range
        assert d.zoo.param_bytes == stage + layer, (agent.agent_id, d.zoo)
        med = next(blk for blk in d.blocks if blk.replica_id == "one-med")
        assert med.shared_param_bytes == stage - layer
        one = next(blk for blk in d.blocks if blk.replica_id == "one")
        assert sorted(one.variants) == ["code", "legal"]


async def test_mixed_variants_through_the_gateway(
    cluster: list[local_agents.AgentProcess],
    tiny_llama: Path,
    made: dict[str, Path],
    prompts: list[list[int]],
) -> None:
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    gw = await helpers.start(str(tiny_llama))
    try:
        gw.apply_routes(_routes(cluster, ("legal", "code")))
        await gw.refresh()
        assert sorted(gw.ready_replicas()) == ["one", "one-med"]
        models = ["", "legal", "code", "med", "legal", "", "med", "code"]
        async with aiohttp.ClientSession() as s:
            status, listed = await _get(s, gw.url + "/v1/models")
            assert [m["id"] for m in listed["data"]] == [helpers.MODEL, "legal", "code", "med"]

            async def one(prompt: list[int], name: str) -> str:
                body = {
                    "model": name or helpers.MODEL,
                    "prompt": prompt,
                    "max_tokens": NEW,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                st, out = await helpers.post(s, gw.url + C, body)
                assert st == 200, out
                assert out["model"] == (name or helpers.MODEL)
                return str(out["choices"][0]["text"])

            got = await asyncio.gather(*(one(p, n) for p, n in zip(prompts, models, strict=True)))
            for prompt, name, text in zip(prompts, models, got, strict=True):
                if name in ("legal", "code"):
                    want = _peft_greedy(str(tiny_llama), str(made[name]), tuple(prompt), NEW)
                elif name == "med":
                    want = hf_greedy(made["med"], prompt, NEW)
                else:
                    want = hf_greedy(tiny_llama, prompt, NEW)
                assert text == tok.decode(want, skip_special_tokens=True), name or "foundation"
            assert got[1] != got[0] or got[3] != got[0]  # the variants do change the model
            status, err = await helpers.post(
                s, gw.url + C, {"model": "nope", "prompt": "hi", "max_tokens": 2}
            )
            assert status == 404 and err["error"]["code"] == "model_not_found"
            for name in (helpers.MODEL, "legal", "code", "med"):
                assert f"`{name}`" in err["error"]["message"]
    finally:
        await gw.stop()


async def _get(s: aiohttp.ClientSession, url: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with s.get(url) as r:
        return r.status, await r.json()


def test_an_adapter_that_does_not_fit_is_refused_with_the_reason(
    cluster: list[local_agents.AgentProcess], made: dict[str, Path]
) -> None:
    bad = made["bad"] / "adapter_config.json"
    bad.write_text(bad.read_text().replace('"use_dora": false', '"use_dora": true'))
    with pytest.raises(grpc.RpcError) as info:
        _stub(cluster[1].address).VariantAdapters(
            pb.VariantAdaptersRequest(
                replica_id="one",
                stage_index=1,
                adapters=[
                    pb.VariantAdapter(name="legal", path=str(made["legal"])),
                    pb.VariantAdapter(name="bad", path=str(made["bad"])),
                ],
            ),
            timeout=30,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "variant 'bad'" in info.value.details() and "use_dora" in info.value.details()
    d = _stub(cluster[1].address).Describe(pb.DescribeRequest(), timeout=10)
    one = next(blk for blk in d.blocks if blk.replica_id == "one")
    assert sorted(one.variants) == ["code", "legal"]  # nothing changed


async def test_removing_an_adapter_lets_its_request_in_flight_finish(
    cluster: list[local_agents.AgentProcess],
    tiny_llama: Path,
    made: dict[str, Path],
) -> None:
    gw = await helpers.start(str(tiny_llama))
    try:
        gw.apply_routes(_routes(cluster, ("legal", "code")))
        await gw.refresh()
        async with aiohttp.ClientSession() as s:
            body = {"model": "code", "prompt": [0, 5, 6, 7], "max_tokens": 120, "temperature": 0}
            body["ignore_eos"] = True
            running = asyncio.create_task(helpers.post(s, gw.url + C, body))
            leader = _stub(cluster[0].address)
            while not any(kv.running for kv in leader.Describe(pb.DescribeRequest()).kv):
                await asyncio.sleep(0.02)  # the request runs on the replica
            assert not running.done()
            # the gateway stops naming it, then the leader (draining), then the follower
            gw.apply_routes(_routes(cluster, ("legal",)))
            loop = asyncio.get_running_loop()
            keep = {"legal": made["legal"]}
            await loop.run_in_executor(None, _remove_leader_first, cluster, keep)
            status, out = await running
            assert status == 200 and out["usage"]["completion_tokens"] == 120
            want = _peft_greedy(str(tiny_llama), str(made["code"]), (0, 5, 6, 7), 120)
            tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
            assert out["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True)
            status, err = await helpers.post(s, gw.url + C, {**body, "max_tokens": 2})
            assert status == 404 and "`legal`" in err["error"]["message"]
    finally:
        await gw.stop()
        _set(cluster, {"legal": made["legal"], "code": made["code"]})


def _remove_leader_first(agents: list[local_agents.AgentProcess], keep: dict[str, Path]) -> None:
    for idx in (0, 1):
        _stub(agents[idx].address).VariantAdapters(
            pb.VariantAdaptersRequest(
                replica_id="one",
                stage_index=idx,
                adapters=[pb.VariantAdapter(name=n, path=str(p)) for n, p in keep.items()],
            ),
            timeout=120,
        )
