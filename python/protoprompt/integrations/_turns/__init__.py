"""A session's turn and the session object's parts: the run hooks (``_run_hooks``), one turn of
the session callback (``_turn``), its reads (``_reads``, ``_window``), context messages
(``_context``), evictions (``_evicted``), the optional hooks (``_hooks``), the options
(``_options``) and debug state (``_debug``). Imports every other room; only the public
modules of ``protoprompt.integrations`` import it."""
