"""The docs stay whole: every relative link lands, and the README and docs/ say what the code does.

The README is short and points into docs/; these tests keep the split from drifting: a moved or
renamed heading breaks a link, a cause id or a magic option added without its line is missed, and
the README's test command stays the one CI runs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import ROOT

import nb_cudaguard

PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
# [text](target) and ![alt](target); the text may span lines, the target has no spaces
_LINK = re.compile(r"\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced blocks and code spans, where brackets are code, not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: markup dropped, lower case, punctuation removed, spaces to
    hyphens (so "`%cudaguard repro` — on CPU" becomes "cudaguard-repro--on-cpu")."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[`*]|<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = github_anchor(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(prose(page.read_text(encoding="utf-8")))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_link_finder_sees_links_and_skips_code() -> None:
    text = "See [a](docs/a.md#x), ![pic\nof it](p.png) and `x[i](j)`.\n```\n[b](c.md)\n```\n"
    assert _LINK.findall(prose(text)) == ["docs/a.md#x", "p.png"]
    assert github_anchor("The failing op on CPU: `%cudaguard repro`") == (
        "the-failing-op-on-cpu-cudaguard-repro"
    )
    assert github_anchor("`nb-cudaguard run NOTEBOOK -o OUT.ipynb`") == (
        "nb-cudaguard-run-notebook--o-outipynb"
    )


def test_there_are_docs_pages_and_the_readme_links_each() -> None:
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = {Path(t.split("#")[0]).name for t in relative_links(ROOT / "README.md")}
    assert docs and docs <= linked, f"docs pages the README does not link: {docs - linked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or ROOT not in (file, *file.parents):
            broken.append(f"{target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def fenced_commands(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [
        line
        for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
        for line in block.splitlines()
    ]


def steps(command: str) -> list[list[str]]:
    """A shell line as its ``&&`` steps, each a token list; pip's -q (quiet) is not a difference."""
    return [[t for t in shlex.split(step) if t != "-q"] for step in command.split("&&")]


def test_the_readme_test_command_is_what_ci_runs() -> None:
    (readme,) = [c for c in fenced_commands(ROOT / "README.md") if "pytest" in c]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_lines = ci.split("# --- the README's test command", 1)[1].splitlines()[1:]
    ci_command = " && ".join(line for line in ci_lines if line.strip() and not line.startswith("#"))
    assert steps(readme) == steps(ci_command)


def test_the_readme_demo_command_names_what_exists() -> None:
    (demo,) = [c for c in fenced_commands(ROOT / "README.md") if "demo_notebooks/run.py" in c]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '-e ".[demo]"' in demo and re.search(r"^demo = \[", pyproject, re.M)
    assert (ROOT / "demo_notebooks" / "run.py").is_file()


def test_every_cause_id_has_its_row_in_the_cause_table() -> None:
    page = (ROOT / "docs" / "panel.md").read_text(encoding="utf-8")
    table = page.split("## Cause ids", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \|", table, re.M)
    assert sorted(rows) == sorted(nb_cudaguard.CAUSES)


def magic_words(method: object) -> set[str]:
    """The option strings and fixed choices a magic's argument parser accepts."""
    words: set[str] = set()
    for action in method.parser._actions:  # type: ignore[attr-defined]
        words.update(o for o in action.option_strings if o.startswith("--") and o != "--help")
        words.update(action.choices or ())
    return words


def test_the_readme_usage_table_names_every_magic_command_and_option() -> None:
    from nb_cudaguard.notebook.cudacheck_magic import CudaCheckMagics
    from nb_cudaguard.notebook.cudaguard_magic import CudaGuardMagics

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Use", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split(" | ", 1)[0] for line in table.splitlines() if line.startswith("| `")]
    missing = {
        f"%{name} {word}"
        for name, method in (
            ("cudacheck", CudaCheckMagics.cudacheck),
            ("cudaguard", CudaGuardMagics.cudaguard),
        )
        for word in magic_words(method)
        if not any(
            re.search(rf"`%%?{name}\b", cell) and re.search(rf"(?<![\w-]){word}(?![\w-])", cell)
            for cell in first_cells
        )
    }
    assert not missing, f"not in the README's usage table: {sorted(missing)}"
