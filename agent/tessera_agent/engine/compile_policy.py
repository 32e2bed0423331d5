"""When the compiled decode (`decode_graph.py`) is on, and what it costs an agent's memory.

Every answer is read from the entry point's `options.EngineOptions`: `mode` / `enabled`
(the compiled decode's mode for a device), `warm_before_ready` (a load answers only once
the warm-up is over: ready means warm), `rehearse` (and once its first steps were
rehearsed), `freeze`, `pack_prompts` and `compile_prompts`; `packed_bytes` /
`planned_packed_bytes` size the packed weight copies it holds (a frozen graph's own, the
eager rows' packs); `load_reserve` decides, before a block's KV pool is sized, whether an
agent holds those bytes back, and `begin` then starts the warm-up or turns the path off
with the reason. Called by `runner.py`, `decode_graph.py`, `hosting.py` and `server.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from tessera_agent.engine import block_tensors
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import model as model_mod
from tessera_agent.engine import options as options_mod

Options = options_mod.EngineOptions
_OFF, _ON = "off", "on"


def _cpu(device: torch.device | None) -> bool:
    return device is None or device.type == "cpu"


def mode(opts: Options, device: torch.device | None = None) -> str:
    """ "off"; "on" (an agent's load answers once the warm-up is over: ready means warm);
    "background" (the load answers at once, steps run eagerly until the warm-up is over);
    or "wait" (warm up when the runner is built, for in-process engines). The agent's
    default ("cpu") is "on" for CPU stages and "off" on CUDA (only when asked there)."""
    if opts.compile_decode == "cpu":
        return _ON if _cpu(device) else _OFF
    return opts.compile_decode


def enabled(opts: Options, device: torch.device | None = None) -> bool:
    """Whether the compiled decode path is on for `device`."""
    return mode(opts, device) != _OFF


def warm_before_ready(opts: Options, device: torch.device | None = None) -> bool:
    """Whether an agent's load waits for the stage's warm-up before it answers (the
    default where the path is on; `TESSERA_COMPILE_DECODE=background` does not)."""
    return mode(opts, device) == _ON


def rehearse(opts: Options, device: torch.device | None = None) -> bool:
    """Whether an agent's load rehearses the stage's first steps before it answers
    (`rehearsal.py`): where ready means warm (`warm_before_ready`) on CPU, unless
    `TESSERA_REHEARSE=0`."""
    return opts.rehearse and _cpu(device) and warm_before_ready(opts, device)


def freeze(opts: Options, device: torch.device | None = None) -> bool:
    """Whether a CPU stage's decode graph is compiled frozen: only with
    `TESSERA_COMPILE_FREEZE=1` (`compile_cache.py` says what each costs a restart)."""
    return opts.compile_freeze and _cpu(device)


def aot(opts: Options, device: torch.device | None = None) -> bool:
    """Whether a CPU stage's decode graphs are saved whole and loaded on a restart, Dynamo's
    trace skipped (`decode_aot.py`): unfrozen only (a frozen graph's prepacked weights
    cannot be pickled), on unless `TESSERA_COMPILE_AOT=0`."""
    return opts.compile_aot and _cpu(device) and not freeze(opts, device)


def pack_prompts(opts: Options, device: torch.device | None = None) -> bool:
    """Whether a CPU stage's compiled decode also packs its projections for the eager
    (prompt) rows: on unless `TESSERA_PACK_PROMPTS=0`."""
    return opts.pack_prompts and _cpu(device)


def compile_prompts(opts: Options, device: torch.device | None = None) -> bool:
    """Whether a CPU stage's compiled decode also compiles the many-row eager steps' layer
    parts over its packs (`prompt_graph.py`): on with the packs unless
    `TESSERA_COMPILE_PROMPTS=0`."""
    return opts.compile_prompts and pack_prompts(opts, device)


def copies(
    opts: Options, dtype: torch.dtype, device: torch.device | None = None, packs: bool = True
) -> int:
    """Packed copies of a stage's projections the compiled decode holds: the frozen
    graph's own (none unfrozen: it reads the eager rows' packs as inputs), plus the eager
    rows' (`packed_linear.py`, float32 only) when `packs` and they are on."""
    graph = 1 if freeze(opts, device) else 0
    eager = 1 if packs and dtype == torch.float32 and pack_prompts(opts, device) else 0
    return graph + eager


def packed_bytes(model: model_mod.StageModel, opts: Options, packs: bool = True) -> int:
    """Bytes of the packed weight copies the compiled decode of a CPU stage holds: every
    projection of the stage's layers (the embedding is gathered from in place; the LM
    head runs eagerly), times `copies`."""
    total = 0
    for layer in model.layers:
        for mod in layer.modules():
            if isinstance(mod, torch.nn.Linear):
                total += mod.weight.nbytes + (mod.bias.nbytes if mod.bias is not None else 0)
    return total * copies(opts, model.dtype_, packs=packs)


def planned_packed_bytes(
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    dtype: torch.dtype,
    opts: Options,
    packs: bool = True,
) -> int:
    """`packed_bytes` of layers [start, end) from the config alone (before loading)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    one = sum(
        math.prod(shape) * elem
        for name, shape in block_tensors.shapes(cfg, start, end).items()
        if "_proj." in name
    )
    return one * copies(opts, dtype, packs=packs)


def load_reserve(
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    dtype: torch.dtype,
    tp_size: int,
    device: torch.device,
    left_after_params: int,
    kv_bytes: int,
    opts: Options,
) -> int:
    """Device bytes an agent holds back for a block's packed copies before sizing its KV
    pool: the graph's and the eager rows' copies when both fit beside its KV (a fixed
    `kv_bytes`; or, with `kv_bytes` 0 = "all the rest", when they take at most half of
    what is left), else the graph's alone when it fits, else 0 (`begin` then turns the
    eager rows' packs, or the whole path, off, saying why)."""
    if tp_size > 1 or device.type != "cpu" or not enabled(opts, device):
        return 0
    if dtype != torch.float32:  # the compiled decode serves float32 stages only (runner.py)
        return 0
    for packs in (True, False):
        need = planned_packed_bytes(cfg, start, end, dtype, opts, packs)
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
    def options(self) -> Options: ...

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
        if runner_graph.with_packs and reserved >= packed_bytes(
            runner_graph.model, runner_graph.options, False
        ):
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
