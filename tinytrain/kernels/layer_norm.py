"""A LayerNorm's forward and backward as one compiled loop each (numba), where NumPy makes a dozen passes.

Hand-written, not a student's: Module 05's ``normalize(x, axes, eps, weight, bias)``
runs these when numba is installed (``pip install tinytrain[compiled]``; the
milestones', notebooks' and tests' extras include it) and the input, weight and bias are
NumPy arrays of one dtype, float32 or float64. Everything else -- CuPy, the strict
test device, bfloat16, numba missing, or inside ``use_compiled_kernels(False)`` --
runs the student's ``Normalize`` as before. The lesson measures both.

Why: each NumPy operation reads and writes a whole array. Over a GPT's
``(768, 128)`` float32 activations (384 KiB) that is 20-30 us a pass; a LayerNorm's
forward takes five passes and two reductions, its backward ten, about 0.45 ms
together, while PyTorch's C++ kernel reads each row once forward and once backward
(0.15 ms). The loops below do the same: per row, the mean, the variance and the
output forward; the two row means and the input's gradient backward, with the
weight's and bias's column sums gathered on the way (0.05 ms each way).

The formulas are the lesson's, over the ``n`` numbers of a row::

    forward   mu = mean(x), var = mean((x - mu)^2), s = 1 / sqrt(var + eps)
              x_hat = (x - mu) s, out = x_hat * weight + bias
    backward  g' = g * weight
              grad_x = s (g' - mean(g') - x_hat mean(g' x_hat))
              grad_weight = sum over rows of g x_hat, grad_bias = sum over rows of g

Sums run in the array's own dtype, as NumPy's do, and the compiler may reorder them
into SIMD lanes (numba's ``fastmath`` flags, less the promise of no nan or inf, so a
nan or inf in a row gives nan there, as NumPy's arithmetic does): results agree with
the NumPy path to rounding (a few float32 ulps), not bit for bit. Compiled on first
use, one version per dtype (about 2 s), and cached on disk next to this file
(numba's ``cache=True``); a later process loads it in a fraction of a second.
"""
import contextlib
import functools
import importlib.util
from typing import Any, Iterator

import numpy as np

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_enabled = True  # what use_compiled_kernels() switches


@functools.cache  # every LayerNorm asks: a search of sys.path each time would cost more than the loops
def compiled_kernels_available() -> bool:
    """Whether numba is installed (it is imported only when a kernel first runs)."""
    return importlib.util.find_spec("numba") is not None


@contextlib.contextmanager
def use_compiled_kernels(enabled: bool = True) -> Iterator[None]:
    """Inside, ``normalize`` runs the compiled LayerNorm (``enabled``) or the student's ``Normalize``
    (not), as ``torch.backends`` flags pick PyTorch's kernels. Restores the previous setting on exit.
    Asking for the compiled loops without numba raises ``ModuleNotFoundError`` saying how to install it."""
    global _enabled
    if enabled and not compiled_kernels_available():
        raise ModuleNotFoundError("use_compiled_kernels(True) needs numba: pip install 'tinytrain[compiled]'")
    previous, _enabled = _enabled, bool(enabled)
    try:
        yield
    finally:
        _enabled = previous


def fits(x: Any, weight: Any, bias: Any) -> bool:
    """Whether the compiled loops take these arrays: switched on, numba installed, and three NumPy
    arrays (not a subclass, such as the strict device's) of one dtype, float32 or float64."""
    return (_enabled and type(x) is np.ndarray and type(weight) is np.ndarray and type(bias) is np.ndarray
            and x.dtype in _DTYPES and weight.dtype == x.dtype and bias.dtype == x.dtype
            and compiled_kernels_available())


def forward_rows(rows: Any, weight: Any, bias: Any, eps: float) -> tuple[Any, Any, Any, Any, Any]:
    """``(out, x_hat, mean, var, inv_std)`` for ``rows`` of shape ``(R, n)`` and ``weight``, ``bias`` of
    shape ``(n,)``: the first two ``(R, n)``, the statistics ``(R,)`` (``var`` biased)."""
    rows = np.ascontiguousarray(rows)  # one compiled version per dtype: C order
    dtype = rows.dtype.type
    out, x_hat = np.empty_like(rows), np.empty_like(rows)
    mean, var, inv_std = (np.empty(len(rows), dtype=rows.dtype) for _ in range(3))
    _compiled()[0](rows, np.ascontiguousarray(weight), np.ascontiguousarray(bias), dtype(eps), dtype(rows.shape[1]),
                   out, x_hat, mean, var, inv_std)
    return out, x_hat, mean, var, inv_std


def backward_rows(grad: Any, x_hat: Any, inv_std: Any, weight: Any) -> tuple[Any, Any, Any]:
    """``(grad_x, grad_weight, grad_bias)`` for the gradient ``grad`` of ``forward_rows``'s ``out``, given
    its ``x_hat`` and ``inv_std``: ``(R, n)``, ``(n,)``, ``(n,)``, new arrays of ``x_hat``'s dtype."""
    grad = np.ascontiguousarray(grad, dtype=x_hat.dtype)
    grad_x = np.empty_like(x_hat)
    grad_weight, grad_bias = np.empty_like(weight), np.empty_like(weight)
    _compiled()[1](grad, x_hat, inv_std, np.ascontiguousarray(weight), x_hat.dtype.type(x_hat.shape[1]),
                   grad_x, grad_weight, grad_bias)
    return grad_x, grad_weight, grad_bias


# -- the loops: plain Python that numba compiles (each runs as written, only slowly, without it) ----------------------
def _forward_loop(rows, weight, bias, eps, n, out, x_hat, mean, var, inv_std):  # noqa: ANN001, ANN202
    zero, one = n - n, n / n  # of the rows' dtype, as every constant here: a float64 literal would widen float32 sums
    for i in range(rows.shape[0]):
        total = zero
        for j in range(rows.shape[1]):
            total += rows[i, j]
        mu = total / n
        squares = zero
        for j in range(rows.shape[1]):
            centered = rows[i, j] - mu
            squares += centered * centered
        variance = squares / n
        s = one / np.sqrt(variance + eps)
        mean[i], var[i], inv_std[i] = mu, variance, s
        for j in range(rows.shape[1]):
            h = (rows[i, j] - mu) * s
            x_hat[i, j] = h
            out[i, j] = h * weight[j] + bias[j]


def _backward_loop(grad, x_hat, inv_std, weight, n, grad_x, grad_weight, grad_bias):  # noqa: ANN001, ANN202
    zero = n - n
    for j in range(grad.shape[1]):
        grad_weight[j] = zero
        grad_bias[j] = zero
    for i in range(grad.shape[0]):
        grad_mean, projection = zero, zero  # mean(g') and mean(g' x_hat)
        for j in range(grad.shape[1]):
            scaled = grad[i, j] * weight[j]
            grad_mean += scaled
            projection += scaled * x_hat[i, j]
            grad_weight[j] += grad[i, j] * x_hat[i, j]
            grad_bias[j] += grad[i, j]
        grad_mean /= n
        projection /= n
        for j in range(grad.shape[1]):
            grad_x[i, j] = inv_std[i] * (grad[i, j] * weight[j] - grad_mean - x_hat[i, j] * projection)


@functools.cache
def _compiled() -> tuple[Any, Any]:
    """The two loops compiled by numba (imported here: 0.3 s, paid only by a process that uses them)."""
    import numba

    # the sums may be reordered into SIMD lanes (reassoc) and fused (contract); not `fastmath=True`, whose
    # promise of no nan or inf would let the compiler drop what a nan in the input must give (nan, as NumPy's)
    compile_loop = numba.njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, nogil=True)
    return compile_loop(_forward_loop), compile_loop(_backward_loop)
