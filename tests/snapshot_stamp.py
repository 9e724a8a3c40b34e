"""Restamp an index snapshot stored by an earlier protoprompt with the running crate version.

A snapshot names the protoprompt-core version that wrote it, and the core loads only its own
version's (``rust/core/src/incremental.rs``: releases never share snapshots). The databases
under ``tests/data/`` were written by earlier builds to test that a *layout* still loads (a
snapshot without masked costs); :func:`restamp` rewrites the version field of such a
database's snapshots -- the first field of the payload, a postcard string -- and seals them
again with the core's checksum (SipHash-1-3, 128 bits, keys 0, over the binding hash and
the payload), so the layout test keeps testing the layout after a version bump.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

MAGIC = b"PPINDEX\0"
CHECKED_FROM = len(MAGIC) + 4 + 16
HEADER = CHECKED_FROM + 16
_MASK = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _round(v: list[int]) -> None:
    v[0] = (v[0] + v[1]) & _MASK
    v[1] = _rotl(v[1], 13) ^ v[0]
    v[0] = _rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & _MASK
    v[3] = _rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & _MASK
    v[3] = _rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & _MASK
    v[1] = _rotl(v[1], 17) ^ v[2]
    v[2] = _rotl(v[2], 32)


def siphash13_128(data: bytes) -> bytes:
    """SipHash-1-3 with 128-bit output and zero keys, as the ``siphasher`` crate's
    ``SipHasher13::new().finish128().as_bytes()``."""
    v = [0x736F6D6570736575, 0x646F72616E646F83, 0x6C7967656E657261, 0x7465646279746573]
    full = len(data) - len(data) % 8
    for i in range(0, full, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v[3] ^= m
        _round(v)
        v[0] ^= m
    b = ((len(data) & 0xFF) << 56) | int.from_bytes(data[full:], "little")
    v[3] ^= b
    _round(v)
    v[0] ^= b
    v[2] ^= 0xEE
    for _ in range(3):
        _round(v)
    h1 = v[0] ^ v[1] ^ v[2] ^ v[3]
    v[1] ^= 0xDD
    for _ in range(3):
        _round(v)
    h2 = v[0] ^ v[1] ^ v[2] ^ v[3]
    return h1.to_bytes(8, "little") + h2.to_bytes(8, "little")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, at


def version_of(snapshot: bytes) -> str:
    """The crate version a snapshot names (checking its seal first)."""
    assert snapshot[: len(MAGIC)] == MAGIC, "not an index snapshot"
    assert siphash13_128(snapshot[CHECKED_FROM:]) == snapshot[CHECKED_FROM - 16 : CHECKED_FROM]
    n, at = _read_varint(snapshot, HEADER)
    return snapshot[at : at + n].decode()


def restamped(snapshot: bytes, version: str) -> bytes:
    """``snapshot`` naming ``version``, sealed again."""
    old = version_of(snapshot)
    n, at = _read_varint(snapshot, HEADER)
    assert at + n == HEADER + len(_varint(len(old))) + len(old)
    body = bytearray(snapshot[:HEADER])
    body += _varint(len(version.encode())) + version.encode() + snapshot[at + n :]
    body[CHECKED_FROM - 16 : CHECKED_FROM] = siphash13_128(bytes(body[CHECKED_FROM:]))
    return bytes(body)


def restamp(db: str | Path, version: str) -> list[str]:
    """Rewrite every snapshot of ``db`` (table ``protoprompt_index_snapshots``) to name
    ``version``; the versions they named before."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT rowid, data FROM protoprompt_index_snapshots").fetchall()
        for rowid, data in rows:
            conn.execute(
                "UPDATE protoprompt_index_snapshots SET data = ? WHERE rowid = ?",
                (restamped(bytes(data), version), rowid),
            )
    conn.close()
    return [version_of(bytes(data)) for _, data in rows]
