"""The ``protoprompt`` command: ``demo`` (an offline budgeted session), ``mcp`` (memory
server), ``inspect`` (a stored session's next request) and ``count`` (tokens of text or
items).

``main(argv)`` returns the exit status: 0 on success, 1 when the input cannot be served
(the message on stderr says why), 2 for a usage error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..errors import ProtoPromptError
from ._args import PROG, CommandError, UsageError
from ._args import TOKEN_ENV as TOKEN_ENV
from ._parser import build_parser
from ._text import terminal_safe

__all__ = ["main"]


def _fail(command: str, message: str) -> int:
    print(f"{PROG} {command}: error: {terminal_safe(message)}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``protoprompt`` command with ``argv`` (default ``sys.argv[1:]``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        status: int = args.run(args)
    except UsageError as exc:
        _fail(args.command, str(exc))
        return 2
    except (CommandError, ProtoPromptError) as exc:  # ProtoPromptError: unknown model, encoding
        return _fail(args.command, str(exc))
    except BrokenPipeError:  # `protoprompt inspect ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    return status
