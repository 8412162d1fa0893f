"""Graded checks of Module 11 (convolutions): im2col and col2im, the convolution's
forward and backward passes, ``conv2d`` and its errors, ``Conv2d``'s initialisation,
max and average pooling (values, the first-maximum tie rule, overlapping windows)
and a Conv -> BatchNorm2d -> ReLU -> MaxPool block.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 11``). Every value is compared with a plain NumPy loop written
here, independent of im2col; gradients also with ``tt.gradcheck`` in float64 on
tiny shapes. (``conv2d_loops`` lives in a lesson cell, not an export cell, so the
notebook's own check grades it, not this file.)
"""
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.course.checks import check

RNG = np.random.default_rng(9)


# -- NumPy references, one output number at a time ------------------------------------------------

def loops_conv(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    """y[n, o, r, q] = b[o] + sum over (c, i, j) of w[o, c, i, j] * padded x[n, c, r*sh + i, q*sw + j]."""
    (sh, sw), (ph, pw) = stride, padding
    x = np.pad(np.asarray(x, dtype=np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n_images, _, height, width = x.shape
    out_channels, _, kh, kw = w.shape
    out = np.zeros((n_images, out_channels, (height - kh) // sh + 1, (width - kw) // sw + 1))
    for n, o, r, q in np.ndindex(*out.shape):
        out[n, o, r, q] = (x[n, :, r * sh:r * sh + kh, q * sw:q * sw + kw] * w[o]).sum() + (0 if b is None else b[o])
    return out


def loops_conv_grads(x, w, g, stride, padding):
    """(dL/dx, dL/dw, dL/db) for L = sum(g * conv(x, w, b)), one output number at a time."""
    (sh, sw), (ph, pw) = stride, padding
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    grad_padded, grad_w = np.zeros_like(padded), np.zeros_like(w)
    _, _, kh, kw = w.shape
    for n, o, r, q in np.ndindex(*g.shape):
        rows, cols = slice(r * sh, r * sh + kh), slice(q * sw, q * sw + kw)
        grad_padded[n, :, rows, cols] += g[n, o, r, q] * w[o]
        grad_w[o] += g[n, o, r, q] * padded[n, :, rows, cols]
    height, width = padded.shape[2:]
    return grad_padded[:, :, ph:height - ph, pw:width - pw], grad_w, g.sum(axis=(0, 2, 3))


def windows(shape, kernel, stride):
    """Every pooling window: (r, q, rows, cols) for an (N, C, H, W) input."""
    (kh, kw), (sh, sw) = kernel, stride
    out_h, out_w = (shape[2] - kh) // sh + 1, (shape[3] - kw) // sw + 1
    for r in range(out_h):
        for q in range(out_w):
            yield r, q, slice(r * sh, r * sh + kh), slice(q * sw, q * sw + kw)


def loops_pool(x, kernel, stride, reduce):
    (kh, kw), (sh, sw) = kernel, stride
    out = np.empty(x.shape[:2] + ((x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1))
    for r, q, rows, cols in windows(x.shape, kernel, stride):
        out[:, :, r, q] = reduce(x[:, :, rows, cols], axis=(2, 3))
    return out


def loops_max_pool_grad(x, g, kernel, stride):
    """Each window's gradient goes to its FIRST maximum, reading the window row by row."""
    grad = np.zeros_like(x)
    for r, q, rows, cols in windows(x.shape, kernel, stride):
        for n, c in np.ndindex(*x.shape[:2]):
            window = x[n, c, rows, cols]
            i, j = np.unravel_index(np.argmax(window), window.shape)  # argmax: the first maximum
            grad[n, c, rows.start + i, cols.start + j] += g[n, c, r, q]
    return grad


def loops_avg_pool_grad(shape, g, kernel, stride):
    grad = np.zeros(shape)
    for r, q, rows, cols in windows(shape, kernel, stride):
        grad[:, :, rows, cols] += g[:, :, r, q, None, None] / (kernel[0] * kernel[1])
    return grad


def t64(array, requires_grad=False):
    return tt.tensor(np.asarray(array, dtype=np.float64), dtype="float64", requires_grad=requires_grad)


def pair(value):
    return (value, value) if isinstance(value, int) else value


# (kernel, stride) of the pooling checks on a 6x8 input: the windows tile it; they overlap;
# they leave gaps (stride > kernel, a remainder no window covers); non-square, overlapping in
# one direction only; the default stride on a size the kernel does not divide.
POOL_CASES = [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((2, 2), (3, 3)), ((2, 3), (1, 2)), ((3, 3), (3, 3))]


# -- im2col and col2im ------------------------------------------------------------------------------

@check(points=2, hint="im2col: (N, C*kH*kW, H_out*W_out); column l = r * W_out + q holds the window at (r, q) "
                      "listed in (c, i, j) order (transpose the window axes in front of the position axes before "
                      "the reshape); keep every stride-th window on each axis separately; write into out and "
                      "return it when given")
def test_im2col(student):
    x = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)
    for (kh, kw), (sh, sw) in [((2, 3), (1, 2)), ((3, 2), (2, 1)), ((1, 1), (1, 1)), ((5, 7), (1, 1))]:
        cols = student.im2col(np, x, (kh, kw), (sh, sw))
        out_h, out_w = (5 - kh) // sh + 1, (7 - kw) // sw + 1
        assert cols.shape == (2, 3 * kh * kw, out_h * out_w), f"kernel {(kh, kw)}, stride {(sh, sw)}: {cols.shape}"
        assert cols.dtype == np.float32
        expected = np.empty(cols.shape, dtype=np.float32)
        for n, r, q in np.ndindex(2, out_h, out_w):
            expected[n, :, r * out_w + q] = x[n, :, r * sh:r * sh + kh, q * sw:q * sw + kw].reshape(-1)
        np.testing.assert_array_equal(cols, expected, err_msg=f"kernel {(kh, kw)}, stride {(sh, sw)}")
    buffer = np.full((2, 3 * 2 * 3, 4 * 3), -1.0, dtype=np.float32)
    assert student.im2col(np, x, (2, 3), (1, 2), out=buffer) is buffer, "with out=, fill it and return it"
    np.testing.assert_array_equal(buffer, student.im2col(np, x, (2, 3), (1, 2)))


@check(points=2, hint="col2im: for each kernel offset (i, j) ADD (+=, windows overlap) the block cols[:, (c, i, j), :] "
                      "reshaped to (N, C, H_out, W_out) into image[:, :, i : i + s*(H_out-1)+1 : s, j : ...]; pixels "
                      "no window covers stay 0; with out= add into out and return it")
def test_col2im(student):
    ones = np.ones((1, 1, 3, 4))
    counts = student.col2im(np, np.ones((1, 4, 6)), ones.shape, (2, 2), (1, 1))
    assert counts[0, 0].tolist() == [[1, 2, 2, 1], [2, 4, 4, 2], [1, 2, 2, 1]], "each pixel: one per window it is in"
    for shape, kernel, stride in [((2, 3, 7, 6), (3, 2), (2, 3)), ((1, 2, 5, 5), (2, 3), (1, 1))]:
        (kh, kw), (sh, sw) = kernel, stride
        out_h, out_w = (shape[2] - kh) // sh + 1, (shape[3] - kw) // sw + 1
        cols = RNG.standard_normal((shape[0], shape[1] * kh * kw, out_h * out_w))
        expected = np.zeros(shape)
        for n, r, q in np.ndindex(shape[0], out_h, out_w):
            window = cols[n, :, r * out_w + q].reshape(shape[1], kh, kw)
            expected[n, :, r * sh:r * sh + kh, q * sw:q * sw + kw] += window
        np.testing.assert_allclose(student.col2im(np, cols, shape, kernel, stride), expected, atol=1e-12,
                                   err_msg=f"shape {shape}, kernel {kernel}, stride {stride}")
        out = np.zeros(shape)
        assert student.col2im(np, cols, shape, kernel, stride, out=out) is out, "with out=, add into it, return it"
        np.testing.assert_allclose(out, expected, atol=1e-12)


# -- the convolution as one Function ----------------------------------------------------------------

# (x shape, weight shape, stride, padding): odd, non-square, every stride and padding pair.
CONV_CASES = [
    ((2, 3, 5, 4), (4, 3, 3, 3), (1, 1), (1, 1)),
    ((1, 2, 6, 5), (3, 2, 3, 2), (2, 1), (0, 2)),
    ((2, 1, 5, 5), (2, 1, 5, 5), (2, 2), (2, 2)),
    ((1, 2, 7, 6), (2, 2, 2, 3), (3, 2), (1, 0)),
    ((2, 3, 4, 3), (5, 3, 1, 1), (1, 1), (0, 0)),
]


@check(points=2, hint="Conv2dFunction.forward: pad H by padding[0] and W by padding[1], im2col with the stride pair, "
                      "weight.reshape(O, -1) @ cols gives (N, O, L), add bias.reshape(O, 1) when there is one, "
                      "reshape to (N, O, H_out, W_out); keep the input's dtype")
def test_conv_forward(student):
    for x_shape, w_shape, stride, padding in CONV_CASES:
        x, w, b = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape), RNG.standard_normal(w_shape[0])
        got = student.Conv2dFunction.apply(t64(x), t64(w), t64(b), stride=stride, padding=padding).numpy()
        np.testing.assert_allclose(got, loops_conv(x, w, b, stride, padding), atol=1e-10,
                                   err_msg=f"x {x_shape}, weight {w_shape}, stride {stride}, padding {padding}")
        got = student.Conv2dFunction.apply(t64(x), t64(w), stride=stride, padding=padding).numpy()
        np.testing.assert_allclose(got, loops_conv(x, w, None, stride, padding), atol=1e-10,
                                   err_msg=f"without a bias: x {x_shape}, weight {w_shape}")
    x, w = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32), RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    out = student.Conv2dFunction.apply(tt.tensor(x), tt.tensor(w), stride=(1, 1), padding=(1, 1))
    assert out.dtype == np.float32 and out.shape == (1, 3, 4, 4)


@check(points=2, hint="Conv2dFunction.backward: with g = grad as (N, O, L): grad_weight = sum over n of "
                      "g[n] @ cols[n].T reshaped to the weight's shape; grad_cols = W_rows.T @ g, col2im, then cut "
                      "the padding off; grad_bias = g.sum over (0, 2); return one gradient per input")
def test_conv_backward_gradcheck(student):
    for x_shape, w_shape, stride, padding in [((2, 2, 4, 3), (3, 2, 2, 2), (1, 1), (1, 0)),
                                              ((1, 2, 5, 4), (2, 2, 3, 2), (2, 1), (1, 2))]:
        x, w, b = (t64(RNG.standard_normal(s), requires_grad=True) for s in (x_shape, w_shape, w_shape[:1]))
        assert tt.gradcheck(lambda x, w, b: student.Conv2dFunction.apply(x, w, b, stride=stride, padding=padding),
                            [x, w, b])
        assert tt.gradcheck(lambda x, w: student.Conv2dFunction.apply(x, w, stride=stride, padding=padding), [x, w])


@check(points=1, hint="Conv2dFunction.backward: compute grad_weight only if inputs[1].requires_grad and grad_x only "
                      "if inputs[0].requires_grad (None otherwise); grad_x has the UNPADDED input's shape; pixels in "
                      "several windows (stride < kernel) get the sum")
def test_conv_backward_against_loops(student):
    for (x_shape, w_shape, stride, padding), frozen in zip(CONV_CASES[:4], ["x", "weight", None, "x"]):
        x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
        xt, wt = t64(x, requires_grad=frozen != "x"), t64(w, requires_grad=frozen != "weight")
        out = student.Conv2dFunction.apply(xt, wt, stride=stride, padding=padding)
        g = RNG.standard_normal(out.shape)
        out.backward(t64(g))
        grad_x, grad_w, _ = loops_conv_grads(x, w, g, stride, padding)
        where = f"x {x_shape}, weight {w_shape}, stride {stride}, padding {padding}"
        if frozen != "x":
            np.testing.assert_allclose(xt.grad.numpy(), grad_x, atol=1e-10, err_msg=f"input gradient, {where}")
        else:
            assert xt.grad is None
        if frozen != "weight":
            np.testing.assert_allclose(wt.grad.numpy(), grad_w, atol=1e-10, err_msg=f"weight gradient, {where}")
        else:
            assert wt.grad is None


# -- conv2d and Conv2d ------------------------------------------------------------------------------

@check(points=1, hint="conv2d: after the checks, Conv2dFunction.apply(x, weight, [bias,] stride=, padding=) with the "
                      "pairs; leave the bias out of apply when it is None")
def test_conv2d_functional(student):
    x, w, b = RNG.standard_normal((2, 3, 6, 5)), RNG.standard_normal((4, 3, 3, 2)), RNG.standard_normal(4)
    for stride, padding in [(1, 0), (2, 1), ((1, 2), (2, 0))]:
        got = student.conv2d(t64(x), t64(w), t64(b), stride, padding).numpy()
        np.testing.assert_allclose(got, loops_conv(x, w, b, pair(stride), pair(padding)), atol=1e-10,
                                   err_msg=f"stride {stride}, padding {padding}")
    np.testing.assert_allclose(student.conv2d(t64(x), t64(w), stride=2).numpy(), loops_conv(x, w, None, (2, 2)),
                               atol=1e-10)
    np.testing.assert_allclose(student.conv2d(t64(x), t64(w), b=t64(b), padding=1).numpy(),
                               loops_conv(x, w, b, (1, 1), (1, 1)), atol=1e-10)
    small = RNG.standard_normal((1, 3, 2, 1))  # smaller than the kernel, but not once padded
    np.testing.assert_allclose(student.conv2d(t64(small), t64(w), padding=1).numpy(),
                               loops_conv(small, w, None, (1, 1), (1, 1)), atol=1e-10)
    layer = student.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 1))
    np.testing.assert_allclose(layer(tt.tensor(x, dtype="float32")).numpy(),
                               loops_conv(x.astype(np.float32), layer.weight.numpy(), layer.bias.numpy(), (2, 1), (1, 1)),
                               rtol=1e-5, atol=1e-5)


@check(points=2, hint="conv2d raises ValueError naming the shapes (str(x.shape), str(weight.shape)) for a non-4-D "
                      "input or weight, a channel mismatch, a bias that is not (O,), and an input smaller than the "
                      "kernel once padded (say 'kHxkW')")
def test_conv2d_errors_name_the_shapes(student):
    x, w = tt.randn(2, 3, 5, 5), tt.randn(4, 3, 3, 3)
    cases = [
        ((tt.randn(3, 5, 5), w), {}, ["(3, 5, 5)"]),
        ((x, tt.randn(4, 3, 3)), {}, ["(4, 3, 3)"]),
        ((tt.randn(2, 2, 5, 5), w), {}, ["(2, 2, 5, 5)", "(4, 3, 3, 3)"]),
        ((x, w, tt.randn(4, 1)), {}, ["(4, 1)"]),
        ((x, w, tt.randn(3)), {}, ["(3,)"]),
        ((tt.randn(1, 3, 2, 5), w), {}, ["(1, 3, 2, 5)", "3x3"]),
        ((tt.randn(1, 3, 5, 1), w), {"padding": (2, 0)}, ["(1, 3, 5, 1)", "3x3"]),
    ]
    for args, kwargs, words in cases:
        shapes = [a.shape for a in args]
        with pytest.raises(ValueError) as error:
            student.conv2d(*args, **kwargs)
        assert all(word in str(error.value) for word in words), f"shapes {shapes}: {error.value} (name {words})"


@check(points=2, hint="Conv2d.__init__: weight (out, in, kH, kW) and bias (out,) from U(-1/sqrt(fan_in), "
                      "1/sqrt(fan_in)) with fan_in = in_channels * kH * kW (both of them), via _uniform_parameter; "
                      "bias=False stores None")
def test_conv2d_layer_init(student):
    tt.manual_seed(0)
    layer = student.Conv2d(2, 300, (3, 2))
    assert layer.weight.shape == (300, 2, 3, 2) and layer.bias.shape == (300,)
    assert layer.weight.dtype == np.float32 and layer.weight.requires_grad and layer.bias.requires_grad
    assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
    bound = 1 / np.sqrt(2 * 3 * 2)
    for name, values in [("weight", layer.weight.numpy()), ("bias", layer.bias.numpy())]:
        top = np.abs(values).max()
        assert 0.9 * bound < top <= bound, f"{name}: largest |value| {top:.4f}, expected up to 1/sqrt(12) = {bound:.4f}"
        assert abs(values.mean()) < 0.2 * bound, f"{name}: uniform around 0"
    plain = student.Conv2d(3, 4, 3, bias=False)
    assert plain.bias is None and len(plain.parameters()) == 1 and plain.weight.shape == (4, 3, 3, 3)
    tt.manual_seed(5)
    first = student.Conv2d(3, 2, 3).weight.numpy()
    tt.manual_seed(5)
    assert np.array_equal(first, student.Conv2d(3, 2, 3).weight.numpy()), "initialise from the seeded generator"


# -- pooling ----------------------------------------------------------------------------------------

@check(points=2, hint="MaxPool2dFunction.forward: start from a copy of the first offset's slice (not zeros: values "
                      "may be negative), xp.maximum with every other offset's slice; use window_slices, which "
                      "handles overlapping windows and gaps; keep the dtype")
def test_max_pool_forward(student):
    x = RNG.standard_normal((2, 3, 6, 8)) - 1.0  # mostly negative
    for kernel, stride in POOL_CASES:
        got = student.MaxPool2dFunction.apply(t64(x), kernel=kernel, stride=stride).numpy()
        np.testing.assert_array_equal(got, loops_pool(x, kernel, stride, np.max),
                                      err_msg=f"kernel {kernel}, stride {stride}")
    out = student.max_pool2d(tt.tensor(x, dtype="float32"), 2)
    assert out.dtype == np.float32 and out.shape == (2, 3, 3, 4)
    np.testing.assert_array_equal(student.MaxPool2d(3, 2)(t64(x)).numpy(), loops_pool(x, (3, 3), (2, 2), np.max))


@check(points=2, hint="max pooling sends each window's gradient to its FIRST maximum, row by row: in forward, an "
                      "offset takes over only if STRICTLY greater (>, not >=), remember the winning offset per "
                      "window; in backward give grad where winner == k, 0 elsewhere")
def test_max_pool_backward_ties(student):
    x = np.zeros((1, 2, 6, 8))
    x[0, 1, ::2, ::3] = 1.0  # windows of zeros and windows with repeated ones: ties everywhere
    x[0, 0, 3:, :] = -1.0
    for kernel, stride in POOL_CASES:
        xt = t64(x, requires_grad=True)
        out = student.MaxPool2dFunction.apply(xt, kernel=kernel, stride=stride)
        g = RNG.standard_normal(out.shape)
        out.backward(t64(g))
        np.testing.assert_allclose(xt.grad.numpy(), loops_max_pool_grad(x, g, kernel, stride), atol=1e-12,
                                   err_msg=f"kernel {kernel}, stride {stride}: the first maximum takes it all")


@check(points=1, hint="MaxPool2dFunction.backward: on the tiled path assign EVERY element of each slice (the array is "
                      "uninitialised: xp.multiply(grad, winner == k, out=slice)); otherwise ADD (+=) into zeros, "
                      "since an element can win several overlapping windows")
def test_max_pool_backward_values(student):
    for kernel, stride in POOL_CASES:
        for trial in range(2):  # the second round reuses the arrays of the first (the buffer cache)
            x = RNG.permutation(2 * 3 * 6 * 8).reshape(2, 3, 6, 8) / 10.0  # distinct values
            xt = t64(x, requires_grad=True)
            out = student.max_pool2d(xt, kernel, stride)
            g = RNG.standard_normal(out.shape)
            out.backward(t64(g))
            np.testing.assert_allclose(xt.grad.numpy(), loops_max_pool_grad(x, g, kernel, stride), atol=1e-12,
                                       err_msg=f"kernel {kernel}, stride {stride}, round {trial + 1}")
            del xt, out
    xt = t64(RNG.permutation(2 * 5 * 6).reshape(1, 2, 5, 6) / 7.0, requires_grad=True)
    assert tt.gradcheck(lambda x: student.max_pool2d(x, (2, 3), (1, 2)), [xt])


@check(points=1, hint="AvgPool2dFunction.forward: add up the kH*kW offset slices (start from a copy of the first) "
                      "and divide by kH*kW")
def test_avg_pool_forward(student):
    x = RNG.standard_normal((2, 3, 6, 8))
    for kernel, stride in POOL_CASES:
        got = student.AvgPool2dFunction.apply(t64(x), kernel=kernel, stride=stride).numpy()
        np.testing.assert_allclose(got, loops_pool(x, kernel, stride, np.mean), rtol=1e-12, atol=1e-12,
                                   err_msg=f"kernel {kernel}, stride {stride}")
    out = student.AvgPool2d(2)(tt.tensor(x, dtype="float32"))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), loops_pool(x, (2, 2), (2, 2), np.mean), rtol=1e-5, atol=1e-6)


@check(points=2, hint="AvgPool2dFunction.backward: every element of a window gets grad / (kH*kW); use gradient_slices: "
                      "on the tiled path assign each slice, otherwise ADD (+=) since windows overlap; elements in "
                      "no window get 0")
def test_avg_pool_backward(student):
    for kernel, stride in POOL_CASES:
        for trial in range(2):  # the second round reuses the arrays of the first (the buffer cache)
            xt = t64(RNG.standard_normal((2, 3, 6, 8)), requires_grad=True)
            out = student.avg_pool2d(xt, kernel, stride)
            g = RNG.standard_normal(out.shape)
            out.backward(t64(g))
            np.testing.assert_allclose(xt.grad.numpy(), loops_avg_pool_grad(xt.shape, g, kernel, stride),
                                       rtol=1e-12, atol=1e-12, err_msg=f"kernel {kernel}, stride {stride}")
            del xt, out
    xt = t64(RNG.standard_normal((1, 2, 5, 4)), requires_grad=True)
    assert tt.gradcheck(lambda x: student.avg_pool2d(x, (3, 2), (1, 2)), [xt])


# -- everything together ------------------------------------------------------------------------------

@check(points=1, hint="a Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d block: the convolution's output feeds the "
                      "per-channel statistics over (N, H, W); every piece must work in float32 and pass gradients on")
def test_conv_batchnorm_block(student):
    tt.manual_seed(0)
    conv, norm, pool = student.Conv2d(2, 3, 3, padding=1), student.BatchNorm2d(3), student.MaxPool2d(2)
    block = tt.nn.Sequential(conv, norm, tt.nn.ReLU(), pool)
    x = RNG.standard_normal((4, 2, 6, 4)).astype(np.float32)
    y = loops_conv(x, conv.weight.numpy(), conv.bias.numpy(), (1, 1), (1, 1))
    mean, var = y.mean(axis=(0, 2, 3), keepdims=True), y.var(axis=(0, 2, 3), keepdims=True)
    expected = loops_pool(np.maximum((y - mean) / np.sqrt(var + 1e-5), 0), (2, 2), (2, 2), np.max)
    out = block(tt.tensor(x))
    assert out.shape == (4, 3, 3, 2) and out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(norm.running_mean.numpy(), 0.1 * mean.ravel(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(norm.running_var.numpy(), 0.9 + 0.1 * y.var(axis=(0, 2, 3), ddof=1), rtol=1e-4)
    out.sum().backward()
    assert conv.weight.grad.shape == (3, 2, 3, 3) and np.abs(conv.weight.grad.numpy()).sum() > 0
    block.eval()
    running_mean, running_var = norm.running_mean.numpy().reshape(1, 3, 1, 1), norm.running_var.numpy().reshape(1, 3, 1, 1)
    expected = loops_pool(np.maximum((y - running_mean) / np.sqrt(running_var + 1e-5), 0), (2, 2), (2, 2), np.max)
    np.testing.assert_allclose(block(tt.tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):
        norm(tt.randn(4, 3, 5))


@check(points=1, hint="all array math goes through the xp you are given (self.xp in a Function): make new arrays with "
                      "xp.zeros / xp.empty (or buffers), never np.zeros -- the same code must run on the strict device")
def test_runs_on_another_device(student):
    x, w, b = RNG.standard_normal((2, 2, 5, 4)), RNG.standard_normal((3, 2, 3, 2)), RNG.standard_normal(3)
    results = []
    for device in ("cpu", "strict"):
        xt, wt, bt = (tt.tensor(a, dtype="float64", device=device, requires_grad=True) for a in (x, w, b))
        y = student.conv2d(xt, wt, bt, stride=(1, 2), padding=1)  # (2, 3, 5, 3)
        overlapping = student.max_pool2d(y, 2, 1).sum() + student.avg_pool2d(y, 2, 1).sum()
        tiled = (student.max_pool2d(y, (5, 1)) * 2.0).sum() + (student.avg_pool2d(y, (1, 3)) * 3.0).sum()
        (overlapping + tiled).backward()
        assert y.device == xt.device
        results.append([a.numpy() for a in (y, xt.grad, wt.grad, bt.grad)])
    for cpu, strict in zip(*results):
        np.testing.assert_allclose(strict, cpu, atol=1e-12)
