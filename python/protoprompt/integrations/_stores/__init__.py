"""What a session keeps beside its history, in the same engine: one history store per engine
(``_store``; ``_sqlalchemy_store``, ``_redis_store``, their ``_servers`` and ``_io`` loop;
what the three share in ``_store_base`` and ``_store_types``),
which part of the index still describes the rows (``_sync``), index snapshots
(``_snapshots``), the stored cache-stable prefixes (``_prefix_state``, ``_turn_state``) and
rolling summaries (``_summary_stores``). Imports the ``_calls`` and ``_sdk`` rooms."""
