"""Module 03: the functional activations (values, gradients, stability, PyTorch).

Values are compared with NumPy references in float32; gradients with
``tt.gradcheck`` in float64 on hypothesis-drawn shapes, on every device. GELU,
the one activation with its own ``Function``, also gets a comparison with the
exact erf form and, when PyTorch is installed, with ``F.gelu(approximate="tanh")``.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinytrain as tt
import tinytrain.nn.functional as F
from tinytrain.nn import activations

SEEDS = st.integers(0, 2**32 - 1)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
C = math.sqrt(2 / math.pi)


def np_gelu(a):
    return 0.5 * a * (1 + np.tanh(C * (a + 0.044715 * a**3)))


def np_gelu_exact(a):
    return np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(a)


def np_softmax(a, axis=-1):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(a, axis=-1):
    shifted = a - a.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def away_from_zero(rng, shape):
    """|x| in [0.1, 3]: keeps relu's finite differences off its kink."""
    return rng.uniform(0.1, 3.0, shape) * rng.choice([-1.0, 1.0], shape)


# (name, function, NumPy reference, minimum ndim)
ACTIVATIONS = [
    ("relu", F.relu, lambda a: np.maximum(a, 0), 0),
    ("sigmoid", F.sigmoid, lambda a: 1 / (1 + np.exp(-a)), 0),
    ("tanh", F.tanh, np.tanh, 0),
    ("gelu", F.gelu, np_gelu, 0),
    ("softmax", F.softmax, np_softmax, 1),
    ("log_softmax", F.log_softmax, np_log_softmax, 1),
]
IDS = [row[0] for row in ACTIVATIONS]


def test_functional_reexports_the_activations():
    for name in IDS:
        assert getattr(F, name) is getattr(activations, name)


@pytest.mark.parametrize("name, f, ref, min_dims", ACTIVATIONS, ids=IDS)
@given(shape=SHAPES, seed=SEEDS)
def test_forward_matches_numpy(device, name, f, ref, min_dims, shape, seed):
    shape = (2,) * min_dims + shape
    a = np.random.default_rng(seed).uniform(-4, 4, shape).astype(np.float32)
    out = f(tt.tensor(a, device=device))
    assert out.dtype == np.float32 and out.shape == a.shape
    np.testing.assert_allclose(out.numpy(), ref(a.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, f, ref, min_dims", ACTIVATIONS, ids=IDS)
@given(shape=SHAPES, seed=SEEDS)
def test_gradcheck(device, name, f, ref, min_dims, shape, seed):
    shape = (2,) * min_dims + shape
    rng = np.random.default_rng(seed)
    x = tt.tensor(away_from_zero(rng, shape), dtype=tt.float64, device=device, requires_grad=True)
    w = tt.tensor(rng.standard_normal(shape), dtype=tt.float64, device=device)
    assert tt.gradcheck(lambda t: (f(t) * w).sum(), [x])
    assert x.grad.device == x.device


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@given(data=st.data())
def test_softmax_axis(device, name, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(data.draw(SEEDS))
    a = rng.uniform(-3, 3, shape)
    w = tt.tensor(rng.standard_normal(shape), dtype=tt.float64, device=device)
    f = getattr(F, name)
    ref = np_softmax if name == "softmax" else np_log_softmax
    x = tt.tensor(a, dtype=tt.float64, device=device, requires_grad=True)
    np.testing.assert_allclose(f(x, axis=axis).numpy(), ref(a, axis=axis), rtol=1e-10, atol=1e-12)
    assert tt.gradcheck(lambda t: (f(t, axis=axis) * w).sum(), [x])


def test_softmax_rows_are_distributions(device):
    tt.manual_seed(0)
    p = F.softmax(tt.randn(5, 7, device=device) * 10).numpy()
    assert (p >= 0).all()
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-6)


def test_relu_gradient_is_zero_at_the_kink(device):
    x = tt.tensor([-1.0, 0.0, 2.0], device=device, requires_grad=True)
    F.relu(x).sum().backward()
    assert x.grad.numpy().tolist() == [0.0, 0.0, 1.0]



@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_relu_values_keep_nan_and_the_sign_of_zero_as_pytorch_does(device, dtype):
    x = tt.tensor([np.nan, -0.0, 0.0, -np.inf, np.inf, -2.0, 3.0], dtype=dtype, device=device, requires_grad=True)
    out = F.relu(x)
    assert out.dtype == np.dtype(dtype)
    got = out.numpy()
    np.testing.assert_array_equal(got, [np.nan, 0.0, 0.0, 0.0, np.inf, 0.0, 3.0])
    assert np.signbit(got).tolist() == [False, True, False, False, False, False, False]  # torch.relu(-0.0) is -0.0
    out.sum().backward()
    assert x.grad.numpy()[1:].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0, 1.0]  # (at NaN PyTorch passes it on; we give 0)


@pytest.mark.parametrize("dtype", ["int8", "int64"])
def test_relu_of_integers_keeps_their_dtype(dtype):
    out = F.relu(tt.tensor([-3, 0, 5], dtype=dtype))
    assert out.dtype == np.dtype(dtype) and out.numpy().tolist() == [0, 0, 5]

# -- GELU ------------------------------------------------------------------------------------

def test_gelu_is_within_5e4_of_exact_gelu():
    a = np.linspace(-8, 8, 16_001)
    got = F.gelu(tt.tensor(a, dtype=tt.float64)).numpy()
    worst = np.abs(got - np_gelu_exact(a)).max()
    assert 4e-4 < worst < 5e-4  # the documented size of the tanh approximation's error


def test_gelu_known_values(device):
    x = tt.tensor([0.0, 1.0, -1.0], dtype=tt.float64, device=device)
    # 0.5 * 1 * (1 + tanh(sqrt(2/pi) * 1.044715)) and its mirror image: gelu(-x) = gelu(x) - x
    expected = 0.5 * (1 + math.tanh(C * 1.044715))
    np.testing.assert_allclose(F.gelu(x).numpy(), [0.0, expected, expected - 1.0], rtol=1e-14)


def test_gelu_gradient_formula(device):
    a = np.linspace(-4, 4, 81)
    x = tt.tensor(a, dtype=tt.float64, device=device, requires_grad=True)
    F.gelu(x).sum().backward()
    t = np.tanh(C * (a + 0.044715 * a**3))
    expected = 0.5 * (1 + t) + 0.5 * a * (1 - t**2) * C * (1 + 3 * 0.044715 * a**2)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12, atol=1e-15)


def test_gelu_keeps_dtype_and_saves_its_input_and_p(device):
    for dtype in (tt.float16, tt.float32, tt.float64):
        x = tt.tensor([-1.0, 2.0], dtype=dtype, device=device, requires_grad=True)
        out = F.gelu(x)
        assert out.dtype == dtype and out.device == x.device
        saved = {name: value for name, value in vars(out._ctx).items() if hasattr(value, "nbytes")}
        assert list(saved) == ["x", "p"], list(saved)  # p saved: NumPy would take eight passes to recompute it
        assert saved["x"] is x.data and saved["p"].dtype == dtype
        t = np.tanh(C * (x.numpy().astype(np.float64) + 0.044715 * x.numpy().astype(np.float64) ** 3))
        np.testing.assert_allclose(x._backend.to_host(saved["p"]), (1 + t) / 2, rtol=1e-3 if dtype == tt.float16
                                   else 1e-6)
        out.sum().backward()
        assert x.grad.dtype == dtype


def test_gelu_backward_twice_with_retain_graph_gives_the_same_gradient(device):
    """Backward never writes into the p it saved."""
    x = tt.tensor([-3.0, -0.5, 0.0, 0.7, 4.0], dtype=tt.float64, device=device, requires_grad=True)
    out = F.gelu(x)
    out.backward(tt.ones(5, dtype=tt.float64, device=device), retain_graph=True)
    first = x.grad.numpy().copy()
    x.grad = None
    out.backward(tt.ones(5, dtype=tt.float64, device=device))
    np.testing.assert_array_equal(x.grad.numpy(), first)


def test_gelu_rejects_the_exact_form():
    with pytest.raises(ValueError, match="tanh"):
        F.gelu(tt.tensor([1.0]), approximate="none")


def test_gelu_is_identity_or_zero_beyond_the_clip(device):
    """Beyond |x| = 10 the approximation is exactly x (or 0); slope exactly 1 (or 0)."""
    a = np.array([-1e6, -50.0, -10.5, 10.5, 50.0, 1e6])
    for dtype in (tt.float32, tt.float64):
        x = tt.tensor(a, dtype=dtype, device=device, requires_grad=True)
        out = F.gelu(x)
        out.sum().backward()
        assert np.array_equal(out.numpy(), np.maximum(a, 0).astype(dtype))
        assert x.grad.numpy().tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]


# -- stability -------------------------------------------------------------------------------

ELEMENTWISE_EXTREMES = {
    tt.float32: [-3e38, -1e30, -1e4, -100.0, 0.0, 100.0, 1e4, 1e30, 3e38],
    tt.float64: [-1e308, -1e30, -1e4, -100.0, 0.0, 100.0, 1e4, 1e30, 1e308],
}
# Softmax subtracts the row maximum, so the spread within a row must stay finite.
ROW_EXTREMES = [[-1e30, 0.0, 1e30], [-1e4, 1e4, 0.0], [1e30, 1e30, -1e30]]


@pytest.mark.parametrize("name, f, ref, min_dims", ACTIVATIONS, ids=IDS)
@pytest.mark.parametrize("dtype", [tt.float32, tt.float64], ids=["float32", "float64"])
def test_large_inputs_stay_finite_without_warnings(device, name, f, ref, min_dims, dtype):
    values = ROW_EXTREMES if min_dims else ELEMENTWISE_EXTREMES[dtype]
    x = tt.tensor(values, dtype=dtype, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow or invalid-value RuntimeWarning fails the test
        out = f(x)
        out.backward(tt.ones(*out.shape, dtype=dtype, device=device))
    assert np.isfinite(out.numpy()).all(), out
    assert np.isfinite(x.grad.numpy()).all(), x.grad


def test_saturated_values(device):
    x = tt.tensor([-1000.0, 1000.0], device=device)
    assert F.sigmoid(x).numpy().tolist() == [0.0, 1.0]
    assert F.tanh(x).numpy().tolist() == [-1.0, 1.0]
    np.testing.assert_allclose(F.log_softmax(tt.tensor([0.0, -200.0], device=device)).numpy(), [0.0, -200.0])


# -- PyTorch (optional) ----------------------------------------------------------------------

@given(shape=SHAPES, seed=SEEDS)
def test_gelu_matches_pytorch_tanh_approximation(shape, seed):
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(seed).uniform(-6, 6, shape)
    x = tt.tensor(a, dtype=tt.float64, requires_grad=True)
    out = F.gelu(x)
    out.backward(tt.tensor(np.ones(shape), dtype=tt.float64))
    xt = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.gelu(xt, approximate="tanh")
    ref.sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_activations_match_pytorch_float32():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(0).uniform(-6, 6, (8, 5)).astype(np.float32)
    pairs = [
        (F.relu, torch.relu), (F.sigmoid, torch.sigmoid), (F.tanh, torch.tanh),
        (F.gelu, lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
        (lambda t: F.softmax(t, axis=0), lambda t: torch.softmax(t, dim=0)),
        (lambda t: F.log_softmax(t, axis=1), lambda t: torch.log_softmax(t, dim=1)),
    ]
    for ours, theirs in pairs:
        np.testing.assert_allclose(ours(tt.tensor(a)).numpy(), theirs(torch.tensor(a)).numpy(), rtol=1e-5, atol=1e-6)
