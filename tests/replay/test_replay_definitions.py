"""A replayed cell's class/def of a kept name binds the kept one at once: the tree transform alone,
then through a real IPython shell's AST transformers."""

from __future__ import annotations

import ast
import traceback

from nb_cudaguard.replay.definitions import HOLDER, KeptDefinitions


def _run(source: str, kept: dict[str, object], names: tuple[str, ...]) -> dict[str, object]:
    tree = KeptDefinitions(names).visit(ast.parse(source))
    namespace: dict[str, object] = {HOLDER: kept}
    exec(compile(tree, "<cell>", "exec"), namespace)
    return namespace


class Tok:
    def __init__(self, n: int) -> None:
        self.n = n


CELL = """\
class Tok:
    def __init__(self, n):
        self.n = n
tok = Tok(3)
if True:
    def make(n):
        return Tok(n)
    made = [make(i) for i in range(2)]
"""


def test_what_the_cell_makes_is_of_the_kept_class():
    ns = _run(CELL, {"Tok": Tok}, ("Tok",))
    assert ns["Tok"] is Tok
    assert type(ns["tok"]) is Tok
    assert all(type(t) is Tok for t in ns["made"])  # type: ignore[attr-defined]


def test_a_def_inside_a_top_level_block_binds_the_kept_one():
    def make(n: int) -> str:
        return f"kept {n}"

    ns = _run(CELL, {"make": make}, ("make",))
    assert ns["make"] is make and ns["made"] == ["kept 0", "kept 1"]
    assert type(ns["tok"]) is not Tok  # Tok was not kept: the cell's own


def test_other_names_and_nested_definitions_are_left_alone():
    source = "def outer():\n    class Tok:\n        pass\n    return Tok\ninner = outer()\n"
    ns = _run(source, {"Tok": Tok}, ("Tok",))
    assert ns["inner"] is not Tok and "Tok" not in ns


def test_line_numbers_of_the_cell_stay_as_typed():
    source = "class Tok:\n    pass\nx = 1\nraise ValueError('line 4')\n"
    try:
        _run(source, {"Tok": Tok}, ("Tok",))
    except ValueError as e:
        assert traceback.extract_tb(e.__traceback__)[-1].lineno == 4
    else:
        raise AssertionError("the cell did not raise")
