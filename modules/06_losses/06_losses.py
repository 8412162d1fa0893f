# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 06 — Loss functions
#
# *One sitting, about 2 hours: the lesson, 10 functions to write, and the measurements.*
#
# Training needs one number that says how wrong the model is, and whose gradient
# points towards "less wrong". That number is the **loss**. Choosing it is not
# arbitrary: the standard losses are *negative log-likelihoods* — the loss is
# small exactly when the model assigns high probability to the data it sees.
#
# **You will**
# 1. write the mean squared error for regression and see why it is the
#    likelihood of Gaussian noise;
# 2. derive cross-entropy from maximum likelihood and write it as **one fused,
#    numerically stable** operation whose backward is simply
#    $(\operatorname{softmax} - \text{one-hot}) / N$;
# 3. write binary cross-entropy, on probabilities (clamped like PyTorch) and on
#    logits (stable for any input);
# 4. see them wrapped as modules: `nn.MSELoss()`, `nn.CrossEntropyLoss()`, ... (given);
# 5. measure what fusing saves in time and memory against composing the same
#    loss from tensor operations.

# %%
import math
import time
import tracemalloc

import matplotlib.pyplot as plt
import numpy as np

import tinytrain as tt
from tinytrain.nn.functional import log_softmax, sigmoid, softmax

# %% [markdown]
# ## 1. One loss per sample, then a reduction
#
# Every loss here first computes one value per sample (or per element), then
# *reduces* them, as chosen by `reduction`:
#
# * `"mean"` (the default) — the average. The loss and its gradient do not grow
#   with the batch size, so neither does the right learning rate.
# * `"sum"` — the total. The Trainer (Module 09) sums over the micro-batches of
#   gradient accumulation and divides once by the number of samples.
# * `"none"` — the per-sample losses themselves, to weight, inspect or sort them.
#
# The helpers below do this for tensors (for losses composed of tensor
# operations) and for raw arrays (inside a `Function`). In backward, a `"mean"`
# loss hands each sample $1/N$ of the incoming gradient; `"sum"` and `"none"`
# pass it on unchanged.

# %% export="nn/losses"
"""Loss functions: functional forms (``mse_loss``, ``cross_entropy``, ...) and modules.

``reduction`` is ``"mean"`` (default), ``"sum"`` or ``"none"`` everywhere, as in
PyTorch. Targets are never differentiated. Cross-entropy and the binary
cross-entropies are fused :class:`~tinytrain.autograd.Function`s: one graph node,
numerically stable, with a closed-form backward.
"""
from typing import Any

import numpy as np

from tinytrain.autograd import Function
from tinytrain.backend import sum_dtype
from tinytrain.nn.module import Module
from tinytrain.tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> str:
    """``reduction`` itself, or a ValueError naming the allowed values."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return reduction


def _reduce(losses: Tensor, reduction: str) -> Tensor:
    """Reduce a tensor of per-sample losses."""
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    return losses


def _reduce_array(losses: Any, reduction: str) -> Any:
    """Reduce an array of per-sample losses (inside a Function's forward), in their dtype (a
    bfloat16 sum adds up in float32, ``sum_dtype``, and is rounded once)."""
    if reduction == "none":
        return losses
    added_in = sum_dtype(losses.dtype)
    total = losses.sum(dtype=added_in)
    if reduction == "mean":
        total = total / losses.size  # what .mean() computes, without its Python-level wrapper
    return total if added_in is None else total.astype(losses.dtype)


def _unreduce(grad: Any, reduction: str, count: int) -> Any:
    """The gradient reaching each per-sample loss from the reduced loss's ``grad``.

    A 0-d array for "mean" (``grad / count``) and "sum", one value per loss for "none".
    """
    return grad / count if reduction == "mean" else grad


def _as_target(target: Any, like: Tensor) -> Tensor:
    """``target`` as a tensor on ``like``'s device, cut off from the graph."""
    if isinstance(target, Tensor):
        target = like._operand(target)  # raises if it lives on another device
        return target.detach() if target.requires_grad else target
    return Tensor(target, device=like._backend)


def _check_same_shape(name: str, pred: Tensor, target: Tensor) -> None:
    """ValueError naming both shapes unless ``pred`` and ``target`` have the same shape."""
    if pred.shape != target.shape:
        raise ValueError(
            f"{name}: input has shape {pred.shape} but target has shape {target.shape}; they must be equal "
            "(no broadcasting: a (N, 1) prediction against a (N,) target would compare every pair)"
        )


# %% [markdown]
# ## 2. Mean squared error
#
# $$\operatorname{MSE}(\hat y, y) = \frac1N \sum_{i=1}^N (\hat y_i - y_i)^2,
# \qquad \frac{\partial\,\mathrm{MSE}}{\partial \hat y_i} = \frac2N(\hat y_i - y_i).$$
#
# **Where it comes from.** Suppose the target is the model's prediction plus
# Gaussian noise, $y = \hat y + \varepsilon$ with $\varepsilon \sim \mathcal N(0, \sigma^2)$.
# The likelihood of one target is
# $p(y \mid x) = \frac{1}{\sqrt{2\pi}\sigma} e^{-(y - \hat y)^2 / 2\sigma^2}$, and its
# negative log is $\frac{(y - \hat y)^2}{2\sigma^2} + \text{const}$. Maximising the
# likelihood of the data is minimising the squared error.
#
# Worked example: $\hat y = (2.5, 0, 2)$, $y = (3, -0.5, 2)$. The errors are
# $(-0.5, 0.5, 0)$, the squares $(0.25, 0.25, 0)$, the mean $0.1667$, and the
# gradient $\frac23(-0.5, 0.5, 0) = (-0.333, 0.333, 0)$.
#
# **A shape trap.** A regression network ends in `Linear(..., 1)` and outputs
# shape `(N, 1)`; the targets usually have shape `(N,)`. Broadcasting turns
# their difference into an `(N, N)` matrix of *every* prediction minus *every*
# target — a wrong loss, with no error:

# %%
pred_column = np.array([[2.5], [0.0], [2.0]])  # (3, 1), what Linear(..., 1) gives
target_row = np.array([3.0, -0.5, 2.0])  # (3,)
print("shape of the difference:", (pred_column - target_row).shape)
print("broadcast 'MSE':", ((pred_column - target_row) ** 2).mean(), " correct MSE:", 0.25 * 2 / 3)

# %% [markdown]
# So `mse_loss` refuses different shapes (PyTorch only warns). MSE is cheap to
# compose from tensor operations — a subtraction, a product and a reduction — so
# it needs no `Function` of its own. The target is detached: it is data, and no
# gradient should flow into it.

# %% export="nn/losses"
def mse_loss(pred: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Mean squared error: ``mean((pred - target) ** 2)`` (or its sum, or per element).

    ``pred`` and ``target`` must have the same shape (ValueError naming both
    otherwise). Gradient ``2 * (pred - target) / N`` for "mean". The loss has
    ``pred``'s dtype, whatever the target's (an int64 target is cast first).
    """
    _check_reduction(reduction)
    target = _as_target(target, pred)
    _check_same_shape("mse_loss", pred, target)
    ### BEGIN SOLUTION
    diff = pred - target.astype(pred.dtype)
    return _reduce(diff * diff, reduction)
    ### END SOLUTION


# %% check=1
pred = tt.tensor([2.5, 0.0, 2.0], requires_grad=True)
loss = mse_loss(pred, tt.tensor([3.0, -0.5, 2.0]))
assert abs(loss.item() - 0.25 * 2 / 3) < 1e-6, loss
loss.backward()
assert np.allclose(pred.grad.numpy(), [-1 / 3, 1 / 3, 0.0]), pred.grad
assert mse_loss(pred, [3.0, -0.5, 2.0], reduction="sum").item() == 0.5
assert mse_loss(pred, [3.0, -0.5, 2.0], reduction="none").numpy().tolist() == [0.25, 0.25, 0.0]
try:
    mse_loss(tt.zeros(3, 1), tt.zeros(3))
except ValueError as error:
    assert "(3, 1)" in str(error) and "(3,)" in str(error), error
else:
    raise AssertionError("mse_loss must refuse a (3, 1) prediction against a (3,) target")
print("mse_loss OK")

# %% [markdown]
# ## 3. Cross-entropy: maximum likelihood for classes
#
# A classifier outputs one score, a **logit** $z_c$, per class $c = 0, \dots, C-1$.
# Softmax (Module 03) turns the logits into the model's probabilities,
# $p(c \mid x) = \operatorname{softmax}(z)_c$. The likelihood of a labelled
# dataset is $\prod_i p(y_i \mid x_i)$; maximising it is minimising the mean
# **negative log-likelihood**
#
# $$L = -\frac1N \sum_{i=1}^N \log \operatorname{softmax}(z_i)_{y_i}.$$
#
# This is the **cross-entropy** $H(q, p) = -\sum_c q_c \log p_c$ between the
# target distribution $q$ and the prediction $p$, averaged over the batch: with a
# one-hot $q$ only the true class's term survives. Targets can also be full
# distributions — soft labels from label smoothing, mixup or a teacher network —
# and then every term counts.
#
# **Worked example.** Logits $z = (2, 1, 0.1)$ give
# $p = (0.659, 0.242, 0.099)$ (Module 03). If the true class is 0 the loss is
# $-\log 0.659 = 0.417$; if it is 2, $-\log 0.099 = 2.317$. A confident right
# answer costs little; a confident wrong one costs a lot, without bound.

# %%
z = np.array([2.0, 1.0, 0.1])
p = np.exp(z) / np.exp(z).sum()
print("p =", p.round(3), " loss if y=0:", round(-math.log(p[0]), 3), " loss if y=2:", round(-math.log(p[2]), 3))

# %% [markdown]
# **The gradient.** Write one sample's loss with the log-sum-exp:
# $L = -z_y + \log \sum_j e^{z_j}$. Differentiating,
#
# $$\frac{\partial L}{\partial z_j} = \operatorname{softmax}(z)_j - [j = y].$$
#
# For the example with $y = 0$: $(0.659 - 1,\ 0.242,\ 0.099) = (-0.341, 0.242, 0.099)$.
# The true class is pulled up, every other class pushed down in proportion to
# the probability it wrongly got; the entries sum to 0, and each lies in
# $[-1, 1]$ however wrong the model is — the gradient never explodes. For a
# batch mean, divide by $N$. For a target distribution $q$:
# $\partial L / \partial z = p \sum_c q_c - q$, which is $p - q$ when $q$ sums to 1.
#
# ### Why logits and log-softmax, not softmax and then log
#
# Computing $\log(\operatorname{softmax}(z))$ in two steps breaks as soon as a
# probability underflows. In float32 $e^{-120} \approx 10^{-52}$ rounds to 0, so a
# model that is confidently wrong gets loss $-\log 0 = \infty$ and a `nan`
# gradient — and one `nan` poisons every weight. Log-softmax with the
# log-sum-exp trick gives the exact answer, 120:

# %%
logits = tt.tensor([[0.0, -120.0]], requires_grad=True)  # the true class is 1
with np.errstate(all="ignore"):  # silence log(0) and 0/0 warnings for the demo
    two_steps = -softmax(logits).log()[0, 1]
    two_steps.backward()
print("-log(softmax):", two_steps.item(), " gradient:", logits.grad.numpy())
logits.grad = None
fused = -log_softmax(logits)[0, 1]
fused.backward()
print("-log_softmax: ", fused.item(), " gradient:", logits.grad.numpy())

# %% [markdown]
# ### One fused operation
#
# The composed form `-log_softmax(z)[range(N), y].mean()` is correct and stable,
# but it is four graph nodes, and its backward pass is wasteful: indexing's
# backward builds an $N \times C$ array of zeros and scatters $N$ values into it,
# log-softmax's backward builds two more $N \times C$ arrays, and the final
# gradient is the simple $(\operatorname{softmax} - \text{one-hot})/N$ anyway.
# A single `Function` can compute it directly:
#
# * **forward**, per row with $m = \max_j z_j$:
#   $L_i = \log \sum_j e^{z_{ij} - m} - (z_{i y_i} - m)$. Keep
#   $\operatorname{softmax}(z)$ (one $N \times C$ array) for backward — it is
#   `exp(z - m)` divided by its row sum, both already computed. Leave the
#   logits array as it is: it is the caller's tensor's data, so `z - m` (a new
#   array), never `z -= m`;
# * **backward**: `probs * g`, then subtract `g` at each row's target column,
#   where `g` is the gradient of each sample's loss (`_unreduce`): one number for
#   "mean" and "sum", a vector of $N$ for "none" — there, scale the rows with the
#   $N \times 1$ column `g[:, None]`, and subtract the flat `g` (one number per
#   row) at `[xp.arange(N), target]`. Write into a new array: `self.probs` must
#   stay as forward left it, since a second backward through the same graph
#   (`backward(retain_graph=True)`, Module 02) reads it again.
#
# For probability targets $q$ (an $N \times C$ float array), the per-row loss is
# $\bigl(\log\sum_j e^{z_{ij}-m}\bigr)\sum_c q_{ic} - \sum_c q_{ic}(z_{ic} - m)$ and
# the gradient $(p \sum_c q_c - q)\, g$. `target.ndim` tells the two kinds apart.
#
# As in every `Function` (Module 02), `forward` and `backward` get arrays and
# compute with `self.xp`, the array library of the inputs' device (NumPy here,
# CuPy on a GPU), never `np` directly; `backward` returns a tuple with one
# gradient per tensor input, and `cross_entropy` calls
# `CrossEntropy.apply(logits, target=..., reduction=...)`. The loss keeps the
# logits' dtype: float32 logits give a float32 loss. So does the gradient
# (Module 02: *keep the dtype*): backward hands float32 logits a float32 array.
# A float64 one would not be an error, only a slow one: every layer below would
# run its backward in float64, twice the time on a CPU, far more on a GPU. Watch
# for the float64 defaults: a one-hot built with `xp.eye(C)` or `xp.zeros((N, C))`
# without `dtype=`, or a count that is a NumPy integer (`np.prod(shape)`: float32
# divided by it becomes float64; `len` and `.size` are Python ints).

# %% export="nn/losses"
class CrossEntropy(Function):
    """Softmax cross-entropy of logits ``(N, C)`` against class indices ``(N,)`` or
    probabilities ``(N, C)``, fused: one node, log-sum-exp stable.

    Backward: ``(softmax(logits) - onehot(target)) * g``, or ``(softmax * sum(q) - q) * g``
    for probability targets ``q``, with ``g`` each sample's share of the upstream
    gradient ``grad`` (``grad / N`` for "mean", ``grad`` for "sum", ``grad[i]`` for "none"). The loss and
    the gradient have the logits' dtype.
    """

    def forward(self, logits: Any, target: Any, reduction: str) -> Any:
        ### BEGIN SOLUTION
        xp = self.xp
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = xp.exp(shifted)
        sums = probs.sum(axis=1, keepdims=True)
        log_sums = xp.log(sums[:, 0])
        if target.ndim == 1:  # class indices
            losses = log_sums - shifted[xp.arange(len(target)), target]
        else:  # probabilities
            losses = log_sums * target.sum(axis=1) - (target * shifted).sum(axis=1)
        probs /= sums  # now softmax(logits): the one (N, C) array backward needs
        self.probs, self.target, self.reduction = probs, target, reduction
        return _reduce_array(losses, reduction)
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        probs, target = self.probs, self.target
        per_sample = _unreduce(grad, self.reduction, len(probs))
        if self.reduction == "none":
            per_sample = per_sample[:, None]
        if target.ndim == 1:
            out = probs * per_sample
            out[self.xp.arange(len(target)), target] -= per_sample.reshape(-1)
        else:
            out = (probs * target.sum(axis=1, keepdims=True) - target) * per_sample
        return (out,)
        ### END SOLUTION


# %% [markdown]
# Check the forward and backward rules on the worked example, calling them
# directly (a 0-d upstream gradient of 1, as `loss.backward()` sends):

# %% check=2
ce = CrossEntropy()
ce.backend = tt.get_backend("cpu")
logits = np.array([[2.0, 1.0, 0.1], [0.0, 0.0, 1000.0]], dtype=np.float32)
losses = ce.forward(logits, np.array([0, 0]), reduction="none")
assert np.allclose(losses, [0.417, 1000.0], atol=1e-3), losses
ce.forward(logits, np.array([0, 0]), reduction="mean")
grad = ce.backward(np.float32(1.0))[0]
assert np.allclose(grad[0], np.array([-0.341, 0.242, 0.099]) / 2, atol=1e-3), grad
assert np.allclose(grad[1], [-0.5, 0.0, 0.5]), grad
soft = np.array([[1.0, 0.0, 0.0], [0.5, 0.0, 0.5]], dtype=np.float32)
assert np.allclose(ce.forward(logits, soft, reduction="none"), [0.417, 500.0], atol=1e-3)
assert np.allclose(ce.backward(np.ones(2, dtype=np.float32))[0][1], [-0.5, 0.0, 0.5])
print("CrossEntropy forward and backward OK")

# %% [markdown]
# The functional form checks its inputs before the `Function` sees them — errors
# that name the problem beat a confusing `IndexError` from deep inside NumPy, or
# worse, a silently wrong loss:
#
# * logits must be `(N, C)`;
# * an integer target (any integer dtype) holds class indices: shape `(N,)`,
#   values in $[0, C)$ — an index outside raises `ValueError` naming it and $C$;
# * a float target holds probabilities with the logits' shape. A float target of
#   shape `(N,)` is almost always class labels that became floats (say, read from
#   a CSV); guessing would be wrong either way, so it raises a `TypeError`
#   asking for integers.

# %% export="nn/losses"
def _check_class_indices(target: Tensor, classes: int) -> None:
    """ValueError naming the first out-of-range value of integer class indices."""
    if target.size == 0:
        return
    # One reduction on the happy path: seen as unsigned integers, negative indices are huge.
    unsigned = target.data.view(f"u{target.dtype.itemsize}")
    if int(unsigned.max()) >= classes:
        low, high = int(target.data.min()), int(target.data.max())
        bad = low if low < 0 else high
        raise ValueError(
            f"cross_entropy: target holds class index {bad}, but the logits have {classes} classes "
            f"(indices must lie in [0, {classes}))"
        )


def cross_entropy(logits: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy: ``mean_i -log softmax(logits_i)[target_i]``.

    ``logits``: raw class scores of shape ``(N, C)`` (not probabilities).
    ``target``: class indices of shape ``(N,)`` of any integer dtype, each in
    ``[0, C)``; or float probabilities (one-hot or soft) of shape ``(N, C)``,
    giving ``mean_i -sum_c target_ic * log softmax(logits_i)_c``. Computed with
    log-sum-exp, so any finite logits give a finite loss; the gradient is
    ``(softmax(logits) - onehot(target)) / N`` for "mean".
    """
    _check_reduction(reduction)
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must have shape (N, C) (a batch of class scores), got {logits.shape}")
    target = _as_target(target, logits)
    n, classes = logits.shape
    if target.dtype.kind in "iu":
        if target.shape != (n,):
            raise ValueError(
                f"cross_entropy: integer class indices must have shape (N,) = ({n},) for logits of shape "
                f"{logits.shape}, got {target.shape}; pass one-hot or soft targets as floats of shape {logits.shape}"
            )
        _check_class_indices(target, classes)
    elif target.dtype.kind == "f":
        if target.ndim == 1:
            raise TypeError(
                f"cross_entropy: class indices must be integers, got a {target.dtype} target of shape "
                f"{target.shape}; convert it with .astype('int64'), or pass probabilities of shape {logits.shape}"
            )
        if target.shape != logits.shape:
            raise ValueError(
                f"cross_entropy: probability targets must have the logits' shape {logits.shape}, got {target.shape}"
            )
        target = target.astype(logits.dtype)
    else:
        raise TypeError(f"cross_entropy: target must hold integer class indices or float probabilities, "
                        f"got dtype {target.dtype}")
    ### BEGIN SOLUTION
    return CrossEntropy.apply(logits, target=target.data, reduction=reduction)
    ### END SOLUTION


# %% check=2
logits = tt.tensor([[2.0, 1.0, 0.1], [0.5, 2.5, -1.0]], requires_grad=True)
labels = tt.tensor([0, 1])
loss = cross_entropy(logits, labels)
expected = -log_softmax(logits.detach()).numpy()[[0, 1], [0, 1]].mean()
assert abs(loss.item() - expected) < 1e-6, (loss, expected)
loss.backward()
assert np.allclose(logits.grad.numpy(), (softmax(logits.detach()).numpy() - np.eye(3)[[0, 1]]) / 2, atol=1e-6)
one_hot = tt.tensor(np.eye(3, dtype=np.float32)[[0, 1]])
assert abs(cross_entropy(logits, one_hot).item() - expected) < 1e-6, "one-hot targets must give the same loss"
assert cross_entropy(logits, np.array([0, 1], dtype=np.uint8), reduction="none").shape == (2,)
assert tt.gradcheck(lambda x: cross_entropy(x, labels, reduction="sum"), [tt.randn(2, 3, dtype="float64", requires_grad=True)])
for bad_target, error_type, words in [([0.0, 1.0], TypeError, "integer"), ([0, 3], ValueError, "3")]:
    try:
        cross_entropy(logits, tt.tensor(bad_target))
    except error_type as error:
        assert words in str(error), error
    else:
        raise AssertionError(f"cross_entropy(logits, {bad_target}) must raise {error_type.__name__}")
print("cross_entropy OK")

# %% [markdown]
# ## 4. Binary cross-entropy
#
# For a yes/no question the model outputs one number per example. Through a
# sigmoid it is the probability of "yes", $p = \sigma(x)$, and the negative
# log-likelihood of a target $t \in \{0, 1\}$ (or a soft target in $[0, 1]$) is
#
# $$\operatorname{BCE}(p, t) = -\bigl[t \log p + (1 - t) \log(1 - p)\bigr],
# \qquad \frac{\partial\,\mathrm{BCE}}{\partial p} = \frac{p - t}{p(1-p)}.$$
#
# (It is two-class cross-entropy: $\sigma(x) = \operatorname{softmax}(0, x)_1$.)
#
# **On probabilities** the logs blow up at $p = 0$ or $1$, which a saturated
# sigmoid does produce in float32. PyTorch's `BCELoss` clamps each log at
# $-100$, so one element costs at most 100, and clamps the denominator
# $p(1-p)$ of the gradient below at $10^{-12}$. We do the same, and avoid even
# computing $\log 0$ (NumPy would warn) by taking the log of
# $\max(p, \text{smallest positive float})$ (the smallest subnormal,
# `np.finfo(dtype).smallest_subnormal`): that is about $-103$ in float32 and
# $-744$ in float64, both then clamped to $-100$. Inputs outside $[0, 1]$ are not
# probabilities, so they raise.
#
# **On logits** we never form $p$. With $\log\sigma(x) = -\log(1 + e^{-x})$ and
# $\log(1 - \sigma(x)) = -x - \log(1 + e^{-x})$, the loss is
# $(1 - t)\,x + \log(1 + e^{-x})$. For $x \ll 0$, $e^{-x}$ overflows; using
# $\log(1 + e^{-x}) = \max(-x, 0) + \log(1 + e^{-|x|})$ gives the stable form
#
# $$\operatorname{BCE}_\text{logits}(x, t) = \max(x, 0) - x\,t + \log\bigl(1 + e^{-|x|}\bigr),
# \qquad \frac{\partial}{\partial x} = \sigma(x) - t.$$
#
# $e^{-|x|} \le 1$ never overflows, and `log1p` keeps precision when it is tiny.
# The gradient is the same "prediction minus target" as cross-entropy's; compute
# its $\sigma(x)$ from the same $e^{-|x|}$ (Module 02's stable sigmoid,
# $\sigma(x) = 1/(1 + e^{-|x|})$ for $x \ge 0$, $e^{-|x|}/(1 + e^{-|x|})$ otherwise):
# `1 / (1 + exp(-x))` overflows for $x \ll 0$, and NumPy warns.
#
# Both backwards multiply the slope by each element's share of the upstream
# gradient (`_unreduce`, as for cross-entropy), and write into a new array: what
# forward saved (`self.probs`, the sigmoid) must stay as it was for a second
# backward through the same graph. Forward leaves its input as it is, as
# cross-entropy's does: `xp.maximum(probs, tiny)` is a new array, never
# `out=probs` (that would change the caller's tensor). Both losses keep the
# input's dtype: cast the target to it (`target.astype(probs.dtype)`, or the
# logits' dtype) before `apply`; and so do their gradients, as cross-entropy's.

# %% export="nn/losses"
LOG_FLOOR = -100.0  # PyTorch's BCELoss clamps log(p) and log(1 - p) here
GRAD_EPS = 1e-12  # ... and p * (1 - p) here in the gradient


class BinaryCrossEntropy(Function):
    """``-(t * log(p) + (1 - t) * log(1 - p))``, each log clamped at -100.

    Backward: ``(p - t) / max(p * (1 - p), 1e-12)``, as in PyTorch, times each
    element's share of ``grad`` (``_unreduce``), in ``probs``' dtype.
    """

    def forward(self, probs: Any, target: Any, reduction: str) -> Any:
        ### BEGIN SOLUTION
        xp = self.xp
        tiny = np.finfo(probs.dtype).smallest_subnormal  # log(tiny) < -100: no log(0), no warning
        log_p = xp.maximum(xp.log(xp.maximum(probs, tiny)), LOG_FLOOR)
        log_not_p = xp.maximum(xp.log(xp.maximum(1 - probs, tiny)), LOG_FLOOR)
        self.probs, self.target, self.reduction = probs, target, reduction
        return _reduce_array(-(target * log_p + (1 - target) * log_not_p), reduction)
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        p, t = self.probs, self.target
        slope = (p - t) / self.xp.maximum(p * (1 - p), GRAD_EPS)
        return (slope * _unreduce(grad, self.reduction, p.size),)
        ### END SOLUTION


class BinaryCrossEntropyWithLogits(Function):
    """``max(x, 0) - x * t + log(1 + exp(-|x|))``: BCE of ``sigmoid(x)``, stable for any x.

    Backward: ``sigmoid(x) - t`` times each element's share of ``grad`` (``_unreduce``),
    with a sigmoid from ``exp(-|x|)`` that cannot overflow, in the logits' dtype.
    """

    def forward(self, logits: Any, target: Any, reduction: str) -> Any:
        ### BEGIN SOLUTION
        xp = self.xp
        decay = xp.exp(-xp.abs(logits))  # in (0, 1]: never overflows
        losses = xp.maximum(logits, 0) - logits * target + xp.log1p(decay)
        self.sigmoid = xp.where(logits >= 0, 1, decay) / (1 + decay)  # stable sigmoid, as in Module 02
        self.target, self.reduction = target, reduction
        return _reduce_array(losses, reduction)
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        return ((self.sigmoid - self.target) * _unreduce(grad, self.reduction, self.target.size),)
        ### END SOLUTION


def binary_cross_entropy(probs: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Binary cross-entropy of probabilities: ``mean(-(t log p + (1 - t) log(1 - p)))``.

    ``probs`` in [0, 1] (ValueError otherwise), ``target`` of the same shape
    (ValueError naming both shapes). Each log is clamped at -100, like PyTorch,
    so the loss is finite even at p = 0 or 1. The loss has ``probs``' dtype. Prefer
    :func:`binary_cross_entropy_with_logits` on raw scores.
    """
    _check_reduction(reduction)
    target = _as_target(target, probs)
    _check_same_shape("binary_cross_entropy", probs, target)
    if probs.size:
        low, high = float(probs.data.min()), float(probs.data.max())
        if low < 0 or high > 1:
            raise ValueError(
                f"binary_cross_entropy: input must hold probabilities in [0, 1], got values from {low} to {high}; "
                "for raw scores use binary_cross_entropy_with_logits"
            )
    ### BEGIN SOLUTION
    return BinaryCrossEntropy.apply(probs, target=target.astype(probs.dtype).data, reduction=reduction)
    ### END SOLUTION


def binary_cross_entropy_with_logits(logits: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Binary cross-entropy of ``sigmoid(logits)``, computed stably from the logits:

    ``mean(max(x, 0) - x * t + log(1 + exp(-|x|)))``; gradient ``sigmoid(x) - t``
    (divided by the number of elements for "mean"). ``target`` must have the logits'
    shape (ValueError naming both). The loss has the logits' dtype.
    """
    _check_reduction(reduction)
    target = _as_target(target, logits)
    _check_same_shape("binary_cross_entropy_with_logits", logits, target)
    ### BEGIN SOLUTION
    return BinaryCrossEntropyWithLogits.apply(logits, target=target.astype(logits.dtype).data, reduction=reduction)
    ### END SOLUTION


# %% check=2
x = tt.tensor([-2.0, 0.0, 3.0], requires_grad=True)
t = tt.tensor([0.0, 1.0, 1.0])
p = 1 / (1 + np.exp(-x.numpy().astype(np.float64)))
expected = -(t.numpy() * np.log(p) + (1 - t.numpy()) * np.log(1 - p))
assert np.allclose(binary_cross_entropy_with_logits(x, t, reduction="none").numpy(), expected, atol=1e-6)
assert np.allclose(binary_cross_entropy(sigmoid(x), t, reduction="none").numpy(), expected, atol=1e-6)
binary_cross_entropy_with_logits(x, t).backward()
assert np.allclose(x.grad.numpy(), (p - t.numpy()) / 3, atol=1e-6)
extreme = tt.tensor([-1000.0, 1000.0], requires_grad=True)
loss = binary_cross_entropy_with_logits(extreme, [1.0, 0.0], reduction="none")
loss.sum().backward()
assert loss.numpy().tolist() == [1000.0, 1000.0] and extreme.grad.numpy().tolist() == [-1.0, 1.0]
clamped = binary_cross_entropy(tt.tensor([0.0, 1.0]), [1.0, 0.0], reduction="none")
assert np.allclose(clamped.numpy(), [100.0, 100.0]), clamped
print("binary cross-entropy OK")

# %% [markdown]
# ### Loss against logit
#
# For a positive example ($t = 1$), plot the loss as the logit varies. Left:
# the usual range — near 0 for a confident right answer, growing linearly with
# a confident wrong one. Right: far into the wrong side, in float32. BCE of
# probabilities is capped at 100 by the clamp, the naive $-\log \sigma(x)$
# becomes infinite once $\sigma(x)$ underflows to 0, and from logits the loss
# stays exact.

# %%
def bce_curves(xs):
    """Loss for target 1 at float32 logits `xs`: from logits, from probabilities, naive."""
    x = tt.tensor(xs)
    ones = tt.ones(*x.shape)
    from_logits = binary_cross_entropy_with_logits(x, ones, reduction="none").numpy()
    from_probs = binary_cross_entropy(sigmoid(x), ones, reduction="none").numpy()
    with np.errstate(divide="ignore"):
        naive = -np.log(sigmoid(x).numpy())
    return from_logits, from_probs, naive


fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
near = np.linspace(-6, 6, 241)
far = np.linspace(-150, 0, 301)
for ax, xs in [(left, near), (right, far)]:
    from_logits, from_probs, naive = bce_curves(xs)
    ax.plot(xs, naive, lw=4, alpha=0.4, label="naive -log σ(x) (inf when σ(x) = 0)")
    ax.plot(xs, from_probs, "--", label="binary_cross_entropy(σ(x))")
    ax.plot(xs, from_logits, label="binary_cross_entropy_with_logits(x)")
    ax.set_xlabel("logit x (target t = 1)")
    ax.set_ylabel("loss")
left.legend()
plt.show()
print("naive loss is infinite from x =", far[np.isinf(bce_curves(far)[2])].max())

# %% [markdown]
# The gradients differ even more. At $x = -50$, a confidently wrong model,
# the logits version sends back $\sigma(x) - 1 \approx -1$: "move up, fast". Through
# probabilities the chain rule would give the same in exact arithmetic: the slope
# in $p$, $-1/p \approx -5 \cdot 10^{21}$, times $\sigma'(x) \approx 2 \cdot 10^{-22}$.
# But the clamp that keeps $p = 0$ finite (the $10^{-12}$ under $p(1-p)$) caps the
# slope at about $10^{12}$, and $\sigma'(x)$ multiplies that to almost nothing —
# the model barely learns from its worst mistakes.

# %%
for name, loss_of_logit in [("with logits", lambda x: binary_cross_entropy_with_logits(x, [1.0])),
                            ("of sigmoid(x)", lambda x: binary_cross_entropy(sigmoid(x), [1.0]))]:
    x = tt.tensor([-50.0], requires_grad=True)
    loss_of_logit(x).backward()
    print(f"d loss / d x at x = -50, {name:14s}: {x.grad.item():.3g}")

# %% [markdown]
# ## 5. Loss modules
#
# Models are modules, and so are losses: `loss_fn = nn.CrossEntropyLoss()` is
# created once with its options, then called like a function,
# `loss_fn(logits, target)`. The Trainer (Module 09) takes such an object. Each
# class stores `reduction` (checked at once: a typo should fail when the loss
# is built, not a training step later) and forwards to the functional form. They
# are given: each is one line.

# %% export="nn/losses"
class _Loss(Module):
    """Base of the loss modules: holds and validates ``reduction``."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _check_reduction(reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class MSELoss(_Loss):
    """``MSELoss(reduction="mean")(pred, target)``: :func:`mse_loss`."""

    def forward(self, pred: Tensor, target: Any) -> Tensor:
        return mse_loss(pred, target, self.reduction)


class CrossEntropyLoss(_Loss):
    """``CrossEntropyLoss(reduction="mean")(logits, target)``: :func:`cross_entropy`."""

    def forward(self, logits: Tensor, target: Any) -> Tensor:
        return cross_entropy(logits, target, self.reduction)


class BCELoss(_Loss):
    """``BCELoss(reduction="mean")(probs, target)``: :func:`binary_cross_entropy`."""

    def forward(self, probs: Tensor, target: Any) -> Tensor:
        return binary_cross_entropy(probs, target, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """``BCEWithLogitsLoss(reduction="mean")(logits, target)``: :func:`binary_cross_entropy_with_logits`."""

    def forward(self, logits: Tensor, target: Any) -> Tensor:
        return binary_cross_entropy_with_logits(logits, target, self.reduction)


# %% check=1
logits = tt.tensor([[2.0, 1.0, 0.1], [0.5, 2.5, -1.0]])
labels = tt.tensor([0, 1])
assert CrossEntropyLoss()(logits, labels).item() == cross_entropy(logits, labels).item()
assert CrossEntropyLoss(reduction="sum").forward(logits, labels).item() == cross_entropy(logits, labels, "sum").item()
assert MSELoss(reduction="none")(tt.tensor([1.0, 2.0]), [0.0, 0.0]).numpy().tolist() == [1.0, 4.0]
assert BCEWithLogitsLoss()(tt.tensor([0.0]), [1.0]).item() == binary_cross_entropy_with_logits(tt.tensor([0.0]), [1.0]).item()
assert BCELoss(reduction="sum")(tt.tensor([0.5, 0.5]), [1.0, 0.0]).item() == binary_cross_entropy(tt.tensor([0.5, 0.5]), [1.0, 0.0], "sum").item()
try:
    MSELoss(reduction="avg")
except ValueError as error:
    assert "avg" in str(error)
else:
    raise AssertionError("an unknown reduction must fail when the loss is built")
print(CrossEntropyLoss(), "OK")

# %% [markdown]
# ## 6. Systems: fused against composed cross-entropy
#
# Take a batch of 512 examples over 1000 classes (ImageNet's count) and compare
# the fused `cross_entropy` with the same loss composed from tensor operations.
# Three measurements: the time of forward + backward, the memory the graph keeps
# between forward and backward, and the peak memory allocated during forward +
# backward (`tracemalloc` sees NumPy's allocations).

# %%
def composed_cross_entropy(logits, labels):
    """The same loss from tensor operations: four graph nodes."""
    return -log_softmax(logits, axis=1)[tt.arange(len(labels)), labels].mean()


def graph_bytes(out):
    """Bytes of the arrays that the operations of out's graph keep for backward."""
    kept, seen, stack = {}, set(), [out._ctx]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        for name, value in vars(fn).items():
            if name == "inputs":
                stack.extend(t._ctx for t in value)
            elif hasattr(value, "nbytes"):
                kept[id(value)] = value.nbytes
    return sum(kept.values())


def measure(loss_fn, logits, labels, repeats=10):
    """(best seconds, bytes kept by the graph, peak bytes allocated) of forward + backward."""
    best = math.inf
    for _ in range(repeats):
        logits.grad = None
        start = time.perf_counter()
        loss_fn(logits, labels).backward()
        best = min(best, time.perf_counter() - start)
    kept = graph_bytes(loss_fn(logits, labels))
    logits.grad = None
    tracemalloc.start()
    loss_fn(logits, labels).backward()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, kept, peak


tt.manual_seed(0)
logits = tt.randn(512, 1000, requires_grad=True)
labels = tt.tensor(np.random.default_rng(0).integers(0, 1000, 512))
assert abs(cross_entropy(logits, labels).item() - composed_cross_entropy(logits, labels).item()) < 1e-5
mib = 2**20
results = {name: measure(fn, logits, labels) for name, fn in [("fused", cross_entropy), ("composed", composed_cross_entropy)]}
print(f"logits: {logits.data.nbytes / mib:.2f} MiB")
for name, (seconds, kept, peak) in results.items():
    print(f"{name:9s} {seconds * 1e3:6.2f} ms   kept for backward {kept / mib:5.2f} MiB   peak {peak / mib:5.2f} MiB")
fused, composed = results["fused"], results["composed"]
print(f"fused is {composed[0] / fused[0]:.1f}x faster and peaks {composed[2] / fused[2]:.1f}x lower")

# %% [markdown]
# Both keep one $N \times C$ array for backward (the softmax, or the
# log-softmax it is computed from), so the graphs weigh about the same. The
# difference is in the *backward pass*: the composed loss materialises a
# scattered one-hot gradient, an `exp` of the log-probabilities, a row sum and
# two more $N \times C$ products, each allocated, written and read once, while
# the fused one writes a single $N \times C$ array — its final answer. At this
# size each such pass costs about as much as the arithmetic in it, so fewer
# passes is faster. PyTorch, if installed, for scale — on one thread, as NumPy's
# elementwise operations run:

# %%
try:
    import torch
except ImportError:
    print("PyTorch is not installed; skipping the comparison")
else:
    torch.set_num_threads(1)
    logits_torch = torch.tensor(logits.numpy(), requires_grad=True)
    labels_torch = torch.tensor(labels.numpy())
    best = math.inf
    for _ in range(10):
        logits_torch.grad = None
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(logits_torch, labels_torch).backward()
        best = min(best, time.perf_counter() - start)
    print(f"torch.nn.functional.cross_entropy: {best * 1e3:.2f} ms")

# %% [markdown]
# ## How PyTorch does it
#
# * `nn.CrossEntropyLoss(reduction="mean")` / `F.cross_entropy(input, target)`
#   takes **logits**, never probabilities, of shape `(N, C)` (or `(N, C, d1, ...)`
#   for per-pixel classes). The target is either class indices of shape `(N,)`
#   and dtype `int64`, or — since PyTorch 1.10 — float probabilities of shape
#   `(N, C)`. It also offers `weight=` (per-class weights), `ignore_index=-100`
#   and `label_smoothing=`. It is `nn.NLLLoss` applied to `log_softmax`, fused.
# * `nn.BCELoss` clamps its logs at $-100$ exactly as ours; `nn.BCEWithLogitsLoss`
#   uses the same stable formula and adds `pos_weight=` for imbalanced data.
#   PyTorch's docs recommend the logits version for the reason plotted above.
# * `nn.MSELoss` broadcasts mismatched shapes with only a `UserWarning`; ours
#   raises.
# * `reduction` is `"mean"`, `"sum"` or `"none"` everywhere, as here.
#
# ## Summary
#
# * A loss is a negative log-likelihood: Gaussian noise gives MSE, a softmax
#   over classes gives cross-entropy, a sigmoid gives binary cross-entropy.
# * Work with logits: log-softmax (log-sum-exp) and the
#   $\max(x, 0) - xt + \log(1 + e^{-|x|})$ form never produce $\infty$ or `nan`.
# * The gradient of each is "prediction minus target" — $(\operatorname{softmax} - \text{one-hot})/N$,
#   $\sigma(x) - t$ — so one fused `Function` computes it directly, faster and
#   with fewer temporaries than the composed graph.
# * Check shapes: an `(N, 1)` prediction against an `(N,)` target must be an
#   error, not a broadcast.
