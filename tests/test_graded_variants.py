"""Graded checks on students' variants: a correct alternative passes, a plausible wrong one fails.

The variants are what independent students write from the lessons alone: wrong
code a graded check must not let through, and correct code that does something
another way than the reference, which the check must grade by the lesson's rule.
Each test runs the check on a variant directly, with a ``student`` namespace as the grader's fixture would
pass it, so each takes well under a second: a correct variant must pass; a wrong
one must fail, saying what it expected and what it got.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import types
from pathlib import Path

import numpy as np
import pytest

import tinytrain as tt
import tinytrain.autograd as autograd
import tinytrain.backend as backend_module
import tinytrain.callbacks as callbacks
import tinytrain.cuda as cuda
import tinytrain.data as data
import tinytrain.distributed as distributed
import tinytrain.nn.attention as attention
import tinytrain.nn.checkpointing as checkpointing
import tinytrain.nn.conv as conv
import tinytrain.nn.embedding as embedding
import tinytrain.nn.layers as layers
import tinytrain.nn.module as module
import tinytrain.optim as optim
import tinytrain.serialization as serialization
import tinytrain.text as text
import tinytrain.nn.losses as losses
import tinytrain.nn.transformer as transformer
import tinytrain.training as training
from tinytrain.autograd import _accumulate, _freed_graph_error, _unshared, no_grad
from tinytrain.course import grading
from tinytrain.serialization import capture_rng_state, restore_rng_state

tensor_module = importlib.import_module("tinytrain.tensor")  # the module: tt.tensor is the factory function

ROOT = Path(__file__).resolve().parents[1]


def _graded(name: str) -> types.ModuleType:
    """``tests/graded/test_<name>.py`` as a module (not collected a second time: a private name)."""
    spec = importlib.util.spec_from_file_location(f"_graded_{name}", ROOT / "tests" / "graded" / f"test_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _student(module: types.ModuleType, **replaced: object) -> types.SimpleNamespace:
    """The package's code of ``module`` as the ``student`` fixture, with ``replaced`` names swapped in."""
    return types.SimpleNamespace(**{**vars(module), **replaced})


def _fails(check, student, *expected: str) -> None:
    with pytest.raises(AssertionError) as failure:
        check(student)
    for text in expected:
        assert text in str(failure.value), str(failure.value)


def _report(graded: types.ModuleType, student: types.SimpleNamespace,
            names: list[str]) -> dict[str, grading.CheckResult]:
    """What ``tinytrain grade`` reports for the checks ``names`` of ``graded`` run on ``student``: each one's
    outcome, message and hint, and the failed checks it follows from (``blocked_by``: "fix that first")."""
    collector = grading.Collector()
    for name in names:
        check = getattr(graded, name)
        result = grading.CheckResult(name, name, check.tinytrain_points, "passed", check.tinytrain_hint,
                                     after=check.tinytrain_after)
        try:
            check(student)
        except Exception as failure:  # any exception fails a check, as under pytest
            result.outcome, result.message = "failed", str(failure)
        collector.results[name] = result
    return {result.name: result for result in collector.report(graded.__name__).checks}


# -- Module 01 ----------------------------------------------------------------------------------
# The factories take requires_grad (the lesson: "plus dtype, device and requires_grad"), ones' as well
# as zeros'. Later code builds leaves with it: Module 05's graded test_dropout (w = tt.ones(1000,
# requires_grad=True), run on the student's library) raises "backward() on a tensor that does not require
# grad" for a correct dropout on a ones that drops the flag, and Module 02's lesson hands Add.backward two
# such leaves.

def _ones_without_requires_grad(*shape, dtype=None, device=None, requires_grad=False):
    """A student's ones that forgets to pass requires_grad on."""
    return tensor_module.ones(*shape, dtype=dtype, device=device)


def test_correct_factories_pass_the_zeros_ones_check():
    _graded("01_tensor").test_zeros_ones(_student(tensor_module))


def test_a_ones_that_drops_requires_grad_loses_its_point():
    _fails(_graded("01_tensor").test_zeros_ones, _student(tensor_module, ones=_ones_without_requires_grad),
           "ones(2, requires_grad=True).requires_grad", "expected True")


# Five wrong Module 01 variants, each breaking a rule the lesson or a docstring states: a non-string
# device silently meaning the CPU, to_array(device=None) moving a device's data to the CPU, float64 random
# numbers drawn as float32, zeros() of shape (1,), and to_array trusting `array.base is None` to mean a
# copy, which an object whose __array__ hands out the array it keeps defeats.

def _module_01(**replaced: object) -> types.SimpleNamespace:
    """Module 01's code, backend and tensor, as the ``student`` fixture, with ``replaced`` names swapped in."""
    return types.SimpleNamespace(**{**vars(backend_module), **vars(tensor_module), **replaced})


def _get_backend_defaulting_to_the_cpu(device=None):
    return backend_module.get_backend(device if isinstance(device, (str, backend_module.Backend)) else None)


def _to_array_with_get_backend_none(data, dtype=None, device=None):
    """Passes device=None on to get_backend, which means the CPU: a strict array moves there."""
    return tensor_module.to_array(data, dtype, backend_module.get_backend(device))


def student_to_array(trusts_base: bool):
    """A student's to_array; ``trusts_base`` counts every asarray result with ``base is None`` as a copy."""

    def to_array(data, dtype=None, device=None):
        if isinstance(data, tensor_module.Tensor):
            array, source, natural, fresh = data.data, data._backend, data.dtype, False
        else:
            source = backend_module.backend_of_array(data)
            array, fresh = data, False
            if source is None:
                array, source = np.asarray(data), backend_module.get_backend("cpu")
                fresh = array.base is None and array is not data if trusts_base else isinstance(data, (list, tuple))
            if array.dtype.kind not in "biuf":
                raise TypeError(f"cannot make a tensor of dtype {array.dtype}")
            natural = tensor_module.default_dtype(array.dtype)
        target = source if device is None else backend_module.get_backend(device)
        if target is not source:
            array, fresh = target.from_host(source.to_host(array)), True
        result = array.astype(natural if dtype is None else np.dtype(dtype), order="C", copy=False)
        return result.copy() if result is array and not fresh else result, target

    return to_array


def _randn_cast_from_float32(*shape, dtype=None, device=None, requires_grad=False):
    return tensor_module._filled(lambda b, s, d: b.random_normal(s, "float32").astype(d),
                                 tensor_module._shape_arg(shape), dtype, device, requires_grad)


def _zeros_of_one_number(*shape, **options):
    return tensor_module.zeros(*(shape or (1,)), **options)


@pytest.mark.parametrize("check_name", ["test_get_backend_caches", "test_to_array_copies",
                                        "test_to_array_devices_and_errors", "test_zeros_ones", "test_randn_rand"])
def test_module_01_reference_and_a_students_to_array_pass(check_name):
    for student in (_module_01(), _module_01(to_array=student_to_array(trusts_base=False))):
        getattr(_graded("01_tensor"), check_name)(student)


@pytest.mark.parametrize("check_name, replaced, expected", [
    ("test_get_backend_caches", {"get_backend": _get_backend_defaulting_to_the_cpu}, "expected TypeError"),
    ("test_to_array_devices_and_errors", {"to_array": _to_array_with_get_backend_none}, "keeps it where it is"),
    ("test_to_array_copies", {"to_array": student_to_array(trusts_base=True)}, "__array__ returns the array"),
    ("test_randn_rand", {"randn": _randn_cast_from_float32}, "randn(3, 4, dtype='float64')"),
    ("test_zeros_ones", {"zeros": _zeros_of_one_number}, "0-d"),
])
def test_a_module_01_variant_that_breaks_its_docstring_loses_points(check_name, replaced, expected):
    _fails(getattr(_graded("01_tensor"), check_name), _module_01(**replaced), expected)


# -- Module 02 ----------------------------------------------------------------------------------
# The lesson allows any reverse topological order ("Any order that visits every operation before
# the operations that produced its inputs works"), so a student may sort the graph first instead of
# using the heap. Such an engine must still skip an operation no gradient reached -- a backward
# returned None for its output, as Module 13's checkpointing does for an input that took no part.
# A sorted walk that forgets it raises KeyError inside checkpoint: the checks must take its points.

def _reverse_topological_order(root):
    """Every operation reachable from ``root``, each before the operations that made its inputs (iterative DFS)."""
    order, seen, todo = [], set(), [(root, False)]
    while todo:
        fn, done = todo.pop()
        if done:
            order.append(fn)
            continue
        if fn in seen:
            continue
        if not hasattr(fn, "inputs"):
            raise _freed_graph_error()
        seen.add(fn)
        todo.append((fn, True))
        todo.extend((t._ctx, False) for t in fn.inputs if t._ctx is not None and t._ctx not in seen)
    return order[::-1]


def sorted_engine(skip_unreached: bool):
    """A student's engine that sorts the graph first; ``skip_unreached=False`` runs operations no gradient reached."""

    def backward(tensor, grad=None, retain_graph=False):
        owned = grad is None
        grad = tensor._backend.xp.ones_like(tensor.data) if grad is None else tensor._operand(grad).data
        root = tensor._ctx
        pending, mine = {root: grad}, {root: owned}
        for fn in _reverse_topological_order(root):
            if skip_unreached and fn not in pending:
                continue
            if not hasattr(fn, "inputs"):
                raise _freed_graph_error()
            incoming = pending.pop(fn)
            fn.owns_grad = mine.pop(fn)
            results = fn.backward(incoming)
            if not isinstance(results, tuple):
                raise TypeError(f"{type(fn).__name__}.backward must return a tuple, got {type(results).__name__}")
            for t, g in zip(fn.inputs, results):
                if g is None or not t.requires_grad:
                    continue
                alone = not retain_graph and _unshared(g, fn, results, incoming)
                if t._ctx is None:
                    _accumulate(t, g, alone)
                elif t._ctx in pending:
                    pending[t._ctx], mine[t._ctx] = pending[t._ctx] + g, True
                else:
                    pending[t._ctx], mine[t._ctx] = g, alone
            if not retain_graph:
                vars(fn).clear()

    return backward


@pytest.mark.parametrize("name", ["test_engine", "test_engine_none_gradients_and_nested_backward",
                                  "test_engine_frees_graph", "test_engine_owns_and_adopts"])
def test_a_correct_sorted_engine_passes_every_engine_check(name):
    getattr(_graded("02_autograd"), name)(types.SimpleNamespace(backward=sorted_engine(skip_unreached=True)))


def test_a_sorted_engine_that_runs_unreached_operations_loses_its_points():
    _fails(_graded("02_autograd").test_engine_none_gradients_and_nested_backward,
           types.SimpleNamespace(backward=sorted_engine(skip_unreached=False)),
           "expected a.grad [1, 1] and c.grad None")


def test_checkpoint_of_a_computed_input_it_does_not_use():
    """What the wrong engine breaks: checkpointing hands ``None`` to a computed input that took no part."""
    x, w = tt.tensor([1.0, 2.0], requires_grad=True), tt.tensor([3.0, 4.0], requires_grad=True)
    unused = w * 2.0
    tt.checkpoint(lambda a, b: a * 3.0, x, unused).sum().backward()
    assert x.grad.numpy().tolist() == [3.0, 3.0] and w.grad is None


# gradcheck names "the worst mismatch (the largest excess over its tolerance)" and fails a nan; apply turns
# only a forward's ValueError into its own, keeping the message. A student can write each of these wrong
# and pass everything else in Module 02: the checks grade each rule.

def student_gradcheck(worst_by: str = "excess", nan_fails: bool = True):
    """A student's gradcheck that compares each input's gradients at once, after all its central differences.

    ``worst_by="difference"`` names the element with the largest ``|analytic - numeric|``;
    ``nan_fails=False`` tests ``excess > 0``, which is False for nan.
    """

    def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3):
        inputs = list(inputs)
        checked = [i for i, x in enumerate(inputs) if getattr(x, "requires_grad", False)]
        if not checked:
            raise ValueError("gradcheck: no input has requires_grad=True")
        for i in checked:
            if inputs[i].dtype != np.float64:
                raise TypeError(f"gradcheck needs float64 inputs; input {i} has dtype {inputs[i].dtype}")
            inputs[i].grad = None
        out = fn(*inputs)
        weights = out._backend.from_host(np.random.default_rng(0).standard_normal(out.shape).astype(out.dtype))
        out.backward(out._make(weights, out._backend))

        def projected() -> float:
            with no_grad():
                return float((fn(*inputs).data * weights).sum())

        worst = None  # (score, message)
        for i in checked:
            x = inputs[i]
            values = x._backend.to_host(x.data).copy()
            analytic = np.zeros_like(values) if x.grad is None else x._backend.to_host(x.grad.data)
            numeric = np.empty_like(values)
            for j in range(values.size):
                original, sides = values.flat[j], []
                for step in (eps, -eps):
                    values.flat[j] = original + step
                    x.data = x._backend.from_host(values)
                    sides.append(projected())
                values.flat[j] = original
                numeric.flat[j] = (sides[0] - sides[1]) / (2 * eps)
            x.data = x._backend.from_host(values)
            difference = np.abs(analytic - numeric)
            excess = difference - (atol + rtol * np.abs(numeric))
            failing = ~(excess <= 0) if nan_fails else excess > 0
            if not failing.any():
                continue
            score = np.where(failing, np.nan_to_num(excess if worst_by == "excess" else difference, nan=np.inf),
                             -np.inf)
            j = int(np.argmax(score))
            if worst is None or score.flat[j] > worst[0]:
                index = tuple(int(k) for k in np.unravel_index(j, values.shape))
                worst = (score.flat[j], f"gradient of input {i} at index {index}: autograd gives "
                                        f"{analytic.flat[j]:.6g}, central differences give {numeric.flat[j]:.6g}")
        if worst is not None:
            raise autograd.GradcheckError(worst[1])
        return True

    return gradcheck


@pytest.mark.parametrize("name", ["test_gradcheck", "test_gradcheck_reports_the_worst_element"])
def test_a_correct_vectorised_gradcheck_passes(name):
    getattr(_graded("02_autograd"), name)(_student(autograd, gradcheck=student_gradcheck()))


@pytest.mark.parametrize("variant, expected", [
    (student_gradcheck(worst_by="difference"), "expected the AssertionError to name '(1,)'"),
    (student_gradcheck(nan_fails=False), "gradcheck of a rule whose gradient is nan"),
])
def test_a_gradcheck_that_misranks_or_passes_nan_loses_its_point(variant, expected):
    _fails(_graded("02_autograd").test_gradcheck_reports_the_worst_element, _student(autograd, gradcheck=variant),
           expected)


class _ApplyRewrappingEveryError(autograd.Function):
    """A student's apply that catches every exception of forward (``except Exception``) as its ValueError."""

    @classmethod
    def apply(cls, *inputs, **params):
        try:
            return super().apply.__func__(cls, *inputs, **params)
        except Exception as error:
            shapes = " and ".join(str(t.shape) for t in inputs)
            raise ValueError(f"{cls.__name__} of tensors with shapes {shapes}: {error}") from error


class _ApplyDroppingTheMessage(autograd.Function):
    """A student's apply whose ValueError names the operation and the shapes but not what forward said."""

    @classmethod
    def apply(cls, *inputs, **params):
        try:
            return super().apply.__func__(cls, *inputs, **params)
        except ValueError:
            shapes = " and ".join(str(t.shape) for t in inputs)
            raise ValueError(f"{cls.__name__} of tensors with shapes {shapes}") from None


@pytest.mark.parametrize("variant, expected", [
    (_ApplyRewrappingEveryError, "expected TypeError"),
    (_ApplyDroppingTheMessage, "shapes do not fit"),
])
def test_an_apply_that_changes_forwards_errors_loses_its_point(variant, expected):
    _fails(_graded("02_autograd").test_function_apply_errors, _student(autograd, Function=variant), expected)


def test_the_reference_apply_passes_the_error_check():
    _graded("02_autograd").test_function_apply_errors(_student(autograd))


# The lesson: "`g[idx] = grad` would keep only one, so we use the backend's `scatter_add`". A student
# who scatters for every index, slices too, is right; the NumPy backend adds a slice with one
# vectorised add, so the GPT's q/k/v slices cost what assignment costs (np.add.at: 84 ms a step, not 70).

class _GetItemThatAlwaysScatters(tt.ops.GetItem):
    def backward(self, grad):
        full = self.xp.zeros(self.shape, dtype=grad.dtype)
        self.backend.scatter_add(full, self.index, grad)
        return (full,)


@pytest.mark.parametrize("name", ["test_indexing_backward", "test_backward_rules_run_on_another_device"])
def test_a_getitem_that_always_scatters_passes_the_indexing_checks(name):
    getattr(_graded("02_autograd"), name)(_student(tt.ops, GetItem=_GetItemThatAlwaysScatters))


# -- Module 03 ----------------------------------------------------------------------------------
# The lesson's table gives tanh x = 2 sigmoid(2x) - 1. Near 0 that subtracts two numbers close to 1
# and keeps few digits (tanh(1e-4) 1.7e-4 off in float32), and so does (e^x - e^-x) / (e^x + e^-x).
# The docstring asks for np.tanh's precision there; x.tanh() has it, and both of these lose points.

def _tanh_from_sigmoid(x):
    return 2 * (2 * x).sigmoid() - 1


def _tanh_from_exponentials(x):
    grow, decay = x.clip(-40.0, 40.0).exp(), (-x.clip(-40.0, 40.0)).exp()  # clipped: no inf / inf
    return (grow - decay) / (grow + decay)


def test_a_tanh_that_cancels_digits_near_zero_loses_its_point():
    graded, activations = _graded("03_activations"), importlib.import_module("tinytrain.nn.activations")
    graded.test_tanh(_student(activations))
    for variant in (_tanh_from_sigmoid, _tanh_from_exponentials):
        _fails(graded.test_tanh, _student(activations, tanh=variant), "tanh([0.0001, -0.003, 2e-06]) in float32",
               "lose digits")


# -- Module 04 ----------------------------------------------------------------------------------
# Wrong Module 04 variants that pass everything else: a LinearFunction.backward that computes G W for an
# x that needs none (the first layer's wasted product) or G^T X for a frozen weight, and a __setattr__ that
# moves a re-assigned parameter or buffer to the end of its registry (the docstring: "keeps its place").

class _LinearWithEveryGradient(layers.LinearFunction):
    def backward(self, grad):
        grad_x, grad_weight, *rest = super().backward(grad)
        rows, x = grad.reshape(-1, grad.shape[-1]), self.x.reshape(-1, self.x.shape[-1])
        return (grad @ self.weight if grad_x is None else grad_x,
                rows.T @ x if grad_weight is None else grad_weight, *rest)


def _module_moving_reassigned(registry_name):
    class Module(module.Module):
        def __setattr__(self, name, value):
            registry = self.__dict__.get(registry_name)
            moved = registry is not None and name in registry and isinstance(value, tt.Tensor)
            if moved:
                del registry[name]
            super().__setattr__(name, value)
            if moved:
                registry.setdefault(name, value)  # back in, at the end (a buffer's name was not re-registered)

    return Module


@pytest.mark.parametrize("check_name, replaced, expected", [
    ("test_linear_backward", {"LinearFunction": _LinearWithEveryGradient}, "None for an x that needs no gradient"),
    ("test_setattr_registers", {"Module": _module_moving_reassigned("_parameters")}, "after root.scale = another"),
    ("test_setattr_registers", {"Module": _module_moving_reassigned("_buffers")}, "and then leaf.count = tt.tensor(7)"),
])
def test_a_layer_that_breaks_its_docstring_loses_its_points(check_name, replaced, expected):
    graded, student = _graded("04_layers"), {**vars(module), **vars(layers)}
    getattr(graded, check_name)(types.SimpleNamespace(**student))
    _fails(getattr(graded, check_name), types.SimpleNamespace(**{**student, **replaced}), expected)


# -- Module 06 ----------------------------------------------------------------------------------
# A loss's backward must hand its input a gradient of the input's dtype (Module 02: keep the dtype).
# A float64 one is cast back only at the leaves, so every layer below the loss runs its backward in
# float64 (an MLP step takes twice as long), which checks that read only leaves' .grad cannot see: a
# one-hot from np.eye's float64 default must lose points.

def one_hot_cross_entropy(dtype):
    """``cross_entropy`` (inputs as the graded check passes them) whose backward subtracts the one-hot
    ``xp.eye(C, dtype=dtype)[target]``; ``dtype=None`` is eye's default, float64."""

    class OneHotCrossEntropy(losses.CrossEntropy):
        def backward(self, grad):
            probs, target = self.probs, self.target
            share = losses._unreduce(grad, self.reduction, len(probs))
            share = share[:, None] if self.reduction == "none" else share
            if target.ndim == 2:
                return ((probs * target.sum(axis=1, keepdims=True) - target) * share,)
            return ((probs - self.xp.eye(probs.shape[1], dtype=dtype)[target]) * share,)

    return lambda logits, target, reduction="mean": OneHotCrossEntropy.apply(logits, target=target.data,
                                                                              reduction=reduction)


class BCEWithLogitsCountingWithNumPy(losses.BinaryCrossEntropyWithLogits):
    """Right values, but "mean" divides by ``np.prod(shape)``, a NumPy int64: float32 / it is float64."""

    def backward(self, grad):
        count = np.prod(self.target.shape)
        return ((self.sigmoid - self.target) * (grad / count if self.reduction == "mean" else grad),)


def bce_with_logits_counting_with_numpy(logits, target, reduction="mean"):
    target = losses._as_target(target, logits)
    return BCEWithLogitsCountingWithNumPy.apply(logits, target=target.astype(logits.dtype).data, reduction=reduction)


def test_a_one_hot_cross_entropy_keeps_its_points_only_in_the_logits_dtype():
    graded = _graded("06_losses")
    graded.test_cross_entropy_gradient(_student(losses, cross_entropy=one_hot_cross_entropy(np.float32)))
    _fails(graded.test_cross_entropy_gradient, _student(losses, cross_entropy=one_hot_cross_entropy(None)),
           "the dtype of the gradient that cross_entropy", "float64")


def test_a_binary_cross_entropy_whose_mean_gradient_is_float64_loses_its_points():
    _fails(_graded("06_losses").test_binary_cross_entropy_with_logits,
           _student(losses, binary_cross_entropy_with_logits=bce_with_logits_counting_with_numpy),
           "the dtype of the gradient that bce_with_logits_counting_with_numpy, reduction='mean'", "float64")


# Five wrong losses, each breaking a sentence of the lesson or a docstring: BCE's forward clamping the
# caller's probabilities in place, its gradient adding 1e-12 instead of taking the max, the logits loss's
# sigmoid rounding to 0 for x < -17 (1 - sigmoid(|x|)) or overflowing with the warning silenced, and
# mse_loss keeping an int64 target's float64.

class _BCEClampingInPlace(losses.BinaryCrossEntropy):
    def forward(self, probs, target, reduction):
        np.maximum(probs, np.finfo(probs.dtype).smallest_subnormal, out=probs)  # the log's guard, in place
        return super().forward(probs, target, reduction)


class _BCEAddingEpsilon(losses.BinaryCrossEntropy):
    def backward(self, grad):
        p, t = self.probs, self.target
        return ((p - t) / (p * (1 - p) + losses.GRAD_EPS) * losses._unreduce(grad, self.reduction, p.size),)


def _bce_of(function_class):
    def binary_cross_entropy(probs, target, reduction="mean"):
        target = losses._as_target(target, probs)
        return function_class.apply(probs, target=target.astype(probs.dtype).data, reduction=reduction)
    return binary_cross_entropy


def _logits_loss_with_sigmoid(sigmoid):
    class WithSigmoid(losses.BinaryCrossEntropyWithLogits):
        def forward(self, logits, target, reduction):
            out = super().forward(logits, target, reduction)
            with np.errstate(over="ignore"):  # the variant hides the overflow that the check raises on
                self.sigmoid = sigmoid(logits).astype(logits.dtype)
            return out

    def binary_cross_entropy_with_logits(logits, target, reduction="mean"):
        target = losses._as_target(target, logits)
        return WithSigmoid.apply(logits, target=target.astype(logits.dtype).data, reduction=reduction)
    return binary_cross_entropy_with_logits


def _mse_without_cast(pred, target, reduction="mean"):
    diff = pred - losses._as_target(target, pred)
    return losses._reduce(diff * diff, reduction)


@pytest.mark.parametrize("check_name, replaced, expected", [
    ("test_binary_cross_entropy_on_probabilities", {"binary_cross_entropy": _bce_of(_BCEClampingInPlace)},
     "forward leaves its input as it is"),
    ("test_binary_cross_entropy_on_probabilities", {"binary_cross_entropy": _bce_of(_BCEAddingEpsilon)},
     "which halves it"),
    ("test_binary_cross_entropy_with_logits",
     {"binary_cross_entropy_with_logits": _logits_loss_with_sigmoid(lambda x: 1 / (1 + np.exp(-x)))}, "not 0"),
    ("test_binary_cross_entropy_with_logits", {"binary_cross_entropy_with_logits": _logits_loss_with_sigmoid(
        lambda x: np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), 1 - 1 / (1 + np.exp(-np.abs(x)))))}, "not 0"),
    ("test_mse_loss_values_and_gradient", {"mse_loss": _mse_without_cast}, "dtype float64"),
])
def test_a_loss_that_breaks_a_stated_rule_loses_its_points(check_name, replaced, expected):
    graded = _graded("06_losses")
    getattr(graded, check_name)(_student(losses))
    _fails(getattr(graded, check_name), _student(losses, **replaced), expected)


# -- Module 07 ----------------------------------------------------------------------------------
# Wrong Module 07 variants: Adam with the optimizer's step count instead of the parameter's own (a
# parameter that missed a step gets the wrong bias correction), and a bias correction through np.sqrt
# in place (x /= np.sqrt(...): the array stays float32, but NumPy runs the loop in float64 -- other
# bits, several times slower, which a device that counts only float64 results cannot see).

def _adam(sqrt=math.sqrt, shared_step=False):
    """The reference Adam, its bias correction through ``sqrt``, with ``t`` the largest step count of
    any parameter when ``shared_step``."""

    class Adam(optim.Adam):
        def adam_update(self, param, grad, state, group, xp):
            beta1, beta2 = group["betas"]
            state["step"] += 1
            step = max(s.get("step", 0) for s in self.state) if shared_step else state["step"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad * grad
            scratch = xp.sqrt(v)
            scratch /= sqrt(1 - beta2**step)
            scratch += group["eps"]
            param -= group["lr"] / (1 - beta1**step) * m / scratch

    return Adam


@pytest.mark.parametrize("check_name, adam, expected", [
    ("test_adam_bias_correction", _adam(shared_step=True), "kept per parameter"),
    ("test_optimizers_run_on_another_device", _adam(sqrt=np.sqrt), "float32 arrays made float64"),
])
def test_an_adam_that_breaks_a_stated_rule_loses_its_point(check_name, adam, expected):
    graded = _graded("07_optimizers")
    getattr(graded, check_name)(_student(optim, Adam=_adam()))
    _fails(getattr(graded, check_name), _student(optim, Adam=adam), expected)


# -- Module 08 ----------------------------------------------------------------------------------
# Wrong Module 08 variants: a loader that makes its batch tensors with Tensor(...) instead of the given
# self._tensor copies every batch a second time (an epoch 45% slower), and batch_indices that copies
# its slices (the docstring: "views of order").

class _LoaderCopyingEveryBatch(data.DataLoader):
    def _fetch(self, indices):
        getitems = getattr(self.dataset, "__getitems__", None)
        batch = getitems(indices) if getitems is not None else data.collate([self.dataset[int(i)] for i in indices])
        if isinstance(batch, tuple):
            return tuple(tt.Tensor(field, device=self._backend) for field in batch)
        return tt.Tensor(batch, device=self._backend)


def _batch_indices_copying(order, batch_size, drop_last=False):
    return [batch.copy() for batch in data.batch_indices(order, batch_size, drop_last)]


@pytest.mark.parametrize("check_name, replaced, expected", [
    ("test_loader_batches", {"DataLoader": _LoaderCopyingEveryBatch}, "the very array __getitems__ returned"),
    ("test_batch_indices", {"batch_indices": _batch_indices_copying}, "are views of order"),
])
def test_a_loader_that_copies_twice_loses_its_point(check_name, replaced, expected):
    graded = _graded("08_data")
    getattr(graded, check_name)(_student(data))
    _fails(getattr(graded, check_name), _student(data, **replaced), expected)


# -- Module 09 ----------------------------------------------------------------------------------
# clip_grad_norm must leave each gradient in its dtype, and evaluate count hits of one-hot targets
# (both in their docstrings); a variant breaking either loses points.

def clip_grad_norm_writing_float64_back(parameters, max_norm=1.0, error_if_nonfinite=False):
    """Casts every gradient to float64 once and reuses the copies to scale: right values, float64 gradients."""
    grads = [p.grad for p in parameters if p.grad is not None]
    wide = [grad.data.astype(np.float64) for grad in grads]
    norm = math.sqrt(sum(float((w * w).sum()) for w in wide))
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise FloatingPointError(f"the global gradient norm is {norm}")
        return norm
    if norm > max_norm:
        for grad, w in zip(grads, wide):
            grad.data = w * (max_norm / (norm + 1e-6))
    return norm


def test_clipping_keeps_the_gradients_dtype() -> None:
    graded = _graded("09_training")
    graded.test_clip_grad_norm(_student(training))
    _fails(graded.test_clip_grad_norm, _student(training, clip_grad_norm=clip_grad_norm_writing_float64_back),
           "expected dtype float32, got float64")


class AccuracyForLabelsOnly(training.Trainer):
    """evaluate() whose accuracy knows integer labels only: one-hot targets give nan."""

    def evaluate(self, dataloader):
        loss_sum, hits, samples, classifier = 0.0, 0, 0, True
        with no_grad():
            for inputs, targets in dataloader:
                outputs = self.model(inputs)
                loss, is_mean = self._reduce(self.loss_fn(outputs, targets))
                loss_sum += loss.item() * (len(inputs) if is_mean else 1)
                samples += len(inputs)
                classifier = classifier and outputs.ndim == 2 and outputs.shape[1] > 1 and targets.ndim == 1
                if classifier:
                    hits += (outputs.argmax(axis=1) == targets).sum().item()
        if samples == 0:
            raise ValueError("evaluate: the data loader yielded no batches")
        return loss_sum / samples, hits / samples if classifier else math.nan


def test_evaluate_counts_hits_of_one_hot_targets() -> None:
    graded = _graded("09_training")
    graded.test_evaluate_edge_cases(_student(training))
    _fails(graded.test_evaluate_edge_cases, _student(training, Trainer=AccuracyForLabelsOnly),
           "evaluate's accuracy with one-hot targets", "got nan")


# With clipping on, a _clip_and_step that checks only the gradient norm lets an inf loss with a finite
# gradient through (a step taken, train_loss inf), and one that asks clip_grad_norm to raise skips
# self._skip, whose message says where; both lose points.

def _trainer_that_skips(loss_checked_when_clipping=True, clip_raises=False):
    """The reference _clip_and_step, its loss checked only without clipping unless ``loss_checked_when_clipping``,
    and clip_grad_norm asked to raise under on_nonfinite='raise' when ``clip_raises``."""

    class Trainer(training.Trainer):
        def _clip_and_step(self, parameters, loss, norms):
            if (loss_checked_when_clipping or self.grad_clip_norm is None) and not math.isfinite(loss):
                return self._skip(f"the loss is {loss}")
            if self.grad_clip_norm is not None:
                norm = training.clip_grad_norm(parameters, self.grad_clip_norm,
                                               error_if_nonfinite=clip_raises and self.on_nonfinite == "raise")
                if not math.isfinite(norm):
                    return self._skip(f"the gradient norm is {norm}")
                norms.append(norm)
            self.optimizer.step()
            self.step += 1
            return True

    return Trainer


@pytest.mark.parametrize("wrong, expected", [({"loss_checked_when_clipping": False}, "an inf loss whose gradient is"),
                                             ({"clip_raises": True}, "epoch 0 after 1 optimizer steps")])
def test_a_trainer_that_skips_the_wrong_way_loses_its_points(wrong, expected):
    graded = _graded("09_training")
    graded.test_nonfinite_loss_skips_the_step(_student(training, Trainer=_trainer_that_skips()))
    _fails(graded.test_nonfinite_loss_skips_the_step, _student(training, Trainer=_trainer_that_skips(**wrong)),
           expected)


# -- Module 10 ----------------------------------------------------------------------------------
# EarlyStopping stops once wait reaches patience, and (its docstring) a wait past patience stops too.
# Counted with `==`, a callback that has stopped never stops again in a second fit (wait goes past
# patience).

class _EarlyStoppingOnlyAtPatience(callbacks.EarlyStopping):
    def on_epoch_end(self, trainer, logs):
        value = callbacks._monitored(logs, self.monitor)
        if callbacks._improves(value, self.best, self.mode, self.min_delta):
            self.best, self.best_epoch, self.wait = value, trainer.epoch, 0
            return
        self.wait += 1
        if self.wait == self.patience:
            trainer.stop_training, self.stopped_epoch = True, trainer.epoch


def test_an_early_stopping_that_stops_only_when_wait_equals_patience_loses_its_point():
    graded = _graded("10_checkpoints")
    graded.test_early_stopping(_student(callbacks))
    _fails(graded.test_early_stopping, _student(callbacks, EarlyStopping=_EarlyStoppingOnlyAtPatience),
           "already stopped", "expected (1, 4, 1), got (2, 5, 8)")


# Eight wrong Module 10 variants, each breaking a rule the lesson or a docstring states (to_plain's ends
# with two: a NumPy scalar such as np.complex128 is not plain data, and ``value`` itself is left as it was).

def _module_10(**replaced: object) -> types.SimpleNamespace:
    """Module 10's code, serialization and callbacks, as the ``student`` fixture, with ``replaced`` swapped in."""
    return types.SimpleNamespace(**{**vars(serialization), **vars(callbacks), **replaced})


def _to_plain_in_place(value, where="state"):
    """Converts a dict's values where they are: the caller's state changes."""
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _to_plain_in_place(item, f"{where}[{key!r}]")
        return value
    return serialization.to_plain(value, where)


def _to_plain_of_any_scalar(value, where="state"):
    """Any NumPy scalar's .item(), complex and datetime included."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict) and all(type(key) in (str, int) for key in value):
        return {key: _to_plain_of_any_scalar(item, f"{where}[{key!r}]") for key, item in value.items()}
    return serialization.to_plain(value, where)


class _UnpicklerTrustingNumpy(serialization.SafeUnpickler):
    """Checks the module only: any name of an allowed module (numpy.save, numpy.load, ...) loads."""

    def find_class(self, module, name):
        if (module, name) not in self.allowed and module in {allowed for allowed, _ in self.allowed}:
            return getattr(importlib.import_module(module), name)
        return super().find_class(module, name)


class _UnpicklerOfRawNumpy(serialization.SafeUnpickler):
    """Allows the right names but returns NumPy's own functions, which build arrays of dtype object."""

    def find_class(self, module, name):
        super().find_class(module, name)  # refuses the names that are not allowed
        return getattr(importlib.import_module(module), name)


def _capture_by_kind():
    """Keys the backends by their kind ("strict"), so strict:0 and strict:1 collide."""
    state = serialization.capture_rng_state()
    state["backends"] = {device.split(":")[0]: value for device, value in state["backends"].items()}
    return state


def _restore_without_gauss_next(state):
    version, internal, _ = state["python"]
    serialization.restore_rng_state({**state, "python": (version, internal, None)})


class _PruneByEpochRange(callbacks.ModelCheckpoint):
    """Keeps the epochs current - keep_last + 1 ... current, not the keep_last newest files."""

    def _prune(self, current):
        keep = set(range(current - self.keep_last + 1, current + 1))
        for epoch in self.epoch_files():
            if epoch <= current and epoch not in keep and not (self.every and epoch % self.every == 0):
                (self.directory / self._name(epoch)).unlink(missing_ok=True)


_reference_improves = callbacks._improves  # the test below swaps the module's for the variant


def _improves_from_none_even_for_nan(value, best, mode, min_delta=0.0):
    """A student's own comparison: the first value is always the best, even nan (then nothing beats it)."""
    return True if best is None else _reference_improves(value, best, mode, min_delta)


@pytest.mark.parametrize("check_name, replaced, expected", [
    ("test_to_plain", {"to_plain": _to_plain_in_place}, "left as it was"),
    ("test_to_plain", {"to_plain": _to_plain_of_any_scalar}, "not plain data"),
    ("test_safe_unpickler", {"SafeUnpickler": _UnpicklerTrustingNumpy}, "'save']"),
    ("test_safe_unpickler", {"SafeUnpickler": _UnpicklerOfRawNumpy}, "dtype object"),
    ("test_rng_state_round_trip", {"capture_rng_state": _capture_by_kind}, "backend.device"),
    ("test_rng_state_round_trip", {"restore_rng_state": _restore_without_gauss_next}, "gauss_next"),
    ("test_model_checkpoint_keeps_the_right_files", {"ModelCheckpoint": _PruneByEpochRange}, "not epochs 29"),
])
def test_a_module_10_variant_that_breaks_its_docstring_loses_points(tmp_path, monkeypatch, check_name, replaced,
                                                                   expected):
    check = getattr(_graded("10_checkpoints"), check_name)
    fixtures = {"tmp_path": tmp_path, "monkeypatch": monkeypatch}
    _fails(functools.partial(check, **{name: fixtures[name] for name in inspect.signature(check).parameters
                                       if name in fixtures}), _module_10(**replaced), expected)


def test_an_early_stopping_whose_first_value_is_best_even_if_nan_loses_its_point(monkeypatch):
    monkeypatch.setattr(callbacks, "_improves", _improves_from_none_even_for_nan)
    _fails(_graded("10_checkpoints").test_early_stopping, _module_10(), "nan, 1.0, 0.9, 0.8")


# -- Module 11 ----------------------------------------------------------------------------------
# Wrong Module 11 variants: max pooling that scans a window column by column (a tie off the first
# offset goes to the wrong element, which ties that all fall on offset 0 cannot show), one that keeps
# the best with where(candidate > best, ...) (NaN dropped, where the docstring says it passes), and a
# backward that computes the bias gradient nobody needs.

def _max_pool(column_by_column=False, keep_nan=True):
    """Max pooling that visits a window's offsets row by row (or column by column) and keeps the best with
    xp.maximum (or with where, which drops NaN)."""

    class MaxPool2dFunction(conv.MaxPool2dFunction):
        def forward(self, x, *, kernel, stride):
            xp = self.xp
            slices = conv.window_slices(xp, x, kernel, stride)
            order = [i * kernel[1] + j for i in range(kernel[0]) for j in range(kernel[1])]
            if column_by_column:
                order = [i * kernel[1] + j for j in range(kernel[1]) for i in range(kernel[0])]
            best, winner = slices[order[0]].copy(), xp.full(slices[0].shape, order[0], dtype=xp.int32)
            for k in order[1:]:
                better = slices[k] > best
                winner = xp.where(better, k, winner)
                best = xp.maximum(best, slices[k]) if keep_nan else xp.where(better, slices[k], best)
            self.winner, self.shape, self.kernel, self.stride = winner, x.shape, kernel, stride
            return best

    return MaxPool2dFunction


class _ConvWithBiasGradientAlways(conv.Conv2dFunction):
    def backward(self, grad):
        grads = super().backward(grad)
        return grads[:2] + (grad.sum(axis=(0, 2, 3)),) if len(grads) == 3 else grads


@pytest.mark.parametrize("check_name, pooling, expected", [
    ("test_max_pool_backward_ties", _max_pool(column_by_column=True), "reading row by row, (0, 1), takes it all"),
    ("test_max_pool_forward", _max_pool(keep_nan=False), "a window holding NaN gives NaN"),
])
def test_a_max_pooling_that_breaks_its_docstring_loses_its_points(monkeypatch, check_name, pooling, expected):
    graded = _graded("11_convolutions")
    monkeypatch.setattr(conv, "MaxPool2dFunction", _max_pool())  # what max_pool2d applies
    getattr(graded, check_name)(_student(conv))
    monkeypatch.setattr(conv, "MaxPool2dFunction", pooling)
    _fails(getattr(graded, check_name), _student(conv), expected)


def test_a_convolution_that_returns_a_bias_gradient_nobody_needs_loses_its_points():
    graded = _graded("11_convolutions")
    graded.test_conv_backward_against_loops(_student(conv))
    _fails(graded.test_conv_backward_against_loops, _student(conv, Conv2dFunction=_ConvWithBiasGradientAlways),
           "returned a bias gradient nobody needs")


def _conv_recipe(crop: str):
    """The lesson's convolution as a student writes it, cutting the padding off the input gradient with
    ``crop``: "ph:H - ph", or "ph:-ph", which is the empty slice 0:0 for padding 0."""

    class Conv2dFunction(autograd.Function):
        def forward(self, x, weight, bias=None, *, stride, padding):
            (ph, pw), (out_channels, _, kh, kw) = padding, weight.shape
            x = self.backend.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
            n, _, height, width = x.shape
            self.cols = conv.im2col(self.xp, x, (kh, kw), stride)
            out = self.xp.matmul(weight.reshape(out_channels, -1), self.cols)
            if bias is not None:
                out += bias.reshape(out_channels, 1)
            self.weight, self.stride, self.padding, self.padded_shape = weight, stride, padding, x.shape
            return out.reshape(n, out_channels, conv.output_size(height, kh, stride[0]),
                               conv.output_size(width, kw, stride[1]))

        def backward(self, grad):
            (n, out_channels), (ph, pw), (height, width) = grad.shape[:2], self.padding, self.padded_shape[2:]
            g = grad.reshape(n, out_channels, -1)
            grads = [None, None, None][:len(self.inputs)]
            if self.inputs[0].requires_grad:
                grad_cols = self.xp.matmul(self.weight.reshape(out_channels, -1).T, g)
                padded = conv.col2im(self.xp, grad_cols, self.padded_shape, self.weight.shape[2:], self.stride)
                grads[0] = (padded[:, :, ph:height - ph, pw:width - pw] if crop == "ph:H - ph"
                            else padded[:, :, ph:-ph, pw:-pw])
            if self.inputs[1].requires_grad:
                grads[1] = self.xp.matmul(g, self.cols.transpose(0, 2, 1)).sum(axis=0).reshape(self.weight.shape)
            if len(self.inputs) == 3 and self.inputs[2].requires_grad:
                grads[2] = g.sum(axis=(0, 2))
            return tuple(grads)

    return Conv2dFunction


@pytest.mark.parametrize("check_name", ["test_conv_backward_gradcheck", "test_conv_backward_against_loops"])
def test_a_convolution_that_crops_with_ph_colon_minus_ph_is_told_why_its_input_gradient_is_empty(check_name):
    """`x[..., 0:-0]` is empty: the check names that cause, not gradcheck's IndexError or a bare shape mismatch."""
    check = getattr(_graded("11_convolutions"), check_name)
    check(_student(conv, Conv2dFunction=_conv_recipe("ph:H - ph")))
    _fails(check, _student(conv, Conv2dFunction=_conv_recipe("ph:-ph")), "`ph:-ph` is `0:-0`", "`ph:H - ph`")


# -- Module 12 ----------------------------------------------------------------------------------
# Four load_state variants that break its docstring ("those three keys and no others", "Python ints",
# "a seed of 2**64 or more is kept modulo 2**64"), and a matmul_cost that counts FLOPs in a float.

def _loading(valid, keep):
    """A DrawCounter whose load_state accepts what ``valid(state)`` accepts and keeps ``keep(seed)``."""

    class Loading(cuda.DrawCounter):
        def load_state(self, state):
            if not valid(state):
                raise ValueError(f"expected {{'generator': {cuda.GENERATOR!r}, ...}}, got {state!r}")
            self.seed, self.draws = keep(state["seed"]), state["draws"]

    return Loading


def _plain(state, integer=int):
    return (isinstance(state, dict) and set(state) == {"generator", "seed", "draws"}
            and state["generator"] == cuda.GENERATOR
            and all(isinstance(state[key], integer) and not isinstance(state[key], bool) and state[key] >= 0
                    for key in ("seed", "draws")))


_LOAD_STATE_VARIANTS = {
    "keeps a seed >= 2**64 whole": (_loading(_plain, lambda seed: seed), "test_draw_counter_round_trip"),
    "refuses a seed >= 2**64": (_loading(lambda state: _plain(state) and state["seed"] < 2**64, lambda seed: seed),
                                "test_draw_counter_round_trip"),
    "takes extra keys": (_loading(lambda state: isinstance(state, dict) and _plain(
        {key: state[key] for key in ("generator", "seed", "draws") if key in state}), lambda seed: seed % 2**64),
        "test_draw_counter_refuses_foreign_states"),
    "takes NumPy ints": (_loading(lambda state: _plain(state, (int, np.integer)), lambda seed: int(seed) % 2**64),
                         "test_draw_counter_refuses_foreign_states"),
}


@pytest.mark.parametrize("variant", list(_LOAD_STATE_VARIANTS))
def test_a_load_state_that_breaks_its_docstring_loses_points(variant):
    counter, check_name = _LOAD_STATE_VARIANTS[variant]
    graded = _graded("12_accelerators")
    with pytest.raises((AssertionError, ValueError)):
        getattr(graded, check_name)(_student(cuda, DrawCounter=counter))
    correct = _loading(_plain, lambda seed: seed % 2**64)
    graded.test_draw_counter_round_trip(_student(cuda, DrawCounter=correct))
    graded.test_draw_counter_refuses_foreign_states(_student(cuda, DrawCounter=correct))


def test_a_matmul_cost_in_floats_loses_its_point():
    graded = _graded("12_accelerators")
    graded.test_cost_model(_student(cuda))
    _fails(graded.test_cost_model, _student(cuda, matmul_cost=lambda m, k, n, itemsize=4: (
        2.0 * m * k * n, itemsize * (m * k + k * n + m * n))), "exact Python ints", "'float'")


# -- Module 13 ----------------------------------------------------------------------------------
# A recompute whose output needs no gradient -- a frozen segment (no parameter requires grad) fed by
# data, whose node exists only through the anchor -- has nothing to backpropagate. A Recompute.backward
# that calls backward on it regardless raises RuntimeError there: it must lose points.
# Handing `grad` to the recomputed output's backward as the bare array is right, and keeps a float64
# segment's gradients in float64 (the engine keeps the output's dtype). An anchor given a zero gradient
# instead of None, and an all-reduce buffer in the gradients' float64 instead of float32, are wrong.

def recompute(guard: bool = True, seed=lambda grad, out: tt.Tensor._make(grad, out._backend),
              anchor_gradient=lambda grad: None) -> type:
    """The reference ``Recompute``, backpropagating ``seed(grad, out)`` (only when the recomputed output
    requires grad if ``guard``) and giving the anchor ``anchor_gradient(grad)``."""

    class Recompute(checkpointing.Recompute):  # the grader's node-type check reads the class name
        def backward(self, grad):
            inputs = [tt.Tensor._make(t.data, t._backend, t.requires_grad) for t in self.inputs[:-1]]
            now = capture_rng_state()
            restore_rng_state(self.rng)
            try:
                with checkpointing._enable_grad():
                    out = self.function(*inputs)
            finally:
                restore_rng_state(now)
            if out.requires_grad or not guard:
                out.backward(seed(grad, out))
            return tuple(None if t.grad is None else t.grad.data for t in inputs) + (anchor_gradient(grad),)

    return Recompute


def test_checkpoint_of_a_frozen_segment_needs_the_guard(monkeypatch) -> None:
    graded = _graded("13_scale")
    graded.test_checkpoint_gradients_equal_plain(_student(checkpointing))
    monkeypatch.setattr(checkpointing, "Recompute", recompute(guard=False))  # what checkpoint() applies
    _fails(graded.test_checkpoint_gradients_equal_plain, _student(checkpointing),
           "checkpoint(frozen, data)", "expected the head's gradient, got RuntimeError")


def test_a_recompute_that_backpropagates_the_bare_array_passes(monkeypatch) -> None:
    monkeypatch.setattr(checkpointing, "Recompute", recompute(seed=lambda grad, out: grad))
    _graded("13_scale").test_checkpoint_gradients_equal_plain(_student(checkpointing))


def test_a_recompute_that_gives_the_anchor_a_zero_gradient_loses_its_points(monkeypatch) -> None:
    checkpointing._anchors.clear()  # an anchor a wrong variant gave a .grad would stay so for the other tests
    monkeypatch.setattr(checkpointing, "Recompute",
                        recompute(anchor_gradient=lambda grad: np.zeros((), dtype=grad.dtype)))
    try:
        _fails(_graded("13_scale").test_checkpoint_gradients_equal_plain, _student(checkpointing),
               "the .grad of the anchor on", "expected None", "got tensor(0.")
    finally:
        checkpointing._anchors.clear()


def _average_in_the_gradients_dtype(parameters, comm, extra=0.0):
    grads = [p.grad for p in parameters if p.grad is not None]
    dtype = np.result_type(np.float32, *[g.dtype for g in grads])  # float64 if any gradient is
    send = np.concatenate([g.numpy().ravel() for g in grads] + [np.array([extra])]).astype(dtype)
    total = np.empty_like(send)
    comm.Allreduce(send, total)
    start = 0
    for g in grads:
        g.data[...] = total[start:start + g.size].reshape(g.shape) / comm.Get_size()
        start += g.size
    return float(total[-1])


def test_an_all_reduce_in_float64_loses_its_points():
    graded = _graded("13_scale")
    graded.test_average_gradients(_student(distributed))
    _fails(graded.test_average_gradients, _student(distributed, average_gradients=_average_in_the_gradients_dtype),
           "the buffer is float32 whatever the gradients' dtype")


def _shard_indices_wrapping_once(order, rank, world_size):
    """Pads with one copy of the start of ``order``: too short when there are more ranks than samples."""
    total = -(-len(order) // world_size) * world_size
    return np.concatenate([order, order[:total - len(order)]])[rank::world_size]


def test_a_shard_indices_that_wraps_only_once_loses_its_points():
    graded = _graded("13_scale")
    graded.test_shard_indices(_student(distributed))
    _fails(graded.test_shard_indices, _student(distributed, shard_indices=_shard_indices_wrapping_once),
           "more ranks than samples: keep wrapping", "got [[4], [2], [4], [2], []]")


# -- Module 14 ----------------------------------------------------------------------------------
# Wrong Module 14 variants: a merge that hands back `ids` itself when nothing merges ("A new list"), a
# train that keeps the old merges for a text without pairs ("Merges learned before are replaced"),
# and an embedding backward whose zeros are float32 whatever grad's dtype.

def _merge_returning_ids_when_nothing_merges(ids, pair, new_id):
    return ids if pair not in set(zip(ids, ids[1:])) else text.merge(ids, pair, new_id)


class _BPEKeepingMergesWithoutPairs(text.BPETokenizer):
    def train(self, corpus, vocab_size):
        return self if len(corpus.encode("utf-8")) < 2 else super().train(corpus, vocab_size)


class _EmbeddingInFloat32(embedding.EmbeddingFunction):
    def backward(self, grad):
        grad_weight = self.xp.zeros(self.weight_shape, dtype=np.float32)
        self.backend.scatter_add(grad_weight, self.ids, grad)
        return (grad_weight,)


@pytest.mark.parametrize("check_name, replaced, expected", [
    ("test_merge", {"merge": _merge_returning_ids_when_nothing_merges}, "returned the list it was given"),
    ("test_bpe_train_rules", {"BPETokenizer": _BPEKeepingMergesWithoutPairs}, "which has no pair at all"),
    ("test_embedding_backward", {"EmbeddingFunction": _EmbeddingInFloat32}, "zeros in grad's dtype"),
])
def test_a_tokenizer_or_embedding_that_breaks_its_docstring_loses_points(check_name, replaced, expected):
    graded, student = _graded("14_attention"), {**vars(text), **vars(embedding)}
    getattr(graded, check_name)(types.SimpleNamespace(**student))
    _fails(getattr(graded, check_name), types.SimpleNamespace(**{**student, **replaced}), expected)


# The attention checks build on each other: a mistake in MaskedSoftmax or in the scale fails the checks after
# them too, and the report must point at the cause, not at the step where it shows.
ATTENTION_CHECKS = ["test_masked_softmax", "test_attention_values", "test_attention_scale", "test_attention_causal",
                    "test_attention_mask_and_dropout"]
_MASKED_SOFTMAX, _ATTENTION = attention.MaskedSoftmax, attention.scaled_dot_product_attention


class _MaskedSoftmaxMaskingAfter(_MASKED_SOFTMAX):
    """Zeroes the masked weights of the full softmax: the allowed ones no longer sum to 1."""

    def forward(self, scores, *, allowed):
        exps = self.xp.exp(scores - scores.max(axis=-1, keepdims=True))
        self.out = exps / exps.sum(axis=-1, keepdims=True)
        if allowed is not None:
            self.out = self.xp.where(allowed, self.out, 0.0)
        return self.out


class _AttentionMaskingAfter:
    """What a scaled_dot_product_attention that masks the weights after the softmax applies."""

    @staticmethod
    def apply(scores, *, allowed):
        weights = _MASKED_SOFTMAX.apply(scores, allowed=None)
        return weights if allowed is None else weights * tt.tensor(np.asarray(allowed), dtype=weights.dtype)


def test_a_mask_applied_after_the_softmax_is_blamed_on_masked_softmax(monkeypatch):
    graded = _graded("14_attention")
    monkeypatch.setattr(attention, "MaskedSoftmax", _MaskedSoftmaxMaskingAfter)  # what attention applies
    report = _report(graded, _student(attention), ATTENTION_CHECKS)
    assert report["test_masked_softmax"].outcome == "failed" and report["test_attention_values"].outcome == "passed"
    for name in ("test_attention_causal", "test_attention_mask_and_dropout"):
        assert report[name].outcome == "failed" and report[name].blocked_by == ["test_masked_softmax"], name


def test_masking_after_the_softmax_in_attention_is_named_by_the_causal_hint(monkeypatch):
    graded = _graded("14_attention")
    monkeypatch.setattr(attention, "MaskedSoftmax", _AttentionMaskingAfter)
    report = _report(graded, _student(attention, MaskedSoftmax=_MASKED_SOFTMAX), ATTENTION_CHECKS)
    causal = report["test_attention_causal"]
    assert report["test_masked_softmax"].outcome == "passed" and report["test_attention_values"].outcome == "passed"
    assert causal.outcome == "failed" and causal.blocked_by == [] and "zeroed after the softmax" in causal.hint


def _attention_with_default_scale(default_scale):
    """A scaled_dot_product_attention whose scale=None means ``default_scale(E)`` instead of 1 / sqrt(E)."""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        return _ATTENTION(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                          scale=default_scale(query.shape[-1]) if scale is None else scale)

    return scaled_dot_product_attention


def _attention_softmax_over_the_queries(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    scores = (query / math.sqrt(query.shape[-1])) @ key.transpose(*range(key.ndim - 2), -1, -2)
    return scores.softmax(-2) @ value


@pytest.mark.parametrize("variant, diagnosis", [
    (_attention_with_default_scale(lambda features: 1.0), "the scores are not scaled: scale=None means 1 / sqrt(E) = "
                                                          "1 / sqrt(3) (attention_scale checks the scale); 40 of 40"),
    (_attention_with_default_scale(lambda features: 1 / features), "the scores are divided by E = 3, not by sqrt(E)"),
    (_attention_softmax_over_the_queries, None),
], ids=["no scale", "scale 1 over E", "softmax over the queries"])
def test_a_wrong_scale_is_named_where_attention_values_fails(variant, diagnosis):
    report = _report(_graded("14_attention"), _student(attention, scaled_dot_product_attention=variant),
                     ATTENTION_CHECKS)
    values = report["test_attention_values"]
    assert values.outcome == "failed" and values.blocked_by == [], values.message
    if diagnosis is None:  # another mistake: the plain comparison, no word of the scale
        assert "scale" not in values.message and "40 of 40 differ" in values.message, values.message
    else:
        assert diagnosis in values.message, values.message
        assert report["test_attention_scale"].blocked_by == ["test_attention_values"]


# -- Module 15 ----------------------------------------------------------------------------------
# generate appends the ids drawn from next_token_probs to a context on the model's device. A
# next_token_probs whose greedy branch builds its one-hot table on the host (np.zeros, then
# Tensor(probs)) makes generate(temperature=0) of a model on a GPU (or the strict device) raise
# "expected tensors on the same device". The docstring says the result is on the logits' device,
# and the check runs next_token_probs there.

def next_token_probs_greedy_on_the_host(logits, temperature=1.0, top_k=None):
    """A student's next_token_probs: right on the cpu, but its greedy table lives on the host."""
    if temperature == 0:
        probs = np.zeros(logits.shape)
        probs[np.arange(logits.shape[0]), logits.argmax(axis=-1).numpy()] = 1.0
        return tt.Tensor(probs)
    return transformer.next_token_probs(logits, temperature, top_k)


def next_token_probs_by_partition(logits, temperature=1.0, top_k=None):
    """A correct variant: xp.eye rows for greedy, xp.partition for the k-th largest, all on the logits' device."""
    xp, z = logits._backend.xp, logits.data
    vocab = z.shape[-1]
    if temperature == 0:
        return tt.Tensor._make(xp.eye(vocab, dtype=z.dtype)[xp.argmax(z, axis=-1)], logits._backend)
    z = z / temperature
    if top_k is not None and top_k < vocab:
        kth = xp.partition(z, vocab - top_k, axis=-1)[:, vocab - top_k:vocab - top_k + 1]
        z = xp.where(z >= kth, z, -xp.inf)
    e = xp.exp(z - z.max(axis=-1, keepdims=True))
    return tt.Tensor._make(e / e.sum(axis=-1, keepdims=True), logits._backend)


def test_next_token_probs_stays_on_the_logits_device() -> None:
    graded = _graded("15_transformers")
    graded.test_next_token_probs(_student(transformer))
    graded.test_next_token_probs(_student(transformer, next_token_probs=next_token_probs_by_partition))
    _fails(graded.test_next_token_probs, _student(transformer, next_token_probs=next_token_probs_greedy_on_the_host),
           "temperature=0", "strict device", "expected 'strict:0', got 'cpu'")
