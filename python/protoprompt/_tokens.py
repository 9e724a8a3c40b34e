"""Token counts of texts and items, truncation, and encodings: the core's tokenizers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import _core
from ._packing._types import Item, ItemCost


def as_list(items: Iterable[Item], name: str) -> list[Any]:
    if isinstance(items, list):
        return items
    if isinstance(items, (str, bytes, Mapping)):
        raise TypeError(f"{name} must be a list of items, got {type(items).__name__}")
    return list(items)


def count_tokens(text: str, *, model: str | None = None, encoding: str | None = None) -> int:
    """Number of tokens of ``text`` (special-token text counted as ordinary text).

    ``encoding`` (e.g. ``"o200k_base"``) wins over ``model`` (e.g. ``"gpt-5"``); the default
    is ``o200k_base``. Raises :class:`~protoprompt.errors.UnknownModelError` for a model
    with no known encoding.
    """
    return _core.count_tokens(text, model=model, encoding=encoding)


def preload(*, model: str | None = None, encoding: str | None = None, wait: bool = True) -> str:
    """Build the tokenizer of ``model`` / ``encoding`` now; returns the encoding name.

    A tokenizer is built once per process, on first use, and takes about 0.1 s (o200k_base:
    ~40 MB). Call this at start-up so the first request does not pay for it; with
    ``wait=False`` it is built on a background thread (the GIL is not held, and a ``fork``
    meanwhile waits for the build to finish, so a child never inherits a half-built one).
    ``ProtoPromptSession.input_callback`` starts this in the background for its builder.
    """
    return _core.preload(model=model, encoding=encoding, wait=wait)


def count_tokens_batch(
    texts: Iterable[str], *, model: str | None = None, encoding: str | None = None
) -> list[int]:
    """Token counts of many texts with one release of the GIL."""
    return _core.count_tokens_batch(list(texts), model=model, encoding=encoding)


TRUNCATION_MARKER = "\n[… {removed} tokens removed by protoprompt …]\n"
"""Put between the head and tail of a cut text; ``{removed}`` is the number of tokens cut."""


def truncate_text(
    text: str,
    max_tokens: int,
    *,
    model: str | None = None,
    encoding: str | None = None,
    tail_share: float = 0.2,
    marker: str = TRUNCATION_MARKER,
) -> str:
    """``text`` cut to at most ``max_tokens`` tokens: its first and last tokens around
    ``marker``, which says how many tokens were removed.

    The count is exact for the model's encoding: ``count_tokens(result) <= max_tokens``
    always holds. ``tail_share`` of the kept tokens come from the end of the text (0 keeps
    only the head). A text that fits is returned unchanged; when not even the marker fits,
    the result is the text's first ``max_tokens`` tokens without a marker.

    Raises:
        TypeError / ValueError: bad arguments; UnknownModelError / UnknownEncodingError.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    if not 0.0 <= tail_share <= 1.0:
        raise ValueError(f"tail_share must be between 0 and 1, got {tail_share!r}")
    if "{removed}" not in marker:
        raise ValueError("marker must contain '{removed}'")
    return _core.cut_text(
        text, max_tokens, tail_share=tail_share, marker=marker, model=model, encoding=encoding
    )


ESTIMATED_ENCODINGS: frozenset[str] = frozenset({"claude_estimate"})
"""Encodings that estimate a tokenizer that is not public (Claude's: two tokens per
``o200k_base`` token, see ``docs/models.md``); plans say so."""


def encoding_for_model(model: str) -> str:
    """The name of the encoding that counts ``model``'s tokens.

    OpenAI's models map to their tiktoken encoding (``gpt-5`` -> ``o200k_base``); the
    open-weight families to their own tokenizer, bundled: ``llama3`` (Llama 3.x), ``qwen2``
    (Qwen 2.5 / 3, QwQ), ``deepseek_v3`` (DeepSeek V3 / R1 / V4, ``deepseek-chat``) and
    ``tekken`` (Mistral Nemo, Small 3, Medium 3, Ministral, Codestral 25, Magistral,
    Devstral) and ``gemma3`` (Gemma 3 and Gemini 2.x / 3, whose server tokenizer is
    Gemma-3-compatible but not guaranteed identical). Claude models (``claude-*``) map to
    ``claude_estimate``, a conservative estimate (two tokens per ``o200k_base`` token):
    Claude's tokenizer is not public.
    Names are read as written for the Agents SDK: ``litellm/<provider>/<model>``,
    any-llm's ``provider:model`` or ``provider/model``, Hugging Face ids, Ollama tags,
    Bedrock ids. Raises :class:`~protoprompt.errors.UnknownModelError` for a model with no
    known tokenizer (see ``docs/models.md``).
    """
    return _core.encoding_for_model(model)


def available_encodings() -> list[str]:
    """Names of the encodings bundled with protoprompt (no download needed)."""
    return _core.available_encodings()


def item_tokens(item: Item, *, model: str | None = None, encoding: str | None = None) -> ItemCost:
    """The cost of one Responses input item (see ``docs/cost-model.md``)."""
    text, media, overhead, opaque, fallback = _core.item_tokens(
        item, model=model, encoding=encoding
    )
    return ItemCost(text, media, overhead, opaque, fallback)


def canonical_text(item: Item) -> str:
    """The canonical text of one item: the plain-text rendering of its provider-bound
    fields that its text tokens are counted on (see ``docs/cost-model.md``). Media and
    opaque payloads are not in it (they are costed apart), nor fields the SDK strips before
    sending.

    Raises:
        InvalidItemError: ``item`` is malformed (the message names the field).
    """
    return _core.canonical_text(item)
