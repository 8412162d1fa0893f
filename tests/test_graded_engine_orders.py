"""Module 02's engine checks grade the rule, not the reference's walk order.

The lesson allows any reverse topological order ("Any order that visits every
operation before the operations that produced its inputs works"), so a student
may sort the graph first (a depth-first search) instead of using the heap. Such
an engine must still skip an operation that no gradient reached -- a
``backward`` returned ``None`` for its output, as Module 13's checkpointing does
for an input that took no part in the result. A sorted walk that forgets it
raised ``KeyError`` inside ``checkpoint`` and yet earned full marks in Module 02.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import tinytrain as tt
from tinytrain.autograd import _accumulate, _freed_graph_error, _unshared

# importing the graded file outside tests/graded: its `graded` mark is registered by that folder's conftest
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")

GRADED = Path(__file__).resolve().parent / "graded" / "test_02_autograd.py"


def _graded_module():
    spec = importlib.util.spec_from_file_location("graded_02_autograd", GRADED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reverse_topological_order(root):
    """Every operation reachable from ``root``, each before the operations that made its inputs (iterative DFS)."""
    order, seen, todo = [], set(), [(root, False)]
    while todo:
        fn, done = todo.pop()
        if done:
            order.append(fn)
            continue
        if fn in seen:
            continue
        if not hasattr(fn, "inputs"):
            raise _freed_graph_error()
        seen.add(fn)
        todo.append((fn, True))
        todo.extend((t._ctx, False) for t in fn.inputs if t._ctx is not None and t._ctx not in seen)
    return order[::-1]


def sorted_engine(skip_unreached: bool):
    """A student's engine that sorts the graph first; ``skip_unreached=False`` forgets operations no gradient reached."""

    def backward(tensor, grad=None, retain_graph=False):
        owned = grad is None
        grad = tensor._backend.xp.ones_like(tensor.data) if grad is None else tensor._operand(grad).data
        root = tensor._ctx
        pending, mine = {root: grad}, {root: owned}
        for fn in _reverse_topological_order(root):
            if skip_unreached and fn not in pending:
                continue
            if not hasattr(fn, "inputs"):
                raise _freed_graph_error()
            incoming = pending.pop(fn)
            fn.owns_grad = mine.pop(fn)
            results = fn.backward(incoming)
            if not isinstance(results, tuple):
                raise TypeError(f"{type(fn).__name__}.backward must return a tuple, got {type(results).__name__}")
            for t, g in zip(fn.inputs, results):
                if g is None or not t.requires_grad:
                    continue
                alone = not retain_graph and _unshared(g, fn, results, incoming)
                if t._ctx is None:
                    _accumulate(t, g, alone)
                elif t._ctx in pending:
                    pending[t._ctx], mine[t._ctx] = pending[t._ctx] + g, True
                else:
                    pending[t._ctx], mine[t._ctx] = g, alone
            if not retain_graph:
                vars(fn).clear()

    return backward


class Student:
    def __init__(self, backward):
        self.backward = backward


@pytest.mark.parametrize("name", ["test_engine", "test_engine_none_gradients_and_nested_backward",
                                  "test_engine_frees_graph", "test_engine_owns_and_adopts"])
def test_a_correct_sorted_engine_passes_every_engine_check(name):
    getattr(_graded_module(), name)(Student(sorted_engine(skip_unreached=True)))


def test_a_sorted_engine_that_runs_unreached_operations_loses_its_points():
    with pytest.raises(AssertionError, match="nothing"):
        _graded_module().test_engine_none_gradients_and_nested_backward(Student(sorted_engine(skip_unreached=False)))


def test_checkpoint_of_a_computed_input_it_does_not_use():
    """What the wrong engine broke: checkpointing hands ``None`` to a computed input that took no part."""
    x, w = tt.tensor([1.0, 2.0], requires_grad=True), tt.tensor([3.0, 4.0], requires_grad=True)
    unused = w * 2.0
    tt.checkpoint(lambda a, b: a * 3.0, x, unused).sum().backward()
    assert x.grad.numpy().tolist() == [3.0, 3.0] and w.grad is None
