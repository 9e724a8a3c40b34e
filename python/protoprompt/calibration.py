"""Calibration of opaque payload costs from the provider's own input-token counts.

Opaque payloads (the base64 ``encrypted_content`` of reasoning and compaction items) are
costed by their decoded size, an estimate (see ``docs/cost-model.md``). The provider's
``usage.input_tokens`` for a model call is the truth for that call. A :class:`Calibration`
learns, per model, the factor of the opaque part that past requests' counts allow, and
keeps it in a SQLite database (table ``protoprompt_calibration``; a
:class:`~protoprompt.integrations.ProtoPromptSession` offers one in its own database as
``session.calibration``). Pass it to :class:`~protoprompt.TokenBudgetedContextBuilder`
(``calibration=``), and a :class:`~protoprompt.integrations.BudgetAudit` wired to that
builder feeds it.

The learning rule is the core's (``protoprompt_core::calibration``): a sample per model call
that carried at least 256 opaque tokens, ``(reported - rest) / opaque`` where ``rest`` is the
conservative estimate of everything else; the factor is the largest of the 32 most recent
samples plus 1/16, in steps of 1/16, between 0.25 and 2; 1 (the rule) until 3 samples are
known. Text, media and overhead are never scaled.

Rows are checked when read (a version, types and bounds, and a keyed hash under a secret kept
in ``protoprompt_meta``): a damaged, retyped or foreign row is ignored — the model is then
uncalibrated, which is the conservative rule — and the next observation replaces it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from . import _core
from ._meta import meta_value
from ._process import sqlite_gate

__all__ = ["Calibration", "CalibrationState"]

_log = logging.getLogger("protoprompt")

_TABLE = "protoprompt_calibration"
_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {_TABLE} "
    "(model TEXT PRIMARY KEY, samples TEXT NOT NULL, mac BLOB NOT NULL)"
)
_SECRET_ROW = "calibration_secret"
_VERSION = 1
MAX_SAMPLES: int = _core.CALIBRATION_MAX_SAMPLES
"""Most recent samples kept per model."""


@dataclass(frozen=True)
class CalibrationState:
    """What a :class:`Calibration` knows of one model."""

    model: str
    samples: tuple[float, ...]
    """The most recent samples, oldest first (factors of the rule's opaque tokens)."""
    opaque_scale: float
    """The learned factor of the opaque part (1.0: the decoded-size rule itself)."""

    def explain(self) -> str:
        if self.opaque_scale == 1.0:
            return (
                f"calibration {self.model}: opaque payloads at the decoded-size rule "
                f"({len(self.samples)} of 3 samples needed)"
                if len(self.samples) < 3
                else f"calibration {self.model}: opaque payloads at the decoded-size rule "
                f"(from {len(self.samples)} calls)"
            )
        return (
            f"calibration {self.model}: opaque payloads at x{self.opaque_scale:g} of the "
            f"decoded-size rule, learned from {len(self.samples)} calls (largest sample "
            f"{max(self.samples):.3f})"
        )


def _is_sample(value: object) -> bool:
    return (
        type(value) is float
        and math.isfinite(value)
        and _core.OPAQUE_SCALE_MIN <= value <= _core.OPAQUE_SCALE_MAX
    )


class Calibration:
    """Per-model calibration of opaque payload costs, kept in a SQLite database.

    Args:
        path: the database file (created if missing); ``None`` keeps the calibration in this
            object only.

    Several processes may share one database: each observation is a short transaction
    that reads the model's samples, adds one and writes them back.

    Raises:
        sqlite3.Error: the database cannot be opened or its tables created.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        if self.path == ":memory:":
            self.path = None
        self._lock = threading.Lock()
        self._memory: dict[str, tuple[float, ...]] = {}
        self._secret = secrets.token_bytes(16)
        if self.path is not None:
            with self._connect() as conn:
                value = meta_value(
                    conn, _SECRET_ROW, lambda: secrets.token_hex(16), [(_TABLE, _CREATE)]
                )
            try:
                self._secret = bytes.fromhex(value or "")
            except ValueError:
                self._secret = b""
            if len(self._secret) != 16:
                raise sqlite3.DatabaseError(
                    f"protoprompt_meta.{_SECRET_ROW} in {self.path} is not 16 hex-encoded bytes"
                )

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        assert self.path is not None
        with sqlite_gate():
            conn = sqlite3.connect(self.path, timeout=5.0)
            try:
                yield conn
            finally:
                conn.close()

    def _mac(self, model: str, text: str) -> bytes:
        data = model.encode("utf-8", "surrogatepass") + b"\0" + text.encode()
        return hashlib.blake2b(data, digest_size=16, key=self._secret).digest()

    def _decode(self, model: str, row: tuple[object, object] | None) -> tuple[float, ...]:
        """The samples of a stored row, or none for a row that does not check out."""
        if row is None:
            return ()
        text, mac = row
        if type(text) is not str or type(mac) is not bytes or mac != self._mac(model, text):
            _log.debug("protoprompt calibration: damaged row for %r ignored", model)
            return ()
        try:
            data = json.loads(text)
        except ValueError:
            return ()
        if not isinstance(data, dict) or data.get("v") != _VERSION:
            return ()
        samples = data.get("samples")
        if not isinstance(samples, list) or len(samples) > MAX_SAMPLES:
            return ()
        if not all(_is_sample(s) for s in samples):
            return ()
        return tuple(samples)

    def _read(self, conn: sqlite3.Connection, model: str) -> tuple[float, ...]:
        try:
            row = conn.execute(
                f"SELECT samples, mac FROM {_TABLE} WHERE model = ?", (model,)
            ).fetchone()
        except sqlite3.Error as exc:
            _log.debug("protoprompt calibration: read failed: %s", exc)
            return ()
        return self._decode(model, row)

    def samples(self, model: str) -> tuple[float, ...]:
        """The samples known for ``model``, oldest first."""
        _check_model(model)
        if self.path is None:
            with self._lock:
                return self._memory.get(model, ())
        try:
            with self._connect() as conn:
                return self._read(conn, model)
        except sqlite3.Error as exc:
            _log.debug("protoprompt calibration: read failed: %s", exc)
            return ()

    def state(self, model: str) -> CalibrationState:
        """What is known of ``model``: its samples and the factor learned from them."""
        samples = self.samples(model)
        return CalibrationState(model, samples, _core.learned_scale(list(samples)))

    def opaque_scale(self, model: str) -> float:
        """The factor of the opaque part of item costs for ``model`` (1.0 uncalibrated)."""
        return self.state(model).opaque_scale

    def observe(
        self, model: str, *, estimate: int, opaque: int, opaque_scale: float, reported: int
    ) -> float | None:
        """Learn from one model call: the request was estimated at ``estimate`` tokens with
        the opaque part (``opaque`` tokens by the rule) at ``opaque_scale``, and the provider
        reported ``reported`` input tokens. Returns the sample, or ``None`` when the call
        carried too few opaque tokens to tell. A write that fails loses the sample only."""
        _check_model(model)
        for name, value in (("estimate", estimate), ("opaque", opaque), ("reported", reported)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        sample = _core.calibration_sample(estimate, opaque, opaque_scale, reported)
        if sample is None:
            return None
        if self.path is None:
            with self._lock:
                self._memory[model] = (*self._memory.get(model, ()), sample)[-MAX_SAMPLES:]
            return sample
        try:
            with self._connect() as conn, conn:
                conn.execute("BEGIN IMMEDIATE")
                samples = (*self._read(conn, model), sample)[-MAX_SAMPLES:]
                text = json.dumps({"v": _VERSION, "samples": list(samples)})
                conn.execute(
                    f"INSERT OR REPLACE INTO {_TABLE} (model, samples, mac) VALUES (?, ?, ?)",
                    (model, text, self._mac(model, text)),
                )
        except sqlite3.Error as exc:
            _log.debug("protoprompt calibration: sample for %r not written: %s", model, exc)
        return sample

    def reset(self, model: str | None = None) -> None:
        """Forget what was learned for ``model`` (every model when ``None``)."""
        if model is not None:
            _check_model(model)
        if self.path is None:
            with self._lock:
                if model is None:
                    self._memory.clear()
                else:
                    self._memory.pop(model, None)
            return
        with self._connect() as conn, conn:
            if model is None:
                conn.execute(f"DELETE FROM {_TABLE}")
            else:
                conn.execute(f"DELETE FROM {_TABLE} WHERE model = ?", (model,))

    def __repr__(self) -> str:
        return f"<Calibration {self.path or 'in memory'}>"


def _check_model(model: str) -> None:
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty str, got {model!r}")
