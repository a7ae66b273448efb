"""The ``nb-cudaguard`` argument parser and the exit statuses every subcommand shares."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from .exits import CLOSED_PIPE, OK, USAGE, UsageFailure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nb-cudaguard",
        description="Explain CUDA device-side asserts (and other sticky CUDA errors) outside a "
        "live notebook: in logs, and in notebooks run headless.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    explain = sub.add_parser(
        "explain",
        help="diagnose a log or a traceback",
        description="Diagnose the CUDA error in a log or a traceback. Exit status: 0 a CUDA "
        "error was recognised, 1 the text holds none, 2 bad usage or an unreadable file.",
    )
    explain.add_argument("file", metavar="FILE", help="the log or traceback; - reads stdin")
    explain.add_argument(
        "--json",
        action="store_true",
        help="print the diagnosis as JSON (the schema in docs/panel.md; null when none)",
    )

    run = sub.add_parser(
        "run",
        help="execute a notebook headless with nb_cudaguard loaded",
        description="Execute a notebook headless (nbclient) with nb_cudaguard loaded. On a failure "
        "OUT holds the diagnosis panel under the failing cell and a papermill-style error cell. "
        "Exit status: 0 every cell succeeded, 1 a cell failed, 2 bad usage or no kernel.",
    )
    run.add_argument("notebook", metavar="NOTEBOOK", help="the notebook to run (.ipynb)")
    run.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="where to write the executed notebook"
    )
    run.add_argument(
        "--cudacheck",
        action="store_true",
        help="check the inputs of assert-prone ops in every cell (`%%cudacheck on`)",
    )
    run.add_argument(
        "--blocking-rerun",
        action="store_true",
        help="after a sticky CUDA error, re-run the notebook up to the failing cell in a new "
        "kernel with CUDA_LAUNCH_BLOCKING=1, to report the line that really failed",
    )
    run.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    run.add_argument("--kernel", metavar="NAME", help="kernel name (default: the notebook's)")
    run.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="per-cell time limit (default: none)"
    )
    run.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # bad usage: argparse exits with status 2
    if args.command is None:
        # A bare `nb-cudaguard` asks what the tool does: the help, as `pip` and `docker` answer.
        parser.print_help()
        return OK
    try:
        if args.command == "explain":
            from .explain import explain

            status = explain(args)
        else:
            from .run import run

            status = run(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return status
    except UsageFailure as failure:
        print(f"nb-cudaguard {args.command}: {failure}", file=sys.stderr)
        return USAGE
    except BrokenPipeError:
        # `nb-cudaguard explain log | head -2`: the reader is gone. The Python-documented way
        # out: point stdout at devnull (the flush at exit would fail again) and end quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return CLOSED_PIPE
