"""Extract the device-side assert sites of PyTorch's CUDA sources: the text each site prints.

Rebuild tests/data/pytorch_assert_sites.json from a PyTorch checkout (every directory that holds
CUDA kernels is scanned; see ``SCANNED``)::

    python tests/data/extract_assert_sites.py --tree ~/pytorch > sites.json
    python tests/data/extract_assert_sites.py --git ~/pytorch/.git <rev> > sites.json

``--file OWNER/REPO@COMMIT:PATH=LOCAL`` reads one file from a copy saved as LOCAL (a fork's
current version of a file when the whole current tree cannot be had): its sites name
``OWNER/REPO@COMMIT`` as their commit (the earlier list's entries of that file stay, for the
texts older releases print). A LOCAL named ``*.excerpt`` holds only the functions with device
asserts, copied verbatim from that file: its sites record ``"excerpt": true`` and no line.
``--headers <torch>/include <commit>`` scans the headers an installed wheel ships (the current
release's .cuh/.h without a checkout);
``--keep sites.json`` carries over the entries of an earlier list whose file the new sources do
not hold (transcribed sites, older eras), so that one list can join several sources, each entry
naming the commit it came from.

What each macro prints (c10's Macros.h, torch/headeronly/macros/Macros.h since 2.9):
``CUDA_KERNEL_ASSERT(cond)`` and ``CUDA_KERNEL_ASSERT_VERBOSE(cond, ...)`` (without
C10_ENABLE_VERBOSE_ASSERT, as in the wheels) print ``#cond``; ``CUDA_KERNEL_ASSERT_MSG(cond,
msg)`` prints ``msg``; ``CUDA_KERNEL_ASSERT_PRINTF(cond, msg, ...)`` prints ``#cond`` (after a
``[CUDA_KERNEL_ASSERT]`` line with the message); ``TORCH_DSA_KERNEL_ASSERT`` (c10/cuda's
device-side assertions) reports ``#cond``. The preprocessor's stringification turns each run of
white space into one space. ``_assert_async(cond, "msg")`` callers (C++ in aten, Python in
torch/) fail inside TensorCompare.cu's ``_assert_async_cuda_kernel`` and print their message;
aten's message-less ``at::_assert_async(cond)`` calls print an empty condition.

A check written inside a function-like macro (Loss.cu's ``CHECK_INDEX_IN_CLASS(INDEX, N_CLASSES)``)
prints the condition with the arguments of each use substituted (``t >= 0 && t < n_classes``),
in the function of that use: one site per use, none for the ``#define`` itself.

The enclosing function is the name the device prints: the innermost function around the site,
or ``operator()`` inside a lambda (TensorIterator kernels).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

# Where PyTorch keeps CUDA kernels and their shared headers.
SCANNED = (
    "aten/src/ATen/native/cuda/",
    "aten/src/ATen/native/sparse/cuda/",
    "aten/src/ATen/native/sparse/",
    "aten/src/ATen/native/transformers/cuda/",
    "aten/src/ATen/native/quantized/cuda/",
    "aten/src/ATen/native/nested/cuda/",
    "aten/src/ATen/cuda/",
    "aten/src/THC/",
    "aten/src/THCUNN/",
    "c10/cuda/",
    "c10/core/",
    "c10/util/",
    "torch/csrc/distributed/c10d/",
)
# Tests and the macros' own definitions are no sites a user meets.
SKIPPED = re.compile(r"/test/|/tests/|Macros\.h$|CUDADeviceAssertion\.h$|hipify")
KERNEL_SUFFIXES = (".cu", ".cuh", ".h", ".hpp")
# Host sources and Python that call _assert_async with a message.
CALLER_SUFFIXES = (".cpp", ".py")
# A saved copy of only the functions that hold device asserts (a file too long to save whole,
# read with the code index page by page): the sites' texts and functions are the file's, its
# line numbers are not.
EXCERPT_SUFFIX = ".excerpt"

_MACROS = re.compile(
    r"\b(CUDA_KERNEL_ASSERT(?:_MSG|_PRINTF|_VERBOSE)?|TORCH_DSA_KERNEL_ASSERT)\s*\("
)
_ASSERT_ASYNC = re.compile(r"\b_assert_async(?:\.msg)?\s*\(")
_KEYWORDS = {
    *("if", "for", "while", "switch", "catch", "return", "sizeof", "defined", "else", "do"),
    "constexpr",
}


def _arguments(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose "(" is at ``start - 1``."""
    depth, quote, args, current = 1, "", [], []
    escaped = False
    for char in text[start:]:
        if quote:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(current))
                return [a.strip() for a in args]
        elif char == "," and depth == 1:
            args.append("".join(current))
            current = []
            continue
        current.append(char)
    return []


def _stringify(code: str) -> str:
    """What ``#code`` gives: runs of white space outside string literals become one space."""
    out = []
    for token in re.split(r'("(?:[^"\\]|\\.)*")', code):
        out.append(token if token.startswith('"') else re.sub(r"\s+", " ", token))
    return "".join(out).strip()


def _literal(code: str) -> str:
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', code)).encode().decode("unicode_escape")


def _blank_comments_and_strings(text: str) -> str:
    """The text with comments and literal contents replaced by spaces (newlines kept), so that
    braces and parentheses can be counted; offsets stay those of the original."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return pattern.sub(blank, text)


_FUNCTION_HEAD = re.compile(r"(~?[A-Za-z_]\w*|operator\s*\(\s*\))\s*\((?P<params>.*)\)", re.S)


def _scope_name(head: str) -> str | None:
    """The function a ``{`` opens, from the code before it: ``operator()`` for a lambda, the
    function's name for a definition, None for a block, class, namespace or loop macro."""
    head = re.sub(r"\s+", " ", head).strip()
    head = re.sub(r"^#[^\n]*", "", head)
    # "[&] GPU_LAMBDA (...) -> T", "[=] C10_DEVICE (int i)", "[] __device__ (...)".
    if re.search(r"\[[^\[\]]*\]\s*(?:[A-Za-z_]\w*\s*)*(?:\(|->|$)", head):
        return "operator()"
    if re.match(r"^(?:namespace|struct|class|union|enum)\b", head) or "=" in head.split("(")[0]:
        return None
    head = re.sub(r"\b(?:const|override|noexcept|final|volatile)\b|->\s*[\w:<>,\s*&]+$", "", head)
    head = head.strip()
    if not head.endswith(")"):
        return None
    # The name in front of the outermost parameter list.
    depth = 0
    for index in range(len(head) - 1, -1, -1):
        if head[index] == ")":
            depth += 1
        elif head[index] == "(":
            depth -= 1
            if depth == 0:
                before = head[:index].rstrip()
                match = re.search(r"(~?[A-Za-z_]\w*|operator\s*\(\s*\))$", before)
                if not match:
                    return None
                name = re.sub(r"\s+", "", match.group(1))
                # Loop macros (CUDA_KERNEL_LOOP, FOR_KERNEL_LOOP) and control statements.
                if name in _KEYWORDS or name.isupper():
                    return None
                return name
    return None


def _enclosing_functions(text: str) -> Iterator[tuple[int, str | None]]:
    """(offset of each "{", the function it opens or the one around it) in order."""
    code = _blank_comments_and_strings(text)
    stack: list[str | None] = []
    last_stop = 0
    for index, char in enumerate(code):
        if char == "{":
            name = _scope_name(code[last_stop:index])
            outer = next((n for n in reversed(stack) if n), None)
            stack.append(name)
            yield index, name or outer
            last_stop = index + 1
        elif char == "}":
            if stack:
                stack.pop()
            outer = next((n for n in reversed(stack) if n), None)
            yield index, outer
            last_stop = index + 1
        elif char == ";" or (char == "\n" and code[last_stop:index].lstrip().startswith("#")):
            last_stop = index + 1


def _function_at(scopes: list[tuple[int, str | None]], offset: int) -> str | None:
    current = None
    for at, name in scopes:
        if at > offset:
            break
        current = name
    return current


# A function-like macro's #define with its continuation lines (offsets into the blanked code).
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)(?:[^\n]*\\\n)*[^\n]*", re.M)


def _macro_uses(text: str, code: str, define: re.Match[str], printed: str) -> list[tuple[int, str]]:
    """(offset, condition) for each use of the macro ``define`` outside #define lines: the
    condition ``printed`` with the macro's parameters replaced by that use's arguments."""
    name, params = define.group(1), [p.strip() for p in define.group(2).split(",")]
    uses = []
    for use in re.finditer(rf"\b{name}\s*\(", code):
        line_start = code.rfind("\n", 0, use.start()) + 1
        in_define = define.start() <= use.start() < define.end()
        if in_define or code[line_start : use.start()].lstrip().startswith("#"):
            continue
        args = _arguments(text, use.end())
        if len(args) != len(params):
            continue
        uses.append((use.start(), _substitute(printed, dict(zip(params, args, strict=True)))))
    return uses


def _substitute(condition: str, by_name: dict[str, str]) -> str:
    """``condition`` with each parameter name (outside string literals) replaced by its
    argument, as the preprocessor does before the inner macro stringifies it."""
    out = []
    for token in re.split(r'("(?:[^"\\]|\\.)*")', condition):
        if not token.startswith('"'):
            token = re.sub(r"\b\w+\b", lambda m: _stringify(by_name.get(m[0], m[0])), token)
        out.append(token)
    return "".join(out)


def sites(text: str, path: str) -> list[dict[str, object]]:
    """The assert sites of one source file's text."""
    found: list[dict[str, object]] = []
    name = path.rsplit("/", 1)[-1]
    code = _blank_comments_and_strings(text)
    scopes: list[tuple[int, str | None]] | None = None
    kernel_source = path.endswith(KERNEL_SUFFIXES)
    defines = list(_DEFINE.finditer(code))
    for match in _MACROS.finditer(code) if kernel_source else ():
        line_start = code.rfind("\n", 0, match.start()) + 1
        if code[line_start : match.start()].lstrip().startswith("#"):
            continue  # the macro's own #define, or an #undef
        args = _arguments(text, match.end())
        if not args:
            continue
        macro = match.group(1)
        printed = _literal(args[1]) if macro == "CUDA_KERNEL_ASSERT_MSG" else _stringify(args[0])
        if macro == "CUDA_KERNEL_ASSERT_MSG" and not printed:
            printed = ""  # a runtime message (_assert_async's): printed as the caller gives it
        scopes = scopes if scopes is not None else list(_enclosing_functions(text))
        define = next((d for d in defines if d.start() < match.start() < d.end()), None)
        # In a function-like macro's body: one site per use of the macro, with its arguments.
        uses = _macro_uses(text, code, define, printed) if define else [(match.start(), printed)]
        for at, condition in uses:
            found.append(
                {
                    "file": name,
                    "path": path,
                    "line": text.count("\n", 0, at) + 1,
                    "function": _function_at(scopes, at),
                    "macro": macro,
                    "printed": condition,
                }
            )
    if "_assert_async" in text and not path.endswith("TensorCompare.cu"):
        for match in _ASSERT_ASYNC.finditer(code):
            args = _arguments(text, match.end())
            if not args or (len(args) > 1 and '"' not in args[1]):
                continue  # a message built at run time: the generic site covers it
            if len(args) == 1 and path.endswith(".py"):
                continue  # Python's message-less calls are the user's own kind of check
            found.append(
                {
                    "file": "TensorCompare.cu",
                    "path": "aten/src/ATen/native/cuda/TensorCompare.cu",
                    "caller": f"{path}:{text.count(chr(10), 0, match.start()) + 1}",
                    "function": "_assert_async_cuda_kernel",
                    # PyTorch's own message-less checks (index_put_ bounds, CTC lengths)
                    # print an empty condition.
                    "macro": "_assert_async.msg" if len(args) > 1 else "_assert_async",
                    "printed": _literal(args[1]) if len(args) > 1 else "",
                }
            )
    return found


def _scanned(path: str) -> bool:
    """A kernel directory's file, or a host source or Python module that may call _assert_async
    (a wheel's torch/include is read with --headers, under the source tree's paths)."""
    if SKIPPED.search(path) or path.startswith("torch/include/"):
        return False
    return path.startswith(SCANNED) or (
        path.endswith(CALLER_SUFFIXES) and path.startswith(("aten/src/ATen/native/", "torch/"))
    )


def from_tree(root: Path) -> Iterable[tuple[str, str]]:
    for file in sorted(root.rglob("*")):
        rel = file.relative_to(root).as_posix()
        if file.is_file() and rel.endswith(KERNEL_SUFFIXES + CALLER_SUFFIXES) and _scanned(rel):
            text = file.read_text(errors="replace")
            if "ASSERT" in text or "_assert_async" in text:
                yield rel, text


def from_git(git_dir: str, rev: str) -> Iterable[tuple[str, str]]:
    names = subprocess.run(
        ["git", "--git-dir", git_dir, "grep", "-l", "-E", "KERNEL_ASSERT|_assert_async", rev],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    for entry in names:
        rel = entry.split(":", 1)[1]
        if rel.endswith(KERNEL_SUFFIXES + CALLER_SUFFIXES) and _scanned(rel):
            blob = subprocess.run(
                ["git", "--git-dir", git_dir, "show", f"{rev}:{rel}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            yield rel, blob


def from_headers(include: Path) -> Iterable[tuple[str, str]]:
    """A wheel's include/ directory, under the paths the headers have in the source tree."""
    for file in sorted(include.rglob("*")):
        if file.is_file() and file.suffix in (".h", ".cuh"):
            rel = file.relative_to(include).as_posix()
            rel = f"aten/src/{rel}" if rel.startswith("ATen/") else rel
            text = file.read_text(errors="replace")
            if "KERNEL_ASSERT" in text and not SKIPPED.search(rel):
                yield rel, text


def git_commit(git_dir: str, rev: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()


def main(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", nargs=2, metavar=("ROOT", "COMMIT"), action="append", default=[])
    parser.add_argument(
        "--headers", nargs=2, metavar=("INCLUDE", "COMMIT"), action="append", default=[]
    )
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="OWNER/REPO@COMMIT:PATH=LOCAL",
        help="one file's copy (a fork's current version), saved as LOCAL",
    )
    parser.add_argument("--keep", help="an earlier list whose entries carry over")
    parser.add_argument(
        "--git",
        nargs=2,
        metavar=("GIT_DIR", "REV"),
        action="append",
        default=[],
        help="an older era's sources, after the kept entries",
    )
    parser.add_argument("--about", default="")
    args = parser.parse_args(argv)
    earlier = json.loads(Path(args.keep).read_text()) if args.keep else {"sites": []}
    # A hand-added note (the cause a site must name, where it was seen) stays with its site.
    notes = {
        (site["path"], site["printed"]): {k: site[k] for k in ("cause", "seen") if k in site}
        for site in earlier["sites"]
    }

    def scan(files: Iterable[tuple[str, str]], commit: str) -> list[dict[str, object]]:
        found = []
        for rel, text in files:
            for site in sites(text, rel):
                site["commit"] = commit
                site.update(notes.get((site["path"], site["printed"]), {}))
                found.append(site)
        return found

    entries: list[dict[str, object]] = []
    for root, commit in args.tree:
        entries += scan(from_tree(Path(root)), commit)
    for include, commit in args.headers:
        entries += scan(from_headers(Path(include)), commit)
    current = {site["path"] for site in entries if "caller" not in site}
    # A newer source of a file replaces what an earlier list holds of it; a single file's copy
    # goes in front of them instead: the texts older releases print stay, and the copy's own
    # entries win the de-duplication below.
    for spec in args.file:
        source, local = spec.rsplit("=", 1)
        commit, rel = source.split(":", 1)
        text = Path(local).read_text(errors="replace")
        found = [{**site, "source": source} for site in scan([(rel, text)], commit)]
        if local.endswith(EXCERPT_SUFFIX):
            # An excerpt's line numbers are its own, not the file's: none is recorded.
            found = [{**site, "line": None, "excerpt": True} for site in found]
        entries = found + entries
    entries += [site for site in earlier["sites"] if site["path"] not in current]
    for git_dir, rev in args.git:
        entries += scan(from_git(git_dir, rev), git_commit(git_dir, rev))
    # The same text printed by the same function of the same file is one site, whatever the era
    # (the first source given wins: the newest).
    seen: set[tuple[object, ...]] = set()
    unique = []
    for site in entries:
        key = (site["path"], site.get("function"), site["printed"], site.get("caller"))
        if key not in seen:
            seen.add(key)
            unique.append(site)
    kept = {key: value for key, value in earlier.items() if key not in ("about", "sites")}
    return {"about": args.about or earlier.get("about", ""), "sites": unique, **kept}


if __name__ == "__main__":
    json.dump(main(sys.argv[1:]), sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
