"""The OpenAI Agents SDK seam: its names imported once (``_names``), the version probes
of its stack frames and code objects (``_probes``), calls into the inner session
(``_shims``), posing as an ``SQLiteSession`` (``_posing``) and the warning for a session
used without a budget (``_unbudgeted``). Imports nothing of the other rooms."""
