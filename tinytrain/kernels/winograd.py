"""Winograd's minimal filtering F(2x2, 3x3): 3x3 convolutions with 2.25x fewer multiplications.

Hand-written, not a student's: Module 11's reference ``Conv2dFunction`` hands its
3x3, stride-1, padding-1 layers to :class:`WinogradConvolution` (through
:func:`tinytrain.kernels.convolution.fast_path`) where :func:`applies` says it is
faster (Module 11, section 8, explains and measures it).

In one dimension, two outputs of a 3-tap filter ``g`` over four inputs ``d`` take
four multiplications instead of six: ``y = A^T [(G g) * (B^T d)]``. Nested, a 4x4
input tile ``d`` gives a 2x2 output tile with 16 multiplications instead of 36::

    Y = A^T [(G g G^T) * (B^T d B)] A        (* elementwise)

With channels the elementwise product becomes a sum over input channels: for each
of the 16 tile positions ``(a, b)`` it is one matrix product
``M[a, b] = V[a, b] @ U[a, b]`` of the transformed tiles ``V`` (tiles x C) and the
transformed weights ``U`` (C x O). So a convolution is 16 matrix products doing
4/9 of im2col's multiplications; the transforms of ``d`` and ``M`` are additions
only. Backward runs the same products transposed: ``dU = V^T dM`` (then
``G^T dU G`` is the weight's gradient) and ``dV = dM U^T`` (then ``B dV B^T``,
added into the overlapping input tiles, is the input's gradient), with
``dM = A dY A^T``. Inside, images are channels-last with their even columns
before their odd ones (:func:`_split_columns`), so that every addition runs over
contiguous memory.
"""
from typing import Any

import numpy as np

# The transforms of F(2, 3) (Lavin and Gray, 2016). G's halves are exact in binary floating point.
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

# Measured in Module 11, section 8: with fewer channels the 16 products are too thin to pay for the
# transforms; parts of the batch with about 1 MiB of transformed tiles keep them in the cache.
MIN_CHANNELS = 16
PART_BYTES = 1 << 20


def applies(xp: Any, x: Any, weight: Any, stride: tuple[int, int], padding: tuple[int, int]) -> bool:
    """Whether :func:`forward` computes this convolution, and is faster than im2col here.

    NumPy arrays of one floating dtype (float32 or float64), a 3x3 kernel, stride 1,
    padding 1, and at least ``MIN_CHANNELS`` input and output channels.
    """
    return (xp is np and x.dtype == weight.dtype and x.dtype in (np.float32, np.float64)
            and weight.shape[2:] == (3, 3) and stride == (1, 1) and padding == (1, 1)
            and min(weight.shape[:2]) >= MIN_CHANNELS)


class WinogradConvolution:
    """:func:`forward` and :func:`backward` as a kernel of :mod:`tinytrain.kernels.convolution`, for one call
    of a layer: ``forward(x, weight, bias)`` keeps the transformed tiles that ``backward(grad, need_x,
    need_weight, need_bias)`` reads; the bias gradient is ``grad`` summed over the batch and the positions."""

    def forward(self, x: Any, weight: Any, bias: Any) -> Any:
        out, self.saved = forward(x, weight, bias)
        return out

    def backward(self, grad: Any, need_x: bool, need_weight: bool, need_bias: bool) -> tuple[Any, Any, Any]:
        grad_x, grad_weight = backward(grad, self.saved, need_x, need_weight)
        return grad_x, grad_weight, (grad.sum(axis=(0, 2, 3)) if need_bias else None)


def transform_weight(weight: Any) -> Any:
    """``U = G w G^T`` for every (output, input) channel pair: (16, C, O), position ``(a, b)`` first."""
    out_channels, channels = weight.shape[:2]
    g = G.astype(weight.dtype)
    u = g @ weight @ g.T  # (O, C, 4, 4)
    return np.ascontiguousarray(u.transpose(2, 3, 1, 0)).reshape(16, channels, out_channels)


def weight_gradient(du: Any) -> Any:
    """``G^T dU G``: the weight's gradient (O, C, 3, 3) from the gradient of ``U``, (16, C, O)."""
    _, channels, out_channels = du.shape
    g = G.astype(du.dtype)
    tiles = du.reshape(4, 4, channels, out_channels).transpose(3, 2, 0, 1)  # (O, C, 4, 4)
    return np.ascontiguousarray(g.T @ tiles @ g)


def _tiles(size: int) -> int:
    """Output tiles along an axis: each covers two outputs (an odd size gets a last half-empty tile)."""
    return (size + 1) // 2


def _images_per_part(tiles: int, channels: int, itemsize: int) -> int:
    """How many images' transformed tiles (16 per tile, ``channels`` each) fit in ``PART_BYTES``; at least one."""
    return max(1, PART_BYTES // (16 * tiles * channels * itemsize))


def forward(x: Any, weight: Any, bias: Any = None) -> tuple[Any, tuple]:
    """The convolution of ``x`` (N, C, H, W) with ``weight`` (O, C, 3, 3), padding 1, plus ``bias`` (O,).

    Returns the result (N, O, H, W) and what :func:`backward` needs.
    """
    n, channels, height, width = x.shape
    out_channels = weight.shape[0]
    th, tw = _tiles(height), _tiles(width)
    tiles = th * tw
    u = transform_weight(weight)
    v = np.empty((16, n * tiles, channels), x.dtype)  # every image's transformed tiles, kept for backward
    result = np.empty((n, out_channels, height, width), x.dtype)
    m = max(1, min(n, _images_per_part(tiles, channels, x.dtype.itemsize)))  # 1 for an empty batch too
    # Zero-padded images in split columns (see _split_columns); an odd size gets one more zero row or column.
    padded = np.zeros((m, 2 * th + 2, 2, tw + 1, channels), x.dtype)
    rows = np.empty((4, m, th, 2, tw + 1, channels), x.dtype)
    products = np.empty((16, m * tiles, out_channels), x.dtype)
    sums = np.empty((2, 4, m, th, tw, out_channels), x.dtype)
    out = np.empty((m, 2 * th, 2, tw, out_channels), x.dtype)
    if bias is not None:  # added in the result's dtype, as im2col's product does
        bias = bias.astype(x.dtype, copy=False).reshape(-1, 1, 1)
    for start in range(0, n, m):
        k = min(m, n - start)
        _split_columns(x[start:start + k], padded[:k, 1:height + 1], shift=1)
        # B^T d B, rows first: row i of every tile is padded row 2 * ty + i, column j padded column 2 * tx + j.
        _b_transpose([padded[:k, i:i + 2 * th:2] for i in range(4)], rows[:, :k])
        part_v = v[:, start * tiles:(start + k) * tiles]
        tile_v = part_v.reshape(4, 4, k, th, tw, channels)
        for a in range(4):
            _b_transpose([rows[a, :k, :, j % 2, j // 2:j // 2 + tw] for j in range(4)], tile_v[a])
        m_part = products[:, :k * tiles]
        np.matmul(part_v, u, out=m_part)
        # A^T M A, rows first, into the 2x2 output tiles
        _a_transpose(m_part.reshape(4, 4, k, th, tw, out_channels), sums[:, :, :k])
        for r in range(2):
            _a_transpose(sums[r, :, :k], out[:k, r::2].transpose(2, 0, 1, 3, 4))
        _join_columns(out[:k, :height], result[start:start + k], bias)
    return result, (v, u, x.shape, m)


def backward(grad: Any, saved: tuple, need_x: bool = True, need_weight: bool = True) -> tuple[Any, Any]:
    """Gradients of the input and the weight (each ``None`` when not needed) from the result's ``grad``."""
    v, u, (n, channels, height, width), m = saved
    out_channels = grad.shape[1]
    th, tw = _tiles(height), _tiles(width)
    tiles = th * tw
    dtype = v.dtype
    grad_tiles = np.zeros((m, 2 * th, 2, tw, out_channels), dtype)  # an odd size's extra row/column stays 0
    rows = np.empty((4, m, th, 2, tw, out_channels), dtype)
    dm = np.empty((16, m * tiles, out_channels), dtype)
    du = np.zeros((16, channels, out_channels), dtype) if need_weight else None
    if need_x:
        grad_x = np.empty((n, channels, height, width), dtype)
        dv = np.empty((16, m * tiles, channels), dtype)
        columns = np.empty((4, 4, m, th, tw, channels), dtype)
        padded = np.empty((m, 2 * th + 2, 2, tw + 1, channels), dtype)
    for start in range(0, n, m):
        k = min(m, n - start)
        _split_columns(grad[start:start + k], grad_tiles[:k, :height], shift=0)
        # dM = A dY A^T, rows first
        _a(grad_tiles[:k, 0::2], grad_tiles[:k, 1::2], rows[:, :k])
        part_dm = dm[:, :k * tiles]
        tile_dm = part_dm.reshape(4, 4, k, th, tw, out_channels)
        for a in range(4):
            _a(rows[a, :k, :, 0], rows[a, :k, :, 1], tile_dm[a])
        if need_weight:
            du += np.matmul(v[:, start * tiles:(start + k) * tiles].transpose(0, 2, 1), part_dm)
        if need_x:
            part_dv = dv[:, :k * tiles]
            np.matmul(part_dm, u.transpose(0, 2, 1), out=part_dv)
            # B dV B^T, rows first, added into the overlapping 4x4 input tiles
            _b(part_dv.reshape(4, 4, k, th, tw, channels), columns[:, :, :k])
            image = padded[:k]
            image.fill(0)
            for i in range(4):
                row = image[:, i:i + 2 * th:2]
                _b(columns[i, :, :k], [row[:, :, j % 2, j // 2:j // 2 + tw] for j in range(4)], add=True)
            _join_columns(image[:, 1:height + 1], grad_x[start:start + k], shift=1)
    return (grad_x if need_x else None), (weight_gradient(du) if need_weight else None)


# Inside, column q of an image lives at [..., q % 2, q // 2, :] of an (..., 2, columns // 2, C) array: even
# columns, then odd ones, channels last. The columns 2 * tx + j of all tiles are then one contiguous run
# [..., j % 2, j // 2:j // 2 + tiles, :] for every j, where a plain layout would need a step of 2.
def _split_columns(images: Any, out: Any, shift: int) -> None:
    """Copy ``images`` (k, C, H, W) into ``out`` (k, H, 2, W', C): column q goes to column ``q + shift``."""
    channels, width = images.shape[1], images.shape[3]
    # Channels a multiple of 4 KiB apart (32x32 float32 images) fall into the same cache sets: gathering
    # all of them at once ran 2.5-3x slower than 8 at a time. Other sizes are fastest all at once.
    step = 8 if images.strides[1] % 4096 == 0 else channels
    for first in range(0, channels, step):
        block = images[:, first:first + step]
        for parity in range(2):
            target = parity + shift
            count = len(range(parity, width, 2))
            out[:, :, target % 2, target // 2:target // 2 + count, first:first + step] = \
                block[..., parity::2].transpose(0, 2, 3, 1)


def _join_columns(split: Any, out: Any, bias: Any = None, shift: int = 0) -> None:
    """The inverse of :func:`_split_columns`: ``out`` (k, C, H, W) from ``split`` (k, H, 2, W', C),
    column q from split column ``q + shift``; adds ``bias`` (C, 1, 1) when given."""
    width = out.shape[3]
    for parity in range(2):
        source = parity + shift
        count = len(range(parity, width, 2))
        columns = split[:, :, source % 2, source // 2:source // 2 + count].transpose(0, 3, 1, 2)
        if bias is None:
            out[..., parity::2] = columns
        else:
            np.add(columns, bias, out=out[..., parity::2])


# The four transforms as additions. Each takes the terms along the axis it transforms (a list or an
# array indexed first along it) and writes the results into `out`, indexed the same way.
def _b_transpose(d: Any, out: Any) -> None:
    """``B^T d``: (d0 - d2, d1 + d2, d2 - d1, d1 - d3)."""
    np.subtract(d[0], d[2], out=out[0])
    np.add(d[1], d[2], out=out[1])
    np.subtract(d[2], d[1], out=out[2])
    np.subtract(d[1], d[3], out=out[3])


def _a_transpose(m: Any, out: Any) -> None:
    """``A^T m``: (m0 + m1 + m2, m1 - m2 - m3)."""
    np.add(m[0], m[1], out=out[0])
    out[0] += m[2]
    np.subtract(m[1], m[2], out=out[1])
    out[1] -= m[3]


def _a(y0: Any, y1: Any, out: Any) -> None:
    """``A y``: (y0, y0 + y1, y0 - y1, -y1), the adjoint of :func:`_a_transpose`."""
    out[0] = y0
    np.add(y0, y1, out=out[1])
    np.subtract(y0, y1, out=out[2])
    np.negative(y1, out=out[3])


def _b(q: Any, out: Any, add: bool = False) -> None:
    """``B q``: (q0, q1 - q2 + q3, q1 + q2 - q0, -q3), the adjoint of :func:`_b_transpose`;
    added into ``out`` when ``add``."""
    if not add:
        out[0] = q[0]
        np.subtract(q[1], q[2], out=out[1])
        out[1] += q[3]
        np.add(q[1], q[2], out=out[2])
        out[2] -= q[0]
        np.negative(q[3], out=out[3])
        return
    out[0] += q[0]
    out[1] += q[1]
    out[1] -= q[2]
    out[1] += q[3]
    out[2] += q[1]
    out[2] += q[2]
    out[2] -= q[0]
    out[3] -= q[3]
