"""Where an asynchronous CUDA error surfaced, and where it was most likely launched.

A bad kernel launched in cell 5 is reported at the next call PyTorch checks, often an operation
that cannot assert itself (``.item()``, ``print(t)``, ``.to()``, ``.cpu()``), sometimes in a later
cell (PyTorch's "CUDA kernel errors might be asynchronously reported at some other API call",
c10/cuda/CUDAMiscFunctions.cpp). Pure: the caller hands in which cells launched CUDA work.
"""

from __future__ import annotations

import ast
import linecache
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from .classify import classify_line, logical_lines

# The calls where an earlier kernel's error typically surfaces, by name: copies and syncs only.
_COPY_OR_SYNC = frozenset(
    {"item", "cpu", "to", "tolist", "numpy", "detach", "copy_", "synchronize", "save"}
    | {"print", "repr", "str", "float", "int", "bool", "display"}
)


def last_launching_cell(launched: Mapping[int, bool], before: int | None = None) -> int | None:
    """The newest cell (before ``before``) that launched CUDA work."""
    cells = [c for c, did in launched.items() if did and (before is None or c < before)]
    return max(cells) if cells else None


def _launching(launched: Mapping[int, bool], queued: Collection[int], cell: int) -> str:
    """``cell [cell]``, and where ``cell`` counts only for work still queued at its end (which
    may be an earlier cell's), the launching cell before it too."""
    if cell not in queued:
        return f"cell [{cell}]"
    earlier = last_launching_cell(launched, before=cell)
    return f"cell [{cell}]" if earlier is None else f"cell [{cell}] or in cell [{earlier}]"


def surfaced_at(error: BaseException) -> str | None:
    """The source line of the innermost user frame of the traceback (cell code, not libraries)."""
    tb = error.__traceback__
    line_text: str | None = None
    while tb is not None:
        code = tb.tb_frame.f_code
        filename = code.co_filename
        # Cells are compiled from "<ipython-input-..>" or ipykernel's temp files.
        if filename.startswith("<") or "ipykernel_" in filename or "/ipykernel" in filename:
            text = linecache.getline(filename, tb.tb_lineno).strip()
            line_text = text or line_text
        tb = tb.tb_next
    return line_text


def _only_copies_or_waits(line: str) -> bool:
    """Every call on the line copies or waits (``print(loss.item())``). One more call can launch
    the failing kernel itself (``criterion(out, y.to(device))``, ``x.gather(1, i.to(device))``),
    and a line that is part of a longer statement cannot be judged alone: neither is innocent."""
    try:
        tree = ast.parse(line)
    except SyntaxError:
        return False
    names = [
        call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
    ]
    return bool(names) and all(name in _COPY_OR_SYNC for name in names)


def where_sentence(
    error: BaseException,
    cell: int | None,
    launched: Mapping[int, bool],
    *,
    synced: bool = False,
    queued: Collection[int] = (),
) -> str | None:
    """Where the error surfaced and where it was most likely launched, or None if unclear.

    ``launched`` says, per execution count, whether that cell launched CUDA work; ``queued``,
    the cells it says so of only because work was still queued at their end; ``synced``, that
    the error was raised by the end-of-cell synchronise of ``cell``.
    """
    if synced:
        return (
            f"It surfaced at the end-of-cell synchronise of cell [{cell}] (%cudaguard sync on), "
            "so the failing kernel was launched by this cell."
        )
    line = surfaced_at(error)
    here = f"cell [{cell}]" if cell is not None else "this cell"
    own = launched.get(cell) if cell is not None else None
    earlier = last_launching_cell(launched, before=cell)
    innocent = line is not None and _only_copies_or_waits(line)
    if own is False and earlier is not None:
        launching = _launching(launched, queued, earlier)
        return (
            f"It surfaced in {here} at `{line}`, in a cell that did no CUDA work of its own: "
            f"the failing kernel was most likely launched in {launching}, the last cell that "
            "launched CUDA work."
        )
    if innocent:
        tail = f" or in {_launching(launched, queued, earlier)}" if earlier is not None else ""
        return (
            f"It surfaced in {here} at `{line}`, an operation that only copies or waits and "
            f"cannot assert: the failing kernel was launched earlier, in this cell{tail}."
        )
    return None


# --- where, read from a text (a log, a pasted traceback) -----------------------------------------
@dataclass
class TextFrame:
    """One frame of a traceback as printed."""

    file: str  # as printed: a path, or a notebook cell ("Cell In[5]", "<ipython-input-5-...>")
    line: int | None
    cell: int | None = None  # a notebook cell's execution count
    code: str | None = None  # the frame's source line, where printed
    numbered: bool = False  # IPython's style: the source comes as numbered lines, "---> 4 code"

    @property
    def is_user_code(self) -> bool:
        return self.cell is not None or _LIBRARY.search(self.file) is None

    @property
    def in_notebook(self) -> bool:
        """A notebook cell's frame (ipykernel compiles cells to ``ipykernel_<pid>/<n>.py``)."""
        return self.cell is not None or _KERNEL_CELL_FILE.search(self.file) is not None

    @property
    def place(self) -> str:
        if self.cell is not None:
            return f"cell [{self.cell}]" + (f", line {self.line}" if self.line else "")
        name = re.split(r"[/\\]", self.file)[-1]
        return f"{name}, line {self.line}" if self.line else name


# Where a traceback can start (plain substrings: a pattern costs 100x more on a long log).
_FRAME_MARKS = (
    "Traceback (most recent", "Original Traceback", "File ", "Cell In", "Input In",
    "<ipython-input-", ".py in ",
)  # fmt: skip
_TRACEBACK_START = re.compile(r"Traceback \(most recent call last\)|Original Traceback")
# Python: '  File "train.py", line 88, in <module>', then the source line (and 3.11's ^^^^).
_PY_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
# IPython >= 8: "Cell In[5], line 4", "Input In [5], in <cell line: 4>()" (8.0-8.5), and
# "File ~/site-packages/torch/_tensor.py:522, in Tensor.backward(...)"; IPython 7:
# "<ipython-input-5-1a2b3c> in <module>" and "/path/x.py in f(a, b)". Then numbered source
# lines, the frame's own marked "---> 4 code".
_CELL_FRAME = re.compile(r"^\s*(?:Cell|Input) In ?\[(?P<cell>\d+)\](?:, line (?P<line>\d+))?")
_IPY_FRAME = re.compile(r'^\s*File (?P<file>[^"\s][^"]*?):(?P<line>\d+)(?:, in |$)')
_OLD_FRAME = re.compile(r"^(?P<file><ipython-input-(?P<cell>\d+)-\w+>|[^\s<]\S*\.py) in \S")
_KERNEL_CELL_FILE = re.compile(r"[/\\]ipykernel_\d+[/\\]\d+\.py$")
_ARROW = re.compile(r"^\s*-+>\s*(?P<line>\d+)\s(?P<code>.*)$")
_NUMBERED = re.compile(r"^\s+\d+\s")
_MARKERS = re.compile(r"^[\s^~]+$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:: |:$|$)")  # "torch.AcceleratorError: ..."
# Libraries and the interpreter's own files: never the user's line. Nor a launcher's console
# script ("/opt/conda/bin/torchrun", line 8, in <module>: sys.exit(main())), which pip writes
# into bin/ (Scripts\<name>.exe\__main__.py on Windows) and which runs no CUDA of its own.
_LIBRARY = re.compile(
    r"site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]Lib[/\\]|^<frozen |^<string>$"
    r"|[/\\]torch[/\\]|[/\\]bin[/\\][\w.+-]+(?<!\.py)$|\.exe[/\\]__main__\.py$",
    re.IGNORECASE,
)


def _frame(line: str) -> TextFrame | None:
    if match := _PY_FRAME.match(line):
        return TextFrame(match["file"], int(match["line"]))
    if match := _CELL_FRAME.match(line):
        number, count = match["line"], int(match["cell"])
        return TextFrame(f"Cell In[{count}]", int(number) if number else None, count, numbered=True)
    if match := _IPY_FRAME.match(line):
        return TextFrame(match["file"], int(match["line"]), numbered=True)
    if match := _OLD_FRAME.match(line):
        old_cell = match["cell"]
        return TextFrame(match["file"], None, int(old_cell) if old_cell else None, numbered=True)
    return None


def text_tracebacks(text: str) -> list[tuple[list[TextFrame], str]]:
    """Each traceback in ``text`` (log prefixes and colours removed): its frames, outermost
    first, and the first line after them (the exception's, where printed)."""
    blocks: list[tuple[list[TextFrame], str]] = []
    frames: list[TextFrame] | None = None

    def close(after: str) -> None:
        nonlocal frames
        if frames:
            blocks.append((frames, after))
        frames = None

    # A long log's lines before the first mark cannot hold a frame.
    first = min((at for at in map(text.find, _FRAME_MARKS) if at >= 0), default=-1)
    if first < 0:
        return blocks
    for line, _source in logical_lines(text[text.rfind("\n", 0, first) + 1 :]):
        if _TRACEBACK_START.search(line):
            close("")
            frames = []
            continue
        frame = _frame(line)
        if frame is not None:
            frames = [*(frames or []), frame]
            continue
        if not frames:
            continue
        last = frames[-1]
        if last.numbered:
            arrow = _ARROW.match(line)
            if arrow:
                last.code = last.code or arrow["code"].strip() or None
                last.line = last.line or int(arrow["line"])
                continue
            if _NUMBERED.match(line) or line[:1].isspace():
                continue
        elif _MARKERS.match(line):
            continue
        elif last.code is None and (line[:1].isspace() or not _EXCEPTION.match(line)):
            # The frame's source line; a logger's prefix may have taken its indentation.
            last.code = line.strip()
            continue
        elif line[:1].isspace():
            continue
        close(line.strip())
    close("")
    return blocks


def failing_frames(text: str) -> list[TextFrame]:
    """The frames of the traceback that raised the text's CUDA error (the last traceback whose
    exception line is a CUDA error; else the last one)."""
    blocks = text_tracebacks(text)
    for frames, after in reversed(blocks):
        if after and classify_line(after) is not None:
            return frames
    return blocks[-1][0] if blocks else []


def where_in_text(text: str) -> str | None:
    """Where a log's or a pasted traceback's CUDA error surfaced: its last frame in the user's
    code (a notebook cell or a script, not a library)."""
    user = [frame for frame in failing_frames(text) if frame.is_user_code]
    if not user:
        return None
    frame = user[-1]
    if frame.code is None:
        return f"It surfaced in {frame.place}."
    if _only_copies_or_waits(frame.code):
        return (
            f"It surfaced at `{frame.code}` ({frame.place}), an operation that only copies or "
            "waits and cannot assert: the failing kernel was launched earlier."
        )
    return (
        f"It surfaced at `{frame.code}` ({frame.place}): the failing kernel was launched there "
        "or earlier."
    )
