"""How a process's engine runs, decided once at its entry point and passed down.

`EngineOptions` holds the engine switches a deployment may turn: the decode rows a mixed
step needs before they run compiled apart from its prefill chunks (`split_min_decodes`),
whether CUDA stages replay decode steps from CUDA graphs, whether the agent fixes
glibc's malloc thresholds, and which attention backend stages attend with
(`attention_backend`, from `tessera agent --attention-backend`; `attention_backend.py`).
`tessera agent` builds it with `from_env` (`$TESSERA_SPLIT_MIN_DECODES`,
`$TESSERA_CUDA_GRAPHS`, `$TESSERA_MALLOC_TUNE`) into its `AgentConfig`; it reaches each
`StageRunner` through `load_config.LoadDefaults`, `hosting` and `stage.load_stage`.
In-process engines (tests, benches, `tessera generate`) get the defaults unless they pass
their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tessera import env_flags

# Decode rows a mixed step needs before they run compiled apart from its prefill chunks:
# measured on the default tiny model (docs/benchmarks-log.md, issue 16 engine), 16 and 24
# decodes beside 64-token prompts ran 2-6 % slower split, 32 ran 6 % and 64 ran 38-40 %
# faster.
SPLIT_MIN_DECODES = 32
SPLIT_ENV = "TESSERA_SPLIT_MIN_DECODES"  # overrides it; 0 turns the split off
CUDA_GRAPHS_ENV = "TESSERA_CUDA_GRAPHS"  # "0": CUDA stages decode eagerly
MALLOC_ENV = "TESSERA_MALLOC_TUNE"  # "0": glibc's malloc thresholds as they are (host_malloc)
NEVER = 1 << 62  # a split threshold no step reaches
# Attention backends a stage may run (`attention_backend.py`; docs/gpu.md).
ATTENTION_BACKENDS = ("auto", "native", "flex", "flashinfer")


@dataclass(frozen=True)
class EngineOptions:
    split_min_decodes: int = SPLIT_MIN_DECODES  # NEVER: mixed steps are never split
    cuda_graphs: bool = True  # CUDA stages replay pure-decode steps from CUDA graphs
    malloc_tune: bool = True  # an agent fixes glibc's malloc thresholds (host_malloc.tune)
    attention_backend: str = "auto"  # one of ATTENTION_BACKENDS; auto: native (docs/gpu.md)

    def __post_init__(self) -> None:
        if self.split_min_decodes < 1:
            raise ValueError("split_min_decodes: must be >= 1 (NEVER turns the split off)")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend: {self.attention_backend!r} is not one of "
                + ", ".join(ATTENTION_BACKENDS)
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EngineOptions:
        """The options an entry point's environment asks for (ValueError names a bad one)."""
        raw = environ.get(SPLIT_ENV, "").strip()
        try:
            n = int(raw) if raw else SPLIT_MIN_DECODES
        except ValueError:
            raise ValueError(f"{SPLIT_ENV}={raw!r} is not an integer") from None

        def on(name: str) -> bool:
            return environ.get(name, "").strip().lower() not in env_flags.OFF

        return cls(
            split_min_decodes=n if n > 0 else NEVER,
            cuda_graphs=on(CUDA_GRAPHS_ENV),
            malloc_tune=on(MALLOC_ENV),
        )
