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

**Messages a student can act on.** A failing check says what was expected and
what the student's code produced, as the notebooks' inline checks do. Use the
``expect_*`` helpers below (``expect_close(got, want, "relu of [-1, 2]")`` says
"relu of [-1, 2]: 1 of 2 differ; largest difference 1 at [0] (expected 0, got -1);
expected [0. 2.], got [-1. 2.]"),
or ``assert condition, "message naming expected and got"``. A check that can only
pass once another passes names it: ``@check(..., after="test_accumulation")``;
when both fail, the report blames the first and not this one.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

def check(points: int, hint: str,
          after: str | tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test function as a graded check worth ``points``, with a ``hint`` shown on failure.

    Each collected test item earns the points (a parametrised check earns them once
    per parameter). The check must take the ``student`` fixture. ``after`` names the
    checks (test function names) whose failure makes this one fail too.
    """
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"check(points=...) takes a positive whole number, got {points!r}")
    if not isinstance(hint, str) or not hint.strip():
        raise ValueError("check(hint=...) takes a non-empty string: what to look at when the check fails")
    after = (after,) if isinstance(after, str) else tuple(after)

    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        function.tinytrain_points = points  # type: ignore[attr-defined]
        function.tinytrain_hint = hint.strip()  # type: ignore[attr-defined]
        function.tinytrain_after = after  # type: ignore[attr-defined]
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


def check_after(item: Any) -> tuple[str, ...]:
    """The checks a collected check depends on (``after=``)."""
    return getattr(getattr(item, "function", None), "tinytrain_after", ())


# -- expectations: failures that say what was expected and what came out -------------------
def _host(value: Any) -> Any:
    """A tensor's or device array's values as NumPy; anything else unchanged."""
    if hasattr(value, "numpy") and callable(value.numpy):
        return value.numpy()
    return value


def _show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        # Two rows and columns from each edge of a matrix or stack keep both arrays of a report on a screen.
        edges = 3 if value.ndim <= 1 else 2
        text = np.array2string(value, precision=5, threshold=12, edgeitems=edges, max_line_width=100)
        return f"{text} (shape {value.shape}, {value.dtype})"
    return repr(value)


def _number(value: Any) -> str:
    """One array element, as a plain number."""
    value = value.item()
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def expect_equal(got: Any, expected: Any, what: str) -> None:
    """``got == expected`` (arrays and tensors: same shape and values), or an AssertionError saying both."""
    got_values, expected_values = _host(got), _host(expected)
    if isinstance(got_values, np.ndarray) or isinstance(expected_values, np.ndarray):
        # An array of Python objects (np.stack of tensors, say) compares equal element by element but is no batch.
        objects = [np.asarray(v).dtype == object for v in (got_values, expected_values)]
        if objects[0] and not objects[1]:
            raise AssertionError(f"{what}: expected an array of numbers {_show(expected_values)}, got an array of "
                                 f"Python objects {_show(got_values)}")
        same = np.shape(got_values) == np.shape(expected_values) and np.array_equal(got_values, expected_values)
    else:
        same = got_values == expected_values
    if not same:
        raise AssertionError(f"{what}: expected {_show(expected_values)}, got {_show(got_values)}")


def expect_close(got: Any, expected: Any, what: str, rtol: float = 1e-5, atol: float = 1e-7,
                 dtype: Any = None) -> None:
    """Numbers or arrays (tensors too) equal within ``rtol``/``atol``, with the expected shape and, when given,
    ``dtype``; the AssertionError shows both and the largest difference."""
    got_values = np.asarray(_host(got))
    expected_values = np.asarray(_host(expected))
    if got_values.shape != expected_values.shape:
        raise AssertionError(f"{what}: expected shape {expected_values.shape}, got shape {got_values.shape}: "
                             f"{_show(got_values)}")
    if dtype is not None and got_values.dtype != np.dtype(dtype):
        raise AssertionError(f"{what}: expected dtype {np.dtype(dtype)}, got {got_values.dtype}")
    if got_values.dtype.kind not in "biufc":
        raise AssertionError(f"{what}: expected numbers, got {_show(got_values)}")
    wrong = ~np.isclose(got_values, expected_values, rtol=rtol, atol=atol, equal_nan=True)
    if wrong.any():
        both = f"expected {_show(expected_values)}, got {_show(got_values)}"
        if got_values.ndim == 0:
            raise AssertionError(f"{what}: {both}")
        difference = np.asarray(np.abs(got_values.astype(np.float64) - expected_values.astype(np.float64)))
        difference[~wrong] = 0
        where = np.unravel_index(np.nanargmax(np.where(np.isnan(difference), np.inf, difference)), difference.shape)
        # The summary first: a report cuts a long message at its end, and the worst element says the most.
        raise AssertionError(f"{what}: {int(wrong.sum())} of {wrong.size} differ; largest difference "
                             f"{difference[where]:.3g} at {list(map(int, where))} (expected "
                             f"{_number(expected_values[where])}, got {_number(got_values[where])}); {both}")


def expect_raises(exception: type[BaseException], call: Callable[[], Any], what: str,
                  mentions: tuple[str, ...] = ()) -> BaseException:
    """``call()`` raises ``exception`` whose message contains every string in ``mentions``; returns it."""
    try:
        result = call()
    except exception as error:
        missing = [text for text in mentions if text not in str(error)]
        if missing:
            raise AssertionError(f"{what}: expected the {exception.__name__} to name {', '.join(map(repr, missing))}; "
                                 f"its message was {str(error)!r}") from None
        return error
    except Exception as error:
        raise AssertionError(f"{what}: expected {exception.__name__}, got {type(error).__name__}: {error}") from None
    try:  # the student's object, whose repr may itself fail (a half-built dataset's reads a missing array)
        shown = _show(_host(result))
    except Exception as error:  # noqa: BLE001 - any failure of the repr: name the type instead
        shown = f"a {type(result).__name__} (whose repr raised {type(error).__name__}: {error})"
    raise AssertionError(f"{what}: expected {exception.__name__}, but it returned {shown}")


def expect_gradcheck(fn: Callable[..., Any], inputs: list[Any], what: str) -> None:
    """``tt.gradcheck(fn, inputs)`` passes, or an AssertionError saying what was checked and the worst mismatch.

    ``gradcheck`` raises rather than returning False, so ``assert tt.gradcheck(...), what`` never shows ``what``.
    """
    import tinytrain as tt  # the installed gradcheck: a student's Module 02 once exported

    try:
        passed = tt.gradcheck(fn, inputs)
    except AssertionError as error:
        raise AssertionError(f"{what}: expected backward's gradients to match central differences, got {error}") \
            from None
    if passed is not True:
        raise AssertionError(f"{what}: expected gradcheck to pass, it returned {passed!r}")
