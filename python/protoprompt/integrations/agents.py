"""OpenAI Agents SDK integration: :class:`ProtoPromptSession` and its budgeted input callback.

The session stores history exactly like the SDK's own sessions (it delegates to
``SQLiteSession`` or to any session you pass). Its :meth:`ProtoPromptSession.input_callback`
makes every request fit the token budget and puts recalled memory in front of it::

    session = ProtoPromptSession("legal-chat", "agents.db")
    callback = session.input_callback(builder, system_prompt="Use recalled contract facts.")
    await Runner.run(agent, "When does it renew?", session=session,
                     run_config=RunConfig(session_input_callback=callback))

Why the session and the callback are a pair: the SDK persists every item the callback
returns that it cannot match to the history or the new input (docs/item-graph.md §9.3), so
the recalled context message would be written to the session on every turn. In a run, the
callback adds the message object to the history list the runner handed it (§9.3 rule 2:
the SDK builds its reference lists after the callback returns), so the SDK takes it for
history and never asks any session to store it — also through a wrapper such as
``EncryptedSession(ProtoPromptSession(...))``, which would hand it over encrypted. Called
directly, the callback registers the message instead and :meth:`add_items` keeps it out of
storage (matched by identity, else by role and text, each produced message consumed once).
The model still receives it. Everything else is stored unchanged.

This module is the public face of the integration; the code lives in
:mod:`protoprompt.integrations.session` and the private modules it names.
"""

from __future__ import annotations

# Imports the SDK first: without it, the ImportError names the extra to install.
from ._sdk import _names  # noqa: F401
from .session import Item as Item
from .session import ProtoPromptSession, SessionInputCallback

__all__ = ["ProtoPromptSession", "SessionInputCallback"]
