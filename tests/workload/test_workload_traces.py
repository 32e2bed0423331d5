"""Trace readers: the three formats, detection, malformed rows naming file:line, empty traces."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tessera.workload import traces

REAL_TRACE = Path(__file__).parents[2].parent / "shared/traces/azure_llm_2023_conv.csv"

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
"""

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
12.5,GPT-4,417,276,693,API log
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_azure_timestamps_keep_seven_fractional_digits(tmp_path: Path) -> None:
    requests = traces.read_azure_csv(_write(tmp_path, "a.csv", AZURE))
    assert [r.timestamp for r in requests] == pytest.approx([0.0, 4.314579, 4.541877], abs=1e-9)
    assert requests[0] == traces.Request(0.0, 374, 44)
    assert requests[2].input_tokens == 879 and requests[2].output_tokens == 55


def test_azure_crossing_midnight_and_unsorted_rows(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-17 00:00:01.5,10,1\n"
        "2023-11-16 23:59:59.25,20,2\n"
        "2023-11-17 00:00:01,30,3\n"
    )
    requests = traces.read_azure_csv(_write(tmp_path, "a.csv", text))
    assert [(r.timestamp, r.input_tokens) for r in requests] == [
        (0.0, 20),
        (1.75, 30),
        (2.25, 10),
    ]


def test_burstgpt_reader_keeps_zero_response_tokens(tmp_path: Path) -> None:
    requests = traces.read_burstgpt_csv(_write(tmp_path, "b.csv", BURSTGPT))
    assert [(r.timestamp, r.input_tokens, r.output_tokens) for r in requests] == [
        (0.0, 472, 18),
        (7.5, 417, 276),
        (40.0, 1087, 0),
    ]


def test_jsonl_round_trip_with_and_without_class(tmp_path: Path) -> None:
    requests = [
        traces.Request(0.0, 12, 3, cls=1),
        traces.Request(0.25, 100, 40),
        traces.Request(1.125, 7, 0, cls=0),
    ]
    path = tmp_path / "t.jsonl"
    traces.write_jsonl(path, requests[:1])
    traces.append_jsonl(path, requests[1:])
    assert traces.read_jsonl(path) == requests
    assert traces.read_trace(path) == requests
    traces.write_jsonl(path, requests[2:])  # write replaces
    assert len(traces.read_jsonl(path)) == 1


def test_jsonl_line_format() -> None:
    line = traces.to_jsonl_line(traces.Request(1.5, 10, 2, cls=3))
    assert line == '{"timestamp": 1.5, "input_tokens": 10, "output_tokens": 2, "class": 3}\n'


def test_read_trace_detects_format(tmp_path: Path) -> None:
    assert traces.detect_format(_write(tmp_path, "x.csv", AZURE)) == "azure"
    assert traces.detect_format(_write(tmp_path, "y.csv", BURSTGPT)) == "burstgpt"
    plain = _write(tmp_path, "z.log", '{"timestamp": 0, "input_tokens": 1, "output_tokens": 1}\n')
    assert traces.detect_format(plain) == "jsonl"
    assert len(traces.read_trace(_write(tmp_path, "y2.csv", BURSTGPT))) == 3
    assert len(traces.read_trace(_write(tmp_path, "x2.csv", AZURE), fmt="azure")) == 3
    with pytest.raises(traces.TraceError, match=r"w\.csv:1: unrecognised trace header"):
        traces.read_trace(_write(tmp_path, "w.csv", "a,b,c\n1,2,3\n"))
    with pytest.raises(ValueError, match="unknown trace format"):
        traces.read_trace(plain, fmt="parquet")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 18:15:52.0,12,abc", r"trace\.csv:3: GeneratedTokens: 'abc' is not an integer"),
        ("2023-11-16 18:15:52.0,-4,1", r"trace\.csv:3: ContextTokens: '-4' is negative"),
        ("yesterday,1,2", r"trace\.csv:3: TIMESTAMP: 'yesterday' is not a timestamp"),
        ("2023-11-16 18:15:52.x,1,2", r"trace\.csv:3: TIMESTAMP"),
        ("2023-11-16 18:15:52.0,1", r"trace\.csv:3: expected 3 fields, got 2"),
    ],
)
def test_azure_malformed_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    lines = AZURE.splitlines()
    path = _write(tmp_path, "trace.csv", "\n".join([*lines[:2], row, *lines[2:]]) + "\n")
    with pytest.raises(traces.TraceError, match=message):
        traces.read_azure_csv(path)


def test_burstgpt_malformed_timestamp(tmp_path: Path) -> None:
    text = BURSTGPT.replace("45,ChatGPT", "soon,ChatGPT")
    with pytest.raises(traces.TraceError, match=r"b\.csv:3: Timestamp: 'soon'"):
        traces.read_burstgpt_csv(_write(tmp_path, "b.csv", text))


def test_missing_column_is_reported(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n")
    with pytest.raises(traces.TraceError, match=r"a\.csv:1: header lacks column\(s\) Generated"):
        traces.read_azure_csv(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"t\.jsonl:2: not a JSON object"),
        ("[1, 2]", r"t\.jsonl:2: not a JSON object"),
        ('{"timestamp": 1, "input_tokens": 3}', r"t\.jsonl:2: missing field 'output_tokens'"),
        (
            '{"timestamp": 1, "input_tokens": 3.5, "output_tokens": 1}',
            r"t\.jsonl:2: input_tokens: 3\.5 is not an integer",
        ),
        (
            '{"timestamp": "x", "input_tokens": 3, "output_tokens": 1}',
            r"t\.jsonl:2: timestamp: 'x' is not a number",
        ),
        (
            '{"timestamp": 1, "input_tokens": 3, "output_tokens": true}',
            r"t\.jsonl:2: output_tokens: True is not an integer",
        ),
    ],
)
def test_jsonl_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_tokens": 1, "output_tokens": 1}'
    path = _write(tmp_path, "t.jsonl", f"{good}\n{line}\n")
    with pytest.raises(traces.TraceError, match=message):
        traces.read_jsonl(path)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("empty.csv", ""),
        ("header_only.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"),
        ("empty.jsonl", "\n\n"),
    ],
)
def test_empty_trace_is_a_clear_error(tmp_path: Path, name: str, text: str) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(traces.TraceError, match=rf"{name}: trace is empty"):
        traces.read_trace(path)


def test_trace_error_is_a_value_error() -> None:
    assert issubclass(traces.TraceError, ValueError)


@pytest.mark.skipif(not REAL_TRACE.exists(), reason="shared Azure trace not present")
def test_real_azure_trace() -> None:
    requests = traces.read_trace(REAL_TRACE)
    assert len(requests) > 19_000
    assert requests[0].timestamp == 0.0
    assert 3_000 < requests[-1].timestamp < 3_700  # about one hour
    assert all(a.timestamp <= b.timestamp for a, b in itertools.pairwise(requests))
