"""The aiohttp application: OpenAI-compatible endpoints plus /health and /metrics.

Built by `server.start_gateway` from a `Service` (the loaded model, the dispatcher, the
replica set, the metrics). Handlers stay thin: parse (`request_params`), tokenize, hand a
`dispatch.Job` to `text_stream`, and format (`responses`; a stream: `sse_response`). Any
`errors.ApiError` becomes an OpenAI error body (the middleware); once a stream has
started, it becomes an SSE error event followed by `data: [DONE]`. A client that
disconnects cancels its handler (the runner enables handler cancellation), which cancels
the agent call; so does a client that stops reading a stream for
`Limits.write_timeout_s`. The body is read and parsed before admission
(`body.middleware`); a prompt's text longer than the context could hold (the token
budget times the longest token of the vocabulary) is refused before tokenizing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tessera.gateway import (
    admin_auth,
    arrivals,
    auth,
    body,
    chat_template,
    dispatch,
    errors,
    hold,
    limits,
    metrics,
    model_info,
    replicas,
    request_params,
    responses,
    sse_response,
    text_stream,
    tokenizer,
)
from tessera.gateway import variants as gw_variants
from tessera.observability import tracing
from tessera.rpc import sampling as rpc_sampling

log = logging.getLogger(__name__)

INLINE_TOKENIZE_CHARS = 16_384  # longer prompts are tokenized in a worker thread
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Service:
    """Everything the handlers use; assembled by `server.start_gateway`."""

    model_name: str
    info: model_info.ModelInfo
    codec: tokenizer.TextCodec
    template: chat_template.ChatTemplate
    dispatcher: dispatch.Dispatcher
    replicas: replicas.ReplicaSet
    metrics: metrics.GatewayMetrics
    created: int  # unix time the gateway started (/v1/models)
    limits: limits.Limits = dataclasses.field(default_factory=limits.Limits)
    api_keys: auth.ApiKeys | None = None  # None: no authentication
    admin_token: admin_auth.AdminToken | None = None  # the operator's, on /admin/
    arrivals: arrivals.ArrivalRecorder | None = None  # per-class arrivals (switching loop)
    variants: gw_variants.VariantTable | None = None  # served names (issue 14); built if None
    holding: hold.Holding | None = None  # holds requests while no replica is awake (issue 32)

    def __post_init__(self) -> None:
        if self.variants is None:
            self.variants = gw_variants.VariantTable(self.model_name)

    @property
    def table(self) -> gw_variants.VariantTable:
        assert self.variants is not None
        return self.variants


def build(service: Service, max_body_bytes: int) -> web.Application:
    admission = limits.Admission(service.limits, lambda: len(service.replicas.ready_ids()))
    guards = admin_auth.guards(service.api_keys, service.admin_token)
    lim = service.limits
    reader = body.middleware(
        limits.GUARDED,
        lim.body_timeout_s,
        max_body_bytes,
        body.Budget(lim.body_bytes_in_flight, lim.retry_after_s),
        lambda path, status: service.metrics.requests.labels(path, str(status)).inc(),
    )
    app = web.Application(
        client_max_size=max_body_bytes,
        middlewares=[_error_middleware, *guards, reader, admission.middleware],
    )
    h = _Handlers(service)
    app.router.add_post("/v1/completions", h.completions)
    app.router.add_post("/v1/chat/completions", h.chat)
    app.router.add_get("/v1/models", h.models)
    app.router.add_get("/health", h.health)
    app.router.add_get("/metrics", h.metrics)
    return app


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.ApiError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "not_found" if exc.status == 404 else None
        return _error_response(errors.ApiError(exc.status, exc.reason, code=code))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(errors.ApiError(500, "internal gateway error", code="internal"))


def _error_response(exc: errors.ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers)


class _Handlers:
    def __init__(self, service: Service) -> None:
        self.s = service

    # -- generation ---------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        m = self.s.metrics
        started = time.monotonic()
        status = 500
        m.in_flight.inc()
        try:
            with tracing.span("tessera.gateway.request", endpoint=request.path):
                resp, status = await self._serve(request, kind, started)
            return resp
        except errors.ApiError as exc:
            status = exc.status
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            status = sse_response.CLIENT_CLOSED
            raise
        finally:
            m.in_flight.dec()
            m.requests.labels(request.path, str(status)).inc()
            m.e2e.labels(request.path).observe(time.monotonic() - started)

    async def _serve(
        self, request: web.Request, kind: str, started: float
    ) -> tuple[web.StreamResponse, int]:
        lim = self.s.limits
        req = await body.read(request, lim.body_timeout_s)
        prompts: list[list[int]] = []
        if kind == "chat":
            chat = request_params.parse_chat(req, self.s.table.names())
            messages = [{"role": x.role, "content": x.content} for x in chat.messages]
            self._check_chars(sum(len(x.content) for x in chat.messages), "messages")
            text = self.s.template.render(messages)
            prompts.append(await self._encode(text, add_special_tokens=False, param="messages"))
            sampling, stream, include_usage = chat.sampling, chat.stream, chat.include_usage
        else:
            comp = request_params.parse_completion(
                req, self.s.table.names(), self.s.info.context_len
            )
            for p in comp.prompts:  # every text first: nothing is tokenized in vain
                if isinstance(p, str):
                    self._check_chars(len(p), "prompt")
            for p in comp.prompts:
                if isinstance(p, str):
                    prompts.append(await self._encode(p, add_special_tokens=True, param="prompt"))
                else:
                    prompts.append(list(p))
            sampling, stream, include_usage = comp.sampling, comp.stream, comp.include_usage
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        target = self.s.table.resolve(str(req["model"]))
        meta = responses.Meta(kind, prefix + uuid.uuid4().hex, int(time.time()), target.model)
        gens: list[text_stream.TextGeneration] = []
        jobs = [self._job(meta.id, prompt, sampling, started) for prompt in prompts]
        for k, job in enumerate(jobs):
            if target.kind != "foundation" or target.exclude:
                job = dataclasses.replace(job, variant=target.variant, allowed=target.allows)
            if self.s.arrivals is not None:
                self.s.arrivals.record(len(job.prompt_ids), sampling.max_tokens)
            self.s.metrics.prompt_tokens.inc(len(job.prompt_ids))
            gens += [
                text_stream.TextGeneration(
                    self.s.dispatcher,
                    self.s.codec.decode,
                    _nth(job, k * sampling.n + i, i),
                    sampling.stop,
                )
                for i in range(sampling.n)
            ]
        shapes = [
            sse_response.LogprobShape(kind, self.s.codec) if sampling.logprobs is not None else None
            for _ in gens
        ]
        prompt_tokens = sum(len(p) for p in prompts)
        if self.s.holding is not None:  # valid, and no replica awake: wait for one to wake
            await self.s.holding.wait()
        if stream:
            return await sse_response.stream(
                request, gens, meta, include_usage, shapes, prompt_tokens, lim.write_timeout_s
            )
        results = await _all_or_none([g.complete() for g in gens])
        use = responses.usage(prompt_tokens, sum(g.completion_tokens for g in gens))
        choices = [
            responses.Choice(
                r.text, r.finish_reason or "stop", shape.payload(r.logprobs) if shape else None
            )
            for r, shape in zip(results, shapes, strict=True)
        ]
        return web.json_response(responses.full(meta, choices, use)), 200

    def _check_chars(self, chars: int, param: str) -> None:
        """400 before tokenizing text that cannot fit the token budget (the context, or
        the gateway's prompt limit) even at the longest token of the vocabulary."""
        budget = self.s.info.context_len
        if self.s.limits.max_prompt_tokens:
            budget = min(budget, self.s.limits.max_prompt_tokens)
        most = budget * self.s.codec.max_token_chars
        if chars > most:
            raise errors.bad_request(
                f"{param}: {chars} characters cannot fit {budget} tokens (at most {most} "
                "characters)",
                param,
                "context_length_exceeded",
            )

    async def _encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        try:
            if len(text) < INLINE_TOKENIZE_CHARS:
                return self.s.codec.encode(text, add_special_tokens)
            # long prompts: tokenize in a worker thread so running streams keep flowing
            return await asyncio.to_thread(self.s.codec.encode, text, add_special_tokens)
        except (ValueError, TypeError, UnicodeError) as exc:  # text the tokenizer refuses
            raise errors.bad_request(f"{param}: cannot be tokenized", param) from exc

    def _job(
        self, request_id: str, prompt: list[int], p: rpc_sampling.Sampling, started: float
    ) -> dispatch.Job:
        info = self.s.info
        if not prompt:
            raise errors.bad_request("prompt: tokenizes to no tokens", "prompt")
        bad = [t for t in prompt if not 0 <= t < info.vocab_size]
        if bad:
            raise errors.bad_request(
                f"prompt: token id {bad[0]} is outside the vocabulary [0, {info.vocab_size})",
                "prompt",
            )
        if len(prompt) >= info.context_len:
            raise errors.bad_request(
                f"prompt: {len(prompt)} tokens do not fit the model's context of "
                f"{info.context_len} tokens (at least one token must be generated)",
                "prompt",
                "context_length_exceeded",
            )
        max_tokens = limits.check_request(
            self.s.limits, len(prompt), p.max_tokens, info.context_len - len(prompt), p.n
        )
        if len(prompt) + max_tokens > info.context_len:
            raise errors.bad_request(
                f"This model's maximum context length is {info.context_len} tokens; the "
                f"request asks for {len(prompt) + max_tokens} ({len(prompt)} in the prompt, "
                f"{max_tokens} for the completion)",
                "max_tokens",
                "context_length_exceeded",
            )
        stop_ids = {t for s in p.stop if (t := self.s.codec.single_token(s)) is not None}
        resolved = dataclasses.replace(
            p, max_tokens=max_tokens, stop_token_ids=tuple(sorted(stop_ids))
        )
        return dispatch.Job(request_id, tuple(prompt), resolved, started)

    # -- inventory ----------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.StreamResponse:
        model = {
            "id": self.s.model_name,
            "object": "model",
            "created": self.s.created,
            "owned_by": "tessera",
            "max_model_len": self.s.info.context_len,
        }
        data = [model] + [
            {**model, "id": v.name, "parent": self.s.model_name, "kind": v.kind}
            for v in self.s.table.variants
        ]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.StreamResponse:
        states = self.s.replicas.states()
        ready = [rid for rid, st in states.items() if st.ready]
        body = {
            "status": "ok" if ready else "unavailable",
            "model": self.s.model_name,
            "ready_replicas": len(ready),
            "replicas": {rid: st.to_json() for rid, st in states.items()},
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=self.s.metrics.render(), headers={"Content-Type": metrics.CONTENT_TYPE}
        )


async def _all_or_none(
    runs: list[Coroutine[Any, Any, text_stream.TextEvent]],
) -> list[text_stream.TextEvent]:
    """Every choice's result; the first failure cancels the others (their agent calls
    end, their KV pages are freed) and is raised."""
    if len(runs) == 1:
        return [await runs[0]]
    tasks = [asyncio.ensure_future(r) for r in runs]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            failure = t.exception() if t.done() and not t.cancelled() else None
            if failure is not None:
                raise failure
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _nth(job: dispatch.Job, index: int, offset: int) -> dispatch.Job:
    """Choice `index` of a request: its own agent request id (`.c<index>`; a retry adds
    `.r<attempt>`, so the two never collide), and seed + `offset` (its place among the
    prompt's `n`) when seeded."""
    if index == 0:
        return job
    return dataclasses.replace(
        job, request_id=f"{job.request_id}.c{index}", sampling=job.reseeded(offset)
    )
