"""Module 11: convolution, pooling and BatchNorm2d.

Values against an independent NumPy reference (a sum over kernel offsets, not
im2col), gradients with ``tt.gradcheck`` in float64 for input, weight and bias
over strides, paddings and odd, non-square shapes (drawn by hypothesis, kept
tiny: gradcheck runs two forward passes per element), the max-pooling tie rule
and its parts of the batch, errors that name the shapes, and equality with
PyTorch when it is installed. Every test that creates tensors runs on every
device: on the CPU the convolution runs the library's kernels
(``tinytrain.kernels.convolution``, tested on their own in
``test_kernels_convolution.py``), on the strict device the lesson's recipe.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
import tinytrain.nn as nn
import tinytrain.nn.functional as F
from tinytrain.kernels import parts
from tinytrain.nn import conv
from tinytrain.nn.conv import Conv2dFunction, col2im, im2col, output_size


def tensor64(a, device, requires_grad=False):
    return tt.tensor(np.asarray(a, dtype=np.float64), dtype="float64", device=device, requires_grad=requires_grad)


def reference_conv(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    """Convolution as a sum over kernel offsets (independent of im2col), in float64."""
    (sh, sw), (ph, pw) = stride, padding
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    _, _, kh, kw = w.shape
    out_h, out_w = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    out = np.zeros((x.shape[0], w.shape[0], out_h, out_w))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + sh * (out_h - 1) + 1:sh, j:j + sw * (out_w - 1) + 1:sw]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def reference_pool(x, kernel, stride, reduce):
    (kh, kw), (sh, sw) = kernel, stride
    out_h, out_w = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    out = np.empty(x.shape[:2] + (out_h, out_w))
    for r in range(out_h):
        for q in range(out_w):
            out[:, :, r, q] = reduce(x[:, :, r * sh:r * sh + kh, q * sw:q * sw + kw], axis=(2, 3))
    return out


@st.composite
def conv_cases(draw, max_side=6):
    """(x shape, weight shape, stride, padding): tiny, odd and non-square, padded input >= kernel."""
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(max(1, kh - 2 * padding[0]), max_side))
    w = draw(st.integers(max(1, kw - 2 * padding[1]), max_side))
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    return (n, c, h, w), (o, c, kh, kw), stride, padding


# -- im2col and col2im ---------------------------------------------------------------------

def test_im2col_order_and_shape() -> None:
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    cols = im2col(np, x, (2, 3), (1, 2))
    assert cols.shape == (2, 3 * 2 * 3, 3 * 2) and cols.dtype == np.float32
    # column l = r * W_out + q lists the window at (r, q) in (c, i, j) order
    for n, r, q in [(0, 0, 0), (1, 2, 1), (0, 1, 1)]:
        window = x[n, :, r:r + 2, 2 * q:2 * q + 3]
        np.testing.assert_array_equal(cols[n, :, r * 2 + q], window.reshape(-1))


@given(case=conv_cases(max_side=7), seed=st.integers(0, 1000))
def test_col2im_is_the_adjoint_of_im2col(case, seed) -> None:
    (n, c, h, w), (_, _, kh, kw), stride, _ = case
    if h < kh or w < kw:
        return
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, c, h, w))
    cols = im2col(np, a, (kh, kw), stride)
    b = rng.standard_normal(cols.shape)
    assert np.isclose((cols * b).sum(), (a * col2im(np, b, a.shape, (kh, kw), stride)).sum())


def test_output_size() -> None:
    assert output_size(28, 3, 1, 1) == 28 and output_size(28, 3, 2, 1) == 14 and output_size(7, 3, 2) == 3


# -- conv2d: values and gradients ----------------------------------------------------------------

@given(case=conv_cases(), seed=st.integers(0, 1000), bias=st.booleans())
def test_conv2d_matches_reference(device, case, seed, bias) -> None:
    x_shape, w_shape, stride, padding = case
    rng = np.random.default_rng(seed)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    out = F.conv2d(tensor64(x, device), tensor64(w, device), tensor64(b, device) if bias else None,
                   stride=stride, padding=padding)
    np.testing.assert_allclose(out.numpy(), reference_conv(x, w, b if bias else None, stride, padding),
                               rtol=1e-10, atol=1e-10)


@given(case=conv_cases(), seed=st.integers(0, 1000))
def test_conv2d_gradcheck_input_weight_bias(device, case, seed) -> None:
    x_shape, w_shape, stride, padding = case
    rng = np.random.default_rng(seed)
    x = tensor64(rng.standard_normal(x_shape), device, requires_grad=True)
    w = tensor64(rng.standard_normal(w_shape), device, requires_grad=True)
    b = tensor64(rng.standard_normal(w_shape[0]), device, requires_grad=True)
    assert tt.gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding), [x, w, b])


@pytest.mark.parametrize("kernel, stride", [(2, 2), (3, 1), ((2, 3), (2, 1))])
def test_max_pool_in_parts_equals_the_whole_batch_at_once(kernel, stride) -> None:
    """Pooled a few images at a time (overlapping windows too), with ties: the same values and first-maximum gradients."""
    rng = np.random.default_rng(4)
    x_host = np.maximum(rng.standard_normal((5, 2, 6, 7)), 0)  # ReLU output: many tied zeros
    grad = rng.standard_normal(F.max_pool2d(tt.tensor(x_host), kernel, stride).shape)
    results = []
    for cache_bytes in (x_host[0].nbytes * 2, parts.CACHE_BYTES):  # parts of 2, 2 and 1 images; one part
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(parts, "CACHE_BYTES", cache_bytes)
            x = tensor64(x_host, "cpu", requires_grad=True)
            out = F.max_pool2d(x, kernel, stride)
            out.backward(tt.tensor(grad))
            results.append((out.numpy(), x.grad.numpy()))
    (parts_out, parts_grad), (whole_out, whole_grad) = results
    np.testing.assert_array_equal(parts_out, whole_out)
    np.testing.assert_array_equal(parts_grad, whole_grad)
    np.testing.assert_allclose(whole_out, reference_pool(x_host, _pair(kernel), _pair(stride), np.max))


def _pair(value):
    return value if isinstance(value, tuple) else (value, value)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
def test_conv2d_gradcheck_grid(device, stride, padding) -> None:
    """Every stride/padding pair on an odd, non-square input, with and without bias."""
    rng = np.random.default_rng(stride * 10 + padding)
    x = tensor64(rng.standard_normal((2, 2, 5, 4)), device, requires_grad=True)
    w = tensor64(rng.standard_normal((3, 2, 3, 2)), device, requires_grad=True)
    b = tensor64(rng.standard_normal(3), device, requires_grad=True)
    assert tt.gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding), [x, w, b])
    assert tt.gradcheck(lambda x, w: F.conv2d(x, w, stride=(stride, 1), padding=(padding, 1)), [x, w])


def test_conv2d_bias_keyword_spellings(device) -> None:
    x, w, b = tt.randn(1, 2, 4, 4, device=device), tt.randn(3, 2, 3, 3, device=device), tt.randn(3, device=device)
    expected = F.conv2d(x, w, b, 1, 1).numpy()
    np.testing.assert_array_equal(F.conv2d(x, w, bias=b, padding=1).numpy(), expected)
    np.testing.assert_array_equal(F.conv2d(x, w, b=b, padding=1).numpy(), expected)  # the design's spelling
    with pytest.raises(TypeError, match="once"):
        F.conv2d(x, w, b, b=b)


def test_conv2d_skips_gradients_nobody_needs(device) -> None:
    layer = nn.Conv2d(2, 3, 3, padding=1).to(device)
    x = tt.randn(2, 2, 5, 5, device=device)  # input images: no gradient wanted
    layer(x).sum().backward()
    assert x.grad is None and layer.weight.grad.shape == (3, 2, 3, 3)
    np.testing.assert_allclose(layer.bias.grad.numpy(), [50.0] * 3)
    layer.weight.requires_grad_(False)
    layer.bias.grad = None
    x.requires_grad_()
    layer(x).sum().backward()
    assert x.grad.shape == x.shape and layer.bias.grad is not None


@pytest.mark.parametrize("frozen", ["x", "weight", "bias", "weight and bias"])
def test_conv2d_gradients_with_some_inputs_frozen(device, frozen) -> None:
    """The bias is the weight of a row of ones in the product, forward and backward: every
    combination of inputs that want a gradient gets exact ones, and the others get none."""
    rng = np.random.default_rng(3)
    arrays = {"x": rng.standard_normal((3, 2, 5, 4)), "weight": rng.standard_normal((4, 2, 3, 3)),
              "bias": rng.standard_normal(4)}
    leaves = {name: tensor64(a, device, requires_grad=name not in frozen.split(" and ")) for name, a in arrays.items()}
    out = F.conv2d(leaves["x"], leaves["weight"], leaves["bias"], padding=1)
    np.testing.assert_allclose(out.numpy(), reference_conv(arrays["x"], arrays["weight"], arrays["bias"], (1, 1), (1, 1)),
                               rtol=1e-10, atol=1e-10)
    out.sum().backward()
    for name, leaf in leaves.items():
        assert (leaf.grad is None) == (name in frozen.split(" and ")), name
    if leaves["bias"].grad is not None:
        np.testing.assert_allclose(leaves["bias"].grad.numpy(), [3 * 5 * 4] * 4)
    assert tt.gradcheck(lambda x, w, b: F.conv2d(x, w, b, padding=1), list(leaves.values()))


@pytest.mark.parametrize("stride, padding", [(1, 0), (1, 1), (2, 1)])
def test_conv2d_on_an_empty_batch(device, stride, padding) -> None:
    """No images: an empty result and input gradient, zero weight and bias gradients (a reshape of the
    gradient to (0, 8, -1) cannot infer its last axis)."""
    x = tt.zeros(0, 3, 6, 5, device=device, requires_grad=True)
    layer = nn.Conv2d(3, 8, 3, stride=stride, padding=padding).to(device)
    out = layer(x)
    side = (6 + 2 * padding - 3) // stride + 1, (5 + 2 * padding - 3) // stride + 1
    assert out.shape == (0, 8) + side
    out.sum().backward()
    assert x.grad.shape == (0, 3, 6, 5)
    np.testing.assert_array_equal(layer.weight.grad.numpy(), np.zeros((8, 3, 3, 3), np.float32))
    np.testing.assert_array_equal(layer.bias.grad.numpy(), np.zeros(8, np.float32))


def test_conv2d_bias_of_another_float_dtype_keeps_the_result_dtype(device) -> None:
    """A float64 bias on a float32 convolution is added in float32, as ``out += bias`` would."""
    x, w = tt.randn(2, 2, 4, 4, device=device), tt.randn(3, 2, 3, 3, device=device)
    bias = tt.tensor(np.arange(3.0), dtype="float64", device=device)
    out = F.conv2d(x, w, bias, padding=1)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), F.conv2d(x, w, padding=1).numpy() + np.arange(3.0)[:, None, None],
                               rtol=1e-5, atol=1e-5)


def test_conv2d_result_device_and_dtype(device, canonical_device) -> None:
    x, w = tt.randn(1, 2, 4, 4, device=device), tt.randn(3, 2, 3, 3, device=device)
    out = F.conv2d(x, w, padding=1)
    assert out.device == canonical_device and out.dtype == np.float32 and out.shape == (1, 3, 4, 4)
    assert out._ctx is None  # no input requires grad: nothing recorded
    assert type(F.conv2d(x, w.requires_grad_(), padding=1)._ctx) is Conv2dFunction


def test_conv2d_two_graphs_alive_at_once(device) -> None:
    """Saved columns are never reused while a graph holds them (the buffer cache's safety)."""
    layer = nn.Conv2d(2, 3, 3).to(device, dtype="float64")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 2, 6, 6)), rng.standard_normal((2, 2, 6, 6))
    first, second = layer(tensor64(a, device)).sum(), layer(tensor64(b, device)).sum()
    first.backward()
    from_first = layer.weight.grad.numpy()
    layer.zero_grad()
    second.backward()
    from_second = layer.weight.grad.numpy()
    layer.zero_grad()
    layer(tensor64(b, device)).sum().backward()
    np.testing.assert_allclose(from_second, layer.weight.grad.numpy(), rtol=1e-12)
    layer.zero_grad()
    layer(tensor64(a, device)).sum().backward()
    np.testing.assert_allclose(from_first, layer.weight.grad.numpy(), rtol=1e-12)


def test_conv2d_retain_graph_backward_twice() -> None:
    layer = nn.Conv2d(1, 2, 3)
    x = tt.randn(2, 1, 5, 5, requires_grad=True)
    loss = layer(x).sum()
    loss.backward(retain_graph=True)
    once = layer.weight.grad.numpy()
    layer(tt.randn(2, 1, 5, 5)).sum()  # another forward in between must not clobber the saved columns
    loss.backward()
    np.testing.assert_allclose(layer.weight.grad.numpy(), 2 * once, rtol=1e-6)


# -- Conv2d: the layer ---------------------------------------------------------------------------

def test_conv2d_layer_layout_init_and_repr() -> None:
    tt.manual_seed(0)
    layer = nn.Conv2d(4, 16, (3, 5), stride=2, padding=(1, 2))
    assert layer.weight.shape == (16, 4, 3, 5) and layer.bias.shape == (16,)
    assert (layer.kernel_size, layer.stride, layer.padding) == ((3, 5), (2, 2), (1, 2))
    assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
    bound = 1 / math.sqrt(4 * 3 * 5)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound and np.abs(w).max() > 0.98 * bound
    np.testing.assert_allclose(w.var(), bound**2 / 3, rtol=0.1)
    assert repr(layer) == "Conv2d(4, 16, kernel_size=(3, 5), stride=(2, 2), padding=(1, 2), bias=True)"
    assert nn.Conv2d(1, 2, 3, bias=False).bias is None and len(nn.Conv2d(1, 2, 3, bias=False).parameters()) == 1
    assert layer(tt.randn(2, 4, 9, 8)).shape == (2, 16, 5, 4)


def test_conv2d_layer_is_reproducible_and_trains(device) -> None:
    tt.manual_seed(5)
    a = nn.Conv2d(1, 2, 3)
    tt.manual_seed(5)
    b = nn.Conv2d(1, 2, 3)
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(16, 2)).to(device)
    optimizer = tt.optim.SGD(model.parameters(), lr=0.1)
    x = tt.randn(8, 1, 4, 4, device=device)
    y = tt.tensor(np.arange(8) % 2, device=device)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: F.conv2d(tt.randn(2, 3, 8, 8, device=d), tt.randn(4, 2, 3, 3, device=d)),
         ["(2, 3, 8, 8)", "(4, 2, 3, 3)", "channels"]),
        (lambda d: F.conv2d(tt.randn(1, 1, 2, 5, device=d), tt.randn(1, 1, 3, 3, device=d)),
         ["(1, 1, 2, 5)", "3x3", "smaller"]),
        (lambda d: F.conv2d(tt.randn(1, 1, 2, 2, device=d), tt.randn(1, 1, 5, 5, device=d), padding=1),
         ["(1, 1, 2, 2)", "4x4", "5x5"]),
        (lambda d: F.conv2d(tt.randn(3, 8, 8, device=d), tt.randn(4, 3, 3, 3, device=d)),
         ["(3, 8, 8)", "(N, C, H, W)"]),
        (lambda d: F.conv2d(tt.randn(1, 3, 8, 8, device=d), tt.randn(4, 3, 3, device=d)), ["(4, 3, 3)"]),
        (lambda d: F.conv2d(tt.randn(1, 3, 8, 8, device=d), tt.randn(4, 3, 3, 3, device=d), tt.randn(3, device=d)),
         ["(3,)", "(4,)"]),
        (lambda d: nn.Conv2d(3, 8, 3).to(d)(tt.randn(2, 1, 8, 8, device=d)), ["(2, 1, 8, 8)", "(N, 3, H, W)"]),
        (lambda d: nn.Conv2d(3, 8, 3).to(d)(tt.randn(2, 3, 8, device=d)), ["(2, 3, 8)"]),
        (lambda d: F.conv2d(tt.randn(1, 1, 4, 4, device=d), tt.randn(1, 1, 3, 3, device=d), stride=0), ["stride"]),
        (lambda d: F.conv2d(tt.randn(1, 1, 4, 4, device=d), tt.randn(1, 1, 3, 3, device=d), padding=-1),
         ["padding"]),
        (lambda d: nn.Conv2d(0, 8, 3), ["in_channels=0"]),
    ],
)
def test_conv2d_bad_input_names_the_shapes(device, make, words) -> None:
    with pytest.raises(ValueError) as info:
        make(device)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_conv2d_bad_argument_types() -> None:
    for bad in (1.5, (1, 2, 3), "2", True):
        with pytest.raises(TypeError, match="kernel_size"):
            nn.Conv2d(1, 1, bad)


# -- pooling ------------------------------------------------------------------------------------

@st.composite
def pool_cases(draw):
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    h, w = draw(st.integers(kernel[0], 7)), draw(st.integers(kernel[1], 7))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 2)), h, w), kernel, stride


@given(case=pool_cases(), seed=st.integers(0, 1000))
def test_pooling_values_and_gradients(device, case, seed) -> None:
    shape, kernel, stride = case
    # distinct values, so that the maximum is unique and finite differences are exact
    a = np.random.default_rng(seed).permutation(math.prod(shape)).reshape(shape) / 8.0
    x = tensor64(a, device, requires_grad=True)
    effective = kernel if stride is None else stride
    np.testing.assert_array_equal(F.max_pool2d(x, kernel, stride).numpy(), reference_pool(a, kernel, effective, np.max))
    np.testing.assert_allclose(F.avg_pool2d(x, kernel, stride).numpy(), reference_pool(a, kernel, effective, np.mean),
                               rtol=1e-12)
    assert tt.gradcheck(lambda x: F.max_pool2d(x, kernel, stride), [x])
    assert tt.gradcheck(lambda x: F.avg_pool2d(x, kernel, stride), [x])


@pytest.mark.parametrize("kernel, stride", [(2, None), (2, 1), (3, 2), ((2, 3), (2, 1))])
def test_max_pool_ties_go_to_the_first_maximum(device, kernel, stride) -> None:
    """PyTorch's rule: within a window (read row by row) the first maximum gets the whole gradient."""
    a = np.zeros((1, 2, 6, 7))
    a[0, 1, ::2, ::3] = 1.0  # more ties: repeated ones among zeros
    x = tensor64(a, device, requires_grad=True)
    out = F.max_pool2d(x, kernel, stride)
    g = np.random.default_rng(0).standard_normal(out.shape)
    out.backward(tensor64(g, device))
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    sh, sw = (kh, kw) if stride is None else (stride, stride) if isinstance(stride, int) else stride
    expected = np.zeros_like(a)
    for n, c, r, q in np.ndindex(*out.shape):
        window = a[n, c, r * sh:r * sh + kh, q * sw:q * sw + kw]
        i, j = np.unravel_index(np.argmax(window), window.shape)  # argmax: the first maximum
        expected[n, c, r * sh + i, q * sw + j] += g[n, c, r, q]
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)


def test_pooling_fast_and_generic_paths_agree(device) -> None:
    """The reshape path (windows tile the input) and the sliding-window path give the same."""
    a = np.random.default_rng(0).standard_normal((2, 3, 8, 6))
    for fn in (F.max_pool2d, F.avg_pool2d):
        tiled, generic = tensor64(a, device, requires_grad=True), tensor64(a[:, :, :7, :5], device, requires_grad=True)
        fn(tiled, 2).sum().backward()
        fn(generic, 2).sum().backward()  # 7x5 is not divisible by 2: the generic path, same windows
        np.testing.assert_allclose(fn(tiled, 2).numpy()[:, :, :3, :2], fn(generic, 2).numpy())
        np.testing.assert_allclose(tiled.grad.numpy()[:, :, :6, :4], generic.grad.numpy()[:, :, :6, :4])
        assert (generic.grad.numpy()[:, :, 6, :] == 0).all() and (generic.grad.numpy()[:, :, :, 4] == 0).all()


def test_pool_layers_and_defaults(device) -> None:
    x = tt.randn(2, 3, 9, 8, device=device)
    pool = nn.MaxPool2d(2)
    assert pool.stride == (2, 2) and repr(pool) == "MaxPool2d(kernel_size=(2, 2), stride=(2, 2))"
    assert pool(x).shape == (2, 3, 4, 4) and nn.AvgPool2d(3, 2)(x).shape == (2, 3, 4, 3)
    assert repr(nn.AvgPool2d((2, 3), 1)) == "AvgPool2d(kernel_size=(2, 3), stride=(1, 1))"
    assert pool.parameters() == [] and pool(x).device == x.device
    np.testing.assert_allclose(nn.AvgPool2d(1)(x).numpy(), x.numpy())


@pytest.mark.parametrize("fn", [F.max_pool2d, F.avg_pool2d])
def test_pooling_bad_input(device, fn) -> None:
    with pytest.raises(ValueError, match=r"\(1, 1, 2, 5\).*3x3"):
        fn(tt.randn(1, 1, 2, 5, device=device), 3)
    with pytest.raises(ValueError, match=r"\(2, 4, 4\)"):
        fn(tt.randn(2, 4, 4, device=device), 2)
    with pytest.raises(ValueError, match="kernel_size"):
        fn(tt.randn(1, 1, 4, 4, device=device), 0)
    with pytest.raises(ValueError, match="stride"):
        fn(tt.randn(1, 1, 4, 4, device=device), 2, (1, 0))


def test_max_pool_nan_propagates(device) -> None:
    a = np.array([[[[1.0, np.nan], [2.0, 0.0]]]])
    assert np.isnan(F.max_pool2d(tensor64(a, device), 2).numpy()).all()


@pytest.mark.parametrize("tiled", [True, False])
def test_max_pool_gradient_of_a_window_with_nan_is_pinned(device, tiled) -> None:
    """A documented limitation (MaxPool2dFunction's docstring): the forward pass does not look for NaN, so a
    window holding NaN sends its gradient to the first maximum of the elements before its first NaN (to the NaN
    itself when it comes first). PyTorch sends it to the window's last NaN. Pinned so that a change is deliberate."""
    windows = [[[1.0, np.nan], [2.0, 0.0]],  # 1.0 comes before the NaN: it gets the gradient
               [[np.nan, 5.0], [6.0, 7.0]],  # the NaN comes first: the NaN gets it
               [[3.0, 4.0], [np.nan, np.nan]],  # 4.0
               [[0.0, 0.0], [9.0, np.nan]]]  # 9.0
    winners = [(0, 0), (0, 0), (0, 1), (1, 0)]
    a = np.concatenate(windows, axis=1)[None, None]  # (1, 1, 2, 8): four 2x2 windows side by side
    if not tiled:
        a = np.pad(a, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-1.0)  # 3x9: windows do not tile it
    x = tensor64(a, device, requires_grad=True)
    out = F.max_pool2d(x, 2)
    assert out.shape == (1, 1, 1, 4) and np.isnan(out.numpy()).all()
    out.backward(tt.tensor(np.array([[[[10.0, 20.0, 30.0, 40.0]]]]), device=device))
    expected = np.zeros_like(a)
    for w, ((i, j), g) in enumerate(zip(winners, (10.0, 20.0, 30.0, 40.0))):
        expected[0, 0, i, 2 * w + j] = g
    np.testing.assert_array_equal(x.grad.numpy(), expected)


# -- BatchNorm2d -----------------------------------------------------------------------------------

def test_batchnorm2d_train_eval_and_state(device) -> None:
    a = np.random.default_rng(1).normal(2.0, 3.0, size=(4, 3, 5, 6))
    bn = nn.BatchNorm2d(3).to(device, dtype="float64")
    out = bn(tensor64(a, device)).numpy()
    mean, var = a.mean(axis=(0, 2, 3), keepdims=True), a.var(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(out, (a - mean) / np.sqrt(var + 1e-5), rtol=1e-10)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * a.mean(axis=(0, 2, 3)), rtol=1e-10)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * a.var(axis=(0, 2, 3), ddof=1), rtol=1e-10)
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    bn.eval()
    mean, var = bn.running_mean.numpy().reshape(1, 3, 1, 1), bn.running_var.numpy().reshape(1, 3, 1, 1)
    expected = (a - mean) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(bn(tensor64(a, device)).numpy(), expected, rtol=1e-10)
    assert repr(bn) == "BatchNorm2d(3, eps=1e-05, momentum=0.1)"


def test_batchnorm2d_gradcheck(device) -> None:
    bn = nn.BatchNorm2d(2).to(device, dtype="float64")
    x = tensor64(np.random.default_rng(2).standard_normal((3, 2, 3, 2)), device, requires_grad=True)
    assert tt.gradcheck(lambda x, w, b: bn(x), [x, bn.weight, bn.bias])


def test_batchnorm2d_bad_input(device) -> None:
    bn = nn.BatchNorm2d(3).to(device)
    for shape in [(4, 3, 5), (4, 2, 5, 5)]:
        with pytest.raises(ValueError, match=str(shape).replace("(", r"\(").replace(")", r"\)")):
            bn(tt.randn(*shape, device=device))


# -- against PyTorch ---------------------------------------------------------------------------------

@pytest.mark.parametrize("stride, padding, bias", [(1, 0, True), (1, 1, False), (2, 1, True), ((2, 1), (0, 2), True)])
def test_conv2d_matches_pytorch(stride, padding, bias) -> None:
    torch = pytest.importorskip("torch")
    tt.manual_seed(0)
    layer = nn.Conv2d(3, 5, (3, 2), stride=stride, padding=padding, bias=bias)
    reference = torch.nn.Conv2d(3, 5, (3, 2), stride=stride, padding=padding, bias=bias)
    reference.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in layer.state_dict().items()})
    a = np.random.default_rng(0).standard_normal((4, 3, 9, 8)).astype(np.float32)
    x, tx = tt.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    out, expected = layer(x), reference(tx)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    out.backward(tt.tensor(g))
    expected.backward(torch.from_numpy(g))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.weight.grad.numpy(), reference.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    if bias:
        np.testing.assert_allclose(layer.bias.grad.numpy(), reference.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel, stride", [(2, None), (3, 1), (3, 2), ((2, 3), (1, 2))])
def test_pooling_matches_pytorch(kernel, stride) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a = np.maximum(rng.standard_normal((2, 3, 9, 8)), 0).astype(np.float32)  # ReLU output: many tied zeros
    pairs = [(F.max_pool2d, torch.nn.functional.max_pool2d), (F.avg_pool2d, torch.nn.functional.avg_pool2d)]
    for ours, theirs in pairs:
        x, tx = tt.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        out, expected = ours(x, kernel, stride), theirs(tx, kernel, stride)
        np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-6, atol=1e-7)
        g = rng.standard_normal(out.shape).astype(np.float32)
        out.backward(tt.tensor(g))
        expected.backward(torch.from_numpy(g))
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)  # ties included


def test_batchnorm2d_matches_pytorch() -> None:
    torch = pytest.importorskip("torch")
    bn, reference = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    rng = np.random.default_rng(0)
    bn.weight.data[...] = rng.uniform(0.5, 1.5, 3).astype(np.float32)
    bn.bias.data[...] = rng.standard_normal(3).astype(np.float32)
    reference.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in bn.state_dict().items()})
    for _ in range(3):
        a = rng.normal(1.0, 2.0, (4, 3, 5, 6)).astype(np.float32)
        x, tx = tt.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        out, expected = bn(x), reference(tx)
        np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
        g = rng.standard_normal(a.shape).astype(np.float32)
        out.backward(tt.tensor(g))
        expected.backward(torch.from_numpy(g))
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(bn.weight.grad.numpy(), reference.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
        bn.zero_grad()
        reference.zero_grad()
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(bn, name).numpy(), getattr(reference, name).numpy(), rtol=1e-5)
    bn.eval()
    reference.eval()
    a = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(bn(tt.tensor(a)).numpy(), reference(torch.from_numpy(a)).detach().numpy(),
                               rtol=1e-4, atol=1e-5)


def test_public_names() -> None:
    assert tt.nn.Conv2d is conv.Conv2d and tt.nn.MaxPool2d is conv.MaxPool2d and tt.nn.AvgPool2d is conv.AvgPool2d
    assert tt.nn.BatchNorm2d is conv.BatchNorm2d
    assert F.conv2d is conv.conv2d and F.max_pool2d is conv.max_pool2d and F.avg_pool2d is conv.avg_pool2d
