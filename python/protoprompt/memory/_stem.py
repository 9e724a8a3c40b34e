"""The terms of the history layer: words stemmed as SQLite FTS5's ``porter`` tokenizer stems
them, and the stop words a recall query leaves out.

SQLite indexes the history layer with ``porter unicode61 remove_diacritics 2``; PostgreSQL
stores the same terms, computed here (:func:`stem` on :func:`._ranking.words`), so both
engines match and count the same terms whatever the server's text search configuration.
:func:`stem` follows FTS5's Porter stemmer step by step, on the word's UTF-8 bytes (bytes
that are not ASCII vowels count as consonants; words shorter than 3 or longer than 64 bytes
are kept as they are); ``tests/recall/test_memory_history.py`` checks it against SQLite's.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["STOP_WORDS", "stem"]

_MAX_TOKEN = 64
_VOWELS = frozenset(b"aeiou")
_Y = ord("y")


def _is_vowel(c: int, y_is_vowel: bool) -> bool:
    return c in _VOWELS or (y_is_vowel and c == _Y)


def _gobble_vc(w: bytes | bytearray, start: int, n: int, prev_consonant: bool) -> int:
    """After a vowel then a consonant from ``start``: the index past them (0: none)."""
    cons = prev_consonant
    i = start
    while i < n:
        cons = not _is_vowel(w[i], cons)
        if not cons:
            break
        i += 1
    i += 1
    while i < n:
        cons = not _is_vowel(w[i], cons)
        if cons:
            return i + 1
        i += 1
    return 0


def _m_gt0(w: bytearray, n: int) -> bool:
    return _gobble_vc(w, 0, n, False) != 0


def _m_gt1(w: bytearray, n: int) -> bool:
    k = _gobble_vc(w, 0, n, False)
    return k != 0 and _gobble_vc(w, k, n, True) != 0


def _m_eq1(w: bytearray, n: int) -> bool:
    k = _gobble_vc(w, 0, n, False)
    return k != 0 and _gobble_vc(w, k, n, True) == 0


def _o_star(w: bytearray, n: int) -> bool:
    if w[n - 1] in b"wxy":
        return False
    mask, cons = 0, False
    for i in range(n):
        cons = not _is_vowel(w[i], cons)
        mask = (mask << 1) | int(cons)
    return (mask & 7) == 5


def _has_vowel(w: bytearray, n: int) -> bool:
    return any(_is_vowel(w[i], i > 0) for i in range(n))


def _m_gt1_s_or_t(w: bytearray, n: int) -> bool:
    return n > 0 and w[n - 1] in b"st" and _m_gt1(w, n)


_Rule = tuple[bytes, bytes]
# Steps 2 to 4: by the word's second-to-last letter, the suffixes tried in order (the first
# that ends the word decides), each with its replacement; all but step 4's "ion" need m > 0
# (steps 2 and 3) or m > 1 (step 4) of the stem.
_STEP2: dict[int, tuple[_Rule, ...]] = {
    ord("a"): ((b"ational", b"ate"), (b"tional", b"tion")),
    ord("c"): ((b"enci", b"ence"), (b"anci", b"ance")),
    ord("e"): ((b"izer", b"ize"),),
    ord("g"): ((b"logi", b"log"),),
    ord("l"): ((b"bli", b"ble"), (b"alli", b"al"), (b"entli", b"ent"), (b"eli", b"e"),
               (b"ousli", b"ous")),
    ord("o"): ((b"ization", b"ize"), (b"ation", b"ate"), (b"ator", b"ate")),
    ord("s"): ((b"alism", b"al"), (b"iveness", b"ive"), (b"fulness", b"ful"),
               (b"ousness", b"ous")),
    ord("t"): ((b"aliti", b"al"), (b"iviti", b"ive"), (b"biliti", b"ble")),
}  # fmt: skip
_STEP3: dict[int, tuple[_Rule, ...]] = {
    ord("a"): ((b"ical", b"ic"),),
    ord("s"): ((b"ness", b""),),
    ord("t"): ((b"icate", b"ic"), (b"iciti", b"ic")),
    ord("u"): ((b"ful", b""),),
    ord("v"): ((b"ative", b""),),
    ord("z"): ((b"alize", b"al"),),
}
_STEP4: dict[int, tuple[bytes, ...]] = {
    ord("a"): (b"al",),
    ord("c"): (b"ance", b"ence"),
    ord("e"): (b"er",),
    ord("i"): (b"ic",),
    ord("l"): (b"able", b"ible"),
    ord("n"): (b"ant", b"ement", b"ment", b"ent"),
    ord("o"): (b"ion", b"ou"),
    ord("s"): (b"ism",),
    ord("t"): (b"ate", b"iti"),
    ord("u"): (b"ous",),
    ord("v"): (b"ive",),
    ord("z"): (b"ize",),
}
_STEP1B2 = {ord("a"): (b"at", b"ate"), ord("b"): (b"bl", b"ble"), ord("i"): (b"iz", b"ize")}


def _replace(w: bytearray, n: int, rules: tuple[_Rule, ...]) -> int:
    """Steps 2 and 3: the first rule whose suffix ends the word applies when m > 0."""
    for suffix, out in rules:
        k = len(suffix)
        if n > k and w[n - k : n] == suffix:
            if _m_gt0(w, n - k):
                w[n - k : n] = out
                return n - k + len(out)
            return n
    return n


def _step1a(w: bytearray, n: int) -> int:
    if w[n - 1] != ord("s"):
        return n
    if w[n - 2] == ord("e"):
        if (n > 4 and w[n - 4 : n - 2] == b"ss") or (n > 3 and w[n - 3] == ord("i")):
            return n - 2
        return n - 1
    return n if w[n - 2] == ord("s") else n - 1


def _step1b(w: bytearray, n: int) -> tuple[int, bool]:
    """Step 1b: ``eed``, ``ed``, ``ing``; ``True`` when ``ed`` or ``ing`` was removed."""
    if n > 3 and w[n - 3 : n] == b"eed":
        return (n - 1, False) if _m_gt0(w, n - 3) else (n, False)
    if n > 2 and w[n - 2 : n] == b"ed":
        return (n - 2, True) if _has_vowel(w, n - 2) else (n, False)
    if n > 3 and w[n - 3 : n] == b"ing":
        return (n - 3, True) if _has_vowel(w, n - 3) else (n, False)
    return n, False


def _step1b2(w: bytearray, n: int) -> int:
    rule = _STEP1B2.get(w[n - 2]) if n >= 2 else None
    if rule is not None and n > 2 and w[n - 2 : n] == rule[0]:
        w[n - 2 : n] = rule[1]
        return n + 1
    c = w[n - 1]
    if n >= 2 and not _is_vowel(c, False) and c not in b"lsz" and c == w[n - 2]:
        return n - 1
    if _m_eq1(w, n) and _o_star(w, n):
        w[n:n] = b"e"
        return n + 1
    return n


def _step4(w: bytearray, n: int) -> int:
    for suffix in _STEP4.get(w[n - 2], ()) if n >= 2 else ():
        k = len(suffix)
        if n > k and w[n - k : n] == suffix:
            test = _m_gt1_s_or_t if suffix == b"ion" else _m_gt1
            return n - k if test(w, n - k) else n
    return n


@lru_cache(maxsize=65_536)
def stem(word: str) -> str:
    """The Porter stem of a lower-cased word, as SQLite FTS5's ``porter`` tokenizer makes
    it (words of fewer than 3 or more than 64 UTF-8 bytes are returned as they are)."""
    raw = word.encode("utf-8", "surrogatepass")
    n = len(raw)
    if n < 3 or n > _MAX_TOKEN:
        return word
    w = bytearray(raw)
    n = _step1a(w, n)
    n, stripped = _step1b(w, n)
    del w[n:]
    if stripped:
        n = _step1b2(w, n)
    del w[n:]
    if n >= 1 and w[n - 1] == _Y and _has_vowel(w, n - 1):
        w[n - 1] = ord("i")
    if n >= 2:
        n = _replace(w, n, _STEP2.get(w[n - 2], ()))
        del w[n:]
    if n >= 2:
        n = _replace(w, n, _STEP3.get(w[n - 2], ()))
        del w[n:]
    n = _step4(w, n)
    del w[n:]
    if (
        n >= 1
        and w[n - 1] == ord("e")
        and (_m_gt1(w, n - 1) or (_m_eq1(w, n - 1) and not _o_star(w, n - 1)))
    ):
        n -= 1
    if n > 1 and w[n - 1] == ord("l") and w[n - 2] == ord("l") and _m_gt1(w, n - 1):
        n -= 1
    return bytes(w[:n]).decode("utf-8", "surrogatepass")


_STOP_TEXT = """
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its
itself just let me more most my myself no nor not now of off on once only or other ought our
ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself yourselves
s t d ll m re ve y don didn doesn isn wasn weren aren hasn haven hadn won wouldn shouldn
couldn mustn ok okay yes yeah please thanks thank tell told say said remember recall
"""
STOP_WORDS = frozenset(_STOP_TEXT.split())
"""Words a recall query leaves out while it has others: English function words and the
words of asking to remember ("what did I tell you about ..."), which say nothing about
which turn is meant."""
