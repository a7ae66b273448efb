"""What a guard reads of a namespace for ops bound by name, at each start and end: not IPython's
numbered history, which grows at every cell (input_guard/entries.py over runtime/namespace.py,
whose own tests are tests/runtime/test_namespace.py)."""

from __future__ import annotations

import torch

import nb_cudaguard


def test_a_long_sessions_namespace_gets_its_ops_checked_and_put_back():
    # ``%cudacheck on`` guards each cell with the notebook's namespace: thousands of ``_i<N>``
    # between the names; an op bound before a guard names the wrapper inside it and torch's op
    # after, and one bound inside the guard names torch's op after it, cells later as at first.
    gather, take = torch.gather, torch.take
    namespace: dict = {f"_i{n}": "x = 1" for n in range(3000)}
    namespace["early"] = gather
    for cell in range(3):
        with nb_cudaguard.guard(namespace=namespace):
            assert namespace["early"] is not gather  # the wrapper, checked
            assert namespace["early"].__wrapped__ is gather
            namespace[f"inside{cell}"] = torch.take  # ``from torch import take`` in the cell
            assert namespace[f"inside{cell}"] is not take
        assert namespace["early"] is gather
        assert namespace[f"inside{cell}"] is take
        namespace.update({f"_i{3000 + 2 * cell + k}": "y = 2" for k in range(2)})


def test_a_namespace_changed_while_it_is_read_is_read_whole():
    # Another thread adding a name as a guard reads the namespace: the read stops with the
    # dict's own RuntimeError, and the guard falls back to every value (one C call).
    gather = torch.gather

    class Growing(dict):
        def __reversed__(self):
            keys = super().__reversed__()

            def changed_midway():
                for key in keys:
                    yield key
                    self.setdefault("late", gather)  # as a thread would, mid-read

            return changed_midway()

    namespace = Growing(early=gather, other=1)
    with nb_cudaguard.guard(namespace=namespace):
        assert namespace["early"] is not gather  # checked all the same
        assert namespace["late"] is not gather
    assert namespace["early"] is gather and namespace["late"] is gather
