"""``nb-cudaguard explain FILE|-``: the diagnosis of a log or a traceback."""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from dataclasses import replace
from pathlib import Path

from ..diagnosis.advice import fixes_in_the_logs_names, setting_of_text
from ..diagnosis.engine import diagnose
from ..diagnosis.render import to_text
from ..diagnosis.schema import to_json
from .exits import NOT_FOUND_OR_FAILED, OK, UsageFailure

_MAX_BYTES = 64 * 1024 * 1024  # a log bigger than this is not read whole


def decode_text(data: bytes, name: str) -> str:
    """Text from a log's bytes: UTF-8 (with or without BOM) or BOM-marked UTF-16 (PowerShell's
    `>` writes that); anything else, or NUL bytes, is not a log."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise UsageFailure(f"{name}: not valid UTF-16 text") from None
    if b"\x00" in data:
        raise UsageFailure(f"{name}: a binary file, not a log or a traceback")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageFailure(f"{name}: not UTF-8 text (byte {error.start}); a binary file?") from None


def read_input(file: str) -> str:
    if file == "-":
        return decode_text(sys.stdin.buffer.read(_MAX_BYTES), "stdin")
    path = Path(file)
    try:
        with path.open("rb") as stream:
            data = stream.read(_MAX_BYTES)
    except IsADirectoryError:
        raise UsageFailure(f"{file}: is a directory") from None
    except FileNotFoundError:
        raise UsageFailure(f"{file}: no such file") from None
    except OSError as error:
        raise UsageFailure(f"{file}: cannot read ({error.strerror or error})") from None
    return decode_text(data, file)


def explain(args: argparse.Namespace) -> int:
    # A job of several ranks (a launcher's log, a --log-dir, per-rank records): its verdict.
    from ..ranks.explain import explain_job

    if args.file != "-" and Path(args.file).is_dir():
        found = explain_job(Path(args.file), args.json)
        if found is None:
            raise UsageFailure(f"{args.file}: is a directory with no rank logs or records")
        if found:
            return OK
        if args.json:
            print("null")
        print(f"nb-cudaguard: no CUDA error found in {args.file}.", file=sys.stderr)
        return NOT_FOUND_OR_FAILED
    text = read_input(args.file)
    if explain_job(text, args.json):
        return OK
    diagnosis = diagnose(text)
    if diagnosis is not None:
        # Read outside the kernel: the fixes may name only what the log shows.
        diagnosis = replace(diagnosis, fixes=fixes_in_the_logs_names(diagnosis.fixes, text))
    # Advice in the words of where the text comes from: a script's log, or a notebook's.
    setting = setting_of_text(text) if diagnosis is not None else None
    if args.json:
        payload = to_json(diagnosis, setting) if diagnosis and setting else None
        print(json.dumps(payload, indent=2))
    elif diagnosis is not None and setting is not None:
        print(to_text(diagnosis, setting=setting).lstrip("\n"))
    else:
        name = "stdin" if args.file == "-" else args.file
        print(f"nb-cudaguard: no CUDA error found in {name}.", file=sys.stderr)
    return OK if diagnosis is not None else NOT_FOUND_OR_FAILED
