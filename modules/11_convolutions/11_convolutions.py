# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 11 — Convolutions
#
# *One sitting, about 2.5 hours: the lesson, 11 functions to write, and the measurements.*
#
# A `Linear` layer on a 28×28 image connects every pixel to every unit: it does
# not know that neighbouring pixels belong together, and a digit shifted by one
# pixel looks like a new input. A **convolution** slides one small filter over
# the whole image instead. The same few weights are used at every position
# (*weight sharing*), so a feature detector learned in one corner works in every
# corner, and the layer has $C_\text{in} \cdot C_\text{out} \cdot k^2$ weights
# whatever the image size. Stacking convolutions and **pooling** layers (which
# shrink the image) gives a network that sees small details first and larger
# shapes later: a CNN.
#
# Written as the formula says, a convolution is seven nested loops — TinyTorch's
# `Conv2d` is exactly that, and a small CNN's training step then takes about
# 3,000 times as long as PyTorch's. Ours will be within a factor of two of
# PyTorch, in NumPy, with code that is still short enough to read.
#
# **You will**
# 1. write a convolution with loops, straight from the definition;
# 2. turn it into **one matrix product** by unfolding the image into columns
#    (*im2col*), and derive the backward pass: two more matrix products and a
#    fold back (*col2im*);
# 3. wrap it as `conv2d` / `Conv2d` with PyTorch's initialisation;
# 4. write max and average pooling — with a rule for ties — and `BatchNorm2d`;
# 5. time loops against im2col against PyTorch, find where the rest of the time
#    goes (a NumPy reduction trap, and page faults), and fix it.

# %%
import os

# One thread for the matrix products, set before NumPy loads: section 8 times
# things, and on a small shared machine a second thread mostly waits for the first.
for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

import math
import time

import matplotlib.pyplot as plt
import numpy as np

import tinytrain as tt
from tinytrain import Tensor

try:
    import torch  # optional: only for comparisons
except ImportError:
    torch = None

# %% [markdown]
# ## 1. What a convolution computes
#
# The input is a batch of images with channels, shape $(N, C, H, W)$ — for
# MNIST $(N, 1, 28, 28)$, for colour images $C = 3$. A `Conv2d` layer with
# $O$ output channels and a $k_H \times k_W$ kernel holds a weight $w$ of shape
# $(O, C, k_H, k_W)$ — one filter per output channel, each spanning all input
# channels — and a bias $b$ of shape $(O,)$. With **stride** $s$ (how far the
# filter moves per step) and **padding** $p$ (zeros added around the border),
# output channel $o$ at position $(r, q)$ is
#
# $$y_{n,o,r,q} = b_o + \sum_{c=0}^{C-1} \sum_{i=0}^{k_H-1} \sum_{j=0}^{k_W-1}
#   w_{o,c,i,j}\; \tilde x_{n,\,c,\,r s + i,\,q s + j},$$
#
# where $\tilde x$ is the padded input. The filter fits
# $H_\text{out} = \lfloor (H + 2p - k_H)/s \rfloor + 1$ times down the image
# (and the same across). Two cases to remember: a 3×3 kernel with padding 1 and
# stride 1 keeps the size ("same" convolution); stride 2 halves it.
#
# (Mathematicians would call this a *cross-correlation*: a true convolution
# flips the kernel. Every deep-learning library computes the formula above and
# calls it convolution; since the weights are learned, the flip does not matter.)
#
# **Worked example.** One 3×3 image and one 2×2 filter, stride 1, no padding:
#
# ```
# x = 1 2 3      w = 1 0      y = 1·1 + 2·0 + 4·0 + 5·1   2·1 + 3·0 + 5·0 + 6·1   =  6  8
#     4 5 6          0 1          4·1 + 5·0 + 7·0 + 8·1   5·1 + 6·0 + 8·0 + 9·1      12 14
#     7 8 9
# ```
#
# The output is 2×2 because the filter fits twice in each direction.
#
# ### The definition as loops
#
# Write it exactly like that: loop over the batch, the output channels and the
# output positions, and take the sum over the window with NumPy. This version
# works on plain NumPy arrays; it is our ground truth, not part of the library.

# %%
def conv2d_loops(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                 stride: int = 1, padding: int = 0) -> np.ndarray:
    """The convolution formula, one output number at a time. ``x``: (N, C, H, W),
    ``weight``: (O, C, kH, kW), ``bias``: (O,) or None; returns (N, O, H_out, W_out)
    in the inputs' dtype (float32 in, float32 out)."""
    ### BEGIN SOLUTION
    n_images, _, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out_h = (height + 2 * padding - kh) // stride + 1
    out_w = (width + 2 * padding - kw) // stride + 1
    out = np.zeros((n_images, out_channels, out_h, out_w), dtype=x.dtype)
    for n in range(n_images):
        for o in range(out_channels):
            for r in range(out_h):
                for q in range(out_w):
                    window = x[n, :, r * stride:r * stride + kh, q * stride:q * stride + kw]
                    out[n, o, r, q] = (window * weight[o]).sum() + (0 if bias is None else bias[o])
    return out
    ### END SOLUTION


# %% check=1
x = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
w = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])
assert conv2d_loops(x, w).tolist() == [[[[6.0, 8.0], [12.0, 14.0]]]]
assert conv2d_loops(x, w, bias=np.array([0.5])).tolist() == [[[[6.5, 8.5], [12.5, 14.5]]]]
assert conv2d_loops(x, w, padding=1).shape == (1, 1, 4, 4) and conv2d_loops(x, w, padding=1)[0, 0, 0, 0] == 1.0
assert conv2d_loops(np.ones((2, 3, 5, 7)), np.ones((4, 3, 3, 3)), stride=2).shape == (2, 4, 2, 3)
print("conv2d_loops OK")

# %% [markdown]
# ## 2. im2col: a convolution is one matrix product
#
# Look at the formula again. For a fixed output position $(r, q)$ the sum runs
# over the $C k_H k_W$ numbers under the filter — the *patch* at that position —
# and multiplies them with the $C k_H k_W$ numbers of the filter. That is a dot
# product, and doing it for every filter and every position is a **matrix
# product**:
#
# * write each patch as a column: the matrix of *columns* has
#   $C k_H k_W$ rows and one column per output position,
#   $L = H_\text{out} W_\text{out}$ (this unfolding is called **im2col**,
#   "image to columns");
# * write each filter as a row: `weight.reshape(O, C * kH * kW)`;
# * then $Y = W_\text{rows}\,\text{cols}$ has shape $(O, L)$ — that is the output
#   image, one row per channel — and adding $b$ to each row finishes the job.
#
# The reshape of the weight orders each row as $(c, i, j)$, so the column must
# list its patch in the same order. Here is the unfolding of a 4×4 image with
# a 2×2 window: every column is one window, read row by row.

# %%
image = np.arange(16).reshape(1, 1, 4, 4)
windows = np.lib.stride_tricks.sliding_window_view(image, (2, 2), axis=(2, 3))  # (1, 1, 3, 3, 2, 2)
columns = windows.transpose(0, 1, 4, 5, 2, 3).reshape(4, 9)
print("image:\n", image[0, 0], "\n\ncolumns (one per window, 4 numbers each):\n", columns)

fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3), gridspec_kw={"width_ratios": [1, 2.2]})
left.imshow(image[0, 0], cmap="Blues", vmin=-8, vmax=24)
left.add_patch(plt.Rectangle((0.5, 0.5), 2, 2, fill=False, edgecolor="red", linewidth=3))  # window 4
for (row, col), value in np.ndenumerate(image[0, 0]):
    left.text(col, row, value, ha="center", va="center")
left.set_title("image: window (1, 1) in red")
right.imshow(columns, cmap="Blues", vmin=-8, vmax=24)
right.add_patch(plt.Rectangle((3.5, -0.5), 1, 4, fill=False, edgecolor="red", linewidth=3))
for (row, col), value in np.ndenumerate(columns):
    right.text(col, row, value, ha="center", va="center")
right.set_title("im2col: one column per output position")
right.set_xlabel("output position l = r * W_out + q")
right.set_ylabel("(c, i, j)")
for axis in (left, right):
    axis.set_xticks([])
    axis.set_yticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Unfolding without loops: `sliding_window_view`
#
# NumPy's `sliding_window_view(x, (kH, kW), axis=(2, 3))` returns every
# $k_H \times k_W$ window of the last two axes as an array of shape
# $(N, C, H - k_H + 1, W - k_W + 1, k_H, k_W)$ — **without copying anything**: it
# is a *view* whose strides step through the same memory again (moving one
# window to the right is one element in memory, like moving one pixel). Slicing
# `[:, :, ::sH, ::sW]` keeps every $s$-th window: that is the stride. Only the
# final reshape into columns copies, because the columns overlap in the image
# but not in the result — each pixel is copied about $k_H k_W$ times.
#
# We keep the batch axis in front: the columns are $(N, C k_H k_W, L)$ and
# `xp.matmul(w_rows, cols)` multiplies the same $(O, C k_H k_W)$ filter matrix
# with each image's columns, giving $(N, O, L)$ — which reshapes to the
# $(N, O, H_\text{out}, W_\text{out})$ output for free. (Putting the batch into
# the columns instead, $(C k_H k_W, N L)$, gives one larger product but an
# $(O, N, \dots)$ result that must be transposed — a full copy of the output;
# we measured it slower.)
#
# The function gets the array namespace `xp` (NumPy, CuPy, or the strict test
# device) from its caller, like everything in a `Function`, so the same code
# runs on a GPU. It writes into `out` when given one — section 8 explains why.

# %% export="nn/conv"
"""Convolution and pooling: ``Conv2d``, ``MaxPool2d``, ``AvgPool2d``, ``BatchNorm2d``
and the functional forms ``conv2d``, ``max_pool2d`` and ``avg_pool2d``.

``conv2d`` unfolds the image into columns (im2col, with ``sliding_window_view``)
and computes every output with one matrix product; backward is two more products
and a fold back (col2im) by strided additions, one per kernel offset. On NumPy the
convolution hands each layer to the library's fast paths instead
(``tinytrain.kernels.convolution``: the same recipe in cache-sized parts of the
batch, and Winograd's algorithm for wide 3x3 layers). Pooling visits the
``kH * kW`` offsets of its window the same way. All array math goes through the
backend's ``xp``, so the code runs unchanged on every device, and nothing is read
back to the host (no ``float()``, ``.item()`` or ``if`` on a device array: on a GPU
each read waits for the device).
"""
import math
from typing import Any

import numpy as np

from tinytrain.autograd import Function
from tinytrain.kernels import convolution
from tinytrain.kernels.parts import cache_sized_parts
from tinytrain.nn.layers import _uniform_parameter, check_floating_input
from tinytrain.nn.normalization import _BatchNorm
from tinytrain.nn.module import Module
from tinytrain.tensor import Tensor


def _pair(value: Any, name: str, minimum: int = 1) -> tuple[int, int]:
    """``3 -> (3, 3)``, ``(3, 5) -> (3, 5)``; ValueError below ``minimum``."""
    def is_int(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    pair = (value, value) if is_int(value) else tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(pair) != 2 or not all(is_int(v) for v in pair):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(pair[0]), int(pair[1])


def output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """How many windows of ``kernel`` fit along an axis of ``size``: ``(size + 2p - k) // s + 1``."""
    return (size + 2 * padding - kernel) // stride + 1


def im2col(xp: Any, x: Any, kernel: tuple[int, int], stride: tuple[int, int], out: Any = None) -> Any:
    """Unfold the (already padded) images ``x`` of shape ``(N, C, H, W)`` into columns.

    Returns ``(N, C * kH * kW, H_out * W_out)``: column ``l = r * W_out + q`` of image
    ``n`` lists the window at output position ``(r, q)`` in ``(c, i, j)`` order, so
    that ``weight.reshape(O, -1) @ cols[n]`` is the convolution of image ``n``.
    Writes into ``out`` (an array of the result's shape) when given, else into a
    new array; either way this is the one copy.
    """
    ### BEGIN SOLUTION
    kh, kw = kernel
    windows = xp.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::stride[0], ::stride[1]]
    n, c, out_h, out_w = windows.shape[:4]
    patches = windows.transpose(0, 1, 4, 5, 2, 3)  # (N, C, kH, kW, H_out, W_out): still a view
    if out is None:
        out = xp.empty((n, c * kh * kw, out_h * out_w), dtype=x.dtype)
    out.reshape(patches.shape)[...] = patches
    return out
    ### END SOLUTION


# %% check=1
cols = im2col(np, np.arange(16.0).reshape(1, 1, 4, 4), (2, 2), (1, 1))
assert cols.shape == (1, 4, 9) and cols[0, :, 0].tolist() == [0, 1, 4, 5] and cols[0, :, 8].tolist() == [10, 11, 14, 15]
cols = im2col(np, np.arange(2 * 25.0).reshape(1, 2, 5, 5), (3, 3), (2, 2))
assert cols.shape == (1, 18, 4), "stride 2 on 5x5 with a 3x3 window: 2x2 positions"
assert cols[0, :9, 1].tolist() == [2, 3, 4, 7, 8, 9, 12, 13, 14] and cols[0, 9, 0] == 25
buffer = np.empty((1, 18, 4))
assert im2col(np, np.arange(50.0).reshape(1, 2, 5, 5), (3, 3), (2, 2), out=buffer) is buffer
print("im2col OK")

# %% [markdown]
# ## 3. The backward pass: two products and col2im
#
# Write $G = \bar Y$ for the gradient arriving at the output, as $(N, O, L)$, and
# $A = W_\text{rows}$, so that $Y_n = A\,\text{cols}_n + b$ for every image $n$.
# This is a `Linear` layer in disguise (Module 04), and the rules are the same:
#
# $$\bar A = \sum_n G_n\, \text{cols}_n^\top, \qquad
#   \overline{\text{cols}}_n = A^\top G_n, \qquad
#   \bar b_o = \sum_{n, l} G_{n, o, l}.$$
#
# $\bar A$ reshapes back to the weight's $(O, C, k_H, k_W)$. The last step is new:
# from $\overline{\text{cols}}$ to $\bar x$. Every entry of `cols` is a *copy* of
# one input pixel, and a pixel used in several windows was copied several times;
# its gradient is the **sum** of the gradients of all its copies (the same rule
# as for a broadcast, Module 02). Folding the columns back while adding is
# **col2im**.
#
# Done one column entry at a time that would be a Python loop over millions of
# numbers. But look at the entries for one kernel offset $(i, j)$: over all output
# positions they came from the pixels $\tilde x_{n, c, r s + i, q s + j}$ — a
# strided slice of the image, `x[:, :, i : i + sh*H_out : sh, j : j + sw*W_out : sw]`
# (stride `sh` down, `sw` across). So col2im is a loop over the $k_H k_W$ offsets
# (9 for a 3×3 kernel), each adding a whole $(N, C, H_\text{out}, W_\text{out})$
# block into its slice, with the columns viewed as $(N, C, k_H, k_W, H_\text{out}, W_\text{out})$:
#
# ```python
# blocks = grad_cols.reshape(N, C, kH, kW, H_out, W_out)
# for i in range(kH):
#     for j in range(kW):
#         grad_x[:, :, i : i + sh*H_out : sh, j : j + sw*W_out : sw] += blocks[:, :, i, j]
# ```
#
# With stride 1 and a 3×3 kernel the nine slices overlap, which is why it must
# be `+=`, never `=`. Finally, the gradient of a padded image has the padding
# cut off: the zeros we added are not inputs. For a padded height $H$ the input's
# rows are `ph : H - ph` — not `ph : -ph`: with padding 0 that is `0 : -0`, and
# since `-0` is `0` the slice `0 : 0` is empty (the same across, with `pw`).

# %% export="nn/conv"
def col2im(xp: Any, cols: Any, shape: tuple[int, ...], kernel: tuple[int, int], stride: tuple[int, int],
           out: Any = None) -> Any:
    """The adjoint of :func:`im2col`: add every entry of ``cols`` ``(N, C*kH*kW, L)``
    back to the pixel of the (padded) image of ``shape`` ``(N, C, H, W)`` it was copied from.

    Returns the image; pixels in several windows receive the sum. Adds into ``out``
    (zeros of ``shape``) when given, else into a new array of ``cols``' dtype.
    """
    ### BEGIN SOLUTION
    n, c, height, width = shape
    kh, kw = kernel
    sh, sw = stride
    out_h, out_w = output_size(height, kh, sh), output_size(width, kw, sw)
    patches = cols.reshape(n, c, kh, kw, out_h, out_w)
    image = xp.zeros(shape, dtype=cols.dtype) if out is None else out
    for i in range(kh):
        for j in range(kw):
            image[:, :, i:i + sh * (out_h - 1) + 1:sh, j:j + sw * (out_w - 1) + 1:sw] += patches[:, :, i, j]
    return image
    ### END SOLUTION


# %% check=1
ones = np.ones((1, 1, 3, 3))
counts = col2im(np, im2col(np, ones, (2, 2), (1, 1)), ones.shape, (2, 2), (1, 1))
assert counts[0, 0].tolist() == [[1, 2, 1], [2, 4, 2], [1, 2, 1]], "each pixel gets one per window it is in"
rng = np.random.default_rng(0)
a, b = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((2, 27, 6))  # 3x3 window, stride 2 -> 3x2 = 6
assert np.isclose((im2col(np, a, (3, 3), (2, 2)) * b).sum(), (a * col2im(np, b, a.shape, (3, 3), (2, 2))).sum()), \
    "col2im must be the adjoint of im2col: <im2col(a), b> == <a, col2im(b)>"
print("col2im OK")

# %% [markdown]
# The second check is the definition of an *adjoint*: im2col is a linear map,
# and col2im is its transpose, so $\langle \text{im2col}(a), b\rangle =
# \langle a, \text{col2im}(b)\rangle$ for any $a, b$. That identity is exactly
# what makes col2im the correct backward rule of im2col.

# %% [markdown]
# ### The convolution as one `Function`
#
# Forward: pad, unfold, one matrix product, add the bias. Save the columns (the
# weight gradient needs them) and the weight (the input gradient needs it).
# Backward: the three rules above, each only for an input that needs a gradient
# (the images fed to the first layer never do — skipping them saves a product
# and the whole col2im):
#
# * $\bar A$: `xp.matmul(g, cols.transpose(0, 2, 1))` gives one $(O, C k_H k_W)$
#   matrix per image; sum them over the batch axis.
# * $\overline{\text{cols}}$: `xp.matmul(w_rows.T, g)`, then `col2im` into the
#   padded shape, then cut off the padding (`ph : H - ph`).
# * $\bar b$: `g.sum(axis=(0, 2))`.
#
# The reference starts both methods with a hand-off: on NumPy,
# `convolution.fast_path(xp, x, weight, stride, padding)` returns one of the
# library's kernels (`tinytrain.kernels.convolution`: hand-written, not one of
# your functions; section 8 explains and measures them) and the layer goes there;
# on every other device it returns `None` and the recipe runs (on a GPU through
# CuPy). Your version needs only the recipe: the checks grade it on the CPU and
# on the strict test device. Once it passes you may add the same hand-off lines.

# %% export="nn/conv"
class Conv2dFunction(Function):
    """``conv2d`` as one graph node: im2col and one matrix product forward; two
    products and col2im backward. Inputs ``x`` (N, C, H, W), ``weight`` (O, C, kH, kW)
    and optionally ``bias`` (O,); ``stride`` and ``padding`` are pairs of ints. The
    result's dtype is NumPy's promotion of ``x``'s and the weight's (``xp.result_type``).
    ``backward`` returns one gradient per input: two without a bias, three with one,
    each in ``grad``'s dtype (float32 for a float32 layer: no float64 accumulators)."""

    def forward(self, x: Any, weight: Any, bias: Any = None, *, stride: tuple[int, int],
                padding: tuple[int, int]) -> Any:
        ### BEGIN SOLUTION
        xp = self.xp
        self.fast = convolution.fast_path(xp, x, weight, stride, padding)  # NumPy's kernels; None elsewhere
        if self.fast is not None:
            return self.fast.forward(x, weight, bias)
        (ph, pw), (out_channels, _, kh, kw) = padding, weight.shape
        x = self.backend.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        n, _, height, width = x.shape
        cols = im2col(xp, x, (kh, kw), stride)  # (N, C kH kW, L)
        out = xp.matmul(weight.reshape(out_channels, -1), cols)  # (N, O, L): each image's rows are its channels
        if bias is not None:
            out += bias.reshape(out_channels, 1)
        self.cols, self.weight, self.stride, self.padding, self.padded_shape = cols, weight, stride, padding, x.shape
        return out.reshape(n, out_channels, output_size(height, kh, stride[0]), output_size(width, kw, stride[1]))
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        need_x, need_weight = self.inputs[0].requires_grad, self.inputs[1].requires_grad
        need_bias = len(self.inputs) == 3 and self.inputs[2].requires_grad
        if self.fast is not None:
            return self.fast.backward(grad, need_x, need_weight, need_bias)[:len(self.inputs)]
        xp, weight = self.xp, self.weight
        n, out_channels, out_h, out_w = grad.shape
        g = grad.reshape(n, out_channels, out_h * out_w)  # (N, O, L); -1 cannot be inferred for an empty batch
        grad_x = grad_weight = grad_bias = None
        if need_x:
            grad_cols = xp.matmul(weight.reshape(out_channels, -1).T, g)  # (N, C kH kW, L)
            grad_padded = col2im(xp, grad_cols, self.padded_shape, weight.shape[2:], self.stride)
            (ph, pw), (height, width) = self.padding, self.padded_shape[2:]
            grad_x = grad_padded[:, :, ph:height - ph, pw:width - pw]  # the padding is not an input
        if need_weight:
            grad_weight = xp.matmul(g, self.cols.transpose(0, 2, 1)).sum(axis=0).reshape(weight.shape)
        if need_bias:
            grad_bias = g.sum(axis=(0, 2))
        return (grad_x, grad_weight, grad_bias)[:len(self.inputs)]
        ### END SOLUTION


# %% [markdown]
# Check the forward pass against the loops (with strides, padding, rectangular
# images and kernels) and the backward pass against central differences in
# float64 (`tt.gradcheck`, Module 02):

# %% check=2
rng = np.random.default_rng(0)
for (n, c, h, w_), (o, kh, kw), stride, padding in [
    ((2, 3, 7, 6), (4, 3, 3), (1, 1), (1, 1)),
    ((1, 2, 8, 5), (3, 3, 2), (2, 1), (0, 2)),
    ((2, 1, 5, 5), (2, 5, 5), (2, 2), (2, 2)),
]:
    x, weight, bias = rng.standard_normal((n, c, h, w_)), rng.standard_normal((o, c, kh, kw)), rng.standard_normal(o)
    ours = Conv2dFunction.apply(tt.tensor(x, dtype="float64"), tt.tensor(weight, dtype="float64"),
                                tt.tensor(bias, dtype="float64"), stride=stride, padding=padding).numpy()
    if stride[0] == stride[1] and padding[0] == padding[1]:
        np.testing.assert_allclose(ours, conv2d_loops(x, weight, bias, stride[0], padding[0]), atol=1e-10)
    assert ours.shape == (n, o, output_size(h, kh, stride[0], padding[0]), output_size(w_, kw, stride[1], padding[1]))
    leaves = [tt.tensor(a, dtype="float64", requires_grad=True) for a in (x, weight, bias)]
    Conv2dFunction.apply(*leaves, stride=stride, padding=padding).sum().backward()
    assert leaves[0].grad.shape == x.shape, \
        f"padding {padding}: the input gradient has shape {leaves[0].grad.shape}, the input {x.shape} (with padding " \
        "0, ph:-ph is 0:-0, which is 0:0, an empty slice: cut the padding off with ph:H - ph)"
    assert tt.gradcheck(lambda x, w, b: Conv2dFunction.apply(x, w, b, stride=stride, padding=padding), leaves)
results = []
for device in ("cpu", "strict"):  # the strict test device's arrays refuse to become NumPy arrays: xp, never np
    leaves = [tt.tensor(a, dtype="float64", device=device, requires_grad=True) for a in (x, weight, bias)]
    out = Conv2dFunction.apply(*leaves, stride=stride, padding=padding)
    out.backward(tt.tensor(np.ones(out.shape), dtype="float64", device=device))
    results.append([out.numpy()] + [leaf.grad.numpy() for leaf in leaves])
for name, on_cpu, on_strict in zip(["the result", "x's gradient", "the weight's gradient", "the bias's gradient"],
                                   *results):
    np.testing.assert_allclose(on_strict, on_cpu, atol=1e-10, err_msg=f"{name} on the strict device")
print("Conv2dFunction OK")

# %% [markdown]
# ## 4. `conv2d` and `Conv2d`
#
# The functional form checks its arguments and names the shapes when they do not
# fit; the module owns the weight and bias. The initialisation is PyTorch's, for
# the same reason as `Linear`'s (Module 04): each output sums
# $n = C k_H k_W$ products — the *fan-in* — so weight and bias are drawn from
# $U(-1/\sqrt n,\ 1/\sqrt n)$.

# %% export="nn/conv"
def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, *,
           b: Tensor | None = None) -> Tensor:
    """2-D convolution (cross-correlation, as in every DL library) of ``x`` (N, C, H, W)
    with ``weight`` (O, C, kH, kW) and an optional ``bias`` (O,) (also accepted as ``b=``).

    ``stride`` (>= 1) and ``padding`` (>= 0, zeros) are ints or (height, width) pairs.
    Returns (N, O, H_out, W_out) with ``H_out = (H + 2 * padding - kH) // stride + 1``.
    Raises ``ValueError`` naming the shapes for a non-4-D input or weight, a channel
    mismatch (say both channel counts), a bias of the wrong shape (name the shape it
    must have, e.g. ``(4,)``), or an input that, padded, is smaller than the kernel
    (name the padded size as ``HxW`` and the kernel as ``kHxkW``, e.g. ``2x5`` and
    ``3x3``); an input exactly the kernel's size is fine. A weight or bias on another
    device than ``x`` raises ``RuntimeError``, as in every operation (``x._operand``); an
    integer or boolean ``x`` raises ``TypeError`` (the given first lines).
    """
    if b is not None:
        if bias is not None:
            raise TypeError("conv2d: give the bias once, as bias= or as b=")
        bias = b
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding", minimum=0)
    check_floating_input("conv2d", x)
    ### BEGIN SOLUTION
    if x.ndim != 4:
        raise ValueError(f"conv2d expects input of shape (N, C, H, W), got {x.shape}")
    if weight.ndim != 4:
        raise ValueError(f"conv2d expects a weight of shape (out_ch, in_ch, kH, kW), got {weight.shape}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"conv2d: the input {x.shape} has {x.shape[1]} channels, but the weight {weight.shape} "
                         f"expects {weight.shape[1]}")
    padded = (x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1])
    if padded[0] < weight.shape[2] or padded[1] < weight.shape[3]:
        raise ValueError(f"conv2d: the input {x.shape} (padded to {padded[0]}x{padded[1]}) is smaller than the "
                         f"kernel {weight.shape[2]}x{weight.shape[3]} of the weight {weight.shape}")
    if bias is None:
        return Conv2dFunction.apply(x, x._operand(weight), stride=stride, padding=padding)
    bias = x._operand(bias)
    if bias.shape != (weight.shape[0],):
        raise ValueError(f"conv2d: the bias must have shape ({weight.shape[0]},) for the weight {weight.shape}, "
                         f"got {bias.shape}")
    return Conv2dFunction.apply(x, x._operand(weight), bias, stride=stride, padding=padding)
    ### END SOLUTION


class Conv2d(Module):
    """2-D convolution layer: ``y = conv2d(x, weight, bias, stride, padding)``.

    ``weight`` is ``(out_channels, in_channels, kH, kW)`` and ``bias`` ``(out_channels,)``,
    both from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with ``fan_in = in_channels * kH * kW``
    (PyTorch's default). ``kernel_size``, ``stride`` and ``padding`` are ints or pairs.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 bias: bool = True) -> None:
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"Conv2d needs positive channel counts, got in_channels={in_channels}, "
                             f"out_channels={out_channels}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride, self.padding = _pair(stride, "stride"), _pair(padding, "padding", minimum=0)
        ### BEGIN SOLUTION
        bound = 1 / math.sqrt(in_channels * self.kernel_size[0] * self.kernel_size[1])
        self.weight = _uniform_parameter((out_channels, in_channels, *self.kernel_size), bound)
        self.bias = _uniform_parameter((out_channels,), bound) if bias else None
        ### END SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"{self!r} expects input of shape (N, {self.in_channels}, H, W), got {x.shape}")
        return conv2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, bias={self.bias is not None}")


# %% check=2
tt.manual_seed(0)
layer = Conv2d(3, 8, 3, padding=1)
assert layer.weight.shape == (8, 3, 3, 3) and layer.bias.shape == (8,) and layer.weight.dtype == np.float32
bound = 1 / math.sqrt(27)
assert np.abs(layer.weight.numpy()).max() <= bound and np.abs(layer.weight.numpy()).max() > 0.9 * bound
assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
x = tt.randn(2, 3, 10, 9)
assert layer(x).shape == (2, 8, 10, 9) and Conv2d(3, 4, (3, 2), stride=2)(x).shape == (2, 4, 4, 4)
assert Conv2d(3, 4, 3, bias=False).bias is None and len(Conv2d(3, 4, 3, bias=False).parameters()) == 1
expected = conv2d_loops(x.numpy(), layer.weight.numpy(), layer.bias.numpy(), padding=1)
np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-5, atol=1e-5)
for bad_input, words in [(tt.randn(2, 4, 10, 9), ["(2, 4, 10, 9)", "3"]), (tt.randn(3, 10, 9), ["(3, 10, 9)"])]:
    try:
        layer(bad_input)
    except ValueError as error:
        assert all(word in str(error) for word in words), error
    else:
        raise AssertionError(f"an input of shape {bad_input.shape} must raise ValueError")
try:
    conv2d(tt.randn(1, 3, 2, 2), layer.weight)
except ValueError as error:
    assert "(1, 3, 2, 2)" in str(error) and "3x3" in str(error), error
else:
    raise AssertionError("an input smaller than the kernel must raise ValueError")
print(layer, "OK")

# %% [markdown]
# ## 5. Pooling
#
# A **pooling** layer summarises each $k_H \times k_W$ window of each channel by
# one number — its maximum (`MaxPool2d`) or its mean (`AvgPool2d`) — and usually
# moves by its own size (stride = kernel size, the default), so a 2×2 pool halves
# height and width. It has no weights. Max pooling keeps the strongest response
# of a feature detector in each region, so the next layer sees *whether* a feature
# occurred nearby, not exactly where.
#
# **Gradients.** The mean spreads the gradient evenly: each of the $k_H k_W$
# inputs of a window gets $\bar y / (k_H k_W)$. The maximum passes the whole
# gradient to the element that won and nothing to the others. When several
# elements tie for the maximum (common after a ReLU: a window of zeros), we
# follow PyTorch: the **first** maximum in the window, reading row by row, gets
# everything. (Splitting it evenly, as our `Tensor.max` does, is also a valid
# subgradient; what matters is one consistent rule, and PyTorch's lets us compare
# gradients exactly.)
#
# ### Visiting the window offsets
#
# Think of the window's $k_H k_W$ offsets $(i, j)$ one at a time. For a fixed
# offset, the elements of all windows form a strided slice of the input, exactly
# as in col2im — shape $(N, C, H_\text{out}, W_\text{out})$, no copy. So the
# maximum over the windows is `xp.maximum` of $k_H k_W$ slices (4 for a 2×2 pool),
# and the winner's offset is tracked along the way: an offset replaces the best so
# far only if it is **strictly** greater — that is the "first maximum" rule.
# Backward hands the gradient of each window to the offset stored for it.
#
# Keep the running maximum with `xp.maximum`, not with that comparison: a window
# holding **NaN gives NaN**, as in PyTorch, so that a NaN activation cannot
# vanish in the next layer. `xp.maximum` passes a NaN on from either argument,
# but every comparison with NaN is False, so
# `xp.where(candidate > best, candidate, best)` would silently drop it. (Where
# such a window's gradient goes is left open: see `MaxPool2dFunction`'s
# docstring.)
#
# Two details. Start the running maximum from a **copy** of the first offset's
# slice (not zeros: values may be negative; and not the slice itself: on the
# tiled path below the slices are views of the input, and `out=` into one would
# overwrite the layer's input). And choose the winners' dtype so that the last
# offset, $k_H k_W - 1$, fits: `uint8` holds the 256 offsets of a 16×16 window,
# a larger window needs a wider type.
#
# How to get the slices:
#
# * when the windows **tile** the input — no overlap (stride = kernel) and the
#   size divisible by the kernel — a free `reshape` to
#   $(N, C, H_\text{out}, k_H, W_\text{out}, k_W)$ exposes offset $(i, j)$ as
#   `blocks[:, :, :, i, :, j]`; every input element is in exactly one window, so
#   the backward pass can *assign* each slice of an uninitialised array;
# * otherwise (overlapping windows, or a remainder that no window covers)
#   `sliding_window_view` gives offset $(i, j)$ as `windows[..., i, j]`, and
#   backward must *add* into zeros, like col2im.
#
# (Why not simply `blocks.max(axis=(3, 5))`? Try it in section 8: NumPy's
# reductions over short, strided axes are dozens of times slower than four
# `maximum` calls.)
#
# The library's max pooling visits the offsets a few images at a time:
# `cache_sized_parts(xp, x)` (`tinytrain.kernels.parts`, hand-written) cuts the
# batch axis into slices of about 2 MiB of `x` on NumPy, and into one slice of
# everything on other devices. Every offset reads the same input, and a part is
# still in the cache when the next offset reads it: that made the CIFAR-shaped
# training step 14% faster on our machine. Your version may take the whole batch
# at once, or loop over the same parts.

# %% export="nn/conv"
def _offsets(kernel: tuple[int, int]) -> list[tuple[int, int]]:
    """The window offsets (i, j), row by row."""
    return [(i, j) for i in range(kernel[0]) for j in range(kernel[1])]


def _tiles(shape: tuple[int, ...], kernel: tuple[int, int], stride: tuple[int, int]) -> bool:
    """Whether windows of ``kernel`` moved by ``stride`` cover an (N, C, H, W) input exactly once."""
    return kernel == stride and shape[2] % kernel[0] == 0 and shape[3] % kernel[1] == 0


def window_slices(xp: Any, x: Any, kernel: tuple[int, int], stride: tuple[int, int]) -> list[Any]:
    """For each window offset (i, j), row by row, the view ``(N, C, H_out, W_out)`` of
    the elements of ``x`` at that offset in every window (no copies)."""
    n, c, height, width = x.shape
    kh, kw = kernel
    if _tiles(x.shape, kernel, stride):
        blocks = x.reshape(n, c, height // kh, kh, width // kw, kw)  # a free view
        return [blocks[:, :, :, i, :, j] for i, j in _offsets(kernel)]
    windows = xp.lib.stride_tricks.sliding_window_view(x, kernel, axis=(2, 3))[:, :, ::stride[0], ::stride[1]]
    return [windows[..., i, j] for i, j in _offsets(kernel)]


def gradient_slices(xp: Any, shape: tuple[int, ...], kernel: tuple[int, int], stride: tuple[int, int],
                    dtype: Any) -> tuple[Any, list[Any], bool]:
    """``(grad_x, slices, tiled)``: an array for the input gradient and, per window
    offset, the view of it that :func:`window_slices` reads from the input.

    ``tiled``: the slices cover ``grad_x`` exactly once, so assign to them
    (``grad_x`` is uninitialised); otherwise ``grad_x`` is zeros and slices may
    overlap, so add to them.
    """
    n, c, height, width = shape
    kh, kw = kernel
    out_h, out_w = output_size(height, kh, stride[0]), output_size(width, kw, stride[1])
    if _tiles(shape, kernel, stride):
        blocks = xp.empty((n, c, out_h, kh, out_w, kw), dtype=dtype)
        return blocks.reshape(shape), [blocks[:, :, :, i, :, j] for i, j in _offsets(kernel)], True
    grad_x = xp.zeros(shape, dtype=dtype)
    rows = [slice(i, i + stride[0] * (out_h - 1) + 1, stride[0]) for i in range(kh)]
    cols = [slice(j, j + stride[1] * (out_w - 1) + 1, stride[1]) for j in range(kw)]
    return grad_x, [grad_x[:, :, rows[i], cols[j]] for i, j in _offsets(kernel)], False


class MaxPool2dFunction(Function):
    """Maximum over each window. Backward routes each window's gradient to its
    first maximum (row by row), as PyTorch does.

    A window holding NaN gives NaN. Where its gradient goes is left open, so that
    the forward pass need not look for NaN: the reference (strict ``>`` against the
    best so far) sends it to the first maximum of the elements before the window's
    first NaN, or to the NaN when that comes first; PyTorch to the window's last NaN.
    A known difference, kept on purpose: once an activation is NaN, the loss and the
    weights' gradients are NaN whichever element gets the window's gradient.
    """

    def forward(self, x: Any, *, kernel: tuple[int, int], stride: tuple[int, int]) -> Any:
        ### BEGIN SOLUTION
        xp = self.xp
        n, c, height, width = x.shape
        out_shape = (n, c, output_size(height, kernel[0], stride[0]), output_size(width, kernel[1], stride[1]))
        best = xp.empty(out_shape, dtype=x.dtype)
        # The offset of the first maximum: uint8 holds the 256 offsets of a 16x16 window.
        winner = xp.zeros(out_shape, dtype=xp.uint8 if kernel[0] * kernel[1] <= 256 else xp.int32)
        for part in cache_sized_parts(xp, x):  # a few images at a time: every offset finds them in the cache
            slices = window_slices(xp, x[part], kernel, stride)
            part_best, part_winner = best[part], winner[part]
            part_best[...] = slices[0]
            for k in range(1, len(slices)):
                better = slices[k] > part_best  # strictly: on a tie the earlier offset stays the winner
                # offsets only grow, so "set winner to k where better" is a maximum (and 20x faster than masking)
                xp.maximum(part_winner, better * part_winner.dtype.type(k), out=part_winner)
                xp.maximum(part_best, slices[k], out=part_best)  # not where(better, ...): NaN must pass on
        self.winner, self.shape, self.kernel, self.stride = winner, x.shape, kernel, stride
        return best
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        xp = self.xp
        grad_x, slices, tiled = gradient_slices(xp, self.shape, self.kernel, self.stride, grad.dtype)
        for part in cache_sized_parts(xp, grad_x):
            for k, target in enumerate(slices):
                won = self.winner[part] == k
                if tiled:
                    xp.multiply(grad[part], won, out=target[part])
                else:
                    target[part] += grad[part] * won
        return (grad_x,)
        ### END SOLUTION


class AvgPool2dFunction(Function):
    """Mean over each window; backward gives every element of a window an equal share."""

    def forward(self, x: Any, *, kernel: tuple[int, int], stride: tuple[int, int]) -> Any:
        ### BEGIN SOLUTION
        slices = window_slices(self.xp, x, kernel, stride)
        total = slices[0].copy()  # a copy: on the tiled path the slices are views of x
        for part in slices[1:]:
            total += part
        total /= len(slices)
        self.shape, self.kernel, self.stride = x.shape, kernel, stride
        return total
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        share = grad / (self.kernel[0] * self.kernel[1])
        grad_x, slices, tiled = gradient_slices(self.xp, self.shape, self.kernel, self.stride, grad.dtype)
        for target in slices:
            if tiled:
                target[...] = share
            else:
                target += share
        return (grad_x,)
        ### END SOLUTION


def _pool_arguments(name: str, x: Tensor, kernel_size: Any, stride: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    """Checked ``(kernel, stride)`` pairs for pooling ``x`` (stride defaults to the kernel)."""
    kernel = _pair(kernel_size, "kernel_size")
    stride = kernel if stride is None else _pair(stride, "stride")
    if x.ndim != 4:
        raise ValueError(f"{name} expects input of shape (N, C, H, W), got {x.shape}")
    if x.shape[2] < kernel[0] or x.shape[3] < kernel[1]:
        raise ValueError(f"{name}: the input {x.shape} is smaller than the window {kernel[0]}x{kernel[1]}")
    return kernel, stride


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None) -> Tensor:
    """Maximum over ``kernel_size`` windows moved by ``stride`` (default: the kernel
    size) of ``x`` (N, C, H, W). Gradient: to each window's first maximum."""
    kernel, stride = _pool_arguments("max_pool2d", x, kernel_size, stride)
    return MaxPool2dFunction.apply(x, kernel=kernel, stride=stride)


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None) -> Tensor:
    """Mean over ``kernel_size`` windows moved by ``stride`` (default: the kernel size)
    of ``x`` (N, C, H, W)."""
    kernel, stride = _pool_arguments("avg_pool2d", x, kernel_size, stride)
    return AvgPool2dFunction.apply(x, kernel=kernel, stride=stride)


class MaxPool2d(Module):
    """``max_pool2d`` as a layer; ``stride`` defaults to ``kernel_size``."""

    def __init__(self, kernel_size: Any, stride: Any = None) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride")

    def forward(self, x: Tensor) -> Tensor:
        return max_pool2d(x, self.kernel_size, self.stride)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class AvgPool2d(MaxPool2d):
    """``avg_pool2d`` as a layer; ``stride`` defaults to ``kernel_size``."""

    def forward(self, x: Tensor) -> Tensor:
        return avg_pool2d(x, self.kernel_size, self.stride)


# %% check=2
x = tt.tensor([[[[1.0, 3.0, 2.0, 2.0], [3.0, 0.0, 2.0, 1.0], [5.0, 6.0, 0.0, 0.0], [7.0, 8.0, 0.0, -1.0]]]],
              requires_grad=True)
y = max_pool2d(x, 2)
assert y.numpy().tolist() == [[[[3.0, 2.0], [8.0, 0.0]]]]
holes = max_pool2d(tt.tensor([[[[1.0, np.nan, 5.0, 4.0], [0.0, 2.0, 3.0, np.nan]]]]), 2).numpy()
assert np.isnan(holes).all(), f"a window holding NaN gives NaN (keep the best with xp.maximum), got {holes}"
y.backward(tt.tensor([[[[10.0, 20.0], [30.0, 40.0]]]]))
assert x.grad.numpy()[0, 0].tolist() == [[0, 10, 20, 0], [0, 0, 0, 0], [0, 0, 40, 0], [0, 30, 0, 0]], \
    "ties: the first maximum in each window (row by row) gets the gradient"
x.grad = None
y = avg_pool2d(x, 2)
assert y.numpy().tolist() == [[[[1.75, 1.75], [6.5, -0.25]]]]
y.sum().backward()
assert (x.grad.numpy() == 0.25).all()
overlapping = max_pool2d(tt.tensor(np.arange(25.0).reshape(1, 1, 5, 5)), 3, stride=1)
assert overlapping.numpy()[0, 0].tolist() == [[12, 13, 14], [17, 18, 19], [22, 23, 24]]
x64 = tt.tensor(np.random.default_rng(1).permutation(70).reshape(1, 2, 5, 7) / 7.0, dtype="float64",
                requires_grad=True)  # distinct values: finite differences are exact away from ties
for kernel, stride in [(2, None), (3, 1), ((2, 3), (1, 2)), (2, 3)]:
    assert tt.gradcheck(lambda x: max_pool2d(x, kernel, stride), [x64])
    assert tt.gradcheck(lambda x: avg_pool2d(x, kernel, stride), [x64])
assert MaxPool2d(2)(tt.randn(2, 3, 9, 8)).shape == (2, 3, 4, 4)
assert AvgPool2d(3, 2)(tt.randn(1, 1, 7, 7)).shape == (1, 1, 3, 3)
print("pooling OK")

# %% [markdown]
# ## 6. `BatchNorm2d`
#
# Batch normalisation (Module 04) for images normalises each **channel** over the
# batch *and* all positions: for $(N, C, H, W)$ the statistics of channel $c$ come
# from $N H W$ numbers, since a feature detector's output should be treated the
# same wherever in the image it fires. Module 04's `_BatchNorm` already
# normalises over every axis but axis 1, so the 2-D version only declares that it
# takes 4-D inputs. Check it against the statistics computed by hand:

# %% export="nn/conv"
class BatchNorm2d(_BatchNorm):
    """Batch normalisation of ``(N, C, H, W)`` inputs per channel ``C``, over ``N``, ``H`` and ``W``.

    ``weight``/``bias`` ``(C,)``; running mean and (unbiased) variance with momentum
    0.1 in training mode, used in evaluation mode; eps 1e-5 — as in PyTorch.
    """

    input_ndims = (4,)


# %%
a = np.random.default_rng(2).normal(1.0, 3.0, size=(4, 3, 5, 6)).astype(np.float32)
bn = BatchNorm2d(3)
out = bn(tt.tensor(a)).numpy()
mean, var = a.mean(axis=(0, 2, 3), keepdims=True), a.var(axis=(0, 2, 3), keepdims=True)
np.testing.assert_allclose(out, (a - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * a.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
try:
    bn(tt.randn(4, 3, 5))
except ValueError as error:
    assert "(4, 3, 5)" in str(error)
else:
    raise AssertionError("BatchNorm2d must refuse a 3-D input")
bn64 = BatchNorm2d(2).to(dtype="float64")
assert tt.gradcheck(lambda x, w, b: bn64(x), [tt.randn(3, 2, 2, 3, dtype="float64", requires_grad=True),
                                             bn64.weight, bn64.bias])
print("BatchNorm2d OK")

# %% [markdown]
# ## 7. Check everything against the loops
#
# The loops of section 1 are slow but obviously right. Random small inputs with
# every combination of stride and padding must give the same result as im2col:

# %% check=1
rng = np.random.default_rng(3)
for trial in range(12):
    n, c, o = rng.integers(1, 3), rng.integers(1, 4), rng.integers(1, 4)
    k, stride, padding = rng.integers(1, 4), rng.integers(1, 3), rng.integers(0, 3)
    h, w_ = rng.integers(k, 9), rng.integers(k, 9)
    x, weight, bias = rng.standard_normal((n, c, h, w_)), rng.standard_normal((o, c, k, k)), rng.standard_normal(o)
    ours = conv2d(tt.tensor(x, dtype="float64"), tt.tensor(weight, dtype="float64"), tt.tensor(bias, dtype="float64"),
                  stride=int(stride), padding=int(padding)).numpy()
    np.testing.assert_allclose(ours, conv2d_loops(x, weight, bias, int(stride), int(padding)), atol=1e-10)
print("im2col == loops on 12 random shapes")

# %% [markdown]
# When PyTorch is installed, compare with it too — forward and all three
# gradients, with the same weights:

# %%
if torch is not None:
    x = tt.randn(4, 3, 11, 9, requires_grad=True)
    layer = Conv2d(3, 5, 3, stride=2, padding=1)
    reference = torch.nn.Conv2d(3, 5, 3, stride=2, padding=1)
    reference.load_state_dict({name: torch.from_numpy(p.numpy()) for name, p in layer.named_parameters()})
    x_torch = torch.from_numpy(x.numpy()).requires_grad_()
    max_pool2d(layer(x), 2, 1).sum().backward()
    torch.nn.functional.max_pool2d(reference(x_torch), 2, 1).sum().backward()
    for ours, theirs in [(x.grad, x_torch.grad), (layer.weight.grad, reference.weight.grad),
                         (layer.bias.grad, reference.bias.grad)]:
        print(f"largest difference from PyTorch: {np.abs(ours.numpy() - theirs.numpy()).max():.1e}")
else:
    print("PyTorch is not installed: skipping the comparison")

# %% [markdown]
# ## 8. Systems: how fast, and where the time goes
#
# ### Loops against im2col against PyTorch
#
# Time the forward pass of the first layer of the MNIST network — 1 → 8
# channels, 3×3, padding 1 — on a batch of 28×28 images. The loop version gets
# a small batch (it is slow); we report time per image.

# %%
def best_of(fn, repeats: int = 5) -> float:
    """The fastest of ``repeats`` calls, in seconds (the least disturbed by other programs)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


tt.manual_seed(0)
conv = Conv2d(1, 8, 3, padding=1)
images = tt.randn(64, 1, 28, 28)
w_host, b_host, x_host = conv.weight.numpy(), conv.bias.numpy(), images.numpy()
per_image = {
    "loops (NumPy per output)": best_of(lambda: conv2d_loops(x_host[:2], w_host, b_host, padding=1), 1) / 2,
    "im2col (tinytrain)": best_of(lambda: conv(images)) / 64,
}
if torch is not None:
    torch.set_num_threads(1)  # like NumPy's BLAS here: on a small shared machine, extra threads mostly wait
    torch_conv = torch.nn.Conv2d(1, 8, 3, padding=1)
    torch_images = torch.from_numpy(x_host)
    with torch.no_grad():
        per_image["PyTorch"] = best_of(lambda: torch_conv(torch_images)) / 64
fastest = min(per_image.values())
print(f"{'forward pass, 1->8 channels, 28x28':38s} {'µs per image':>13s} {'vs fastest':>11s}")
for name, seconds in per_image.items():
    print(f"{name:38s} {seconds * 1e6:13.1f} {seconds / fastest:10.1f}x")

# %% [markdown]
# The loops pay Python's interpreter for each of the $8 \cdot 28 \cdot 28 = 6{,}272$
# outputs per image; im2col pays it for a handful of NumPy calls per *batch* and
# leaves the arithmetic to a matrix-product routine (BLAS) that uses the
# processor's vector units. On our 2-core test machine the im2col version was
# 4,000–8,000 times faster than the loops and within 1.2× of PyTorch for this
# small layer (your numbers will differ; run the cell again to see the noise).

# %% [markdown]
# ### The library's kernels: three tricks
#
# Your `Conv2dFunction` is the recipe: one im2col of the whole batch, one
# product, col2im. The reference hands NumPy layers to the library's kernels
# instead (`tinytrain.kernels.convolution`, hand-written; the hand-off is the
# `fast_path` line at the top of its `forward`), and `Im2colInParts` there does the
# same arithmetic with three tricks:
#
# 1. **A few images at a time.** The columns of a batch are tens of megabytes,
#    more than the processor's caches. Written all at once, they go out to main
#    memory and the product reads them back from there. `cache_sized_parts`
#    (`tinytrain.kernels.parts`) cuts the batch into parts of at most 2 MiB of
#    columns; unfolding and multiplying one part after the other, the product
#    reads columns that are still in the cache. Backward loops over the same
#    parts. (The padded images are one part's buffer, its border zeroed once.
#    Backward, only the inside of each part's padded gradient is copied out: a
#    view that cuts off the padding is an array of short rows, and the previous
#    layer's backward runs up to 10× slower over it.)
# 2. **col2im along whole rows.** col2im adds rows of $W_{out}$ numbers, and
#    for a 14×14 image NumPy spends more time starting each short row than
#    adding it. Give the column gradient one column for *every* position of a
#    padded image row — $W$ of them, the last $k_W - 1$ zeros (make the output
#    gradient that wide, zeros on the right, before the product) — and output
#    $(r, q)$ reads the flattened image at $r W + q + iW + j$ for offset
#    $(i, j)$: each offset becomes one shifted addition of long contiguous runs.
#    `add_windows` (in `tinytrain.kernels.convolution`) does that for stride 1.
# 3. **The bias as a row of ones.** Put a row of ones under each image's
#    columns and the bias as one more column of the weight matrix,
#    $[A \mid b]$; then $[A \mid b] \begin{bmatrix}\text{cols} \\ 1\end{bmatrix}
#    = A\,\text{cols} + b$: the product adds the bias, where `out += b` would
#    be one more pass over the whole output. Backward, the same row gives the
#    bias gradient for free: the last row of $\text{cols}\, g^\top$ is
#    $\sum_l g_{o,l}$.
#
# Here they are on the second convolution of the CIFAR-shaped network (32 → 64
# channels at 16×16, batch 64), with your `im2col` and `col2im` and the
# library's `cache_sized_parts` and `add_windows`. (Unfolding part by part into
# one array of columns is what `im2col`'s `out` is for.)

# %%
from tinytrain.kernels.convolution import add_windows
from tinytrain.kernels.parts import cache_sized_parts

rng = np.random.default_rng(0)
x_pad = np.pad(rng.standard_normal((64, 32, 16, 16), dtype=np.float32), ((0, 0), (0, 0), (1, 1), (1, 1)))
w_rows = rng.standard_normal((64, 32 * 9), dtype=np.float32)
g = rng.standard_normal((64, 64, 16 * 16), dtype=np.float32)
cols = np.empty((64, 32 * 9, 256), np.float32)
out = np.empty((64, 64, 256), np.float32)


def forward_at_once():
    im2col(np, x_pad, (3, 3), (1, 1), out=cols)
    np.matmul(w_rows, cols, out=out)


def forward_in_parts():
    for part in cache_sized_parts(np, cols):
        im2col(np, x_pad[part], (3, 3), (1, 1), out=cols[part])
        np.matmul(w_rows, cols[part], out=out[part])


def input_gradient_col2im():
    return col2im(np, np.matmul(w_rows.T, g), x_pad.shape, (3, 3), (1, 1))


def input_gradient_whole_rows():
    g_wide = np.zeros((64, 64, 16, 18), np.float32)  # each row as wide as a padded image row, zeros on the right
    g_wide[..., :16] = g.reshape(64, 64, 16, 16)
    image = np.zeros(x_pad.shape, np.float32)
    add_windows(np.matmul(w_rows.T, g_wide.reshape(64, 64, -1)), image, (3, 3))
    return image


bias = rng.standard_normal((64, 1), dtype=np.float32)
w_and_bias = np.concatenate([w_rows, bias], axis=1)  # [A | b]
cols_and_ones = np.ones((64, 32 * 9 + 1, 256), np.float32)  # the columns with a row of ones below


def bias_added():
    np.matmul(w_rows, cols, out=out)
    return np.add(out, bias, out=out)  # one more pass over the whole result


def bias_in_product():
    return np.matmul(w_and_bias, cols_and_ones, out=out)


np.testing.assert_allclose(input_gradient_whole_rows(), input_gradient_col2im(), rtol=1e-4, atol=1e-3)
forward_at_once()
cols_and_ones[:, :-1] = cols
np.testing.assert_allclose(bias_in_product().copy(), bias_added(), rtol=1e-4, atol=1e-3)
for label, plain, faster in [("forward: im2col + product", forward_at_once, forward_in_parts),
                             ("input gradient: product + col2im", input_gradient_col2im, input_gradient_whole_rows),
                             ("bias: product + out += b", bias_added, bias_in_product)]:
    plain_seconds, faster_seconds = best_of(plain), best_of(faster)
    print(f"{label:34s} plain {plain_seconds * 1e3:6.2f} ms, library's way {faster_seconds * 1e3:6.2f} ms "
          f"({plain_seconds / faster_seconds:.2f}x)")

# %% [markdown]
# On our machine, when it was quiet, the parts made this forward pass about
# 1.07× faster and the whole-row col2im the input gradient about 1.2× faster,
# although its product is 18/16 times larger (the zero columns); the bias row
# made the product with its bias 1.05–1.09× faster, although the product is
# 289/288 times larger. On a busy machine the differences drown in the noise.
# Within whole training steps they add up: with the first two, and the weight
# gradient taken part by part too, the MNIST- and CIFAR-shaped steps of
# `benchmarks/cnn_step.py` took 0.86× the time of the plain recipe; the bias
# row (and the padded part buffer) took another 5–6% off both, and the
# contiguous input gradient another 1–2.5%.
# No trick changes what the convolution computes beyond float rounding, so the
# course grades the plain recipe and the library ships the faster one.

# %% [markdown]
# ### A fourth trick: fewer multiplications (Winograd)
#
# Every trick so far moves the same multiplications around. For 3×3 kernels
# there is an algorithm that does fewer (Winograd's minimal filtering, 1980;
# brought to CNNs by Lavin & Gray, 2016). In one
# dimension, two outputs of a 3-tap filter $g$ over four inputs $d$ need six
# multiplications the direct way, but only four this way:
#
# $$m_1 = (d_0 - d_2)\,g_0,\quad m_2 = (d_1 + d_2)\,\tfrac{g_0 + g_1 + g_2}{2},\quad
#   m_3 = (d_2 - d_1)\,\tfrac{g_0 - g_1 + g_2}{2},\quad m_4 = (d_1 - d_3)\,g_2$$
# $$y_0 = m_1 + m_2 + m_3, \qquad y_1 = m_2 - m_3 - m_4.$$
#
# The sums of $g$ are computed once per filter, not once per position. Written
# with matrices, $y = A^\top[(G g) \odot (B^\top d)]$ with
#
# $$B^\top = \begin{pmatrix} 1 & 0 & -1 & 0 \\ 0 & 1 & 1 & 0 \\ 0 & -1 & 1 & 0 \\ 0 & 1 & 0 & -1 \end{pmatrix},\quad
#   G = \begin{pmatrix} 1 & 0 & 0 \\ \tfrac12 & \tfrac12 & \tfrac12 \\ \tfrac12 & -\tfrac12 & \tfrac12 \\ 0 & 0 & 1 \end{pmatrix},\quad
#   A^\top = \begin{pmatrix} 1 & 1 & 1 & 0 \\ 0 & 1 & -1 & -1 \end{pmatrix},$$
#
# and nested for images a 4×4 input tile gives a 2×2 output tile:
# $Y = A^\top[(G g G^\top) \odot (B^\top d B)]A$, 16 multiplications instead of 36.
# With $C$ input channels each output tile sums $C$ such elementwise products;
# over all the tiles of the batch that is, for each of the 16 positions of a
# tile, one matrix product of (tiles × $C$) by ($C$ × $O$). So the layer
# becomes 16 matrix products that do 4/9 of im2col's multiplications, plus the
# transforms $B^\top d B$ and $A^\top \cdot A$, which are only additions
# ($B^\top$ and $A^\top$ hold only 0 and ±1). Backward is the same products
# transposed: with $U = G g G^\top$, $V = B^\top d B$ and $M = U \odot V$ summed
# over channels, $\bar V = \bar M U^\top$ for the input and
# $\bar U = V^\top \bar M$ for the weight.
#
# The additions are passes over memory, and each of the 16 products is thin
# when there are few channels. So Winograd wins only for wide layers:
# `convolution.fast_path` hands 3×3, stride-1, padding-1 layers with at least
# 16 input and output channels (NumPy, float32 or float64) to
# `tinytrain.kernels.winograd` (hand-written code, not one of your functions;
# about 250 lines, channels-last inside). You do not need it for full marks.
# Check the one-dimensional formula, check the library's version against the
# forward pass above (`winograd.forward(x, weight)` pads the images itself and
# returns the result and what backward needs), and time the library's `conv2d`
# with it and without it (`winograd.MIN_CHANNELS` is its threshold):

# %%
d, g3 = rng.standard_normal(4), rng.standard_normal(3)  # g3 is the filter (g above is an output gradient)
m = [(d[0] - d[2]) * g3[0], (d[1] + d[2]) * (g3[0] + g3[1] + g3[2]) / 2,
     (d[2] - d[1]) * (g3[0] - g3[1] + g3[2]) / 2, (d[1] - d[3]) * g3[2]]
np.testing.assert_allclose([m[0] + m[1] + m[2], m[1] - m[2] - m[3]], [d[0:3] @ g3, d[1:4] @ g3])

from tinytrain.kernels import winograd

x_inside, w_filters = x_pad[:, :, 1:-1, 1:-1], w_rows.reshape(64, 32, 3, 3)
forward_in_parts()
np.testing.assert_allclose(winograd.forward(x_inside, w_filters)[0].reshape(64, 64, 256), out, rtol=1e-4, atol=1e-3)

# Forward and backward through the library's conv2d, with Winograd's threshold where it is and above every layer
layer_input, layer_weight = tt.tensor(x_inside, requires_grad=True), tt.tensor(w_filters, requires_grad=True)
layer_grad = tt.tensor(g.reshape(64, 64, 16, 16))


def forward_backward():
    tt.nn.functional.conv2d(layer_input, layer_weight, padding=1).backward(layer_grad)


threshold = winograd.MIN_CHANNELS
winograd_seconds = best_of(forward_backward)
winograd.MIN_CHANNELS = 10**9  # no layer has that many channels: im2col for all
im2col_seconds = best_of(forward_backward)
winograd.MIN_CHANNELS = threshold
print(f"forward + backward, 32 -> 64 channels: im2col {im2col_seconds * 1e3:.1f} ms, "
      f"Winograd {winograd_seconds * 1e3:.1f} ms ({im2col_seconds / winograd_seconds:.2f}x)")

# %% [markdown]
# On our machine, forward and backward together, Winograd took 0.75× the time
# of the library's im2col on this layer (32 → 64 channels at 16×16) and
# 0.59–0.65× on the CIFAR milestone's wider layers (64 and 128 channels), where
# it comes within about 10% of PyTorch; at 8 channels it was 1.2–1.3× slower,
# hence the threshold. The CIFAR-shaped training step of `benchmarks/cnn_step.py`
# took 0.85–0.87× the time. The results differ from im2col's by float rounding (about
# $10^{-6}$ relative in float32), which is why the checks compare with a tolerance.

# %% [markdown]
# ### The reduction trap
#
# Here is the pooling shortcut from section 5 against the offset loop we used:

# %%
activations = np.maximum(np.random.default_rng(0).standard_normal((128, 8, 28, 28), dtype=np.float32), 0)


def pool_by_reduction():
    return activations.reshape(128, 8, 14, 2, 14, 2).max(axis=(3, 5))


def pool_by_offsets():
    best = activations[:, :, 0::2, 0::2].copy()
    for i, j in [(0, 1), (1, 0), (1, 1)]:
        np.maximum(best, activations[:, :, i::2, j::2], out=best)
    return best


assert np.array_equal(pool_by_reduction(), pool_by_offsets())
reduction, offsets = best_of(pool_by_reduction), best_of(pool_by_offsets)
print(f"max pool 2x2 of (128, 8, 28, 28): .max(axis=(3, 5)) {reduction * 1e3:.2f} ms, "
      f"4 maximum calls {offsets * 1e3:.2f} ms ({reduction / offsets:.0f}x)")

# %% [markdown]
# Same numbers, same memory, 30 to 50 times slower (on our machines). The
# reduction walks axes of length 2 in its inner loop, paying NumPy's per-loop
# overhead for every two elements; `maximum` on two slices runs its inner loop
# along a row of 14. *Where* the loops run matters as much as how many
# operations there are.
#
# ### A whole training step, and page faults
#
# Now the MNIST-shaped training step of `benchmarks/cnn_step.py`: batch 128,
# Conv 1→8, ReLU, MaxPool, Conv 8→16, ReLU, MaxPool, Linear 784→10,
# cross-entropy, SGD with momentum. Besides the time we count *minor page
# faults* — each one is the operating system handing the process a fresh 4 KiB
# page, usually because freed memory went back to the system and is needed
# again — under four settings: the C library's defaults, without and with the
# library's buffer cache, and the C library told to keep freed memory
# (`tinytrain.runtime.allocator`, what `import tinytrain` does on Linux), without and
# with the cache.
#
# The buffer cache (`tinytrain.runtime.buffers`) is the remedy every framework
# has in some form — PyTorch's caching allocator keeps GPU memory it freed for
# the next request of a similar size. Ours is deliberately small:
# `buffers.empty(xp, shape, dtype)` returns an array it handed out before once
# **nothing else refers to it any more**, which Python's reference count tells
# exactly, so an array that a tensor still holds, that a graph saved for backward,
# or that another array views is never handed out twice. The library's
# convolution kernels take their columns, results and gradients from it; your
# recipe does not, so the step below runs on the library's layers (`tt.nn`).

# %%
try:
    import resource  # Unix only
except ImportError:
    resource = None


def mnist_step_fn():
    tt.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Conv2d(1, 8, 3, padding=1), tt.nn.ReLU(), tt.nn.MaxPool2d(2),
                             tt.nn.Conv2d(8, 16, 3, padding=1), tt.nn.ReLU(), tt.nn.MaxPool2d(2),
                             tt.nn.Flatten(), tt.nn.Linear(784, 10))
    optimizer = tt.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = tt.randn(128, 1, 28, 28), tt.tensor(np.random.default_rng(0).integers(0, 10, 128))

    def step():
        optimizer.zero_grad()
        tt.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return step


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


from tinytrain.runtime import allocator
from tinytrain.runtime.buffers import buffers

step = mnist_step_fn()
was_keeping, limit = allocator.in_effect(), buffers.max_bytes
for label, keep, cache_bytes in [("C library defaults", False, 0), ("defaults + buffer cache", False, 128 << 20),
                                 ("keep freed memory", True, 0), ("keep freed + buffer cache", True, 128 << 20)]:
    allocator.keep_freed_memory() if keep else allocator.return_freed_memory()
    buffers.clear()
    buffers.max_bytes = cache_bytes
    seconds = best_of(step, 10)
    before = faults()
    for _ in range(10):
        step()
    print(f"{label:25s} {seconds * 1e3:6.1f} ms per step, {(faults() - before) / 10:6.0f} page faults per step, "
          f"{buffers.nbytes / 2**20:5.1f} MiB cached")
allocator.keep_freed_memory() if was_keeping else allocator.return_freed_memory()
buffers.clear()
buffers.max_bytes = limit

# %% [markdown]
# With the C library's defaults (made pessimistic here:
# `return_freed_memory()` also stops glibc from raising its threshold as large
# blocks come and go) every step faults in thousands of pages again: the columns
# (3.8 + 7.0 MiB for the two convolutions), the outputs and gradients of
# convolution and pooling; the kernel zeroes every page before handing it over.
# On our machine (three runs, with other programs running):
#
# | setting | ms per step | page faults per step |
# |---|---:|---:|
# | C library defaults | 52.2, 38.7, 51.2 | 7,737–8,024 |
# | defaults + buffer cache | 28.0, 29.9, 28.0 | 4,225–4,512 |
# | keep freed memory | 14.9, 15.4, 21.1 | 0 |
# | keep freed memory + buffer cache | 15.8, 15.3, 17.1 | 0 |
#
# The buffer cache removes the faults of the arrays it holds (the convolutions'
# columns, results and gradients: 19.4 MiB); the others (pooling's arrays,
# ReLU's outputs, the other gradients) still fault. Keeping freed memory in the
# heap removes every fault and is faster than the cache, and adding the cache on
# top makes the step no faster. Most likely the reason is where the arrays lie:
# the heap hands an array freed at the end of one step back at the next from
# memory the step just used, while the cache keeps arrays of its own, more than
# the CPU's caches hold. So `buffers` is switched off (`max_bytes = 0`) wherever
# `tinytrain.runtime.allocator.in_effect()` (on Linux, unless
# `TINYTRAIN_KEEP_FREED_MEMORY=0`) and serves where the C library cannot be told
# (macOS, for one). The price of either remedy is memory: the process keeps
# about its peak until it exits, as PyTorch's caching allocators do.
#
# `benchmarks/cnn_step.py` times this step and a CIFAR-shaped one against
# hand-written NumPy and PyTorch, each in a process of its own with one thread.
# On our 2-core machine the MNIST-shaped step took 0.6–0.75× PyTorch's time
# and the CIFAR-shaped one about the same (0.97–1.05× over several runs). Both were
# faster than the hand-written NumPy step (0.5× and 0.7×), which runs with the
# C library's defaults, as ordinary NumPy code does, and pays the page faults
# above. With every process told to keep freed memory
# (`MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824` in the
# environment) the NumPy step comes within 3–6% of ours, and PyTorch gains too
# (0.94× and 1.17×).
#
# ## How PyTorch does it
#
# `torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0,
# dilation=1, groups=1, bias=True)` has the same weight layout
# `(out, in / groups, kH, kW)` and the same initialisation; `F.conv2d`,
# `F.max_pool2d`, `F.avg_pool2d`, `nn.MaxPool2d`, `nn.AvgPool2d`, `nn.BatchNorm2d`
# are the same functions (they also take `dilation`, `groups`, pooling
# `padding` and `ceil_mode`, and average pooling's `count_include_pad`). Its max
# pooling saves the winners' indices, as we do (`return_indices=True` hands them
# out, for `MaxUnpool2d`), and its CPU kernel keeps the *first* maximum of a
# window, as we do. (With one exception: a window holding NaN. PyTorch counts
# NaN as larger than any number and sends the window's gradient to its last NaN;
# our strict `>` never lets a NaN win after a number. By then the loss is NaN
# anyway, and checking for NaN would cost every forward pass a few more passes.)
#
# The arithmetic is done by vendor libraries that pick among several algorithms:
#
# * **im2col + GEMM** (Chellapilla et al., 2006; made popular by Caffe, Jia et
#   al., 2014) — what we wrote. Simple and uses the fastest matrix product
#   available, at the price of the $k_H k_W$-fold copy. PyTorch's fallback
#   `slow_conv2d` still does this, one image at a time.
# * **Direct convolution** with blocked memory layouts: on the CPU, **oneDNN**
#   (formerly MKL-DNN) JIT-compiles kernels for the processor's vector width and
#   stores activations in layouts such as `nChw16c` (16 channels interleaved) so
#   the inner loop is a vector of channels — no im2col copy at all.
# * **Implicit GEMM** (cuDNN's default family on GPUs): the matrix product is
#   computed as if the columns existed, fetching each tile of them from the image
#   on the fly in fast on-chip memory.
# * **Winograd** (Lavin & Gray, 2016): for 3×3 kernels, $F(2{\times}2, 3{\times}3)$
#   computes a 2×2 output tile with 16 multiplications instead of 36, trading
#   them for cheap additions (section 8; our library uses it for wide layers).
#   **FFT** convolution pays off for large kernels.
#
# cuDNN offers all of these (`CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM`, `_GEMM`,
# `_DIRECT`, `_FFT`, `_FFT_TILING`, `_WINOGRAD`, `_WINOGRAD_NONFUSED`, ...);
# `torch.backends.cudnn.benchmark = True` times them on the first batch of each
# shape and keeps the fastest. `model.to(memory_format=torch.channels_last)`
# stores activations as NHWC, which tensor cores prefer. Our `Conv2d` runs on a
# GPU unchanged through CuPy (Module 12): the same im2col, with cuBLAS doing the
# matrix product.
#
# ## Summary
#
# * A convolution slides $O$ filters of shape $(C, k_H, k_W)$ over the padded
#   image; the output is $\lfloor (H + 2p - k)/s \rfloor + 1$ along each axis.
# * **im2col** unfolds every window into a column (a strided *view* from
#   `sliding_window_view`, then one copy); the convolution is then one matrix
#   product, batched over images so the output needs no transpose.
# * Backward is a `Linear` in disguise — $\bar A = \sum_n G_n \text{cols}_n^\top$,
#   $\overline{\text{cols}} = A^\top G$, $\bar b = \sum G$ — plus **col2im**: one
#   strided addition per kernel offset, the adjoint of im2col.
# * Pooling visits the $k_H k_W$ window offsets as strided slices (a free reshape
#   when the windows tile the input). Max pooling sends the gradient to the first
#   maximum of each window, like PyTorch.
# * On NumPy the library hands each convolution to its kernels
#   (`tinytrain.kernels`): the same arithmetic a few images at a time (the
#   columns stay in the cache), the input gradient added along whole padded
#   rows for stride 1, the bias added by the product (a row of ones under the
#   columns); wide 3×3 layers use Winograd's algorithm, 4/9 of the
#   multiplications. The course grades the recipe, which runs on every other
#   device.
# * Loops → im2col is a factor of thousands; the last factor of two is in
#   details: NumPy's slow reductions over short axes, and page faults from
#   large temporaries, which keeping freed memory in the C heap removes (a
#   buffer cache does it where the heap cannot be told).
