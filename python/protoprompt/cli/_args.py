"""The ``protoprompt`` command's vocabulary: its errors, the types of its arguments (each
refusal one line naming the argument) and its argument parser."""

from __future__ import annotations

import argparse
from typing import NoReturn

from ._text import terminal_safe

PROG = "protoprompt"


class CommandError(Exception):
    """A user-facing error: printed as ``protoprompt <command>: error: ...``, exit 1."""


class UsageError(CommandError):
    """A combination of options that is refused: printed like a :class:`CommandError`,
    exit 2."""


TOKEN_ENV = "PROTOPROMPT_MCP_TOKEN"
"""Where ``protoprompt mcp`` reads its bearer token when ``--auth-token`` is not given."""


def whole_number(text: str, least: int, rule: str, most: int, what: str) -> int:
    """``text`` as an int in ``[least, most]`` (``rule`` and ``what`` say so in the error)."""
    digits = text.strip().removeprefix("+").removeprefix("-")
    if not digits.isascii() or not digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a whole number, got {terminal_safe(repr(text[:40]))}"
            + ("…" if len(text) > 40 else "")
        )
    if len(digits.lstrip("0")) > len(str(most)):  # never converts thousands of digits
        raise argparse.ArgumentTypeError(f"{what} is at most {most}, got {len(digits)} digits")
    value = int(text)
    if value < least:
        raise argparse.ArgumentTypeError(f"{rule}, got {value}")
    if value > most:
        raise argparse.ArgumentTypeError(f"{what} is at most {most}, got {value}")
    return value


MAX_TOKENS = 2**64 - 1
"""Largest token count the core takes."""
MAX_ROWS = 2**63 - 1
"""Largest row count SQLite takes."""


def positive(text: str) -> int:
    return whole_number(text, 1, "must be at least 1", MAX_TOKENS, "a token count")


def non_negative(text: str) -> int:
    return whole_number(text, 0, "must be 0 or more", MAX_TOKENS, "a token count")


def row_count(text: str) -> int:
    return whole_number(text, 1, "must be at least 1", MAX_ROWS, "a row count")


def mask_excerpt(text: str) -> int:
    return whole_number(text, 16, "must be at least 16", MAX_TOKENS, "a token count")


def port(text: str) -> int:
    return whole_number(text, 0, "must be 0 or more", 65535, "a TCP port")


def text_arg(text: str) -> str:
    """A text argument: valid Unicode (bytes that are not UTF-8 come in as lone surrogates)."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: {terminal_safe(repr(text[:40]))}")
    return text


def name_arg(text: str) -> str:
    """A name (session id, scope part, host, table): valid Unicode without control
    characters."""
    text = text_arg(text)
    if terminal_safe(text) != text:
        raise argparse.ArgumentTypeError(
            f"control characters are not allowed: {terminal_safe(repr(text[:40]))}"
        )
    return text


def http_path(text: str) -> str:
    text = name_arg(text)
    if not text.startswith("/") or not text.isascii() or " " in text:
        raise argparse.ArgumentTypeError(f"an HTTP path starts with '/' (ASCII), got {text!r}")
    return text


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the argument (and where
    to read more), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            f"{self.prog}: error: {terminal_safe(message)} (see '{self.prog} --help')\n",
        )


def add_tokenizer(parser: argparse.ArgumentParser, what: str) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--model", metavar="M", help=f"model whose tokenizer {what} (gpt-5, gpt-4o, gpt-4…)"
    )
    group.add_argument(
        "--encoding",
        metavar="E",
        help="tokenizer by name (o200k_base, cl100k_base…); default o200k_base",
    )


class InspectError(Exception):
    """The database or session cannot be inspected (the message says why)."""
