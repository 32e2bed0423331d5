"""How many microbatches the pipeline an overload drop made keeps in flight
(`leader.dropped_in_flight` over `microbatch.in_flight`): one when the head is a CPU stage
whose next stage is reached over loopback (both share this machine's cores), one per stage
otherwise (another host, a host name, a GPU stage), the agent's `--pipeline-microbatches`
over both."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tessera_agent import leader


def _head(next_address: str, device: str = "cpu", num_stages: int = 2) -> Any:
    runner = SimpleNamespace(device=torch.device(device))
    stage = SimpleNamespace(runner=runner, spec=SimpleNamespace(num_stages=num_stages))
    return SimpleNamespace(next_address=next_address, stage=stage)


@pytest.mark.parametrize(
    ("address", "device", "stages", "configured", "want"),
    [
        ("127.0.0.1:5001", "cpu", 2, 0, 1),
        ("[::1]:5001", "cpu", 3, 0, 1),
        ("localhost:5001", "cpu", 2, 0, 1),
        ("10.0.0.7:5001", "cpu", 2, 0, 2),  # another machine's cores
        ("agent-1.tessera.svc:5001", "cpu", 3, 0, 3),  # a name: not known to be this machine
        ("127.0.0.1:5001", "cuda", 2, 0, 2),  # GPU stages compute at once on their own GPUs
        ("127.0.0.1:5001", "cpu", 2, 3, 3),  # --pipeline-microbatches wins
    ],
)
def test_microbatches_in_flight_after_a_drop(
    address: str, device: str, stages: int, configured: int, want: int
) -> None:
    assert leader.dropped_in_flight(_head(address, device, stages), configured) == want
