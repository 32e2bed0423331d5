"""Units to checkpoint names, the throttled storage reader, and parts on the wire (issue 11).

In-process, no agents: every unit range names exactly the tensors of the layers it covers
(the embedding with unit 0, the final norm and head with unit L+1); a read at a declared
bandwidth takes at least bytes / bandwidth; a `LoadBlock` action's parts become
`switch_sources` of its request.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tessera import blocks
from tessera.policies.transition import actions
from tessera.rpc import blocks as rpc_blocks
from tessera_agent import switch_fetch
from tessera_agent.engine import config, errors, loader


def test_unit_ranges_name_exactly_their_layers(tiny_llama: Path) -> None:
    cfg = config.ModelConfig.from_path(tiny_llama)
    n = cfg.num_layers
    everything = switch_fetch.unit_names(cfg, 0, n + 2)
    assert set(everything) == set(loader.checkpoint_names(cfg, 0, n))
    # layers [0, 4) are units 0-4 (with the embedding); [4, n) with the head are 5..n+1
    assert set(switch_fetch.unit_names(cfg, 0, 5)) == set(loader.checkpoint_names(cfg, 0, 4))
    assert set(switch_fetch.unit_names(cfg, 5, n + 2)) == set(loader.checkpoint_names(cfg, 4, n))
    with pytest.raises(errors.InvalidArgumentError, match="units"):
        switch_fetch.unit_names(cfg, 3, n + 3)


def test_throttled_reader_takes_bytes_over_bandwidth(tiny_llama: Path) -> None:
    cfg = config.ModelConfig.from_path(tiny_llama)
    names = loader.checkpoint_names(cfg, 0, 2)
    fast = switch_fetch.read_checkpoint(tiny_llama, names, 0)
    nbytes = sum(t.numel() * t.element_size() for t in fast.values())
    started = time.monotonic()
    slow = switch_fetch.read_checkpoint(tiny_llama, names, nbytes / 0.3)  # 0.3 s at this rate
    assert time.monotonic() - started >= 0.3
    assert all((slow[k] == fast[k]).all() for k in names)


def test_parts_go_on_the_wire() -> None:
    b = blocks.Block("/m", 0, 6, replica_id="r1.g3", num_stages=2)
    peer = actions.PeerSource("agent-0", "h:1", "r0.g1", 0, "")
    local = actions.PeerSource("agent-1", "h:2", "r1.g2", 1, "local")
    parts = (actions.SwitchPart((0, 5), peer), actions.SwitchPart((5, 7), local))
    req = rpc_blocks.load_request(b, parts=parts)
    got = [
        (p.unit_start, p.unit_end, p.source.address, p.source.replica_id, p.source.transport)
        for p in req.switch_sources
    ]
    assert got == [(0, 5, "h:1", "r0.g1", ""), (5, 7, "h:2", "r1.g2", "local")]
    assert not req.HasField("source")
    store = rpc_blocks.load_request(b, parts=(actions.SwitchPart((0, 7), None),))
    assert store.switch_sources[0].unit_end == 7 and not store.switch_sources[0].source.address
