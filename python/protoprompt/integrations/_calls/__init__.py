"""One model call: what it sends besides its input (``_request``, ``_agent``), the shapes of
its input (``_steps``), which run it belongs to (``_runs``), its oversized newest step
(``_oversized``), its plan (``_call_plan``) and the cache-stable prefix both hooks share
(``_planner``). Imports the ``_sdk`` room only."""
