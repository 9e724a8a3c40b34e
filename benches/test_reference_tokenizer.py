"""protoprompt's token counts equal the real tiktoken's (loaded offline)."""

from __future__ import annotations

import harness  # noqa: I001  (first: puts the benches' helper modules first)

harness.ensure_paths()

import random

import pytest

import protoprompt
from history_gen import corpus_texts
from reference_tokenizer import AssetNotFoundError, find_asset, get_encoding


def _corpus() -> list[str]:
    r = random.Random(3)
    texts = [
        "",
        " ",
        "a",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Договор № 17/2025 продлевается автоматически, если ни одна из сторон не заявит...",
        "def f(x):\n    return {k: v for k, v in x.items() if v}\n",
        'fn main() { println!("{}", 1 + 2); }\r\n\r\n',
        "🙂🚀✅⚠️👍🏽👨‍👩‍👧‍👦 emoji and ZWJ sequences 🇺🇦🇯🇵",
        "<|endoftext|>",
        "text <|endoftext|> more <|fim_prefix|><|endofprompt|>",
        "\t\t  \n\n\n   \u00a0\u2003 mixed whitespace \r\n\t",
        " " * 1000,
        "\n" * 500,
        "a" * 5000,
        "1234567890" * 300,
        "ǅemo Ǉ ǈ ǉ – mixed-case letters, diacritics: naïve café coöperate",
        "中文文本和日本語のテキスト、한국어 텍스트",
        "https://example.com/path?query=1&b=%20x#frag",
        '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": "б"}}',
        "I'm you're they'll we've it's HE'S SHE'D",
        "\u0000\u0001 control chars \u200b zero width",
    ]
    alphabet = "abc XYZ йцук 123 \n\t.,;!?'\"()[]{}<>|_-+=*/\\😀é"
    texts += ["".join(r.choices(alphabet, k=r.randint(1, 300))) for _ in range(300)]
    big = "\n".join(corpus_texts(110_000, seed=9))
    texts += [big[:100_000], big, " ".join(["word"] * 30_000)]
    texts += corpus_texts(200_000, seed=4)
    return texts


CORPUS = _corpus()


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_count_tokens_equals_tiktoken(encoding):
    enc = get_encoding(encoding)
    expected = [len(enc.encode_ordinary(t)) for t in CORPUS]
    batch = protoprompt.count_tokens_batch(CORPUS, encoding=encoding)
    assert batch == expected
    for t, n in zip(CORPUS, expected):
        assert protoprompt.count_tokens(t, encoding=encoding) == n, t[:80]


def test_special_tokens_are_ordinary_text():
    enc = get_encoding("o200k_base")
    text = "<|endoftext|>"
    assert protoprompt.count_tokens(text) == len(enc.encode_ordinary(text)) > 1


def test_missing_asset_gives_a_clear_error(monkeypatch, tmp_path):
    find_asset.cache_clear()
    monkeypatch.setenv("PROTOPROMPT_TIKTOKEN_ASSETS", str(tmp_path))
    monkeypatch.setenv("CARGO_HOME", str(tmp_path / "no-cargo"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cargo binary either
    try:
        with pytest.raises(AssetNotFoundError, match="tiktoken-rs"):
            find_asset("o200k_base")
    finally:
        find_asset.cache_clear()


def test_loading_the_encoding_leaves_nothing_in_tmp(monkeypatch, tmp_path):
    import tempfile

    get_encoding.cache_clear()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        enc = get_encoding("cl100k_base")
        assert len(enc.encode_ordinary("hello world")) == 2
        assert list(tmp_path.iterdir()) == []
    finally:
        get_encoding.cache_clear()
