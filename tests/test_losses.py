"""Module 06: the losses (values, gradients, reductions, errors, modules, PyTorch).

Values are compared with NumPy references written out by hand (float64) and,
when PyTorch is installed, with ``torch.nn.functional``; gradients with
``tt.gradcheck`` in float64 on hypothesis-drawn shapes, on every device.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
import tinytrain.nn as nn
import tinytrain.nn.functional as F
from tinytrain.nn import losses

SEEDS = st.integers(0, 2**32 - 1)
REDUCTIONS = ["mean", "sum", "none"]
BATCH = st.integers(1, 5)
CLASSES = st.integers(1, 6)


# -- NumPy references ------------------------------------------------------------------------

def reduce(values, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](values)


def np_log_softmax(z):
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def np_cross_entropy(z, target, reduction="mean"):
    logp = np_log_softmax(z)
    if target.ndim == 1:
        per_sample = -logp[np.arange(len(target)), target]
    else:
        per_sample = -(target * logp).sum(axis=1)
    return reduce(per_sample, reduction)


def np_bce(p, t, reduction="mean"):
    with np.errstate(divide="ignore"):
        per_element = -(t * np.maximum(np.log(p), -100) + (1 - t) * np.maximum(np.log(1 - p), -100))
    return reduce(per_element, reduction)


def np_bce_logits(x, t, reduction="mean"):
    return reduce(np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x))), reduction)


def leaf(a, device, dtype=tt.float64):
    return tt.tensor(a, dtype=dtype, device=device, requires_grad=True)


def weighted(loss, device, seed=1):
    """``sum(loss * w)`` with fixed random ``w``, so "none" gradients are checked per sample."""
    w = tt.tensor(np.random.default_rng(seed).standard_normal(loss.shape), dtype=loss.dtype, device=device)
    return (loss * w).sum()


def check_grad(fn, x):
    assert tt.gradcheck(fn, [x])
    assert x.grad.device == x.device and x.grad.shape == x.shape


def test_functional_and_nn_reexports():
    for name in ["mse_loss", "cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits"]:
        assert getattr(F, name) is getattr(losses, name)
    for name in ["MSELoss", "CrossEntropyLoss", "BCELoss", "BCEWithLogitsLoss"]:
        assert getattr(nn, name) is getattr(losses, name)


# -- mse_loss ------------------------------------------------------------------------------

def test_mse_worked_example(device):
    pred = leaf([2.5, 0.0, 2.0], device, tt.float32)
    loss = F.mse_loss(pred, tt.tensor([3.0, -0.5, 2.0], device=device))
    assert loss.shape == () and loss.dtype == np.float32 and loss.device == pred.device
    np.testing.assert_allclose(loss.item(), 1 / 6, rtol=1e-6)
    loss.backward()
    np.testing.assert_allclose(pred.grad.numpy(), [-1 / 3, 1 / 3, 0.0], rtol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=SEEDS)
def test_mse_values_and_gradcheck(device, reduction, shape, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    target = tt.tensor(b, dtype=tt.float64, device=device)
    got = F.mse_loss(tt.tensor(a, dtype=tt.float64, device=device), target, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), reduce((a - b) ** 2, reduction), rtol=1e-12)
    check_grad(lambda x: weighted(F.mse_loss(x, target, reduction=reduction), device), leaf(a, device))


def test_mse_accepts_plain_and_integer_targets(device):
    pred = tt.tensor([1.0, 2.0], device=device)
    assert F.mse_loss(pred, [0.0, 0.0], reduction="sum").item() == 5.0
    assert F.mse_loss(pred, np.array([1, 1]), reduction="sum").item() == 1.0
    assert F.mse_loss(pred, tt.tensor([1, 2], device=device)).item() == 0.0


@pytest.mark.parametrize("pred_shape, target_shape", [((3, 1), (3,)), ((3,), (3, 1)), ((2, 3), (3,)), ((4,), (5,))])
def test_mse_refuses_mismatched_shapes(device, pred_shape, target_shape):
    with pytest.raises(ValueError) as error:
        F.mse_loss(tt.zeros(pred_shape, device=device), tt.zeros(target_shape, device=device))
    assert str(pred_shape) in str(error.value) and str(target_shape) in str(error.value)


# -- cross_entropy -----------------------------------------------------------------------------

def test_cross_entropy_worked_example(device):
    logits = leaf([[2.0, 1.0, 0.1]], device, tt.float32)
    loss = F.cross_entropy(logits, tt.tensor([0], device=device))
    np.testing.assert_allclose(loss.item(), 0.41703, rtol=1e-4)
    loss.backward()
    np.testing.assert_allclose(logits.grad.numpy(), [[0.659 - 1, 0.2424, 0.0986]], atol=1e-3)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n=BATCH, c=CLASSES, seed=SEEDS)
def test_cross_entropy_indices_values_and_gradcheck(device, reduction, n, c, seed):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, c)) * 3
    y = rng.integers(0, c, n)
    target = tt.tensor(y, device=device)
    got = F.cross_entropy(tt.tensor(z, dtype=tt.float64, device=device), target, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), np_cross_entropy(z, y, reduction), rtol=1e-12, atol=1e-12)
    check_grad(lambda x: weighted(F.cross_entropy(x, target, reduction=reduction), device), leaf(z, device))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n=BATCH, c=CLASSES, seed=SEEDS, normalised=st.booleans())
def test_cross_entropy_probabilities_values_and_gradcheck(device, reduction, n, c, seed, normalised):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, c)) * 3
    q = rng.uniform(0, 1, (n, c))
    if normalised:
        q /= q.sum(axis=1, keepdims=True)
    target = tt.tensor(q, dtype=tt.float64, device=device)
    got = F.cross_entropy(tt.tensor(z, dtype=tt.float64, device=device), target, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), np_cross_entropy(z, q, reduction), rtol=1e-12, atol=1e-12)
    check_grad(lambda x: weighted(F.cross_entropy(x, target, reduction=reduction), device), leaf(z, device))


def test_cross_entropy_gradient_is_softmax_minus_onehot_over_n(device):
    rng = np.random.default_rng(0)
    z, y = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    logits = leaf(z, device)
    F.cross_entropy(logits, tt.tensor(y, device=device)).backward()
    softmax = np.exp(np_log_softmax(z))
    np.testing.assert_allclose(logits.grad.numpy(), (softmax - np.eye(4)[y]) / 6, rtol=1e-12, atol=1e-15)


def test_cross_entropy_is_one_graph_node_keeping_one_array(device):
    logits = leaf(np.zeros((3, 5)), device)
    loss = F.cross_entropy(logits, tt.tensor([0, 1, 4], device=device))
    assert isinstance(loss._ctx, losses.CrossEntropy) and loss._ctx.inputs == (logits,)
    kept = [value for name, value in vars(loss._ctx).items() if hasattr(value, "shape") and value.shape == (3, 5)]
    assert len(kept) == 1  # the softmax, nothing else of the logits' size


def test_one_hot_targets_equal_index_targets(device):
    rng = np.random.default_rng(3)
    z, y = rng.standard_normal((5, 3)), rng.integers(0, 3, 5)
    a, b = leaf(z, device), leaf(z, device)
    by_index = F.cross_entropy(a, tt.tensor(y, device=device))
    by_one_hot = F.cross_entropy(b, tt.tensor(np.eye(3)[y], dtype=tt.float64, device=device))
    np.testing.assert_allclose(by_index.item(), by_one_hot.item(), rtol=1e-14)
    by_index.backward()
    by_one_hot.backward()
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64", "uint64"])
def test_cross_entropy_accepts_any_integer_dtype(device, dtype):
    z = np.random.default_rng(0).standard_normal((4, 3))
    target = tt.tensor(np.array([2, 0, 1, 2], dtype=dtype), dtype=dtype, device=device)
    assert target.dtype == np.dtype(dtype)
    got = F.cross_entropy(tt.tensor(z, dtype=tt.float64, device=device), target)
    np.testing.assert_allclose(got.item(), np_cross_entropy(z, np.array([2, 0, 1, 2])), rtol=1e-12)


def test_cross_entropy_accepts_host_targets(device):
    logits = tt.tensor([[1.0, 2.0], [3.0, 0.0]], device=device)
    expected = F.cross_entropy(logits, tt.tensor([1, 0], device=device)).item()
    assert F.cross_entropy(logits, [1, 0]).item() == expected
    assert F.cross_entropy(logits, np.array([1, 0], dtype=np.int32)).item() == expected


def test_float_class_indices_raise_type_error(device):
    logits = tt.zeros(3, 4, device=device)
    with pytest.raises(TypeError, match="class indices must be integers") as error:
        F.cross_entropy(logits, tt.tensor([0.0, 1.0, 3.0], device=device))
    assert "(3,)" in str(error.value) and "(3, 4)" in str(error.value)
    with pytest.raises(TypeError, match="integers"):
        F.cross_entropy(logits, [0.0, 1.0, 3.0])


@pytest.mark.parametrize("bad", [4, 7, -1])
def test_out_of_range_index_names_value_and_classes(device, bad):
    with pytest.raises(ValueError) as error:
        F.cross_entropy(tt.zeros(3, 4, device=device), tt.tensor([0, bad, 1], device=device))
    message = str(error.value)
    assert str(bad) in message and "4 classes" in message


@pytest.mark.parametrize(
    "logits_shape, target, match",
    [
        ((4,), [0, 1, 2, 3], r"\(N, C\).*\(4,\)"),
        ((2, 3, 4), [[0] * 4] * 2, r"\(N, C\).*\(2, 3, 4\)"),
        ((2, 3), [[0, 1], [1, 0]], r"shape \(N,\) = \(2,\).*\(2, 2\)"),
        ((2, 3), [0, 1, 2], r"\(N,\) = \(2,\).*\(3,\)"),
        ((2, 3), np.zeros((2, 4)), r"\(2, 3\).*\(2, 4\)"),
        ((2, 3), np.zeros((3, 3)), r"\(2, 3\).*\(3, 3\)"),
    ],
    ids=["1d_logits", "3d_logits", "2d_int_target", "wrong_n", "probs_wrong_c", "probs_wrong_n"],
)
def test_cross_entropy_shape_errors(device, logits_shape, target, match):
    with pytest.raises(ValueError, match=match):
        F.cross_entropy(tt.zeros(*logits_shape, device=device), target)


def test_cross_entropy_refuses_bool_targets(device):
    with pytest.raises(TypeError, match="bool"):
        F.cross_entropy(tt.zeros(2, 2, device=device), tt.tensor([True, False], device=device))


def test_cross_entropy_is_stable_for_huge_logits(device):
    z = np.array([[1e4, 0.0, -1e4], [-3e38, 3e37, 0.0], [50.0, 50.0, 50.0]], dtype=np.float32)
    logits = tt.tensor(z, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = F.cross_entropy(logits, tt.tensor([2, 0, 1], device=device), reduction="none")
        loss.sum().backward()
    np.testing.assert_allclose(loss.numpy(), [2e4, 3e37 + 3e38, np.log(3)], rtol=1e-6)
    np.testing.assert_allclose(logits.grad.numpy(), [[1, 0, -1], [-1, 1, 0], [1 / 3, -2 / 3, 1 / 3]], atol=1e-6)


def test_targets_receive_no_gradient(device):
    logits = leaf([[1.0, 2.0]], device)
    soft = leaf([[0.3, 0.7]], device)
    F.cross_entropy(logits, soft).backward()
    assert soft.grad is None and logits.grad is not None
    pred, target = leaf([1.0, 2.0], device), leaf([0.0, 0.0], device)
    F.mse_loss(pred, target).backward()
    assert target.grad is None and pred.grad is not None
    probs, t = leaf([0.2, 0.9], device), leaf([0.0, 1.0], device)
    F.binary_cross_entropy(probs, t).backward()
    F.binary_cross_entropy_with_logits(probs, t).backward()
    assert t.grad is None


def test_float32_logits_with_float64_probabilities_stay_float32(device):
    loss = F.cross_entropy(tt.zeros(2, 3, device=device), tt.tensor(np.full((2, 3), 1 / 3), dtype=tt.float64, device=device))
    assert loss.dtype == np.float32
    np.testing.assert_allclose(loss.item(), np.log(3), rtol=1e-6)


def test_target_on_another_device_is_refused(device, other_device):
    with pytest.raises(RuntimeError, match="same device"):
        F.cross_entropy(tt.zeros(2, 3, device=device), tt.tensor([0, 1], device=other_device))
    with pytest.raises(RuntimeError, match="same device"):
        F.mse_loss(tt.zeros(2, device=device), tt.zeros(2, device=other_device))


@pytest.mark.parametrize(
    "fn, args",
    [
        (F.mse_loss, ([1.0], [1.0])),
        (F.cross_entropy, ([[1.0]], [0])),
        (F.binary_cross_entropy, ([0.5], [1.0])),
        (F.binary_cross_entropy_with_logits, ([0.5], [1.0])),
    ],
    ids=["mse", "ce", "bce", "bce_logits"],
)
def test_unknown_reduction(fn, args):
    with pytest.raises(ValueError, match="'mean', 'sum' or 'none'.*'avg'"):
        fn(tt.tensor(args[0]), args[1], reduction="avg")


# -- binary cross-entropy ----------------------------------------------------------------------

SHAPES = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(shape=SHAPES, seed=SEEDS)
def test_bce_values_and_gradcheck(device, reduction, shape, seed):
    rng = np.random.default_rng(seed)
    p, t = rng.uniform(0.05, 0.95, shape), rng.uniform(0, 1, shape)
    target = tt.tensor(t, dtype=tt.float64, device=device)
    got = F.binary_cross_entropy(tt.tensor(p, dtype=tt.float64, device=device), target, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), np_bce(p, t, reduction), rtol=1e-12)
    check_grad(lambda x: weighted(F.binary_cross_entropy(x, target, reduction=reduction), device), leaf(p, device))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(shape=SHAPES, seed=SEEDS)
def test_bce_with_logits_values_and_gradcheck(device, reduction, shape, seed):
    rng = np.random.default_rng(seed)
    x, t = rng.standard_normal(shape) * 4, rng.uniform(0, 1, shape)
    target = tt.tensor(t, dtype=tt.float64, device=device)
    got = F.binary_cross_entropy_with_logits(tt.tensor(x, dtype=tt.float64, device=device), target, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), np_bce_logits(x, t, reduction), rtol=1e-12)
    check_grad(
        lambda v: weighted(F.binary_cross_entropy_with_logits(v, target, reduction=reduction), device), leaf(x, device)
    )


def test_bce_with_logits_equals_bce_of_sigmoid(device):
    x = np.linspace(-6, 6, 13)
    t = (np.arange(13) % 2).astype(np.float64)
    a = F.binary_cross_entropy_with_logits(tt.tensor(x, dtype=tt.float64, device=device), t, reduction="none")
    b = F.binary_cross_entropy(F.sigmoid(tt.tensor(x, dtype=tt.float64, device=device)), t, reduction="none")
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10)


@pytest.mark.parametrize("dtype", [tt.float32, tt.float64], ids=["float32", "float64"])
def test_bce_clamps_log_at_minus_100(device, dtype):
    probs = tt.tensor([0.0, 1.0, 0.0, 1.0, 1e-300 if dtype == tt.float64 else 1e-45], dtype=dtype, device=device,
                      requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = F.binary_cross_entropy(probs, tt.tensor([1.0, 0.0, 0.0, 1.0, 1.0], device=device), reduction="none")
        loss.sum().backward()
    np.testing.assert_allclose(loss.numpy(), [100.0, 100.0, 0.0, 0.0, 100.0], rtol=1e-6)
    grad = probs.grad.numpy()
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(grad[:2], [-1e12, 1e12], rtol=1e-5)  # (p - t) / max(p(1-p), 1e-12)


def test_bce_refuses_values_outside_0_1(device):
    with pytest.raises(ValueError, match=r"\[0, 1\].*-0\.5.*1\.5.*with_logits"):
        F.binary_cross_entropy(tt.tensor([-0.5, 0.5, 1.5], device=device), [0.0, 1.0, 1.0])


@pytest.mark.parametrize("fn", [F.binary_cross_entropy, F.binary_cross_entropy_with_logits])
def test_bce_refuses_mismatched_shapes(device, fn):
    with pytest.raises(ValueError) as error:
        fn(tt.zeros(4, 1, device=device) + 0.5, tt.zeros(4, device=device))
    assert "(4, 1)" in str(error.value) and "(4,)" in str(error.value)


@pytest.mark.parametrize("dtype", [tt.float32, tt.float64], ids=["float32", "float64"])
def test_bce_with_logits_is_stable_for_huge_logits(device, dtype):
    big = 3e38 if dtype == tt.float32 else 1e308
    x = tt.tensor([-big, -1e4, -100.0, 100.0, 1e4, big], dtype=dtype, device=device, requires_grad=True)
    t = tt.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], dtype=dtype, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
        loss.backward(tt.ones(6, dtype=dtype, device=device))  # .sum() would overflow: 2 * 3e38
    np.testing.assert_allclose(loss.numpy(), [big, 1e4, 0.0, 0.0, 1e4, big], rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(x.grad.numpy(), [-1.0, -1.0, 0.0, 0.0, 1.0, 1.0], atol=1e-30)


def test_bce_accepts_integer_targets(device):
    x = tt.tensor([0.0, 2.0], device=device)
    expected = F.binary_cross_entropy_with_logits(x, tt.tensor([1.0, 0.0], device=device)).item()
    assert F.binary_cross_entropy_with_logits(x, tt.tensor([1, 0], device=device)).item() == expected


# -- loss modules ------------------------------------------------------------------------------

MODULES = [
    (nn.MSELoss, F.mse_loss, lambda d: (tt.tensor([1.0, -2.0], device=d), tt.tensor([0.5, 0.0], device=d))),
    (nn.CrossEntropyLoss, F.cross_entropy,
     lambda d: (tt.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]], device=d), tt.tensor([1, 0], device=d))),
    (nn.BCELoss, F.binary_cross_entropy, lambda d: (tt.tensor([0.2, 0.9], device=d), tt.tensor([0.0, 1.0], device=d))),
    (nn.BCEWithLogitsLoss, F.binary_cross_entropy_with_logits,
     lambda d: (tt.tensor([-1.0, 3.0], device=d), tt.tensor([0.0, 1.0], device=d))),
]
MODULE_IDS = ["MSELoss", "CrossEntropyLoss", "BCELoss", "BCEWithLogitsLoss"]


@pytest.mark.parametrize("cls, fn, make", MODULES, ids=MODULE_IDS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_modules_call_their_function(device, cls, fn, make, reduction):
    pred, target = make(device)
    loss_fn = cls(reduction=reduction)
    assert isinstance(loss_fn, nn.Module) and loss_fn.reduction == reduction
    expected = fn(pred, target, reduction=reduction).numpy()
    np.testing.assert_array_equal(loss_fn(pred, target).numpy(), expected)
    np.testing.assert_array_equal(loss_fn.forward(pred, target).numpy(), expected)
    assert list(loss_fn.parameters()) == []
    assert repr(loss_fn) == f"{cls.__name__}(reduction={reduction!r})"


@pytest.mark.parametrize("cls", [row[0] for row in MODULES], ids=MODULE_IDS)
def test_loss_modules_default_to_mean_and_check_reduction_at_once(cls):
    assert cls().reduction == "mean"
    with pytest.raises(ValueError, match="'Mean'"):
        cls(reduction="Mean")


def test_loss_module_trains_a_parameter(device):
    w = nn.Parameter(np.zeros((2, 3)), device=device)
    x = tt.tensor([[1.0, 0.0], [0.0, 1.0]], device=device)
    loss_fn = nn.CrossEntropyLoss()
    first = loss_fn(x @ w, tt.tensor([2, 1], device=device))
    for _ in range(20):
        w.grad = None
        loss = loss_fn(x @ w, tt.tensor([2, 1], device=device))
        loss.backward()
        w.data -= w.grad.data
    assert loss.item() < first.item() / 3


# -- PyTorch (optional) ------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(n=BATCH, c=CLASSES, seed=SEEDS)
def test_matches_pytorch(reduction, n, c, seed):
    torch = pytest.importorskip("torch")
    tF = torch.nn.functional
    rng = np.random.default_rng(seed)
    z, y, q = rng.standard_normal((n, c)) * 3, rng.integers(0, c, n), rng.dirichlet(np.ones(c), n)
    p, t = rng.uniform(0.01, 0.99, (n, c)), rng.uniform(0, 1, (n, c))
    cases = [
        (F.cross_entropy, tF.cross_entropy, z, y),
        (F.cross_entropy, tF.cross_entropy, z, q),
        (F.mse_loss, tF.mse_loss, z, q),
        (F.binary_cross_entropy, tF.binary_cross_entropy, p, t),
        (F.binary_cross_entropy_with_logits, tF.binary_cross_entropy_with_logits, z, t),
    ]
    for ours, theirs, inp, target in cases:
        x = tt.tensor(inp, dtype=tt.float64, requires_grad=True)
        got = ours(x, tt.tensor(target, dtype=target.dtype), reduction=reduction)
        xt = torch.tensor(inp, requires_grad=True)
        ref = theirs(xt, torch.tensor(target), reduction=reduction)
        np.testing.assert_allclose(got.numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-12)
        upstream = rng.standard_normal(ref.shape)
        got.backward(tt.tensor(upstream, dtype=tt.float64))
        ref.backward(torch.tensor(upstream))
        np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_bce_clamp_matches_pytorch():
    torch = pytest.importorskip("torch")
    p = np.array([0.0, 1.0, 1e-45, 0.5], dtype=np.float32)
    t = np.array([1.0, 0.0, 1.0, 1.0], dtype=np.float32)
    ours = F.binary_cross_entropy(tt.tensor(p, requires_grad=True), tt.tensor(t), reduction="none")
    theirs = torch.nn.functional.binary_cross_entropy(torch.tensor(p), torch.tensor(t), reduction="none")
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
