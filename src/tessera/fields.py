"""Validation of parsed JSON/YAML documents with errors that name the offending field.

Parsers of profiles, clusters, manifests and assignment inputs (``tessera.cost.profile``,
``tessera.planner.cluster``, ``tessera.planner.manifest``, ``tessera.planner.assign_input``)
call these helpers with a dotted path such as ``replicas[1].capacity[2]`` so that a bad
input is reported as ``replicas[1].capacity[2]: must be >= 0``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


class FieldError(ValueError):
    """A document field is missing or has an invalid value; ``path`` names it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def join(path: str, key: str | int) -> str:
    """Return the path of ``key`` inside ``path`` (``a`` + ``b`` -> ``a.b``, 2 -> ``a[2]``)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def mapping(value: Any, path: str) -> Mapping[str, Any]:
    """Return ``value`` if it is a JSON object, else raise naming ``path``."""
    if not isinstance(value, Mapping):
        raise FieldError(path, f"must be an object, got {type(value).__name__}")
    return value


def sequence(value: Any, path: str) -> Sequence[Any]:
    """Return ``value`` if it is a JSON array, else raise naming ``path``."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise FieldError(path, f"must be a list, got {type(value).__name__}")
    return value


def require(doc: Mapping[str, Any], key: str, path: str) -> Any:
    """Return ``doc[key]``; raise naming ``path.key`` when it is missing."""
    if key not in doc or doc[key] is None:
        raise FieldError(join(path, key), "is required")
    return doc[key]


def number(value: Any, path: str, *, minimum: float | None = None, positive: bool = False) -> float:
    """Return ``value`` as a finite float, checking ``>= minimum`` or ``> 0``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(path, f"must be a number, got {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result):
        raise FieldError(path, "must be finite")
    if positive and result <= 0:
        raise FieldError(path, "must be > 0")
    if minimum is not None and result < minimum:
        raise FieldError(path, f"must be >= {minimum:g}")
    return result


def integer(value: Any, path: str, *, minimum: int | None = None) -> int:
    """Return ``value`` as an int (integral floats accepted), checking ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(path, f"must be an integer, got {type(value).__name__}")
    if isinstance(value, float) and not value.is_integer():
        raise FieldError(path, "must be an integer")
    result = int(value)
    if minimum is not None and result < minimum:
        raise FieldError(path, f"must be >= {minimum}")
    return result


def string(value: Any, path: str, *, choices: Sequence[str] | None = None) -> str:
    """Return ``value`` if it is a non-empty string (optionally one of ``choices``)."""
    if not isinstance(value, str) or not value:
        raise FieldError(path, "must be a non-empty string")
    if choices is not None and value not in choices:
        raise FieldError(path, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


# Longest suffix first so that "Gi" is not read as "G" followed by garbage.
_QUANTITY_SUFFIXES: tuple[tuple[str, float], ...] = (
    ("KiB", 2.0**10),
    ("MiB", 2.0**20),
    ("GiB", 2.0**30),
    ("TiB", 2.0**40),
    ("Ki", 2.0**10),
    ("Mi", 2.0**20),
    ("Gi", 2.0**30),
    ("Ti", 2.0**40),
    ("KB", 1e3),
    ("MB", 1e6),
    ("GB", 1e9),
    ("TB", 1e12),
    ("K", 1e3),
    ("k", 1e3),
    ("M", 1e6),
    ("G", 1e9),
    ("T", 1e12),
)


def byte_quantity(value: Any, path: str) -> int:
    """Parse a Kubernetes-style memory quantity (``80Gi``, ``40GB``, ``1e9``) into bytes."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(number(value, path, positive=True))
    if not isinstance(value, str) or not value.strip():
        raise FieldError(path, "must be a byte quantity such as 80Gi")
    text = value.strip()
    for suffix, scale in _QUANTITY_SUFFIXES:
        if text.endswith(suffix):
            head = text[: -len(suffix)].strip()
            try:
                amount = float(head)
            except ValueError:
                break
            if amount <= 0 or not math.isfinite(amount):
                raise FieldError(path, "must be > 0")
            return int(amount * scale)
    try:
        amount = float(text)
    except ValueError:
        raise FieldError(path, f"cannot parse byte quantity {value!r}") from None
    if amount <= 0 or not math.isfinite(amount):
        raise FieldError(path, "must be > 0")
    return int(amount)


def optional(doc: Mapping[str, Any], key: str, default: Any) -> Any:
    """``doc[key]``, or ``default`` where the key is missing or null."""
    value = doc.get(key)
    return default if value is None else value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(path, f"must be true or false, got {type(value).__name__}")
    return value


def known_only(doc: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    """Reject the first key of ``doc`` not in ``allowed`` (manifest objects are closed)."""
    extra = sorted(set(doc) - set(allowed))
    if extra:
        raise FieldError(join(path, extra[0]), f"unknown field (allowed: {', '.join(allowed)})")
