"""``tinytrain.kernels.layer_norm``: a LayerNorm's forward and backward as compiled loops (numba)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.kernels import layer_norm
from tinytrain.nn.normalization import normalize

needs_numba = pytest.mark.skipif(not layer_norm.compiled_kernels_available(), reason="numba is not installed")


def _array(shape: tuple[int, ...], dtype: object, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _tensor(array: np.ndarray, requires_grad: bool = False) -> tt.Tensor:
    return tt.tensor(array, dtype=array.dtype, requires_grad=requires_grad)


def _lesson_formulas(x, w, b, g, eps):
    """The lesson's LayerNorm over the rows of ``x``, forward and backward, in NumPy."""
    mean, var = x.mean(axis=1), x.var(axis=1)
    s = 1 / np.sqrt(var[:, None] + eps)
    x_hat = (x - mean[:, None]) * s
    scaled = g * w
    grad_x = s * (scaled - scaled.mean(axis=1, keepdims=True) - x_hat * (scaled * x_hat).mean(axis=1, keepdims=True))
    return x_hat * w + b, x_hat, mean, var, s[:, 0], grad_x, (g * x_hat).sum(axis=0), g.sum(axis=0)


def test_the_loops_run_as_plain_python_compute_the_lessons_formulas() -> None:
    """The loops' own arithmetic, without numba (so it is checked where numba is missing too)."""
    x, g = _array((5, 7), np.float64) * 3 + 1, _array((5, 7), np.float64, seed=1)
    w, b = _array((7,), np.float64, seed=2), _array((7,), np.float64, seed=3)
    out, x_hat = np.empty_like(x), np.empty_like(x)
    mean, var, inv_std = np.empty(5), np.empty(5), np.empty(5)
    layer_norm._forward_loop(x, w, b, 1e-3, 7.0, out, x_hat, mean, var, inv_std)
    grad_x, grad_w, grad_b = np.empty_like(x), np.empty(7), np.empty(7)
    layer_norm._backward_loop(g, x_hat, inv_std, w, 7.0, grad_x, grad_w, grad_b)
    for got, expected in zip((out, x_hat, mean, var, inv_std, grad_x, grad_w, grad_b), _lesson_formulas(x, w, b, g, 1e-3)):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)


@needs_numba
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_compiled_rows_compute_the_lessons_formulas_in_the_rows_dtype(dtype, rtol) -> None:
    x, g = _array((768, 128), dtype) * 2 - 1, _array((768, 128), dtype, seed=1)
    w, b = _array((128,), dtype, seed=2), _array((128,), dtype, seed=3)
    out, x_hat, mean, var, inv_std = layer_norm.forward_rows(x, w, b, 1e-5)
    grads = layer_norm.backward_rows(g, x_hat, inv_std, w)
    wide = [a.astype(np.float64) for a in (x, w, b, g)]
    for got, expected in zip((out, x_hat, mean, var, inv_std, *grads), _lesson_formulas(*wide, 1e-5)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * 10)


CASES = [  # shape, axes, a transposed (not contiguous) input
    ((12, 64, 128), (2,), False),  # a GPT's activations
    ((2, 3, 4), (-2, -1), False),  # two trailing axes
    ((4, 5, 3), (2,), True),
    ((6,), (0,), False),  # one sample
]


@needs_numba
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("shape, axes, transposed", CASES)
def test_normalize_runs_the_compiled_loops_and_agrees_with_the_students_normalize(shape, axes, transposed, dtype,
                                                                                 rtol) -> None:
    x = _tensor(_array(shape, dtype, seed=1) * 2 + 0.5, requires_grad=True)
    source_shape = (shape[0], shape[2], shape[1]) if transposed else shape
    trailing = source_shape[len(source_shape) - len(axes):]
    weight = _tensor(_array(trailing, dtype, seed=2), requires_grad=True)
    bias = _tensor(_array(trailing, dtype, seed=3), requires_grad=True)
    grad = _array(source_shape, dtype, seed=4)
    if grad.ndim == 3:
        grad = np.asfortranarray(grad)  # a gradient in another memory order is read as it is
    results = {}
    for compiled in (True, False):
        with layer_norm.use_compiled_kernels(compiled):
            source = x.transpose(0, 2, 1) if transposed else x
            out, mean, var = normalize(source, axes, 1e-3, weight, bias)
            assert out._ctx.compiled is compiled and type(out._ctx).__name__ == "AffineNormalize"
            x.grad = weight.grad = bias.grad = None
            out.backward(_tensor(grad))
        results[compiled] = [out.numpy(), mean, var, x.grad.numpy(), weight.grad.numpy(), bias.grad.numpy()]
    for name, got, expected in zip(("out", "mean", "var", "x.grad", "weight.grad", "bias.grad"), *results.values()):
        assert got.shape == expected.shape and got.dtype == expected.dtype == dtype, name
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * 10, err_msg=name)


@needs_numba
def test_compiled_layer_norm_passes_gradcheck_and_leaves_frozen_tensors_without_gradient() -> None:
    x = _tensor(_array((3, 4, 5), np.float64), requires_grad=True)
    weight = _tensor(_array((5,), np.float64, seed=1), requires_grad=True)
    bias = _tensor(_array((5,), np.float64, seed=2), requires_grad=True)
    assert normalize(x, (2,), 1e-5, weight, bias)[0]._ctx.compiled
    assert tt.gradcheck(lambda x, w, b: normalize(x, (2,), 1e-5, w, b)[0], [x, weight, bias])
    x.grad = None
    frozen_weight, frozen_bias = _tensor(weight.numpy()), _tensor(bias.numpy())
    normalize(x, (2,), 1e-5, frozen_weight, frozen_bias)[0].sum().backward()
    assert x.grad is not None and frozen_weight.grad is None and frozen_bias.grad is None
    with tt.no_grad():
        out, mean, var = normalize(x, (2,), 1e-5, weight, bias)
    assert out._ctx is None and mean.shape == var.shape == (3, 4, 1)


@needs_numba
def test_a_nan_or_inf_in_a_row_gives_nan_in_that_row_as_the_students_normalize_does() -> None:
    """The loops keep nan and inf (no `fastmath=True`, which would let the compiler assume there are none)."""
    x = _array((4, 8), np.float32)
    x[1, 3], x[2, 5] = np.nan, np.inf
    results = []
    for compiled in (True, False):
        with layer_norm.use_compiled_kernels(compiled), np.errstate(invalid="ignore"):  # NumPy's inf - inf
            source = _tensor(x, requires_grad=True)
            out = normalize(source, (1,), 1e-5, _tensor(np.ones(8, np.float32)), _tensor(np.zeros(8, np.float32)))[0]
            out.backward(_tensor(np.ones_like(x)))
        results.append((np.isnan(out.numpy()), np.isnan(source.grad.numpy())))
    for got, expected in zip(*results):
        assert np.array_equal(got, expected) and got[[1, 2]].all() and not got[[0, 3]].any(), (got, expected)


@needs_numba
def test_layer_norm_matches_pytorch_with_the_compiled_loops() -> None:
    torch = pytest.importorskip("torch")
    x, g = _array((12, 64, 128), np.float32), _array((12, 64, 128), np.float32, seed=1)
    w, b = _array((128,), np.float32, seed=2), _array((128,), np.float32, seed=3)
    layer = tt.nn.LayerNorm(128)
    layer.weight.data[...], layer.bias.data[...] = w, b
    ours_x = tt.tensor(x, requires_grad=True)
    out = layer(ours_x)
    assert out._ctx.compiled
    out.backward(tt.tensor(g))
    theirs_x, theirs_w, theirs_b = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    expected = torch.nn.functional.layer_norm(theirs_x, (128,), theirs_w, theirs_b, 1e-5)
    expected.backward(torch.from_numpy(g))
    for got, want in ((out, expected), (ours_x.grad, theirs_x.grad), (layer.weight.grad, theirs_w.grad),
                      (layer.bias.grad, theirs_b.grad)):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_other_arrays_take_the_students_normalize() -> None:
    """bfloat16 and float16, mixed dtypes, a subclass of ndarray (the strict device's kind), or switched off."""
    x32, w32 = _array((4, 8), np.float32), _array((8,), np.float32)
    assert layer_norm.fits(x32, w32, w32) is layer_norm.compiled_kernels_available()
    for x, w in ((x32.astype(ml_dtypes.bfloat16), w32.astype(ml_dtypes.bfloat16)),
                 (x32.astype(np.float16), w32.astype(np.float16)), (x32, w32.astype(np.float64)),
                 (x32.view(np.recarray), w32), (x32.astype(np.int64), w32.astype(np.int64))):
        assert not layer_norm.fits(x, w, w), (type(x), x.dtype, w.dtype)
    with layer_norm.use_compiled_kernels(False):
        assert not layer_norm.fits(x32, w32, w32)
        out = normalize(tt.tensor(x32, requires_grad=True), (1,), 1e-5, tt.tensor(w32), tt.tensor(w32))[0]
        assert not out._ctx.compiled


def test_asking_for_the_compiled_loops_without_numba_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setattr(layer_norm, "compiled_kernels_available", lambda: False)
    with pytest.raises(ModuleNotFoundError, match=r"numba: pip install 'tinytrain\[compiled\]'"):
        with layer_norm.use_compiled_kernels(True):
            pass
    x = _array((4, 8), np.float32)
    assert not layer_norm.fits(x, x[0], x[0])  # without numba the lesson's code runs


def test_the_switch_restores_the_previous_setting_even_after_an_error() -> None:
    before = layer_norm._enabled
    with pytest.raises(RuntimeError):
        with layer_norm.use_compiled_kernels(False):
            assert layer_norm._enabled is False
            raise RuntimeError("inside")
    assert layer_norm._enabled is before
