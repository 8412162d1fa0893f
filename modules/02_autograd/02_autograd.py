# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 02 — Automatic differentiation
#
# *One sitting, about 2.5 hours: the lesson, 12 functions to write, and the measurements.*
#
# Training a network means nudging every weight against the gradient of the loss.
# A network has millions of weights and the loss is a composition of thousands of
# simple operations, so we need every partial derivative at once, exactly, and
# about as cheaply as computing the loss itself. **Reverse-mode automatic
# differentiation** (backpropagation) does that.
#
# **You will**
# 1. write `Function`, the base of every operation: it computes a result and
#    remembers how it was computed (the *graph*);
# 2. write the backward rules that teach something new — multiply and power
#    (broadcasting, inputs that need no gradient), the matrix product, max (ties),
#    stable sigmoid and softmax, indexing (repeated picks) — and read the rest,
#    which are given;
# 3. write the engine that walks the graph backwards and accumulates gradients;
# 4. check every backward rule against numerical derivatives (`gradcheck`);
# 5. measure the engine's per-operation overhead against PyTorch.

# %%
import time

import numpy as np

import tinytrain as tt
from tinytrain import Tensor

# %% [markdown]
# ## 1. The chain rule, backwards
#
# Take $L = f(g(x))$ with $y = g(x)$. The chain rule says
# $\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y}\,\frac{\partial y}{\partial x}$.
# Reverse mode computes the left factor first: starting from
# $\frac{\partial L}{\partial L} = 1$ it walks from the loss towards the inputs,
# and every operation only has to answer one local question:
#
# > *given the gradient of the loss with respect to my output, what is the
# > gradient with respect to each of my inputs?*
#
# That answer is the operation's **backward rule**. For $z = x \cdot y$
# (elementwise): $\bar x = \bar z \cdot y$ and $\bar y = \bar z \cdot x$, where
# $\bar v$ is shorthand for $\partial L / \partial v$. For $z = x + y$ the
# gradient passes through unchanged: $\bar x = \bar y = \bar z$.
#
# Worked example: $x = 3$, $y = 4$, $z = x y = 12$, $L = z + x = 15$.
# Backwards: $\bar L = 1$; $\bar z = 1$ and $x$ gets $1$ from the `+`;
# $\bar x \mathrel{+}= \bar z \cdot y = 4$, $\bar y = \bar z \cdot x = 3$.
# So $\partial L/\partial x = 5$ and $\partial L/\partial y = 3$ —
# note that $x$ collects gradient from *both* places it is used.
#
# ## 2. `Function`: an operation that remembers
#
# Every operation is a subclass of `Function` with two methods on raw arrays:
#
# * `forward(self, *arrays, **params) -> array` computes the result and may save
#   what backward will need on `self` (the instance is the operation's memory,
#   often called its *context*);
# * `backward(self, grad) -> tuple` returns one gradient array per input (or
#   `None` for inputs that need none).
#
# `Function.apply(*tensors, **params)` runs `forward` on the tensors' arrays and
# wraps the result in a tensor. If gradients are enabled and any input requires
# them, the result remembers its creator in `_ctx`, and the creator remembers its
# `inputs`: that chain of references *is* the graph. Each recorded operation also
# gets a `sequence` number from a global counter — the engine in section 4 uses it.
# Under `no_grad()` nothing is recorded, which saves memory during evaluation.

# %% export="autograd"
"""Reverse-mode automatic differentiation.

Every operation is a :class:`Function`. ``Function.apply`` computes the result
and, when gradients are needed, links it to the inputs: the result's ``_ctx`` is
the Function, whose ``inputs`` are the argument tensors. :func:`backward` walks
that graph from the output to the leaves in reverse topological order, calling
each Function's ``backward`` and summing the gradients that meet at a tensor.
"""
import contextlib
import functools
import heapq
import itertools
from typing import Any, Callable, Sequence

from tinytrain.backend import memory_order

_grad_enabled = True
_creation_order = itertools.count()  # numbers recorded operations: inputs are always older


def is_grad_enabled() -> bool:
    """Whether new operations record the graph."""
    return _grad_enabled


class no_grad(contextlib.ContextDecorator):
    """Context manager (and decorator) that stops recording the graph.

    ``with no_grad():``, ``@no_grad()`` and, as in PyTorch, ``@no_grad``. One
    instance may be entered again before it exits (a decorated function that
    calls itself), so it keeps a stack of the states to restore, not one.
    """

    def __new__(cls, function: Callable[..., Any] | None = None) -> Any:
        if function is not None:  # used as @no_grad, without the parentheses
            return cls()(function)
        instance = super().__new__(cls)
        instance._previous = []
        return instance

    def __enter__(self) -> None:
        global _grad_enabled
        self._previous.append(_grad_enabled)
        _grad_enabled = False

    def __exit__(self, *exc_info: Any) -> None:
        global _grad_enabled
        _grad_enabled = self._previous.pop()


class Function:
    """One differentiable operation; an instance is one node of the graph.

    Subclasses implement ``forward(*arrays, **params) -> array`` and
    ``backward(grad) -> tuple`` (one array or ``None`` per input). Inside both,
    ``self.xp`` is the array namespace and ``self.backend`` the backend.
    ``backward`` may return new arrays, views, ``grad`` itself, an input's
    array or an array it saved on ``self``, but never an array that something
    else may change later (another tensor's data, a cache that could hand it out
    again while it is in use): the engine may keep a new array as a leaf's
    ``.grad`` without a copy. (The library's buffer cache, ``tinytrain.runtime.buffers``,
    is safe: it never hands out an array that anything else still refers to.)
    When ``self.owns_grad`` is true, nothing but the engine holds ``grad``, and
    ``backward`` may overwrite it and return it (see :func:`backward`).
    """

    output_backend = None  # set by an operation whose result lives on another device
    owns_grad = False  # set by the engine, per call of backward: whether it may overwrite `grad`

    @functools.cached_property
    def xp(self) -> Any:
        """The array namespace of the operation's device (NumPy, CuPy, ...)."""
        return self.backend.xp

    def forward(self, *arrays: Any, **params: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad: Any) -> tuple:
        raise NotImplementedError

    @classmethod
    def apply(cls, *inputs: Any, **params: Any) -> Any:
        """Run the operation on tensors and record it in the graph if needed.

        1. ``fn = cls()``; ``fn.backend`` is the first input's backend (``inputs[0]._backend``).
        2. ``fn.forward(*arrays, **params)`` on the inputs' arrays (``t.data``). If it
           raises ``ValueError`` (shapes that do not fit), raise a ``ValueError`` that
           names the operation and the shape of every input, e.g. ``"MatMul of tensors
           with shapes (2, 3) and (4,): ..."``. NumPy returns a scalar, not an array,
           for some 0-d results (``a.sum()``): wrap a 0-d result with the ``xp.asarray``
           of the result's backend (below), since a tensor always holds an array.
        3. The result's backend is ``fn.output_backend or fn.backend`` (only a move to
           another device sets ``output_backend``); the result is
           ``inputs[0]._make(data, that_backend, requires_grad)`` (Module 01's
           ``Tensor._make``). It requires grad
           when recording is on and any input requires grad; only then it gets
           ``_ctx = fn``, and ``fn`` gets ``inputs`` (the tensors) and
           ``sequence = next(_creation_order)``.
        """
        ### BEGIN SOLUTION
        fn = cls()
        fn.backend = backend = inputs[0]._backend
        fn.xp = backend.xp  # fills the cached property at once: forward and backward read it often
        try:
            data = fn.forward(*[t.data for t in inputs], **params)
        except ValueError as error:
            shapes = " and ".join(str(t.shape) for t in inputs)
            raise ValueError(f"{cls.__name__} of tensors with shapes {shapes}: {error}") from error
        out_backend = fn.output_backend or backend
        if data.ndim == 0:  # NumPy returns scalars for 0-d results; tensors hold arrays
            data = out_backend.xp.asarray(data)
        requires_grad = False
        if _grad_enabled:
            for t in inputs:
                if t.requires_grad:
                    requires_grad = True
                    break
        out = inputs[0]._make(data, out_backend, requires_grad)
        if requires_grad:
            fn.inputs = inputs
            fn.sequence = next(_creation_order)
            out._ctx = fn
        return out
        ### END SOLUTION


def sum_to_shape(grad: Any, shape: tuple[int, ...]) -> Any:
    """Undo broadcasting: sum ``grad`` over the axes that broadcasting stretched.

    If ``x`` of shape ``(3, 1)`` was broadcast to ``(2, 3, 4)``, every element of
    ``x`` was used 2 * 4 times, so its gradient is the sum over those copies.
    When ``grad`` already has ``shape``, return ``grad`` itself (no copy).
    The result is always an array of ``shape`` -- a 0-d array for ``()``, never
    the NumPy scalar that a sum over every axis gives (``keepdims=True`` avoids it).
    """
    ### BEGIN SOLUTION
    if grad.shape == shape:
        return grad
    leading = grad.ndim - len(shape)
    stretched = tuple(i + leading for i, n in enumerate(shape) if n == 1 and grad.shape[i + leading] != 1)
    return grad.sum(axis=tuple(range(leading)) + stretched, keepdims=True).reshape(shape)
    ### END SOLUTION


# %% [markdown]
# Check `sum_to_shape` on the example from its docstring: a `(3, 1)` array
# broadcast to `(2, 3, 4)` collects `2 * 4 = 8` ones per element.

# %% check=1
g = np.ones((2, 3, 4), dtype=np.float32)
summed = sum_to_shape(g, (3, 1))
assert summed.shape == (3, 1) and (summed == 8).all(), f"to (3, 1): expected [[8], [8], [8]], got {summed.tolist()}"
assert sum_to_shape(g, (4,)).tolist() == [6.0] * 4, f"to (4,): expected [6, 6, 6, 6], got {sum_to_shape(g, (4,))}"
assert sum_to_shape(g, ()).item() == 24.0, f"to (): expected 24, got {sum_to_shape(g, ())!r}"
assert sum_to_shape(g, (2, 3, 4)) is g, "to grad's own shape: expected grad itself (no copy)"
print("sum_to_shape OK")

# %% [markdown]
# ## 3. Operations, each with its backward rule
#
# Each rule below is the derivative you know from calculus, written for arrays.
# Three details matter for every binary operation:
#
# * **Broadcasting.** In `x + b` with `x: (batch, 10)` and `b: (10,)`, `b` was
#   used `batch` times; its gradient is `sum_to_shape(grad, b.shape)`.
# * **Skip what nobody needs.** `self.inputs[i].requires_grad` says whether input
#   `i` needs a gradient: the input images of a network never do, and skipping
#   them saves a matrix product per layer. Return `None` for such an input.
# * **Keep the dtype.** Every gradient has the dtype of `grad` (float32 stays
#   float32): NumPy's `zeros(shape)` is float64 unless you pass `dtype=`, and
#   float32 divided by an integer array (a count) becomes float64.
#
# `Add`, `Sub` and `Div` are given as worked examples. `Sub` and `Div` skip an
# input that needs no gradient where its gradient would cost work; `Add` hands
# `grad` to both, which costs nothing, because the engine (section 4) gives
# nothing to an input that does not require grad, whatever its operation
# returned. You write `Mul` and `Pow`, where each input's gradient needs the
# *other* input.
#
# ### Arithmetic
#
# | op | forward | backward |
# |----|---------|----------|
# | add | $a + b$ | $\bar a = \bar z,\ \bar b = \bar z$ |
# | sub | $a - b$ | $\bar a = \bar z,\ \bar b = -\bar z$ |
# | mul | $a b$ | $\bar a = \bar z b,\ \bar b = \bar z a$ |
# | div | $a / b$ | $\bar a = \bar z / b,\ \bar b = -\bar z a / b^2$ |
# | pow | $a^b$ | $\bar a = \bar z\, b a^{b-1},\ \bar b = \bar z\, a^b \ln a$ |
#
# Write each rule as the table does: $b a^{b-1}$ is $b \cdot a^b / a$ in exact
# arithmetic, but that form divides 0 by 0 at $a = 0$ (where `x ** 2` has slope
# 0). At $a = 0$ the exponent's rule $a^b \ln a$ is $0 \cdot (-\infty)$, NaN,
# here; PyTorch returns 0 there, a case that needs a learned exponent of a zero base.

# %% export="ops"
"""Every differentiable operation: a forward rule and a backward rule each.

Forward and backward work on raw backend arrays (``self.xp`` is NumPy or CuPy),
so the same code runs on every device.
"""
from typing import Any

from tinytrain.autograd import Function, sum_to_shape
from tinytrain.backend import bfloat16_operands, sum_dtype


class Add(Function):
    def forward(self, a: Any, b: Any) -> Any:
        self.shapes = a.shape, b.shape
        return a + b

    def backward(self, grad: Any) -> tuple:
        a_shape, b_shape = self.shapes
        return sum_to_shape(grad, a_shape), sum_to_shape(grad, b_shape)


class Sub(Function):
    def forward(self, a: Any, b: Any) -> Any:
        self.shapes = a.shape, b.shape
        return a - b

    def backward(self, grad: Any) -> tuple:
        a_shape, b_shape = self.shapes
        grad_b = sum_to_shape(-grad, b_shape) if self.inputs[1].requires_grad else None
        return sum_to_shape(grad, a_shape), grad_b


class Mul(Function):
    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        return a * b

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        a, b = self.a, self.b
        grad_a = sum_to_shape(grad * b, a.shape) if self.inputs[0].requires_grad else None
        grad_b = sum_to_shape(grad * a, b.shape) if self.inputs[1].requires_grad else None
        return grad_a, grad_b
        ### END SOLUTION


class Div(Function):
    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        return a / b

    def backward(self, grad: Any) -> tuple:
        a, b = self.a, self.b
        grad_a = sum_to_shape(grad / b, a.shape) if self.inputs[0].requires_grad else None
        grad_b = sum_to_shape(-grad * a / (b * b), b.shape) if self.inputs[1].requires_grad else None
        return grad_a, grad_b


class Neg(Function):
    def forward(self, a: Any) -> Any:
        return -a

    def backward(self, grad: Any) -> tuple:
        return (-grad,)


class Pow(Function):
    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        self.out = a**b
        return self.out

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        a, b = self.a, self.b
        grad_a = grad_b = None
        if self.inputs[0].requires_grad:
            grad_a = sum_to_shape(grad * b * a ** (b - 1), a.shape)
        if self.inputs[1].requires_grad:
            grad_b = sum_to_shape(grad * self.out * self.xp.log(a), b.shape)
        return grad_a, grad_b
        ### END SOLUTION


# %% [markdown]
# Each operation is usable right away through `apply` — the tensor operators
# (`x * y`) call exactly this. Check the worked example from section 1 by hand,
# calling the backward rules in reverse order:

# %% check=1
x = tt.tensor(3.0, requires_grad=True)
y = tt.tensor(4.0, requires_grad=True)
mul = Mul()
mul.backend, mul.inputs = x._backend, (x, y)
mul.forward(x.data, y.data)
got = mul.backward(np.ones((), dtype=np.float32))  # the engine hands backward arrays
assert got == (4.0, 3.0), f"Mul at x=3, y=4: expected (4, 3), got {got}"
add = Add()
add.backend, add.inputs = x._backend, (tt.ones(2, 3, requires_grad=True), tt.ones(3, requires_grad=True))
add.forward(np.ones((2, 3)), np.ones(3))
grad_a, grad_b = add.backward(np.ones((2, 3)))
assert grad_a.shape == (2, 3) and grad_b.shape == (3,) and (grad_b == 2).all(), \
    f"Add of (2, 3) and (3,): expected gradients of shapes (2, 3) and (3,) (b's all 2), got {grad_a.shape}, {grad_b}"
z = Mul.apply(x, y)
assert z.item() == 12.0 and z.requires_grad, f"Mul.apply(3, 4): expected 12 requiring grad, got {z!r}"
assert isinstance(z._ctx, Mul) and z._ctx.inputs == (x, y), "Mul.apply records its Mul as z._ctx, with inputs (x, y)"
print("arithmetic rules OK")

# %% [markdown]
# ### Matrix product
#
# For $Z = A B$ with $A: (n, k)$ and $B: (k, m)$:
# $\bar A = \bar Z B^\top$ (shape $(n, k)$) and $\bar B = A^\top \bar Z$
# (shape $(k, m)$) — check the shapes and the rule writes itself. `@` also
# accepts vectors (a 1-D operand acts as a row or column that is dropped from the
# result) and stacks of matrices with broadcast batch dimensions; we promote
# vectors to matrices, apply the 2-D rule batch-wise, and sum over broadcast batch
# dimensions.

# %% export="ops"
class MatMul(Function):
    def forward(self, a: Any, b: Any) -> Any:
        inner_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if a.ndim == 0 or b.ndim == 0 or a.shape[-1] != inner_b:
            raise ValueError(f"matmul needs a.shape[-1] == b.shape[-2], got {a.shape} @ {b.shape}")
        a, b, rounding = bfloat16_operands(a, b)  # a bfloat16 operand: the product runs in bfloat16 (Module 17)
        self.a, self.b = a, b
        out = a @ b
        return out if rounding is None else out.astype(rounding)

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        xp, a, b = self.xp, self.a, self.b
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        if b.ndim == 1:
            grad = xp.expand_dims(grad, -1)
        if a.ndim == 1:
            grad = xp.expand_dims(grad, -2)
        grad_a = grad_b = None
        if self.inputs[0].requires_grad:
            grad_a = sum_to_shape(grad @ xp.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
        if self.inputs[1].requires_grad:
            grad_b = sum_to_shape(xp.swapaxes(a2, -1, -2) @ grad, b2.shape).reshape(b.shape)
        return grad_a, grad_b
        ### END SOLUTION


# %% [markdown]
# ### Reductions and shapes
#
# `sum` copies the output gradient back to every element that was summed;
# `mean` does the same divided by the count. `max` sends the gradient to the
# element(s) that won — when several tie, each gets an equal share, so the total
# is the same as for a single winner. `reshape` and `transpose` only move
# numbers around, so their backward moves the gradient back. `Sum`, `Mean` and
# `Transpose` are given; you write `Max`.

# %% export="ops"
def _expand_reduced(xp: Any, grad: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
    """Re-insert the axes a reduction removed, so ``grad`` broadcasts against its input."""
    if axis is None or keepdims:
        return grad
    return xp.expand_dims(grad, axis)


class Sum(Function):
    def forward(self, a: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
        self.shape, self.axis, self.keepdims = a.shape, axis, keepdims
        added_in = sum_dtype(a.dtype)  # float32 for bfloat16 (Module 17), then rounded back
        out = a.sum(axis=axis, keepdims=keepdims, dtype=added_in)
        return out if added_in is None else out.astype(a.dtype)

    def backward(self, grad: Any) -> tuple:
        grad = _expand_reduced(self.xp, grad, self.axis, self.keepdims)
        return (self.xp.broadcast_to(grad, self.shape),)


class Mean(Function):
    def forward(self, a: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
        self.shape, self.axis, self.keepdims = a.shape, axis, keepdims
        added_in = sum_dtype(a.dtype)
        out = a.mean(axis=axis, keepdims=keepdims, dtype=added_in)
        self.count = a.size // max(out.size, 1)
        return out if added_in is None else out.astype(a.dtype)

    def backward(self, grad: Any) -> tuple:
        grad = _expand_reduced(self.xp, grad, self.axis, self.keepdims) / self.count
        return (self.xp.broadcast_to(grad, self.shape),)


class Max(Function):
    def forward(self, a: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
        self.a, self.axis, self.keepdims = a, axis, keepdims
        self.peak = a.max(axis=axis, keepdims=True)
        return self.peak if keepdims else self.peak.reshape(
            () if axis is None else tuple(n for i, n in enumerate(a.shape) if i not in axis)
        )

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        winners = self.a == self.peak
        counts = winners.sum(axis=self.axis, keepdims=True, dtype=grad.dtype)
        return (winners * (_expand_reduced(self.xp, grad, self.axis, self.keepdims) / counts),)
        ### END SOLUTION


class Reshape(Function):
    def forward(self, a: Any, shape: tuple[int, ...]) -> Any:
        self.shape = a.shape
        return a.reshape(shape)

    def backward(self, grad: Any) -> tuple:
        return (grad.reshape(self.shape),)


class Transpose(Function):
    def forward(self, a: Any, axes: tuple[int, ...]) -> Any:
        if sorted(ax % max(a.ndim, 1) for ax in axes) != list(range(a.ndim)):
            raise ValueError(f"axes {axes} are not a permutation of the {a.ndim} axes of shape {a.shape}")
        self.axes = axes
        return a.transpose(axes)

    def backward(self, grad: Any) -> tuple:
        inverse = [0] * len(self.axes)
        for position, axis in enumerate(self.axes):
            inverse[axis % len(self.axes)] = position
        return (grad.transpose(inverse),)


# %% check=1
a = tt.tensor([[1.0, 5.0, 5.0], [2.0, 0.0, 1.0]], requires_grad=True)
m = Max()
m.inputs = (a,)
m.backend = tt.get_backend("cpu")
m.forward(a.data, axis=(1,), keepdims=False)
got = m.backward(np.ones(2, dtype=np.float32))[0].tolist()
assert got == [[0, 0.5, 0.5], [1, 0, 0]], f"Max over axis 1: expected [[0, .5, .5], [1, 0, 0]] (ties share), got {got}"
s = Sum()
s.inputs = (a,)
s.backend = tt.get_backend("cpu")
s.forward(a.data, axis=(0,), keepdims=False)
got = s.backward(np.array([1.0, 2.0, 3.0]))[0].tolist()
assert got == [[1, 2, 3], [1, 2, 3]], f"Sum over axis 0: expected [[1, 2, 3], [1, 2, 3]], got {got}"
t = Transpose()
t.backend, t.inputs = tt.get_backend("cpu"), (tt.zeros(2, 3, 4, requires_grad=True),)
t.forward(np.zeros((2, 3, 4)), axes=(1, 2, 0))
got = t.backward(np.zeros((3, 4, 2)))[0].shape
assert got == (2, 3, 4), f"Transpose(1, 2, 0) of (2, 3, 4): expected a gradient of shape (2, 3, 4), got {got}"
print("reductions OK")

# %% [markdown]
# ### Elementwise functions
#
# | op | forward | backward |
# |----|---------|----------|
# | exp | $e^a$ | $\bar z\, e^a$ (reuse the output) |
# | log | $\ln a$ | $\bar z / a$ |
# | sqrt | $\sqrt a$ | $\bar z / (2\sqrt a)$ |
# | tanh | $\tanh a$ | $\bar z (1 - \tanh^2 a)$ |
# | sigmoid | $\sigma(a) = 1/(1+e^{-a})$ | $\bar z\, \sigma(a)(1-\sigma(a))$ |
# | relu | $z = \max(a, 0)$ | $\bar z \cdot [z > 0]$ (reuse the output) |
# | abs | $\lvert a\rvert$ | $\bar z\, \operatorname{sign}(a)$ |
# | clip | $\min(\max(a, lo), hi)$ | $\bar z \cdot [lo \le a \le hi]$ |
#
# At the kinks of relu and abs the derivative is undefined; like PyTorch we use 0.
#
# **Stability.** $1/(1+e^{-a})$ overflows for $a = -1000$ ($e^{1000}$ is inf).
# Writing it with $e^{-\lvert a\rvert}$, which is always in $(0, 1]$, never
# overflows: $\sigma(a) = 1/(1+e^{-\lvert a\rvert})$ for $a \ge 0$ and
# $e^{-\lvert a\rvert}/(1+e^{-\lvert a\rvert})$ for $a < 0$.
#
# The backward rules are given (they reuse the output, as the table says); you
# write the stable forward of `Sigmoid`.

# %% export="ops"
class Exp(Function):
    def forward(self, a: Any) -> Any:
        self.out = self.xp.exp(a)
        return self.out

    def backward(self, grad: Any) -> tuple:
        return (grad * self.out,)


class Log(Function):
    def forward(self, a: Any) -> Any:
        self.a = a
        return self.xp.log(a)

    def backward(self, grad: Any) -> tuple:
        return (grad / self.a,)


class Sqrt(Function):
    def forward(self, a: Any) -> Any:
        self.out = self.xp.sqrt(a)
        return self.out

    def backward(self, grad: Any) -> tuple:
        return (grad / (2 * self.out),)


class Tanh(Function):
    def forward(self, a: Any) -> Any:
        self.out = self.xp.tanh(a)
        return self.out

    def backward(self, grad: Any) -> tuple:
        return (grad * (1 - self.out * self.out),)


class Sigmoid(Function):
    def forward(self, a: Any) -> Any:
        ### BEGIN SOLUTION
        decay = self.xp.exp(-self.xp.abs(a))  # in (0, 1]: never overflows
        self.out = self.xp.where(a >= 0, 1, decay) / (1 + decay)
        return self.out
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        return (grad * self.out * (1 - self.out),)


class ReLU(Function):
    def forward(self, a: Any) -> Any:
        # clip, not maximum(a, 0): NumPy has no SIMD loop for a maximum against a scalar (3x slower).
        # Same values as PyTorch's relu, -0.0 and NaN included; integers keep their dtype via maximum.
        xp = self.xp
        self.out = xp.clip(a, 0, xp.inf) if a.dtype.kind == "f" else xp.maximum(a, 0)
        return self.out

    def backward(self, grad: Any) -> tuple:
        # out=grad: multiply in place when the engine owns grad (section 4); None makes a new array.
        return (self.xp.multiply(grad, self.out > 0, out=grad if self.owns_grad else None),)


class Abs(Function):
    def forward(self, a: Any) -> Any:
        self.sign = self.xp.sign(a)
        return self.xp.abs(a)

    def backward(self, grad: Any) -> tuple:
        return (grad * self.sign,)


class Clip(Function):
    def forward(self, a: Any, low: float | None, high: float | None) -> Any:
        inside = True
        if low is not None:
            inside = a >= low
        if high is not None:
            inside = inside & (a <= high)
        self.inside = inside
        return self.xp.clip(a, low, high)

    def backward(self, grad: Any) -> tuple:
        return (grad * self.inside,)


# %% [markdown]
# ### Softmax and log-softmax
#
# $\operatorname{softmax}(a)_i = e^{a_i} / \sum_j e^{a_j}$ turns scores into
# probabilities. $e^{1000}$ overflows, but softmax does not change when the same
# number is subtracted from every score, so we subtract the maximum first: the
# largest exponent is then $e^0 = 1$. Take the maximum along `axis`, one per
# softmax (`keepdims=True`): one maximum for the whole array would leave a row of
# much smaller scores with nothing but $e^{-2000} = 0$, and $0 / 0$. Log-softmax is
# $a_i - \log\sum_j e^{a_j}$ — computed as `shifted - log(sum(exp(shifted)))`,
# never as `log(softmax(a))`, which gives $\log 0 = -\infty$ for very negative
# scores.
#
# Backward, with $s = \operatorname{softmax}(a)$:
# $\bar a = s \odot (\bar s - \sum_j \bar s_j s_j)$; for log-softmax with output $o$:
# $\bar a = \bar o - e^{o} \sum_j \bar o_j$. You write `Softmax`; `LogSoftmax`
# is given, for comparison.

# %% export="ops"
class Softmax(Function):
    def forward(self, a: Any, axis: int) -> Any:
        ### BEGIN SOLUTION
        self.axis = axis
        exps = self.xp.exp(a - a.max(axis=axis, keepdims=True))
        self.out = exps / exps.sum(axis=axis, keepdims=True)
        return self.out
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        out = self.out
        return (out * (grad - (grad * out).sum(axis=self.axis, keepdims=True)),)
        ### END SOLUTION


class LogSoftmax(Function):
    def forward(self, a: Any, axis: int) -> Any:
        self.axis = axis
        shifted = a - a.max(axis=axis, keepdims=True)
        self.out = shifted - self.xp.log(self.xp.exp(shifted).sum(axis=axis, keepdims=True))
        return self.out

    def backward(self, grad: Any) -> tuple:
        return (grad - self.xp.exp(self.out) * grad.sum(axis=self.axis, keepdims=True),)


# %% check=1
logits = np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32)
sm = Softmax()
sm.backend = tt.get_backend("cpu")
probs = sm.forward(logits, axis=1)
assert np.isfinite(probs).all() and np.allclose(probs, [[1, 0, 0]]), f"softmax of [[1000, 0, -1000]]: got {probs}"
lsm = LogSoftmax()
lsm.backend = tt.get_backend("cpu")
logp = lsm.forward(logits, axis=1)
assert np.allclose(logp, [[0, -1000, -2000]]), f"log_softmax of [[1000, 0, -1000]]: got {logp}"
sg = Sigmoid()
sg.backend = tt.get_backend("cpu")
got = sg.forward(np.array([-1000.0, 0.0, 1000.0], dtype=np.float32))
assert np.allclose(got, [0, 0.5, 1]), f"sigmoid of [-1000, 0, 1000]: expected [0, 0.5, 1], got {got}"
print("stable softmax and sigmoid OK")

# %% [markdown]
# ### Indexing, joining, selecting, moving
#
# `x[idx]` picks elements; its backward puts the gradient back where they came
# from in a zero array of `x`'s shape. With an integer array the same element can
# be picked twice (`x[[0, 0]]`), and then both gradients must *add up*:
# `g[idx] = grad` would keep only one, so we use the backend's `scatter_add`
# (NumPy's `np.add.at`, which adds element by element; for ints and slices, which
# cannot repeat a position, the backend takes one vectorised add instead, just as
# fast as `g[idx] = grad`). `stack`/`concatenate` split the gradient back into
# pieces, `where` routes it to the branch that was chosen, and `to(device)` copies
# it back to the device the input came from. You write `GetItem`'s backward; the
# others are given.

# %% export="ops"
def _is_integer_array_index(index: Any) -> bool:
    """Whether ``index`` holds an integer array (which may repeat positions)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(getattr(part, "dtype", None) is not None and part.dtype.kind in "iu" for part in parts)


class GetItem(Function):
    def forward(self, a: Any, index: Any) -> Any:
        self.shape, self.index = a.shape, index
        return a[index]

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        full = self.xp.zeros(self.shape, dtype=grad.dtype)
        if _is_integer_array_index(self.index):
            self.backend.scatter_add(full, self.index, grad)
        else:
            full[self.index] = grad
        return (full,)
        ### END SOLUTION


class Stack(Function):
    def forward(self, *arrays: Any, axis: int) -> Any:
        out = self.xp.stack(arrays, axis=axis)
        self.axis = axis % out.ndim
        return out

    def backward(self, grad: Any) -> tuple:
        return tuple(self.xp.moveaxis(grad, self.axis, 0))


class Concatenate(Function):
    def forward(self, *arrays: Any, axis: int) -> Any:
        out = self.xp.concatenate(arrays, axis=axis)
        self.axis = axis % out.ndim
        self.ends = [0]
        for array in arrays:
            self.ends.append(self.ends[-1] + array.shape[self.axis])
        return out

    def backward(self, grad: Any) -> tuple:
        before = (slice(None),) * self.axis
        return tuple(grad[before + (slice(start, end),)] for start, end in zip(self.ends, self.ends[1:]))


class Where(Function):
    def forward(self, a: Any, b: Any, condition: Any) -> Any:
        self.shapes, self.condition = (a.shape, b.shape), condition
        return self.xp.where(condition, a, b)

    def backward(self, grad: Any) -> tuple:
        a_shape, b_shape = self.shapes
        zero = self.xp.zeros((), dtype=grad.dtype)
        return (
            sum_to_shape(self.xp.where(self.condition, grad, zero), a_shape),
            sum_to_shape(self.xp.where(self.condition, zero, grad), b_shape),
        )


class Cast(Function):
    def forward(self, a: Any, dtype: Any) -> Any:
        self.source_dtype = a.dtype
        return a.astype(dtype)

    def backward(self, grad: Any) -> tuple:
        return (grad.astype(self.source_dtype),)


class To(Function):
    """Copy to another device; the gradient is copied back."""

    def forward(self, a: Any, source: Any, target: Any) -> Any:
        self.source, self.output_backend = source, target
        return target.from_host(source.to_host(a))

    def backward(self, grad: Any) -> tuple:
        return (self.source.from_host(self.output_backend.to_host(grad)),)


# %% check=1
x = tt.tensor([1.0, 2.0, 3.0], requires_grad=True)
picked = GetItem.apply(x, index=np.array([0, 0, 2]))
picked.backward(tt.ones(3))
assert x.grad.numpy().tolist() == [2.0, 0.0, 1.0], "repeated indices must add their gradients"
print("indexing OK")

# %% [markdown]
# ## 4. The engine: walking the graph backwards
#
# `loss.backward()` must call an operation's `backward` only **after** all the
# gradient for its output has arrived — otherwise it would pass on a partial sum.
# Any order that visits every operation before the operations that produced its
# inputs (a *reverse topological order*) works. One comes for free: an operation's
# inputs always exist before it does, so their creators have smaller `sequence`
# numbers. Processing operations **newest first** is therefore a reverse
# topological order.
#
# The engine keeps a *heap* (Python's `heapq`, a priority queue) of operations
# whose output has received gradient, keyed by `-sequence` so the newest comes out
# first, and a dict from operation to the gradient collected for its output:
#
# 1. start with the output's operation and the seed gradient (1 for a scalar loss);
# 2. pop the newest operation, call its `backward`, and hand each input its share:
#    a **leaf** (a tensor nobody computed — your parameters) adds it to `.grad`;
#    a computed tensor adds it to its creator's entry, pushing the creator onto the
#    heap the first time;
# 3. repeat until the heap is empty.
#
# A `backward` may return `None` for an input even when that input requires a
# gradient (Module 13's gradient checkpointing does, for an input it only needs
# for ordering, or one that took no part in its result): the engine then hands
# that input nothing. If that input was computed, its operation may then receive
# no gradient at all; it has nothing to pass on and is skipped (the heap never
# gets it; an engine that sorts the whole graph first must skip it). And a `backward` may
# itself run `backward` on a graph of its own (checkpointing does that too), so
# keep the engine's heap and collected gradients in local variables of one call,
# never in globals.
#
# No recursion is involved, so a chain of 10,000 operations (an RNN unrolled over
# a long sequence, say) is no problem — a recursive walk would hit Python's
# recursion limit of about 1,000.
#
# Leaves *add* to what `.grad` already holds, so several backward calls accumulate
# until you reset `.grad = None` (or call an optimizer's `zero_grad()`). After
# `backward` each operation drops its saved arrays and its links: the graph is
# *freed*, and a second `backward()` through it is an error unless the first was
# called with `retain_graph=True`. Each operation saves different names (`a`,
# `out`, `probs`, ...), so drop them all at once: `vars(fn).clear()` empties the
# object's attributes, `inputs` and `sequence` included, and a missing `inputs`
# is then how the engine recognises a freed operation.
#
# **One copy fewer per parameter.** The first gradient a leaf receives becomes its
# `.grad`. Storing the array itself is only safe if nothing else holds it — an
# addition hands the *same* array to both of its inputs, and a view shares memory
# with the array it views; adding the next step's gradient into such a `.grad`
# would silently change the other holder too. Copying always is safe but costs a
# full pass over every parameter on every step (about a tenth of an MLP's
# training step). The given helper `_unshared` recognises the common case — a new array
# that the operation just computed, such as the `G^T X` of a weight gradient —
# and `_accumulate` then keeps it without copying. With `retain_graph=True` the
# operation keeps its saved arrays, so the engine never adopts then.
#
# **No new array where an old one will do.** The same test says when the gradient
# that the engine hands to an operation is the engine's alone: then
# `fn.owns_grad` is set, and `backward` may write its result into `grad` instead of
# a new array — ReLU does, with `out=`. A new array for every elementwise backward
# costs an allocation and a pass over memory that is not in the cache; NumPy code
# written by hand does such steps in place, and so can we, when it is safe. The
# engine itself does the same when a second share arrives for an operation whose
# pending gradient it owns (a tensor used twice, the three slices of a
# transformer's `qkv`): `pending += share` instead of a new `pending + share`,
# when both have one dtype (`+=` keeps the pending array's dtype, where `+`
# promotes: a float64 share added into a float32 array would be rounded to it).

# %% export="autograd"
def _freed_graph_error() -> RuntimeError:
    """What a backward through a graph that an earlier backward freed raises."""
    return RuntimeError(
        "trying to backward through the graph a second time (its saved arrays were freed by the first "
        "backward); pass retain_graph=True to the first backward() if you need to do this"
    )


def _unshared(grad: Any, fn: Function, grads: tuple, incoming: Any) -> bool:
    """Whether ``grad``, one of the ``grads`` that ``fn.backward(incoming)`` returned, is an array nobody else holds.

    True for a new array of ``fn``'s device, unless it is a view (it shares
    memory with the array it views: the incoming gradient or a saved array),
    returned for two inputs at once, or the data of one of ``fn``'s inputs. The
    ``incoming`` gradient itself, passed on unchanged (an addition) or
    overwritten in place (a ReLU), is unshared only if ``fn.owns_grad``.
    """
    if not fn.backend.is_array(grad):  # a NumPy scalar, say: `out=` cannot take it
        return False
    if grad is incoming:
        if not fn.owns_grad:
            return False
    elif grad.base is not None:  # a view
        return False
    holders = 0
    for other in grads:  # plain loops: this runs for every gradient on every step
        if other is grad:
            holders += 1
    for t in fn.inputs:
        if t.data is grad:
            return False
    return holders == 1


def _accumulate(leaf: Any, grad: Any, unshared: bool = False) -> None:
    """Add ``grad`` into ``leaf.grad``.

    On first use ``leaf.grad`` takes ``grad`` itself when it is ``unshared`` (see
    :func:`_unshared`) and has the leaf's dtype and memory order, otherwise a
    copy: a shared array would change under its other holder when the next
    backward adds into it, and a gradient stored in another order than its
    parameter would slow down every elementwise update of the optimizer.
    Adopting saves a copy of every parameter's gradient on every training step.
    """
    if leaf.grad is not None:
        leaf.grad.data += grad
        return
    order = memory_order(leaf.data)
    if unshared and grad.dtype == leaf.data.dtype and memory_order(grad) == order:
        leaf.grad = leaf._make(grad, leaf._backend)
    else:
        leaf.grad = leaf._make(leaf._backend.xp.array(grad, dtype=leaf.dtype, order=order), leaf._backend)


def backward(tensor: Any, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d(tensor)/d(leaf), weighted by ``grad``, into every leaf's ``.grad``.

    ``grad`` defaults to 1 for a single-element ``tensor``; for any other shape
    it must be given, with the tensor's shape. It is cast to the tensor's dtype, as in
    PyTorch (``Tensor.backward`` turns an array or a list straight into a tensor of
    that dtype: through the default float32 it would round a float64 gradient).
    A ``None`` from an operation's ``backward`` gives that input nothing, whether or
    not it requires grad (an operation that so receives no gradient at all is
    skipped), and an input that does not require grad gets nothing, whatever
    ``backward`` returned.
    An operation's ``backward`` that returns anything but a tuple raises
    ``TypeError`` naming the operation, the word "tuple" (what it must return)
    and what it returned.
    Re-entrant: an operation's ``backward`` may call ``backward`` itself.
    Reaching an operation that an earlier backward freed raises
    ``_freed_graph_error()``.

    Before it calls ``fn.backward``, the engine sets ``fn.owns_grad``: for the
    output's operation, ``owned`` (the engine made the seed); for any other,
    whether the gradient collected for it is the engine's alone -- the one
    gradient an operation handed it, when ``_unshared`` says so, or a sum of
    several. A further share is added in place (``pending += share``) only into a
    pending array the engine owns, of the share's dtype; otherwise the sum
    is a new array (``pending + share``): the pending array may be shared -- an
    addition hands one array to both of its inputs. A leaf gets its share through
    ``_accumulate(leaf, share, unshared)``. With ``retain_graph=True`` nothing
    an operation returns counts as unshared: it keeps what it saved.
    """
    if not tensor.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad: no input had requires_grad=True, "
                           "or it was computed under no_grad()")
    owned = grad is None  # the seed is the engine's own only when it makes it
    if grad is None:
        if tensor.size != 1:
            raise RuntimeError(f"backward() without a grad argument needs a single-element tensor, got shape "
                               f"{tensor.shape}; pass grad= with that shape")
        grad = tensor._backend.xp.ones_like(tensor.data)
    else:
        grad = tensor._operand(grad).data.astype(tensor.dtype, copy=False)  # same device, or RuntimeError
        if grad.shape != tensor.shape:
            raise ValueError(f"backward(grad): grad has shape {grad.shape} but the tensor has shape {tensor.shape}")
    if tensor._ctx is None:
        _accumulate(tensor, grad)
        return
    ### BEGIN SOLUTION
    root = tensor._ctx
    if not hasattr(root, "inputs"):
        raise _freed_graph_error()
    root.owns_grad = owned
    output_grads = {root: grad}
    newest_first = [(-root.sequence, root)]
    while newest_first:
        fn = heapq.heappop(newest_first)[1]
        try:
            inputs = fn.inputs
        except AttributeError:  # freed by an earlier backward through a shared part of the graph
            raise _freed_graph_error() from None
        incoming = output_grads.pop(fn)
        grads = fn.backward(incoming)
        if not isinstance(grads, tuple):  # zip would hand a bare array's rows to the inputs
            raise TypeError(f"{type(fn).__name__}.backward must return a tuple with one gradient (or None) per "
                            f"input, got {type(grads).__name__}")
        for parent, parent_grad in zip(inputs, grads):
            if parent_grad is None or not parent.requires_grad:
                continue
            # With retain_graph, fn keeps its saved arrays: never adopt or overwrite what it returns.
            unshared = not retain_graph and _unshared(parent_grad, fn, grads, incoming)
            creator = parent._ctx
            if creator is None:  # a leaf
                _accumulate(parent, parent_grad, unshared)
            elif creator in output_grads:
                pending = output_grads[creator]
                if creator.owns_grad and pending.dtype == parent_grad.dtype:
                    pending += parent_grad  # the engine's own array: add in place, no new array
                else:
                    output_grads[creator] = pending + parent_grad
                    creator.owns_grad = True  # the sum is a new array
            else:
                if not hasattr(creator, "inputs"):  # freed: y = x * 2; y.sum().backward(); (y * 3).sum().backward()
                    raise _freed_graph_error()
                output_grads[creator] = parent_grad
                creator.owns_grad = unshared
                heapq.heappush(newest_first, (-creator.sequence, creator))
        if not retain_graph:
            vars(fn).clear()  # frees saved arrays and the links to the inputs
    ### END SOLUTION


# %% check=1
x = tt.tensor(3.0, requires_grad=True)
y = tt.tensor(4.0, requires_grad=True)
loss = x * y + x  # the worked example
backward(loss)
assert (x.grad.item(), y.grad.item()) == (5.0, 3.0), f"expected (5, 3), got {(x.grad.item(), y.grad.item())}"
a = tt.tensor([1.0, 2.0], requires_grad=True)
shared = a * a  # two operations use it: both shares must arrive before it passes its gradient on
backward((shared * 3 + shared).sum())
assert a.grad.numpy().tolist() == [8.0, 16.0], f"sum(3 a^2 + a^2) at a = [1, 2]: expected [8, 16], got {a.grad}"
chain = x
for _ in range(10_000):
    chain = chain * 1.0
backward(chain)
assert x.grad.item() == 6.0, "10,000-op chain: gradients accumulate on the leaf (5 + 1)"
try:
    backward(loss)
except RuntimeError as error:
    assert "second time" in str(error)
else:
    raise AssertionError("a second backward through a freed graph must raise")
print("engine OK")

# %% [markdown]
# ## 5. Gradient checking
#
# How do you know a backward rule is right? Compare it with the definition of the
# derivative. The **central difference**
# $$\frac{\partial f}{\partial x_i} \approx \frac{f(x + \epsilon e_i) - f(x - \epsilon e_i)}{2\epsilon}$$
# has error $O(\epsilon^2)$; in float64 with $\epsilon = 10^{-6}$ it agrees with a
# correct analytic gradient to about 8 digits (float32 has only 7 digits in
# total, which is why checks run in float64).
#
# For an output with many elements we check one random projection
# $L = \sum_k r_k\, f(x)_k$ (fixed random $r$): a wrong rule for any element almost
# surely changes $L$'s gradient. One backward call gives the analytic gradient;
# two forward calls per input element give the numerical one.

# %% export="autograd"
class GradcheckError(AssertionError):
    """An analytic gradient disagrees with the central-difference estimate."""


def gradcheck(
    fn: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3
) -> bool:
    """Compare autograd's gradients of ``fn(*inputs)`` with central differences.

    Checks every input tensor with ``requires_grad``; they must be float64.
    An element passes when ``|analytic - numeric| <= atol + rtol * |numeric|`` (a nan
    on either side never does);
    an input that got no gradient (``.grad`` stays ``None``) has analytic
    gradient 0. Every input's values are put back afterwards, on any device.
    Returns True, or raises :class:`GradcheckError` naming the worst mismatch
    (the largest excess over its tolerance): its input's position in
    ``inputs``, its index as a tuple and both values, e.g. ``gradient of input
    1 at index (1, 0): autograd gives 0.314159, central differences give 0.251327``
    (each value with 6 significant digits, ``f"{value:.6g}"``).
    """
    import numpy as np  # host-side bookkeeping only: perturbations and the comparison

    inputs = list(inputs)
    checked = [i for i, x in enumerate(inputs) if getattr(x, "requires_grad", False)]
    if not checked:
        raise ValueError("gradcheck: no input has requires_grad=True")
    for i in checked:
        if inputs[i].dtype != np.float64:
            raise TypeError(f"gradcheck needs float64 inputs; input {i} has dtype {inputs[i].dtype}")
        inputs[i].grad = None
    out = fn(*inputs)
    weights = np.random.default_rng(0).standard_normal(out.shape)
    weights_on_device = out._backend.from_host(weights.astype(out.dtype))
    out.backward(out._make(weights_on_device, out._backend))

    def projected_output() -> float:
        with no_grad():
            return float((fn(*inputs).data * weights_on_device).sum())

    ### BEGIN SOLUTION
    worst = (0.0, None)
    for i in checked:
        x = inputs[i]
        values = x._backend.to_host(x.data).copy()
        analytic = np.zeros_like(values) if x.grad is None else x._backend.to_host(x.grad.data)
        for j in range(values.size):
            original = values.flat[j]
            estimates = []
            for step in (eps, -eps):
                values.flat[j] = original + step
                x.data = x._backend.from_host(values)
                estimates.append(projected_output())
            values.flat[j] = original
            numeric = (estimates[0] - estimates[1]) / (2 * eps)
            excess = abs(analytic.flat[j] - numeric) - (atol + rtol * abs(numeric))
            if excess != excess:  # nan: no tolerance holds it (a comparison with nan is always False)
                excess = float("inf")
            if excess > worst[0]:
                worst = (excess, (i, np.unravel_index(j, values.shape), analytic.flat[j], numeric))
        x.data = x._backend.from_host(values)
    if worst[1] is not None:
        i, index, analytic_value, numeric = worst[1]
        raise GradcheckError(
            f"gradient of input {i} at index {tuple(int(k) for k in index)}: autograd gives {analytic_value:.6g}, "
            f"central differences give {numeric:.6g} (tolerance atol={atol} + rtol={rtol} * |numeric|)"
        )
    return True
    ### END SOLUTION


# %% check=2
def check(f, *shapes):
    tensors = [tt.randn(*s, dtype="float64", requires_grad=True) for s in shapes]
    return gradcheck(f, tensors)


assert check(lambda a, b: Div.apply(Mul.apply(a, b), Add.apply(b, b)), (3, 4), (4,))
assert check(lambda a, b: MatMul.apply(a, b), (2, 3), (3, 5))
assert check(lambda a: Softmax.apply(a, axis=1), (3, 4))
assert check(lambda a: Max.apply(a, axis=(0,), keepdims=False), (4, 3))
assert check(lambda a: Sum.apply(Exp.apply(a), axis=None, keepdims=False), (2, 3))


class WrongSquare(Function):
    def forward(self, a):
        self.a = a
        return a * a

    def backward(self, grad):
        return (grad * self.a,)  # should be 2 * a


try:
    gradcheck(lambda a: WrongSquare.apply(a), [tt.randn(3, dtype="float64", requires_grad=True)])
except GradcheckError as error:
    print("caught the wrong rule:", error)
else:
    raise AssertionError("gradcheck must reject a wrong backward rule")

# %% [markdown]
# ## 6. `no_grad`, `detach` and `requires_grad`
#
# * An operation's result requires grad when any input does (and recording is on).
# * `with tt.no_grad():` records nothing — use it for evaluation and for updating
#   weights, which must not become part of the next step's graph.
# * `t.detach()` shares `t`'s values but starts a new leaf with no history.

# %%
w = tt.randn(3, requires_grad=True)
print((w * 2).requires_grad)
with tt.no_grad():
    print((w * 2).requires_grad)
print((w.detach() * 2).requires_grad)

# %% [markdown]
# ## 7. Systems: how much does the bookkeeping cost?
#
# For big matrices the arithmetic dominates. For small arrays, every operation
# pays a fixed Python cost: creating a `Function`, a `Tensor`, recording the
# graph, and later calling `backward`. Measure it on 200 chained elementwise
# operations on 64 numbers; `benchmarks/autograd_overhead.py` runs the same
# against PyTorch. The operators and `.backward()` below run the installed
# package: the reference until you `tinytrain export 02`, your code after.

# %%
def chained_ops(x):
    for _ in range(40):  # five operations per round: 200 in all
        x = ((x * 1.01 + 0.1).tanh() - 0.05) * 0.99
    return x.sum()


x = tt.randn(64, requires_grad=True)
for _ in range(3):
    chained_ops(x).backward()
runs = 20
start = time.perf_counter()
for _ in range(runs):
    chained_ops(x).backward()
per_op = (time.perf_counter() - start) / runs / 200
print(f"forward + backward: {per_op * 1e6:.1f} µs per operation")

# %% [markdown]
# ## How PyTorch does it
#
# PyTorch's `torch.autograd.Function` has the same shape — `forward(ctx, ...)`,
# `backward(ctx, grad_output)`, `ctx.save_for_backward` — and `torch.autograd.
# gradcheck` performs the same central-difference test (it insists on float64
# too). Its engine is written in C++. Like ours it sorts nothing in advance: it
# counts how many gradients each operation still waits for, runs an operation
# once all have arrived, and among those ready prefers the newest (by sequence
# numbers, as our heap does). It frees saved tensors after backward unless
# `retain_graph=True`, exactly as ours.
#
# ## Summary
#
# * Reverse mode needs one local rule per operation: output gradient in, input
#   gradients out. Broadcast inputs get `sum_to_shape(grad, shape)`.
# * The engine walks a reverse topological order (iteratively: no recursion
#   limit), sums gradients that meet at a tensor, accumulates into leaves, and
#   frees the graph.
# * `gradcheck` compares every rule with central differences in float64.
