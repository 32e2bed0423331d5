"""Request traces: read the Azure and BurstGPT CSVs and Tessera's own JSONL into `Request`s.

Callers: the planner (``read_azure_csv`` / ``read_trace``), the gateway (``append_jsonl`` /
``to_jsonl_line`` as it serves) and the predictor benchmark. Readers return requests sorted by
arrival, timestamps in seconds since the file's earliest request. A malformed row raises
`TraceError` naming the file and 1-based line; so does a trace with no requests. Formats: Azure
CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``, timestamps like ``2023-11-16
18:15:46.6805900``); BurstGPT CSV (``Timestamp`` in seconds, ``Request tokens``, ``Response
tokens``, ...); Tessera JSONL (``timestamp`` seconds, ``input_tokens``, ``output_tokens``,
optional integer ``class``; blank lines ignored).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import os
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
FORMATS = ("azure", "burstgpt", "jsonl")

PathLike = str | os.PathLike[str]


@dataclasses.dataclass(frozen=True)
class Request:
    """One served (or to-be-served) request, as far as the workload model cares."""

    timestamp: float  # arrival, seconds since the first request of the trace
    input_tokens: int  # prompt length
    output_tokens: int  # generated length
    cls: int | None = None  # workload class id, when typed (see classes.py)


class TraceError(ValueError):
    """A trace file that cannot be read: message is ``file:line: what is wrong``."""


def read_trace(path: PathLike, fmt: str | None = None) -> list[Request]:
    """Read a trace in any supported format; `fmt` is one of FORMATS or None to detect it.

    Detection: a ``.jsonl``/``.ndjson`` extension or a first line starting with ``{`` is
    JSONL; otherwise the CSV header decides (``ContextTokens`` → Azure, ``Request tokens``
    → BurstGPT).
    """
    fmt = fmt if fmt is not None else detect_format(path)
    readers: dict[str, Callable[[PathLike], list[Request]]] = {
        "azure": read_azure_csv,
        "burstgpt": read_burstgpt_csv,
        "jsonl": read_jsonl,
    }
    if fmt not in readers:
        raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return readers[fmt](path)


def detect_format(path: PathLike) -> str:
    """Return the trace format of `path` ("azure", "burstgpt" or "jsonl") from name/header."""
    if Path(path).suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    with open(path, encoding="utf-8", newline="") as f:
        first = next((line for line in f if line.strip()), "")
    if not first:
        raise TraceError(f"{path}: trace is empty (no header and no requests)")
    if first.lstrip().startswith("{"):
        return "jsonl"
    header = {name.strip() for name in first.strip().split(",")}
    if "ContextTokens" in header:
        return "azure"
    if "Request tokens" in header:
        return "burstgpt"
    raise TraceError(f"{path}:1: unrecognised trace header {first.strip()!r}")


def read_azure_csv(path: PathLike) -> list[Request]:
    """Read the Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``)."""
    raw: list[tuple[Fraction, int, int]] = []
    for line, row in _csv_rows(path, AZURE_COLUMNS):
        where = f"{path}:{line}"
        raw.append(
            (
                _parse_datetime(row["TIMESTAMP"], f"{where}: TIMESTAMP"),
                _parse_int(row["ContextTokens"], f"{where}: ContextTokens"),
                _parse_int(row["GeneratedTokens"], f"{where}: GeneratedTokens"),
            )
        )
    return _relative(path, raw)


def read_burstgpt_csv(path: PathLike) -> list[Request]:
    """Read the BurstGPT CSV; ``Timestamp`` is seconds, other columns than tokens ignored."""
    raw: list[tuple[Fraction, int, int]] = []
    for line, row in _csv_rows(path, BURSTGPT_COLUMNS):
        where = f"{path}:{line}"
        raw.append(
            (
                _parse_seconds(row["Timestamp"], f"{where}: Timestamp"),
                _parse_int(row["Request tokens"], f"{where}: Request tokens"),
                _parse_int(row["Response tokens"], f"{where}: Response tokens"),
            )
        )
    return _relative(path, raw)


def read_jsonl(path: PathLike) -> list[Request]:
    """Read Tessera's JSONL trace (see the module docstring); ``class`` becomes `cls`."""
    raw: list[tuple[Fraction, int, int]] = []
    labels: list[int | None] = []
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            where = f"{path}:{line}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{where}: not a JSON object")
            for key in ("timestamp", "input_tokens", "output_tokens"):
                if key not in obj:
                    raise TraceError(f"{where}: missing field {key!r}")
            raw.append(
                (
                    _json_seconds(obj["timestamp"], f"{where}: timestamp"),
                    _json_int(obj["input_tokens"], f"{where}: input_tokens"),
                    _json_int(obj["output_tokens"], f"{where}: output_tokens"),
                )
            )
            cls = obj.get("class")
            labels.append(None if cls is None else _json_int(cls, f"{where}: class"))
    return _relative(path, raw, labels)


def to_jsonl_line(request: Request) -> str:
    """Return one JSONL line (with trailing newline) for `request`, as the readers expect."""
    obj: dict[str, Any] = {
        "timestamp": request.timestamp,
        "input_tokens": request.input_tokens,
        "output_tokens": request.output_tokens,
    }
    if request.cls is not None:
        obj["class"] = request.cls
    return json.dumps(obj) + "\n"


def write_jsonl(path: PathLike, requests: Iterable[Request]) -> None:
    """Write `requests` to `path` as Tessera JSONL, replacing any existing file."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(to_jsonl_line(r) for r in requests)


def append_jsonl(path: PathLike, requests: Iterable[Request]) -> None:
    """Append `requests` to the Tessera JSONL trace at `path`, creating it if absent."""
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(to_jsonl_line(r) for r in requests)


def _csv_rows(path: PathLike, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    """Yield (1-based line number, row by column name) for each non-blank data row."""
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header: list[str] | None = None
        for fields in reader:
            if not any(field.strip() for field in fields):
                continue
            if header is None:
                header = [name.strip() for name in fields]
                missing = [name for name in required if name not in header]
                if missing:
                    raise TraceError(
                        f"{path}:{reader.line_num}: header lacks column(s) {', '.join(missing)}"
                    )
                continue
            if len(fields) != len(header):
                raise TraceError(
                    f"{path}:{reader.line_num}: expected {len(header)} fields, got {len(fields)}"
                )
            yield reader.line_num, dict(zip(header, fields, strict=True))
        if header is None:
            raise TraceError(f"{path}: trace is empty (no header and no requests)")


def _relative(
    path: PathLike,
    raw: list[tuple[Fraction, int, int]],
    labels: Sequence[int | None] | None = None,
) -> list[Request]:
    """Sort by arrival and shift timestamps to seconds since the earliest request."""
    if not raw:
        raise TraceError(f"{path}: trace is empty (no requests)")
    labels = labels if labels is not None else [None] * len(raw)
    t0 = min(t for t, _, _ in raw)
    requests = [
        Request(float(t - t0), inp, out, cls)
        for (t, inp, out), cls in zip(raw, labels, strict=True)
    ]
    requests.sort(key=lambda r: r.timestamp)
    return requests


def _parse_int(text: str, where: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TraceError(f"{where}: {text!r} is not an integer") from None
    if value < 0:
        raise TraceError(f"{where}: {text!r} is negative")
    return value


def _parse_seconds(text: str, where: str) -> Fraction:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise TraceError(f"{where}: {text!r} is not a number of seconds") from None


_EPOCH = datetime.datetime(1970, 1, 1)


def _parse_datetime(text: str, where: str) -> Fraction:
    """Seconds since 1970 (naive) as an exact Fraction: keeps all 7 fractional digits."""
    stamp = text.strip()
    whole, _, frac = stamp.partition(".")
    try:
        moment = datetime.datetime.fromisoformat(whole)
        if moment.tzinfo is not None:
            raise ValueError("time zones are not supported")
        if frac and not frac.isdigit():
            raise ValueError("bad fraction")
    except ValueError:
        raise TraceError(
            f"{where}: {text!r} is not a timestamp like 2023-11-16 18:15:46.68"
        ) from None
    seconds = (moment - _EPOCH) // datetime.timedelta(seconds=1)
    return Fraction(seconds) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)


def _json_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: {value!r} is not an integer")
    if value < 0:
        raise TraceError(f"{where}: {value!r} is negative")
    return value


def _json_seconds(value: object, where: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"{where}: {value!r} is not a number of seconds")
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceError(f"{where}: {value!r} is not a finite number of seconds")
    return Fraction(value)
