"""``tinytrain.kernels.softmax``: a softmax's exponentials with one shift for the whole array where that is safe."""
from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.kernels.softmax import SAFE_ROW_SUM, exp_shifted_by_row_max


def _softmax_by_rows(scores: np.ndarray) -> np.ndarray:
    """The textbook softmax along the last axis, each row shifted by its own maximum, in float64."""
    scores = scores.astype(np.float64)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1, total)


def _softmax(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, e, total) from the kernel, on a copy that the kernel owns."""
    owned = scores.copy()
    e, total = exp_shifted_by_row_max(np, owned)
    return e / np.where(total == 0, 1, total), e, total


def _causal_scores(dtype: object) -> np.ndarray:
    scores = np.random.default_rng(0).standard_normal((12, 4, 64, 64)) * 3
    return np.where(np.tril(np.ones((64, 64), bool)), scores, -np.inf).astype(dtype)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 3e-6), (np.float64, 1e-13)])
def test_one_shift_for_every_row_gives_the_softmax_by_rows(dtype, rtol) -> None:
    scores = _causal_scores(dtype)
    owned = scores.copy()
    e, total = exp_shifted_by_row_max(np, owned)
    assert e is not owned and np.array_equal(owned, scores, equal_nan=True), "the one-shift pass leaves its input"
    assert e.dtype == total.dtype == scores.dtype and total.shape == (12, 4, 64, 1)
    assert (e[..., 0, :] < 1).all(), "shifted by the array's largest score, not row 0's own (its only score)"
    np.testing.assert_allclose(e / total, _softmax_by_rows(scores), rtol=rtol, atol=rtol * 1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_only_the_rows_far_below_the_largest_score_take_their_own_maximum(dtype) -> None:
    scores = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(dtype)
    scores[0, 0] += 500  # every other row's exponentials would vanish under this row's shift
    scores[2, 1, 3] = -np.inf
    owned = scores.copy()
    e, total = exp_shifted_by_row_max(np, owned)
    assert e is not owned and np.array_equal(owned, scores), "the rows redone are copies"
    assert (e.max(axis=-1) == 1).all(), "each row shifted by its own maximum: the largest is exp(0)"
    np.testing.assert_allclose(e / total, _softmax_by_rows(scores), rtol=1e-6)
    scores[0, 0] -= 500
    scores[1, 2] -= 500  # now one row far below: redone alone, the others keep the one shift
    e, total = exp_shifted_by_row_max(np, scores.copy())
    one_shift = np.exp(scores - scores.max())
    others = np.ones((3, 4), bool)
    others[1, 2] = False
    assert e[1, 2].max() == 1, "the row far below: shifted by its own maximum"
    np.testing.assert_allclose(e[others], one_shift[others], rtol=1e-6, err_msg="the others: by the array's")
    np.testing.assert_allclose(e / total, _softmax_by_rows(scores), rtol=3e-6)


def test_the_check_is_on_each_rows_sum_against_safe_row_sum() -> None:
    """A row whose largest exponential sits just above the threshold keeps the one shift; just below, its own."""
    for gap, one_shift in ((np.log(2.0) * 59, True), (np.log(2.0) * 61, False)):
        scores = np.array([[0.0, -1e9], [-gap, -1e9]], np.float64)  # row 1's sum is about 2**-59 or 2**-61
        e, total = exp_shifted_by_row_max(np, scores.copy())
        assert (e[1, 0] != 1) == one_shift, (gap, total.ravel(), SAFE_ROW_SUM)
        np.testing.assert_allclose(e / total, [[1.0, 0.0], [1.0, 0.0]])


def test_one_row_of_scores() -> None:
    for scores in (np.array([3.0, 1.0, -np.inf]), np.array([-np.inf, -np.inf])):
        weights, _, _ = _softmax(scores)
        np.testing.assert_allclose(weights, _softmax_by_rows(scores))


def test_rows_with_nothing_allowed_are_zero_without_warnings() -> None:
    scores = _causal_scores(np.float32)
    scores[0, 0, 5] = -np.inf  # one row with nothing allowed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no inf - inf, no 0 / 0
        weights, _, total = _softmax(scores)
        all_masked, _, total2 = _softmax(np.full((2, 3), -np.inf, np.float32))
    assert (weights[0, 0, 5] == 0).all() and total[0, 0, 5, 0] == 0
    np.testing.assert_allclose(weights, _softmax_by_rows(scores), rtol=3e-6, atol=1e-9)
    assert (all_masked == 0).all() and (total2 == 0).all()


def test_nan_and_infinite_scores_spoil_only_their_own_rows() -> None:
    scores = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    scores[1, 2], scores[2, 3] = np.nan, np.inf
    with np.errstate(invalid="ignore"):
        weights, _, _ = _softmax(scores)
    assert np.isnan(weights[1]).all() and np.isnan(weights[2]).all()
    np.testing.assert_allclose(weights[[0, 3]], _softmax_by_rows(scores[[0, 3]]), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_narrow_floats_take_the_rows_pass(dtype) -> None:
    scores = np.random.default_rng(3).standard_normal((4, 8)).astype(dtype)
    owned = scores.copy()
    e, total = exp_shifted_by_row_max(np, owned)
    assert e is owned and e.dtype == dtype
    np.testing.assert_allclose((e / total).astype(np.float64), _softmax_by_rows(scores), rtol=2e-2)


def test_every_device_gets_the_softmax(device) -> None:
    """CuPy and the strict device take the rows' pass (no check read back to the host); same weights."""
    scores = _causal_scores(np.float32)
    backend = tt.get_backend(device)
    e, total = exp_shifted_by_row_max(backend.xp, tt.tensor(scores, device=device).data)
    weights = tt.Tensor._make(e / total, backend).numpy()
    np.testing.assert_allclose(weights, _softmax_by_rows(scores), rtol=3e-6, atol=1e-9)
