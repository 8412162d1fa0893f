"""Graded checks of Module 02 (autograd): Function.apply, sum_to_shape, every
backward rule the student writes, the engine and gradcheck.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 02``). Each operation is checked on its own: a fresh instance
of the student's class runs ``forward`` on float64 arrays, and its ``backward``
is compared with central differences of that forward. The engine and gradcheck
are checked on graphs of the installed operations (the tensor operators, and
``InstalledFunction`` subclasses: one creation counter orders them all), so one
unfinished part does not fail the checks of another.
"""
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.autograd import Function as InstalledFunction  # the package's, imported before any overlay
from tinytrain.course.checks import check

RNG = np.random.default_rng(0)


def _op(student, name, arrays, **params):
    """A fresh instance of the student's operation ``name`` after its forward on ``arrays``."""
    fn = getattr(student, name)()
    fn.backend = tt.get_backend("cpu")
    fn.inputs = tuple(tt.tensor(a, dtype="float64", requires_grad=True) for a in arrays)
    out = fn.forward(*arrays, **params)
    return fn, out


def assert_backward(student, name, arrays, eps=1e-6, **params):
    """``backward`` of operation ``name`` agrees with central differences of its ``forward``."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    fn, out = _op(student, name, [a.copy() for a in arrays], **params)
    weights = RNG.standard_normal(np.shape(out))
    grads = fn.backward(weights.copy())
    assert len(grads) == len(arrays), f"{name}.backward returns one gradient per input, got {len(grads)}"
    for i, array in enumerate(arrays):
        assert grads[i] is not None, f"{name}.backward: no gradient for input {i}, which requires grad"
        analytic = np.asarray(grads[i], dtype=np.float64)
        assert analytic.shape == array.shape, f"{name}: gradient {i} has shape {analytic.shape}, input {array.shape}"
        numeric = np.zeros_like(array)
        for j in range(array.size):
            estimates = []
            for step in (eps, -eps):
                moved = [a.copy() for a in arrays]
                moved[i].flat[j] += step
                estimates.append(float((weights * _op(student, name, moved, **params)[1]).sum()))
            numeric.flat[j] = (estimates[0] - estimates[1]) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7, err_msg=f"{name}.backward, input {i}")


@check(points=2, hint="apply: fn = cls(); fn.backend = inputs[0]._backend; forward on the arrays; record fn, inputs and "
                      "sequence on the result only when an input requires grad and recording is on")
def test_function_apply(student):
    class Double(student.Function):
        def forward(self, a):
            return 2 * a

        def backward(self, grad):
            return (2 * grad,)

    x = tt.tensor([1.0, 2.0], requires_grad=True)
    y = Double.apply(x)
    assert isinstance(y, tt.Tensor) and y.numpy().tolist() == [2.0, 4.0]
    assert y.requires_grad and isinstance(y._ctx, Double) and tuple(y._ctx.inputs) == (x,)
    assert y._ctx.backend is x._backend
    z = Double.apply(y)
    assert z._ctx.sequence > y._ctx.sequence, "a later operation gets a larger sequence number"
    constant = Double.apply(tt.tensor([1.0]))
    assert not constant.requires_grad and constant._ctx is None, "nothing requires grad: record nothing"
    with student.no_grad():
        assert not Double.apply(x).requires_grad, "under no_grad nothing is recorded"

    class Total(student.Function):
        def forward(self, a):
            return a.sum()  # NumPy returns a scalar here, not an array

        def backward(self, grad):
            return (grad,)

    total = Total.apply(tt.tensor([1.0, 2.0]))
    assert isinstance(total.data, np.ndarray) and total.shape == (), "a 0-d result is wrapped in an array"


@check(points=1, hint="apply catches the ValueError of a forward and raises one that names the input shapes")
def test_function_apply_errors(student):
    class Broken(student.Function):
        def forward(self, a, b):
            raise ValueError("shapes do not fit")

    with pytest.raises(ValueError) as error:
        Broken.apply(tt.zeros(2, 3), tt.zeros(4))
    assert "(2, 3)" in str(error.value) and "(4,)" in str(error.value)


@check(points=1, hint="apply passes params to forward by name (forward(*arrays, **params)), and the result lives on "
                      "fn.output_backend when forward set it (a move to another device), else on fn.backend")
def test_function_apply_params_and_devices(student):
    class Scale(student.Function):
        def forward(self, a, *, factor):  # keyword-only, like the convolutions' stride and padding
            return a * factor

        def backward(self, grad):
            return (grad,)

    x = tt.tensor([1.0, 2.0], requires_grad=True)
    assert Scale.apply(x, factor=3.0).numpy().tolist() == [3.0, 6.0]

    class ToStrict(student.Function):
        def forward(self, a):
            self.output_backend = tt.get_backend("strict")
            return self.output_backend.from_host(a)

        def backward(self, grad):
            return (self.backend.from_host(self.output_backend.to_host(grad)),)

    moved = ToStrict.apply(x)
    assert moved.device == "strict:0", f"expected the result on 'strict:0' (fn.output_backend), got {moved.device!r}"
    scalar = ToStrict.apply(tt.tensor(2.0))
    assert scalar.shape == () and scalar.device == "strict:0", "a 0-d result is wrapped by its own device's xp"


@check(points=2, hint="sum_to_shape sums the leading extra axes and the axes where the shape has 1 but grad does not")
def test_sum_to_shape(student):
    grad = np.ones((2, 3, 4))
    assert student.sum_to_shape(grad, (3, 1)).tolist() == [[8.0]] * 3
    assert student.sum_to_shape(grad, (2, 3, 4)) is grad, "same shape: return grad itself"
    assert student.sum_to_shape(grad, ()).shape == () and float(student.sum_to_shape(grad, ())) == 24.0
    assert student.sum_to_shape(grad, (1, 4)).tolist() == [[6.0] * 4]
    values = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(student.sum_to_shape(values, (2, 1, 4)), values.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(student.sum_to_shape(values, (4,)), values.sum(axis=(0, 1)))





@check(points=2, hint="Mul: grad*b for a and grad*a for b, each through sum_to_shape of its input's shape, and None "
                      "for an input that needs no gradient")
def test_mul_backward(student):
    a, b = RNG.standard_normal((3, 4)), RNG.uniform(0.5, 2.0, (3, 1))
    assert_backward(student, "Mul", [a, b])
    assert_backward(student, "Mul", [RNG.standard_normal((4,)), RNG.standard_normal((2, 4))])
    assert_backward(student, "Mul", [RNG.standard_normal(()), RNG.standard_normal((2, 2))])


@check(points=1, hint="Pow: d/da = b * a**(b-1), d/db = a**b * log(a)")
def test_pow_backward(student):
    assert_backward(student, "Pow", [RNG.uniform(0.5, 2.0, (2, 3)), RNG.uniform(-1.0, 2.0, (3,))])


@check(points=2, hint="MatMul: grad @ b^T and a^T @ grad; treat 1-D operands as a row/column, and sum broadcast batches")
def test_matmul_backward(student):
    assert_backward(student, "MatMul", [RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))])
    assert_backward(student, "MatMul", [RNG.standard_normal((2, 2, 3)), RNG.standard_normal((3, 2))])
    assert_backward(student, "MatMul", [RNG.standard_normal((3,)), RNG.standard_normal((3, 2))])
    assert_backward(student, "MatMul", [RNG.standard_normal((2, 3)), RNG.standard_normal((3,))])


@check(points=2, hint="Max: the gradient goes to the element(s) equal to the maximum; tied winners share it "
                      "equally; put the reduced axes back (keepdims) before comparing")
def test_max_backward(student):
    x = RNG.standard_normal((3, 4))
    assert_backward(student, "Max", [x], axis=None, keepdims=False)
    assert_backward(student, "Max", [x], axis=(1,), keepdims=False)
    assert_backward(student, "Max", [x], axis=(0,), keepdims=True)
    tied, out = _op(student, "Max", [np.array([[1.0, 5.0, 5.0], [2.0, 0.0, 1.0]])], axis=(1,), keepdims=False)
    assert tied.backward(np.ones(2))[0].tolist() == [[0, 0.5, 0.5], [1, 0, 0]], "tied maxima share the gradient"





@check(points=1, hint="Sigmoid forward: 1/(1+e^-|a|) for a >= 0 and e^-|a|/(1+e^-|a|) for a < 0 -- exp of a "
                      "non-positive number never overflows")
def test_sigmoid_forward_is_stable(student):
    x = RNG.standard_normal((3, 4)) * 5
    _, out = _op(student, "Sigmoid", [x])
    np.testing.assert_allclose(out, 1 / (1 + np.exp(-x)), rtol=1e-12)
    with np.errstate(over="raise"):
        _, out = _op(student, "Sigmoid", [np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0])])
    assert np.isfinite(out).all() and np.allclose(out, [0.0, 1 / (1 + np.exp(30.0)), 0.5, 1 / (1 + np.exp(-30.0)), 1.0])


@check(points=2, hint="Softmax: subtract the max along axis first; backward s*(g - sum(g*s, axis, keepdims=True))")
def test_softmax_backward(student):
    x = RNG.standard_normal((3, 4))
    assert_backward(student, "Softmax", [x], axis=1)
    assert_backward(student, "Softmax", [x], axis=0)
    _, probs = _op(student, "Softmax", [np.array([[1000.0, 0.0, -1000.0]])], axis=1)
    assert np.isfinite(probs).all() and np.allclose(probs, [[1, 0, 0]])


@check(points=2, hint="GetItem backward scatters grad into zeros of the input's shape: scatter_add for integer "
                      "arrays, so repeated picks add up; plain assignment for slices")
def test_indexing_backward(student):
    x = RNG.standard_normal((4, 3))
    assert_backward(student, "GetItem", [x], index=(slice(1, 3), 0))
    assert_backward(student, "GetItem", [x], index=np.array([0, 2, 0]))
    picked, _ = _op(student, "GetItem", [np.array([1.0, 2.0, 3.0])], index=np.array([0, 0, 2]))
    assert picked.backward(np.ones(3))[0].tolist() == [2.0, 0.0, 1.0], "repeated indices add their gradients"


@check(points=2, hint="backward rules compute with self.xp (NumPy on the CPU, CuPy on a GPU), never with np: "
                      "np.zeros, np.arange, np.add.at and friends fail on another device's arrays")
def test_backward_rules_run_on_another_device(student):
    strict = tt.get_backend("strict")
    cases = [("GetItem", [(4, 3)], {"index": np.array([0, 2, 0])}), ("GetItem", [(4, 3)], {"index": (slice(1, 3), 0)}),
             ("MatMul", [(2, 3), (3, 4)], {}), ("Mul", [(3, 4), (4,)], {}), ("Pow", [(3, 4), (4,)], {}),
             ("Max", [(3, 4)], {"axis": (1,), "keepdims": False}), ("Softmax", [(3, 4)], {"axis": 1}),
             ("Sigmoid", [(5,)], {})]
    for name, shapes, params in cases:
        arrays = [RNG.uniform(0.5, 2.0, shape).astype(np.float32) for shape in shapes]  # Pow needs a > 0
        fn, out = _op(student, name, arrays, **params)
        expected = fn.backward(np.ones_like(out))
        fn = getattr(student, name)()
        fn.backend = strict
        fn.inputs = tuple(tt.tensor(a, device="strict", requires_grad=True) for a in arrays)
        try:
            on_device = {key: strict.from_host(value) if isinstance(value, np.ndarray) else value
                         for key, value in params.items()}  # an index array lives on the device too
            out = fn.forward(*[strict.from_host(a) for a in arrays], **on_device)
            got = fn.backward(strict.xp.ones_like(out))
        except TypeError as error:
            raise AssertionError(f"{name} on the strict device: {error}") from None
        for i, (want, have) in enumerate(zip(expected, got)):
            np.testing.assert_allclose(strict.to_host(have), want, rtol=1e-6, err_msg=f"{name}, input {i}, on strict")


@check(points=3, hint="backward: pop the newest operation (heap keyed by -sequence), call its backward, add each share "
                      "into a leaf's .grad or its creator's pending gradient; free each operation unless retain_graph")
def test_engine(student):
    x = tt.tensor(3.0, requires_grad=True)
    y = tt.tensor(4.0, requires_grad=True)
    student.backward(x * y + x)
    assert (x.grad.item(), y.grad.item()) == (5.0, 3.0)
    # a diamond: both paths must arrive before the shared node passes its gradient on
    a = tt.tensor([1.0, 2.0], requires_grad=True)
    shared = a * a
    student.backward(((shared * 3) + shared.exp()).sum())
    expected = 6 * np.array([1.0, 2.0]) + 2 * np.array([1.0, 2.0]) * np.exp([1.0, 4.0])
    np.testing.assert_allclose(a.grad.numpy(), expected, rtol=1e-6)
    # a long chain: no recursion
    chain = x
    for _ in range(5_000):
        chain = chain * 1.0
    student.backward(chain)
    assert x.grad.item() == 6.0, "gradients accumulate on a leaf across backward calls (5 + 1)"


@check(points=1, hint="backward: a None from an operation's backward gives that input nothing (even if it requires "
                      "grad); keep the heap and the collected gradients local to one call: a backward may call backward")
def test_engine_none_gradients_and_nested_backward(student):
    class FirstOnly(InstalledFunction):
        def forward(self, a, b):
            return a + b

        def backward(self, grad):
            return grad, None  # b requires grad, but this operation gives it none

    a, b = tt.tensor([1.0, 2.0], requires_grad=True), tt.tensor([3.0, 4.0], requires_grad=True)
    student.backward(FirstOnly.apply(a, b).sum())
    assert a.grad.numpy().tolist() == [1.0, 1.0] and b.grad is None, f"expected b.grad None, got {b.grad}"

    class Doubled(InstalledFunction):
        """Like Module 13's checkpointing: its backward runs a backward of its own."""

        def forward(self, a):
            self.a = a
            return a * 2

        def backward(self, grad):
            leaf = tt.tensor(self.a, dtype=self.a.dtype, requires_grad=True)
            student.backward(leaf * 2, grad=tt.tensor(grad))
            return (leaf.grad.data,)

    x, y = tt.tensor([0.5, 1.0], requires_grad=True), tt.tensor([3.0, -1.0], requires_grad=True)
    older = y * y  # still waiting in the outer backward while the nested one runs
    shared = Doubled.apply(x)
    student.backward(((shared * 3) + shared.exp()).sum() + older.sum())  # a diamond around the nested backward
    expected = 6 + 2 * np.exp(2 * np.array([0.5, 1.0]))
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6, err_msg="gradient through a nested backward")
    assert y.grad is not None, "y never got its gradient: the nested backward cleared the outer backward's state"
    np.testing.assert_allclose(y.grad.numpy(), [6.0, -2.0], err_msg="the other branch, after a nested backward")


@check(points=1, hint="after backward the graph is freed (a second backward raises RuntimeError) unless retain_graph=True")
def test_engine_frees_graph(student):
    x = tt.tensor(2.0, requires_grad=True)
    loss = x * x
    student.backward(loss, retain_graph=True)
    student.backward(loss)
    assert x.grad.item() == 8.0
    with pytest.raises(RuntimeError):
        student.backward(loss)
    z = tt.tensor([1.0, 2.0], requires_grad=True)
    out = z * 2
    student.backward(out, grad=tt.tensor([1.0, 10.0]))
    assert z.grad.numpy().tolist() == [2.0, 20.0]


@check(points=2, hint="gradcheck: perturb each element by +-eps, take (f+ - f-)/(2 eps) of the projected output, "
                      "restore it; raise GradcheckError with the worst mismatch, else return True")
def test_gradcheck(student):
    x = tt.tensor(RNG.standard_normal((2, 3)), dtype="float64", requires_grad=True)
    w = tt.tensor(RNG.standard_normal((3, 2)), dtype="float64", requires_grad=True)
    before = x.numpy().copy()
    assert student.gradcheck(lambda a, b: (a @ b).tanh(), [x, w]) is True
    np.testing.assert_array_equal(x.numpy(), before, err_msg="gradcheck must put the inputs' values back")

    class WrongSquare(InstalledFunction):
        def forward(self, a):
            self.a = a
            return a * a

        def backward(self, grad):
            return (grad * self.a,)  # should be 2 * a

    with pytest.raises(AssertionError) as error:  # GradcheckError is an AssertionError
        student.gradcheck(WrongSquare.apply, [tt.tensor([1.0, -2.0, 3.0], dtype="float64", requires_grad=True)])
    assert isinstance(error.value, student.GradcheckError)
