"""How a process's engine runs, decided once at its entry point and passed down.

`EngineOptions` holds the engine switches a deployment may turn: the decode rows a mixed
step needs before they run compiled apart from its prefill chunks (`split_min_decodes`),
CUDA graphs, glibc's malloc thresholds, the attention backend stages attend with
(`attention_backend`, from `tessera agent --attention-backend`; `attention_backend.py`),
the compiled decode (`compile_policy.py`: its mode, freezing, packed prompt rows and their
graphs, fused decode attention, graphs saved whole: `decode_aot.py`; the rehearsal before
ready: `rehearsal.py`) and the release of helper threads' OpenMP teams (`omp_teams.py`).
`tessera agent` builds it with `from_env` into its `AgentConfig`; it reaches each
`StageRunner` through `load_config.LoadDefaults`, `hosting` and `stage.load_stage`.
In-process engines get the defaults (compiled decode off).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from tessera import env_flags

log = logging.getLogger(__name__)

# Decode rows a mixed step needs before they run compiled apart from its prefill chunks:
# measured on the default tiny model (docs/benchmarks-log.md, issue 16 engine), 16 and 24
# decodes beside 64-token prompts ran 2-6 % slower split, 32 ran 6 % and 64 ran 38-40 %
# faster.
SPLIT_MIN_DECODES = 32
SPLIT_ENV = "TESSERA_SPLIT_MIN_DECODES"  # overrides it; 0 turns the split off
CUDA_GRAPHS_ENV = "TESSERA_CUDA_GRAPHS"  # "0": CUDA stages decode eagerly
MALLOC_ENV = "TESSERA_MALLOC_TUNE"  # "0": glibc's malloc thresholds as they are (host_malloc)
NEVER = 1 << 62  # a split threshold no step reaches
# The compiled decode (`compile_policy.py`): "0"/"1"/"background"/"wait" over the agent's
# default (`--no-compile-decode`).
COMPILE_ENV = "TESSERA_COMPILE_DECODE"
# A CPU stage's rehearsal before its load answers (`rehearsal.py`, with the compiled
# decode's "on"); "0" skips it (A/B: the first requests then pay its one-time costs).
REHEARSE_ENV = "TESSERA_REHEARSE"
# The eager rows' prepacked projections (`packed_linear.py`), on with the compiled decode;
# "0" turns them off (A/B).
PACK_ENV = "TESSERA_PACK_PROMPTS"
# The decode graph compiled with Inductor's `freezing` (weights prepacked as constants);
# "0" compiles it unfrozen: slower steps, but a graph Inductor's caches keep across
# restarts (a frozen one bypasses them: its prepacked weights cannot be pickled).
FREEZE_ENV = "TESSERA_COMPILE_FREEZE"
# The compiled row-wise layer parts over those packs (`prompt_graph.py`); "0" turns them off.
PROMPT_ENV = "TESSERA_COMPILE_PROMPTS"
# "0": a CPU stage's unfrozen decode graphs are traced by Dynamo at every start, not
# saved whole and loaded (`decode_aot.py`; A/B).
AOT_ENV = "TESSERA_COMPILE_AOT"
# "gather": compiled decode graphs attend with eager's gather + SDPA (A/B), not fused.
DECODE_ATTN_ENV = "TESSERA_DECODE_ATTN"
OMP_ENV = "TESSERA_OMP_RELEASE"  # "0": helper threads keep their OpenMP teams (omp_teams)
# "cpu": on for CPU stages only (an agent's default); "wait": warmed up when the runner is
# built (in-process engines); "background": loads answer before the warm-up is over.
COMPILE_MODES = ("off", "on", "background", "wait", "cpu")


def compile_mode(raw: str, default: bool) -> str:
    """`$TESSERA_COMPILE_DECODE`'s value as a mode; unset: "cpu" when the agent's
    `default` is on, else "off". A value not understood is logged and means "off"."""
    value = raw.strip().lower()
    if value in env_flags.ON:
        return "on"
    if value in ("background", "wait"):
        return value
    if value == "sync":
        return "wait"
    if value in env_flags.OFF:
        return "off"
    if value:
        log.warning(
            "%s=%r is not one of 0, 1, background, wait: compiled decode stays off",
            COMPILE_ENV,
            raw,
        )
        return "off"
    return "cpu" if default else "off"


# Attention backends a stage may run (`attention_backend.py`; docs/gpu.md).
ATTENTION_BACKENDS = ("auto", "native", "flex", "flashinfer")


@dataclass(frozen=True)
class EngineOptions:
    split_min_decodes: int = SPLIT_MIN_DECODES  # NEVER: mixed steps are never split
    cuda_graphs: bool = True  # CUDA stages replay pure-decode steps from CUDA graphs
    malloc_tune: bool = True  # an agent fixes glibc's malloc thresholds (host_malloc.tune)
    compile_decode: str = "off"  # one of COMPILE_MODES (compile_policy.mode)
    compile_freeze: bool = False  # CPU decode graphs compiled frozen (compile_policy.freeze)
    pack_prompts: bool = True  # eager rows over packed projections, with the compiled decode
    compile_prompts: bool = True  # and those rows' layer parts compiled (prompt_graph.py)
    compile_aot: bool = True  # unfrozen CPU decode graphs saved whole and loaded (decode_aot)
    fused_decode_attn: bool = True  # compiled decode attends fused (attention._decode_fused)
    omp_release: bool = True  # helper threads release their OpenMP teams (omp_teams)
    attention_backend: str = "auto"  # one of ATTENTION_BACKENDS; auto: native (docs/gpu.md)
    rehearse: bool = True  # a CPU stage rehearses its first steps before ready (rehearsal.py)

    def __post_init__(self) -> None:
        if self.split_min_decodes < 1:
            raise ValueError("split_min_decodes: must be >= 1 (NEVER turns the split off)")
        if self.compile_decode not in COMPILE_MODES:
            raise ValueError(f"compile_decode: one of {COMPILE_MODES}, not {self.compile_decode!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend: {self.attention_backend!r} is not one of "
                + ", ".join(ATTENTION_BACKENDS)
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str], compile_default: bool = False) -> EngineOptions:
        """The options an entry point's environment asks for (ValueError names a bad one);
        `compile_default`: the compiled decode's mode when `$TESSERA_COMPILE_DECODE` is
        unset (an agent's `--compile-decode`: on for CPU stages)."""
        raw = environ.get(SPLIT_ENV, "").strip()
        try:
            n = int(raw) if raw else SPLIT_MIN_DECODES
        except ValueError:
            raise ValueError(f"{SPLIT_ENV}={raw!r} is not an integer") from None

        def on(name: str) -> bool:
            return env_flags.on(environ, name)

        attn = environ.get(DECODE_ATTN_ENV, "fused").strip().lower()
        if attn not in ("fused", "gather"):
            raise ValueError(f"{DECODE_ATTN_ENV} must be 'fused' or 'gather', not {attn!r}")
        return cls(
            split_min_decodes=n if n > 0 else NEVER,
            cuda_graphs=on(CUDA_GRAPHS_ENV),
            malloc_tune=on(MALLOC_ENV),
            compile_decode=compile_mode(environ.get(COMPILE_ENV, ""), compile_default),
            compile_freeze=env_flags.strict(environ, FREEZE_ENV, False),
            pack_prompts=on(PACK_ENV),
            compile_prompts=on(PROMPT_ENV),
            compile_aot=on(AOT_ENV),
            fused_decode_attn=attn == "fused",
            omp_release=on(OMP_ENV),
            rehearse=on(REHEARSE_ENV),
        )
