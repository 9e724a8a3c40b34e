"""Exception classes of protoprompt.

Every error is a :class:`ProtoPromptError` and also subclasses the builtin exception a
caller would naturally catch (``ValueError`` for bad input and budget overflows), so
``except ValueError`` keeps working.  This module imports nothing from the native core;
the core imports these classes (PyO3 ``import_exception!``) when it is loaded and raises
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = [
    "BudgetUnderestimateWarning",
    "ConflictingArgumentsError",
    "HistoryMismatchError",
    "InvalidItemError",
    "InvalidNewInputError",
    "MemoryStoreError",
    "ProtoPromptError",
    "ProtoPromptWarning",
    "SnapshotError",
    "TokenBudgetExceededError",
    "TokenizerError",
    "UnbudgetedSessionWarning",
    "UnknownEncodingError",
    "UnknownModelError",
]


def renamed(owner: str, old: str, new: str) -> None:
    """Warn that ``owner.old`` is now ``owner.new`` (the old name is kept until 1.1)."""
    import warnings

    warnings.warn(
        f"{owner}.{old} is now called {owner}.{new} (the old name is kept until 1.1)",
        DeprecationWarning,
        stacklevel=3,
    )


class ProtoPromptError(Exception):
    """Base class of every protoprompt error."""


class MemoryStoreError(ProtoPromptError, RuntimeError):
    """A :class:`~protoprompt.memory.MemoryStore` on PostgreSQL could not do what was asked:
    the server cannot be reached, refused the login, or failed the statement; or the database
    holds memory tables of a schema version this protoprompt does not know. The driver's own
    exception (``psycopg.Error``) is the ``__cause__``. Nothing is changed by a call that
    raises it. (A store on SQLite raises ``sqlite3.Error`` as it always did.)"""


class TokenBudgetExceededError(ProtoPromptError, ValueError):
    """The mandatory part of a request does not fit the token budget.

    Nothing is sent when this is raised: the request would have been oversized.

    Attributes:
        used: tokens the mandatory part needs (new input, tail dependency, output
            reserve and fixed context together).
        max_tokens: the token budget (``budget``: its old name, an alias until 1.1).
        section: the section at which the running total passed the budget, one of
            ``"new_input"``, ``"dependency"``, ``"output_reserve"``, ``"context"``
            (and ``"system_prompt"`` when raised by the context builder). A per-call model
            filter also names ``"instructions_and_tools"`` (the agent's instructions and
            tool definitions), ``"tool_output"`` (a tool output of the newest step) and
            ``"step"`` (the newest model output itself); so does a session's callback for
            the agent's instructions, tools and output schema (``run_config(agent=...)``).
        detail: what overflowed, for a person (e.g. which tool output and call), or ``""``.
    """

    PLAN_SECTIONS: ClassVar[dict[str, str]] = {
        "new_input": "run_input",
        "dependency": "kept_history",
        "output_reserve": "output_reserve",
        "context": "context_message",
        "system_prompt": "context_message",
        "instructions_and_tools": "instructions",
        "tool_output": "newest_step",
        "step": "newest_step",
    }
    """Each ``section`` by the name the plans give it (``protoprompt.plan.SECTIONS``; the
    glossary of docs/reading-a-plan.md). ``dependency``: the stored items the run input
    answers, which are sent with it; ``instructions_and_tools``: the instructions, tool
    definitions and output schema, named by the first."""

    def __init__(self, used: int, budget: int, section: str, detail: str = "") -> None:
        self.used = int(used)
        self.max_tokens = int(budget)
        self.section = str(section)
        self.detail = str(detail)
        super().__init__(used, budget, section)

    @property
    def budget(self) -> int:
        """:attr:`max_tokens` by its old name (an alias until 1.1; a ``DeprecationWarning``)."""
        renamed(type(self).__name__, "budget", "max_tokens")
        return self.max_tokens

    @property
    def plan_section(self) -> str:
        """:attr:`section` in the plans' vocabulary (:attr:`PLAN_SECTIONS`; an unknown
        section as it is)."""
        return self.PLAN_SECTIONS.get(self.section, self.section)

    def __str__(self) -> str:
        return (
            f"mandatory input needs {self.used} tokens but the budget is {self.max_tokens} "
            f"(overflowed at section {self.section!r}"
            + (f": {self.detail}" if self.detail else "")
            + "); nothing was sent"
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # keep the attributes through pickling
        return (type(self), (self.used, self.max_tokens, self.section, self.detail))


class InvalidItemError(ProtoPromptError, ValueError, TypeError):
    """An item is malformed: not a mapping, a non-string id, a non-JSON value, NaN, or
    nesting that is too deep.

    Attributes:
        location: which item, e.g. ``"history[3]"`` or ``"new_input[0]"``.
        field: the field path inside the item, e.g. ``"call_id"`` or ``"content[0].text"``.
    """

    def __init__(self, message: str, location: str = "", field: str = "") -> None:
        self.location = location
        self.field = field
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.location, self.field))


class InvalidNewInputError(ProtoPromptError, ValueError):
    """``new_input`` cannot be sent as given: e.g. a leading tool output whose call is not in
    the history, a misplaced ``compaction_trigger``, or a dependency that is itself invalid.

    Attributes:
        location: the offending new-input item, e.g. ``"new_input[0]"``.
        reasons: the rule violations, as sentences.
    """

    def __init__(self, message: str, location: str = "", reasons: Sequence[str] = ()) -> None:
        self.location = location
        self.reasons = list(reasons)
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.location, self.reasons))


class ConflictingArgumentsError(ProtoPromptError, TypeError, ValueError):
    """Two arguments of a call say the same thing: ``max_tokens`` and its old name
    ``budget``, or an ``options`` value and the keywords it replaces. Pass one of them."""


class UnknownModelError(ProtoPromptError, ValueError):
    """No tokenizer is known for a model name; pass ``encoding=`` explicitly."""

    def __init__(self, message: str, model: str = "") -> None:
        self.model = model
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.model))


class UnknownEncodingError(ProtoPromptError, ValueError):
    """The encoding name is not one that protoprompt ships."""

    def __init__(self, message: str, encoding: str = "") -> None:
        self.encoding = encoding
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.encoding))


class SnapshotError(ProtoPromptError, ValueError):
    """An index snapshot cannot be loaded: damaged, not a snapshot, or written by another
    version of protoprompt (whose item rules may differ). Nothing was loaded; rebuild the
    index from the history instead."""


class HistoryMismatchError(ProtoPromptError, ValueError):
    """The history given to :meth:`HistoryIndex.pack <protoprompt.HistoryIndex.pack>` is
    shorter than what the index has already seen: items were removed or rewritten. Call
    :meth:`~protoprompt.HistoryIndex.truncate` or :meth:`~protoprompt.HistoryIndex.clear`
    first. Nothing was changed.

    Attributes:
        history_len: items in the history given.
        indexed: items the index holds.
    """

    def __init__(self, message: str, history_len: int = 0, indexed: int = 0) -> None:
        self.history_len = int(history_len)
        self.indexed = int(indexed)
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.history_len, self.indexed))


class TokenizerError(ProtoPromptError, ValueError):
    """The tokenizer failed on a text (an internal failure of the BPE, reported instead of
    crashing the process). Inside :func:`~protoprompt.pack` the message starts with the item
    whose text it was (e.g. ``"history[3]: tokenizer failed: ..."``); the item itself is not
    at fault, so this is not an :class:`InvalidItemError`."""


class ProtoPromptWarning(UserWarning):
    """Base class of every protoprompt warning."""


class BudgetUnderestimateWarning(ProtoPromptWarning, RuntimeWarning):
    """The provider counted more input tokens for a model call than protoprompt estimated:
    the budget was not conservative for that call (see
    :class:`~protoprompt.integrations.BudgetAudit`). ``estimate``, ``reported`` and ``model``
    say by how much, and for which model."""

    def __init__(self, message: str, estimate: int = 0, reported: int = 0, model: str = "") -> None:
        super().__init__(message)
        self.estimate = estimate
        self.reported = reported
        self.model = model

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.estimate, self.reported, self.model))


class UnbudgetedSessionWarning(ProtoPromptWarning):
    """A :class:`~protoprompt.integrations.ProtoPromptSession` was run by the Agents SDK
    without a budget: the run has no ``session_input_callback`` (``Runner.run(...,
    session=session)`` without ``run_config=session.run_config(...)``), so the whole stored
    history went to the model, however long. Issued once per session object, at the
    runner's read of its history; ``session_id`` names the session."""

    def __init__(self, message: str, session_id: str = "") -> None:
        super().__init__(message)
        self.session_id = session_id

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.session_id))
