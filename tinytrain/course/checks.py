"""The ``@check`` decorator: what makes a test function a graded check.

``tests/graded/test_NN_name.py`` holds module NN's checks::

    from tinytrain.course.checks import check

    @check(points=2, hint="relu keeps positive values and zeroes the rest")
    def test_relu(student):
        assert student.relu(student.tensor([-1.0, 2.0])).numpy().tolist() == [0.0, 2.0]

The ``student`` fixture (``tests/graded/conftest.py``) is a
:class:`tinytrain.course.overlay.StudentCode`: every top-level name that module NN's
export cells define, as attributes. Every graded check must call code the student
writes, so that it *fails* on the unfilled notebook (whose stubs raise
``NotImplementedError``); CI grades every module's unfilled notebook (zero points)
and its reference notebook (full marks).

While a notebook is graded, its modules stand in for the package's in
``sys.modules``, but what the package imported before keeps the package's
objects: ``tensor * tensor`` runs the package's operations, and ``tt.Function``
may be either. Build the objects a check compares from one side -- the
student's (``student.Function``) or the package's, imported at the top of the
test file (``from tinytrain.autograd import Function as InstalledFunction``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

def check(points: int, hint: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test function as a graded check worth ``points``, with a ``hint`` shown on failure.

    Each collected test item earns the points (a parametrised check earns them once
    per parameter). The check must take the ``student`` fixture.
    """
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"check(points=...) takes a positive whole number, got {points!r}")
    if not isinstance(hint, str) or not hint.strip():
        raise ValueError("check(hint=...) takes a non-empty string: what to look at when the check fails")

    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        function.tinytrain_points = points  # type: ignore[attr-defined]
        function.tinytrain_hint = hint.strip()  # type: ignore[attr-defined]
        try:
            import pytest
        except ModuleNotFoundError:  # plain import of a test file; pytest reads the attributes
            return function
        return pytest.mark.graded(points=points, hint=hint.strip())(function)

    return mark


def check_info(item: Any) -> tuple[int, str] | None:
    """(points, hint) of a collected pytest item that is a graded check, else None."""
    function = getattr(item, "function", None)
    points = getattr(function, "tinytrain_points", None)
    if points is None:
        return None
    return points, function.tinytrain_hint  # type: ignore[union-attr]
