"""Reaching a PostgreSQL server: the driver's imports, the URL as libpq takes it (and
redacted for people), and its errors as :class:`~protoprompt.errors.MemoryStoreError`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import MemoryStoreError


def redact(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` parameter)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user, _, host = netloc.rpartition("@")
            netloc = user.split(":", 1)[0] + ":***@" + host
        query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "postgresql://(unparsable URL)"


def driver_url(url: str) -> str:
    """``url`` as libpq takes it: SQLAlchemy's ``postgresql+<driver>://`` scheme without
    the driver."""
    scheme, rest = url.split("://", 1)
    return scheme.split("+", 1)[0].lower() + "://" + rest


@contextmanager
def database_errors() -> Iterator[None]:
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        raise MemoryStoreError(f"PostgreSQL: {exc}".rstrip()) from exc


def imports() -> tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ImportError(
            "MemoryStore on PostgreSQL needs psycopg 3 and psycopg_pool: "
            "pip install 'protoprompt[postgres]'"
        ) from exc
    return psycopg, psycopg_pool


# --------------------------------------------------------------------------- backend
