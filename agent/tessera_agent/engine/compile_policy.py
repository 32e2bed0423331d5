"""When the compiled decode (`decode_graph.py`) is on, and what it costs an agent's memory.

`mode_from_env` reads `TESSERA_COMPILE_DECODE` over the process default (`set_default`,
called by `tessera agent`), and `warm_before_ready` says whether a load answers only once
the warm-up is over (the default: ready means warm); `freeze` whether the decode graph is
compiled frozen; `packed_bytes` / `planned_packed_bytes` size the packed weight copies it
holds (a frozen graph's own, the eager rows' packs); `load_reserve` decides, before a
block's KV pool is sized, whether an agent holds those bytes back, and `begin` then starts
the warm-up or turns the path off with the reason. Called by `runner.py`, `hosting.py`
and `server.py`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch

from tessera import env_flags
from tessera_agent.engine import block_tensors
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import model as model_mod

log = logging.getLogger(__name__)

ENV = "TESSERA_COMPILE_DECODE"
# The eager rows' prepacked projections (`packed_linear.py`), on with the compiled decode;
# "0" turns them off (A/B).
PACK_ENV = "TESSERA_PACK_PROMPTS"
# "1": the decode graph compiled with Inductor's `freezing` (weights prepacked as
# constants), which Inductor's caches never keep (its prepacked weights cannot be
# pickled), so every restart compiles it again. Default: unfrozen, over the eager rows'
# packs passed as inputs (`packed_linear.GraphPacks`): kept whole by the caches.
FREEZE_ENV = "TESSERA_COMPILE_FREEZE"
# The compiled row-wise layer parts over those packs (`prompt_graph.py`); "0" turns them off.
PROMPT_ENV = "TESSERA_COMPILE_PROMPTS"
_OFF, _ON, _BACKGROUND, _WAIT = "off", "on", "background", "wait"
_default = False  # an agent process sets it (`set_default`); in-process engines leave it


def set_default(on: bool) -> None:
    """The process-wide default when `TESSERA_COMPILE_DECODE` is unset (agents: on)."""
    global _default
    _default = on


def mode_from_env(device: torch.device | None = None) -> str:
    """ "off"; "on" (an agent's load answers once the warm-up is over: ready means warm);
    "background" (the load answers at once, steps run eagerly until the warm-up is over);
    or "wait" (warm up when the runner is built, for in-process engines)."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return _ON
    if raw == _BACKGROUND:
        return _BACKGROUND
    if raw in ("wait", "sync"):
        return _WAIT
    if raw in ("0", "false", "no", "off"):
        return _OFF
    if raw:
        log.warning(
            "%s=%r is not one of 0, 1, background, wait: compiled decode stays off", ENV, raw
        )
        return _OFF
    on = _default and (device is None or device.type == "cpu")  # CUDA: only when asked
    return _ON if on else _OFF


def enabled_from_env(device: torch.device | None = None) -> bool:
    """Whether the compiled decode path is on (environment, else the process default)."""
    return mode_from_env(device) != _OFF


def warm_before_ready(device: torch.device | None = None) -> bool:
    """Whether an agent's load waits for the stage's warm-up before it answers (the
    default where the path is on; `TESSERA_COMPILE_DECODE=background` does not)."""
    return mode_from_env(device) == _ON


def freeze(device: torch.device | None = None) -> bool:
    """Whether a CPU stage's decode graph is compiled frozen: only with
    `TESSERA_COMPILE_FREEZE=1` (`compile_cache.py` says what each costs a restart)."""
    return env_flags.strict(FREEZE_ENV, False) and (device is None or device.type == "cpu")


def pack_prompts(device: torch.device | None = None) -> bool:
    """Whether a CPU stage's compiled decode also packs its projections for the eager
    (prompt) rows: on unless `TESSERA_PACK_PROMPTS=0`."""
    return env_flags.on(PACK_ENV) and (device is None or device.type == "cpu")


def compile_prompts(device: torch.device | None = None) -> bool:
    """Whether a CPU stage's compiled decode also compiles the many-row eager steps' layer
    parts over its packs (`prompt_graph.py`): on with the packs unless
    `TESSERA_COMPILE_PROMPTS=0`."""
    return env_flags.on(PROMPT_ENV) and pack_prompts(device)


def copies(dtype: torch.dtype, device: torch.device | None = None, packs: bool = True) -> int:
    """Packed copies of a stage's projections the compiled decode holds: the frozen
    graph's own (none unfrozen: it reads the eager rows' packs as inputs), plus the eager
    rows' (`packed_linear.py`, float32 only) when `packs` and they are on."""
    graph = 1 if freeze(device) else 0
    eager = 1 if packs and dtype == torch.float32 and pack_prompts(device) else 0
    return graph + eager


def packed_bytes(model: model_mod.StageModel, packs: bool = True) -> int:
    """Bytes of the packed weight copies the compiled decode of a CPU stage holds: every
    projection of the stage's layers (the embedding is gathered from in place; the LM
    head runs eagerly), times `copies`."""
    total = 0
    for layer in model.layers:
        for mod in layer.modules():
            if isinstance(mod, torch.nn.Linear):
                total += mod.weight.nbytes + (mod.bias.nbytes if mod.bias is not None else 0)
    return total * copies(model.dtype_, packs=packs)


def planned_packed_bytes(
    cfg: config_mod.ModelConfig, start: int, end: int, dtype: torch.dtype, packs: bool = True
) -> int:
    """`packed_bytes` of layers [start, end) from the config alone (before loading)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    one = sum(
        math.prod(shape) * elem
        for name, shape in block_tensors.shapes(cfg, start, end).items()
        if "_proj." in name
    )
    return one * copies(dtype, packs=packs)


def load_reserve(
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    dtype: torch.dtype,
    tp_size: int,
    device: torch.device,
    left_after_params: int,
    kv_bytes: int,
) -> int:
    """Device bytes an agent holds back for a block's packed copies before sizing its KV
    pool: the graph's and the eager rows' copies when both fit beside its KV (a fixed
    `kv_bytes`; or, with `kv_bytes` 0 = "all the rest", when they take at most half of
    what is left), else the graph's alone when it fits, else 0 (`begin` then turns the
    eager rows' packs, or the whole path, off, saying why)."""
    if tp_size > 1 or device.type != "cpu" or not enabled_from_env(device):
        return 0
    if dtype != torch.float32:  # the compiled decode serves float32 stages only (runner.py)
        return 0
    for packs in (True, False):
        need = planned_packed_bytes(cfg, start, end, dtype, packs)
        if left_after_params - (kv_bytes or need) - need >= 0:
            return need
    return 0


class DecodeGraph(Protocol):
    """What `begin` drives of a stage's compiled decode (`decode_graph.CompiledDecode` has
    it; declared here because `decode_graph.py` calls this module)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def model(self) -> model_mod.StageModel: ...

    @property
    def with_packs(self) -> bool: ...

    @property
    def packed_bytes(self) -> int: ...

    def drop_packs(self, reason: str) -> None: ...

    def disable(self, reason: str) -> None: ...

    def start(self, kv_like: list[tuple[torch.Tensor, torch.Tensor]]) -> None: ...


def begin(
    runner_graph: DecodeGraph | None, reserved: int, kv: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """After an agent loaded a block: warm the graph up in the background when its
    copies were reserved (`load_reserve`); the graph's alone: without the eager rows'
    packs; else turn it off. Reasons go to the log."""
    if runner_graph is None:
        return
    if runner_graph.device.type == "cpu" and reserved < runner_graph.packed_bytes:
        if runner_graph.with_packs and reserved >= packed_bytes(runner_graph.model, False):
            runner_graph.drop_packs(
                f"the eager rows' packed weights ({runner_graph.packed_bytes - reserved} "
                "bytes) do not fit beside the block's parameters and KV pool"
            )
            runner_graph.start(kv)
            return
        runner_graph.disable(
            f"its packed weights ({runner_graph.packed_bytes} bytes) do not fit beside the "
            "block's parameters and KV pool in the device budget"
        )
        return
    runner_graph.start(kv)


class _Counts(Protocol):
    compiles: int


def counting_backend(owner: _Counts) -> Callable[..., Any]:
    """Inductor as a `torch.compile` backend that adds one to `owner.compiles` per graph
    it builds (the compiled decode's and prompt rows' recompile counters)."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        owner.compiles += 1
        return compile_fx(gm, example_inputs)

    return backend
