"""Graded checks of Module 03 (activations): every function the student writes.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 03``). Inputs are built with the installed tensor library.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check, expect_close, expect_gradcheck, expect_raises

X = [-3.0, -0.5, 0.0, 0.5, 3.0]
UPSTREAM = [0.5, -2.0, 1.5, 3.0, -1.0]  # a gradient from above that is not all ones


def _gelu(x):
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_slope(x):
    x = np.asarray(x, dtype=np.float64)
    t = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x * x)


def _log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return (x - m) - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _expect_gradient(f, name):
    """``f(x, axis)`` is in the graph, with the right gradient, for both axes of a (2, 3) input."""
    for axis in (1, 0):
        x = tt.tensor(np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -0.5]]), dtype="float64", requires_grad=True)
        if not f(x, axis=axis).requires_grad:
            raise AssertionError(f"{name}(x, axis={axis}) of an x that requires grad: expected a result in the graph "
                                 "(requires_grad True), got one cut off from it")
        expect_gradcheck(lambda t: f(t, axis=axis), [x], f"gradcheck of {name}(x, axis={axis})")


def _expect_unchanged_after(f, name):
    values = [[0.5, -1.0, 2.0], [3.0, 0.0, -0.5]]
    x = tt.tensor(values, requires_grad=True)
    f(x, axis=0).sum().backward()
    _expect_unchanged(x, values, f"{name}(x, axis=0) and its backward")


def _backward(f, values, upstream, dtype="float64", **kwargs):
    """(f(x) as NumPy, x.grad as NumPy) for x = values, backpropagating ``upstream``; x must stay unchanged."""
    x = tt.tensor(values, dtype=dtype, requires_grad=True)
    y = f(x, **kwargs)
    y.backward(tt.tensor(upstream, dtype=dtype))
    name = getattr(f, "__name__", f)
    assert x.grad is not None, f"{name}(x).backward(): expected a gradient in x.grad, got None"
    _expect_unchanged(x, values, f"{name}(x)")
    return y.numpy(), x.grad.numpy()


def _expect_unchanged(x, values, what):
    expect_close(x.numpy(), np.array(values, dtype=x.dtype), f"x after {what} with x = {values} (a function never "
                 "changes its input)", rtol=0, atol=0)


def _on_strict(f, values, **kwargs):
    """``f`` of ``values`` on the strict device (no NumPy arrays mixed in, no host reads), as a NumPy array."""
    try:
        return f(tt.tensor(values, device="strict"), **kwargs).numpy()
    except TypeError as error:
        raise AssertionError(f"{getattr(f, '__name__', f)}(x) of an x on the 'strict' device: expected it computed on "
                             f"x's device with tensor operations, got TypeError: {error}") from None


@check(points=1, hint="relu(x) is max(x, 0) elementwise; x.relu() does it")
def test_relu(student):
    y, grad = _backward(student.relu, X, UPSTREAM, dtype="float32")
    expect_close(y, np.maximum(X, 0), f"relu({X})", dtype="float32")
    expect_close(grad, np.array(UPSTREAM) * [0, 0, 0, 1, 1], f"gradient of relu at {X} for upstream {UPSTREAM}")


@check(points=1, hint="sigmoid(x) = 1 / (1 + exp(-x)), and must not overflow for x = -1000")
def test_sigmoid(student):
    values = X + [-1000.0, 1000.0]
    y, grad = _backward(student.sigmoid, values, UPSTREAM + [1.0, 1.0], dtype="float32")
    s = 1 / (1 + np.exp(-np.clip(np.array(values), -80, 80)))
    expect_close(y, s, f"sigmoid({values})", rtol=1e-5, atol=1e-7, dtype="float32")
    expect_close(grad, np.array(UPSTREAM + [1.0, 1.0]) * s * (1 - s), f"gradient of sigmoid at {values}",
                 rtol=1e-4, atol=1e-7)


@check(points=1, hint="tanh(x) is x.tanh(); its values lie in [-1, 1], exactly +-1 (never nan) for large |x|, "
                     "and keep their digits near 0")
def test_tanh(student):
    values = X + [-1000.0, 1000.0]
    y, grad = _backward(student.tanh, values, UPSTREAM + [1.0, 1.0], dtype="float32")
    expect_close(y, np.tanh(values), f"tanh({values})", rtol=1e-5, dtype="float32")
    small = [1e-4, -3e-3, 2e-6]  # tanh(x) ~ x: 2 * sigmoid(2x) - 1 cancels digits here
    expect_close(student.tanh(tt.tensor(small)), np.tanh(np.array(small, dtype=np.float32)),
                 f"tanh({small}) in float32, to 1e-5 relative (near 0 tanh(x) is about x; 2 * sigmoid(2x) - 1 "
                 "and (e^x - e^-x) / (e^x + e^-x) subtract nearly equal numbers there and lose digits)",
                 rtol=1e-5, atol=0, dtype="float32")
    y, grad = _backward(student.tanh, X, UPSTREAM, dtype="float32")
    expect_close(grad, np.array(UPSTREAM) * (1 - np.tanh(X) ** 2), f"gradient of tanh at {X}", rtol=1e-4, atol=1e-7)


@check(points=2, hint="GELU forward: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), x clipped inside the cubic")
def test_gelu_forward(student):
    x = [-20.0, -3.0, -1.0, 0.0, 0.5, 2.0, 20.0, 1e6]
    y = student.gelu(tt.tensor(x, dtype="float64")).numpy()
    expected = _gelu(np.clip(x, -10, 10))
    expected[-2:] = [20.0, 1e6]  # tanh is exactly 1 there: gelu(x) = x
    expected[0] = 0.0
    expect_close(y, expected, f"gelu({x}) in float64", rtol=1e-6, atol=1e-12, dtype="float64")
    huge = [-1e30, -50.0, 50.0, 1e30]
    with np.errstate(over="raise", invalid="raise"):
        try:
            y = student.gelu(tt.tensor(huge)).numpy()
        except FloatingPointError as error:
            raise AssertionError(f"gelu({huge}) in float32: expected no overflow (clip x inside the cubic), got "
                                 f"FloatingPointError: {error}") from None
    expect_close(y, [0.0, 0.0, 50.0, 1e30], f"gelu({huge}) in float32", dtype="float32")
    small = [-1.0, 0.5, 2.0]
    expect_close(student.gelu(tt.tensor(small)), _gelu(small), f"gelu({small}) in float32", rtol=1e-5,
                 dtype="float32")


@check(points=2, hint="GELU backward: p + 2 x p (1 - p) sqrt(2/pi)(1 + 3*0.044715 x^2), p = (1 + t) / 2, times grad",
       after="test_gelu_forward")
def test_gelu_backward(student):
    values = [-2.5, -0.7, 0.1, 0.9, 3.0]
    _, grad = _backward(student.gelu, values, UPSTREAM)
    expect_close(grad, np.array(UPSTREAM) * _gelu_slope(values), f"gradient of gelu at {values} for upstream "
                 f"{UPSTREAM}", rtol=1e-9, atol=1e-12)
    huge = [-1e30, -50.0, 50.0, 1e30]
    with np.errstate(over="raise", invalid="raise"):
        try:
            _, grad = _backward(student.gelu, huge, [1.0, 1.0, 1.0, 1.0], dtype="float32")
        except FloatingPointError as error:
            raise AssertionError(f"gradient of gelu at {huge} in float32: expected no overflow (clip x inside the "
                                 f"cubic, and in the slope), got FloatingPointError: {error}") from None
    expect_close(grad, [0.0, 0.0, 1.0, 1.0], f"gradient of gelu at {huge} (no overflow: clip x inside the cubic)")
    node = student.gelu(tt.tensor([0.5, -1.0], requires_grad=True))._ctx
    got = node.backward(np.array([1.0, 2.0], np.float32))
    expect_close(got[0], np.array([1.0, 2.0]) * _gelu_slope([0.5, -1.0]),
                 "GELUTanh.backward(float32 grad [1, 2]) at float32 x = [0.5, -1] (a gradient has grad's dtype)",
                 rtol=1e-5, dtype="float32")
    x = tt.tensor([[-2.5, -0.7], [0.1, 3.0]], dtype="float64", requires_grad=True)
    expect_gradcheck(student.gelu, [x], "gradcheck of gelu")
    node = student.gelu(x)._ctx
    assert isinstance(node, student.GELUTanh), f"gelu(x): expected one GELUTanh node in the graph " \
                                               f"(GELUTanh.apply(x)), got {type(node).__name__}"
    saved = {name: value for name, value in vars(node).items() if isinstance(value, np.ndarray)}
    t = np.tanh(math.sqrt(2 / math.pi) * (x.data + 0.044715 * x.data**3))
    others = [name for name, value in saved.items() if value is not x.data]
    keeps = len(saved) - len(others) == 1 and len(others) <= 1 and all(
        saved[name].shape == t.shape and any(np.allclose(saved[name], kept, rtol=1e-9) for kept in (t, (1 + t) / 2))
        for name in others)
    assert keeps, \
        f"GELUTanh saves for backward x, the input array itself (a copy or a clipped x costs memory), and " \
        f"p = (1 + tanh(u)) / 2 or t = tanh(u) or nothing more (then backward recomputes it): expected the " \
        f"input's array and at most p or t, got " \
        f"{list(saved)}" + ("" if len(saved) > len(others) else " (none of them the input's array)")


@check(points=1, hint="gelu(x, approximate=...) supports only 'tanh'; anything else raises ValueError")
def test_gelu_rejects_exact(student):
    expect_close(student.gelu(tt.tensor([1.0]), approximate="tanh"), _gelu([1.0]), "gelu([1.0], approximate='tanh')",
                 rtol=1e-5)
    expect_raises(ValueError, lambda: student.gelu(tt.tensor([1.0]), approximate="none"),
                  "gelu(x, approximate='none')", mentions=("none",))


@check(points=2, hint="softmax along axis: exp(x - max) / sum(exp(x - max)); rows sum to 1, no overflow")
def test_softmax(student):
    x = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, 1000.0]])
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    expect_close(student.softmax(tt.tensor(x), axis=-1), e / e.sum(axis=-1, keepdims=True),
                 "softmax([[1, 2, 3], [1000, 1000, 1000]], axis=-1)", rtol=1e-5, dtype="float32")
    expect_close(student.softmax(tt.tensor(x)), e / e.sum(axis=-1, keepdims=True),
                 "softmax([[1, 2, 3], [1000, 1000, 1000]]) (default axis=-1)", rtol=1e-5)
    z = np.array([[2.0, 1.0], [0.0, -1.0], [-500.0, 3.0]])
    e = np.exp(z - z.max(axis=0, keepdims=True))
    expect_close(student.softmax(tt.tensor(z), axis=0), e / e.sum(axis=0, keepdims=True),
                 "softmax([[2, 1], [0, -1], [-500, 3]], axis=0)", rtol=1e-5, atol=1e-7)
    _expect_gradient(student.softmax, "softmax")
    _expect_unchanged_after(student.softmax, "softmax")
    expect_close(_on_strict(student.softmax, [[1.0, 2.0, 3.0], [1000.0, 1000.0, 1000.0]]),
                 np.array([[0.09003057, 0.24472847, 0.66524096], [1 / 3, 1 / 3, 1 / 3]]),
                 "softmax([[1, 2, 3], [1000, 1000, 1000]]) on the 'strict' device", rtol=1e-5)


@check(points=2, hint="log_softmax along axis = (x - m) - log(sum(exp(x - m))) with m = max(x) along that axis; "
                      "finite for large x")
def test_log_softmax(student):
    x = np.array([[1.0, 2.0, 3.0], [-1000.0, 0.0, 1000.0]])
    for axis in (1, 0, -1):
        y = student.log_softmax(tt.tensor(x, dtype="float64"), axis=axis).numpy()
        expect_close(y, _log_softmax(x, axis), f"log_softmax([[1, 2, 3], [-1000, 0, 1000]], axis={axis})",
                     rtol=1e-9, dtype="float64")
    y = student.log_softmax(tt.tensor(x, dtype="float64")).numpy()
    expect_close(y, _log_softmax(x, -1), "log_softmax([[1, 2, 3], [-1000, 0, 1000]]) (default axis=-1)", rtol=1e-9)
    expect_close(student.log_softmax(tt.tensor([0.0, -200.0])), [0.0, -200.0], "log_softmax([0, -200]) in float32",
                 rtol=1e-6, dtype="float32")
    _expect_gradient(student.log_softmax, "log_softmax")
    _expect_unchanged_after(student.log_softmax, "log_softmax")
    expect_close(_on_strict(student.log_softmax, [[1.0, 2.0, 3.0], [-1000.0, 0.0, 1000.0]]),
                 _log_softmax(np.array([[1.0, 2.0, 3.0], [-1000.0, 0.0, 1000.0]]), -1),
                 "log_softmax([[1, 2, 3], [-1000, 0, 1000]]) on the 'strict' device", rtol=1e-5)
