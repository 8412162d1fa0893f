"""Sums and means over an array's last axes, as a matrix-vector product where NumPy's reduction is slow.

Hand-written, not a student's: Module 05's ``Normalize`` and Module 14's
``MaskedSoftmax`` call these where their lessons write ``x.mean(axis=axes,
keepdims=True)`` and ``x.sum(axis=-1, keepdims=True)`` (each lesson says so).

NumPy reduces a contiguous last axis one row at a time, with a call of its inner
loop per row. For short rows -- an attention row's 64 keys, a LayerNorm's 128
channels -- the calls cost more than the additions: the row sums of a
``(12, 4, 64, 64)`` float32 array take 104 us, the row means of ``(12, 64, 128)``
52 us. The same sums as a product with a vector of ones, ``rows @ ones`` (BLAS's
matrix-vector product), run at memory speed: 18 us and 13 us. The sums agree with
NumPy's to rounding (a float32 ulp or two: BLAS adds in another order); the strict
test device computes them as the CPU does, bit for bit.

Only float32 and float64 go through BLAS: float16 and bfloat16 (which NumPy sums
in float32) and integers take ``sum``/``mean`` as before, and so do axes that are not
the trailing ones (BatchNorm's ``(0, 2, 3)``).

:func:`trailing_dot` sums a product, ``(a * b).sum(...)``, without making the product:
NumPy's ``vecdot`` multiplies and adds each row in one pass (26 us for the rows of two
``(768, 128)`` float32 arrays, against 36 us for the product and ``rows @ ones``).

:func:`column_sum` adds the rows of a 2-D array, ``rows.sum(axis=0)``, as ``ones @ rows``
(16 us against 31 us for ``(768, 128)`` float32): a LayerNorm's weight and bias gradients.
"""
import math
from typing import Any

import numpy as np

_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _trailing_rows(array: Any, axes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape with kept dimensions, when ``axes`` are ``array``'s last ``len(axes)`` axes and its
    dtype is float32 or float64; None otherwise (the reduction then goes to NumPy's ``sum``)."""
    ndim = array.ndim
    count = len(axes)
    if array.dtype not in _BLAS_DTYPES or not 0 < count <= ndim:
        return None
    if count == 1:  # the common case, without sorting
        if axes[0] % ndim != ndim - 1:
            return None
    elif sorted(axis % ndim for axis in axes) != list(range(ndim - count, ndim)):
        return None
    return (*array.shape[:ndim - count], *(1,) * count)


def trailing_sum(xp: Any, array: Any, axes: tuple[int, ...]) -> Any:
    """``array.sum(axis=axes, keepdims=True)``, by ``rows @ ones`` when ``axes`` are the last ones.

    >>> import numpy as np
    >>> trailing_sum(np, np.arange(6.0).reshape(2, 3), (-1,))
    array([[ 3.],
           [12.]])
    """
    kept = _trailing_rows(array, axes)
    if kept is None:
        return array.sum(axis=axes, keepdims=True)
    width = math.prod(array.shape[len(kept) - len(axes):])
    rows = array.reshape(*kept[:len(kept) - len(axes)], width)  # a view of a contiguous array
    return xp.matmul(rows, xp.ones(width, dtype=array.dtype)).reshape(kept)


def trailing_mean(xp: Any, array: Any, axes: tuple[int, ...], dtype: Any = None) -> Any:
    """``array.mean(axis=axes, keepdims=True, dtype=dtype)``, by ``rows @ ones / n`` when ``axes``
    are the last ones and ``dtype`` is None or ``array``'s own.

    >>> import numpy as np
    >>> trailing_mean(np, np.arange(6.0).reshape(2, 3), (1,))
    array([[1.],
           [4.]])
    """
    if dtype is not None and np.dtype(dtype) != array.dtype or _trailing_rows(array, axes) is None:
        return array.mean(axis=axes, keepdims=True, dtype=dtype)
    total = trailing_sum(xp, array, axes)
    total /= math.prod(array.shape[axis] for axis in axes)
    return total


def trailing_dot(xp: Any, a: Any, b: Any, axes: tuple[int, ...]) -> Any:
    """``(a * b).sum(axis=axes, keepdims=True)`` for ``a`` and ``b`` of one shape, without the product
    array when they are NumPy float32 or float64 arrays and ``axes`` their last axes (``np.vecdot``).

    >>> import numpy as np
    >>> trailing_dot(np, np.arange(6.0).reshape(2, 3), np.ones((2, 3)), (-1,))
    array([[ 3.],
           [12.]])
    """
    kept = _trailing_rows(a, axes)
    if kept is None or not isinstance(a, np.ndarray) or b.dtype != a.dtype or b.shape != a.shape:
        return (a * b).sum(axis=axes, keepdims=True)
    width = math.prod(a.shape[len(kept) - len(axes):])
    leading = kept[:len(kept) - len(axes)]
    rows_dot = getattr(np, "vecdot", None) or (lambda x, y: np.einsum("...i,...i->...", x, y))  # vecdot: NumPy 2
    return rows_dot(a.reshape(*leading, width), b.reshape(*leading, width)).reshape(kept)


def column_sum(xp: Any, rows: Any) -> Any:
    """``rows.sum(axis=0)`` for a 2-D array ``rows``, by ``ones @ rows`` when it is float32 or float64.

    >>> import numpy as np
    >>> column_sum(np, np.arange(6.0).reshape(2, 3))
    array([3., 5., 7.])
    """
    if rows.dtype not in _BLAS_DTYPES:
        return rows.sum(axis=0)
    return xp.matmul(xp.ones(rows.shape[0], dtype=rows.dtype), rows)
