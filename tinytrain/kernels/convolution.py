"""The library's convolution on NumPy: the fast paths that Module 11's reference ``Conv2dFunction`` hands layers to.

Hand-written, not a student's: Module 11 teaches the recipe (im2col, one matrix
product, col2im), and its section 8 explains and measures what these kernels do
differently. :func:`fast_path` chooses once per call of a layer:

* :class:`~tinytrain.kernels.winograd.WinogradConvolution` for 3x3, stride-1,
  padding-1 layers with many channels: Winograd's algorithm, 4/9 of the
  multiplications (:func:`tinytrain.kernels.winograd.applies` says when);
* :class:`Im2colInParts` for every other layer: the recipe itself, done a few
  images at a time and with two more changes that keep the arithmetic;
* ``None`` on every other device: the recipe as the lesson writes it runs there
  (on a GPU, cuBLAS does its products, and large products are what a GPU wants).

A kernel serves one call of a layer: ``forward(x, weight, bias)`` returns the
convolution ``(N, O, H_out, W_out)`` of the NumPy arrays ``x`` ``(N, C, H, W)``,
``weight`` ``(O, C, kH, kW)`` and ``bias`` ``(O,)`` or ``None``, in NumPy's promotion
of ``x``'s and the weight's dtypes, and keeps what ``backward(grad, need_x,
need_weight, need_bias)`` needs; that returns the gradients of the input, the
weight and the bias, each ``None`` where it is not needed and otherwise in
``grad``'s dtype. It never changes ``x``, ``weight`` or ``grad``, and it keeps what
it saved intact, so backward may run twice (``retain_graph``).
"""
from typing import Any

import numpy as np

from tinytrain.kernels import winograd
from tinytrain.kernels.parts import cache_sized_parts
from tinytrain.runtime.buffers import buffers


def fast_path(xp: Any, x: Any, weight: Any, stride: tuple[int, int],
              padding: tuple[int, int]) -> "winograd.WinogradConvolution | Im2colInParts | None":
    """The kernel for convolving ``x`` with ``weight`` (``stride`` and ``padding`` pairs) on ``xp``'s device:
    Winograd's where it applies and is faster, :class:`Im2colInParts` elsewhere on NumPy, None on other devices."""
    if xp is not np:
        return None
    if winograd.applies(xp, x, weight, stride, padding):
        return winograd.WinogradConvolution()
    return Im2colInParts(stride, padding)


class Im2colInParts:
    """im2col, one matrix product per image and col2im, as Module 11 teaches them, with three changes:

    1. **A few images at a time.** The columns of a whole batch are tens of
       megabytes. Unfolded and multiplied a cache-sized part of the batch at a time
       (:func:`~tinytrain.kernels.parts.cache_sized_parts`), the product reads
       columns that are still in the processor's cache; backward reads each part's
       columns and gradient while they are. The padded images are one part's
       buffer, its border zeroed once; backward, each part's padded input gradient
       is such a buffer too, and only its inside is copied out, so that the input
       gradient is contiguous: over a view of short rows that cuts the padding off,
       the previous layer's backward runs up to 10x slower.
    2. **col2im along whole rows** (:func:`add_windows`), for stride 1.
    3. **The bias as a row of ones.** With a row of ones under each image's columns
       and the bias as one more column of the weight matrix, the product adds the
       bias (``out += b`` would be one more pass over the result), and backward the
       same row gives the bias gradient: the last row of ``cols @ g.T`` is ``g``
       summed over the positions.

    Its large arrays come from :data:`tinytrain.runtime.buffers.buffers`.
    """

    def __init__(self, stride: tuple[int, int], padding: tuple[int, int]) -> None:
        self.stride, self.padding = stride, padding

    def forward(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        n, channels, height, width = x.shape
        out_channels, _, kh, kw = weight.shape
        (ph, pw), (sh, sw) = self.padding, self.stride
        self.padded_shape = (n, channels, height + 2 * ph, width + 2 * pw)
        out_h, out_w = (height + 2 * ph - kh) // sh + 1, (width + 2 * pw - kw) // sw + 1
        rows = weight.reshape(out_channels, channels * kh * kw)
        unfolded = rows.shape[1]
        if bias is not None:  # [A | b]: the bias is the weight of the row of ones below the columns
            rows = np.concatenate([rows, bias.reshape(out_channels, 1).astype(rows.dtype, copy=False)], axis=1)
        cols = buffers.empty(np, (n, rows.shape[1], out_h * out_w), x.dtype)
        out = buffers.empty(np, (n, out_channels, out_h * out_w), np.result_type(rows, cols))  # (N, O, L): NCHW
        parts = cache_sized_parts(np, cols)
        if ph or pw:  # one part's padded images, the border zeroed once; each part copies in its images
            padded = buffers.zeros(np, (len(x[parts[0]]),) + self.padded_shape[1:], x.dtype)
        for part in parts:
            images = x[part]
            if ph or pw:
                padded[:len(images), :, ph:ph + height, pw:pw + width] = images
                images = padded[:len(images)]
            _unfold(images, (kh, kw), self.stride, out=cols[part, :unfolded])
            cols[part, unfolded:] = 1  # the row of ones (an empty slice without a bias)
            np.matmul(rows, cols[part], out=out[part])
        self.cols, self.weight = cols, weight
        return out.reshape(n, out_channels, out_h, out_w)

    def backward(self, grad: np.ndarray, need_x: bool, need_weight: bool,
                 need_bias: bool) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        cols, weight = self.cols, self.weight
        n, out_channels, out_h, out_w = grad.shape
        g = grad.reshape(n, out_channels, out_h * out_w)  # (N, O, L); -1 cannot be inferred for an empty batch
        rows = weight.reshape(out_channels, -1)
        unfolded = rows.shape[1]
        parts = cache_sized_parts(np, cols)
        grad_x = grad_weight = grad_bias = None
        if need_x:
            (ph, pw), (_, channels, height, width) = self.padding, self.padded_shape
            grad_x = buffers.empty(np, (n, channels, height - 2 * ph, width - 2 * pw), g.dtype)
            # stride 1: a column of the column gradient for every position of a padded row (add_windows)
            row_length = width if self.stride == (1, 1) else out_w
            part_size = len(grad[parts[0]])
            g_rows = buffers.zeros(np, (part_size, out_channels, out_h, row_length), g.dtype)  # zeros past out_w
            grad_cols = buffers.empty(np, (part_size, unfolded, out_h * row_length), g.dtype)
            padded = buffers.empty(np, (part_size,) + self.padded_shape[1:], g.dtype) if ph or pw else None
        weight_parts = []  # per part, as (C kH kW [+ 1], O): cols @ g.T is the faster order for BLAS
        for part in parts:
            if need_weight:  # with a bias, the row of ones gives its gradient (the sum of g) as well
                weight_parts.append(np.matmul(cols[part], g[part].transpose(0, 2, 1)).sum(axis=0))
            if need_x:
                m = len(grad[part])
                g_rows[:m, :, :, :out_w] = grad[part]
                np.matmul(rows.T, g_rows[:m].reshape(m, out_channels, out_h * row_length), out=grad_cols[:m])
                image = grad_x[part] if padded is None else padded[:m]
                image.fill(0)
                if row_length == out_w:
                    _fold(grad_cols[:m], image, weight.shape[2:], self.stride)
                else:
                    add_windows(grad_cols[:m], image, weight.shape[2:])
                if padded is not None:  # the padding is not an input: copy the inside out while it is in the cache
                    grad_x[part] = image[:, :, ph:height - ph, pw:width - pw]
        if need_weight:
            total = sum(weight_parts)
            grad_weight = total[:unfolded].T.reshape(weight.shape)
            grad_bias = total[unfolded] if need_bias else None
        elif need_bias:  # a frozen weight: the bias gradient alone
            grad_bias = g.sum(axis=(0, 2))
        return grad_x, grad_weight, grad_bias


def add_windows(cols: np.ndarray, image: np.ndarray, kernel: tuple[int, int]) -> None:
    """col2im for stride 1 along whole rows: add ``cols`` into the (padded) ``image`` (N, C, H, W).

    col2im adds rows of ``W_out`` numbers per kernel offset, and for a 14x14 image
    NumPy spends more time starting each short row than adding it. Here ``cols`` is
    (N, C * kH * kW, H_out * W): a column for each position of a *full* image row,
    so output (r, q) is column ``r * W + q``; the ``kW - 1`` columns with
    ``q >= W_out`` (past the last window of a row) must hold zeros. The window at
    offset (i, j) of every output is then the flattened image shifted by
    ``i * W + j``: one addition of long contiguous runs per offset. On our machine
    it made the input gradient of a 32 -> 64 channel layer at 16x16 about 1.2x
    faster, although its product is 18/16 times larger (Module 11, section 8).
    """
    n, c, height, width = image.shape
    kh, kw = kernel
    flat = image.reshape(n, c, height * width)
    patches = cols.reshape(n, c, kh * kw, cols.shape[-1])
    length = (height - kh) * width + (width - kw + 1)  # up to the last real output: no shift runs past the end
    for k in range(kh * kw):
        start = (k // kw) * width + k % kw  # offset (i, j) of the window, row by row
        flat[:, :, start:start + length] += patches[:, :, k, :length]


# The lesson's im2col and col2im (Module 11, sections 2 and 3) once more, for NumPy arrays: the kernels
# do not import the module a student writes (tinytrain.nn.conv imports them).
def _unfold(images: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int], out: np.ndarray) -> None:
    """im2col of the padded ``images`` (N, C, H, W) into ``out`` (N, C * kH * kW, H_out * W_out)."""
    windows = np.lib.stride_tricks.sliding_window_view(images, kernel, axis=(2, 3))[:, :, ::stride[0], ::stride[1]]
    patches = windows.transpose(0, 1, 4, 5, 2, 3)  # (N, C, kH, kW, H_out, W_out): still a view
    out.reshape(patches.shape)[...] = patches


def _fold(cols: np.ndarray, image: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int]) -> None:
    """col2im: add ``cols`` (N, C * kH * kW, H_out * W_out) into the padded ``image`` (N, C, H, W)."""
    n, c, height, width = image.shape
    (kh, kw), (sh, sw) = kernel, stride
    out_h, out_w = (height - kh) // sh + 1, (width - kw) // sw + 1
    patches = cols.reshape(n, c, kh, kw, out_h, out_w)
    for i in range(kh):
        for j in range(kw):
            image[:, :, i:i + sh * (out_h - 1) + 1:sh, j:j + sw * (out_w - 1) + 1:sw] += patches[:, :, i, j]
