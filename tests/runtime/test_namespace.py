"""A notebook namespace's names and values, read incrementally at every cell
(runtime/namespace.py): by the replay's record (the user's names) and by a guard (all but
IPython's numbered history)."""

from __future__ import annotations

from nb_cudaguard.runtime.namespace import NamespaceNames, getter, not_history


def test_the_numbered_history_is_left_out():
    op = object()
    namespace = {"_i1": "x = 1", "_i": "", "_ii": "", "_iii": "", "_1": op, "_": op, "g": op}
    names, values = NamespaceNames(not_history).read(namespace)
    assert list(names) == ["_", "g"]  # in the namespace's order
    assert values == (op, op)


def test_names_added_deleted_and_bound_again_between_looks_are_seen():
    namespace: dict = {"a": 1, "_i1": "a = 1"}
    space = NamespaceNames(not_history)

    def values() -> tuple:
        return space.read(namespace)[1]

    assert values() == (1,)
    namespace.update({"_i2": "b = 2", "b": 2, "_2": 2})
    assert values() == (1, 2)
    del namespace["a"]  # the count says a key went: all read again
    assert values() == (2,)
    namespace["a"] = 3  # back, at the end
    assert values() == (2, 3)
    del namespace["b"]
    namespace["c"] = 4  # one went and one came: the same count
    assert values() == (3, 4)
    namespace["c"] = 5  # bound again: read anew
    assert values() == (3, 5)
    namespace.clear()
    assert values() == ()


def test_renamed_says_when_the_wanted_names_changed():
    space = NamespaceNames(lambda name: not name.startswith("_"))
    namespace: dict = {"x": 1}
    space.read(namespace)
    assert space.renamed
    space.renamed = False
    namespace["_i2"] = "y"  # not wanted: the names are the same
    space.read(namespace)
    assert not space.renamed
    namespace["y"] = 2
    assert list(space.read(namespace)[0]) == ["x", "y"] and space.renamed


def test_values_alone_raise_where_the_count_cannot_tell_and_read_mends_it():
    namespace: dict = {"a": 1, "b": 2, "c": 3}
    space = NamespaceNames(not_history)
    assert space.values(namespace) == (1, 2, 3)
    del namespace["a"], namespace["c"]
    namespace.update(d=4, c=5)  # the same count, and the last key one seen before
    try:
        space.values(namespace)
    except KeyError:
        pass
    else:
        raise AssertionError("a KeyError was expected")
    names, values = space.read(namespace)
    assert (list(names), values) == (["b", "d", "c"], (2, 4, 5))


def test_a_getter_gives_a_tuple_for_any_count():
    mapping = {"a": 1, "b": 2}
    assert getter([])(mapping) == ()
    assert getter(["b"])(mapping) == (2,)
    assert getter(["b", "a"])(mapping) == (2, 1)
