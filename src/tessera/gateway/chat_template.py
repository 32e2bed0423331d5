"""Chat messages → prompt text with the model's Jinja chat template (sandboxed).

Called by the chat-completions handler. The template comes from `tokenizer_config.json`
(`chat_template`) or `chat_template.jinja`; without one, `DEFAULT_TEMPLATE` (documented in
docs/gateway.md) is used. Rendering follows transformers' `apply_chat_template`:
`trim_blocks`/`lstrip_blocks`, `add_generation_prompt=True`, `bos_token`/`eos_token`
variables and a `raise_exception` helper; the rendered text is tokenized without adding
special tokens (the template places them).
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import jinja2
from jinja2 import sandbox

from tessera.gateway import errors

# Plain role-prefixed turns; BOS first when the tokenizer defines one.
DEFAULT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


class TemplateError(Exception):
    """The template rejected the conversation (e.g. `raise_exception`) or failed to render."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A compiled chat template bound to the tokenizer's BOS/EOS strings."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        env = sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined
        )
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = _tojson
        self.is_default = source is None
        try:
            self._template = env.from_string(source if source is not None else DEFAULT_TEMPLATE)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat_template: invalid Jinja ({exc})") from exc
        self._bos, self._eos = bos_token, eos_token

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for `messages`, ending with the assistant's generation prompt."""
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self._bos,
                eos_token=self._eos,
                tools=None,
                documents=None,
            )
        except TemplateError as exc:
            raise errors.bad_request(f"messages: {exc}", "messages") from exc
        except jinja2.TemplateError as exc:
            raise errors.bad_request(
                f"messages: the chat template failed to render ({exc})", "messages"
            ) from exc
