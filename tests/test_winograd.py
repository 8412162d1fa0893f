"""Winograd's F(2x2, 3x3) convolution (``tinytrain.kernels.winograd``), the kernel that Module 11's
reference ``Conv2dFunction`` gets from ``tinytrain.kernels.convolution.fast_path`` for 3x3,
stride-1, padding-1 layers with many channels.

Values against the independent sum over kernel offsets of ``test_conv``, gradients by
central differences in float64 over odd, non-square shapes (drawn by hypothesis; the
channel threshold is lowered so that tiny layers take the Winograd path), parts of the
batch, inputs that want no gradient, when it applies, and equality with PyTorch when it
is installed.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
import tinytrain.nn.functional as F
from tinytrain.kernels import winograd
from tinytrain.backend import get_backend

from test_conv import reference_conv, tensor64


@contextlib.contextmanager
def winograd_for_every_layer(part_bytes: int | None = None):
    """Lower the channel threshold to 1 (and optionally the part size) for the block."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(winograd, "MIN_CHANNELS", 1)
        if part_bytes is not None:
            patch.setattr(winograd, "PART_BYTES", part_bytes)
        yield


def took_winograd(out) -> bool:
    """Whether the convolution that computed ``out`` (recorded in the graph) ran Winograd's kernel."""
    return isinstance(out._ctx.fast, winograd.WinogradConvolution)


def conv_by_winograd(x, w, b=None):
    """``F.conv2d(x, w, b, padding=1)``, asserting that the Winograd path computed it."""
    out = F.conv2d(x, w, b, padding=1)
    assert out._ctx is None or took_winograd(out), "the convolution did not take the Winograd path"
    return out


layer_shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 7), st.integers(1, 7))


@given(shape=layer_shapes, seed=st.integers(0, 1000), bias=st.booleans())
def test_values_match_the_sum_over_kernel_offsets(shape, seed, bias) -> None:
    n, c, o, h, w_ = shape
    rng = np.random.default_rng(seed)
    x, w, b = rng.standard_normal((n, c, h, w_)), rng.standard_normal((o, c, 3, 3)), rng.standard_normal(o)
    with winograd_for_every_layer():
        out = conv_by_winograd(tensor64(x, "cpu"), tensor64(w, "cpu"), tensor64(b, "cpu") if bias else None)
    np.testing.assert_allclose(out.numpy(), reference_conv(x, w, b if bias else None, (1, 1), (1, 1)),
                               rtol=1e-10, atol=1e-10)


@given(shape=layer_shapes, seed=st.integers(0, 1000))
def test_gradients_by_central_differences(shape, seed) -> None:
    n, c, o, h, w_ = shape
    rng = np.random.default_rng(seed)
    leaves = [tensor64(rng.standard_normal(s), "cpu", requires_grad=True) for s in ((n, c, h, w_), (o, c, 3, 3), (o,))]
    with winograd_for_every_layer():
        assert tt.gradcheck(lambda x, w, b: conv_by_winograd(x, w, b), leaves)


@pytest.mark.parametrize("images_per_part", [1, 2, 4])
@pytest.mark.parametrize("size", [(6, 8), (5, 7)])
def test_parts_of_the_batch_equal_the_whole_batch(images_per_part, size) -> None:
    """The batch is transformed a few images at a time; 5 images leave a shorter last part."""
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((5, 3, *size)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    g = rng.standard_normal((5, 4, *size))
    tiles = ((size[0] + 1) // 2) * ((size[1] + 1) // 2)
    results = []
    for part_bytes in (16 * tiles * 3 * 8 * images_per_part, 1 << 30):
        with winograd_for_every_layer(part_bytes):
            leaves = [tensor64(a, "cpu", requires_grad=True) for a in (x, w, b)]
            conv_by_winograd(*leaves).backward(tensor64(g, "cpu"))
        results.append([leaf.grad.numpy() for leaf in leaves])
    for part, whole in zip(*results):
        np.testing.assert_allclose(part, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("frozen", ["x", "weight", "bias", "weight and bias"])
def test_inputs_that_want_no_gradient_get_none(frozen) -> None:
    rng = np.random.default_rng(3)
    arrays = {"x": rng.standard_normal((3, 2, 5, 4)), "weight": rng.standard_normal((4, 2, 3, 3)),
              "bias": rng.standard_normal(4)}
    leaves = {name: tensor64(a, "cpu", requires_grad=name not in frozen.split(" and ")) for name, a in arrays.items()}
    with winograd_for_every_layer():
        conv_by_winograd(*leaves.values()).sum().backward()
    for name, leaf in leaves.items():
        assert (leaf.grad is None) == (name in frozen.split(" and ")), name
    if leaves["bias"].grad is not None:
        np.testing.assert_allclose(leaves["bias"].grad.numpy(), [3 * 5 * 4] * 4)


@pytest.mark.parametrize("size", [(9, 10), (32, 32)])  # 32x32: channels 4 KiB apart, copied 8 at a time
def test_float32_layer_of_the_milestone_uses_it_and_matches_im2col(size) -> None:
    """At the default threshold a 32 -> 64 channel 3x3 layer takes the Winograd path, in float32,
    and agrees with the im2col path to float32 rounding, forward and backward."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 32, *size), dtype=np.float32)
    w = (rng.standard_normal((64, 32, 3, 3), dtype=np.float32) / 17).astype(np.float32)
    b, g = rng.standard_normal(64, dtype=np.float32), rng.standard_normal((3, 64, *size), dtype=np.float32)
    results = []
    for threshold in (winograd.MIN_CHANNELS, 10 ** 9):  # the default, then never
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(winograd, "MIN_CHANNELS", threshold)
            leaves = [tt.tensor(a, requires_grad=True) for a in (x, w, b)]
            out = F.conv2d(*leaves, padding=1)
            assert took_winograd(out) == (threshold < 10 ** 9)
            out.backward(tt.tensor(g))
        assert out.dtype == np.float32 and all(leaf.grad.dtype == np.float32 for leaf in leaves)
        results.append([out.numpy()] + [leaf.grad.numpy() for leaf in leaves])
    for name, fast, plain in zip(["out", "x", "weight", "bias"], *results):
        scale = np.abs(plain).max()
        np.testing.assert_allclose(fast, plain, rtol=0, atol=2e-6 * scale, err_msg=name)


@pytest.mark.parametrize("change, applies", [
    ({}, True),
    ({"dtype": np.float64}, True),
    ({"dtype": np.float16}, False),
    ({"x_dtype": np.float64}, False),  # mixed dtypes: im2col promotes them
    ({"kernel": (5, 5)}, False),
    ({"kernel": (3, 1)}, False),
    ({"stride": (2, 2)}, False),
    ({"stride": (1, 2)}, False),
    ({"padding": (0, 0)}, False),
    ({"padding": (1, 0)}, False),
    ({"channels": 15}, False),
    ({"out_channels": 15}, False),
    ({"xp": "strict"}, False),
])
def test_when_it_applies(change, applies) -> None:
    dtype = change.get("dtype", np.float32)
    x = np.zeros((2, change.get("channels", 32), 8, 8), change.get("x_dtype", dtype))
    weight = np.zeros((change.get("out_channels", 32), x.shape[1], *change.get("kernel", (3, 3))), dtype)
    xp = get_backend("strict").xp if change.get("xp") == "strict" else np
    assert winograd.applies(xp, x, weight, change.get("stride", (1, 1)), change.get("padding", (1, 1))) is applies


def test_other_devices_take_the_im2col_path(device) -> None:
    """Winograd's path is NumPy's only (a GPU wants im2col's one large product); every device gets the same values."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 32, 4, 6)), rng.standard_normal((32, 32, 3, 3))
    out = F.conv2d(tensor64(x, device), tensor64(w, device, requires_grad=True), padding=1)
    assert took_winograd(out) == (device == "cpu")
    np.testing.assert_allclose(out.numpy(), reference_conv(x, w, None, (1, 1), (1, 1)), rtol=1e-10, atol=1e-9)


def test_weight_transform_and_its_gradient_are_adjoint() -> None:
    """<G w G^T, dU> == <w, G^T dU G>: weight_gradient is the exact adjoint of transform_weight."""
    rng = np.random.default_rng(4)
    w, du = rng.standard_normal((5, 3, 3, 3)), rng.standard_normal((16, 3, 5))
    np.testing.assert_allclose(np.vdot(winograd.transform_weight(w), du), np.vdot(w, winograd.weight_gradient(du)),
                               rtol=1e-12)


def test_matches_pytorch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 32, 8, 7), dtype=np.float32)
    w = (rng.standard_normal((48, 32, 3, 3), dtype=np.float32) / 17).astype(np.float32)
    b, g = rng.standard_normal(48, dtype=np.float32), rng.standard_normal((4, 48, 8, 7), dtype=np.float32)
    leaves = [tt.tensor(a, requires_grad=True) for a in (x, w, b)]
    out = F.conv2d(*leaves, padding=1)
    assert took_winograd(out)
    out.backward(tt.tensor(g))
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    expected = torch.nn.functional.conv2d(*theirs, padding=1)
    expected.backward(torch.tensor(g))
    for name, ours, reference in zip(["out", "x", "weight", "bias"], [out] + [leaf.grad for leaf in leaves],
                                     [expected] + [t.grad for t in theirs]):
        reference = reference.detach().numpy()
        np.testing.assert_allclose(ours.numpy(), reference, rtol=0, atol=2e-5 * np.abs(reference).max(), err_msg=name)


def test_backward_twice_with_retain_graph_and_another_forward_between() -> None:
    """backward reads the saved tiles and never writes them (nor the incoming gradient)."""
    tt.manual_seed(0)
    layer = tt.nn.Conv2d(32, 32, 3, padding=1)
    x = tt.randn(2, 32, 5, 6, requires_grad=True)
    out = layer(x)
    assert took_winograd(out)
    loss = (out * out).sum()
    loss.backward(retain_graph=True)
    once = [layer.weight.grad.numpy().copy(), x.grad.numpy().copy()]
    layer(tt.randn(2, 32, 5, 6)).sum().backward()  # another graph in between must not clobber the saved tiles
    layer.weight.grad = None
    loss.backward()
    np.testing.assert_allclose(layer.weight.grad.numpy(), once[0], rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), 2 * once[1], rtol=1e-5)


def test_an_empty_batch() -> None:
    """No images: an empty result, an empty input gradient and a zero weight gradient (not a part size of 0,
    which range() refuses)."""
    x = tt.zeros(0, 32, 5, 6, requires_grad=True)
    w = tt.randn(32, 32, 3, 3, requires_grad=True)
    out = F.conv2d(x, w, padding=1)
    assert out.shape == (0, 32, 5, 6) and took_winograd(out)
    out.sum().backward()
    assert x.grad.shape == (0, 32, 5, 6)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((32, 32, 3, 3), np.float32))


def test_a_bias_of_another_float_dtype_keeps_the_result_dtype() -> None:
    """As on the im2col path: a float64 bias on a float32 layer is added in float32."""
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 3, 4, 5), dtype=np.float32), rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(4)
    with winograd_for_every_layer():
        out = conv_by_winograd(tt.tensor(x), tt.tensor(w), tt.tensor(bias, dtype="float64"))
        plain = conv_by_winograd(tt.tensor(x), tt.tensor(w))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.numpy(), plain.numpy() + bias.astype(np.float32).reshape(-1, 1, 1))
