"""The exponentials of a softmax, shifted for stability, with one shift for a whole array where that is safe.

Hand-written, not a student's: Module 14's ``MaskedSoftmax`` calls
:func:`exp_shifted_by_row_max` where its lesson subtracts each row's largest score and
exponentiates (the lesson says so).

A softmax does not change when every score of a row moves by the same number, so the
shift ``m`` only has to keep ``exp(s - m)`` finite and not lose the row to underflow.
Each row's own maximum is the textbook choice, but NumPy finds the maxima of short rows
one row at a time (157 us for a ``(12, 4, 64, 64)`` float32 array, against 15 us for
the largest value of the whole array) and subtracts a column of them more slowly than
one number. So on NumPy the kernel first shifts the whole array by its largest value
and checks every row's sum afterwards: a sum of at least ``SAFE_ROW_SUM`` means the
row's largest exponential is at least ``SAFE_ROW_SUM / width``, a normal number far
above float32's smallest (2**-126), so the row keeps full precision and dividing by
the sum gives the same softmax as the row's own shift, to rounding (the subtraction
rounds at the size of the gap, so a float32 weight may differ from the row-by-row one
by up to about 2e-6 of itself). A row that falls further below the array's largest
value (or has nothing allowed) fails the check and is done again with its own
maximum. In the GPT milestone's trained model the first layer's scores span about 47,
and 0.2% of its rows (at most 0.7% of an array's) are redone.

CuPy and the strict test device always take the row-by-row path: checking the sums
would make a GPU stop and wait for the answer.
"""
from typing import Any

import numpy as np

from tinytrain.kernels.reductions import trailing_sum

SAFE_ROW_SUM = 2.0 ** -60  # a row sum below this is redone with the row's own maximum
_ONE_SHIFT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def exp_shifted_by_row_max(xp: Any, scores: Any) -> tuple[Any, Any]:
    """``(e, total)``: ``e = exp(scores - m)`` along the last axis with ``m`` each row's largest value (0 for
    a row that is all ``-inf``, whose exponentials are all 0), and the row sums ``(..., 1)``.

    ``scores`` must be an array the caller owns: ``e`` is either a new array (``scores`` unchanged) or
    ``scores`` itself, overwritten. On NumPy float32 and float64 arrays ``m`` may be one number for every
    row that keeps a healthy sum (see the module's docstring): each row's exponentials then differ from the
    row-maximum ones by one factor, which the softmax's division by the row sum cancels.

    >>> import numpy as np
    >>> e, total = exp_shifted_by_row_max(np, np.array([[0.0, np.log(3.0)], [-np.inf, -np.inf]]))
    >>> (e / np.where(total == 0, 1, total)).round(6).tolist()
    [[0.25, 0.75], [0.0, 0.0]]
    """
    if isinstance(scores, np.ndarray) and scores.dtype in _ONE_SHIFT_DTYPES and scores.size:
        shift = scores.max()
        if np.isfinite(shift):
            e = scores - shift  # a new array: scores stays for the rows that need their own maximum
            np.exp(e, out=e)
            total = trailing_sum(np, e, (-1,))
            far_below = ~(total[..., 0] >= SAFE_ROW_SUM)  # also a row of nan, or with nothing allowed (sum 0)
            if far_below.any():
                e[far_below], total[far_below] = _by_rows(np, scores[far_below])
            return e, total
    return _by_rows(xp, scores)


def _by_rows(xp: Any, scores: Any) -> tuple[Any, Any]:
    """``exp_shifted_by_row_max`` with each row's own maximum, in place on ``scores``."""
    top = scores.max(axis=-1, keepdims=True)
    scores -= xp.where(top == -xp.inf, 0, top)
    xp.exp(scores, out=scores)
    return scores, trailing_sum(xp, scores, (-1,))
