"""OpenAI request bodies → validated plain dataclasses (pure; raises `errors.ApiError`);
the sampling settings become the one wire type, `tessera.rpc.sampling.Sampling`.

Called by the handlers in `app.py` for `/v1/completions` and `/v1/chat/completions`. Defaults
follow OpenAI (`temperature` 1.0, `top_p` 1.0, `max_tokens` 16 for completions, the rest of the
context for chat). Extensions: `top_k` (0 or -1 = off), `ignore_eos`. `logprobs` /
`top_logprobs` (0-20), `n` (1-16, seed + index per choice), `prompt` as a list of texts or
token-id lists. Parameters it cannot honour (`best_of` > 1, `echo`, penalties, `logit_bias`,
tools, ...) are 400, never ignored; unknown fields and `user` are ignored. Numbers are
range-checked against the wire types; a temperature below `GREEDY_BELOW` (or a one-token
`top_p`) is greedy; at most `MAX_STOPS` stops of `MAX_STOP_CHARS` characters. docs/gateway.md
has the full table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.gateway import errors
from tessera.rpc import sampling as rpc_sampling

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_LOGPROBS = 20  # alternatives per token, as the agents allow
MAX_CHOICES = 16  # `n`
MAX_PROMPTS = 16  # prompts in one /v1/completions request (each with `n` choices)
MAX_STOPS = 4  # stop strings, as OpenAI
MAX_STOP_CHARS = 64  # characters per stop string
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
GREEDY_BELOW = 1e-5  # smaller temperatures (float32 denormals make NaN) are greedy
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple[str | tuple[int, ...], ...]  # texts, or token ids given by the client
    sampling: rpc_sampling.Sampling
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    sampling: rpc_sampling.Sampling
    stream: bool = False
    include_usage: bool = False


def check_model(body: Mapping[str, Any], served: str | Sequence[str]) -> None:
    """400 when `model` is missing, 404 naming the served models (the foundation and its
    variants) when it names another."""
    model = body.get("model")
    if model is None:
        raise errors.bad_request("model: required", "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise errors.bad_request("model: must be a string", "model")
    names = [served] if isinstance(served, str) else list(served)
    if model not in names:
        listed = ", ".join(f"`{n}`" for n in names)
        raise errors.ApiError(
            404,
            f"The model `{model}` does not exist; this gateway serves {listed}",
            param="model",
            code="model_not_found",
        )


def parse_completion(
    body: Mapping[str, Any], served: str | Sequence[str], context_len: int = 0
) -> CompletionRequest:
    """`context_len` (when given) refuses longer token-id prompts before reading them."""
    check_model(body, served)
    _reject_unsupported(body, ("echo", "suffix", "best_of"))
    stream, include_usage = _stream(body)
    logprobs = _opt_int(body, "logprobs")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise errors.bad_request(
            f"logprobs: must be in [0, {MAX_LOGPROBS}], got {logprobs}", "logprobs"
        )
    return CompletionRequest(
        prompts=_prompts(body.get("prompt"), context_len),
        sampling=_sampling(body, COMPLETIONS_DEFAULT_MAX_TOKENS, "max_tokens", logprobs),
        stream=stream,
        include_usage=include_usage,
    )


def parse_chat(body: Mapping[str, Any], served: str | Sequence[str]) -> ChatRequest:
    check_model(body, served)
    _reject_unsupported(body, ("tools", "tool_choice", "functions"))
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise errors.bad_request(
            'response_format: only {"type": "text"} is supported', "response_format"
        )
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stream, include_usage = _stream(body)
    return ChatRequest(
        messages=_messages(body.get("messages")),
        sampling=_sampling(body, None, key, _chat_logprobs(body)),
        stream=stream,
        include_usage=include_usage,
    )


# -- fields -------------------------------------------------------------------------------


def _chat_logprobs(body: Mapping[str, Any]) -> int | None:
    wanted = _bool(body, "logprobs", False)
    top = _opt_int(body, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise errors.bad_request(
            f"top_logprobs: must be in [0, {MAX_LOGPROBS}], got {top}", "top_logprobs"
        )
    if top and not wanted:
        raise errors.bad_request("top_logprobs: requires logprobs to be true", "top_logprobs")
    return (top or 0) if wanted else None


def _sampling(
    body: Mapping[str, Any], default_max: int | None, max_key: str, logprobs: int | None
) -> rpc_sampling.Sampling:
    n = _int(body, "n", 1)
    if not 1 <= n <= MAX_CHOICES:
        raise errors.bad_request(f"n: must be in [1, {MAX_CHOICES}], got {n}", "n")
    max_tokens = _opt_int(body, max_key)
    if max_tokens is None:
        max_tokens = default_max
    if max_tokens is not None and not 1 <= max_tokens <= INT32_MAX:
        raise errors.bad_request(
            f"{max_key}: must be in [1, {INT32_MAX}], got {max_tokens}", max_key
        )
    temperature = _float(body, "temperature", 1.0)
    if not 0 <= temperature <= FLOAT32_MAX:
        raise errors.bad_request(
            f"temperature: must be in [0, {FLOAT32_MAX:.4g}], got {temperature}", "temperature"
        )
    top_p = _float(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise errors.bad_request(f"top_p: must be in (0, 1], got {top_p}", "top_p")
    if temperature < GREEDY_BELOW or top_p < GREEDY_BELOW:
        temperature, top_p = 0.0, 1.0  # a one-token nucleus is the greedy choice
    top_k = _int(body, "top_k", 0)
    if not -1 <= top_k <= INT32_MAX:
        raise errors.bad_request(
            f"top_k: must be in [0, {INT32_MAX}] (or -1 for off), got {top_k}", "top_k"
        )
    seed = _opt_int(body, "seed")
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        raise errors.bad_request(f"seed: must be in [{INT64_MIN}, {INT64_MAX}], got {seed}", "seed")
    return rpc_sampling.Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        seed=seed,
        stop=_stop(body.get("stop")),
        ignore_eos=_bool(body, "ignore_eos", False),
        logprobs=logprobs,
        n=n,
    )


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not stream:
        raise errors.bad_request(
            "stream_options: only allowed when stream is true", "stream_options"
        )
    if not isinstance(opts, dict):
        raise errors.bad_request("stream_options: must be an object", "stream_options")
    return stream, _bool(opts, "include_usage", False, "stream_options.include_usage")


def _prompts(value: object, context_len: int) -> tuple[str | tuple[int, ...], ...]:
    """A prompt (text or token ids) or a list of them."""
    if value is None:
        raise errors.bad_request("prompt: required", "prompt", "missing_required_parameter")
    if isinstance(value, str) or (isinstance(value, list) and value and _is_int(value[0])):
        return (_prompt(value, context_len),)
    if isinstance(value, list) and value:
        if len(value) > MAX_PROMPTS:
            raise errors.bad_request(
                f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(value)}", "prompt"
            )
        return tuple(_prompt(v, context_len) for v in value)
    raise errors.bad_request(
        "prompt: must be a string, a non-empty list of token ids, or a list of those", "prompt"
    )


def _prompt(value: object, context_len: int) -> str | tuple[int, ...]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and context_len and len(value) >= context_len:
        raise errors.bad_request(
            f"prompt: {len(value)} tokens do not fit the model's context of {context_len} "
            "tokens (at least one token must be generated)",
            "prompt",
            "context_length_exceeded",
        )
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        return tuple(int(t) for t in value)
    raise errors.bad_request(
        "prompt: each prompt must be a string or a non-empty list of token ids", "prompt"
    )


def _messages(value: object) -> tuple[ChatMessage, ...]:
    if value is None:
        raise errors.bad_request("messages: required", "messages", "missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise errors.bad_request("messages: must be a non-empty list", "messages")
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise errors.bad_request(f"{where}: must be an object", "messages")
        role = msg.get("role")
        if role not in ROLES:
            raise errors.bad_request(
                f"{where}.role: must be one of {', '.join(ROLES)}, got {role!r}", "messages"
            )
        out.append(ChatMessage(str(role), _content(msg.get("content"), role, where)))
    return tuple(out)


def _content(value: object, role: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":
        return ""
    if isinstance(value, list):
        texts = []
        for part in value:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise errors.bad_request(
                    f"{where}.content: only text parts are supported", "messages"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise errors.bad_request(
        f"{where}.content: must be a string or a list of text parts", "messages"
    )


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        raise errors.bad_request("stop: must be a string or a list of strings", "stop")
    if len(value) > MAX_STOPS:
        raise errors.bad_request(
            f"stop: at most {MAX_STOPS} stop strings, got {len(value)}", "stop"
        )
    if any(len(s) > MAX_STOP_CHARS for s in value):
        raise errors.bad_request(
            f"stop: each stop string is at most {MAX_STOP_CHARS} characters", "stop"
        )
    return tuple(s for s in value if s)


def _reject_unsupported(body: Mapping[str, Any], extra: tuple[str, ...]) -> None:
    for key in ("logit_bias", "presence_penalty", "frequency_penalty", *extra):
        value = body.get(key)
        if value in (None, False, 0, {}, [], "") or (key == "best_of" and value == 1):
            continue
        raise errors.bad_request(f"{key}: not supported by this gateway", key, "unsupported")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_int(body: Mapping[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not _is_int(v):
        raise errors.bad_request(f"{key}: must be an integer", key)
    return int(v)


def _int(body: Mapping[str, Any], key: str, default: int) -> int:
    v = _opt_int(body, key)
    return default if v is None else v


def _float(body: Mapping[str, Any], key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise errors.bad_request(f"{key}: must be a finite number", key)
    try:
        f = float(v)  # an int too large for a float overflows
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise errors.bad_request(f"{key}: must be a finite number", key)
    return f


def _bool(body: Mapping[str, Any], key: str, default: bool, param: str = "") -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise errors.bad_request(f"{param or key}: must be true or false", param or key)
    return v
