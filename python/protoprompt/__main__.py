"""``python -m protoprompt``: the ``protoprompt`` command (see :mod:`protoprompt.cli`)."""

import sys

from .cli import main

sys.exit(main())
