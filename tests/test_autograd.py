"""The autograd engine: backward, gradient accumulation, graph lifetime,
``no_grad``, ``detach``, custom ``Function`` subclasses and ``gradcheck``."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import tinytrain as tt
from tinytrain.autograd import Function


def leaf(data, device, dtype=tt.float64):
    return tt.tensor(data, dtype=dtype, device=device, requires_grad=True)


def assert_grad(t, expected):
    assert t.grad is not None, "expected a gradient"
    np.testing.assert_allclose(t.grad.numpy(), expected, rtol=1e-6)


# -- custom Functions (the extension API) -------------------------------------------------

class Cube(Function):
    def forward(self, x):
        self.x = x
        return x * x * x

    def backward(self, grad):
        return (3 * self.x * self.x * grad,)


class WrongCube(Cube):
    """Forgets the factor 3: gradcheck must catch it."""

    def backward(self, grad):
        return (self.x * self.x * grad,)


class Scale(Function):
    """Keyword parameters reach ``forward``; they are not inputs."""

    def forward(self, x, factor=1.0):
        self.factor = factor
        return x * factor

    def backward(self, grad):
        return (grad * self.factor,)


class TimesFirst(Function):
    """``x * y`` that claims no gradient for ``y`` (returns None for it)."""

    def forward(self, x, y):
        self.y = y
        return x * y

    def backward(self, grad):
        return (grad * self.y, None)


def test_custom_function_forward_and_backward(device):
    x = leaf([1.0, -2.0], device)
    y = Cube.apply(x)
    assert isinstance(y, tt.Tensor) and y.requires_grad
    np.testing.assert_allclose(y.numpy(), [1.0, -8.0])
    y.sum().backward()
    assert_grad(x, [3.0, 12.0])


def test_custom_function_passes_gradcheck(device):
    assert tt.gradcheck(lambda t: Cube.apply(t).sum(), [leaf([0.5, -1.5, 2.0], device)]) is True


class _NanSlope(Function):
    """The zero function whose backward gives nan: nan - numeric compared with any tolerance is False."""

    def forward(self, a):
        return a * 0.0

    def backward(self, grad):
        return (self.xp.full(grad.shape, np.nan),)


def test_gradcheck_catches_a_nan_gradient(device):
    # Catches a worst mismatch kept with `excess > worst`, which is False for nan: such a gradcheck returns True.
    with pytest.raises(tt.GradcheckError, match="nan"):
        tt.gradcheck(lambda t: _NanSlope.apply(t).sum(), [leaf([0.5, -1.5], device)])


def test_gradcheck_catches_wrong_backward(device):
    x = leaf([3.0], device)
    with pytest.raises(AssertionError) as info:
        tt.gradcheck(lambda t: WrongCube.apply(t).sum(), [x])
    # The report names the mismatch: the numeric gradient is 3x the analytic one
    # (both possibly scaled by gradcheck's own projection of the output).
    numbers = [float(n) for n in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", str(info.value))]
    assert any(abs(a) > 0 and abs(b / a - 3) < 1e-3 for a in numbers for b in numbers), str(info.value)


def test_gradcheck_names_the_bad_input(device):
    """With two inputs of which only the second's gradient is wrong, gradcheck still fails."""
    a, b = leaf([1.0, 2.0], device), leaf([3.0], device)
    with pytest.raises(AssertionError):
        tt.gradcheck(lambda x, y: (x * 2).sum() + WrongCube.apply(y).sum(), [a, b])


def test_gradcheck_accepts_non_scalar_output(device):
    assert tt.gradcheck(lambda t: Cube.apply(t), [leaf([[0.5, -1.0], [2.0, 1.5]], device)]) is True


def test_gradcheck_leaves_inputs_unchanged(device):
    x = leaf([0.5, -1.5], device)
    tt.gradcheck(lambda t: Cube.apply(t).sum(), [x])
    np.testing.assert_array_equal(x.numpy(), [0.5, -1.5])


def test_function_keyword_params(device):
    x = leaf([1.0, 2.0], device)
    y = Scale.apply(x, factor=3.0)
    np.testing.assert_allclose(y.numpy(), [3.0, 6.0])
    y.sum().backward()
    assert_grad(x, [3.0, 3.0])


def test_function_none_gradient_leaves_input_without_grad(device):
    x, y = leaf([1.0, 2.0], device), leaf([5.0, 7.0], device)
    TimesFirst.apply(x, y).sum().backward()
    assert_grad(x, [5.0, 7.0])
    assert y.grad is None


def test_function_output_requires_grad_only_if_an_input_does(device):
    x = tt.tensor([1.0], device=device)
    assert Cube.apply(x).requires_grad is False
    assert Cube.apply(leaf([1.0], device)).requires_grad is True


# -- backward basics -----------------------------------------------------------------------

def test_scalar_backward_seeds_with_one(device):
    x = leaf([1.0, 2.0, 3.0], device)
    (x * x).sum().backward()
    assert_grad(x, [2.0, 4.0, 6.0])


def test_grad_is_tensor_without_requires_grad(device):
    x = leaf([1.0, 2.0], device)
    (x * 3).sum().backward()
    assert isinstance(x.grad, tt.Tensor)
    assert x.grad.requires_grad is False
    assert x.grad.device == x.device and x.grad.dtype == x.dtype and x.grad.shape == x.shape


def test_float32_grad_stays_float32(device):
    x = leaf([1.0, 2.0], device, dtype=tt.float32)
    (x * x).mean().backward()
    assert x.grad.dtype == np.float32


def test_backward_on_non_scalar_needs_grad(device):
    y = leaf(np.ones((2, 3)), device) * 2
    with pytest.raises(RuntimeError) as info:
        y.backward()
    assert "(2, 3)" in str(info.value)


def test_backward_with_explicit_grad(device):
    x = leaf(np.arange(6.0).reshape(2, 3), device)
    (x * x).backward(tt.ones(2, 3, dtype=tt.float64, device=device))
    assert_grad(x, 2 * np.arange(6.0).reshape(2, 3))
    x.grad = None
    weights = np.arange(6.0).reshape(2, 3) + 1
    (x * 2).backward(tt.tensor(weights, dtype=tt.float64, device=device))
    assert_grad(x, 2 * weights)


class _SeenGradient(Function):
    """The identity, recording the dtype of the gradient that reaches it."""

    seen: list = []

    def forward(self, a):
        return a

    def backward(self, grad):
        _SeenGradient.seen.append(grad.dtype)
        return (grad,)


def test_backward_grad_takes_the_tensors_dtype(device):
    # Catches an array or list taken through tt.tensor's default float32: 1/3 comes back rounded in a float64 graph.
    third = [0.1, 1 / 3]
    for given in (np.array(third), third):
        x = leaf([1.0, 2.0], device)
        (x * 1.0).backward(given)
        assert x.grad.dtype == np.float64 and x.grad.numpy().tolist() == third, x.grad
    _SeenGradient.seen = []
    x = leaf([1.0, 2.0], device)
    _SeenGradient.apply(x * 1.0).backward(tt.tensor(third, dtype=tt.float32, device=device))
    assert _SeenGradient.seen == [np.dtype(np.float64)]  # a float32 tensor is cast to the output's dtype
    assert x.grad.numpy().tolist() == np.array(third, np.float32).astype(np.float64).tolist()


def test_backward_grad_of_wrong_shape_names_both(device):
    y = leaf(np.ones((2, 3)), device) * 2
    with pytest.raises(ValueError) as info:
        y.backward(tt.ones(3, 2, dtype=tt.float64, device=device))
    assert "(2, 3)" in str(info.value) and "(3, 2)" in str(info.value)


def test_non_leaf_grad_is_none(device):
    x = leaf([1.0, 2.0], device)
    y = x * 2
    z = y.sum()
    z.backward()
    assert y.grad is None and z.grad is None
    assert_grad(x, [2.0, 2.0])


def test_constants_get_no_grad(device):
    x = leaf([1.0, 2.0], device)
    c = tt.tensor([3.0, 4.0], dtype=tt.float64, device=device)
    (x * c).sum().backward()
    assert c.grad is None
    assert_grad(x, [3.0, 4.0])


# -- graph shape -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "step, expected",
    [(lambda y: y * 1.0001, 1.0001**10_000), (lambda y: y + 1, 1.0)],
    ids=["mul", "add"],
)
def test_deep_chain_has_no_recursion_limit(device, step, expected):
    assert sys.getrecursionlimit() < 10_000 * 2, "the test must exceed the recursion limit to mean anything"
    x = leaf(1.0, device)
    y = x
    for _ in range(10_000):
        y = step(y)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-9)


def test_node_used_many_times_sums_gradients(device):
    x = leaf([1.0, -2.0], device)
    s = x * x
    for _ in range(99):
        s = s + x * x
    s.sum().backward()
    assert_grad(x, 200 * np.array([1.0, -2.0]))


def test_shared_intermediate(device):
    """Diamond: ``y`` feeds two branches; its gradient is the sum of both before flowing to x."""
    x = leaf([2.0], device)
    y = x * 3
    z = y * y + y.exp()  # dz/dx = (2y + e^y) * 3
    z.sum().backward()
    assert_grad(x, [(2 * 6.0 + np.exp(6.0)) * 3])


def test_gradient_flows_only_to_reachable_leaves(device):
    x, unused = leaf([1.0], device), leaf([1.0], device)
    _ = unused * 2
    (x * 5).sum().backward()
    assert_grad(x, [5.0])
    assert unused.grad is None


# -- accumulation and graph lifetime -------------------------------------------------------------

def test_leaf_grads_accumulate_until_reset(device):
    x = leaf([1.0, 2.0], device)
    (x * 3).sum().backward()
    (x * x).sum().backward()
    assert_grad(x, [3.0 + 2.0, 3.0 + 4.0])
    x.grad = None
    (x * 3).sum().backward()
    assert_grad(x, [3.0, 3.0])


def test_second_backward_through_same_graph_raises(device):
    x = leaf([1.0, 2.0], device)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time|retain_graph"):
        loss.backward()


def test_a_backward_that_returns_a_bare_array_raises_naming_the_operation(device):
    """Unchecked, zip(inputs, grads) would hand the bare array's first row to the input, silently."""
    class Bare(tt.autograd.Function):
        def forward(self, a):
            return a * 2

        def backward(self, grad):
            return grad * 2

    x = leaf([[1.0, 2.0], [3.0, 4.0]], device)
    with pytest.raises(TypeError, match=r"Bare\.backward must return a tuple with one gradient \(or None\) per input, got \w+"):
        Bare.apply(x).sum().backward()


def test_a_new_graph_through_a_freed_part_raises_the_second_time_error(device):
    """Not an AttributeError ('Mul' object has no attribute 'sequence') from the engine's heap."""
    x = leaf([1.0, 2.0], device)
    y = x * 2
    y.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        (y * 3).sum().backward()


def test_retain_graph_allows_second_backward(device):
    x = leaf([1.0, 2.0], device)
    loss = (x * x).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert_grad(x, [4.0, 8.0])


# -- a leaf's first gradient: adopted only when nothing else holds it ----------------------------

def test_gradients_handed_to_two_leaves_are_not_shared(device):
    a, b = leaf([1.0, 2.0], device), leaf([3.0, 4.0], device)
    seed = tt.tensor([1.0, 10.0], dtype=tt.float64, device=device)
    (a + b).backward(seed)  # the addition passes the user's array on, unchanged, to both leaves
    (a * 1).sum().backward()
    assert_grad(a, [2.0, 11.0])
    assert_grad(b, [1.0, 10.0])
    np.testing.assert_array_equal(seed.numpy(), [1.0, 10.0])


def test_view_of_a_shared_gradient_is_copied(device):
    x, w = leaf([[1.0, 2.0], [3.0, 4.0]], device), leaf([0.0, 0.0, 0.0, 0.0], device)
    (x.reshape(4) + w).sum().backward()  # x gets a view of the gradient that w gets
    (w * 2).sum().backward()
    assert_grad(x, [[1.0, 1.0], [1.0, 1.0]])
    assert_grad(w, [3.0, 3.0, 3.0, 3.0])


class ReturnsSaved(Function):
    """``2 x`` whose backward returns an array it keeps (valid for an all-ones ``grad``)."""

    def forward(self, x):
        self.slope = x * 0 + 2
        return x * 2

    def backward(self, grad):
        return (self.slope,)


def test_array_kept_by_a_retained_graph_is_copied(device):
    x = leaf([1.0, 5.0], device)
    y = ReturnsSaved.apply(x)
    ones = tt.ones(2, dtype=tt.float64, device=device)
    for _ in range(3):
        y.backward(ones, retain_graph=True)
    assert_grad(x, [6.0, 6.0])


class SwapsInputs(Function):
    """``x * y`` for an all-ones ``grad``: its backward returns the inputs' own arrays."""

    def forward(self, x, y):
        self.x, self.y = x, y
        return x * y

    def backward(self, grad):
        return self.y, self.x


def test_input_array_returned_as_gradient_is_copied(device):
    x, y = leaf([1.0, 2.0], device), leaf([3.0, 4.0], device)
    SwapsInputs.apply(x, y).backward(tt.ones(2, dtype=tt.float64, device=device))
    (x * 1).sum().backward()
    assert_grad(x, [4.0, 5.0])
    np.testing.assert_array_equal(y.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(y.grad.numpy(), [1.0, 2.0])


made = []


class Doubles(Function):
    """``2 x``; records the gradient array it returns, to see whether the engine copies it."""

    def forward(self, x):
        return x * 2

    def backward(self, grad):
        made.append(grad * 2)
        return (made[-1],)


def test_new_gradient_array_is_adopted_without_a_copy(device):
    x = leaf([1.0, 2.0], device)
    made.clear()
    Doubles.apply(x).backward(tt.ones(2, dtype=tt.float64, device=device))
    assert x.grad.data is made[0], "a new, unshared gradient array should become .grad as it is"
    assert_grad(x, [2.0, 2.0])


# -- the gradient a backward receives: overwritable only when the engine owns it -------------------

class Probe(Function):
    """The identity; records ``owns_grad`` at each backward and, when allowed, overwrites ``grad``."""

    seen: list[bool] = []

    def forward(self, x):
        return x * 1

    def backward(self, grad):
        Probe.seen.append(self.owns_grad)
        if self.owns_grad:
            grad *= 1  # in place: only legal because the engine owns grad
            return (grad,)
        return (grad * 1,)


def probed(build, device, **backward_args):
    """``owns_grad`` as each Probe in ``build(x)`` saw it, newest first, and x.grad."""
    Probe.seen.clear()
    x = leaf([1.0, -2.0], device)
    build(x).backward(**backward_args)
    return Probe.seen, x.grad.numpy()


def test_engine_owns_the_seed_it_makes_and_fresh_gradients(device):
    seen, grad = probed(lambda x: (Probe.apply(x) * 3).sum(), device)
    assert seen == [True]  # Mul's backward made a new array: the engine owns it
    np.testing.assert_array_equal(grad, [3.0, 3.0])
    seen, grad = probed(lambda x: Probe.apply((x * 3).sum()), device)
    assert seen == [True]  # the seed 1 that backward() made
    np.testing.assert_array_equal(grad, [3.0, 3.0])
    seen, _ = probed(lambda x: Probe.apply(x).sum(), device)
    assert seen == [False]  # Sum's backward hands on a broadcast view of its seed


def test_callers_gradient_is_never_overwritten(device):
    seed = tt.tensor([1.0, 10.0], dtype=tt.float64, device=device)
    seen, grad = probed(lambda x: Probe.apply(x), device, grad=seed)
    assert seen == [False]
    np.testing.assert_array_equal(seed.numpy(), [1.0, 10.0])
    np.testing.assert_array_equal(grad, [1.0, 10.0])


class PassOn(Function):
    """The identity; its backward hands on the very array it receives."""

    def forward(self, x):
        return x * 1

    def backward(self, grad):
        return (grad,)


def test_passed_on_gradient_keeps_its_owner(device):
    seed = tt.tensor([1.0, 10.0], dtype=tt.float64, device=device)
    seen, grad = probed(lambda x: PassOn.apply(Probe.apply(x)), device, grad=seed)
    assert seen == [False]  # still the caller's array
    np.testing.assert_array_equal(seed.numpy(), [1.0, 10.0])
    seen, _ = probed(lambda x: PassOn.apply(Probe.apply(x)).sum(), device)
    assert seen == [False]  # a broadcast view (from sum), passed on
    seen, _ = probed(lambda x: PassOn.apply(Probe.apply(x) * 2) * 3, device, grad=seed)
    assert seen == [True]  # Mul's new array, passed on: still the engine's
    seen, _ = probed(lambda x: Probe.apply(Probe.apply(x) * 2) * 3, device, grad=seed)
    assert seen == [True, True]  # overwritten in place by the outer Probe, then still the engine's


def test_gradient_returned_for_two_inputs_is_not_owned(device):
    seen, grad = probed(lambda x: (Probe.apply(x * 2) + Probe.apply(x * 3)).sum(), device)
    assert seen == [False, False]  # Add hands the same array to both branches
    np.testing.assert_array_equal(grad, [5.0, 5.0])


def test_summed_gradient_is_owned(device):
    def build(x):
        y = Probe.apply(x * 1)
        return (y * 2 + y * 3).sum()  # y's gradient is the sum of two contributions

    seen, grad = probed(build, device)
    assert seen == [True]
    np.testing.assert_array_equal(grad, [5.0, 5.0])


class Fresh(Function):
    """``x * factor``; its backward returns a new array and records it."""

    made: list = []

    def forward(self, x, *, factor):
        self.factor = factor
        return x * factor

    def backward(self, grad):
        out = grad * self.factor
        Fresh.made.append(out)
        return (out,)


class Receives(Function):
    """The identity; records the gradient array its backward receives."""

    received: list = []

    def forward(self, x):
        return x * 1

    def backward(self, grad):
        Receives.received.append(grad)
        return (grad * 1,)


def test_later_shares_are_added_in_place_into_an_owned_pending_gradient(device):
    """y used three times: the first share (a new array) becomes y's pending gradient, and the engine adds the
    other two into it instead of making a new array for each sum."""
    Fresh.made.clear(), Receives.received.clear()
    x = leaf([1.0, -2.0], device)
    y = Receives.apply(x)
    (Fresh.apply(y, factor=2.0) + Fresh.apply(y, factor=3.0) + Fresh.apply(y, factor=4.0)).sum().backward()
    assert len(Fresh.made) == 3 and Receives.received[0] is Fresh.made[0], "added into the first share, in place"
    assert_grad(x, [9.0, 9.0])


def test_a_share_of_another_dtype_or_into_a_shared_pending_gradient_makes_a_new_sum(device):
    Fresh.made.clear(), Receives.received.clear()
    x = leaf([1.0, -2.0], device)
    y = Receives.apply(x)
    (y + Fresh.apply(y, factor=3.0)).sum().backward()  # the first share is Add's array, which the engine does not own
    assert Receives.received[0] is not Fresh.made[0]
    assert_grad(x, [4.0, 4.0])
    Fresh.made.clear(), Receives.received.clear()
    x32 = tt.tensor([1.0, 2.0], dtype=tt.float32, device=device, requires_grad=True)
    y = Receives.apply(x32)
    (Widens.apply(y) + Fresh.apply(y, factor=2.0)).sum().backward()  # Fresh first, then a float64 share: a new sum
    assert Receives.received[0] is not Fresh.made[0] and Receives.received[0].dtype == np.float64
    np.testing.assert_array_equal(x32.grad.numpy(), [3.0, 3.0])


class Widens(Function):
    """The identity; its backward returns a float64 gradient whatever the input's dtype."""

    def forward(self, x):
        return x * 1

    def backward(self, grad):
        return (grad.astype(np.float64),)


def test_retained_graph_never_hands_out_owned_gradients(device):
    Probe.seen.clear()
    x = leaf([1.0, -2.0], device)
    y = (Probe.apply(x) * 3).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert Probe.seen == [False, True]
    assert_grad(x, [6.0, 6.0])


def test_relu_backward_overwrites_only_owned_gradients(device):
    x = leaf([[1.0, -2.0], [-3.0, 4.0]], device)
    seed = tt.tensor([[5.0, 6.0], [7.0, 8.0]], dtype=tt.float64, device=device)
    x.relu().backward(seed)
    np.testing.assert_array_equal(seed.numpy(), [[5.0, 6.0], [7.0, 8.0]])
    assert_grad(x, [[5.0, 0.0], [0.0, 8.0]])
    x.grad = None
    (x * 2).relu().sum().backward()
    assert_grad(x, [[2.0, 0.0], [0.0, 2.0]])


def test_freed_graph_still_allows_new_graphs_from_same_leaves(device):
    x = leaf([1.0], device)
    (x * x).sum().backward()
    (x * x).sum().backward()
    assert_grad(x, [4.0])


# -- no_grad, detach, requires_grad propagation --------------------------------------------------

def test_no_grad_results_do_not_require_grad(device):
    x = leaf([1.0, 2.0], device)
    with tt.no_grad():
        y = x * 2 + 1
        z = Cube.apply(x)
    assert y.requires_grad is False and z.requires_grad is False
    np.testing.assert_allclose(y.numpy(), [3.0, 5.0])
    assert (x * 2).requires_grad is True, "grad mode must come back after the block"


def test_no_grad_works_as_a_decorator_with_or_without_parentheses(device):
    x = leaf([1.0, 2.0], device)

    @tt.no_grad
    def bare(t):
        return t * 2

    @tt.no_grad()
    def called(t):
        return t * 2

    for double in (bare, called):
        assert double(x).requires_grad is False
        assert_values = double(x).numpy()
        np.testing.assert_array_equal(assert_values, [2.0, 4.0])
    assert tt.is_grad_enabled() and (x * 2).requires_grad


def test_a_decorated_function_calling_itself_turns_recording_back_on():
    """Catches one shared instance that remembers only the innermost previous state: recording would stay off."""

    @tt.no_grad()
    def depth(n):
        assert not tt.is_grad_enabled()
        return depth(n - 1) + 1 if n else 0

    assert depth(3) == 3
    assert tt.is_grad_enabled()
    shared = tt.no_grad()
    with shared:
        with shared:
            pass
        assert not tt.is_grad_enabled()
    assert tt.is_grad_enabled()


def test_no_grad_builds_no_graph(device):
    """A result made under no_grad is a constant afterwards: using it adds no path to x."""
    x = leaf([1.0, 2.0], device)
    with tt.no_grad():
        y = x * x
    (x * y).sum().backward()
    assert_grad(x, [1.0, 4.0])


def test_no_grad_restores_mode_after_exception(device):
    x = leaf([1.0], device)
    with pytest.raises(ZeroDivisionError):
        with tt.no_grad():
            1 / 0
    assert (x * 2).requires_grad is True


def test_no_grad_nests(device):
    x = leaf([1.0], device)
    with tt.no_grad():
        with tt.no_grad():
            pass
        assert (x * 2).requires_grad is False
    assert (x * 2).requires_grad is True


def test_detach_cuts_graph(device):
    x = leaf([1.0, 2.0], device)
    y = x * 2
    z = y.detach() * 3 + y
    z.sum().backward()
    assert_grad(x, [2.0, 2.0])


def test_requires_grad_propagates(device):
    x = leaf([1.0], device)
    c = tt.tensor([2.0], dtype=tt.float64, device=device)
    assert (x + c).requires_grad and (c * x).requires_grad and (x**2).requires_grad
    assert x.exp().requires_grad and x.sum().requires_grad and x[0].requires_grad
    assert not (c + c).requires_grad and not c.exp().requires_grad
    assert not x.detach().requires_grad
    assert not (x > 0).requires_grad


def test_setting_requires_grad_on_leaf(device):
    x = tt.tensor([1.0, 2.0], dtype=tt.float64, device=device)
    x.requires_grad = True
    (x * x).sum().backward()
    assert_grad(x, [2.0, 4.0])


def test_leaf_gradient_takes_the_memory_order_of_its_leaf(device):
    """A column-major leaf gets a column-major ``.grad`` even from an operation whose gradient
    comes out row-major (MatMul's ``x^T g``), and keeps it when a second backward adds to it:
    an in-place optimizer update mixing the two orders is up to 40x slower. A row-major leaf stays row-major."""
    from tinytrain.backend import memory_order

    rng = np.random.default_rng(0)
    x = tt.tensor(rng.standard_normal((4, 3)), dtype="float64", device=device)
    column_major = tt.tensor(rng.standard_normal((3, 2)), dtype="float64", device=device, requires_grad=True)
    column_major.data = column_major._backend.xp.array(column_major.data, order="F")
    row_major = tt.tensor(np.ascontiguousarray(column_major.numpy()), device=device, requires_grad=True)
    expected = x.numpy().T @ np.ones((4, 2))
    for w, order in [(column_major, "F"), (row_major, "C")]:
        (x @ w).sum().backward()
        assert memory_order(w.grad.data) == order
        np.testing.assert_allclose(w.grad.numpy(), expected)
        (x @ w).sum().backward()
        assert memory_order(w.grad.data) == order
        np.testing.assert_allclose(w.grad.numpy(), 2 * expected)
