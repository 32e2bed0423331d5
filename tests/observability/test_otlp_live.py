"""Tracing on in a live `tessera up` (gateway, two agent processes), exported over OTLP to a
collector this test runs: one trace per request crosses the processes (gateway -> leader
-> the pipeline's second stage), and the reconcile passes come as traces of their own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.cli import bench_relayout
from tests.observability.test_live_up import _complete

pytest.importorskip("opentelemetry.proto")
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: two agents + tessera up, both cores


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    self.spans.extend(ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[_Collector, int]]:
    col = _Collector()
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(col, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield col, port
    finally:
        srv.stop(None)


def test_a_request_is_one_trace_across_the_processes_of_tessera_up(
    collector: tuple[_Collector, int], tiny_llama: Path, tmp_path: Path
) -> None:
    col, port = collector
    manifest = tmp_path / "m.yaml"
    bench_relayout.write_manifest(manifest, tiny_llama, 1)  # r0 whole, r1 on two agents
    env = {
        **os.environ,
        "TESSERA_TRACING": "on",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "tessera-test",
    }
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera.cli.main",
            "up",
            "-f",
            str(manifest),
            "--port",
            "0",
            "--state-file",
            str(tmp_path / "state.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    log: list[str] = []
    try:
        assert up.stdout is not None
        url = ""
        for line in up.stdout:
            log.append(line.rstrip())
            m = re.search(r"serving .* at (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "\n".join(log)
        out = up.stdout
        threading.Thread(target=lambda: [log.append(x.rstrip()) for x in out], daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            _complete(url, 4)
            time.sleep(0.5)
            with col.lock:
                spans = list(col.spans)
            chain = _pipelined_chain(spans)
            if chain:
                break
            assert time.monotonic() < deadline, (sorted({s.name for s in spans}), log[-30:])
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(30)
    assert any(s.name == "tessera.control.reconcile.pass" for s in spans)


def _pipelined_chain(spans: list[Any]) -> bool:
    """A request -> attempt -> leader generate -> stage-1 step chain within one trace."""
    by_id = {s.span_id: s for s in spans}
    for st in spans:
        if st.name != "tessera.stage.step":
            continue
        gen = by_id.get(st.parent_span_id)
        att = by_id.get(gen.parent_span_id) if gen is not None else None
        req = by_id.get(att.parent_span_id) if att is not None else None
        if (
            gen is not None
            and gen.name == "tessera.agent.generate"
            and att is not None
            and att.name == "tessera.gateway.attempt"
            and req is not None
            and req.name == "tessera.gateway.request"
            and len({st.trace_id, gen.trace_id, att.trace_id, req.trace_id}) == 1
        ):
            return True
    return False
