"""Transformer dimensions of a decoder-only model, read from a Hugging Face ``config.json``.

The cost model (``tessera.cost.analytic``, ``tessera.cost.fit``) derives parameter bytes,
FLOPs per token and KV-cache bytes from a :class:`ModelShape`; the planner checks tensor
parallel degrees against its head counts. Callers read the file with
``tessera.model_facts.read_config`` and pass the decoded mapping to :func:`from_hf_config`
(no file access here); element sizes come from ``tessera.dtypes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tessera import dtypes, fields


@dataclass(frozen=True)
class ModelShape:
    """Dimensions that determine a decoder-only transformer's cost."""

    name: str  # human name, e.g. "llama-2-13b"
    hidden_size: int  # d_model
    intermediate_size: int  # MLP width (gated SwiGLU: three h x I matrices)
    num_layers: int  # decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA when < num_heads)
    vocab_size: int
    head_dim: int  # per-head width; hidden_size // num_heads unless config says otherwise
    dtype_bytes: int = 2  # bytes per weight and per KV element
    attention_bias: bool = False  # q/k/v projections carry biases (Qwen2)
    tie_word_embeddings: bool = False  # lm_head shares the embedding matrix

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "vocab_size",
            "head_dim",
            "dtype_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise fields.FieldError(name, f"must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise fields.FieldError(
                "num_key_value_heads",
                f"must divide num_attention_heads ({self.num_heads}), got {self.num_kv_heads}",
            )

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP and two RMSNorms."""
        h, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        attention = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attention += q + 2 * kv
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        """Parameters of the token embedding (held by the first pipeline stage)."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters of the final norm and output projection (held by the last stage).

        A tied lm_head still needs its own copy when the first and last stages differ, so
        it is counted in full either way.
        """
        return self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def total_params(self) -> int:
        """Parameters of the whole model as a single stage holds them."""
        head = self.hidden_size if self.tie_word_embeddings else self.lm_head_params
        return self.num_layers * self.layer_params + self.embedding_params + head

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """KV-cache bytes one token occupies in one layer (K and V, all KV heads)."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def activation_bytes_per_token(self) -> int:
        """Bytes of one token's hidden state: the TP all-reduce and PP hop payload."""
        return self.hidden_size * self.dtype_bytes

    def to_json(self) -> dict[str, Any]:
        """Return the shape as a JSON object (the ``model`` section of a profile)."""
        return asdict(self)

    @staticmethod
    def from_json(doc: Any, path: str = "model") -> ModelShape:
        """Inverse of :meth:`to_json`; errors name ``path.field``."""
        obj = fields.mapping(doc, path)

        def req_int(key: str) -> int:
            return fields.integer(fields.require(obj, key, path), fields.join(path, key), minimum=1)

        return ModelShape(
            name=fields.string(fields.require(obj, "name", path), fields.join(path, "name")),
            hidden_size=req_int("hidden_size"),
            intermediate_size=req_int("intermediate_size"),
            num_layers=req_int("num_layers"),
            num_heads=req_int("num_heads"),
            num_kv_heads=req_int("num_kv_heads"),
            vocab_size=req_int("vocab_size"),
            head_dim=req_int("head_dim"),
            dtype_bytes=req_int("dtype_bytes"),
            attention_bias=bool(obj.get("attention_bias", False)),
            tie_word_embeddings=bool(obj.get("tie_word_embeddings", False)),
        )


def dtype_bytes(torch_dtype: str, path: str = "torch_dtype") -> int:
    """Return bytes per element for a ``torch_dtype`` string of ``config.json``."""
    try:
        return dtypes.nbytes(torch_dtype)
    except ValueError:
        known = ", ".join(dtypes.STORED_BYTES)
        message = f"unsupported dtype {torch_dtype!r} (known: {known})"
        raise fields.FieldError(path, message) from None


def from_hf_config(config: Mapping[str, Any], name: str, path: str = "config.json") -> ModelShape:
    """Build a :class:`ModelShape` from a decoded Hugging Face ``config.json`` mapping.

    Reads hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads (defaults to num_attention_heads), vocab_size, head_dim (defaults
    to hidden_size // num_attention_heads) and torch_dtype (defaults to float16).
    """
    doc = fields.mapping(config, path)

    def req_int(key: str) -> int:
        return fields.integer(fields.require(doc, key, path), fields.join(path, key), minimum=1)

    hidden = req_int("hidden_size")
    heads = req_int("num_attention_heads")
    kv_heads = (
        req_int("num_key_value_heads") if doc.get("num_key_value_heads") is not None else heads
    )
    if doc.get("head_dim") is not None:
        head_dim = req_int("head_dim")
    else:
        if hidden % heads:
            raise fields.FieldError(
                fields.join(path, "num_attention_heads"),
                f"must divide hidden_size ({hidden}) when head_dim is absent",
            )
        head_dim = hidden // heads
    torch_dtype = doc.get("torch_dtype") or doc.get("dtype") or "float16"
    size = dtype_bytes(
        fields.string(torch_dtype, fields.join(path, "torch_dtype")),
        fields.join(path, "torch_dtype"),
    )
    bias = doc.get("attention_bias")
    if bias is None:
        bias = doc.get("model_type") == "qwen2"  # Qwen2 always has q/k/v biases
    try:
        return ModelShape(
            name=name,
            hidden_size=hidden,
            intermediate_size=req_int("intermediate_size"),
            num_layers=req_int("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            vocab_size=req_int("vocab_size"),
            head_dim=head_dim,
            dtype_bytes=size,
            attention_bias=bool(bias),
            tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
        )
    except fields.FieldError as exc:
        raise fields.FieldError(fields.join(path, exc.path), exc.message) from None
