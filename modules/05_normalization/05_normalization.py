# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 05 — Dropout and normalisation
#
# *One sitting, about 1.5 hours: the lesson, 5 functions to write, and the measurements.*
#
# Module 04's layers compute; the layers of this module make deep networks
# *train*. Dropout keeps a network from relying on a few units (regularisation);
# normalisation keeps every layer's inputs at a fixed scale, without which a
# deep stack of layers shrinks or blows up its signal. Both behave differently
# in training and in evaluation — the reason `Module` has modes.
#
# **You will**
# 1. write inverted dropout, drawing its mask from the device's generator;
# 2. write the backward rule of one fused normalisation operation, and with it
#    `LayerNorm` (per sample) and `BatchNorm1d` (per channel over the batch, with
#    running averages for evaluation);
# 3. see what normalisation does to the activations of a deep network, and
#    measure what fusing the normalisation saves in time and memory, and what a
#    compiled loop saves beyond that.

# %%
import time
import tracemalloc

import numpy as np

import tinytrain as tt
from tinytrain import Tensor
from tinytrain.kernels.layer_norm import compiled_kernels_available, use_compiled_kernels
from tinytrain.nn import Linear, ReLU, Sequential

# %% [markdown]
# ## 1. `Dropout`
#
# Dropout (Srivastava et al., 2014) fights overfitting by setting each activation
# to zero with probability $p$ during training, so the network cannot rely on any
# single unit. At evaluation time nothing is dropped. That would make the next
# layer see inputs that are, on average, a factor $1-p$ larger at evaluation than
# in training. **Inverted dropout** fixes it during training instead: each kept
# value is scaled by $1/(1-p)$, so with a mask $m_i \sim \text{Bernoulli}(1-p)$,
# $$\mathbb E\left[\frac{m_i}{1-p} x_i\right] = \frac{1-p}{1-p}\, x_i = x_i ,$$
# and evaluation is simply the identity. The backward pass multiplies by the same
# mask: a dropped unit passes no gradient.
#
# The mask comes from the tensor's device generator, `x._backend.random_uniform`:
# keep where $u \ge p$. Drawing in float32 whatever the input dtype gives the same
# mask for float32 and float64 inputs after the same `tt.manual_seed`.

# %% export="nn/dropout"
"""Inverted dropout: ``dropout`` and the ``Dropout`` module."""
from tinytrain.arguments import check_number
from tinytrain.nn.module import Module
from tinytrain.tensor import Tensor


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by ``1/(1-p)``.

    The identity (``x`` itself) when ``training`` is false or ``p == 0``. ``p`` must be
    a number in [0, 1): the given first line raises ``TypeError`` or ``ValueError``
    otherwise, and makes it a float. The mask keeps the elements whose uniform
    draw ``u`` from ``x``'s device generator is ``>= p``; it is drawn in float32
    whatever ``x``'s dtype (the generators refuse float16, which mixed precision
    computes in) and then cast to ``x``'s dtype.
    """
    p = check_number("p", p, minimum=0, below=1)
    ### BEGIN SOLUTION
    if not training or p == 0:
        return x
    keep = x._backend.random_uniform(x.shape) >= p
    scaled_mask = keep.astype(x.dtype) * (1 / (1 - p))
    return x * Tensor._make(scaled_mask, x._backend)
    ### END SOLUTION


class Dropout(Module):
    """Inverted dropout in training mode, the identity in evaluation mode."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = check_number("p", p, minimum=0, below=1)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# %% check=2
tt.manual_seed(0)
all_ones = tt.ones(100_000)
dropped = dropout(all_ones, 0.3).numpy()
values = np.unique(dropped)
assert len(values) == 2 and values[0] == 0.0 and np.isclose(values[1], 1 / 0.7), values
assert abs((dropped == 0).mean() - 0.3) < 0.01 and abs(dropped.mean() - 1.0) < 0.02
assert dropout(all_ones, 0.3, training=False) is all_ones and dropout(all_ones, 0.0) is all_ones
layer = Dropout(0.5)
x = tt.randn(1000, requires_grad=True)
out = layer(x)
out.sum().backward()
np.testing.assert_allclose(x.grad.numpy(), (out.numpy() != 0) * 2.0)
assert layer.eval()(x) is x
for bad in (1.0, -0.1):
    try:
        Dropout(bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"Dropout({bad}) must raise ValueError")
print("dropout OK")

# %% [markdown]
# ## 2. Normalisation layers
#
# Module 04 showed that each default-initialised layer shrinks the signal; other
# choices make it grow. Deep networks train far more easily when every layer sees
# inputs of a fixed scale, and a **normalisation layer** enforces that directly:
# it standardises a group of $N$ numbers to mean 0 and variance 1,
# $$\mu = \frac1N \sum_i x_i,\qquad \sigma^2 = \frac1N \sum_i (x_i - \mu)^2,\qquad
#   \hat x_i = \frac{x_i - \mu}{\sqrt{\sigma^2 + \epsilon}},$$
# and then lets the network choose the scale it wants with a learned **affine**
# map $y_i = \gamma \hat x_i + \beta$ ($\gamma$ = `weight`, initialised to 1;
# $\beta$ = `bias`, initialised to 0). The small $\epsilon$ (`eps`, $10^{-5}$) keeps
# the division finite for a constant group. The two layers differ only in *which*
# numbers form a group:
#
# * **LayerNorm** (Ba et al., 2016) normalises each sample over its last axes
#   (its features): the statistics of one sample never depend on the others, so
#   training and evaluation compute the same thing. Transformers use it.
# * **BatchNorm** (Ioffe & Szegedy, 2015) normalises each *feature* (channel) over
#   the batch: for `(N, C)` inputs over the `N` rows, for `(N, C, L)` over `N` and
#   `L`. At evaluation time there may be no batch (one image at a time), so while
#   training it also keeps **running averages** of the batch statistics,
#   $$\text{running} \leftarrow (1 - m)\,\text{running} + m\,\text{batch}, \qquad m = 0.1\ (\texttt{momentum}),$$
#   and evaluation normalises with those. The running *variance* uses the
#   unbiased batch variance $\frac{n}{n-1}\sigma^2$, an estimate of the population's
#   (as PyTorch does), $n$ the number of values per channel: $N$ for `(N, C)`,
#   $N L$ for `(N, C, L)`. Normalising itself uses the biased $\sigma^2$. In
#   evaluation the running averages are constants, so the gradient is just the
#   scale: $\bar x = \gamma\, g / \sqrt{\text{running\_var} + \epsilon}$ (no
#   terms through the statistics, unlike `Normalize`'s). The running
#   averages are *buffers*: saved in `state_dict()`, never trained, and their
#   update is plain array arithmetic that does not enter the graph.
#
# ### One fused operation for $\hat x$
#
# Composed from tensor operations, $\hat x$ records seven of them (mean, subtract,
# square, mean, add, sqrt, divide), each storing a full-size intermediate. The
# backward rule of the whole normalisation is short enough to write by hand. The
# loss depends on $x_i$ directly and through $\mu$ and $\sigma^2$; with
# $\bar{\hat x} = g$, $s = 1/\sqrt{\sigma^2 + \epsilon}$ and the means taken over the group,
# $$\bar x_i = s\left(g_i - \operatorname{mean}(g) - \hat x_i\, \operatorname{mean}(g \hat x)\right).$$
# (The path through $\mu$ gives $-\operatorname{mean}(g)$; the path through
# $\sigma^2$, using $\partial\sigma^2/\partial x_i = 2(x_i-\mu)/N$, gives the last
# term.) The fused operation saves only $\hat x$ and $s$. Both layers get $\mu$
# and $\sigma^2$ from `normalize`, which BatchNorm also feeds into its running
# averages.
#
# `LayerNorm.forward` is `normalize` over the last `len(normalized_shape)` axes,
# then the affine map: `x_hat * self.weight + self.bias` is right. The given
# `normalize(x, axes, eps, weight, bias)` does the same in one node,
# `AffineNormalize`, which runs your `Normalize` and the affine map together
# (section 3 measures why); either passes. Where numba is installed, the library's
# LayerNorm runs a compiled loop of the same formulas instead of your `Normalize`
# (section 3 again); the graded checks grade your `Normalize` on its own.

# %% export="nn/normalization"
"""Normalisation: one fused operation (``Normalize``), ``LayerNorm`` and ``BatchNorm1d``.

Both layers standardise groups of numbers with :func:`normalize` and then apply a
learned ``weight`` and ``bias``; BatchNorm also keeps running averages of the
batch statistics for evaluation (its buffers).
"""
import math
from typing import Any

import numpy as np

from tinytrain.arguments import check_int, check_number, check_type
from tinytrain.autograd import Function
from tinytrain.backend import sum_dtype
from tinytrain.kernels import layer_norm as layer_norm_kernel
from tinytrain.kernels.reductions import column_sum, trailing_dot, trailing_mean
from tinytrain.nn.module import Module, Parameter
from tinytrain.tensor import Tensor, ones, tensor, zeros


class Normalize(Function):
    """``(x - mean) / sqrt(var + eps)``, where ``mean`` and ``var`` are ``x``'s own
    statistics over ``axes`` (with kept dimensions): backward differentiates through them."""

    def forward(self, x: Any, mean: Any, var: Any, axes: tuple[int, ...], eps: float, centered: Any = None) -> Any:
        """``centered``, when given, is ``x - mean``, an array the caller made for this and hands over
        (``normalize`` has it from the variance): it is scaled in place into ``x_hat``."""
        self.axes = axes
        self.inv_std = 1 / self.xp.sqrt(var + eps)
        self.x_hat = x - mean if centered is None else centered
        self.x_hat *= self.inv_std  # in place: one new array at most, not two
        return self.x_hat

    def backward(self, grad: Any) -> tuple:
        """``s * (g - mean(g) - x_hat * mean(g * x_hat))``, means over ``axes``.

        Never written into ``self.x_hat`` (it is also the output's own array, so writing
        into it would change the result the caller holds) nor into ``grad``; an array
        made here may be updated in place, which saves a pass over memory per step.
        """
        ### BEGIN SOLUTION
        x_hat, axes = self.x_hat, self.axes
        # trailing_mean(xp, a, axes) is a.mean(axis=axes, keepdims=True) and trailing_dot(xp, a, b, axes)
        # (a * b).sum(axis=axes, keepdims=True), both faster over a LayerNorm's short rows
        projection = trailing_dot(self.xp, grad, x_hat, axes) / math.prod(x_hat.shape[axis] for axis in axes)
        grad_x = grad - trailing_mean(self.xp, grad, axes)  # a new array: the rest works in place on it
        grad_x -= x_hat * projection
        grad_x *= self.inv_std
        return (grad_x,)
        ### END SOLUTION


class AffineNormalize(Normalize):
    """``Normalize`` over ``x``'s trailing axes, then ``* weight + bias``: a LayerNorm in one node, not three.

    Given, not a student's: it runs ``Normalize``'s forward and backward (yours) on the
    input as rows, ``(rows, n)`` with the trailing axes flattened into one (a view of a
    contiguous input), where NumPy broadcasts the per-row statistics faster than over
    the original axes, and applies the affine map in the same node, keeping nothing more
    than ``Normalize`` keeps: ``x_hat`` also gives ``weight``'s gradient. Backward:
    ``grad_weight = sum(g * x_hat)`` and ``grad_bias = sum(g)`` over the rows, and the
    input's gradient is ``Normalize``'s backward of ``g * weight``. ``mean`` and ``var``
    have kept dimensions, as ``normalize`` returns them; ``centered`` is ``x - mean`` as rows;
    ``axes`` (the trailing ones) is kept for readers of the graph, such as the ONNX export.

    ``compiled``: instead of ``centered``, what ``normalize`` got from the compiled loops
    (``kernels/layer_norm.py``, numba) -- the output, ``x_hat`` and ``s`` as rows; the node
    keeps the last two and its backward runs the compiled loop too.
    """

    compiled = False  # whether forward adopted the compiled loops' results

    def forward(self, x: Any, weight: Any, bias: Any, mean: Any, var: Any, axes: tuple[int, ...], eps: float,
                centered: Any = None, compiled: tuple[Any, Any, Any] | None = None) -> Any:
        self.shape, self.weight_shape = x.shape, weight.shape
        if compiled is not None:
            out, self.x_hat, self.inv_std = compiled
            self.weight, self.compiled = weight.reshape(-1), True
            return out.reshape(x.shape)
        rows = centered.shape
        x_hat = super().forward(x, mean.reshape(rows[0], 1), var.reshape(rows[0], 1), (1,), eps, centered)
        self.weight = weight.reshape(rows[1])
        out = x_hat * self.weight
        bias = bias.reshape(rows[1])
        out = self.xp.add(out, bias, out=out) if self.xp.result_type(out, bias) == out.dtype else out + bias
        return out.reshape(x.shape)

    def backward(self, grad: Any) -> tuple:
        rows = grad.reshape(self.x_hat.shape)  # a view when grad is contiguous
        needs = [t.requires_grad for t in self.inputs]
        if self.compiled:
            grads = layer_norm_kernel.backward_rows(rows, self.x_hat, self.inv_std, self.weight)
            shapes = (self.shape, self.weight_shape, self.weight_shape)
            return tuple(g.reshape(shape) if need else None for g, shape, need in zip(grads, shapes, needs))
        grad_weight = column_sum(self.xp, rows * self.x_hat).reshape(self.weight_shape) if needs[1] else None
        grad_bias = column_sum(self.xp, rows).reshape(self.weight_shape) if needs[2] else None
        grad_x = super().backward(rows * self.weight)[0].reshape(self.shape) if needs[0] else None
        return grad_x, grad_weight, grad_bias


def normalize(x: Tensor, axes: tuple[int, ...], eps: float = 1e-5, weight: Tensor | None = None,
              bias: Tensor | None = None) -> tuple[Tensor, Any, Any]:
    """``(x_hat, mean, var)``: ``x`` standardised over ``axes``, and its mean and biased
    variance over ``axes`` as arrays with kept dimensions (outside the graph); those of a
    bfloat16 ``x`` are float32 (``sum_dtype``: bfloat16 additions round at every step).

    With ``weight`` and ``bias`` (tensors of the shape of ``x``'s trailing ``axes``, which must
    be its last ones, as a LayerNorm's are) the first result is ``x_hat * weight + bias``, one
    node (``AffineNormalize``) instead of three; ``ValueError`` naming the shapes otherwise."""
    xp = x._backend.xp
    affine = weight is not None or bias is not None
    if affine:
        trailing = tuple(range(x.ndim - len(axes), x.ndim))
        if (weight is None or bias is None or sorted(axis % max(x.ndim, 1) for axis in axes) != list(trailing)
                or weight.shape != x.shape[trailing[0]:] or bias.shape != weight.shape):
            raise ValueError(f"normalize with weight and bias needs axes that are x's last ones and a weight and a "
                             f"bias of their shape: got x {x.shape}, axes={axes}, weight "
                             f"{None if weight is None else weight.shape}, bias {None if bias is None else bias.shape}")
        weight, bias = x._operand(weight), x._operand(bias)  # RuntimeError for a tensor on another device
        source, over = x.data.reshape(-1, weight.data.size), (1,)  # (rows, n): the trailing axes flattened, a view
        kept = (*x.shape[:trailing[0]], *(1,) * len(trailing))  # the statistics with x's kept dimensions
        if layer_norm_kernel.fits(x.data, weight.data, bias.data):  # numba installed, NumPy float arrays: section 3
            out, x_hat, mean, var, inv_std = layer_norm_kernel.forward_rows(source, weight.data.reshape(-1),
                                                                            bias.data.reshape(-1), eps)
            mean, var = mean.reshape(kept), var.reshape(kept)
            out = AffineNormalize.apply(x, weight, bias, mean=mean, var=var, axes=trailing, eps=eps,
                                        compiled=(out, x_hat, inv_std))
            return out, mean, var
    else:
        source, over = x.data, axes
    mean = trailing_mean(xp, source, over, sum_dtype(x.dtype))  # source.mean(axis=over, keepdims=True, dtype=...)
    centered = source - mean  # in the mean's dtype: float32 for bfloat16
    var = trailing_dot(xp, centered, centered, over) / math.prod(source.shape[axis] for axis in over)
    if not affine:
        return Normalize.apply(x, mean=mean, var=var, axes=axes, eps=eps, centered=centered), mean, var
    mean, var = mean.reshape(kept), var.reshape(kept)
    out = AffineNormalize.apply(x, weight, bias, mean=mean, var=var, axes=trailing, eps=eps, centered=centered)
    return out, mean, var


def _normalized_shape(shape: Any) -> tuple[int, ...]:
    """``LayerNorm``'s ``normalized_shape`` as a tuple of ``int``s >= 1: an int, or a non-empty tuple
    or list of them; ``TypeError`` or ``ValueError`` naming the value otherwise."""
    if isinstance(shape, (int, np.integer)):
        return (check_int("normalized_shape", shape, minimum=1),)
    check_type("normalized_shape", shape, (tuple, list), "an int or a tuple of ints")
    if not shape:
        raise ValueError(f"normalized_shape must hold at least one size, got normalized_shape={shape!r}")
    return tuple(check_int(f"normalized_shape[{i}]", size, minimum=1) for i, size in enumerate(shape))


class LayerNorm(Module):
    """Normalise each sample over its last ``len(normalized_shape)`` axes, then ``* weight + bias``.

    ``weight`` (ones) and ``bias`` (zeros) have shape ``normalized_shape``; the same
    computation in training and evaluation. An input of shape ``normalized_shape``
    itself is one sample. Raises ``ValueError`` naming the input's shape when its
    trailing axes are not ``normalized_shape``. ``normalized_shape`` (an int or a
    non-empty tuple of ints >= 1) and ``eps`` (a finite number > 0) are checked
    when the layer is built: ``TypeError`` or ``ValueError`` naming the value.
    """

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5) -> None:
        super().__init__()
        self.normalized_shape = _normalized_shape(normalized_shape)
        self.eps = check_number("eps", eps, above=0)
        self.weight = Parameter(ones(self.normalized_shape))
        self.bias = Parameter(zeros(self.normalized_shape))

    def forward(self, x: Tensor) -> Tensor:
        ### BEGIN SOLUTION
        k = len(self.normalized_shape)
        if x.ndim < k or x.shape[x.ndim - k:] != self.normalized_shape:
            raise ValueError(
                f"LayerNorm({self.normalized_shape}) expects input of shape (..., "
                f"{', '.join(map(str, self.normalized_shape))}), got {x.shape}"
            )
        # x_hat * self.weight + self.bias, in the same node as the normalisation (section 3)
        out, _, _ = normalize(x, tuple(range(x.ndim - k, x.ndim)), self.eps, self.weight, self.bias)
        return out
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


# %% [markdown]
# A quick look: a LayerNorm output has mean 0 and standard deviation 1 in every
# row, whatever the input's scale.

# %%
x = tt.randn(3, 6) * 5 + 2
y = LayerNorm(6)(x)
print("row means:", y.numpy().mean(axis=1).round(6), " row stds:", y.numpy().std(axis=1).round(4))

# %% check=2
x64 = tt.randn(4, 5, dtype="float64", requires_grad=True)
assert tt.gradcheck(lambda x: normalize(x, (1,))[0], [x64])
assert tt.gradcheck(lambda x: normalize(x, (0, 2))[0], [tt.randn(3, 2, 4, dtype="float64", requires_grad=True)])
layer = LayerNorm((2, 3))
a = np.random.default_rng(0).normal(size=(4, 2, 3)).astype(np.float32)
layer.weight.data[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
layer.bias.data[...] = 0.5
out = layer(tt.tensor(a)).numpy()
expected = (a - a.mean(axis=(1, 2), keepdims=True)) / np.sqrt(a.var(axis=(1, 2), keepdims=True) + 1e-5)
np.testing.assert_allclose(out, expected * np.arange(6).reshape(2, 3) + 0.5, rtol=1e-4, atol=1e-5)
assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
try:
    layer(tt.randn(4, 3, 2))
except ValueError as error:
    assert "(4, 3, 2)" in str(error), error
else:
    raise AssertionError("a LayerNorm input of the wrong shape must raise ValueError")
print("LayerNorm OK")

# %% export="nn/normalization"
class _BatchNorm(Module):
    """Batch normalisation over every axis but the channel axis 1 (``BatchNorm1d``, ``BatchNorm2d``).

    Training mode normalises with the batch's statistics and updates the running
    averages (``running_var`` with the unbiased variance); evaluation mode computes
    ``(x - running_mean) / sqrt(running_var + eps) * weight + bias``, each per-channel
    number reshaped to ``channel_shape``. The running averages are constants there:
    the gradient in ``x`` is ``weight / sqrt(running_var + eps) * g`` (not
    ``Normalize``'s, which differentiates through the batch's statistics), while
    ``weight`` and ``bias`` get their gradients in both modes (as in PyTorch, where
    fine-tuning with frozen statistics trains them). Training mode needs at least two values per
    channel (the unbiased variance divides by count - 1): fewer, as in a batch of one
    ``(1, C)`` sample, raise ``ValueError`` naming the layer and the input's shape,
    before any running average changes. Subclasses set ``input_ndims``.

    The settings are checked when the layer is built (``TypeError`` or ``ValueError``
    naming the value): ``num_features`` a whole number >= 1, ``eps`` a finite number
    > 0, ``momentum`` a number in [0, 1]. PyTorch's ``momentum=None`` (a cumulative
    average of every batch so far) is not implemented and raises ``TypeError`` saying so.
    """

    input_ndims: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        if momentum is None:
            raise TypeError("momentum=None (PyTorch's cumulative moving average of every batch so far) is not "
                            "supported by tinytrain: give a number in [0, 1], such as the default 0.1")
        self.num_features = check_int("num_features", num_features, minimum=1)
        self.eps = check_number("eps", eps, above=0)
        self.momentum = check_number("momentum", momentum, minimum=0, maximum=1)
        self.weight = Parameter(ones(num_features))
        self.bias = Parameter(zeros(num_features))
        self.register_buffer("running_mean", zeros(num_features))
        self.register_buffer("running_var", ones(num_features))
        self.register_buffer("num_batches_tracked", tensor(0))  # int64

    def _update_running_stats(self, mean: Any, unbiased_var: Any) -> None:
        """Exponential moving averages of the batch statistics (arrays: not in the graph).

        ``mean`` and ``unbiased_var`` hold one number per channel, shaped ``(C,)`` or
        with ``normalize``'s kept dimensions (``(1, C)``, ``(1, C, 1)``).

        Updates all three buffers in place (their arrays stay the same objects: a
        checkpointed layer restores them by value): ``running_mean`` and
        ``running_var`` become ``(1 - momentum) * running + momentum * batch``, and
        ``num_batches_tracked`` goes up by one.
        """
        ### BEGIN SOLUTION
        m = self.momentum
        for buffer, batch in ((self.running_mean, mean), (self.running_var, unbiased_var)):
            buffer.data *= 1 - m
            buffer.data += m * batch.reshape(self.num_features)
        self.num_batches_tracked.data += 1
        ### END SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self.input_ndims or x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) expects input with "
                f"{' or '.join(map(str, self.input_ndims))} axes and {self.num_features} channels on axis 1, "
                f"got shape {x.shape}"
            )
        channel_shape = (self.num_features,) + (1,) * (x.ndim - 2)  # broadcasts against (N, C, ...)
        ### BEGIN SOLUTION
        if self.training:
            count = x.size // self.num_features
            if count < 2:
                raise ValueError(f"{type(self).__name__} in training mode needs more than one value per channel, "
                                 f"got input of shape {x.shape}")
            x_hat, mean, var = normalize(x, (0,) + tuple(range(2, x.ndim)), self.eps)
            self._update_running_stats(mean, var * (count / (count - 1)))
            return x_hat * self.weight.reshape(channel_shape) + self.bias.reshape(channel_shape)
        inv_std = Tensor._make(1 / x._backend.xp.sqrt(self.running_var.data + self.eps), x._backend)
        scale = self.weight * inv_std  # fold normalisation and affine map into one scale and shift
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(channel_shape) + shift.reshape(channel_shape)
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of ``(N, C)`` or ``(N, C, L)`` inputs, per channel ``C``."""

    input_ndims = (2, 3)


# %% check=3
a = np.random.default_rng(1).normal(3.0, 2.0, size=(8, 3)).astype(np.float32)
bn = BatchNorm1d(3)
out = bn(tt.tensor(a)).numpy()
np.testing.assert_allclose(out, (a - a.mean(0)) / np.sqrt(a.var(0) + 1e-5), rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * a.mean(0), rtol=1e-5)
np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * a.var(0, ddof=1), rtol=1e-5)
assert bn.num_batches_tracked.item() == 1
assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
bn.eval()
running_mean, running_var = bn.running_mean.numpy(), bn.running_var.numpy()
np.testing.assert_allclose(bn(tt.tensor(a)).numpy(), (a - running_mean) / np.sqrt(running_var + 1e-5), rtol=1e-4)
assert bn.num_batches_tracked.item() == 1, "evaluation must not update the running statistics"
seq = BatchNorm1d(2).to(dtype="float64")
x3 = tt.randn(4, 2, 3, dtype="float64", requires_grad=True)
assert tt.gradcheck(lambda x, w, b: seq(x), [x3, seq.weight, seq.bias])  # train mode, (N, C, L)
assert bn(tt.randn(1, 3)).shape == (1, 3)  # one sample is fine in evaluation mode
bn3 = BatchNorm1d(3).eval()
bn3.running_mean.data[...] = [1.0, 2.0, 3.0]
np.testing.assert_allclose(bn3(tt.zeros(1, 3, 2)).numpy()[0], -np.array([[1.0] * 2, [2.0] * 2, [3.0] * 2]) / np.sqrt(1 + 1e-5),
                           rtol=1e-5, err_msg="evaluation mode of an (N, C, L) input: one running mean per channel")
print("BatchNorm1d OK")

# %% [markdown]
# ### What normalisation does to a deep network
#
# Push a batch of 512 standard-normal inputs through ten `Linear(256, 256)` +
# `ReLU` blocks with PyTorch's default initialisation. After each block, measure
# how much each unit's activation varies *from one input to the next* (its
# standard deviation over the batch, averaged over the units): that variation is
# what carries information about the input. Then do the same with a `BatchNorm1d`
# before each ReLU.

# %%
import matplotlib.pyplot as plt


def activation_stds(batchnorm: bool, depth: int = 10, width: int = 256) -> list[float]:
    tt.manual_seed(0)
    blocks = []
    for _ in range(depth):
        blocks += [Linear(width, width)] + ([BatchNorm1d(width)] if batchnorm else []) + [ReLU()]
    net = Sequential(*blocks)
    h, stds = tt.randn(512, width), []
    with tt.no_grad():
        for block in net:
            h = block(h)
            if isinstance(block, ReLU):
                stds.append(float(h.numpy().std(axis=0).mean()))
    return stds


plain, normalised = activation_stds(False), activation_stds(True)
for depth, (p, n) in enumerate(zip(plain, normalised), 1):
    print(f"block {depth:2d}: std without BatchNorm {p:.2e}   with BatchNorm {n:.3f}")
plt.figure(figsize=(5, 3))
plt.semilogy(range(1, 11), plain, "o-", label="Linear + ReLU")
plt.semilogy(range(1, 11), normalised, "s-", label="Linear + BatchNorm + ReLU")
plt.xlabel("block")
plt.ylabel("std over the batch")
plt.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Without normalisation the input's signal shrinks by a factor of about 3 per
# block (the printed spreads: 0.34, 0.11, 0.04, ...): the initialisation divides
# the variance by 3, and the ReLU, which zeroes about half of the values, leaves
# roughly a third of what still varies between inputs. After ten
# blocks the activations differ between inputs by less than $10^{-4}$ — the output
# hardly depends on the input any more (what is left is mostly the biases), and
# the gradients flowing back shrink the same way. With BatchNorm every block's
# output keeps the spread of a ReLU of a standard normal,
# $\sqrt{(1 - 1/\pi)/2} \approx 0.58$, at any depth.

# %% [markdown]
# ## 3. Systems: what the fused normalisation saves
#
# `normalize` records one operation that keeps $\hat x$ and one number per
# group. Composed from tensor operations, the same $\hat x$ records seven (mean,
# subtract, square, mean, add, square root, divide), and the graph keeps their
# intermediate arrays until backward. Measure both on the activations of a
# hidden layer — a batch of 256 rows of 1,024 features — forward and backward:


# %%
def composed(x: Tensor) -> Tensor:
    mean = x.mean(axis=1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=1, keepdims=True)
    return centered / (var + 1e-5).sqrt()


def fused(x: Tensor) -> Tensor:
    return normalize(x, (1,))[0]


x = tt.randn(256, 1024, requires_grad=True)
grad = tt.randn(256, 1024)
for name, fn in (("composed", composed), ("fused", fused)):
    tracemalloc.start()
    out = fn(x)
    kept = tracemalloc.get_traced_memory()[0]  # what the graph holds once forward is done
    tracemalloc.stop()
    out.backward(grad)
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        fn(x).backward(grad)
        best = min(best, time.perf_counter() - start)
    print(f"{name:8s} forward + backward {best * 1e3:6.2f} ms, arrays kept for backward {kept / 2**20:5.1f} MiB")
np.testing.assert_allclose(composed(x).numpy(), fused(x).numpy(), atol=1e-5)

# %% [markdown]
# The composed version keeps several full-size arrays where the fused one keeps
# $\hat x$ and one number per row, and it runs seven forward and seven backward
# steps where the fused one runs one of each. In a network, every normalisation
# layer pays that, at every step.
#
# One more cost hides in the means. NumPy sums a short last axis one row at a time,
# a call of its inner loop per row, and for a LayerNorm's 128 channels those calls
# cost more than the additions. The library's `Normalize` therefore takes its means
# with `trailing_mean(xp, a, axes)` (`tinytrain/kernels/reductions.py`): the same
# `a.mean(axis=axes, keepdims=True)`, computed as a product with a vector of ones,
# `rows @ ones / n`, which BLAS runs at memory speed (about 4x faster for
# `(12, 64, 128)` float32, and a GPT step 1% faster). Your `.mean` is just as right.
# Its `mean(g * x_hat)` goes one step further: `trailing_dot(xp, g, x_hat, axes)`
# is `(g * x_hat).sum(axis=axes, keepdims=True)` without the product array
# (NumPy's `vecdot` multiplies and adds each row in one pass), divided by the
# group's size. `normalize` gets the variance the same way, as the dot product of
# $x - \mu$ with itself, and hands that array to `Normalize`, which scales it into
# $\hat x$ in place instead of subtracting the mean a second time.
#
# A LayerNorm's affine map costs more than its arithmetic, too. As `x_hat *
# weight + bias` it records two more nodes, makes two more full-size arrays
# forward, and runs two more backward rules. `normalize(x, axes, eps, weight, bias)`
# records one node, `AffineNormalize` (given), whose backward is your
# `Normalize.backward` of `g * weight` plus the two sums over rows,
# $\bar\gamma = \sum g \hat x$ and $\bar\beta = \sum g$. It works on the input as
# rows, `(rows, n)` with the trailing axes flattened (a view): NumPy broadcasts the
# per-row $\mu$ and $s$ over a 2-D array faster than over `(12, 64, 1)`. Measure
# both forms on a GPT's activations, batch 12 of 64 positions of 128 channels:


# %%
def three_nodes(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return normalize(x, (2,))[0] * weight + bias


def one_node(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return normalize(x, (2,), 1e-5, weight, bias)[0]


def median_time(fn, *args: Tensor) -> float:
    """The median of 50 forward + backward passes, in seconds."""
    samples = []
    for _ in range(50):
        start = time.perf_counter()
        fn(*args).backward(grad)
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


x = tt.randn(12, 64, 128, requires_grad=True)
weight, bias = tt.randn(128, requires_grad=True), tt.randn(128, requires_grad=True)
grad = tt.randn(12, 64, 128)
times = {}
with use_compiled_kernels(False):  # your Normalize in both forms (the compiled loop comes next)
    for name, fn in (("three nodes", three_nodes), ("one node", one_node)):
        times[name] = median_time(fn, x, weight, bias)
        print(f"{name:11s} forward + backward {times[name] * 1e6:5.0f} us (median of 50)")
    np.testing.assert_allclose(three_nodes(x, weight, bias).numpy(), one_node(x, weight, bias).numpy(), atol=1e-5)
print(f"one node / three nodes: {times['one node'] / times['three nodes']:.2f}")

# %% [markdown]
# On a 2-core machine the single node took 0.75 to 0.95 of the three nodes' time
# here, and inside a whole GPT training step, where the arrays no longer sit in
# the processor's caches, the step ran 2-3% faster with it (nine LayerNorms a step).
#
# ### A compiled loop
#
# Even as one node, every NumPy operation reads and writes a whole array: over
# these 12 x 64 x 128 float32 numbers (384 KiB) a pass costs 20-30 us, and the
# LayerNorm makes about five passes forward (subtract the mean, scale by $s$,
# multiply by the weight, add the bias, plus two reductions) and ten backward.
# PyTorch's LayerNorm is a C++ loop that reads each row once forward and once
# backward. `tinytrain/kernels/layer_norm.py` (given) writes this section's
# formulas as two such loops over the rows,
# $$\mu, \sigma^2 \to \hat x = (x - \mu)\,s,\ \ y = \hat x\,\gamma + \beta
# \qquad\text{and}\qquad
# \bar x = s\left(g\gamma - \operatorname{mean}(g\gamma) - \hat x\,\operatorname{mean}(g\gamma\hat x)\right),$$
# with $\bar\gamma$ and $\bar\beta$ summed on the way, and numba compiles them to
# machine code the first time they run (a second or two, cached on disk for the
# next process). `normalize` runs them when numba is installed and the input,
# weight and bias are NumPy float32 or float64 arrays; everything else (CuPy,
# bfloat16, no numba) runs your `Normalize`. They add in another order, so the
# results agree with yours to rounding, not bit for bit. Measure both on the
# same activations; `use_compiled_kernels(False)` switches the loops off:


# %%
if compiled_kernels_available():
    for compiled in (False, True):
        with use_compiled_kernels(compiled):
            one_node(x, weight, bias).backward(grad)  # the first call compiles the loops (or loads them)
            times[compiled] = median_time(one_node, x, weight, bias)
            outputs = one_node(x, weight, bias).numpy()
        np.testing.assert_allclose(outputs, three_nodes(x, weight, bias).numpy(), rtol=1e-4, atol=1e-5)
        print(f"{'compiled loops' if compiled else 'your Normalize'}: forward + backward {times[compiled] * 1e6:5.0f} us")
    print(f"compiled / yours: {times[True] / times[False]:.2f}")
else:
    print("numba is not installed (pip install 'tinytrain[compiled]'): every LayerNorm runs your Normalize")

# %% [markdown]
# On a 2-core machine the loops took a quarter to 0.3 of your node's time here
# (0.17-0.2 ms against 0.55-0.72 ms), and a whole GPT training step of the
# milestone's model (nine LayerNorms) ran about 3% faster with them, the steps
# taking turns in one process. That is the price of NumPy's
# one-operation-at-a-time model, and why frameworks fuse: PyTorch by writing
# kernels by hand, `torch.compile` by generating them. Your `Normalize` is the
# specification; the loop is a faster way to run it, checked against it
# (`tests/test_kernels_layer_norm.py`).
#
# ## How PyTorch does it
#
# PyTorch has the same layers: `nn.Dropout` (and `F.dropout`), `nn.LayerNorm` and
# `nn.BatchNorm1d`, with the same momentum, eps, unbiased running variance and
# buffer names. Its normalisation
# layers are fused kernels in C++/CUDA, as our `Normalize` is a fused operation
# in NumPy; `torch.nn.functional.layer_norm` and `batch_norm` are their
# functional forms.
#
# ## Summary
#
# * Inverted dropout scales kept values by $1/(1-p)$ so that evaluation is the identity.
# * LayerNorm normalises each sample, BatchNorm each channel over the batch, with
#   running averages for evaluation; both share one fused normalisation whose
#   backward is $s(g - \bar g - \hat x\,\overline{g\hat x})$.
# * Without normalisation, a deep stack of default-initialised layers shrinks its
#   signal by a constant factor per layer; with it, every layer sees the same scale.
# * NumPy pays a pass over memory per operation; a compiled loop of the same
#   formulas (numba, `use_compiled_kernels`) reads each row once, as PyTorch's kernel does.
