"""``pp.truncate_text``: a text cut to a token limit, exactly, with a marker saying how much
was removed (the per-call filter and recall cut outputs with it)."""

from __future__ import annotations

import pytest

import protoprompt as pp

# ~42k tokens of table rows: a tool output far over any limit below.
TABLE = "\n".join(f"row {i}: " + " ".join(f"v{i}_{j}" for j in range(12)) for i in range(700))


def test_truncate_text_is_token_exact() -> None:
    for limit in (0, 1, 10, 50, 500, 5_000):
        cut = pp.truncate_text(TABLE, limit)
        assert pp.count_tokens(cut) <= limit
        if limit >= 50:
            assert cut.startswith("row 0:") and "tokens removed by protoprompt" in cut
    assert pp.truncate_text("short", 10) == "short"
    with pytest.raises(ValueError):
        pp.truncate_text("x", -1)
    with pytest.raises(ValueError, match="removed"):
        pp.truncate_text("x", 5, marker="[cut]")
