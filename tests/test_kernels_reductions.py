"""``tinytrain.kernels.reductions``: sums and means over the last axes as matrix-vector products."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.kernels.reductions import column_sum, trailing_dot, trailing_mean, trailing_sum

CASES = [  # shape, axes
    ((12, 4, 64, 64), (-1,)),  # attention's scores
    ((12, 64, 128), (2,)),  # a LayerNorm's rows
    ((3, 5, 4, 6), (-2, -1)),  # LayerNorm over two axes, in either order
    ((3, 5, 4, 6), (3, 2)),
    ((7,), (0,)),  # every axis: one sum
    ((0, 8), (-1,)),  # no rows
]


def _array(shape: tuple[int, ...], dtype: object) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("shape, axes", CASES)
def test_equal_to_numpys_sum_and_mean_with_kept_dimensions(shape, axes, dtype, rtol) -> None:
    a = _array(shape, dtype)
    for ours, numpys in ((trailing_sum(np, a, axes), a.sum(axis=axes, keepdims=True)),
                         (trailing_mean(np, a, axes), a.mean(axis=axes, keepdims=True)),
                         (trailing_mean(np, a, axes, dtype), a.mean(axis=axes, keepdims=True))):
        assert ours.shape == numpys.shape and ours.dtype == numpys.dtype, (ours.shape, ours.dtype, numpys.dtype)
        np.testing.assert_allclose(ours, numpys, rtol=rtol, atol=rtol * 10)


def test_trailing_float_axes_are_summed_by_a_matrix_vector_product() -> None:
    a = _array((12, 4, 64, 64), np.float32)
    product = (a.reshape(-1, 64) @ np.ones(64, np.float32)).reshape(12, 4, 64, 1)
    assert np.array_equal(trailing_sum(np, a, (-1,)), product)
    assert np.array_equal(trailing_mean(np, a, (3,)), product / 64)
    transposed = a.transpose(0, 1, 3, 2)  # not contiguous: reshape copies it first
    np.testing.assert_allclose(trailing_sum(np, transposed, (-1,)), transposed.sum(axis=-1, keepdims=True),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int64])
def test_other_dtypes_and_axes_take_numpys_reduction_unchanged(dtype) -> None:
    """float16 and bfloat16 (summed in float32 by NumPy) and integers: BLAS has no such products."""
    a = (np.arange(2 * 3 * 8) % 7).reshape(2, 3, 8).astype(dtype)
    assert np.array_equal(trailing_sum(np, a, (-1,)), a.sum(axis=-1, keepdims=True))
    assert np.array_equal(trailing_mean(np, a, (-1,)), a.mean(axis=-1, keepdims=True))
    assert trailing_sum(np, a, (-1,)).dtype == a.sum(axis=-1, keepdims=True).dtype


def test_leading_axes_and_a_wider_mean_dtype_take_numpys_reduction_unchanged() -> None:
    a = _array((8, 3, 5, 5), np.float32)
    for axes in [(0,), (0, 2, 3), (1, 3)]:  # BatchNorm's axes, and axes with a gap
        assert np.array_equal(trailing_sum(np, a, axes), a.sum(axis=axes, keepdims=True)), axes
        assert np.array_equal(trailing_mean(np, a, axes), a.mean(axis=axes, keepdims=True)), axes
    assert np.array_equal(trailing_mean(np, a, (-1,), np.float64), a.mean(axis=-1, keepdims=True, dtype=np.float64))
    bf16 = a.astype(ml_dtypes.bfloat16)  # normalize() asks for its statistics in float32
    assert np.array_equal(trailing_mean(np, bf16, (-1,), np.float32),
                          bf16.mean(axis=-1, keepdims=True, dtype=np.float32))


def test_every_device_gets_the_cpus_sums_bit_for_bit(device) -> None:
    a = _array((12, 64, 128), np.float32)
    xp = tt.get_backend(device).xp
    on_device = tt.tensor(a, device=device).data
    for reduce in (trailing_sum, trailing_mean):
        result = tt.Tensor._make(reduce(xp, on_device, (-1,)), tt.get_backend(device))
        assert np.array_equal(result.numpy(), reduce(np, a, (-1,))), reduce.__name__


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-13)])
@pytest.mark.parametrize("shape, axes", CASES)
def test_trailing_dot_is_the_sum_of_the_product(shape, axes, dtype, rtol) -> None:
    a, b = _array(shape, dtype), _array(shape, dtype)[::-1].copy()
    ours, numpys = trailing_dot(np, a, b, axes), (a * b).sum(axis=axes, keepdims=True)
    assert ours.shape == numpys.shape and ours.dtype == numpys.dtype, (ours.shape, ours.dtype, numpys.dtype)
    np.testing.assert_allclose(ours, numpys, rtol=rtol, atol=rtol * 10)


def test_trailing_dot_of_a_view_and_of_other_dtypes_and_axes() -> None:
    a = _array((6, 5, 8), np.float32)
    view = a.transpose(1, 0, 2)  # not contiguous: its rows are gathered first
    np.testing.assert_allclose(trailing_dot(np, view, view, (-1,)), (view * view).sum(axis=-1, keepdims=True),
                               rtol=1e-5)
    for other, axes in ((a.astype(ml_dtypes.bfloat16), (-1,)), (a, (0,)), ((a * 4).astype(np.int64), (-1,))):
        assert np.array_equal(trailing_dot(np, other, other, axes), (other * other).sum(axis=axes, keepdims=True))


def test_every_device_gets_the_dot_products(device) -> None:
    a, b = _array((12, 64, 128), np.float32), _array((12, 64, 128), np.float64).astype(np.float32)[::-1].copy()
    backend = tt.get_backend(device)
    ours = trailing_dot(backend.xp, tt.tensor(a, device=device).data, tt.tensor(b, device=device).data, (-1,))
    np.testing.assert_allclose(tt.Tensor._make(ours, backend).numpy(), trailing_dot(np, a, b, (-1,)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-13)])
@pytest.mark.parametrize("shape", [(768, 128), (1, 5), (0, 4)])
def test_column_sum_is_numpys_sum_over_rows(shape, dtype, rtol) -> None:
    rows = _array(shape, dtype)
    ours, numpys = column_sum(np, rows), rows.sum(axis=0)
    assert ours.shape == numpys.shape and ours.dtype == numpys.dtype
    np.testing.assert_allclose(ours, numpys, rtol=rtol, atol=rtol * 10)
    if rows.size:
        assert np.array_equal(ours, np.ones(shape[0], dtype) @ rows)  # by BLAS's matrix-vector product


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int64])
def test_column_sum_of_other_dtypes_is_numpys_sum(dtype) -> None:
    rows = (np.arange(24) % 7).reshape(6, 4).astype(dtype)
    assert np.array_equal(column_sum(np, rows), rows.sum(axis=0))
    assert column_sum(np, rows).dtype == rows.sum(axis=0).dtype
