"""Text the command prints: what comes from a database or a file is made safe for a
terminal, and JSON is read with its failures named.

A session id, a message or a tool's output stored by whatever wrote the database may hold
terminal control sequences (ESC ``[31m``, an OSC title change ending in BEL, a bidi
override that reorders what is shown). :func:`terminal_safe` writes every such character
as a visible escape (``\\x1b``, ``\\u202e``) so the text is shown, never obeyed. ``--json``
output needs nothing: JSON escapes control characters itself.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["JsonReadError", "read_json", "terminal_safe"]

_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _unsafe(c: str) -> bool:
    o = ord(c)
    return o < 0x20 or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF or c in _BIDI


def terminal_safe(text: str) -> str:
    """``text`` with control characters (C0, DEL, C1), lone surrogates and bidi controls
    written as escapes (``\\x1b``, ``\\n``, ``\\u202e``, ``\\udc80``)."""
    if not any(_unsafe(c) for c in text):
        return text
    out = []
    for c in text:
        if not _unsafe(c):
            out.append(c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) <= 0xFF:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\u{ord(c):04x}")
    return "".join(out)


class JsonReadError(ValueError):
    """Text that is JSON but cannot be read (too deep, a number too long): the message
    says which."""


def read_json(text: str | bytes) -> Any:
    """``json.loads(text)``, with the failures that are not syntax errors named: nesting
    deeper than Python's recursion allows, an integer longer than Python converts, bytes
    that are not UTF-8. A syntax error stays a ``json.JSONDecodeError``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise JsonReadError(
            f"JSON nested deeper than can be read (about {sys.getrecursionlimit()} levels)"
        ) from None
    except UnicodeDecodeError as exc:
        raise JsonReadError(f"not UTF-8 (byte {exc.start})") from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string ..."
        if "digits" in str(exc):
            limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
            raise JsonReadError(f"a JSON number with more than {limit} digits") from None
        raise JsonReadError(str(exc)) from None
