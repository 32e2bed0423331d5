"""Validation of a block to load: what the request alone says, against the ranks of its
stage held here, then against the model.

Called by `hosting.Hosting.load` before anything is read or transferred, so a bad
request fails fast with an `EngineError` (INVALID_ARGUMENT or FAILED_PRECONDITION)
naming the field or the block in the way.
"""

from __future__ import annotations

import dataclasses

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
    if not is_last and not b.next_address and b.tp_rank == 0:  # rank 0 talks downstream
        raise errors.InvalidArgumentError(
            "next_stage_address: required for a stage that does not end the model"
        )


def check_ranks(held: list[blocks.Block], spec: blocks.Block) -> None:
    """Ranks of one stage held here need one device each and the same TP size."""
    for have in held:
        if have.tp_size != spec.tp_size or have.device == spec.device:
            why = (
                f"is already on {have.device}; rank {spec.tp_rank} needs a device of its own"
                if have.tp_size == spec.tp_size
                else f"is held here; rank {spec.tp_rank} of tp={spec.tp_size} does "
                "not fit it (unload it first: a new layout takes a new replica id)"
            )
            raise errors.FailedPreconditionError(
                f"replica {spec.replica_id} stage {spec.stage_index}: rank "
                f"{have.tp_rank} of tp={have.tp_size} {why}"
            )


def again(have: blocks.Block, spec: blocks.Block) -> str:
    """A load of a block already held: "already loaded" when the same, "rewired" when only
    its next-stage address differs; anything else is refused."""
    if have == spec:
        return "already loaded"
    if have == dataclasses.replace(spec, next_address=have.next_address):
        return "rewired"
    raise errors.FailedPreconditionError(
        f"replica {spec.replica_id} stage {spec.stage_index} is already loaded "
        f"with layers [{have.start}, {have.end}) on {have.device}; unload it first "
        "(a new layout takes a new replica id)"
    )
