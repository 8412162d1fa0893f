"""``tinytrain.kernels.convolution``: the kernels Module 11's reference ``Conv2dFunction`` hands NumPy layers to.

``Im2colInParts`` called directly, against sums over kernel offsets (``test_conv``'s
reference, and its gradients here) over strides, paddings and odd, non-square
shapes drawn by hypothesis, with and without a bias and for every combination of
gradients asked for; parts of the batch against the whole batch; ``add_windows``
against the lesson's col2im; what ``fast_path`` chooses. Winograd's kernel has
``test_winograd.py``.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain.kernels import parts, winograd
from tinytrain.kernels.convolution import Im2colInParts, add_windows, fast_path
from tinytrain.nn.conv import col2im

from test_conv import conv_cases, reference_conv

NEEDS = list(itertools.product([False, True], repeat=3))  # (need_x, need_weight, need_bias)


def reference_gradients(x, w, g, stride, padding):
    """(grad_x, grad_w, grad_b) of ``sum(g * conv(x, w, b))``, one kernel offset at a time."""
    (sh, sw), (ph, pw) = stride, padding
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    grad_padded, grad_w = np.zeros_like(padded), np.zeros_like(w)
    out_h, out_w = g.shape[2:]
    for i, j in np.ndindex(*w.shape[2:]):
        rows, cols = slice(i, i + sh * (out_h - 1) + 1, sh), slice(j, j + sw * (out_w - 1) + 1, sw)
        grad_w[:, :, i, j] = np.einsum("nohw,nchw->oc", g, padded[:, :, rows, cols])
        grad_padded[:, :, rows, cols] += np.einsum("nohw,oc->nchw", g, w[:, :, i, j])
    height, width = x.shape[2:]
    return grad_padded[:, :, ph:ph + height, pw:pw + width], grad_w, g.sum(axis=(0, 2, 3))


@given(case=conv_cases(), seed=st.integers(0, 1000), bias=st.booleans(), needs=st.sampled_from(NEEDS))
def test_values_and_gradients_match_sums_over_kernel_offsets(case, seed, bias, needs) -> None:
    x_shape, w_shape, stride, padding = case
    rng = np.random.default_rng(seed)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    kernel = Im2colInParts(stride, padding)
    out = kernel.forward(x, w, b if bias else None)
    np.testing.assert_allclose(out, reference_conv(x, w, b if bias else None, stride, padding), rtol=1e-10, atol=1e-10)
    g = rng.standard_normal(out.shape)
    need_bias = needs[2] and bias
    got = kernel.backward(g, needs[0], needs[1], need_bias)
    expected = reference_gradients(x, w, g, stride, padding)
    for name, need, found, wanted in zip(("x", "weight", "bias"), (needs[0], needs[1], need_bias), got, expected):
        if need:
            assert found.shape == wanted.shape, name
            np.testing.assert_allclose(found, wanted, rtol=1e-10, atol=1e-10, err_msg=name)
        else:
            assert found is None, name


@pytest.mark.parametrize("images_per_part", [1, 2])
@pytest.mark.parametrize("stride, padding", [((1, 1), (1, 1)), ((1, 1), (0, 0)), ((2, 2), (1, 1)), ((1, 2), (2, 0))])
def test_parts_of_the_batch_equal_the_whole_batch(images_per_part, stride, padding) -> None:
    """Five images in parts of one or two (the last one shorter), against all five at once."""
    rng = np.random.default_rng(images_per_part)
    x, w, b = rng.standard_normal((5, 2, 6, 5)), rng.standard_normal((3, 2, 3, 2)), rng.standard_normal(3)
    (sh, sw), (ph, pw) = stride, padding
    positions = ((6 + 2 * ph - 3) // sh + 1) * ((5 + 2 * pw - 2) // sw + 1)
    columns = np.empty((5, 2 * 3 * 2 + 1, positions))  # an image's columns, with the row of ones for the bias
    results = []
    for cache_bytes, expected_parts in ((images_per_part * columns[0].nbytes, -(-5 // images_per_part)), (1 << 40, 1)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(parts, "CACHE_BYTES", cache_bytes)
            assert len(parts.cache_sized_parts(np, columns)) == expected_parts
            kernel = Im2colInParts(stride, padding)
            out = kernel.forward(x, w, b)
            g = np.random.default_rng(0).standard_normal(out.shape)
            results.append([out, *kernel.backward(g, True, True, True)])
    for name, in_parts, whole in zip(("out", "x", "weight", "bias"), *results):
        np.testing.assert_allclose(in_parts, whole, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("padding", [(0, 0), (1, 1), (2, 0)])
@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_the_input_gradient_is_contiguous(padding, stride) -> None:
    """Not a view that drops the padding: over its short rows the previous layer's backward runs up to 10x slower."""
    rng = np.random.default_rng(0)
    kernel = Im2colInParts(stride, padding)
    out = kernel.forward(rng.standard_normal((3, 2, 7, 6)), rng.standard_normal((4, 2, 3, 3)), None)
    grad_x, _, _ = kernel.backward(np.ones(out.shape), True, False, False)
    assert grad_x.shape == (3, 2, 7, 6) and grad_x.flags.c_contiguous


def test_dtypes_follow_numpy_promotion_and_the_gradient() -> None:
    rng = np.random.default_rng(1)
    x32, w32 = rng.standard_normal((2, 3, 5, 5), dtype=np.float32), rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    kernel = Im2colInParts((1, 1), (1, 1))
    out = kernel.forward(x32, w32, rng.standard_normal(4))  # a float64 bias is added in the result's dtype
    assert out.dtype == np.float32
    assert [g.dtype for g in kernel.backward(np.ones(out.shape, np.float32), True, True, True)] == [np.float32] * 3
    assert [g.dtype for g in kernel.backward(np.ones(out.shape), True, True, True)] == [np.float64] * 3
    assert Im2colInParts((1, 1), (1, 1)).forward(x32, w32.astype(np.float64), None).dtype == np.float64


def test_inputs_and_saved_arrays_stay_unchanged_so_backward_may_run_twice() -> None:
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((3, 2, 6, 5)), rng.standard_normal((4, 2, 3, 3)), rng.standard_normal(4)
    copies = [a.copy() for a in (x, w, b)]
    kernel = Im2colInParts((1, 1), (1, 1))
    out = kernel.forward(x, w, b)
    g = rng.standard_normal(out.shape)
    g_copy = g.copy()
    first = [a.copy() for a in kernel.backward(g, True, True, True)]
    second = kernel.backward(g, True, True, True)
    for before, after in zip(copies + [g_copy], [x, w, b, g]):
        np.testing.assert_array_equal(before, after)
    for a, b_ in zip(first, second):
        np.testing.assert_array_equal(a, b_)


@pytest.mark.parametrize("stride, padding", [((1, 1), (0, 0)), ((1, 1), (1, 1)), ((2, 2), (1, 1))])
def test_an_empty_batch(stride, padding) -> None:
    kernel = Im2colInParts(stride, padding)
    out = kernel.forward(np.zeros((0, 3, 6, 5)), np.ones((8, 3, 3, 3)), np.ones(8))
    assert out.shape[:2] == (0, 8)
    grad_x, grad_w, grad_b = kernel.backward(np.zeros(out.shape), True, True, True)
    assert grad_x.shape == (0, 3, 6, 5)
    np.testing.assert_array_equal(grad_w, np.zeros((8, 3, 3, 3)))
    np.testing.assert_array_equal(grad_b, np.zeros(8))


@given(n=st.integers(1, 2), c=st.integers(1, 3), kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       extra=st.tuples(st.integers(0, 3), st.integers(0, 3)), seed=st.integers(0, 1000))
def test_add_windows_is_col2im_along_whole_rows(n, c, kernel, extra, seed) -> None:
    """The column gradient made as wide as the image (zeros on the right) and added by shifts is col2im."""
    (kh, kw), height, width = kernel, kernel[0] + extra[0], kernel[1] + extra[1]
    out_h, out_w = height - kh + 1, width - kw + 1
    cols = np.random.default_rng(seed).standard_normal((n, c * kh * kw, out_h * out_w))
    wide = np.zeros((n, c * kh * kw, out_h, width))
    wide[..., :out_w] = cols.reshape(n, -1, out_h, out_w)
    image = np.zeros((n, c, height, width))
    add_windows(wide.reshape(n, c * kh * kw, -1), image, kernel)
    np.testing.assert_allclose(image, col2im(np, cols, image.shape, kernel, (1, 1)), rtol=1e-12, atol=1e-12)


def test_fast_path_chooses_winograd_for_wide_3x3_layers_im2col_elsewhere_and_nothing_off_numpy() -> None:
    wide, narrow = np.zeros((2, 32, 8, 8), np.float32), np.zeros((2, 3, 8, 8), np.float32)
    w_wide, w_narrow = np.zeros((32, 32, 3, 3), np.float32), np.zeros((32, 3, 3, 3), np.float32)
    assert isinstance(fast_path(np, wide, w_wide, (1, 1), (1, 1)), winograd.WinogradConvolution)
    chosen = fast_path(np, narrow, w_narrow, (2, 1), (0, 1))
    assert isinstance(chosen, Im2colInParts) and (chosen.stride, chosen.padding) == ((2, 1), (0, 1))
    assert isinstance(fast_path(np, wide, w_wide, (2, 2), (1, 1)), Im2colInParts)
    x_strict, w_strict = tt.zeros(2, 32, 8, 8, device="strict"), tt.zeros(32, 32, 3, 3, device="strict")
    assert fast_path(x_strict._backend.xp, x_strict.data, w_strict.data, (1, 1), (1, 1)) is None


def test_conv2d_hands_numpy_layers_to_the_kernels_and_other_devices_to_the_recipe(device) -> None:
    x = tt.randn(2, 3, 6, 5, device=device)
    w = tt.randn(4, 3, 3, 3, device=device, requires_grad=True)
    out = tt.nn.functional.conv2d(x, w, padding=1)
    assert isinstance(out._ctx.fast, Im2colInParts) == (device == "cpu")
    assert (out._ctx.fast is None) == (device != "cpu")
