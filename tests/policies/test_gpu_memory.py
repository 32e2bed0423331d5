"""The GPU memory budget (utilization x total less in use) and a CUDA load's reserve."""

from __future__ import annotations

import pytest

from tessera.policies.serving import gpu_memory

GIB = 1 << 30


def test_budget_is_the_fraction_less_what_is_in_use() -> None:
    b = gpu_memory.device_budget(80 * GIB, 79 * GIB, 0.9)
    assert b.capacity_bytes == int(0.9 * 80 * GIB) - GIB and not b.error
    assert b.in_use_bytes == GIB
    assert "0.9 x 80.00 GiB - 1.00 GiB in use" in b.describe()
    assert gpu_memory.device_budget(80 * GIB, 80 * GIB, 1.0).capacity_bytes == 80 * GIB


def test_a_fraction_below_what_is_taken_is_an_error_naming_both() -> None:
    b = gpu_memory.device_budget(80 * GIB, 20 * GIB, 0.5)  # 60 GiB held by others
    assert b.capacity_bytes == 0
    assert "60.00 GiB of 80.00 GiB" in b.error and "0.5" in b.error
    assert "--gpu-memory-utilization" in b.error


@pytest.mark.parametrize("u", [0.0, -0.1, 1.01])
def test_utilization_outside_0_1_is_refused(u: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        gpu_memory.device_budget(GIB, GIB, u)


def test_bad_measurements_are_refused() -> None:
    with pytest.raises(ValueError, match="free"):
        gpu_memory.device_budget(GIB, 2 * GIB, 0.9)


SHAPE_1B = gpu_memory.ModelShape(2048, 8192, 32000, 32, 8, 64, 16)


def test_reserve_grows_with_the_step_and_counts_graphs_only_when_captured() -> None:
    r = gpu_memory.load_reserve(SHAPE_1B, 8192, 256, 2, graphs=True)
    per_row = 2 * 2048 + (32 + 16) * 64 + 32 * 64 + 3 * 8192
    assert r.activation_bytes == 8192 * per_row * 2 + 256 * 32000 * 8
    assert r.graph_bytes == 256 * per_row * 2 + 256 * 32000 * 8
    assert r.total_bytes == r.activation_bytes + r.graph_bytes + gpu_memory.WORKSPACE_BYTES
    no_graphs = gpu_memory.load_reserve(SHAPE_1B, 8192, 256, 2, graphs=False)
    assert no_graphs.graph_bytes == 0 and no_graphs.activation_bytes == r.activation_bytes
    small = gpu_memory.load_reserve(SHAPE_1B, 512, 8, 2, graphs=True)
    assert small.total_bytes < r.total_bytes
    # about 0.7 GiB for the 1B shape at 8192 tokens in bfloat16: small beside a GPU
    assert r.activation_bytes < GIB
