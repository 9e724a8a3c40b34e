"""The process's memo of token counts (``protoprompt._context._count_memo``): a count is reused only
for the same text, counted the same way (kind, model, encoding), whichever of its two
tables holds it (short texts by the text itself, every text by its digest)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protoprompt._context import _count_memo


@pytest.fixture(autouse=True)
def fresh_memo() -> Iterator[None]:
    _count_memo.clear()
    yield
    _count_memo.clear()


class Counter:
    """A token counter that counts its calls: one per character, plus ``extra``."""

    def __init__(self, extra: int = 0) -> None:
        self.extra = extra
        self.seen: list[str] = []

    def __call__(self, texts: list[str]) -> list[int]:
        self.seen.extend(texts)
        return [len(t) + self.extra for t in texts]


def test_a_count_is_reused_for_the_same_text_counted_the_same_way() -> None:
    short, long = '<turn when="2 turns ago">\n', "word " * _count_memo.MAX_TEXT_CHARS
    first = Counter()
    assert _count_memo.counts("text", [short, long], None, "o200k_base", first) == [
        len(short),
        len(long),
    ]
    again = Counter(extra=100)  # would count otherwise: never called for what is kept
    # Equal texts that are other objects (as the next turn builds them) are found too.
    same = ["".join(list(short)), "".join(list(long))]
    assert _count_memo.counts("text", same, None, "o200k_base", again) == [len(short), len(long)]
    assert again.seen == []
    # Another encoding, model or kind is another count: never the kept one.
    for kind, model, encoding in (
        ("text", None, "cl100k_base"),
        ("text", "gpt-4o", "o200k_base"),
        ("message:system", None, "o200k_base"),
    ):
        other = Counter(extra=7)
        found = _count_memo.counts(kind, [short, long], model, encoding, other)
        assert found == [len(short) + 7, len(long) + 7]
        assert other.seen == [short, long]
    # Another text (one character changed) is counted.
    changed = short.replace("2", "3")
    fresh = Counter(extra=1)
    assert _count_memo.counts("text", [changed, short], None, "o200k_base", fresh) == [
        len(changed) + 1,
        len(short),
    ]
    assert fresh.seen == [changed]


def test_short_texts_are_kept_by_the_text_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_count_memo, "MAX_TEXTS", 8)
    digests: list[str] = []
    real = _count_memo._digest

    def digest(text: str) -> bytes:
        digests.append(text)
        return real(text)

    monkeypatch.setattr(_count_memo, "_digest", digest)
    texts = [f"passage {i}" for i in range(20)]
    assert _count_memo.counts("text", texts, None, None, Counter()) == [len(t) for t in texts]
    assert len(_count_memo._by_text) <= 8
    digests.clear()
    # The last ones are found by the text (no digest); the older ones by their digest.
    assert _count_memo.counts("text", texts[-3:], None, None, Counter(9)) == [
        len(t) for t in texts[-3:]
    ]
    assert digests == []
    assert _count_memo.counts("text", texts[:2], None, None, Counter(9)) == [
        len(t) for t in texts[:2]
    ]
    assert digests == texts[:2]
    _count_memo.clear()
    assert _count_memo.counts("text", texts[-1:], None, None, Counter(9)) == [len(texts[-1]) + 9]


def test_a_count_kept_by_its_caller_is_found_by_the_text() -> None:
    """``keep`` (a count the caller worked out, e.g. as the sum of its lines' counts) is
    found by ``find`` and by ``counts`` for the same text counted the same way only."""
    short, long = "<a>\nb\n</a>", "word " * _count_memo.MAX_TEXT_CHARS
    for text in (short, long):
        assert _count_memo.find("message:system", text, None, "o200k_base") is None
        _count_memo.keep("message:system", text, None, "o200k_base", 7)
        assert _count_memo.find("message:system", "".join(list(text)), None, "o200k_base") == 7
        assert _count_memo.find("message:user", text, None, "o200k_base") is None
        assert _count_memo.find("message:system", text, None, "cl100k_base") is None
        never = Counter()
        assert _count_memo.counts("message:system", [text], None, "o200k_base", never) == [7]
        assert never.seen == []
