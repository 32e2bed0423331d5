"""GPU devices at agent start, through a fake device backend and a fake NVML probe.

The budget each GPU gets (utilization x total less what is in use), the errors when
there is no CUDA, the reserve a CUDA load keeps out of its KV pool, and the flags of
`tessera agent` / `tessera up` that carry the utilization.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from tessera.cli import main as cli_main
from tessera.cli import up_cmd
from tessera.policies.serving import gpu_memory
from tessera_agent import devices, gpu_devices, server
from tessera_agent.engine import config, kv_cache, stage

GIB = 1 << 30


@dataclass
class FakeCuda:
    mem: list[tuple[int, int]]  # (free, total) per device
    available: bool = True
    asked: list[int] = field(default_factory=list)

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return len(self.mem)

    def mem_get_info(self, index: int) -> tuple[int, int]:
        self.asked.append(index)
        return self.mem[index]


def _nvml(n: int, total: int = 80 * GIB):  # type: ignore[no-untyped-def]
    def probe() -> tuple[list[devices.Device], str]:
        return [devices.Device(f"cuda:{i}", "cuda", "NVIDIA H100", total) for i in range(n)], "ok"

    return probe


def test_each_gpu_gets_utilization_x_total_less_in_use() -> None:
    fake = FakeCuda([(79 * GIB, 80 * GIB), (60 * GIB, 80 * GIB)])
    devs, status = devices.parse_devices("cuda", 0.9, fake, _nvml(2))
    assert [d.capacity_bytes for d in devs] == [
        int(0.9 * 80 * GIB) - 1 * GIB,
        int(0.9 * 80 * GIB) - 20 * GIB,
    ]
    assert all(d.free_bytes == d.capacity_bytes for d in devs)
    assert status.startswith("ok; budgets: cuda:0: 0.9 x 80.00 GiB - 1.00 GiB in use")
    one, _ = devices.parse_devices("cuda:1", 0.5, FakeCuda(fake.mem), _nvml(2))
    assert [d.id for d in one] == ["cuda:1"] and one[0].capacity_bytes == 20 * GIB


def test_cpu_devices_never_touch_the_backend() -> None:
    fake = FakeCuda([(GIB, GIB)])
    devs, _ = devices.parse_devices("cpu:2x1GiB", 0.9, fake, _nvml(1))
    assert [d.capacity_bytes for d in devs] == [GIB, GIB] and fake.asked == []


def test_errors_name_the_cause() -> None:
    with pytest.raises(devices.DeviceError, match="no CUDA support"):
        devices.parse_devices("cuda", 0.9, FakeCuda([(GIB, GIB)], available=False), _nvml(1))
    with pytest.raises(devices.DeviceError, match=r"torch sees 1.*CUDA_VISIBLE_DEVICES"):
        devices.parse_devices("cuda", 0.9, FakeCuda([(GIB, GIB)]), _nvml(2))
    busy = FakeCuda([(10 * GIB, 80 * GIB)])  # 70 GiB held by another process
    with pytest.raises(devices.DeviceError, match=r"cuda:0 .*70\.00 GiB of 80\.00 GiB.*0\.8"):
        devices.parse_devices("cuda", 0.8, busy, _nvml(1))
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        devices.parse_devices("cuda", 1.5, FakeCuda([(GIB, GIB)]), _nvml(1))


def test_auto_with_gpus_takes_their_budgets() -> None:
    devs, status = devices.parse_devices(
        "auto", 0.9, FakeCuda([(8 * GIB, 8 * GIB)]), _nvml(1, 8 * GIB)
    )
    assert devs[0].capacity_bytes == int(0.9 * 8 * GIB) and "budgets" in status


def test_no_gpu_here_is_a_clear_error_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():  # pragma: no cover - on a GPU node the flag works
        pytest.skip("this machine has a GPU")
    with pytest.raises(devices.DeviceError, match="--devices cuda: no NVIDIA GPU is usable"):
        devices.parse_devices("cuda")
    assert server.run(server.AgentConfig(devices="cuda", port=0)) == 2
    assert "no NVIDIA GPU is usable here" in capsys.readouterr().err


def test_kv_pool_is_the_budget_less_weights_and_reserve(tiny_llama) -> None:  # type: ignore[no-untyped-def]
    """The sizing composed as the agent composes it for a block that takes all the rest:
    KV bytes = utilization x total - in use - weights - activation / graph reserve."""
    cfg = config.ModelConfig.from_path(tiny_llama)
    budget = gpu_memory.device_budget(2 * GIB, 2 * GIB - (300 << 20), 0.9)
    cuda = torch.device("cuda")  # a device object only: nothing is allocated
    reserve = gpu_devices.load_reserve(cfg, 0, cfg.num_layers, torch.bfloat16, 1, 512, 16, cuda)
    assert reserve is not None and reserve.graph_bytes > 0
    assert (
        gpu_devices.load_reserve(cfg, 0, 8, torch.bfloat16, 1, 512, 16, torch.device("cpu")) is None
    )
    spec = stage.BlockSpec(str(tiny_llama), 0, cfg.num_layers, dtype="bfloat16", device="cuda:0")
    _, params = stage.plan_bytes(spec)
    pages = stage.kv_pages(spec, cfg, params, budget.capacity_bytes - reserve.total_bytes)
    kv = budget.capacity_bytes - params - reserve.total_bytes
    want = kv_cache.pages_for_budget(
        kv, cfg.num_layers, spec.page_size, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16
    )
    assert pages == want > 0


def test_agent_and_up_carry_the_utilization() -> None:
    parser = cli_main.build_parser()
    a = parser.parse_args(["agent", "--devices", "cuda", "--gpu-memory-utilization", "0.7"])
    assert (a.devices, a.gpu_memory_utilization) == ("cuda", 0.7)
    assert parser.parse_args(["agent"]).gpu_memory_utilization == 0.9
    u = parser.parse_args(
        ["up", "-f", "m.yaml", "--devices", "cuda", "--gpu-memory-utilization", "0.6"]
    )
    assert u.devices == "cuda"
    assert up_cmd._agent_args(u, "/models") == (
        "--model-root",
        "/models",
        "--gpu-memory-utilization",
        "0.6",
    )
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        server.AgentConfig(gpu_memory_utilization=0.0)


def test_hosting_keeps_the_reserve_out_of_the_kv_pool_and_books_it(
    tiny_llama, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The load path as on a GPU, with the reserve a CUDA device would get forced onto a
    CPU load: a block that takes all the rest gets budget - weights - reserve of KV, the
    reserve is booked under `<holder>/reserve` and released with the block."""
    import asyncio
    import concurrent.futures

    from tessera import blocks
    from tessera_agent import booking, hosting, load_config

    reserve = gpu_memory.LoadReserve(
        activation_bytes=24 << 20, graph_bytes=0, workspace_bytes=8 << 20
    )
    seen: list[tuple[int, int]] = []

    def fake_reserve(cfg, start, end, dtype, tp, tokens, seqs, device):  # type: ignore[no-untyped-def]
        seen.append((tokens, seqs))
        return reserve

    monkeypatch.setattr(gpu_devices, "load_reserve", fake_reserve)

    async def run() -> None:
        dev = devices.Device("cpu:0", "cpu", "virtual CPU device", 256 << 20)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        h = hosting.Hosting("a0", booking.Booking("a0", [dev]), load_config.LoadDefaults(), pool)
        await h.load(blocks.Block(str(tiny_llama), 0, 8, replica_id="r"), max_batched_tokens=512)
        st = h.get("r", 0).stage
        assert dev.used["r/0/reserve"] == reserve.total_bytes
        assert st.kv_bytes <= (256 << 20) - st.param_bytes - reserve.total_bytes
        per_page = st.runner.cache.layout.bytes_per_page
        assert st.kv_bytes > (256 << 20) - st.param_bytes - reserve.total_bytes - per_page
        assert seen == [(512, load_config.LoadDefaults().max_num_seqs)]
        await h.unload("r", 0)
        assert dev.used == {} and dev.free_bytes == 256 << 20
        await h.close()

    asyncio.run(run())


@pytest.mark.slow
def test_up_with_cuda_and_no_gpu_fails_with_the_agents_reason(tiny_llama, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    if torch.cuda.is_available():  # pragma: no cover - on a GPU node it serves
        pytest.skip("this machine has a GPU")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        f"""apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata: {{name: t}}
spec:
  model: {{name: tiny, path: {tiny_llama}}}
  layout:
    mode: explicit
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: cuda:0, layers: [0, 8]}}
  gateway: {{port: 8000}}
"""
    )
    cmd = [sys.executable, "-m", "tessera.cli.main", "up", "-f", str(manifest), "--port", "0"]
    cmd += ["--devices", "cuda", "--agents", "1", "--state-file", str(tmp_path / "s.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "tessera up: agent agent-0 exited: tessera agent: --devices cuda: no NVIDIA GPU" in (
        done.stderr + done.stdout
    )
    assert "Traceback" not in done.stderr
