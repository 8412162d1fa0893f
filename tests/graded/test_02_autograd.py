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
import re

import numpy as np

import tinytrain as tt
from tinytrain.autograd import Function as InstalledFunction  # the package's, imported before any overlay
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises

RNG = np.random.default_rng(0)

# the checks of the backward rules the student writes: a check that needs them all runs after them
RULE_CHECKS = ("test_mul_backward", "test_pow_backward", "test_matmul_backward", "test_max_backward",
               "test_sigmoid_forward_is_stable", "test_softmax_backward", "test_indexing_backward")


def _op(student, name, arrays, needs=None, **params):
    """A fresh instance of the student's operation ``name`` after its forward on ``arrays``.

    ``needs[i]`` says whether input ``i`` requires grad (default: all do).
    """
    needs = (True,) * len(arrays) if needs is None else needs
    fn = getattr(student, name)()
    fn.backend = tt.get_backend("cpu")
    fn.inputs = tuple(tt.tensor(a, dtype=np.asarray(a).dtype.name, requires_grad=need)
                      for a, need in zip(arrays, needs))
    out = fn.forward(*arrays, **params)
    return fn, out


def _describe(name, arrays, needs, params):
    shapes = ", ".join(str(np.shape(a)) for a in arrays)
    extra = "".join(f", {key}={value!r}" for key, value in params.items())
    wanted = "" if needs is None else f", requires_grad={tuple(needs)}"
    return f"{name} of inputs with shapes {shapes}{extra}{wanted}"


def assert_backward(student, name, arrays, needs=None, eps=1e-6, **params):
    """``backward`` of operation ``name`` agrees with central differences of its ``forward``; an input that
    does not require grad (``needs[i]`` false) gets ``None``."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    what = _describe(name, arrays, needs, params)
    fn, out = _op(student, name, [a.copy() for a in arrays], needs, **params)
    weights = np.asarray(RNG.standard_normal(np.shape(out)))
    incoming = weights.copy()
    grads = _call_backward(fn, incoming, what)  # fn.owns_grad is False: another holder may read `incoming` afterwards
    assert len(grads) == len(arrays), f"{what}: expected backward to return {len(arrays)} gradients, got {len(grads)}"
    expect_equal(incoming, weights, f"{what}: the incoming gradient after backward with owns_grad False (it may be "
                 "shared, as Add hands one array to both inputs: overwrite grad only when self.owns_grad)")
    owner, _ = _op(student, name, [a.copy() for a in arrays], needs, **params)
    owner.owns_grad = True  # backward may now write into grad: only after it has read grad for every input
    owned = _call_backward(owner, weights.copy(), f"{what}, owns_grad True")
    for i, array in enumerate(arrays):
        if needs is not None and not needs[i]:
            assert grads[i] is None, (f"{what}: input {i} does not require grad, so expected None for it, got an "
                                      f"array of shape {np.shape(grads[i])}")
            continue
        assert grads[i] is not None, f"{what}: expected a gradient for input {i}, which requires grad, got None"
        analytic = np.asarray(grads[i], dtype=np.float64)
        numeric = np.zeros_like(array)
        for j in range(array.size):
            estimates = []
            for step in (eps, -eps):
                moved = [a.copy() for a in arrays]
                moved[i].flat[j] += step
                estimates.append(float((weights * _op(student, name, moved, needs, **params)[1]).sum()))
            numeric.flat[j] = (estimates[0] - estimates[1]) / (2 * eps)
        expect_close(analytic, numeric, f"{what}: gradient of input {i} (central differences expected)",
                     rtol=1e-5, atol=1e-7)
        expect_close(np.asarray(owned[i], dtype=np.float64), numeric, f"{what}: gradient of input {i} with owns_grad "
                     "True (central differences expected: write into grad only after the last read of it)",
                     rtol=1e-5, atol=1e-7)


def _call_backward(fn, grad, what):
    """``fn.backward(grad)``; an error in it becomes an AssertionError naming the operation and its inputs."""
    try:
        return fn.backward(grad)
    except Exception as error:  # noqa: BLE001 - the message says which call failed
        raise AssertionError(f"{what}: expected backward to return the gradients, got {type(error).__name__}: "
                             f"{error}") from None


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
    assert isinstance(y, tt.Tensor), f"Double.apply(x): expected a Tensor, got {type(y).__name__}"
    expect_equal(y.numpy(), np.array([2.0, 4.0], dtype=np.float32), "Double.apply([1, 2])")
    assert y.requires_grad, "Double.apply(x) with x.requires_grad: expected requires_grad True, got False"
    assert isinstance(y._ctx, Double), f"Double.apply(x): expected _ctx to be the Double instance, got {y._ctx!r}"
    assert tuple(y._ctx.inputs) == (x,), f"Double.apply(x): expected _ctx.inputs == (x,), got {y._ctx.inputs!r}"
    assert y._ctx.backend is x._backend, f"expected fn.backend to be x's backend, got {y._ctx.backend!r}"
    z = Double.apply(y)
    assert z._ctx.sequence > y._ctx.sequence, (f"a later operation gets a larger sequence number: expected more than "
                                               f"{y._ctx.sequence}, got {z._ctx.sequence}")
    constant = Double.apply(tt.tensor([1.0]))
    assert not constant.requires_grad and constant._ctx is None, (
        f"no input requires grad: expected requires_grad False and _ctx None, got {constant.requires_grad} and "
        f"{constant._ctx!r}")
    with student.no_grad():
        quiet = Double.apply(x)
    assert not quiet.requires_grad and quiet._ctx is None, (
        f"under no_grad nothing is recorded: expected requires_grad False and _ctx None, got {quiet.requires_grad} "
        f"and {quiet._ctx!r}")

    class Total(student.Function):
        def forward(self, a):
            return a.sum()  # NumPy returns a scalar here, not an array

        def backward(self, grad):
            return (grad,)

    total = Total.apply(tt.tensor([1.0, 2.0]))
    assert isinstance(total.data, np.ndarray) and total.shape == (), (
        f"a 0-d result is wrapped in an array: expected a 0-d numpy.ndarray, got {type(total.data).__name__} "
        f"with shape {np.shape(total.data)}")


@check(points=1, hint="apply catches the ValueError of a forward and raises one that names the input shapes")
def test_function_apply_errors(student):
    class Broken(student.Function):
        def forward(self, a, b):
            raise ValueError("shapes do not fit")

    expect_raises(ValueError, lambda: Broken.apply(tt.zeros(2, 3), tt.zeros(4)),
                  "Broken.apply of shapes (2, 3) and (4,) whose forward raises ValueError",
                  mentions=("Broken", "(2, 3)", "(4,)", "shapes do not fit"))

    class Refusing(student.Function):
        def forward(self, a):
            raise TypeError("unsupported dtype")

    expect_raises(TypeError, lambda: Refusing.apply(tt.zeros(2, 3)), "Refusing.apply whose forward raises TypeError "
                  "(only a ValueError becomes apply's ValueError; anything else goes on as it is)",
                  mentions=("unsupported dtype",))


@check(points=1, hint="apply passes params to forward by name (forward(*arrays, **params)), and the result lives on "
                      "fn.output_backend when forward set it (a move to another device), else on fn.backend")
def test_function_apply_params_and_devices(student):
    class Scale(student.Function):
        def forward(self, a, *, factor):  # keyword-only, like the convolutions' stride and padding
            return a * factor

        def backward(self, grad):
            return (grad,)

    x = tt.tensor([1.0, 2.0], requires_grad=True)
    expect_equal(Scale.apply(x, factor=3.0).numpy(), np.array([3.0, 6.0], dtype=np.float32),
                 "Scale.apply([1, 2], factor=3.0)")

    class ToStrict(student.Function):
        def forward(self, a):
            self.output_backend = tt.get_backend("strict")
            return self.output_backend.from_host(a)

        def backward(self, grad):
            return (self.backend.from_host(self.output_backend.to_host(grad)),)

    moved = ToStrict.apply(x)
    assert moved.device == "strict:0", f"expected the result on 'strict:0' (fn.output_backend), got {moved.device!r}"
    scalar = ToStrict.apply(tt.tensor(2.0))
    assert scalar.shape == () and scalar.device == "strict:0", (
        f"a 0-d result is wrapped by its own device's xp: expected shape () on 'strict:0', got shape {scalar.shape} "
        f"on {scalar.device!r}")


def _broadcast_sources(shape):
    """Every shape that broadcasts to ``shape``: a suffix of it with any of its axes set to 1."""
    for start in range(len(shape) + 1):
        tail = shape[start:]
        for mask in range(2 ** len(tail)):
            yield tuple(1 if mask >> k & 1 else n for k, n in enumerate(tail))


@check(points=2, hint="sum_to_shape sums the leading extra axes and the axes where the shape has 1 but grad does not, "
                      "and returns an array of that shape (a 0-d array for shape (), never a NumPy scalar)")
def test_sum_to_shape(student):
    grad = np.ones((2, 3, 4))
    assert student.sum_to_shape(grad, (2, 3, 4)) is grad, "same shape: expected grad itself, got another array"
    for grad_shape in [(2, 3, 4), (1, 3, 2), (2, 1, 2), (5,)]:
        values = np.arange(1.0, 1.0 + np.prod(grad_shape)).reshape(grad_shape).astype(np.float32)
        for shape in _broadcast_sources(grad_shape):
            leading = len(grad_shape) - len(shape)
            axes = tuple(range(leading)) + tuple(leading + k for k, n in enumerate(shape) if n == 1)
            expected = values.sum(axis=axes, keepdims=True).reshape(shape)
            got = student.sum_to_shape(values, shape)
            what = f"sum_to_shape(grad of shape {grad_shape}, {shape})"
            assert isinstance(got, np.ndarray), f"{what}: expected a numpy.ndarray, got {type(got).__name__} {got!r}"
            expect_close(got, expected, what, rtol=0, atol=0, dtype=np.float32)


@check(points=2, hint="Mul: grad*b for a and grad*a for b, each through sum_to_shape of its input's shape, and None "
                      "for an input that does not require grad (self.inputs[i].requires_grad)")
def test_mul_backward(student):
    a, b = RNG.standard_normal((3, 4)), RNG.uniform(0.5, 2.0, (3, 1))
    assert_backward(student, "Mul", [a, b])
    assert_backward(student, "Mul", [RNG.standard_normal((4,)), RNG.standard_normal((2, 4))])
    assert_backward(student, "Mul", [RNG.standard_normal(()), RNG.standard_normal((2, 2))])
    assert_backward(student, "Mul", [a, b], needs=(True, False))
    assert_backward(student, "Mul", [a, b], needs=(False, True))


@check(points=1, hint="Pow: d/da = b * a**(b-1), d/db = a**b * log(a), and None for an input that does not require "
                      "grad (self.inputs[i].requires_grad)")
def test_pow_backward(student):
    a, b = RNG.uniform(0.5, 2.0, (2, 3)), RNG.uniform(-1.0, 2.0, (3,))
    assert_backward(student, "Pow", [a, b])
    assert_backward(student, "Pow", [a, b], needs=(True, False))
    assert_backward(student, "Pow", [a, b], needs=(False, True))
    assert_backward(student, "Pow", [np.array([0.0, 1.5, -2.0]), np.array(2.0)], needs=(True, False))  # b a^(b-1)


@check(points=2, hint="MatMul: grad @ b^T and a^T @ grad, transposing the last two axes; treat 1-D operands as a "
                      "row/column, sum broadcast batches, and None for an input that does not require grad")
def test_matmul_backward(student):
    normal = RNG.standard_normal
    for shapes in [((2, 3), (3, 4)), ((2, 2, 3), (3, 2)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 2, 3), (3,)),
                   ((3,), (3,)), ((3,), (2, 3, 4)), ((2, 3), (2, 3, 4)), ((2, 1, 2, 3), (3, 3, 2))]:
        assert_backward(student, "MatMul", [normal(shape) for shape in shapes])
    a, b = normal((2, 3)), normal((3, 4))
    assert_backward(student, "MatMul", [a, b], needs=(True, False))
    assert_backward(student, "MatMul", [a, b], needs=(False, True))


@check(points=2, hint="Max: the gradient goes to the element(s) equal to the maximum; tied winners share it "
                      "equally; put the reduced axes back (keepdims) before comparing")
def test_max_backward(student):
    x = RNG.standard_normal((3, 4))
    assert_backward(student, "Max", [x], axis=None, keepdims=False)
    assert_backward(student, "Max", [x], axis=(1,), keepdims=False)
    assert_backward(student, "Max", [x], axis=(0,), keepdims=True)
    tied, out = _op(student, "Max", [np.array([[1.0, 5.0, 5.0], [2.0, 0.0, 1.0]])], axis=(1,), keepdims=False)
    expect_close(tied.backward(np.ones(2))[0], np.array([[0, 0.5, 0.5], [1, 0, 0]]),
                 "Max over axis 1 of [[1, 5, 5], [2, 0, 1]], backward of ones (tied maxima share the gradient)")


@check(points=1, hint="Sigmoid forward: 1/(1+e^-|a|) for a >= 0 and e^-|a|/(1+e^-|a|) for a < 0 -- exp of a "
                      "non-positive number never overflows")
def test_sigmoid_forward_is_stable(student):
    x = np.array([[-8.0, -3.0, -1.0, -0.5], [-0.1, 0.0, 0.1, 0.5], [0.9, 1.0, 3.0, 8.0]])
    _, out = _op(student, "Sigmoid", [x])
    expect_close(out, 1 / (1 + np.exp(-x)), f"Sigmoid forward of {x.tolist()}", rtol=1e-12, atol=0)
    with np.errstate(over="raise"):
        try:
            _, out = _op(student, "Sigmoid", [np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0])])
        except FloatingPointError as error:
            raise AssertionError(f"Sigmoid forward of [-1000, -30, 0, 30, 1000]: expected no overflow, got {error}") \
                from None
    expect_close(out, [0.0, 1 / (1 + np.exp(30.0)), 0.5, 1 / (1 + np.exp(-30.0)), 1.0],
                 "Sigmoid forward of [-1000, -30, 0, 30, 1000]", rtol=1e-12, atol=0)


@check(points=2, hint="Softmax: subtract the max along axis (keepdims=True), one per softmax, not one for the whole "
                      "array; backward s*(g - sum(g*s, axis, keepdims=True))")
def test_softmax_backward(student):
    x = RNG.standard_normal((3, 4))
    assert_backward(student, "Softmax", [x], axis=1)
    assert_backward(student, "Softmax", [x], axis=0)
    _, probs = _op(student, "Softmax", [np.array([[1000.0, 0.0, -1000.0]])], axis=1)
    expect_close(probs, [[1.0, 0.0, 0.0]], "Softmax over axis 1 of [[1000, 0, -1000]]")
    far_apart = np.array([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1002.0]])
    expected = np.exp([0.0, -1.0, -2.0]) / np.exp([0.0, -1.0, -2.0]).sum()
    with np.errstate(all="ignore"):
        _, probs = _op(student, "Softmax", [far_apart], axis=1)
        expect_close(probs, np.stack([expected, expected]),
                     "Softmax over axis 1 of [[1000, 999, 998], [-1000, -1001, -1002]] (each row's own maximum)")
        _, probs = _op(student, "Softmax", [far_apart.T.copy()], axis=0)
        expect_close(probs, np.stack([expected, expected]).T,
                     "Softmax over axis 0 of [[1000, -1000], [999, -1001], [998, -1002]] (each column's own maximum)")


@check(points=2, hint="GetItem backward scatters grad into zeros of the input's shape: scatter_add for integer "
                      "arrays, so repeated picks add up; plain assignment for slices")
def test_indexing_backward(student):
    x = RNG.standard_normal((4, 3))
    assert_backward(student, "GetItem", [x], index=(slice(1, 3), 0))
    assert_backward(student, "GetItem", [x], index=np.array([0, 2, 0]))
    picked, _ = _op(student, "GetItem", [np.array([1.0, 2.0, 3.0])], index=np.array([0, 0, 2]))
    expect_close(picked.backward(np.ones(3))[0], np.array([2.0, 0.0, 1.0]),
                 "GetItem of [1, 2, 3] at [0, 0, 2], backward of ones (repeated indices add their gradients)")


# (operation, input shapes, params) of every backward rule the student writes; inputs in [0.5, 2): Pow needs a > 0
RULE_CASES = [("GetItem", [(4, 3)], {"index": np.array([0, 2, 0])}), ("GetItem", [(4, 3)], {"index": (slice(1, 3), 0)}),
              ("MatMul", [(2, 3), (3, 4)], {}), ("Mul", [(3, 4), (4,)], {}), ("Pow", [(3, 4), (4,)], {}),
              ("Max", [(3, 4)], {"axis": (1,), "keepdims": False}), ("Softmax", [(3, 4)], {"axis": 1}),
              ("Sigmoid", [(5,)], {})]


@check(points=2, hint="backward rules compute with self.xp (NumPy on the CPU, CuPy on a GPU), never with np: "
                      "np.zeros, np.arange, np.add.at and friends fail on another device's arrays", after=RULE_CHECKS)
def test_backward_rules_run_on_another_device(student):
    strict = tt.get_backend("strict")
    for name, shapes, params in RULE_CASES:
        arrays = [RNG.uniform(0.5, 2.0, shape).astype(np.float32) for shape in shapes]
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
            raise AssertionError(f"{name} on the strict device: expected it to run, got TypeError: {error}") from None
        for i, (want, have) in enumerate(zip(expected, got)):
            assert strict.is_array(have), (f"{name} on the strict device, gradient of input {i}: expected a strict-device "
                                           f"array, got {type(have).__name__}")
            expect_close(strict.to_host(have), want, f"{name} on the strict device, gradient of input {i}", rtol=1e-6)


@check(points=1, hint="a gradient keeps the dtype of grad (float32 stays float32): pass dtype= to zeros and to sums "
                      "of booleans, since NumPy makes zeros float64 and float32 / int64 float64", after=RULE_CHECKS)
def test_backward_rules_keep_the_dtype(student):
    for name, shapes, params in RULE_CASES:
        arrays = [RNG.uniform(0.5, 2.0, shape).astype(np.float32) for shape in shapes]
        fn, out = _op(student, name, arrays, **params)
        what = _describe(name, arrays, None, params) + " in float32"
        assert np.asarray(out).dtype == np.float32, f"{what}: expected a float32 result, got {np.asarray(out).dtype}"
        if name == "Sigmoid":
            continue  # its backward is given
        for i, grad in enumerate(fn.backward(np.ones_like(out))):
            dtype = getattr(grad, "dtype", type(grad).__name__)
            assert dtype == np.float32, f"{what}: expected a float32 gradient for input {i}, got {dtype}"


@check(points=3, hint="backward: pop the newest operation (heap keyed by -sequence), call its backward, add each share "
                      "into a leaf's .grad or its creator's pending gradient; free each operation unless retain_graph")
def test_engine(student):
    x = tt.tensor(3.0, requires_grad=True)
    y = tt.tensor(4.0, requires_grad=True)
    student.backward(x * y + x)
    expect_close((x.grad.item(), y.grad.item()), (5.0, 3.0), "(x.grad, y.grad) of x*y + x at x=3, y=4")
    # a diamond: both paths must arrive before the shared node passes its gradient on
    a = tt.tensor([1.0, 2.0], requires_grad=True)
    shared = a * a
    student.backward(((shared * 3) + shared.exp()).sum())
    expected = 6 * np.array([1.0, 2.0]) + 2 * np.array([1.0, 2.0]) * np.exp([1.0, 4.0])
    expect_close(a.grad.numpy(), expected, "a.grad of sum(3 a^2 + exp(a^2)) at a=[1, 2] (a diamond)", rtol=1e-6)
    # branches of different lengths: a first-in-first-out queue reaches a*a before exp(0.1 a^2) has delivered
    a = tt.tensor([1.0, 2.0], requires_grad=True)
    shared = a * a
    what = "a.grad of sum(exp(0.1 a^2) + a^2) at a=[1, 2] (a diamond whose branches have 3 and 1 operations)"
    try:
        student.backward(((shared * 0.1).exp() + shared).sum())
    except RuntimeError as error:
        raise AssertionError(f"{what}: expected a gradient, got RuntimeError: {error} (a^2 ran before the longer "
                             "branch delivered its share: always take the newest pending operation)") from None
    expected = 2 * np.array([1.0, 2.0]) * (0.1 * np.exp(0.1 * np.array([1.0, 4.0])) + 1)
    expect_close(a.grad.numpy(), expected, what, rtol=1e-6)
    # a long chain: no recursion
    chain = x
    for _ in range(5_000):
        chain = chain * 1.0
    student.backward(chain)
    expect_close(x.grad.item(), 6.0, "x.grad after a second backward (a 5,000-op chain): gradients accumulate, 5 + 1")
    # inputs that need no gradient, mixed with ones that do
    w = tt.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    images = tt.tensor([[1.0, -1.0], [0.5, 2.0]])
    student.backward((images @ w).sum())
    expect_close(w.grad.numpy(), np.array([[1.5, 1.5], [1.0, 1.0]]), "w.grad of sum(images @ w)")
    assert images.grad is None, f"an input that does not require grad gets no .grad: expected None, got {images.grad}"
    # Add hands one array to both inputs: adding into u's pending gradient in place would change w's share too
    x, w = tt.tensor(1.0, requires_grad=True), tt.tensor(1.0, requires_grad=True)
    u = x * 2
    student.backward((u + w) + u)
    expect_close((x.grad.item(), w.grad.item()), (4.0, 1.0), "(x.grad, w.grad) of (u + w) + u with u = 2x at x = w "
                 "= 1 (sum a second share into a new array: the pending one may be shared)")


@check(points=1, hint="backward: a None from an operation's backward gives that input nothing (even if it requires "
                      "grad; if it was computed, its operation then gets no gradient and is skipped), and a backward "
                      "that returns no tuple raises TypeError naming the operation; keep the "
                      "heap and the collected gradients local to one call: a backward may call backward",
       after="test_engine")
def test_engine_none_gradients_and_nested_backward(student):
    class FirstOnly(InstalledFunction):
        def forward(self, a, b):
            return a + b

        def backward(self, grad):
            return grad, None  # b requires grad, but this operation gives it none

    a, b = tt.tensor([1.0, 2.0], requires_grad=True), tt.tensor([3.0, 4.0], requires_grad=True)
    student.backward(FirstOnly.apply(a, b).sum())
    expect_close(a.grad.numpy(), [1.0, 1.0], "a.grad of sum(FirstOnly(a, b))")
    assert b.grad is None, f"FirstOnly.backward returns None for b: expected b.grad None, got {b.grad}"

    # None for a computed input (checkpointing's, for an input that took no part): its operation gets nothing
    a, c = tt.tensor([1.0, 2.0], requires_grad=True), tt.tensor([3.0, 4.0], requires_grad=True)
    what = "backward of sum(FirstOnly(a, c * 2)), whose backward returns None for the computed input c * 2"
    try:
        student.backward(FirstOnly.apply(a, c * 2.0).sum())
    except Exception as error:  # noqa: BLE001 - the message says which call failed
        raise AssertionError(f"{what}: expected a.grad [1, 1] and c.grad None, got {type(error).__name__}: {error} "
                             "(no gradient reached c * 2's operation: it has nothing to pass on, so skip it)") from None
    expect_close(a.grad.numpy(), [1.0, 1.0], f"{what}: a.grad")
    assert c.grad is None, f"{what}: expected c.grad None (nothing reached it), got {c.grad}"

    class Both(InstalledFunction):
        def forward(self, a, b):
            return a + b

        def backward(self, grad):
            return grad, grad  # a gradient for the constant too, as Add's backward returns

    class Bare(InstalledFunction):
        def forward(self, a):
            return a * 2

        def backward(self, grad):
            return grad * 2  # a bare array, not (grad * 2,): zip would give the input its first row

    expect_raises(TypeError, lambda: student.backward(Bare.apply(tt.tensor([[1.0, 2.0]], requires_grad=True)).sum()),
                  "backward through an operation whose backward returns a bare array", mentions=("Bare", "tuple",
                                                                                             "ndarray"))

    class Listed(Bare):
        def backward(self, grad):
            return [grad * 2]  # a list holds one gradient per input, but it is not the tuple the rule asks for

    expect_raises(TypeError, lambda: student.backward(Listed.apply(tt.tensor([1.0, 2.0], requires_grad=True)).sum()),
                  "backward through an operation whose backward returns a list (anything but a tuple raises)",
                  mentions=("Listed", "tuple", "list"))

    p, constant = tt.tensor([1.0, 2.0], requires_grad=True), tt.tensor([5.0, 5.0])
    student.backward(Both.apply(p, constant).sum())
    assert constant.grad is None, f"an input that does not require grad gets nothing, whatever backward returned " \
                                  f"for it: expected its .grad None, got {constant.grad}"

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
    expect_close(x.grad.numpy(), expected, "x.grad through a nested backward", rtol=1e-6)
    assert y.grad is not None, "y never got its gradient: the nested backward cleared the outer backward's state"
    expect_close(y.grad.numpy(), [6.0, -2.0], "y.grad, the other branch, after a nested backward")


@check(points=1, hint="after backward the graph is freed unless retain_graph=True: reaching a freed operation (the "
                      "output's, or one a nested backward freed) raises the RuntimeError of _freed_graph_error",
       after="test_engine")
def test_engine_frees_graph(student):
    x = tt.tensor(2.0, requires_grad=True)
    loss = x * x
    student.backward(loss, retain_graph=True)
    student.backward(loss)
    expect_close(x.grad.item(), 8.0, "x.grad after two backward calls of x*x at x=2 (the first with retain_graph)")
    expect_raises(RuntimeError, lambda: student.backward(loss), "a third backward through the freed graph of x*x",
                  mentions=("second time",))
    kept = sorted(name for name, value in vars(loss._ctx).items()
                  if isinstance(value, np.ndarray) or isinstance(value, (tuple, list)) and value)
    expect_equal(kept, [], "the attributes of x*x's freed operation that still hold its saved arrays or its inputs "
                 "(freeing drops them all: vars(fn).clear())")
    y = x * 2
    student.backward(y.sum())
    expect_raises(RuntimeError, lambda: student.backward((y * 3).sum()), "y = x * 2; backward(y.sum()); then "
                  "backward((y * 3).sum()), a new graph that reaches y's freed operation", mentions=("second time",))

    class Peek(InstalledFunction):
        """The identity, whose backward runs a backward of its own through ``shared``, freeing h*h."""

        def forward(self, a):
            return a.copy()

        def backward(self, grad):
            student.backward((shared * 1.0).sum())
            return (grad,)

    h = tt.tensor([1.0, 2.0], requires_grad=True)
    shared = h * h
    loss = (Peek.apply(shared) + shared).sum()  # the outer backward still waits on h*h when Peek's backward frees it
    expect_raises(RuntimeError, lambda: student.backward(loss),
                  "backward of sum(Peek(h*h) + h*h), where Peek's own backward frees h*h before the outer one gets "
                  "to it", mentions=("second time",))
    z = tt.tensor([1.0, 2.0], requires_grad=True)
    out = z * 2
    student.backward(out, grad=tt.tensor([1.0, 10.0]))
    expect_close(z.grad.numpy(), [2.0, 20.0], "z.grad of z*2 with grad=[1, 10]")


@check(points=2, hint="backward sets fn.owns_grad before each fn.backward: `owned` for the output's operation, "
                      "_unshared(...) for the one gradient handed to an operation, True for a sum of several; a leaf "
                      "gets _accumulate(leaf, grad, unshared); with retain_graph nothing is unshared; a sum of shares "
                      "of two dtypes has NumPy's promoted dtype",
       after="test_engine")
def test_engine_owns_and_adopts(student):
    seen = []

    class Probe(InstalledFunction):
        """The identity; records whether the engine let it own its incoming gradient."""

        def forward(self, a):
            return a.copy()

        def backward(self, grad):
            seen.append(self.owns_grad)
            return (grad,)

    def twice(p):
        return (p + p).sum()

    cases = [  # (loss of x, what the engine hands Probe, backward's keywords, whether Probe owns it)
        (lambda x: Probe.apply(x.sum()), "the seed the engine made", {}, True),
        (lambda x: Probe.apply(x), "the grad= the caller passed", {"grad": tt.tensor([1.0, 1.0])}, False),
        (lambda x: Probe.apply(x).sum(), "the broadcast view from sum's backward", {}, False),
        (lambda x: (Probe.apply(x) * 3.0).sum(), "the new array grad*3 from Mul's backward", {}, True),
        (lambda x: twice(Probe.apply(x)), "the sum of the two shares of p + p", {}, True),
        (lambda x: (Probe.apply(x) * 3.0).sum(), "grad*3 from Mul's backward, with retain_graph=True",
         {"retain_graph": True}, False),
    ]
    for make_loss, handed, keywords, owns in cases:
        seen.clear()
        student.backward(make_loss(tt.tensor([1.0, 2.0], requires_grad=True)), **keywords)
        assert seen == [owns], f"Probe's owns_grad when it gets {handed}: expected {[owns]}, got {seen}"

    class Widens(InstalledFunction):
        """The identity; its backward hands on a float64 gradient."""

        def forward(self, a):
            return a.copy()

        def backward(self, grad):
            return (grad.astype(np.float64),)

    received = []

    class Receives(InstalledFunction):
        def forward(self, a):
            return a.copy()

        def backward(self, grad):
            received.append(grad.dtype)
            return (grad,)

    r = Receives.apply(tt.tensor([1.0, 2.0], dtype="float32", requires_grad=True))
    student.backward((Widens.apply(r) + r * 2.0).sum())  # r's shares: float32 from Mul, then float64 from Widens
    assert received == [np.float64], ("the gradient summed from a float32 and a float64 share: expected float64 "
                                      f"(pending + share, as NumPy promotes; never += into the float32 one), got "
                                      f"{[str(d) for d in received]}")

    returned = []

    class Twice(InstalledFunction):
        def forward(self, a):
            return 2 * a

        def backward(self, grad):
            returned.append(grad * 2)  # a new array that nobody else holds
            return (returned[-1],)

    x = tt.tensor([1.0, 2.0], requires_grad=True)
    student.backward(Twice.apply(x).sum())
    expect_close(x.grad.numpy(), [2.0, 2.0], "x.grad of sum(Twice(x))")
    assert x.grad.data is returned[0], ("x.grad keeps the new array Twice.backward returned (no copy): expected "
                                        "x.grad.data to be that array, got a copy")

    a, b = tt.tensor([1.0, 2.0], requires_grad=True), tt.tensor([3.0, 4.0], requires_grad=True)
    student.backward(((a + b) * 2.0).sum())  # Add hands the same array to a and b: each leaf needs its own copy
    student.backward((a * 1.0).sum())
    expect_close((a.grad.numpy(), b.grad.numpy()), ([3.0, 3.0], [2.0, 2.0]),
                 "(a.grad, b.grad) after backward of sum((a + b) * 2), then of sum(a * 1)")

    class Triple(InstalledFunction):
        """3 * a.sum(); when grad is 1 its backward skips the multiply and hands out the slope it saved."""

        def forward(self, a):
            self.slope = self.xp.full(a.shape, 3.0, dtype=a.dtype)
            return 3 * a.sum()

        def backward(self, grad):
            return (self.slope if float(grad) == 1.0 else self.slope * grad,)

    x = tt.tensor([1.0, 2.0], requires_grad=True)
    y = Triple.apply(x)
    for _ in range(3):
        student.backward(y, retain_graph=True)
    expect_close(x.grad.numpy(), [9.0, 9.0],
                 "x.grad after three backward(retain_graph=True) of Triple(x), whose backward returns its saved slope")


@check(points=2, hint="gradcheck: perturb each element by +-eps, take (f+ - f-)/(2 eps) of the projected output, "
                      "restore it; raise GradcheckError with the worst mismatch, else return True")
def test_gradcheck(student):
    for device in ("cpu", "strict"):
        x = tt.tensor(RNG.standard_normal((2, 3)), dtype="float64", device=device, requires_grad=True)
        w = tt.tensor(RNG.standard_normal((3, 2)), dtype="float64", device=device, requires_grad=True)
        before = x.numpy().copy()
        result = student.gradcheck(lambda a, b: (a @ b).tanh(), [x, w])
        assert result is True, f"gradcheck of tanh(a @ b) on {device!r}: expected True, got {result!r}"
        expect_equal(x.numpy(), before, f"the input's values after gradcheck on {device!r} (put back)")

    unused = tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    result = student.gradcheck(lambda a, b: a * 2.0, [tt.tensor([1.0], dtype="float64", requires_grad=True), unused])
    assert result is True, (f"gradcheck of f(a, b) = 2a (b gets no gradient, which is right: 0): expected True, "
                            f"got {result!r}")

    class WrongSquare(InstalledFunction):
        def forward(self, a):
            self.a = a
            return a * a

        def backward(self, grad):
            return (grad * self.a,)  # should be 2 * a

    for values in ([1.0, -2.0, 3.0], [0.01, -0.02, 0.03]):
        error = expect_raises(AssertionError, lambda: student.gradcheck(
            WrongSquare.apply, [tt.tensor(values, dtype="float64", requires_grad=True)]),
            f"gradcheck of a wrong rule for a*a at {values}")
        assert isinstance(error, student.GradcheckError), (
            f"expected a GradcheckError, got {type(error).__name__}: {error}")

    class FirstOnly(InstalledFunction):
        def forward(self, a, b):
            return a + b

        def backward(self, grad):
            return grad, None  # wrong: b's gradient is 1, and a missing .grad counts as 0

    pair = [tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True) for _ in range(2)]
    expect_raises(AssertionError, lambda: student.gradcheck(FirstOnly.apply, pair),
                  "gradcheck of a + b whose backward gives b no gradient (its .grad stays None: analytic 0, numeric 1)")
    steep = tt.tensor([0.0], dtype="float64", requires_grad=True)
    result = student.gradcheck(lambda a: a * a * 1e5, [steep])
    assert result is True, (f"gradcheck of the correct rule of 1e5 * a^2 at a = 0: expected True, got {result!r} "
                            "(central differences give 0 there; a one-sided (f(a + eps) - f(a)) / eps gives 0.1)")


@check(points=1, hint="gradcheck: an element passes when |analytic - numeric| <= atol + rtol*|numeric|; the error "
                      "names the worst element: its input's position, its index as a tuple and both values",
       after="test_gradcheck")
def test_gradcheck_reports_the_worst_element(student):
    slope = np.array([[1.0, 2.0], [2.0, 1.0]])
    wrong = np.array([[1.0, 2.05], [2.5, 1.0]])  # off by 2.5% at (0, 1) and by 25% at (1, 0)

    class Weighted(InstalledFunction):
        """sum(a) + sum(slope * b), whose backward has the wrong slope for b."""

        def forward(self, a, b):
            return a.sum() + (slope * b).sum()

        def backward(self, grad):
            return grad * np.ones(3), grad * wrong

    a = tt.tensor([1.0, 2.0, 3.0], dtype="float64", requires_grad=True)
    b = tt.tensor([[0.5, -1.0], [1.5, 2.0]], dtype="float64", requires_grad=True)
    error = expect_raises(AssertionError, lambda: student.gradcheck(Weighted.apply, [a, b]),
                          "gradcheck of a rule that is wrong for input 1 at (0, 1) and (1, 0)",
                          mentions=("input 1", "(1, 0)"))
    weight = float(np.random.default_rng(0).standard_normal(()))  # gradcheck's projection of a 0-d output
    numbers = [float(text) for text in re.findall(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?", str(error))]
    for value, meaning in ((2.5 * weight, "autograd's value"), (2.0 * weight, "the central difference")):
        assert any(np.isclose(number, value, rtol=1e-4, atol=0) for number in numbers), (
            f"the GradcheckError names the worst element's values: expected {meaning} {value:.6g} in its message, "
            f"got {str(error)!r}")

    class AtTolerance(InstalledFunction):
        """The zero function, whose backward is off by exactly atol = 1e-5: just inside the tolerance."""

        def forward(self, a):
            return a * 0.0

        def backward(self, grad):
            return (self.xp.full(grad.shape, 1e-5),)

    class NotANumber(InstalledFunction):
        """The zero function, whose backward gives nan: |nan - 0| <= tolerance is False, so it must fail."""

        def forward(self, a):
            return a * 0.0

        def backward(self, grad):
            return (self.xp.full(grad.shape, np.nan),)

    expect_raises(AssertionError, lambda: student.gradcheck(NotANumber.apply, [
        tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)]), "gradcheck of a rule whose gradient is nan",
        mentions=("nan",))
    result = student.gradcheck(AtTolerance.apply, [tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)])
    assert result is True, (f"gradcheck with |analytic - numeric| == atol exactly (0 + atol >= 1e-5): expected True, "
                            f"got {result!r}")

    class BothWrong(InstalledFunction):
        """sum(a) + sum(b), whose backward is off by 1% for a and by 100% for b."""

        def forward(self, a, b):
            return a.sum() + b.sum()

        def backward(self, grad):
            return grad * self.xp.full(2, 1.01), grad * self.xp.full(2, 2.0)

    pair = [tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True) for _ in range(2)]
    expect_raises(AssertionError, lambda: student.gradcheck(BothWrong.apply, pair),
                  "gradcheck of a rule off by 1% for input 0 and by 100% for input 1 (the worst over all inputs)",
                  mentions=("input 1",))

    class SteepAndFlat(InstalledFunction):
        """1000 a[0] + a[1], whose backward says 1001.5 and 2: (times gradcheck's projection weight w) off by 1.5 w
        where the tolerance is 1e-5 + w, by w where it is 1e-5 + 0.001 w. The worst element is the largest excess
        over its tolerance (index 1), not the largest difference (index 0)."""

        def forward(self, a):
            return (a * self.xp.array([1000.0, 1.0])).sum()

        def backward(self, grad):
            return (grad * self.xp.array([1001.5, 2.0]),)

    error = expect_raises(AssertionError, lambda: student.gradcheck(SteepAndFlat.apply, [
        tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)]),
        "gradcheck of 1000 a0 + a1 with the slopes 1001.5 and 2 (the largest difference is at (0,), the largest "
        "excess over its tolerance at (1,))",
        mentions=("(1,)",))
    assert "(0,)" not in str(error), (f"the GradcheckError names the largest excess over the tolerance, at index "
                                      f"(1,), not the largest difference, at (0,): got {str(error)!r}")

    class JustOutside(InstalledFunction):
        """1000 a, whose backward says 1001.001: |analytic - numeric| = 1.001 > atol + rtol * |numeric| = 1.00001."""

        def forward(self, a):
            return a * 1000.0

        def backward(self, grad):
            return (grad * 1001.001,)

    expect_raises(AssertionError, lambda: student.gradcheck(JustOutside.apply, [tt.tensor([1.0], dtype="float64",
                                                                                           requires_grad=True)]),
                  "gradcheck of 1000 a with the slope 1001.001 (rtol multiplies |numeric| = 1000, not |analytic|)")
