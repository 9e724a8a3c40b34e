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

Under an estimate encoding (``claude_estimate``: Claude's tokenizer is not public) the error
is in every token, so the factor scales the whole cost of every item instead
(``docs/models.md``): a sample per model call of ``(reported - rest) / items``, with
``items`` the request's items by the estimate (unscaled) and ``rest`` its instructions, tools
and context message; the factor is the largest of the 32 most recent samples plus 1/16, in
steps of 1/16, between 0.5 (the ``o200k_base`` count itself) and 2. Until 3 samples are known
it only ever raises the estimate: one call the provider counted above it is enough to be more
careful, not one below it to be less. A sample above 2 (the provider counted more than twice
the estimate: the call was not what the estimate saw) is refused and logged, never learned.
Which factor a model has follows the encoding it is counted under (its own by default): the
rows of the two kinds are kept apart (``"v": 1`` opaque, ``"v": 2`` estimate), and a row of
the other kind reads as none.

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
from ._storage.dialect import SQLITE
from ._storage.tables import SQLiteTable, Table
from ._tokens import ESTIMATED_ENCODINGS

__all__ = ["Calibration", "CalibrationState"]

_log = logging.getLogger("protoprompt")

_ROWS = SQLiteTable(
    Table("protoprompt_calibration", key=("model", "text"), key_constraint="PRIMARY KEY",
          columns=(("samples", "text"), ("mac", "blob")))
)  # fmt: skip
_TABLE = _ROWS.table.name
_CREATE = _ROWS.table.create(SQLITE)[0]
_SECRET_ROW = "calibration_secret"
_VERSION = 1
_ESTIMATE_VERSION = 2
"""Rows of an estimate's whole-cost samples (a protoprompt that knows only ``v: 1`` ignores
them)."""
MAX_SAMPLES: int = _core.CALIBRATION_MAX_SAMPLES
"""Most recent samples kept per model."""


@dataclass(frozen=True)
class CalibrationState:
    """What a :class:`Calibration` knows of one model."""

    model: str
    samples: tuple[float, ...]
    """The most recent samples, oldest first (factors of the rule's opaque tokens)."""
    opaque_scale: float
    """The learned factor (1.0: none): of the opaque part, or with :attr:`estimate` of the
    whole cost."""
    estimate: bool = False
    """The model is counted under an estimate (``claude_estimate``): the factor scales the
    whole cost of every item, not only opaque payloads."""

    def explain(self) -> str:
        if self.estimate:
            return self._explain_estimate()
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

    def _explain_estimate(self) -> str:
        n = len(self.samples)
        if not n:
            return (
                f"calibration {self.model}: the estimate as it is (no call of this model "
                "reported by the provider yet)"
            )
        sure = f"from {n} call{'s' if n != 1 else ''}" + (
            f"; {3 - n} more before it may lower the estimate" if n < 3 else ""
        )
        return (
            f"calibration {self.model}: the estimate at x{self.opaque_scale:g}, learned from "
            f"the provider's counts ({sure}; largest sample {max(self.samples):.3f})"
        )


def _is_sample(value: object, whole: bool = False) -> bool:
    lo, hi = (
        (_core.ESTIMATE_SCALE_MIN, _core.ESTIMATE_SAMPLE_CAP)
        if whole
        else (_core.OPAQUE_SCALE_MIN, _core.OPAQUE_SCALE_MAX)
    )
    return type(value) is float and math.isfinite(value) and lo <= value <= hi


def _whole(model: str, encoding: str | None) -> bool:
    """Whether ``model`` counted under ``encoding`` (default: its own) is an estimate."""
    if encoding is None:
        try:
            encoding = _core.encoding_for_model(model)
        except Exception:  # noqa: BLE001 - an unknown model is counted by a given encoding
            return False
    return encoding in ESTIMATED_ENCODINGS


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
        self._memory: dict[tuple[str, bool], tuple[float, ...]] = {}
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

    def _decode(
        self, model: str, row: tuple[object, ...] | None, whole: bool = False
    ) -> tuple[float, ...]:
        """The samples of a stored row, or none for a row that does not check out (or is of
        the other kind)."""
        if row is None:
            return ()
        _, text, mac = row
        if type(text) is not str or type(mac) is not bytes or mac != self._mac(model, text):
            _log.debug("protoprompt calibration: damaged row for %r ignored", model)
            return ()
        try:
            data = json.loads(text)
        except ValueError:
            return ()
        version = _ESTIMATE_VERSION if whole else _VERSION
        if not isinstance(data, dict) or data.get("v") != version:
            return ()
        samples = data.get("samples")
        if not isinstance(samples, list) or len(samples) > MAX_SAMPLES:
            return ()
        if not all(_is_sample(s, whole) for s in samples):
            return ()
        return tuple(samples)

    def _read(self, conn: sqlite3.Connection, model: str, whole: bool = False) -> tuple[float, ...]:
        try:
            rows = _ROWS.get_many(conn, [model])
        except sqlite3.Error as exc:
            _log.debug("protoprompt calibration: read failed: %s", exc)
            return ()
        return self._decode(model, rows[0] if rows else None, whole)

    def samples(self, model: str, *, encoding: str | None = None) -> tuple[float, ...]:
        """The samples known for ``model`` counted under ``encoding`` (default: the
        model's own), oldest first."""
        _check_model(model)
        whole = _whole(model, encoding)
        if self.path is None:
            with self._lock:
                return self._memory.get((model, whole), ())
        try:
            with self._connect() as conn:
                return self._read(conn, model, whole)
        except sqlite3.Error as exc:
            _log.debug("protoprompt calibration: read failed: %s", exc)
            return ()

    def state(self, model: str, *, encoding: str | None = None) -> CalibrationState:
        """What is known of ``model`` counted under ``encoding`` (default: the model's
        own): its samples and the factor learned from them."""
        whole = _whole(model, encoding)
        samples = self.samples(model, encoding=encoding)
        scale = _core.learned_scale(list(samples), whole=whole)
        return CalibrationState(model, samples, scale, estimate=whole)

    def opaque_scale(self, model: str, *, encoding: str | None = None) -> float:
        """The factor of item costs for ``model`` (1.0 uncalibrated): of their opaque
        part, or of their whole cost under an estimate (see the module notes)."""
        return self.state(model, encoding=encoding).opaque_scale

    def observe(
        self,
        model: str,
        *,
        estimate: int,
        opaque: int,
        opaque_scale: float,
        reported: int,
        encoding: str | None = None,
    ) -> float | None:
        """Learn from one model call: the request was estimated at ``estimate`` tokens with
        the opaque part (``opaque`` tokens by the rule) at ``opaque_scale``, and the provider
        reported ``reported`` input tokens. Under an estimate ``encoding`` (default: the
        model's own) ``opaque`` is the tokens of the request's items by the estimate
        (unscaled) and ``opaque_scale`` the factor of their whole cost. Returns the sample, or
        ``None`` when the call carried too few tokens to tell, or gave a sample above the cap
        (logged, not learned). A write that fails loses the sample only."""
        _check_model(model)
        for name, value in (("estimate", estimate), ("opaque", opaque), ("reported", reported)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        whole = _whole(model, encoding)
        sample, wild = _core.calibration_sample(
            estimate, opaque, opaque_scale, reported, whole=whole
        )
        if wild is not None:
            _log.warning(
                "protoprompt calibration: %r: the provider counted %d input tokens for a "
                "call estimated at %d (x%.2f of its items, above the cap of x%g): not learned",
                model,
                reported,
                estimate,
                wild,
                _core.ESTIMATE_SAMPLE_CAP,
            )
        if sample is None:
            return None
        if self.path is None:
            with self._lock:
                key = (model, whole)
                self._memory[key] = (*self._memory.get(key, ()), sample)[-MAX_SAMPLES:]
            return sample
        try:
            with self._connect() as conn, conn:
                conn.execute("BEGIN IMMEDIATE")
                samples = (*self._read(conn, model, whole), sample)[-MAX_SAMPLES:]
                version = _ESTIMATE_VERSION if whole else _VERSION
                text = json.dumps({"v": version, "samples": list(samples)})
                _ROWS.put_many(conn, [(model, text, self._mac(model, text))])
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
                    self._memory.pop((model, False), None)
                    self._memory.pop((model, True), None)
            return
        with self._connect() as conn, conn:
            _ROWS.delete(conn, None if model is None else [model])

    def __repr__(self) -> str:
        return f"<Calibration {self.path or 'in memory'}>"


def _check_model(model: str) -> None:
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty str, got {model!r}")
