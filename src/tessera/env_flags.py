"""On/off switches of the environment an entry point passes, parsed one way everywhere.

`on(environ, name)`: a switch that is on unless set to an off word (0, false, no, off):
the engine's tuning switches (`TESSERA_OMP_RELEASE`, `TESSERA_MALLOC_TUNE`, ...), where
any other value keeps the default. `strict(environ, name, default)`: the value must be an
on or an off word (or unset, giving `default`); anything else raises `ValueError` naming
the variable, for switches whose typo would silently change behaviour a user relies on.
`parse` is `strict` over one value. Pure: the entry points read the process environment
and pass it (`EngineOptions.from_env`, `gc_heap.wanted`, `tracing.configure`).
"""

from __future__ import annotations

from collections.abc import Mapping

OFF = ("0", "false", "no", "off")
ON = ("1", "true", "yes", "on")


def on(environ: Mapping[str, str], name: str) -> bool:
    """False only when `name` is set to an off word in `environ`."""
    return environ.get(name, "").strip().lower() not in OFF


def strict(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """`default` when unset or empty; True/False for an on/off word; else ValueError."""
    return parse(name, environ.get(name, ""), default)


def parse(name: str, raw: str, default: bool) -> bool:
    """`strict` over a value an entry point read: `default` when empty; True/False for an
    on/off word; else ValueError naming `name`."""
    value = raw.strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off, not {value!r}")
