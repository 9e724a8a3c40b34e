"""An offline sentence embedder for hybrid recall (``pip install 'protoprompt[embed]'``).

:class:`OfflineEmbedder` runs a small static sentence-embedding model whose weights ship
inside a registry package: WordLlama's ``l2_supercat`` (a 32,000-token vocabulary of
256-dimensional vectors taken from Llama 2's token embeddings and trained for sentence
similarity; the ``wordllama`` wheel carries the weights and the tokenizer). Nothing is
downloaded at run time, and it needs no torch or GPU: a text's vector is the average of its
tokens' vectors, so embedding is a table look-up (about 0.02 ms per short passage).

Give it to a :class:`~protoprompt.MemoryStore` and its searches become hybrid: full-text
ranking fused with cosine similarity (reciprocal-rank fusion), for documents, facts and the
history layer that ``recall_evicted`` fills::

    from protoprompt import MemoryStore
    from protoprompt.embed import OfflineEmbedder

    store = MemoryStore("memory.db", embedder=OfflineEmbedder())

The passages a session evicts are embedded where they are indexed, in the background
worker, never on a turn's path; a turn embeds only its question. See ``docs/memory.md``
for its size, speed and memory.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DIMENSIONS", "MODEL", "EmbedderUnavailableError", "OfflineEmbedder", "available"]

MODEL = "wordllama l2_supercat"
"""The model :class:`OfflineEmbedder` runs."""

DIMENSIONS = (64, 128, 256)
"""The vector sizes it offers (its vectors are trained to be cut to these, Matryoshka
style: shorter ones cost less to store and compare, and rank a little worse)."""

_WEIGHTS = ("weights", "l2_supercat_256.safetensors")
_TOKENIZER = ("tokenizers", "l2_supercat_tokenizer_config.json")
_MAX_TOKENS = 512  # a passage's first tokens: the history layer's passages are shorter


class EmbedderUnavailableError(ImportError):
    """The ``embed`` extra is not installed (or its package does not hold the model)."""


def _package_root() -> Path:
    """The ``wordllama`` package's folder (found, not imported: only its files are used)."""
    try:
        spec = importlib.util.find_spec("wordllama")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise EmbedderUnavailableError(
            "protoprompt.embed needs the 'wordllama' package: pip install 'protoprompt[embed]'"
        )
    return Path(spec.origin).resolve().parent


def available() -> bool:
    """Whether :class:`OfflineEmbedder` can run here (the ``embed`` extra is installed)."""
    try:
        root = _package_root()
    except EmbedderUnavailableError:
        return False
    return root.joinpath(*_WEIGHTS).is_file() and root.joinpath(*_TOKENIZER).is_file()


class OfflineEmbedder:
    """``list[str] -> list[list[float]]``: unit-length sentence vectors from a model shipped
    inside the ``wordllama`` package (see the module note). Loads its weights (16 MB) when
    made, so the first search does not wait for them; safe to share between threads.

    Args:
        dimensions: the vector size, one of :data:`DIMENSIONS` (default 256).

    Raises:
        EmbedderUnavailableError: the ``embed`` extra is not installed.
        ValueError: ``dimensions`` is not one of :data:`DIMENSIONS`.
    """

    def __init__(self, *, dimensions: int = 256) -> None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise TypeError(f"dimensions must be an int, got {type(dimensions).__name__}")
        if dimensions not in DIMENSIONS:
            raise ValueError(f"dimensions must be one of {DIMENSIONS}, got {dimensions}")
        root = _package_root()
        weights, tokenizer_file = root.joinpath(*_WEIGHTS), root.joinpath(*_TOKENIZER)
        if not weights.is_file() or not tokenizer_file.is_file():
            raise EmbedderUnavailableError(
                f"the installed wordllama package does not hold {MODEL}'s weights and "
                "tokenizer (a wordllama version that does not ship them?)"
            )
        import numpy as np
        from safetensors import safe_open
        from tokenizers import Tokenizer

        with safe_open(str(weights), framework="np") as f:
            table = f.get_tensor("embedding.weight")
        # Kept as shipped (float16: 16 MB at 256 dimensions), summed in float32.
        self._table = np.ascontiguousarray(table[:, :dimensions])
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tokenizer.enable_truncation(_MAX_TOKENS)
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._lock = threading.Lock()  # Tokenizer's truncation settings are shared state
        self.dimensions = dimensions
        """The vectors' size."""

    def __repr__(self) -> str:
        return f"OfflineEmbedder({MODEL!r}, dimensions={self.dimensions})"

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit-length vector per text (a text without any known token: all zeros,
        which matches nothing)."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError("texts must be a sequence of str")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        if not texts:
            return []
        import numpy as np

        with self._lock:
            encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, encoding in enumerate(encodings):
            ids = encoding.ids
            if ids:
                index = np.clip(np.asarray(ids, dtype=np.int64), 0, len(self._table) - 1)
                out[row] = self._table[index].mean(axis=0, dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0.0)
        vectors: list[list[float]] = out.tolist()
        return vectors

    def similarity(self, a: str, b: str) -> float:
        """The cosine similarity of two texts' vectors."""
        va, vb = self([a, b])
        return math.fsum(x * y for x, y in zip(va, vb, strict=True))
