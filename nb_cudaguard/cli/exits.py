"""The exit statuses every subcommand shares, and the user mistake that ends in status 2."""

from __future__ import annotations

# Exit statuses, documented in docs/cli.md.
OK = 0  # explain: a CUDA error was recognised; run: every cell succeeded
NOT_FOUND_OR_FAILED = 1  # explain: the text holds no CUDA error; run: a cell failed
USAGE = 2  # bad arguments, an unreadable file, a kernel that cannot start
CLOSED_PIPE = 141  # the reader of stdout went away (`| head`): 128 + SIGPIPE, as a shell reports


class UsageFailure(Exception):
    """A user mistake or an unreadable input: one line on stderr, exit status 2."""
