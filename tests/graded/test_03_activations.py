"""Graded checks of Module 03 (activations): every function the student writes.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 03``). Inputs are built with the installed tensor library.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check

X = [-3.0, -0.5, 0.0, 0.5, 3.0]


def _gelu(x):
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@check(points=1, hint="relu(x) is max(x, 0) elementwise; x.relu() does it")
def test_relu(student):
    x = tt.tensor(X, requires_grad=True)
    y = student.relu(x)
    np.testing.assert_allclose(y.numpy(), np.maximum(X, 0))
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0, 0, 0, 1, 1])


@check(points=1, hint="sigmoid(x) = 1 / (1 + exp(-x)), and must not overflow for x = -1000")
def test_sigmoid(student):
    x = tt.tensor(X + [-1000.0, 1000.0])
    y = student.sigmoid(x).numpy()
    expected = 1 / (1 + np.exp(-np.clip(np.array(X + [-1000.0, 1000.0]), -80, 80)))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-7)
    assert np.isfinite(y).all()


@check(points=1, hint="tanh(x) is x.tanh(); its values lie in (-1, 1)")
def test_tanh(student):
    y = student.tanh(tt.tensor(X)).numpy()
    np.testing.assert_allclose(y, np.tanh(X), rtol=1e-5)


@check(points=2, hint="GELU forward: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), x clipped inside the cubic")
def test_gelu_forward(student):
    x = [-20.0, -3.0, -1.0, 0.0, 0.5, 2.0, 20.0, 1e6]
    y = student.gelu(tt.tensor(x, dtype="float64")).numpy()
    expected = _gelu(np.clip(x, -10, 10))
    expected[-2:] = [20.0, 1e6]  # tanh is exactly 1 there: gelu(x) = x
    expected[0] = 0.0
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-12)


@check(points=2, hint="GELU backward: 0.5(1 + t) + 0.5 x (1 - t^2) sqrt(2/pi)(1 + 3*0.044715 x^2), times grad")
def test_gelu_backward(student):
    x = tt.tensor([-2.5, -0.7, 0.1, 0.9, 3.0], dtype="float64", requires_grad=True)
    assert tt.gradcheck(student.gelu, [x])


@check(points=1, hint="gelu(x, approximate=...) supports only 'tanh'; anything else raises ValueError")
def test_gelu_rejects_exact(student):
    import pytest

    y = student.gelu(tt.tensor([1.0]))  # the supported form works...
    np.testing.assert_allclose(y.numpy(), _gelu([1.0]), rtol=1e-5)
    with pytest.raises(ValueError):  # ...and the unsupported one says so
        student.gelu(tt.tensor([1.0]), approximate="none")


@check(points=2, hint="softmax along axis: exp(x - max) / sum(exp(x - max)); rows sum to 1, no overflow")
def test_softmax(student):
    x = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, 1000.0]])
    y = student.softmax(tt.tensor(x), axis=-1).numpy()
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=-1, keepdims=True), rtol=1e-5)
    columns = student.softmax(tt.tensor(x[:1].T), axis=0).numpy()
    np.testing.assert_allclose(columns.sum(axis=0), [1.0], rtol=1e-5)


@check(points=2, hint="log_softmax = (x - m) - log(sum(exp(x - m))) with m = max(x); finite for large x")
def test_log_softmax(student):
    x = np.array([[1.0, 2.0, 3.0], [-1000.0, 0.0, 1000.0]])
    y = student.log_softmax(tt.tensor(x, dtype="float64"), axis=1).numpy()
    m = x.max(axis=1, keepdims=True)
    expected = (x - m) - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(y, expected, rtol=1e-9)
    assert np.isfinite(y).all()
