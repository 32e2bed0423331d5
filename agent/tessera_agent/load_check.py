"""Validation of a block to load: what the request alone says, then against the model.

Called by `hosting.Hosting.load` before anything is read or transferred, so a bad
request fails fast with an `EngineError` (INVALID_ARGUMENT) naming the field.
"""

from __future__ import annotations

from tessera import blocks
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors


def check_request(b: blocks.Block) -> None:
    if not b.replica_id:
        raise errors.InvalidArgumentError("replica_id: must not be empty")
    if not 0 <= b.stage_index < b.num_stages:
        raise errors.InvalidArgumentError(
            f"stage_index: {b.stage_index} is outside [0, {b.num_stages})"
        )
    if b.tp_size != 1:
        raise errors.InvalidArgumentError(
            f"tp_size: {b.tp_size}: this agent serves unsharded stages only (tp_size 1)"
        )


def check_against_model(b: blocks.Block, cfg: config_mod.ModelConfig) -> None:
    """Only stage 0 starts at layer 0, only the last stage ends the model, and every
    other stage names its next stage."""
    if (b.start == 0) != (b.stage_index == 0):
        raise errors.InvalidArgumentError(
            f"stage_index: stage {b.stage_index} cannot start at layer {b.start} "
            "(only stage 0 starts at layer 0)"
        )
    is_last = b.end == cfg.num_layers
    if is_last != (b.stage_index == b.num_stages - 1):
        raise errors.InvalidArgumentError(
            f"num_stages: stage {b.stage_index} of {b.num_stages} ends at layer "
            f"{b.end} of {cfg.num_layers}; only the last stage ends the model"
        )
    if not is_last and not b.next_address:
        raise errors.InvalidArgumentError(
            "next_stage_address: required for a stage that does not end the model"
        )
