# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 03 — Activation functions
#
# *One sitting, about 1 hour: the lesson, 8 functions to write, and the measurements.*
#
# A neural network alternates two kinds of steps: a *linear* map (`x @ W + b`,
# Module 04) and an elementwise *nonlinearity*, the **activation function**. The
# linear maps hold the weights; the activations are what let a stack of them
# represent anything more interesting than a single matrix.
#
# **You will**
# 1. see why a network without activations collapses into one linear map;
# 2. meet ReLU, sigmoid and tanh, and what their derivatives do to gradients in a
#    deep network (saturation, vanishing gradients, dead units);
# 3. write GELU as an autograd `Function` with its own backward rule;
# 4. write the functional forms `relu`, `sigmoid`, `tanh`, `gelu`, `softmax` and
#    `log_softmax` that the rest of the library imports from
#    `tinytrain.nn.functional`;
# 5. turn scores into probabilities with softmax — stably;
# 6. measure what each activation costs in time and in memory kept for backward.
#
# The forward and backward rules of relu, sigmoid, tanh, softmax and log-softmax
# are already operations (you wrote them in Module 02); here you learn *why*
# each exists and give them their public names.

# %%
import math
import time

import matplotlib.pyplot as plt
import numpy as np

import tinytrain as tt

# %% [markdown]
# ## 1. Why a nonlinearity?
#
# Two linear layers without anything between them are one linear layer:
# $(x W_1) W_2 = x (W_1 W_2)$. However many you stack, the network can only draw
# straight decision boundaries — it cannot even learn XOR. Put a nonlinear $f$
# between them, $f(x W_1) W_2$, and the composition is no longer one matrix;
# with enough hidden units it can approximate any continuous function on a
# bounded region (the *universal approximation theorem*, Cybenko 1989; Hornik
# 1991).
#
# Check the collapse numerically:

# %%
tt.manual_seed(0)
x = tt.randn(5, 3)
w1, w2 = tt.randn(3, 4), tt.randn(4, 2)
print("two layers == one layer:", np.allclose(((x @ w1) @ w2).numpy(), (x @ (w1 @ w2)).numpy(), atol=1e-5))
print("with a relu between:    ", np.allclose(((x @ w1).relu() @ w2).numpy(), (x @ (w1 @ w2)).numpy(), atol=1e-5))

# %% [markdown]
# ## 2. ReLU, sigmoid and tanh
#
# | name | $f(x)$ | $f'(x)$ | range |
# |------|--------|---------|-------|
# | ReLU | $\max(x, 0)$ | $1$ if $x > 0$ else $0$ | $[0, \infty)$ |
# | sigmoid | $\sigma(x) = \dfrac{1}{1 + e^{-x}}$ | $\sigma(x)(1 - \sigma(x)) \le \tfrac14$ | $(0, 1)$ |
# | tanh | $\tanh x = 2\sigma(2x) - 1$ | $1 - \tanh^2 x \le 1$ | $(-1, 1)$ |
#
# * **Sigmoid** squashes any number into a probability; it is the right output
#   for a yes/no question (Module 06's binary cross-entropy). Inside a network
#   it is a poor choice: its slope is at most $\tfrac14$, and far from 0 it is
#   nearly flat — the unit **saturates**.
# * **tanh** is a sigmoid stretched to $(-1, 1)$ and centred on 0; its slope at 0
#   is 1, so gradients pass through small activations unchanged.
# * **ReLU** (Nair & Hinton 2010) is the default for hidden layers: it costs one
#   comparison, and its slope is exactly 1 wherever the unit is active, so it
#   never saturates for positive inputs.
#
# Each of the three is a one-line wrapper around the tensor method (and so the
# operation) you wrote in Module 02. The functional forms exist so that model
# code reads like the math — `F.relu(x @ w)` — and matches PyTorch's
# `torch.nn.functional`.

# %% export="nn/activations"
"""Activation functions in functional form: ``relu(x)``, ``gelu(x)``, ``softmax(x, axis)``, ...

``tinytrain.nn.functional`` re-exports them; the layer classes (``nn.ReLU``, ...)
in :mod:`tinytrain.nn.layers` call them. Most are thin wrappers around tensor
methods whose operations live in :mod:`tinytrain.ops`; GELU has its own
:class:`~tinytrain.autograd.Function` here. Every function computes on its
input's device and returns a new tensor: the input stays unchanged.
"""
import math
from typing import Any

from tinytrain.autograd import Function
from tinytrain.tensor import Tensor


def relu(x: Tensor) -> Tensor:
    """Rectified linear unit, elementwise: ``max(x, 0)``.

    The derivative is 1 where ``x > 0`` and 0 elsewhere (0 at the kink, as in PyTorch).
    """
    ### BEGIN SOLUTION
    return x.relu()
    ### END SOLUTION


def sigmoid(x: Tensor) -> Tensor:
    """Logistic sigmoid, elementwise: ``1 / (1 + exp(-x))``, in (0, 1) (in float32, far
    from 0 it rounds to exactly 0.0 or 1.0).

    Computed without overflow for any finite ``x``; derivative ``s * (1 - s)``.
    """
    ### BEGIN SOLUTION
    return x.sigmoid()
    ### END SOLUTION


def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent, elementwise: ``(e^x - e^-x) / (e^x + e^-x)``, in (-1, 1).

    Exactly +-1 for large ``|x|``, never nan (that formula as written gives
    inf / inf = nan in float32 beyond ``|x|`` of about 44), and as precise as
    ``np.tanh`` near 0, where ``tanh(x)`` is about ``x``: that formula and
    ``2 * sigmoid(2x) - 1`` subtract nearly equal numbers there and lose digits
    (``tanh(1e-4)`` comes out with a relative error of 1.7e-4 in float32). Derivative ``1 - tanh(x)**2``.
    """
    ### BEGIN SOLUTION
    return x.tanh()
    ### END SOLUTION


# %% check=1
x = tt.tensor([-2.0, 0.0, 3.0], requires_grad=True)
assert relu(x).numpy().tolist() == [0.0, 0.0, 3.0]
relu(x).sum().backward()
assert x.grad.numpy().tolist() == [0.0, 0.0, 1.0], "relu's slope: 0 for x <= 0, 1 for x > 0"
assert np.allclose(sigmoid(x).numpy(), 1 / (1 + np.exp([2.0, 0.0, -3.0])))
assert np.allclose(tanh(x).numpy(), np.tanh([-2.0, 0.0, 3.0]))
big = tt.tensor([-1000.0, 1000.0])
assert sigmoid(big).numpy().tolist() == [0.0, 1.0] and tanh(big).numpy().tolist() == [-1.0, 1.0]
small = tt.tensor([1e-4])
assert np.allclose(tanh(small).numpy(), np.tanh(small.numpy()), rtol=1e-6, atol=0), \
    f"tanh(1e-4) should keep its digits (np.tanh gives {np.tanh(small.numpy())[0]:.8g}), " \
    f"got {tanh(small).numpy()[0]:.8g}"
print("relu, sigmoid, tanh OK")

# %% [markdown]
# ### Plot them, with derivatives from autograd
#
# We do not need to code the derivatives for the plot: `y.sum().backward()`
# leaves $f'(x_i)$ in `x.grad` (each $y_i$ depends only on $x_i$).

# %%
def value_and_slope(f, xs):
    """f(xs) and f'(xs) for an elementwise f, both as NumPy arrays."""
    x = tt.tensor(xs, requires_grad=True)
    y = f(x)
    y.sum().backward()
    return y.numpy(), x.grad.numpy()


xs = np.linspace(-5, 5, 401)
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for name, f in [("relu", relu), ("sigmoid", sigmoid), ("tanh", tanh)]:
    y, slope = value_and_slope(f, xs)
    left.plot(xs, y, label=name)
    right.plot(xs, slope, label=name)
left.set_title("f(x)")
right.set_title("f'(x)")
for ax in (left, right):
    ax.axhline(0, color="gray", lw=0.5)
    ax.axvline(0, color="gray", lw=0.5)
    ax.legend()
plt.show()

# %% [markdown]
# Read the right-hand plot: sigmoid's slope never exceeds 0.25 and is almost 0
# beyond $|x| > 5$; tanh's peaks at 1 but also dies off; ReLU's is a step.
#
# ### Vanishing gradients
#
# Backpropagation multiplies one local slope per layer. Through 20 sigmoid layers
# the gradient picks up a factor of at most $0.25^{20} \approx 10^{-12}$ from the
# activations alone. Measure it: push a batch through 20 random linear layers
# (weights scaled to keep the signal's size, Module 04 explains the scale) and
# look at the gradient that reaches the input.

# %%
def input_gradient(activation, depth=20, width=256, seed=0):
    """Mean |d(loss)/d(input)| of a random `depth`-layer network."""
    tt.manual_seed(seed)
    x = tt.randn(64, width, requires_grad=True)
    gain = 2.0 if activation is relu else 1.0  # He vs. Xavier scaling (Module 04)
    h = x
    for _ in range(depth):
        h = activation(h @ (tt.randn(width, width) * math.sqrt(gain / width)))
    (h * tt.randn(*h.shape)).sum().backward()
    return np.abs(x.grad.numpy()).mean()


for name, f in [("sigmoid", sigmoid), ("tanh", tanh), ("relu", relu)]:
    print(f"{name:8s} mean |gradient| at the input after 20 layers: {input_gradient(f):.1e}")

# %% [markdown]
# With sigmoid the gradient that reaches the input is about $10^{12}$ times
# smaller than with ReLU: the first layers effectively do not learn. This is the *vanishing gradient* problem
# that held deep networks back until ReLU and careful initialisation
# (Glorot & Bengio 2010; He et al. 2015).
#
# ### Dead ReLUs
#
# ReLU's flat half has its own failure. A unit whose pre-activation is negative
# for *every* input outputs 0 and passes back a gradient of 0 — so its weights
# never change again. A large learning-rate step that pushes a bias far negative
# can kill a unit for good. Here one unit has bias $-10$:

# %%
tt.manual_seed(0)
inputs = tt.randn(1000, 3)
w = tt.randn(3, 2, requires_grad=True)
b = tt.tensor([0.0, -10.0], requires_grad=True)
relu(inputs @ w + b).sum().backward()
print("active fraction per unit:", ((inputs @ w + b) > 0).numpy().mean(axis=0))
print("gradient of the bias:    ", b.grad.numpy())

# %% [markdown]
# The second unit gets exactly zero gradient from all 1000 inputs. Variants such
# as *leaky ReLU* ($\max(x, 0.01x)$) keep a small slope on the left for this
# reason; GELU, next, is smooth and slightly negative there.
#
# ## 3. GELU
#
# The **Gaussian error linear unit** (Hendrycks & Gimpel 2016) is the activation
# of BERT, GPT and most transformers:
#
# $$\operatorname{GELU}(x) = x\,\Phi(x) = \frac{x}{2}\left(1 + \operatorname{erf}\frac{x}{\sqrt 2}\right),$$
#
# where $\Phi$ is the standard normal CDF: the input scaled by the probability
# that a standard normal is below it. It looks like a smoothed ReLU with a small
# dip (minimum about $-0.17$ at $x \approx -0.75$).
#
# NumPy has no vectorised `erf`, and tinytrain depends on NumPy only, so we use
# the paper's tanh approximation — PyTorch's `F.gelu(x, approximate="tanh")`:
#
# $$\operatorname{GELU}(x) \approx \tfrac12 x \bigl(1 + \tanh u\bigr), \qquad u = \sqrt{2/\pi}\,\bigl(x + 0.044715\,x^3\bigr).$$
#
# How close is it? Compare with the exact formula, using Python's scalar
# `math.erf`:

# %%
grid = np.linspace(-8, 8, 160_001)
exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in grid])
approx = 0.5 * grid * (1 + np.tanh(math.sqrt(2 / math.pi) * (grid + 0.044715 * grid**3)))
worst = np.abs(exact - approx).argmax()
print(f"max |exact - tanh approximation| = {abs(exact - approx)[worst]:.2e} at x = {grid[worst]:.2f}")

# %% [markdown]
# About $5 \cdot 10^{-4}$ at most: far below the noise of training, which is why
# GPT-2 used this form.
#
# ### The backward rule
#
# The approximation keeps the exact form's shape, $x$ times a probability:
# $\operatorname{GELU}(x) \approx x\,p$ with $p = \tfrac12(1 + t)$, $t = \tanh u$,
# which stands in for $\Phi(x)$. With $u' = \sqrt{2/\pi}\,(1 + 3 \cdot 0.044715\,x^2)$
# and $t' = (1 - t^2)\,u'$, where $1 - t^2 = (1 - t)(1 + t) = 4p(1 - p)$, its
# derivative is $p' = \tfrac12 t' = 2p(1 - p)\,u'$, and the product rule gives
#
# $$\frac{d}{dx}\operatorname{GELU}(x) = p + x\,p' = p + 2x\,p\,(1 - p)\,u'
#   \;=\; \tfrac12 (1 + t) + \tfrac12 x\,(1 - t^2)\,u'.$$
#
# Two implementation choices:
#
# * **What to save for backward.** The rule needs $x$ and $p$. Saving $p$ costs
#   one more array the size of the input; recomputing it from $x$ costs the
#   clip, the cubic and the exponential again. PyTorch recomputes: its fused kernel does
#   that in registers, nearly for free. In NumPy it is eight passes over memory, a
#   third of GELU's time forward and backward, so keep $p$ next to $x$
#   (`self.p = p`) and pay 4 bytes per element. The forward is then one product,
#   `x * p`: written as $\tfrac12 x (1 + t)$ from $t$ it takes three passes, and a
#   GPT training step 2-3% longer. (Recomputing is as right: the
#   checks grade that you keep the input array itself, never a copy or the
#   clipped $x$, and at most $p$ or $t$ besides.)
# * **Overflow.** $x^3$ overflows float32 once $|x| > 7 \cdot 10^{12}$: NumPy
#   warns, and backward's $p\,(1 - p)\,u'$ becomes $0 \cdot \infty =$ `nan`.
#   But $\tanh u$ is already exactly $\pm 1$ in float32 and float64 once
#   $|x| > 10$ ($u > 43$), so $p$ is exactly 1 or 0 there, and clipping $x$ to $[-10, 10]$
#   *inside the cubic* changes no result and removes the overflow. Backward clips too: the $x^2$ in
#   $u'$ overflows the same way, so use $x$ clipped the same way there,
#   `x.clip(-GELU_CLIP, GELU_CLIP)` (the given `_cdf_and_clipped`
#   returns that next to $p$ in forward; it computes $p$ as
#   $1 - 1/(e^{2u} + 1)$, the same value, because NumPy's `exp` is
#   faster than its `tanh`; multiply $x$ by $p$ or by $\tfrac12(1 + t)$ and the far left
#   comes out exactly 0, as $1 + t$ does, where $1/(1 + e^{-2u})$ would leave $x$ times a tiny
#   number). Beyond the clip, GELU is exactly $x$ (right) or $0$ (left) with slope 1 or 0:
#   $p(1 - p)$ is exactly 0 there, so the clipped $x$ serves in $2x\,p\,(1 - p)\,u'$ too.
#
# Write `GELUTanh` as a `Function` (Module 02): `backward` returns the tuple
# `(grad * slope,)`, and `gelu` is `GELUTanh.apply(x)`, one node in the graph.
# The cells marked for export become `tinytrain/nn/activations.py`, which
# imports only `math`, `Function` and `Tensor`: compute with `self.xp`, not the
# notebook's `np` or `tt` (neither exists there).

# %% export="nn/activations"
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
GELU_CLIP = 10.0  # tanh(u) is exactly +-1 beyond |x| = 10 (u > 43), in float32 and float64


def _normal_cdf_approximation(xp: Any, clipped: Any) -> Any:
    """``p = (1 + tanh(u)) / 2`` for ``u = sqrt(2/pi) * (c + 0.044715 * c^3)``, ``c = clipped`` (within
    [-10, 10]): GELU's stand-in for the normal CDF, a new array.

    Multiplying ``(e^u - e^-u) / (e^u + e^-u)`` above and below by ``e^u`` gives
    ``tanh(u) = 1 - 2 / (exp(2u) + 1)``, so ``p = 1 - 1 / (exp(2u) + 1)``, the form computed
    here for float32 and float64: NumPy's ``exp`` is faster than its ``tanh`` (1.3 against
    2.6 ns an element in float32 on a Zen 3 core), and equal to it within a rounding (1e-7 in
    float32). Far left, ``exp(2u) + 1`` rounds to 1 and ``p`` to exactly 0, as ``1 + tanh(u)``
    does. ``|u| <= 43.6`` keeps ``exp(2u)`` below 1e38, finite in float32; in float16 (mixed
    precision) it would overflow, so float16 takes ``xp.tanh``. Every step after the first
    works in place on one buffer, so a call makes one array, not seven.
    """
    # out=: an array even for a 0-d input, whose arithmetic NumPy returns as a scalar (which out= refuses)
    buffer = xp.multiply(clipped, clipped, out=xp.empty_like(clipped))
    if clipped.dtype.itemsize < 4:
        buffer *= GELU_CUBIC
        buffer += 1
        buffer *= clipped
        buffer *= SQRT_2_OVER_PI  # u
        xp.tanh(buffer, out=buffer)
        buffer += 1
        buffer *= 0.5
        return buffer
    buffer *= 2 * SQRT_2_OVER_PI * GELU_CUBIC  # 2u = (2 sqrt(2/pi) 0.044715 c^2 + 2 sqrt(2/pi)) c: 4 passes, not 6
    buffer += 2 * SQRT_2_OVER_PI
    buffer *= clipped
    xp.exp(buffer, out=buffer)
    buffer += 1
    xp.divide(1.0, buffer, out=buffer)
    return xp.subtract(1.0, buffer, out=buffer)


class GELUTanh(Function):
    """GELU, tanh approximation: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``, that is ``x * p``
    with ``p = (1 + tanh(u)) / 2``.

    Backward: ``grad`` times ``p + 2 * x * p * (1 - p) * sqrt(2/pi) * (1 + 3 * 0.044715 x^2)``, in
    ``grad``'s dtype (the constants are Python floats: a NumPy float64 scalar would make a
    float32 gradient float64). Saves the input array itself (``self.x = x``, no copy: the
    graph holds it anyway) and ``p`` (``self.p``): recomputing it would cost backward eight
    more passes over memory. ``x`` is clipped to [-10, 10] inside the cubic, where ``p`` is
    already exactly 1 or 0, so huge inputs neither overflow (no NumPy warning) nor change
    the result.
    """

    def _cdf_and_clipped(self, x: Any) -> tuple:
        """``(p, clip(x, -10, 10))``: the approximation's ``p = (1 + tanh(u)) / 2``, and the clipped ``x``."""
        clipped = self.xp.clip(x, -GELU_CLIP, GELU_CLIP)
        return _normal_cdf_approximation(self.xp, clipped), clipped

    def forward(self, x: Any) -> Any:
        ### BEGIN SOLUTION
        self.x = x
        self.p, _ = self._cdf_and_clipped(x)  # kept for backward: never written into
        return x * self.p
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        p = self.p
        clipped = self.x.clip(-GELU_CLIP, GELU_CLIP)  # p (1 - p) is 0 beyond the clip: x can be the clipped x
        du = clipped * clipped  # 2 x u' = 2 sqrt(2/pi) (1 + 3 * 0.044715 c^2) c, in place on a new array
        du *= 6 * GELU_CUBIC * SQRT_2_OVER_PI
        du += 2 * SQRT_2_OVER_PI
        du *= clipped
        slope = 1 - p  # a new array: self.p stays as it was, for a second backward (retain_graph)
        slope *= p
        slope *= du
        slope += p  # p + 2 x p (1 - p) u'
        return (grad * slope,)
        ### END SOLUTION


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """Gaussian error linear unit, tanh approximation, elementwise:

    ``gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``

    PyTorch's ``F.gelu(x, approximate="tanh")``; it differs from the exact
    ``x * Phi(x)`` by less than 5e-4. ``approximate="none"`` (exact, via erf) is
    not offered: NumPy has no vectorised erf.
    """
    if approximate != "tanh":
        raise ValueError(
            f"gelu(approximate={approximate!r}) is not supported: only the tanh approximation "
            "(approximate='tanh') is available, since NumPy has no vectorised erf"
        )
    ### BEGIN SOLUTION
    return GELUTanh.apply(x)
    ### END SOLUTION


# %% check=2
x = tt.tensor([-3.0, -1.0, 0.0, 0.5, 2.0])
expected = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x.numpy().tolist()]
assert np.allclose(gelu(x).numpy(), expected, atol=1e-6), gelu(x)
assert gelu(x).dtype == np.float32
assert tt.gradcheck(gelu, [tt.randn(4, 3, dtype="float64", requires_grad=True)])
huge = tt.tensor([-1e30, -50.0, 50.0, 1e30], requires_grad=True)
out = gelu(huge)
out.sum().backward()
assert np.array_equal(out.numpy(), np.maximum(huge.numpy(), 0)) and np.isfinite(huge.grad.numpy()).all()
assert huge.grad.numpy().tolist() == [0.0, 0.0, 1.0, 1.0]
print("gelu OK")

# %% [markdown]
# GELU next to ReLU, and their slopes:

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for name, f in [("relu", relu), ("gelu", gelu)]:
    y, slope = value_and_slope(f, np.linspace(-4, 4, 401))
    left.plot(np.linspace(-4, 4, 401), y, label=name)
    right.plot(np.linspace(-4, 4, 401), slope, label=name)
left.set_title("f(x)")
right.set_title("f'(x)")
for ax in (left, right):
    ax.axhline(0, color="gray", lw=0.5)
    ax.legend()
plt.show()

# %% [markdown]
# GELU's slope is smooth, slightly above 1 near $x \approx 1.5$, and slightly
# negative for $x \lesssim -0.75$ — small negative inputs still pass back some
# gradient, so a GELU unit is hard to kill.
#
# ## 4. Softmax: scores into probabilities
#
# A classifier's last layer outputs one score (*logit*) $z_i$ per class.
# Softmax turns them into a probability distribution:
#
# $$\operatorname{softmax}(z)_i = \frac{e^{z_i}}{\sum_j e^{z_j}}.$$
#
# Every output is positive, they sum to 1, larger scores get larger shares, and
# adding the same constant to every score changes nothing. Worked example:
# $z = (2, 1, 0.1)$ gives $e^z = (7.39, 2.72, 1.11)$, sum $11.21$, so
# $\operatorname{softmax}(z) = (0.659, 0.242, 0.099)$.
#
# **Stability — the max-shift trick.** $e^{z}$ overflows float32 at $z \approx 89$
# (and float64 at 710). Because shifting all scores changes nothing, compute
# $\operatorname{softmax}(z - \max_j z_j)$: the largest exponent is then $e^0 = 1$,
# and nothing overflows. Watch the naive formula fail:

# %%
z = np.array([1000.0, 0.0], dtype=np.float32)
with np.errstate(all="ignore"):  # silence NumPy's overflow warning for the demo
    print("naive:  ", np.exp(z) / np.exp(z).sum())
shifted = z - z.max()
print("shifted:", np.exp(shifted) / np.exp(shifted).sum())

# %% [markdown]
# **Log-softmax and log-sum-exp.** Losses need $\log \operatorname{softmax}$
# (Module 06). Taking the log of a softmax loses everything that underflowed to
# 0: in float32, $\operatorname{softmax}(0, -200)_2 = e^{-200} \approx 10^{-87}$
# rounds to 0, and $\log 0 = -\infty$. Written out instead,
#
# $$\log\operatorname{softmax}(z)_i = z_i - \underbrace{\log \textstyle\sum_j e^{z_j}}_{\text{log-sum-exp}}
#   = (z_i - m) - \log \textstyle\sum_j e^{z_j - m}, \qquad m = \max_j z_j,$$
#
# every term is moderate: the answer for the example is exactly $-200$.
#
# Both operations take an `axis`: for a batch of score rows of shape
# `(batch, classes)` the default `axis=-1` normalises each row.

# %% export="nn/activations"
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Softmax along ``axis``: ``exp(x_i) / sum_j exp(x_j)``.

    Positive values that sum to 1 along ``axis``. Module 02's ``Tensor.softmax``
    is this operation already, forward and backward: it computes
    ``softmax(x - max(x))``, which is equal and never overflows, on ``x``'s
    device (no ``x.numpy()``); here it gets its public name. The result is part
    of the graph: its gradient flows back to ``x``.
    """
    ### BEGIN SOLUTION
    return x.softmax(axis)
    ### END SOLUTION


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Log-softmax along ``axis``: ``x_i - log(sum_j exp(x_j))``.

    Module 02's ``Tensor.log_softmax``, given its public name: the log-sum-exp
    trick, ``(x_i - m) - log(sum_j exp(x_j - m))`` with ``m = max(x)``, so it is
    finite wherever ``x`` is, unlike ``log(softmax(x))``. The result is part of
    the graph, like ``softmax``'s.
    """
    ### BEGIN SOLUTION
    return x.log_softmax(axis)
    ### END SOLUTION


# %% check=1
scores = tt.tensor([[2.0, 1.0, 0.1], [1000.0, 0.0, -1000.0]])
probs = softmax(scores)
assert np.allclose(probs.numpy()[0], [0.659, 0.242, 0.099], atol=1e-3)
assert np.allclose(probs.numpy().sum(axis=1), 1.0) and np.isfinite(probs.numpy()).all()
assert np.allclose(softmax(scores, axis=0).numpy().sum(axis=0), 1.0), "softmax must honour axis"
logp = log_softmax(tt.tensor([0.0, -200.0]))
assert np.allclose(logp.numpy(), [0.0, -200.0]), logp
s = scores.numpy().astype(np.float64)
reference = s - s.max(axis=0) - np.log(np.exp(s - s.max(axis=0)).sum(axis=0))
assert np.allclose(log_softmax(scores, axis=0).numpy(), reference), "log_softmax must honour axis"
print("softmax, log_softmax OK")

# %% [markdown]
# Softmax as a probability "dial": dividing the scores by a *temperature* $T$
# before softmax sharpens ($T < 1$) or flattens ($T > 1$) the distribution —
# language models sample with it.

# %%
logits = tt.tensor([2.0, 1.0, 0.1])
for temperature in (0.25, 1.0, 4.0):
    print(f"T = {temperature:4}: {np.round(softmax(logits / temperature).numpy(), 3)}")

# %% [markdown]
# ## 5. Systems: time and memory per activation
#
# Every activation runs once per layer per step, forward and backward, on every
# hidden value — and each keeps something alive for its backward pass until the
# backward pass reaches it. For a 1M-element float32 tensor (4 MiB), measure
# forward + backward time and the bytes the operation holds for backward.
#
# What each one keeps, from its backward rule: ReLU needs only *where* $x > 0$,
# which its output tells ($z > 0$ exactly there), so it keeps the output (4
# bytes per element, where a boolean mask would take 1); sigmoid, tanh and
# softmax reuse their output too; our GELU keeps its input and $p$ (8 bytes).

# %%
def saved_bytes(out: Tensor) -> int:
    """Bytes of the arrays that out's operation keeps for its backward pass."""
    kept = [value for name, value in vars(out._ctx).items() if name != "inputs" and hasattr(value, "nbytes")]
    return sum(array.nbytes for array in kept)


def time_forward_backward(f, x, upstream, repeats=5):
    """Best-of-`repeats` seconds for f(x) forward and backward."""
    best = math.inf
    for _ in range(repeats):
        x.grad = None
        start = time.perf_counter()
        f(x).backward(upstream)
        best = min(best, time.perf_counter() - start)
    return best


tt.manual_seed(0)
x = tt.randn(1000, 1000, requires_grad=True)  # 1M float32 values
upstream = tt.randn(1000, 1000)
print(f"{'activation':12s} {'fwd+bwd (ms)':>12s} {'kept for backward':>18s}")
for name, f in [("relu", relu), ("sigmoid", sigmoid), ("tanh", tanh), ("gelu", gelu),
                ("softmax", softmax), ("log_softmax", log_softmax)]:
    seconds = time_forward_backward(f, x, upstream)
    kept = saved_bytes(f(x))
    print(f"{name:12s} {seconds * 1e3:12.2f} {kept / 2**20:12.2f} MiB ({kept / x.size:.0f} B/elem)")

# %% [markdown]
# Read the time column as memory traffic. At 1M elements a simple step costs
# about as much as allocating and filling its 4 MiB result, so relu, tanh and
# the softmaxes — a few array passes each — land within a few times of each other.
# Sigmoid and GELU take several times longer (on the machine this was written on,
# 2.5–5x the softmaxes and 10x or more relu's time) because each is many NumPy
# steps, each a pass over memory: sigmoid's branch-free stable form (`abs`, `exp`, `where`,
# divide), GELU's clip, cubic and exponential. Writing a step's result into an array the
# function itself made (`slope = 1 - p; slope *= p; slope *= du` where
# `p * (1 - p) * du` makes three new arrays; never into `x`, `grad` or a saved
# `p`) saves allocating a temporary per step: the reference GELU does its steps
# that way. Keeping $p$ for backward, rather than recomputing it there, made
# GELU's forward and backward about 1.4x faster at a GPT's sizes, for 4 more
# bytes per element: it *trades memory for time*, the reverse of gradient
# checkpointing in Module 13. All of them are still small next to the matrix
# products between activations.
#
# A subtlety in the memory column: the saved array of relu, sigmoid and tanh *is*
# their output, and the next layer usually keeps that output alive anyway, so it
# costs nothing extra — which is why ReLU keeps its output rather than a mask,
# which would be 1 byte per element of genuinely new memory.
#
# ## How PyTorch does it
#
# `torch.nn.functional` has `relu`, `sigmoid`, `tanh`, `gelu`, `softmax(x, dim)`
# and `log_softmax(x, dim)` — PyTorch says `dim` where NumPy and we say `axis`.
# `F.gelu` defaults to the exact erf form (`approximate="none"`); ours is
# `approximate="tanh"`, which is what GPT-2 and many transformer codebases use.
# The layer classes `nn.ReLU()`, `nn.GELU()`, `nn.Softmax(dim)` wrap the same
# functions (our versions come in Module 04). PyTorch's GELU saves only the
# input and recomputes $\tanh u$ in backward, where ours keeps $p$: its fused
# C++/CUDA kernels do each activation in one pass over memory, nearly free to
# repeat, where ours makes a NumPy pass per arithmetic step.
#
# ## Summary
#
# * Without a nonlinearity, a deep network is one matrix.
# * Sigmoid and tanh saturate: their slopes vanish for large $|x|$, and sigmoid's
#   is at most $\tfrac14$, so gradients shrink geometrically with depth.
#   ReLU's slope is 1 where active, 0 where not (dead units).
# * GELU $\approx \tfrac12 x(1 + \tanh(\sqrt{2/\pi}(x + 0.044715x^3)))$, within
#   $5\cdot10^{-4}$ of $x\Phi(x)$: $x\,p$ with $p = \tfrac12(1 + \tanh u)$, kept for backward,
#   whose slope is $p + 2x\,p(1 - p)\,u'$.
# * Softmax turns scores into probabilities; subtract the maximum first, and
#   compute log-probabilities with log-sum-exp, never as `log(softmax)`.
