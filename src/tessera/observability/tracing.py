"""OpenTelemetry traces of requests and control actions, off unless `TESSERA_TRACING` is on.

One trace per request: the gateway's `tessera.gateway.request` span, a
`tessera.gateway.attempt` span per replica tried, the leader's `tessera.agent.generate`
span (parent in `GenerateRequest.trace_parent`, a W3C `traceparent`) and one
`tessera.stage.step` span per step batch on every later stage (parents in
`StageStep.trace_parents`, stamped by `stamp_step`); one per control action
(`observability.control.action`). A process's entry point (`tessera agent`, `gateway`,
`operator`, `up`) calls `configure` with its environment: on, the SDK exports over OTLP
as the standard `OTEL_*` variables say; off, every call is a no-op and OpenTelemetry is
never imported. `install(provider)` hands in another provider (tests). The tracer is
process-wide module state on purpose, as OpenTelemetry's global provider is. Called by
the gateway (`app`, `dispatch`), the agent (`generate_mux`, `convert`, `stage_server`)
and the control loops.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from tessera import env_flags

ENV = "TESSERA_TRACING"
MAX_REMEMBERED = 4096  # requests whose span context a process keeps for the next stage


class _State:
    """The process's tracer (None: tracing off) and the requests' span contexts."""

    def __init__(self) -> None:
        self.tracer: Any = None
        self.parents: OrderedDict[str, Any] = OrderedDict()  # seq id -> span context


_STATE = _State()
# The spans a stage opened for the step it runs: seq id -> span, read by `stamp_step`.
_STEP_SPANS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "tessera_step_spans", default=None
)


def _tracer() -> Any:
    """The process's tracer; None while tracing is off."""
    return _STATE.tracer


def configure(environ: Mapping[str, str]) -> None:
    """At a process's entry point: trace over OTLP when `TESSERA_TRACING` is on in
    `environ` (a value not understood is logged and leaves tracing off)."""
    try:
        on = env_flags.strict(environ, ENV, False)
    except ValueError as exc:  # never fail a process over it: say so, stay off
        logging.getLogger(__name__).warning("tracing stays off: %s", exc)
        on = False
    if on:
        _STATE.tracer = _otlp_tracer(environ.get("OTEL_SERVICE_NAME", "tessera"))


def _otlp_tracer(service: str) -> Any:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider.get_tracer("tessera")


def install(provider: Any) -> None:
    """Trace to `provider` (an SDK `TracerProvider`) from now on; None turns tracing off."""
    _STATE.tracer = None if provider is None else provider.get_tracer("tessera")
    _STATE.parents.clear()


def enabled() -> bool:
    return _tracer() is not None


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span as a child of the current one (a no-op context when tracing is off)."""
    tracer = _tracer()
    if tracer is None:
        return contextlib.nullcontext()
    cm: contextlib.AbstractContextManager[Any] = tracer.start_as_current_span(
        name, attributes=_clean(attributes)
    )
    return cm


@contextlib.contextmanager
def remote_span(parent: str, name: str, **attributes: Any) -> Iterator[Any]:
    """A span whose parent is the W3C `traceparent` `parent` ("" or off: no parent link)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(
        name, context=_extract(parent), attributes=_clean(attributes)
    ) as s:
        yield s


def traceparent() -> str:
    """The current span as a W3C `traceparent` header value ("" when off or no span)."""
    if _tracer() is None:
        return ""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", "")


def _extract(parent: str) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not parent:
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": parent})


class SpanHandle:
    """A started span that is not made current: safe to end from any task or generator.

    `traceparent()` names it to a child in another process; `end()` records the exception
    being handled, if any, as its error.
    """

    def __init__(self, span: Any = None, seq_id: str = "") -> None:
        self._span, self._seq_id = span, seq_id
        if span is not None and seq_id:
            parents = _STATE.parents
            parents[seq_id] = span.get_span_context()
            while len(parents) > MAX_REMEMBERED:
                parents.popitem(last=False)

    def traceparent(self) -> str:
        return "" if self._span is None else _traceparent_of(self._span.get_span_context())

    def stamp(self, request: Any) -> Any:
        """`request` (a `GenerateRequest`) with this span as its `trace_parent`."""
        if self._span is not None:
            request.trace_parent = self.traceparent()
        return request

    def child(self, name: str, **attributes: Any) -> SpanHandle:
        """A child span of this one (the no-op handle when this one is)."""
        if self._span is None:
            return NOOP
        return open_span(name, self.traceparent(), **attributes)

    def event(self, name: str, **attributes: Any) -> None:
        if self._span is not None:
            self._span.add_event(name, attributes=_clean(attributes))

    def end(self, **attributes: Any) -> None:
        if self._span is None:
            return
        exc = sys.exc_info()[1]
        # a consumer closing a finished stream raises GeneratorExit in its generator: not
        # an error of the span (every streamed attempt ended that way)
        if exc is not None and not isinstance(exc, GeneratorExit):
            from opentelemetry.trace import Status, StatusCode

            self._span.record_exception(exc)
            self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self._span.set_attributes(_clean(attributes))
        self._span.end()
        if self._seq_id:
            _STATE.parents.pop(self._seq_id, None)
        self._span = None


NOOP = SpanHandle()


def open_span(
    name: str, parent: str | None = None, seq_id: str = "", **attributes: Any
) -> SpanHandle:
    """Start a span, not made current: a child of `parent` (a W3C traceparent) when given,
    else of the current span. `seq_id`: remember it as that request's span for the steps
    sent onwards (`stamp_step`). Off: the shared no-op handle."""
    tracer = _tracer()
    if tracer is None:
        return NOOP
    ctx = _extract(parent) if parent is not None else None
    return SpanHandle(tracer.start_span(name, context=ctx, attributes=_clean(attributes)), seq_id)


def _traceparent_of(ctx: Any) -> str:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    parent = trace.set_span_in_context(trace.NonRecordingSpan(ctx))
    TraceContextTextMapPropagator().inject(carrier, context=parent)
    return carrier.get("traceparent", "")


def stamp_step(msg: Any) -> None:
    """Write each sequence's span context into a `StageStep`'s `trace_parents`."""
    if _tracer() is None:
        return
    spans = _STEP_SPANS.get() or {}
    for c in msg.chunks:
        s = spans.get(c.seq_id)
        ctx = s.get_span_context() if s is not None else _STATE.parents.get(c.seq_id)
        if ctx is not None:
            msg.trace_parents[c.seq_id] = _traceparent_of(ctx)


@contextlib.contextmanager
def step(msg: Any, replica: str, stage: int) -> Iterator[None]:
    """One `tessera.stage.step` span per traced sequence of a received `StageStep`, each a
    child of that sequence's span on the previous stage."""
    tracer = _tracer()
    if tracer is None or not msg.trace_parents:
        yield
        return
    opened: dict[str, Any] = {}
    for c in msg.chunks:
        parent = msg.trace_parents.get(c.seq_id, "")
        if not parent:
            continue
        kind = "decode" if c.start > 0 and c.num_tokens == 1 else "prefill"
        opened[c.seq_id] = tracer.start_span(
            "tessera.stage.step",
            context=_extract(parent),
            attributes={
                "tessera.replica": replica,
                "tessera.stage": stage,
                "tessera.step_id": int(msg.step_id),
                "tessera.seq_id": c.seq_id,
                "tessera.kind": kind,
                "tessera.tokens": int(c.num_tokens),
                "tessera.batch_sequences": len(msg.chunks),
            },
        )
    token = _STEP_SPANS.set(opened)
    try:
        yield
    finally:
        _STEP_SPANS.reset(token)
        for s in opened.values():
            s.end()


def event(name: str, **attributes: Any) -> None:
    """An event on the current span (first token, retry, ...); nothing when off."""
    if _tracer() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, attributes=_clean(attributes))


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute names under `tessera.`; values OpenTelemetry accepts."""
    out: dict[str, Any] = {}
    for k, v in attributes.items():
        if v is None:
            continue
        out[k if "." in k else f"tessera.{k}"] = v if isinstance(v, int | float | bool) else str(v)
    return out
