"""Graded checks for Module 06 (losses), run against the student's own code.

Every name of this module comes from the ``student`` fixture (the student's
notebook when grading, the reference in the normal test suite); the rest of
tinytrain (tensors, autograd, softmax) comes from the package. Expected values
are computed independently, in float64 NumPy.
"""
import numpy as np

import tinytrain as tt
from tinytrain.autograd import Function
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck, expect_raises


# -- NumPy references (float64) -----------------------------------------------------------

def reduce(values, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](values)


def np_log_softmax(z):
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def np_softmax(z):
    return np.exp(np_log_softmax(z))


def np_sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


def logits_and_labels(seed=0, n=5, classes=4):
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((n, classes)) * 2).astype(np.float32)
    y = rng.integers(0, classes, n)
    y[:classes] = np.arange(classes)  # every class appears
    return z, y


def leaf(array, dtype=None):
    return tt.tensor(array, dtype=dtype, requires_grad=True)


class _GradientSpy(Function):
    """The identity, recording the dtype of the gradient that reaches it: what the loss hands its input."""

    seen: list = []

    def forward(self, a):
        return a.copy()

    def backward(self, grad):
        _GradientSpy.seen.append(grad.dtype)
        return (grad,)


def _expect_float32_gradient(loss_of, x, what):
    """``loss_of(input)`` of float32 ``x`` sends float32 gradients back, for every reduction.

    A leaf's ``.grad`` is cast to the leaf's dtype, so only a node between them sees a float64
    gradient -- which would make every layer below the loss run its backward in float64.
    """
    for reduction in ("mean", "sum", "none"):
        _GradientSpy.seen = []
        loss = loss_of(_GradientSpy.apply(leaf(x)), reduction)
        loss.backward(None if reduction != "none" else tt.ones(*loss.shape))
        expect_equal(_GradientSpy.seen, [np.dtype(np.float32)], f"the dtype of the gradient that {what}, "
                     f"reduction={reduction!r}, hands its float32 input (keep the dtype: a one-hot from xp.eye "
                     "or xp.zeros without dtype=, or a count from np.prod, makes it float64)")


# -- mean squared error -------------------------------------------------------------------

@check(points=2, hint="mse_loss: square the difference pred - target and reduce it; 'mean' divides by the number "
                      "of elements, so the gradient is 2 * (pred - target) / N; the loss has pred's dtype (cast the "
                      "target)")
def test_mse_loss_values_and_gradient(student):
    rng = np.random.default_rng(1)
    p, t = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    for reduction in ("mean", "sum", "none"):
        pred = leaf(p)
        loss = student.mse_loss(pred, tt.tensor(t), reduction=reduction)
        expected = reduce((p.astype(np.float64) - t) ** 2, reduction)
        expect_close(loss, expected, f"mse_loss of a (4, 3) batch, reduction={reduction!r}", rtol=1e-5, atol=1e-6)
        loss.sum().backward()
        scale = 2 / p.size if reduction == "mean" else 2
        expect_close(pred.grad, scale * (p - t), f"the gradient of mse_loss, reduction={reduction!r}",
                     rtol=1e-5, atol=1e-6)
    expect_equal(student.mse_loss(tt.tensor([1.0, 2.0]), [1.0, 2.0]).item(), 0.0, "mse_loss of equal values")
    expect_equal(student.mse_loss(tt.tensor([2.5, 0.0, 2.0]), np.array([3.0, -0.5, 2.0])).dtype, np.dtype(np.float32),
                 "the dtype of mse_loss of a float32 prediction against a float64 array")
    _expect_the_inputs_dtype(student.mse_loss, p)


# -- cross-entropy ----------------------------------------------------------------------

@check(points=2, hint="cross_entropy: per sample, log(sum_j exp(z_j - m)) - (z_y - m) with m the row's max; "
                      "then reduce ('mean' over samples, 'sum', or 'none' for one loss per sample)")
def test_cross_entropy_values(student):
    z, y = logits_and_labels()
    expected = -np_log_softmax(z.astype(np.float64))[np.arange(len(y)), y]
    for reduction in ("mean", "sum", "none"):
        loss = student.cross_entropy(tt.tensor(z), tt.tensor(y), reduction=reduction)
        expect_close(loss, reduce(expected, reduction), f"cross_entropy of (5, 4) float32 logits, "
                     f"reduction={reduction!r}", rtol=1e-5, atol=1e-6, dtype="float32")
    module = student.CrossEntropyLoss()
    logits = tt.tensor(z)
    expect_close(module(logits, tt.tensor(y)).item(), expected.mean(), "CrossEntropyLoss()(logits, labels)",
                 rtol=1e-5)
    expect_equal(logits, z, "the logits after cross_entropy(logits, labels) (forward must leave its input as it was)")


@check(points=2, hint="CrossEntropy.backward: the gradient is (softmax(logits) - one_hot(target)) times each "
                      "sample's share g of the upstream gradient (g = grad / N for 'mean', grad for 'sum', "
                      "grad[i] for 'none'), in the logits' dtype")
def test_cross_entropy_gradient(student):
    z, y = logits_and_labels(seed=2, n=6, classes=3)
    p, onehot = np_softmax(z.astype(np.float64)), np.eye(3)[y]
    for reduction, scale in (("mean", 1 / len(y)), ("sum", 1.0)):
        logits = leaf(z)
        student.cross_entropy(logits, tt.tensor(y), reduction=reduction).backward()
        expect_close(logits.grad, (p - onehot) * scale, f"the gradient of cross_entropy, reduction={reduction!r}",
                     atol=1e-6)
    for reduction, scale in (("mean", 3 / len(y)), ("sum", 3.0)):
        logits = leaf(z)
        (student.cross_entropy(logits, tt.tensor(y), reduction=reduction) * 3.0).backward()
        expect_close(logits.grad, (p - onehot) * scale, f"the gradient of 3 * cross_entropy(reduction={reduction!r}) "
                     "(the upstream gradient is 3)", atol=1e-6)
    upstream = np.arange(1.0, 7.0, dtype=np.float32)  # a different weight per sample
    logits = leaf(z)
    student.cross_entropy(logits, tt.tensor(y), reduction="none").backward(tt.tensor(upstream))
    expect_close(logits.grad, (p - onehot) * upstream[:, None],
                 "the gradient of cross_entropy(reduction='none') with upstream [1, 2, ..., 6]", atol=1e-5)
    expect_gradcheck(lambda x: student.cross_entropy(x, tt.tensor(y), reduction="mean"), [leaf(z, dtype="float64")],
                     "gradcheck of cross_entropy in float64")
    logits = leaf(z)
    loss = student.cross_entropy(logits, tt.tensor(y))
    loss.backward(retain_graph=True)
    loss.backward()
    expect_close(logits.grad, 2 * (p - onehot) / len(y), "the gradient of cross_entropy after two backward passes "
                 "through one graph (retain_graph=True): backward must leave the saved probabilities unchanged",
                 atol=1e-6)
    _expect_float32_gradient(lambda x, reduction: student.cross_entropy(x, tt.tensor(y), reduction=reduction), z,
                             "cross_entropy")
    _expect_float32_gradient(lambda x, reduction: student.cross_entropy(x, tt.tensor(p), reduction=reduction), z,
                             "cross_entropy with probability targets")


@check(points=2, hint="subtract each row's maximum before exp (log-sum-exp): exp(1000) overflows to inf, and "
                      "log(softmax) of a tiny probability is -inf")
def test_cross_entropy_stable_for_large_logits(student):
    z = np.array([[1000.0, 0.0, -1000.0], [0.0, -1000.0, 1000.0], [-120.0, 0.0, 0.0]], dtype=np.float32)
    y = np.array([0, 0, 0])
    logits = leaf(z)
    with np.errstate(all="ignore"):  # a naive version gives inf or nan: the values below catch it
        losses = student.cross_entropy(logits, tt.tensor(y), reduction="none")
        losses.sum().backward()
    expect_close(losses, np.array([0.0, 1000.0, 120.0 + np.log(2)]), "cross_entropy of logits +-1000 and -120",
                 rtol=1e-6)
    expect_close(logits.grad, np_softmax(z.astype(np.float64)) - np.eye(3)[y],
                 "the gradient of cross_entropy of logits +-1000 and -120", atol=1e-6)


@check(points=1, hint="probability targets q of shape (N, C): the loss is log-sum-exp * sum(q) - sum_c q_c (z_c - m) "
                      "per sample (q's rows need not sum to 1) and its gradient (p * sum(q) - q) * g; tell the two kinds "
                      "of target apart by target.ndim")
def test_cross_entropy_probability_targets(student):
    z, _ = logits_and_labels(seed=3, n=4, classes=3)
    q = np.array([[1.0, 0.0, 0.0], [0.2, 0.5, 0.3], [0.0, 0.0, 1.0], [0.5, 0.5, 0.0]], dtype=np.float32)
    logits = leaf(z)
    loss = student.cross_entropy(logits, tt.tensor(q))
    logp = np_log_softmax(z.astype(np.float64))
    expect_close(loss.item(), -(q * logp).sum(axis=1).mean(), "cross_entropy with probability targets", rtol=1e-5)
    loss.backward()
    expect_close(logits.grad, (np.exp(logp) - q) / 4, "the gradient of cross_entropy with probability targets",
                 atol=1e-6)
    expect_gradcheck(lambda x: student.cross_entropy(x, tt.tensor(q, dtype="float64"), reduction="sum"),
                     [leaf(z, dtype="float64")], "gradcheck of cross_entropy with probability targets")
    # rows that do not sum to 1 (weighted or partial targets): the sum of q multiplies the log-sum-exp term
    unnormalised = np.array([[0.5, 0.0, 0.0], [0.4, 1.0, 0.6], [0.0, 0.0, 2.0], [0.1, 0.1, 0.0]], dtype=np.float32)
    logits = leaf(z)
    losses = student.cross_entropy(logits, tt.tensor(unnormalised), reduction="none")
    expect_close(losses, -(unnormalised * logp).sum(axis=1),
                 "cross_entropy(reduction='none') with target rows summing to 0.5, 2, 2 and 0.2", rtol=1e-5, atol=1e-6)
    upstream = np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)
    losses.backward(tt.tensor(upstream))
    expected = (np.exp(logp) * unnormalised.sum(axis=1, keepdims=True) - unnormalised) * upstream[:, None]
    expect_close(logits.grad, expected, "the gradient of cross_entropy(reduction='none') with target rows summing to "
                 "0.5, 2, 2 and 0.2 and upstream [1, -2, 0.5, 3]", atol=1e-5)


@check(points=1, hint="class indices of any integer dtype must work (index with them as they are); a float "
                      "target of shape (N,) is refused with a TypeError that asks for integers")
def test_cross_entropy_targets_integer_dtypes_and_float_labels_refused(student):
    z, y = logits_and_labels(seed=4, n=4, classes=4)
    expected = -np_log_softmax(z.astype(np.float64))[np.arange(4), y].mean()
    for dtype in (np.int64, np.int32, np.uint8):
        loss = student.cross_entropy(tt.tensor(z), tt.tensor(y.astype(dtype)))
        expect_close(loss.item(), expected, f"cross_entropy with {np.dtype(dtype)} class indices", rtol=1e-5)
    expect_raises(TypeError, lambda: student.cross_entropy(tt.tensor(z), tt.tensor(y.astype(np.float32))),
                  "cross_entropy with a float32 target of shape (4,)", mentions=("integer",))
    expect_raises(ValueError, lambda: student.cross_entropy(tt.tensor(z), tt.tensor([0, 1, 2, 4])),
                  "cross_entropy with class index 4 for 4 classes", mentions=("4",))


# -- binary cross-entropy -----------------------------------------------------------------

@check(points=2, hint="binary_cross_entropy: -(t log p + (1 - t) log(1 - p)) with each log clamped at -100 (so "
                      "p = 0 or 1 costs at most 100); gradient (p - t) / max(p (1 - p), 1e-12), divided by the number of "
                      "elements for 'mean', in probs' dtype")
def test_binary_cross_entropy_on_probabilities(student):
    p = np.array([[0.1, 0.5], [0.9, 0.99]], dtype=np.float32)
    t = np.array([[0.0, 1.0], [1.0, 0.3]], dtype=np.float32)
    p64 = p.astype(np.float64)
    expected = -(t * np.log(p64) + (1 - t) * np.log(1 - p64))
    for reduction in ("mean", "sum", "none"):
        probs = leaf(p)
        loss = student.binary_cross_entropy(probs, tt.tensor(t), reduction=reduction)
        expect_close(loss, reduce(expected, reduction), f"binary_cross_entropy, reduction={reduction!r}", rtol=1e-5)
        loss.sum().backward()
        scale = 1 / p.size if reduction == "mean" else 1
        expect_close(probs.grad, (p64 - t) / (p64 * (1 - p64)) * scale,
                     f"the gradient of binary_cross_entropy, reduction={reduction!r}", rtol=1e-4)
    edges = leaf(np.array([0.0, 1.0, 0.0, 1.0], dtype=np.float32))
    try:
        with np.errstate(divide="raise", invalid="raise"):
            clamped = student.binary_cross_entropy(edges, [1.0, 0.0, 0.0, 1.0], reduction="none")
            clamped.sum().backward()
    except FloatingPointError as error:
        raise AssertionError(f"binary_cross_entropy of p = [0, 1, 0, 1] and its gradient: expected no log(0) and no "
                             f"0/0, got FloatingPointError: {error} (take the log of max(p, the smallest subnormal))") \
            from None
    expect_close(clamped, np.array([100.0, 100.0, 0.0, 0.0]),
                 "binary_cross_entropy of p = [0, 1, 0, 1] against t = [1, 0, 0, 1] (logs clamped at -100)")
    assert np.isfinite(edges.grad.numpy()).all(), \
        f"the gradient of binary_cross_entropy at p = 0 and 1: expected finite values, got {edges.grad.numpy()}"
    expect_close(edges, np.array([0.0, 1.0, 0.0, 1.0]), "p = [0, 1, 0, 1] after binary_cross_entropy of it and its "
                 "backward (forward leaves its input as it is: max(p, tiny) is a new array)", rtol=0, atol=0)
    sure = leaf(np.array([1e-12]), dtype="float64")
    student.binary_cross_entropy(sure, tt.tensor([1.0], dtype="float64"), reduction="sum").backward()
    expect_close(sure.grad, np.array([-(1 - 1e-12) / 1e-12]), "the gradient of binary_cross_entropy at p = 1e-12, "
                 "t = 1 in float64: (p - t) / max(p (1 - p), 1e-12), the max -- not p (1 - p) + 1e-12, which halves it",
                 rtol=1e-6)
    expect_close(student.BCELoss(reduction="sum")(tt.tensor(p), t).item(), expected.sum(), "BCELoss(reduction='sum')",
                 rtol=1e-5)
    probs = leaf(p)
    upstream = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=np.float32)
    student.binary_cross_entropy(probs, tt.tensor(t), reduction="none").backward(tt.tensor(upstream))
    expect_close(probs.grad, (p64 - t) / (p64 * (1 - p64)) * upstream, "the gradient of "
                 "binary_cross_entropy(reduction='none') with a different upstream per element", rtol=1e-4)
    for reduction, scale in (("mean", 3 / p.size), ("sum", 3.0)):
        probs = leaf(p)
        (student.binary_cross_entropy(probs, tt.tensor(t), reduction=reduction) * 3.0).backward()
        expect_close(probs.grad, (p64 - t) / (p64 * (1 - p64)) * scale, f"the gradient of 3 * "
                     f"binary_cross_entropy(reduction={reduction!r}) (the upstream gradient is 3)", rtol=1e-4)
    _expect_twice_the_gradient(student.binary_cross_entropy, p, t, (p64 - t) / (p64 * (1 - p64)) / p.size, rtol=1e-4)
    _expect_the_inputs_dtype(student.binary_cross_entropy, p)


def _expect_twice_the_gradient(loss_fn, x, t, gradient, rtol):
    """Two backward passes through one graph (retain_graph) give twice ``gradient``: backward left the saved arrays."""
    inputs = leaf(x)
    loss = loss_fn(inputs, tt.tensor(t))
    loss.backward(retain_graph=True)
    loss.backward()
    expect_close(inputs.grad, 2 * gradient, f"the gradient of {loss_fn.__name__} after two backward passes through "
                 "one graph (retain_graph=True): backward must leave what forward saved unchanged", rtol=rtol, atol=1e-7)


def _expect_the_inputs_dtype(loss_fn, x):
    """A float32 input gives a float32 loss, whatever the target's dtype, and a float32 gradient."""
    for target in (tt.tensor((x > 0.5).astype(np.int64)), tt.tensor(np.zeros(x.shape), dtype="float64")):
        loss = loss_fn(tt.tensor(x), target)
        expect_equal(loss.dtype, np.dtype(np.float32), f"the dtype of {loss_fn.__name__} of float32 input and a target "
                     f"of dtype {target.dtype} (cast the target to the input's dtype)")
    t = (x > 0.5).astype(np.float32)
    _expect_float32_gradient(lambda v, reduction: loss_fn(v, tt.tensor(t), reduction=reduction), x, loss_fn.__name__)


def np_bce_with_logits(x, t):
    """The per-element loss, in float64: -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x)))."""
    return np.logaddexp(0.0, -x) + (1 - t) * x


@check(points=2, hint="binary_cross_entropy_with_logits: max(x, 0) - x t + log1p(exp(-|x|)), then reduce; backward "
                      "(sigmoid(x) - t) * g with the stable sigmoid where(x >= 0, 1, e) / (1 + e), e = exp(-|x|), and "
                      "g = grad / N for 'mean', in the logits' dtype")
def test_binary_cross_entropy_with_logits(student):
    x = np.array([[-3.0, -0.5, 0.0], [0.25, 2.0, 7.5]], dtype=np.float32)
    t = np.array([[0.0, 1.0, 0.3], [1.0, 0.0, 0.7]], dtype=np.float32)
    x64 = x.astype(np.float64)
    expected = np_bce_with_logits(x64, t)
    slope = 1 / (1 + np.exp(-x64)) - t
    for reduction in ("mean", "sum", "none"):
        logits = leaf(x)
        loss = student.binary_cross_entropy_with_logits(logits, tt.tensor(t), reduction=reduction)
        expect_close(loss, reduce(expected, reduction),
                     f"binary_cross_entropy_with_logits of x = {x.tolist()}, reduction={reduction!r}", rtol=1e-5)
        loss.sum().backward()
        scale = 1 / x.size if reduction == "mean" else 1
        expect_close(logits.grad, slope * scale,
                     f"the gradient of binary_cross_entropy_with_logits, reduction={reduction!r}", rtol=1e-5, atol=1e-7)
    logits = leaf(x)
    upstream = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]], dtype=np.float32)
    student.binary_cross_entropy_with_logits(logits, tt.tensor(t), reduction="none").backward(tt.tensor(upstream))
    expect_close(logits.grad, slope * upstream,
                 "the gradient of binary_cross_entropy_with_logits(reduction='none') with a different upstream per "
                 "element", rtol=1e-5, atol=1e-7)
    for reduction, scale in (("mean", 3 / x.size), ("sum", 3.0)):
        logits = leaf(x)
        (student.binary_cross_entropy_with_logits(logits, tt.tensor(t), reduction=reduction) * 3.0).backward()
        expect_close(logits.grad, slope * scale, f"the gradient of 3 * binary_cross_entropy_with_logits("
                     f"reduction={reduction!r}) (the upstream gradient is 3)", rtol=1e-5, atol=1e-7)
    _expect_twice_the_gradient(student.binary_cross_entropy_with_logits, x, t, slope / x.size, rtol=1e-5)
    _expect_the_inputs_dtype(student.binary_cross_entropy_with_logits, x)
    confident = student.binary_cross_entropy_with_logits(tt.tensor([20.0, -20.0]), [1.0, 0.0], reduction="none")
    expect_close(confident, np.log1p(np.exp(-20.0)) * np.ones(2), "binary_cross_entropy_with_logits of x = [20, -20], "
                 "t = [1, 0] in float32 (log1p(e) keeps the tiny loss that log(1 + e) rounds to 0)", rtol=1e-5, atol=0)
    extreme = leaf(np.array([-1000.0, 1000.0, -1000.0, 1000.0], dtype=np.float32))
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):  # exp(1000) overflows in a naive version
            losses = student.binary_cross_entropy_with_logits(extreme, [1.0, 0.0, 0.0, 1.0], reduction="none")
            losses.sum().backward()
    except FloatingPointError as error:
        raise AssertionError(f"binary_cross_entropy_with_logits of x = [-1000, 1000, -1000, 1000] and its gradient: "
                             f"expected no overflow, got FloatingPointError: {error} (compute the loss and the "
                             "sigmoid from exp(-|x|))") from None
    expect_close(losses, np.array([1000.0, 1000.0, 0.0, 0.0], dtype=np.float32),
                 "binary_cross_entropy_with_logits of x = [-1000, 1000, -1000, 1000], t = [1, 0, 0, 1]")
    expect_close(extreme.grad, np.array([-1.0, 1.0, 0.0, 0.0], dtype=np.float32),
                 "its gradient (sigmoid(x) - t)")
    negative = leaf(np.array([-90.0, -20.0], dtype=np.float32))
    student.binary_cross_entropy_with_logits(negative, [0.0, 0.0], reduction="sum").backward()
    expect_close(negative.grad, 1 / (1 + np.exp(np.array([90.0, 20.0]))), "the gradient of "
                 "binary_cross_entropy_with_logits at x = [-90, -20], t = 0 in float32: sigmoid(x) itself, tiny but "
                 "not 0 (e / (1 + e) for x < 0; 1 / (1 + exp(-x)) overflows and 1 - sigmoid(|x|) rounds to 0)",
                 rtol=1e-5, atol=0)
    expect_gradcheck(lambda v: student.binary_cross_entropy_with_logits(v, tt.tensor(t, dtype="float64")),
                     [leaf(x, dtype="float64")], "gradcheck of binary_cross_entropy_with_logits in float64")
    expect_close(student.BCEWithLogitsLoss(reduction="sum")(tt.tensor(x), t).item(), expected.sum(),
                 "BCEWithLogitsLoss(reduction='sum')", rtol=1e-5)


@check(points=1, after=("test_cross_entropy_gradient", "test_binary_cross_entropy_on_probabilities",
                        "test_binary_cross_entropy_with_logits", "test_mse_loss_values_and_gradient"),
       hint="compute on the logits' device: self.xp in forward and backward (xp.arange, xp.exp), never np; "
                      "a loss on a GPU must not come back through the host")
def test_losses_run_on_another_device(student):
    z, y = logits_and_labels(seed=6)
    p = np.array([0.2, 0.9, 0.5], dtype=np.float32)
    results = {}
    for device in ("cpu", "strict"):
        logits, probs = tt.tensor(z, device=device, requires_grad=True), tt.tensor(p, device=device, requires_grad=True)
        x = tt.tensor(p - 0.5, device=device, requires_grad=True)
        t = tt.tensor([1.0, 0.0, 1.0], device=device)
        try:
            losses = [student.cross_entropy(logits, tt.tensor(y, device=device)),
                      student.cross_entropy(logits, tt.tensor(np_softmax(z), device=device), reduction="sum"),
                      student.binary_cross_entropy(probs, t), student.binary_cross_entropy_with_logits(x, t),
                      student.mse_loss(probs, t, reduction="sum")]
            sum(losses[1:], losses[0]).backward()
        except TypeError as error:
            raise AssertionError(f"the losses on the {device!r} device: {error}") from None
        results[device] = [loss.numpy() for loss in losses] + [logits.grad.numpy(), probs.grad.numpy(), x.grad.numpy()]
    names = ("cross_entropy", "cross_entropy with probabilities", "binary_cross_entropy",
             "binary_cross_entropy_with_logits", "mse_loss", "the logits' gradient", "the probabilities' gradient",
             "the gradient of the BCE logits")
    for name, cpu, strict in zip(names, *results.values()):
        expect_close(strict, cpu, f"{name} on the strict device (against the cpu's)", rtol=1e-5, atol=1e-7)
