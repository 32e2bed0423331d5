"""Traces (docs/observability.md): one per pipelined request, gateway -> stage 0 -> stage 1,
and one per control action; off by default with no OpenTelemetry import.

The agents run in this process (their servicers on the test's event loop) so the SDK's
in-memory exporter sees every span of the request.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tessera.cli import local_agents
from tessera.gateway import config
from tessera.observability import control, tracing
from tests.gateway import helpers

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


async def _agent(name: str) -> tuple[Any, Any, str]:
    """An agent servicer and server on this loop; (server, servicer, address)."""
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
    from tessera_agent import devices, servicer

    devs, nvml = devices.parse_devices("cpu:1x512MiB")
    svc = servicer.AgentServicer(name, devs, nvml, "test")
    srv = transport.server()
    pb_grpc.add_AgentServicer_to_server(svc, srv)
    port = transport.add_port(srv, "127.0.0.1:0", None)
    await srv.start()
    return srv, svc, f"127.0.0.1:{port}"


@pytest.fixture
async def pipeline(tiny_llama: Path) -> AsyncIterator[list[str]]:
    started = [await _agent("tr-0"), await _agent("tr-1")]
    procs = [
        local_agents.AgentProcess(f"tr-{i}", None, a)  # type: ignore[arg-type]
        for i, (_, _, a) in enumerate(started)
    ]
    await asyncio.to_thread(
        local_agents.load_pipeline,
        procs,
        str(tiny_llama),
        [(0, 4), (4, 8)],
        "two",
        data_plane=False,
    )
    try:
        yield [a for _, _, a in started]
    finally:
        for srv, svc, _ in started:
            await svc.close()
            await srv.stop(grace=None)


async def test_a_pipelined_request_is_one_trace_across_gateway_and_stages(
    spans: InMemorySpanExporter, pipeline: list[str], tiny_llama: Path
) -> None:
    for mux in (False, True):
        spans.clear()
        gw = await helpers.start(
            str(tiny_llama), config.ReplicaEndpoint("two", pipeline[0]), generate_mux=mux
        )
        try:
            async with aiohttp.ClientSession() as s:
                status, body = await helpers.post(
                    s,
                    gw.url + "/v1/completions",
                    {"model": helpers.MODEL, "prompt": "Once upon", "max_tokens": 4},
                )
            assert status == 200, body
        finally:
            await gw.stop()
        got = spans.get_finished_spans()
        by_name: dict[str, list[Any]] = {}
        for sp in got:
            by_name.setdefault(sp.name, []).append(sp)
        (req,) = by_name["tessera.gateway.request"]
        (attempt,) = by_name["tessera.gateway.attempt"]
        (gen,) = by_name["tessera.agent.generate"]
        steps = by_name["tessera.stage.step"]
        trace_id = req.context.trace_id
        assert {sp.context.trace_id for sp in [attempt, gen, *steps]} == {trace_id}, mux
        assert attempt.parent.span_id == req.context.span_id
        assert gen.parent.span_id == attempt.context.span_id
        assert all(st.parent.span_id == gen.context.span_id for st in steps)
        (prefill,) = by_name["tessera.agent.queue_prefill"]
        assert prefill.parent.span_id == gen.context.span_id
        assert prefill.end_time <= gen.end_time
        assert {st.attributes["tessera.stage"] for st in steps} == {1}
        kinds = [st.attributes["tessera.kind"] for st in steps]
        assert kinds[0] == "prefill" and kinds.count("decode") >= 2, kinds
        assert gen.attributes["tessera.generated_tokens"] == 4
        assert attempt.attributes["tessera.replica"] == "two"
        # a finished request is no error (its stream was closed by the consumer)
        assert attempt.status.is_ok and gen.status.is_ok, (attempt.status, gen.status)
        assert [e.name for e in attempt.events] == ["first_token"]


async def test_a_transition_is_one_trace_of_its_pass_and_steps(
    spans: InMemorySpanExporter, tiny_llama: Path
) -> None:
    """Two converge passes over in-process agents: load 2 whole replicas, then move to
    1 whole + a 2-stage pipeline; the second pass's transition and its steps are spans
    under its reconcile pass."""
    from tessera import api
    from tessera.cli import bench_relayout
    from tessera.control import agents, converge

    started = [await _agent("agent-0"), await _agent("agent-1")]
    refs = [agents.AgentRef(f"agent-{i}", a) for i, (_, _, a) in enumerate(started)]
    try:
        first = await converge.converge(
            api.parse(bench_relayout.manifest(tiny_llama, 0)), str(tiny_llama), refs, tls=None
        )
        assert first.reason == "Serving", first.message
        spans.clear()
        await converge.converge(
            api.parse(bench_relayout.manifest(tiny_llama, 1)),
            str(tiny_llama),
            refs,
            published=first.routes,
            tls=None,
        )
    finally:
        for srv, svc, _ in started:
            await svc.close()
            await srv.stop(grace=None)
    got = spans.get_finished_spans()
    (passes,) = [sp for sp in got if sp.name == "tessera.control.reconcile.pass"]
    moves = [sp for sp in got if sp.name.startswith("tessera.control.transition.")]
    (top,) = [
        sp for sp in moves if sp.parent is not None and sp.parent.span_id == passes.context.span_id
    ]
    steps = [sp for sp in moves if sp is not top]
    assert steps and all(sp.parent.span_id == top.context.span_id for sp in steps)
    assert {sp.context.trace_id for sp in [top, *steps]} == {passes.context.trace_id}
    assert "tessera.control.transition.LoadBlock" in {sp.name for sp in steps}, [
        sp.name for sp in steps
    ]
    assert passes.attributes["tessera.deployment"] == "default.tiny"


def test_a_control_action_is_a_trace_with_its_steps(spans: InMemorySpanExporter) -> None:
    rec = control.Recorder()
    with rec.action("transition", "relayout", deployment="default.tiny") as act:
        with rec.action("transition", "load", replica="r1"):
            pass
        act.note("2 loads, 1 unload")
    with pytest.raises(RuntimeError), rec.action("overload", "drop", replica="r0"):
        raise RuntimeError("agent gone")
    got = {sp.name: sp for sp in spans.get_finished_spans()}
    top, step = got["tessera.control.transition.relayout"], got["tessera.control.transition.load"]
    assert step.parent.span_id == top.context.span_id
    assert top.attributes["tessera.deployment"] == "default.tiny"
    drop = got["tessera.control.overload.drop"]
    assert drop.parent is None and not drop.status.is_ok


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from tessera.observability import tracing, control\n"
        "h = tracing.open_span('x'); h.end()\n"
        "with tracing.span('y'): pass\n"
        "with control.Recorder().action('transition', 'relayout'): pass\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "TESSERA_TRACING": "off"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
