"""Every op: forward values against NumPy (float32) and gradients with
``tt.gradcheck`` (float64), on every device. Hypothesis draws the shapes where
broadcasting or axes matter; values come from a seeded NumPy generator inside
each op's valid domain, away from kinks where finite differences are meaningless.
"""
from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinytrain as tt

SEEDS = st.integers(0, 2**32 - 1)


# -- helpers ---------------------------------------------------------------------------

def assert_values(t, expected, rtol=1e-5, atol=1e-6):
    got = t.numpy()
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def leaf(a, device, dtype=tt.float64):
    return tt.tensor(a, dtype=dtype, device=device, requires_grad=True)


def check_grad(fn, arrays, device):
    """``gradcheck`` of ``sum(fn(*xs) * w)`` for a fixed random ``w``.

    The random weights give every output element its own upstream gradient: with
    a plain ``sum`` (all-ones upstream) a backward that permutes or transposes its
    gradient would still pass.
    """
    inputs = [leaf(a, device) for a in arrays]
    shape = fn(*inputs).shape
    w = tt.tensor(np.random.default_rng(1).standard_normal(shape), dtype=tt.float64, device=device)
    assert tt.gradcheck(lambda *xs: (fn(*xs) * w).sum(), inputs) is True


def grad_of(fn, a, device, dtype=tt.float64):
    """The gradient of ``fn(x).sum()`` at ``a``, as a host array."""
    x = leaf(a, device, dtype)
    fn(x).sum().backward()
    assert x.grad.shape == x.shape and x.grad.device == x.device
    return x.grad.numpy()


# Value domains: each draws an array of ``shape`` from ``rng``.
def real(rng, shape):
    return rng.uniform(-2.0, 2.0, shape)


def positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def nonzero(rng, shape):
    """|x| >= 0.1: keeps finite differences off the kink of relu/abs and the pole of 1/x."""
    return rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def off_clip_bounds(rng, shape):
    """Values at least 0.05 away from the clip bounds +-0.5."""
    magnitude = np.where(rng.random(shape) < 0.5, rng.uniform(0.0, 0.45, shape), rng.uniform(0.55, 2.0, shape))
    return magnitude * rng.choice([-1.0, 1.0], shape)


def distinct(rng, shape):
    """No two values closer than 0.09, so ``max`` has no ties within gradcheck's step."""
    size = int(np.prod(shape))
    return (rng.permutation(size) * 0.1 - 0.05 * size + rng.uniform(0, 0.01, size)).reshape(shape)


def np_sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def np_softmax(a, axis=-1):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(a, axis=-1):
    shifted = a - a.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def shapes(min_dims=0, max_dims=3, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)


# -- elementwise and row-wise unary ops ---------------------------------------------------

# (name, tinytrain op, NumPy reference, value domain, minimum ndim)
UNARY = [
    ("neg", lambda t: -t, np.negative, real, 0),
    ("exp", lambda t: t.exp(), np.exp, real, 0),
    ("log", lambda t: t.log(), np.log, positive, 0),
    ("sqrt", lambda t: t.sqrt(), np.sqrt, positive, 0),
    ("tanh", lambda t: t.tanh(), np.tanh, real, 0),
    ("sigmoid", lambda t: t.sigmoid(), np_sigmoid, real, 0),
    ("relu", lambda t: t.relu(), lambda a: np.maximum(a, 0), nonzero, 0),
    ("abs", lambda t: t.abs(), np.abs, nonzero, 0),
    ("clip", lambda t: t.clip(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), off_clip_bounds, 0),
    ("pow3", lambda t: t**3, lambda a: a**3, real, 0),
    ("pow_half", lambda t: t**0.5, np.sqrt, positive, 0),
    ("pow_neg", lambda t: t**-2.0, lambda a: a**-2.0, positive, 0),
    ("rpow", lambda t: 2.0**t, lambda a: 2.0**a, real, 0),
    ("rsub", lambda t: 3.0 - t, lambda a: 3.0 - a, real, 0),
    ("rdiv", lambda t: 1.0 / t, lambda a: 1.0 / a, nonzero, 0),
    ("radd_rmul", lambda t: 2.0 * t + 1.0, lambda a: 2.0 * a + 1.0, real, 0),
    ("softmax", lambda t: t.softmax(), np_softmax, real, 1),
    ("log_softmax", lambda t: t.log_softmax(), np_log_softmax, real, 1),
    ("softmax_axis0", lambda t: t.softmax(axis=0), lambda a: np_softmax(a, axis=0), real, 1),
    ("log_softmax_axis0", lambda t: t.log_softmax(axis=0), lambda a: np_log_softmax(a, axis=0), real, 1),
]
UNARY_IDS = [row[0] for row in UNARY]


@pytest.mark.parametrize("name, op, ref, domain, min_dims", UNARY, ids=UNARY_IDS)
@given(shape=shapes(), seed=SEEDS)
def test_unary_forward(device, name, op, ref, domain, min_dims, shape, seed):
    shape = (1,) * min_dims + shape
    a = domain(np.random.default_rng(seed), shape).astype(np.float32)
    out = op(tt.tensor(a, device=device))
    assert out.dtype == np.float32
    assert_values(out, ref(a.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, op, ref, domain, min_dims", UNARY, ids=UNARY_IDS)
@given(shape=shapes(), seed=SEEDS)
def test_unary_grad(device, name, op, ref, domain, min_dims, shape, seed):
    shape = (2,) * min_dims + shape
    check_grad(op, [domain(np.random.default_rng(seed), shape)], device)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@given(data=st.data())
def test_softmax_any_axis(device, name, data):
    shape = data.draw(shapes(min_dims=1))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    a = real(np.random.default_rng(data.draw(SEEDS)), shape)
    ref = np_softmax if name == "softmax" else np_log_softmax
    op = lambda t: getattr(t, name)(axis=axis)  # noqa: E731
    assert_values(op(tt.tensor(a, dtype=tt.float64, device=device)), ref(a, axis=axis), rtol=1e-10, atol=1e-12)
    check_grad(op, [a], device)


def test_softmax_rows_sum_to_one(device):
    tt.manual_seed(0)
    s = tt.randn(4, 7, device=device).softmax(axis=-1).numpy()
    np.testing.assert_allclose(s.sum(axis=-1), np.ones(4), rtol=1e-6)


# -- kinks: derivative conventions ----------------------------------------------------------

@pytest.mark.parametrize(
    "op, x, expected",
    [
        (lambda t: t.relu(), [-1.0, 0.0, 2.0], [0.0, 0.0, 1.0]),
        (lambda t: t.abs(), [-1.0, 0.0, 2.0], [-1.0, 0.0, 1.0]),
        (lambda t: t.clip(-0.5, 0.5), [-1.0, -0.5, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0, 1.0, 0.0]),
        (lambda t: t.max(), [1.0, 3.0, 3.0], [0.0, 0.5, 0.5]),
        (lambda t: t.max(), [[1.0, 3.0], [3.0, 0.0]], [[0.0, 0.5], [0.5, 0.0]]),
        (lambda t: t.max(), [2.0, 2.0, 2.0, 2.0], [0.25, 0.25, 0.25, 0.25]),
        (lambda t: t.max(axis=1), [[1.0, 3.0, 3.0], [2.0, 2.0, 1.0]], [[0.0, 0.5, 0.5], [0.5, 0.5, 0.0]]),
        (lambda t: t.max(axis=0, keepdims=True), [[1.0, 3.0], [1.0, 2.0]], [[0.5, 1.0], [0.5, 0.0]]),
    ],
    ids=["relu0", "abs0", "clip_bounds", "max_tie", "max_tie_2d", "max_all_tied", "max_tie_axis", "max_keepdims"],
)
def test_gradient_at_kinks(device, op, x, expected):
    np.testing.assert_allclose(grad_of(op, x, device), expected)


# -- binary elementwise ops with broadcasting --------------------------------------------------

# (name, op, reference, domain of a, domain of b)
BINARY = [
    ("add", operator.add, np.add, real, real),
    ("sub", operator.sub, np.subtract, real, real),
    ("mul", operator.mul, np.multiply, real, real),
    ("div", operator.truediv, np.divide, real, nonzero),
    ("pow", operator.pow, np.power, positive, real),
]
BINARY_IDS = [row[0] for row in BINARY]
BROADCAST_PAIRS = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)


@pytest.mark.parametrize("name, op, ref, dom_a, dom_b", BINARY, ids=BINARY_IDS)
@given(shapes=BROADCAST_PAIRS, seed=SEEDS)
def test_binary_forward(device, name, op, ref, dom_a, dom_b, shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    a, b = dom_a(rng, sa).astype(np.float32), dom_b(rng, sb).astype(np.float32)
    out = op(tt.tensor(a, device=device), tt.tensor(b, device=device))
    assert out.shape == shapes.result_shape and out.dtype == np.float32
    assert_values(out, ref(a.astype(np.float64), b.astype(np.float64)), rtol=1e-5)


@pytest.mark.parametrize("name, op, ref, dom_a, dom_b", BINARY, ids=BINARY_IDS)
@given(shapes=BROADCAST_PAIRS, seed=SEEDS)
def test_binary_grad(device, name, op, ref, dom_a, dom_b, shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    check_grad(op, [dom_a(rng, sa), dom_b(rng, sb)], device)


@pytest.mark.parametrize("name, op, ref, dom_a, dom_b", BINARY, ids=BINARY_IDS)
@given(shapes=BROADCAST_PAIRS, seed=SEEDS)
def test_broadcast_operands_get_grads_of_their_own_shape(device, name, op, ref, dom_a, dom_b, shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    a, b = leaf(dom_a(rng, sa), device), leaf(dom_b(rng, sb), device)
    op(a, b).sum().backward()
    assert a.grad.shape == sa and b.grad.shape == sb
    assert a.grad.dtype == np.float64 and b.grad.dtype == np.float64


def test_broadcast_add_grad_values(device):
    a = leaf(np.zeros((3, 1)), device)
    b = leaf(np.zeros(4), device)
    (a + b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.full((3, 1), 4.0))
    np.testing.assert_array_equal(b.grad.numpy(), np.full(4, 3.0))


def test_same_tensor_on_both_sides(device):
    """``x * x`` and ``x / x`` use one leaf twice; both contributions must add up."""
    np.testing.assert_allclose(grad_of(lambda x: x * x, [1.0, -2.0], device), [2.0, -4.0])
    np.testing.assert_allclose(grad_of(lambda x: x / x, [1.0, -2.0], device), [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(grad_of(lambda x: x - x, [1.0, -2.0], device), [0.0, 0.0])


# -- matmul -------------------------------------------------------------------------------------

MATMUL_CASES = [
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (3, 4)),
    ((3,), (2, 3, 4)),
    ((2, 3, 4), (4,)),
    ((2, 1, 3, 4), (5, 4, 2)),
]


@st.composite
def matmul_shapes(draw):
    batch_a, batch_b = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3)).input_shapes
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    vector = st.sampled_from([False, False, False, True])
    a_shape = (k,) if draw(vector) else batch_a + (m, k)
    b_shape = (k,) if draw(vector) else batch_b + (k, n)
    return a_shape, b_shape


def check_matmul(device, a_shape, b_shape, seed):
    rng = np.random.default_rng(seed)
    a, b = real(rng, a_shape), real(rng, b_shape)
    out = tt.tensor(a, device=device) @ tt.tensor(b, device=device)
    expected = np.matmul(a.astype(np.float32), b.astype(np.float32))
    assert out.dtype == np.float32
    assert_values(out, expected, rtol=1e-5, atol=1e-5)
    check_grad(operator.matmul, [a, b], device)


@pytest.mark.parametrize("a_shape, b_shape", MATMUL_CASES, ids=repr)
def test_matmul_cases(device, a_shape, b_shape):
    check_matmul(device, a_shape, b_shape, seed=0)


@given(shapes=matmul_shapes(), seed=SEEDS)
def test_matmul_random_shapes(device, shapes, seed):
    check_matmul(device, *shapes, seed)


# -- reductions ----------------------------------------------------------------------------------

@st.composite
def shape_axis_keepdims(draw):
    shape = draw(shapes())
    nd = len(shape)
    axis = None
    if nd:
        one_axis = st.integers(-nd, nd - 1)
        axes = st.lists(one_axis, min_size=1, max_size=nd, unique_by=lambda a: a % nd).map(tuple)
        axis = draw(st.one_of(st.none(), one_axis, axes))
    return shape, axis, draw(st.booleans())


REDUCTIONS = [("sum", np.sum, real), ("mean", np.mean, real), ("max", np.max, distinct)]


@pytest.mark.parametrize("name, ref, domain", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
@given(case=shape_axis_keepdims(), seed=SEEDS)
def test_reduction_forward(device, name, ref, domain, case, seed):
    shape, axis, keepdims = case
    a = domain(np.random.default_rng(seed), shape).astype(np.float32)
    out = getattr(tt.tensor(a, device=device), name)(axis=axis, keepdims=keepdims)
    assert out.dtype == np.float32
    assert_values(out, ref(a.astype(np.float64), axis=axis, keepdims=keepdims), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, ref, domain", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
@given(case=shape_axis_keepdims(), seed=SEEDS)
def test_reduction_grad(device, name, ref, domain, case, seed):
    shape, axis, keepdims = case
    a = domain(np.random.default_rng(seed), shape)
    check_grad(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims), [a], device)


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
def test_reduction_defaults_and_positional_axis(device, name):
    a = np.arange(6.0).reshape(2, 3)
    t = tt.tensor(a, device=device)
    assert getattr(t, name)().shape == ()
    assert_values(getattr(t, name)(), getattr(np, name)(a))
    assert_values(getattr(t, name)(1), getattr(np, name)(a, axis=1))


def test_mean_grad_is_one_over_count(device):
    np.testing.assert_allclose(grad_of(lambda t: t.mean(axis=(0, 2)), np.zeros((2, 3, 4)), device), np.full((2, 3, 4), 1 / 8))


# -- shape ops ---------------------------------------------------------------------------------------

@given(shape=shapes(), data=st.data())
def test_reshape_grad(device, shape, data):
    size = int(np.prod(shape))
    target = data.draw(st.sampled_from([(-1,), (size, 1), (1, -1), tuple(reversed(shape)) or (1,)]))
    a = real(np.random.default_rng(0), shape)
    assert tt.tensor(a, device=device).reshape(target).shape == a.reshape(target).shape
    check_grad(lambda t: t.reshape(target), [a], device)
    check_grad(lambda t: t.reshape(*target), [a], device)


@given(shape=shapes(min_dims=1), data=st.data())
def test_transpose_grad(device, shape, data):
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    a = real(np.random.default_rng(0), shape)
    assert_values(tt.tensor(a, dtype=tt.float64, device=device).transpose(*axes), a.transpose(axes))
    check_grad(lambda t: t.transpose(*axes), [a], device)
    check_grad(lambda t: t.transpose(), [a], device)


def test_T_grad(device):
    check_grad(lambda t: t.T, [real(np.random.default_rng(0), (2, 3))], device)


@pytest.mark.parametrize("dtype", [tt.float32, tt.float16])
def test_astype_grad_returns_to_source_dtype(device, dtype):
    x = leaf([1.0, 2.0], device)
    (x.astype(dtype) * 3).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_astype_gradcheck(device):
    check_grad(lambda t: t.astype(tt.float64) * t, [real(np.random.default_rng(0), (3,))], device)


# -- indexing -----------------------------------------------------------------------------------------

MASK = np.array([[True, False, True], [False, False, False], [True, True, True], [False, True, False]])

# (id, make(device) -> (tinytrain index, NumPy index)); x has shape (4, 3).
INDICES = [
    ("int", lambda d: (1, 1)),
    ("negative_int", lambda d: (-1, -1)),
    ("slice", lambda d: (slice(1, 3), slice(1, 3))),
    ("step_slice", lambda d: (slice(None, None, -2),) * 2),
    ("int_pair", lambda d: ((2, 1), (2, 1))),
    ("column", lambda d: ((slice(None), 0),) * 2),
    ("none_ellipsis", lambda d: ((None, Ellipsis),) * 2),
    ("ellipsis_int", lambda d: ((Ellipsis, 1),) * 2),
    ("mixed", lambda d: ((1, None, slice(0, 2)),) * 2),
    ("list_repeated", lambda d: ([0, 2, 0], [0, 2, 0])),
    ("empty_list", lambda d: ([], [])),  # NumPy's asarray([]) is float64, which no index may be
    ("ndarray_2d", lambda d: (np.array([[0, 1], [3, 3]]),) * 2),
    ("tensor_repeated", lambda d: (tt.tensor([3, 0, 3], device=d), np.array([3, 0, 3]))),
    ("advanced_pair", lambda d: (([0, 1, 1], [2, 2, 0]),) * 2),
    ("slice_and_list", lambda d: ((slice(None), [2, 0, 2]),) * 2),
    ("bool_mask", lambda d: (tt.tensor(MASK, device=d), MASK)),
    ("bool_row_mask", lambda d: (tt.tensor(MASK[:, 0], device=d), MASK[:, 0])),
]
INDEX_IDS = [row[0] for row in INDICES]


@pytest.mark.parametrize("name, make", INDICES, ids=INDEX_IDS)
def test_getitem_forward(device, name, make):
    index, np_index = make(device)
    a = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    assert_values(tt.tensor(a, device=device)[index], a[np_index])


@pytest.mark.parametrize("name, make", INDICES, ids=INDEX_IDS)
def test_getitem_grad(device, name, make):
    index, _ = make(device)
    check_grad(lambda t: t[index], [real(np.random.default_rng(0), (4, 3))], device)


def test_repeated_indices_accumulate(device):
    g = grad_of(lambda t: t[[0, 0, 2, 0]], np.zeros(3), device)
    np.testing.assert_array_equal(g, [3.0, 0.0, 1.0])
    g = grad_of(lambda t: t[tt.tensor([[1, 1], [1, 0]], device=device)], np.zeros((2, 2)), device)
    np.testing.assert_array_equal(g, [[1.0, 1.0], [3.0, 3.0]])


# -- stack, concatenate, where -------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_stack_grad(device, axis):
    rng = np.random.default_rng(0)
    check_grad(lambda *ts: tt.stack(list(ts), axis=axis), [real(rng, (2, 3)) for _ in range(3)], device)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_grad(device, axis):
    rng = np.random.default_rng(0)
    arrays = [real(rng, (2, 3)), real(rng, (2, 3) if axis == 0 else (2, 1)), real(rng, (1, 3) if axis == 0 else (2, 2))]
    check_grad(lambda *ts: tt.concatenate(list(ts), axis=axis), arrays, device)


def test_where_grad(device):
    rng = np.random.default_rng(0)
    cond = tt.tensor([[True, False, True], [False, False, True]], device=device)
    check_grad(lambda a, b: tt.where(cond, a, b), [real(rng, (2, 3)), real(rng, (2, 3))], device)


def test_where_grad_values(device):
    cond = tt.tensor([True, False, True], device=device)
    a, b = leaf(np.zeros(3), device), leaf(np.zeros(3), device)
    (tt.where(cond, a, b) * tt.tensor([1.0, 2.0, 3.0], dtype=tt.float64, device=device)).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.0, 2.0, 0.0])


def test_where_broadcasts(device):
    rng = np.random.default_rng(0)
    cond = tt.tensor([True, False, True], device=device)
    check_grad(lambda a, b: tt.where(cond, a, b), [real(rng, (2, 3)), real(rng, ())], device)


# -- composite: a small network's gradient -----------------------------------------------------------

def test_mlp_grad(device):
    rng = np.random.default_rng(0)

    def mlp(x, w1, b1, w2):
        h = (x @ w1 + b1).tanh()
        return (h @ w2).log_softmax(axis=-1)

    check_grad(mlp, [real(rng, (5, 4)), real(rng, (4, 6)), real(rng, (6,)), real(rng, (6, 3))], device)


# -- numerical stability ------------------------------------------------------------------------------

@pytest.fixture
def strict_warnings():
    """Any floating-point warning (overflow in exp, 0/0, log(0)) fails the test."""
    with warnings.catch_warnings(), np.errstate(over="warn", divide="warn", invalid="warn"):
        warnings.simplefilter("error")
        yield


EXTREME = [1000.0, 0.0, -1000.0]


@pytest.mark.parametrize("dtype", [tt.float32, tt.float64])
def test_softmax_extreme_logits(device, dtype, strict_warnings):
    x = tt.tensor(EXTREME, dtype=dtype, device=device, requires_grad=True)
    s = x.softmax()
    np.testing.assert_allclose(s.numpy(), [1.0, 0.0, 0.0])
    (s * tt.tensor([1.0, 2.0, 3.0], dtype=dtype, device=device)).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


@pytest.mark.parametrize("dtype", [tt.float32, tt.float64])
def test_log_softmax_extreme_logits(device, dtype, strict_warnings):
    x = tt.tensor(EXTREME, dtype=dtype, device=device, requires_grad=True)
    out = x.log_softmax()
    np.testing.assert_allclose(out.numpy(), [0.0, -1000.0, -2000.0])
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [-2.0, 1.0, 1.0], atol=1e-6)


def test_softmax_extreme_logits_along_axis0(device, strict_warnings):
    x = tt.tensor([[1000.0, -5.0], [0.0, -5.0], [-1000.0, -5.0]], device=device)
    np.testing.assert_allclose(x.softmax(axis=0).numpy(), [[1.0, 1 / 3], [0.0, 1 / 3], [0.0, 1 / 3]], rtol=1e-6)


@pytest.mark.parametrize("dtype", [tt.float32, tt.float64])
def test_sigmoid_extreme_inputs(device, dtype, strict_warnings):
    x = tt.tensor([1000.0, -1000.0, 0.0], dtype=dtype, device=device, requires_grad=True)
    s = x.sigmoid()
    np.testing.assert_allclose(s.numpy(), [1.0, 0.0, 0.5])
    s.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 0.25])


def test_tanh_extreme_inputs(device, strict_warnings):
    x = tt.tensor([1000.0, -1000.0], device=device, requires_grad=True)
    t = x.tanh()
    np.testing.assert_allclose(t.numpy(), [1.0, -1.0])
    t.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0])
