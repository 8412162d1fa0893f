# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 19 — Quantization: int8 per channel, calibration, fake-quant training and NF4
#
# *One sitting, about 3 hours: the lesson, 12 functions to write, and the measurements.*
#
# A trained model in float32 spends 4 bytes on every weight. GPT-2 small's 124 M
# parameters are 500 MB; a 65 B-parameter LLaMA is 260 GB, more than any GPU
# holds. Yet a trained network does not need 24 bits of mantissa per weight: it
# runs almost as well on **8-bit integers** — and a large language model even on
# **4 bits**. This module builds both, the way practitioners do it.
#
# **You will**
# 1. map floats to integers and back: a *scale* and a *zero point*, rounding and
#    clamping to the integer range, symmetric and affine (asymmetric);
# 2. quantize a weight **per output channel**, each row with its own scale;
# 3. calibrate the range of activations on a few batches with *observers*
#    (min/max and a percentile): **static** quantization, against **dynamic**
#    quantization, which measures every batch;
# 4. write the **integer matrix product** (int8 × int8, summed in int32) that a
#    quantized layer runs, and find the fastest honest way to do it in NumPy;
# 5. train through rounding with **fake quantization** and the
#    **straight-through estimator** (quantization-aware training, QAT);
# 6. write **NF4**, QLoRA's 4-bit type: 16 levels at the quantiles of a normal
#    distribution, a scale per block of 64 weights, the scales themselves in
#    8 bits (*double quantization*), two codes per byte;
# 7. measure, on a GPT trained on Shakespeare: bytes and validation loss in
#    float32, int8 (dynamic and static) and NF4, the error of every layer, and a
#    short QAT fine-tune.
#
# The integer-arithmetic scheme is that of Jacob et al. (2018), *Quantization
# and Training of Neural Networks for Efficient Integer-Arithmetic-Only
# Inference*; NF4 and double quantization are from Dettmers et al. (2023),
# *QLoRA: Efficient Finetuning of Quantized LLMs*.

# %%
import math
import statistics
import time

import numpy as np

import tinytrain as tt
from tinytrain import Tensor

# %% [markdown]
# ## 1. Where the bytes go
#
# | type | bytes per weight | GPT-2 small (124 M) | 7 B model |
# |---|---|---|---|
# | float32 | 4 | 498 MB | 28 GB |
# | bfloat16 / float16 | 2 | 249 MB | 14 GB |
# | int8 (+ a float32 scale per row) | ≈ 1 | ≈ 125 MB | ≈ 7 GB |
# | NF4 (+ scales, double-quantized) | ≈ 0.52 | ≈ 64 MB | ≈ 3.6 GB |
#
# Bytes matter twice. They decide what fits: a 7 B model in float32 fits no
# consumer GPU, in NF4 it fits a laptop's. And they decide the speed of
# generation: to write one token, a language model reads **every weight once**
# and does two floating-point operations with it. A GPU reads perhaps 3 TB/s
# and computes 1,000 TFLOP/s: at batch size 1 it spends its time waiting for
# weights, so four times fewer bytes make each token up to four times faster.
#
# The price is rounding. A quantized weight is one of at most 256 values (int8)
# or 16 (4 bits); the art is to choose those values so that the network does not
# notice.

# %%
for name, bytes_per_weight in [("float32", 4), ("bfloat16", 2), ("int8", 1 + 4 / 768), ("NF4", 4.127 / 8)]:
    print(f"{name:9s} {124.4e6 * bytes_per_weight / 1e6:6.0f} MB for GPT-2 small, "
          f"{7e9 * bytes_per_weight / 1e9:5.1f} GB for a 7 B model")

# %% [markdown]
# ## 2. From floats to integers and back
#
# Quantization maps a real value $x$ to an integer **code** $q$ with a **scale**
# $s > 0$ and a **zero point** $z$ (an integer):
#
# $$q = \operatorname{clamp}\!\left(\operatorname{round}\!\left(\frac{x}{s}\right) + z,\ q_{\min},\ q_{\max}\right),
#   \qquad \hat x = s\,(q - z).$$
#
# $\hat x$ is the value the code stands for (*dequantization*). Inside the range,
# rounding moves a value by at most half a step: $|x - \hat x| \le s/2$. Outside
# it, the clamp cuts it to the nearest end. Rounding is **half to even**
# (`round(2.5) = 2`, `round(3.5) = 4`), as NumPy's `round` and PyTorch do: ties
# go up and down equally often instead of always up.
#
# Signed `b`-bit codes run from $-2^{b-1}$ to $2^{b-1} - 1$: int8 from $-128$ to
# $127$ (`integer_range`, given). Two ways to choose $s$ and $z$ for values in
# $[\text{low}, \text{high}]$:
#
# * **affine** (asymmetric): the range is first widened to include 0
#   ($\text{low} \leftarrow \min(\text{low}, 0)$, $\text{high} \leftarrow
#   \max(\text{high}, 0)$), then spread over all codes:
#   $$s = \frac{\text{high} - \text{low}}{q_{\max} - q_{\min}}, \qquad
#     z = q_{\min} - \operatorname{round}\!\left(\frac{\text{low}}{s}\right).$$
#   $z$ is the code of 0, and 0 comes back **exactly**: $\hat 0 = s(z - z) = 0$.
#   That matters: zero padding, ReLU's zeros and masked positions must stay 0
#   (Jacob et al. make it a requirement). Activations use affine codes: after a
#   ReLU or GELU they are far from centred on 0.
# * **symmetric**: $z = 0$, the range $[-a, a]$ with $a = \max(|\text{low}|,
#   |\text{high}|)$, and the lowest code dropped so that both sides are equal:
#   $q \in [-127, 127]$ for int8, $s = a / 127$. Weights are roughly centred on
#   0, and a zero point of 0 keeps the integer matrix product simple (section 5).
#   `integer_range(bits, symmetric=True)` gives $[-127, 127]$.
#
# A range of width 0 (an all-zero channel) would make $s = 0$ and divide by
# zero: use $s = 1$ there — any scale represents 0 exactly.
#
# **Worked example** (int8, affine), values in $[-1, 3]$: $s = 4/255 = 0.015686$,
# $z = -128 - \operatorname{round}(-1/0.015686) = -128 + 64 = -64$. Then
# $x = 1$: $1/s = 63.75 \to 64$, $q = 64 - 64 = 0$, $\hat x = s \cdot 64 =
# 1.0039$, off by $0.0039 \le s/2$. And $x = 0$: $q = -64$, $\hat x = 0$ exactly.
# Symmetric on the same range: $s = 3/127 = 0.02362$ and $-1 \to -42$: the codes
# $-127 \ldots -43$ are never used, a third of the range wasted on values that
# do not occur.
#
# The scales are float32 tensors and the zero points int32, one of each per
# range: `low` and `high` may be numbers (one range) or tensors of one shape
# (a range per channel, section 3). Work on the arrays: `xp = low._backend.xp`,
# `low.data`, and wrap results with `Tensor._make(array, low._backend)` so that
# they stay on the tensors' device. One NumPy trap with one range: a ufunc on
# 0-d arrays (`np.round`, `a - b`) returns a NumPy *scalar*, not a 0-d array;
# `xp.asarray(result)` makes it an array again before `Tensor._make`, wherever
# a 0-d result must stay an array (a layer's buffer, section 4).

# %% export="quantization"
"""Quantization: int8 per output channel, calibrated activations, fake-quant training, and 4-bit NF4.

A code ``q`` stands for the value ``scale * (q - zero_point)``. ``choose_qparams`` picks the
scale and zero point of a range, ``quantize`` / ``dequantize`` go between floats and codes,
``quantize_per_channel`` gives each row of a weight its own scale, and an ``Observer`` records
the range of activations on calibration batches. ``int8_matmul`` multiplies int8 matrices
exactly (float32 products of integers, summed in int32), ``int8_linear`` is a quantized layer's
integer forward, ``QuantizedLinear`` the layer (dynamic or static activations),
``FakeQuantize`` the straight-through rounding of quantization-aware training (``QATLinear``,
``prepare_qat``, ``convert_qat``), and ``nf4_quantize`` / ``nf4_dequantize`` QLoRA's 4-bit
NormalFloat with double-quantized block scales (``NF4Linear``). ``quantize_model`` replaces a
model's ``Linear`` layers; ``model_bytes`` counts the bytes a model holds.

The scheme is Jacob et al. (2018), *Quantization and Training of Neural Networks for
Efficient Integer-Arithmetic-Only Inference*; NF4 and double quantization are Dettmers et al.
(2023), *QLoRA: Efficient Finetuning of Quantized LLMs*.
"""
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from tinytrain.arguments import check_callable, check_int, check_number, check_type
from tinytrain.autograd import Function, no_grad
from tinytrain.nn.layers import Linear, check_floating_input, linear
from tinytrain.nn.module import Module, Parameter
from tinytrain.tensor import Tensor


def integer_range(bits: int = 8, symmetric: bool = False) -> tuple[int, int]:
    """``(qmin, qmax)`` of signed ``bits``-bit codes: ``(-2**(bits-1), 2**(bits-1) - 1)``, int8's
    ``(-128, 127)``; ``symmetric`` drops the lowest code so that both sides are equal, ``(-127, 127)``.
    Codes are stored as int8, so ``bits`` is 2 to 8 (``ValueError`` naming it otherwise)."""
    bits = check_int("bits", bits, minimum=2)
    if bits > 8:
        raise ValueError(f"bits must be at most 8 (codes are stored as int8), got bits={bits}")
    top = 2 ** (bits - 1) - 1
    return (-top if symmetric else -top - 1), top


def as_tensor(value: Any, like: Tensor, dtype: Any, name: str) -> Tensor:
    """``value`` (a number, a list, a host array or a tensor) as a tensor of ``dtype`` on ``like``'s
    device; a tensor on another device raises ``RuntimeError`` naming ``name`` and both devices."""
    if isinstance(value, Tensor):
        if value._backend is not like._backend:
            raise RuntimeError(f"{name} is on {value.device}, the values on {like.device}; move it with .to(device)")
        return value if value.dtype == np.dtype(dtype) else Tensor._make(value.data.astype(dtype), value._backend)
    return Tensor(value, dtype=dtype, device=like._backend)


def choose_qparams(low: Any, high: Any, bits: int = 8, symmetric: bool = False) -> tuple[Tensor, Tensor]:
    """The scale and zero point that map values in ``[low, high]`` onto ``bits``-bit codes.

    ``low`` and ``high``: numbers, or tensors of one shape (a range per channel). Returns
    ``(scale, zero_point)``: a float32 and an int32 tensor of that shape, on their device.

    * affine: the range widened to include 0 (``low = min(low, 0)``, ``high = max(high, 0)``), then
      ``scale = (high - low) / (qmax - qmin)`` and ``zero_point = qmin - round(low / scale)``, the
      code of 0 (``(qmin, qmax) = integer_range(bits)``);
    * symmetric: ``scale = max(|low|, |high|) / qmax`` and ``zero_point = 0``
      (``integer_range(bits, symmetric=True)``: int8's ``[-127, 127]``).

    A range of width 0 gets scale 1 (any scale represents 0 exactly). Raises ``ValueError`` naming
    the values where ``low > high``.
    """
    anchor = low if isinstance(low, Tensor) else high if isinstance(high, Tensor) else Tensor(0.0)
    low, high = as_tensor(low, anchor, np.float32, "low"), as_tensor(high, anchor, np.float32, "high")
    if low.shape != high.shape:
        raise ValueError(f"choose_qparams: low and high must have one shape, got {low.shape} and {high.shape}")
    if bool((low.data > high.data).any()):
        lows, highs = low.numpy(), high.numpy()
        where = tuple(int(i) for i in np.argwhere(lows > highs)[0])
        at = f" at {where}" if where else ""
        raise ValueError(f"choose_qparams: low must not exceed high, got low={lows[where]} > high={highs[where]}{at}")
    qmin, qmax = integer_range(bits, symmetric)
    ### BEGIN SOLUTION
    xp = low._backend.xp
    low_with_0, high_with_0 = xp.minimum(low.data, 0), xp.maximum(high.data, 0)
    if symmetric:
        scale = xp.maximum(-low_with_0, high_with_0) / qmax
    else:
        scale = (high_with_0 - low_with_0) / (qmax - qmin)
    scale = xp.where(scale == 0, 1, scale).astype(xp.float32)
    zero_point = xp.zeros_like(scale) if symmetric else qmin - xp.round(low_with_0 / scale)
    return Tensor._make(scale, low._backend), Tensor._make(zero_point.astype(xp.int32), low._backend)
    ### END SOLUTION


# %% check=2
scale, zero_point = choose_qparams(-1.0, 3.0)
assert np.isclose(scale.item(), 4 / 255) and zero_point.item() == -64, (scale, zero_point)
assert scale.dtype == np.float32 and zero_point.dtype == np.int32, "float32 scales, int32 zero points"
scale, zero_point = choose_qparams(-1.0, 3.0, symmetric=True)
assert np.isclose(scale.item(), 3 / 127) and zero_point.item() == 0, "symmetric: max(|low|, |high|) / 127"
scale, zero_point = choose_qparams(0.5, 2.0)
assert np.isclose(scale.item(), 2 / 255) and zero_point.item() == -128, "the range is widened to include 0"
scale, zero_point = choose_qparams(tt.tensor([-2.0, 0.0, -1.0]), tt.tensor([1.75, 0.0, 2.75]), bits=4)
assert np.allclose(scale.numpy(), [0.25, 1, 0.25]) and zero_point.numpy().tolist() == [0, -8, -4], \
    "a range per channel; 4 bits: codes -8..7; an empty range gets scale 1"
print("choose_qparams OK")

# %% [markdown]
# Now the two directions. `quantize(x, scale, zero_point, qmin, qmax)` returns
# the codes as an **int8** tensor; `scale` and `zero_point` broadcast against
# `x` (a scale per row of a matrix has shape $(C, 1)$). `dequantize(codes,
# scale, zero_point)` returns $s(q - z)$ in the scale's dtype, float32. Mind
# NumPy's promotion rules here: an int32 array times a float32 array is
# **float64** (int32 does not fit in float32's 24-bit mantissa, so NumPy widens);
# cast the codes and the zero point to the scale's dtype first. `quantize` meets
# the same rule: `round(x / scale) + zero_point` with an int32 zero point is
# float64 too — harmless to the codes, which are whole numbers cast to int8 after
# the clip, but a float64 copy of `x`; cast the zero point to `x`'s dtype to stay
# in float32.

# %% export="quantization"
def qparams_like(x: Tensor, scale: Any, zero_point: Any) -> tuple[Tensor, Tensor]:
    """``scale`` and ``zero_point`` as tensors on ``x``'s device (scale in ``x``'s float dtype, the zero
    point int32), checked to broadcast against ``x`` without changing its shape, and ``scale > 0``."""
    dtype = x.dtype if x.dtype.kind == "f" else np.float32
    scale, zero_point = as_tensor(scale, x, dtype, "scale"), as_tensor(zero_point, x, np.int32, "zero_point")
    try:
        shape = np.broadcast_shapes(x.shape, scale.shape, zero_point.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise ValueError(f"scale of shape {scale.shape} and zero_point of shape {zero_point.shape} must broadcast "
                         f"against the values' shape {x.shape} (a scale per row of a matrix: shape (rows, 1))")
    if not bool((scale.data > 0).all()):
        raise ValueError(f"scale must be > 0 everywhere, got a smallest scale of {float(scale.data.min())}")
    return scale, zero_point


def quantize(x: Tensor, scale: Any, zero_point: Any = 0, qmin: int = -128, qmax: int = 127) -> Tensor:
    """The codes of ``x``: ``clip(round(x / scale) + zero_point, qmin, qmax)`` as an int8 tensor of ``x``'s
    shape on its device (``round`` half to even). ``scale`` (> 0) and ``zero_point`` are numbers or tensors
    that broadcast against ``x``; ``qmin < qmax`` within int8's ``[-128, 127]``."""
    check_type("x", x, Tensor, "a Tensor")
    check_floating_input("quantize", x)
    qmin, qmax = check_int("qmin", qmin, minimum=-128), check_int("qmax", qmax)
    if not qmin < qmax <= 127:
        raise ValueError(f"quantize: need -128 <= qmin < qmax <= 127 (int8 codes), got qmin={qmin}, qmax={qmax}")
    scale, zero_point = qparams_like(x, scale, zero_point)
    ### BEGIN SOLUTION
    xp = x._backend.xp
    codes = xp.round(x.data / scale.data) + zero_point.data
    return Tensor._make(xp.clip(codes, qmin, qmax).astype(xp.int8), x._backend)
    ### END SOLUTION


def dequantize(codes: Tensor, scale: Any, zero_point: Any = 0) -> Tensor:
    """The values that integer ``codes`` stand for: ``scale * (codes - zero_point)``, a tensor of the
    codes' shape in the scale's dtype (float32 for the scales ``choose_qparams`` gives)."""
    check_type("codes", codes, Tensor, "a Tensor")
    if codes.dtype.kind not in "iu":
        raise TypeError(f"dequantize: codes must be integers, got {codes.dtype} of shape {codes.shape}")
    scale, zero_point = qparams_like(codes, scale, zero_point)
    ### BEGIN SOLUTION
    dtype = scale.dtype
    return Tensor._make((codes.data.astype(dtype) - zero_point.data.astype(dtype)) * scale.data, codes._backend)
    ### END SOLUTION


# %% check=2
x = tt.tensor([-1.0, 0.0, 0.25, 0.75, 1.1, 100.0, -100.0])
codes = quantize(x, 0.5, 3)
assert codes.dtype == np.int8 and codes.numpy().tolist() == [1, 3, 3, 5, 5, 127, -128], codes
assert np.allclose(dequantize(codes, 0.5, 3).numpy(), [-1, 0, 0, 1, 1, 62, -65.5]), "s (q - z)"
assert dequantize(codes, 0.5, 3).dtype == np.float32, "cast the codes and zero point to the scale's dtype"
rows = quantize(tt.tensor([[1.0, -1.0], [1.0, -1.0]]), tt.tensor([[0.5], [0.25]]), 0, -127, 127)
assert rows.numpy().tolist() == [[2, -2], [4, -4]], "a scale per row broadcasts"
print("quantize and dequantize OK")

# %% [markdown]
# $0.25 = 0.5 s$ rounded to $0 + z$ and $0.75 = 1.5 s$ to $2 + z$: half to even.
# And $100$ was clamped to code $127$, which stands for $62$: outside the range, the
# error is no longer bounded by $s/2$. Every choice of range trades those two
# errors, **rounding** (a wide range: coarse steps) against **clipping** (a
# narrow one: the extremes cut off).

# %% [markdown]
# ## 3. Weights: a scale per output channel
#
# A Linear layer computes $y_i = \sum_j W_{ij} x_j + b_i$ with $W$ of shape
# $(\text{out}, \text{in})$. Its rows — the **output channels** — often differ in
# size by an order of magnitude. With one scale for the whole matrix, the largest
# weight anywhere sets the step, and a row of small weights is left with a handful
# of distinct codes. So give each row its own symmetric scale:
#
# $$s_i = \frac{\max_j |W_{ij}|}{127}, \qquad q_{ij} = \operatorname{round}(W_{ij} / s_i) \in [-127, 127].$$
#
# Each row's largest weight maps to $\pm 127$ exactly, so nothing is clipped and
# **every weight comes back within half its row's step**: $|W_{ij} - s_i q_{ij}|
# \le s_i / 2$. The price is one float32 per row: $4 / \text{in}$ bytes per weight
# (3% at $\text{in} = 128$).
#
# Why per *output* channel, and not per input column? The product sums over $j$.
# A scale of row $i$ is a constant of output $i$ and leaves the sum:
# $y_i \approx s_i \sum_j q_{ij} x_j$ — the sum stays an integer product (section
# 5). A scale per column $j$ would sit inside the sum, a multiplication per term.
#
# `quantize_per_channel(weight, bits=8)` returns the codes, int8 of the weight's
# shape, and the scales, float32 of shape $(\text{out},)$: build it from
# `choose_qparams` (symmetric, each row's range $[-\max|W_i|, \max|W_i|]$) and
# `quantize` (a scale per row broadcasts with shape $(\text{out}, 1)$, and the
# symmetric range is `integer_range(bits, symmetric=True)`).

# %% export="quantization"
def quantize_per_channel(weight: Tensor, bits: int = 8) -> tuple[Tensor, Tensor]:
    """Symmetric codes of a ``(out, in)`` weight with one scale per row (output channel).

    Row ``i`` gets ``scale[i] = max_j |weight[i, j]| / qmax`` and zero point 0 (``choose_qparams``,
    symmetric), and ``codes = quantize(weight, scale[:, None], 0, qmin, qmax)`` with ``(qmin, qmax) =
    integer_range(bits, symmetric=True)``. Returns ``(codes, scale)``: int8 ``(out, in)`` and float32
    ``(out,)``. Every weight comes back within half its row's step: ``|weight - scale[:, None] * codes|
    <= scale[:, None] / 2``.
    """
    check_type("weight", weight, Tensor, "a Tensor")
    if weight.ndim != 2:
        raise ValueError(f"quantize_per_channel expects a (out, in) weight, got shape {weight.shape}")
    check_floating_input("quantize_per_channel", weight)
    ### BEGIN SOLUTION
    amax = Tensor._make(weight._backend.xp.abs(weight.data).max(axis=1), weight._backend)
    scale, zero_point = choose_qparams(-amax, amax, bits, symmetric=True)
    qmin, qmax = integer_range(bits, symmetric=True)
    codes = quantize(weight, scale.reshape(-1, 1), zero_point.reshape(-1, 1), qmin, qmax)
    return codes, scale
    ### END SOLUTION


# %% check=2
weight = tt.tensor([[0.5, -1.27, 0.1], [0.001, 0.003, -0.004], [0.0, 0.0, 0.0]])
codes, scale = quantize_per_channel(weight)
assert codes.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (3,), (codes, scale)
assert np.allclose(scale.numpy(), [0.01, 0.004 / 127, 1.0]), "scale[i] = max |row i| / 127 (an all-zero row: 1)"
assert codes.numpy().tolist() == [[50, -127, 10], [32, 95, -127], [0, 0, 0]], codes
rng = np.random.default_rng(0)
weight = tt.tensor(rng.standard_normal((16, 40)) * 10.0 ** rng.uniform(-2, 1, (16, 1)))
codes, scale = quantize_per_channel(weight)
error = np.abs(weight.numpy() - scale.numpy()[:, None] * codes.numpy())
assert (error <= scale.numpy()[:, None] / 2 * (1 + 1e-5)).all(), "every weight within half its row's step"
codes4, scale4 = quantize_per_channel(weight, bits=4)
assert np.abs(codes4.numpy()).max() == 7 and np.allclose(scale4.numpy(), scale.numpy() * 127 / 7, rtol=1e-6), \
    f"bits=4: codes in [-7, 7] and scales 127/7 times int8's, got a largest |code| of {np.abs(codes4.numpy()).max()}"
print("quantize_per_channel OK")

# %% [markdown]
# How much per-channel scales buy on a weight whose rows differ in size (the
# rows of trained layers do, less extremely):

# %%
def per_tensor_round_trip(weight: Tensor) -> np.ndarray:
    """The weight after int8 codes with one symmetric scale for the whole matrix."""
    amax = float(np.abs(weight.numpy()).max())
    scale, _ = choose_qparams(-amax, amax, symmetric=True)
    return dequantize(quantize(weight, scale, 0, -127, 127), scale).numpy()


codes, scale = quantize_per_channel(weight)
per_channel = dequantize(codes, scale.reshape(-1, 1)).numpy()
relative = np.abs(weight.numpy()).mean(axis=1)
for name, approximation in [("per tensor", per_tensor_round_trip(weight)), ("per channel", per_channel)]:
    row_errors = np.abs(approximation - weight.numpy()).mean(axis=1) / relative
    print(f"{name:11s}: error / mean |weight| per row: median {np.median(row_errors):.4f}, "
          f"worst {row_errors.max():.4f}")

# %% [markdown]
# ## 4. Activations: calibrate, or measure every batch
#
# Weights are known before the model runs; the inputs of each layer are not.
# Two ways to pick their scale and zero point:
#
# * **dynamic** quantization measures each batch as it comes: its min and max,
#   then `choose_qparams`. The range always fits the batch, at the cost of a pass
#   over the activations and one read of two numbers per layer and batch.
#   (PyTorch's `quantize_dynamic` does this for Linear layers.)
# * **static** quantization fixes the ranges beforehand: run the model on a few
#   representative batches — **calibration** — and let an **observer** at each
#   layer's input record the range it sees. At run time nothing is measured; an
#   input unlike the calibration data gets clipped.
#
# What should an observer record? **min/max**: the smallest and largest value in
# any batch. Every calibration value fits, but one outlier stretches the range and
# every other value gets a coarser step. A **percentile** observer takes, per
# batch, the $(100 - p)$-th and $p$-th percentiles ($p = 99.99$: all but one
# value in 10,000 inside) and averages them over the batches: the rare extremes
# are clipped, the bulk gets finer steps. Example: 10,000 values of $\mathcal
# N(0, 1)$ and one of 50. Min/max gives $[-3.9, 50]$, a step of $0.21$: the bulk
# of the values, within $\pm 2$, falls on about 19 codes. The 99.9th percentiles
# give about $[-3.3, 3.3]$, a step of $0.026$ — and the 50 is clipped to $3.3$.
#
# `Observer.observe(x)` updates `low` and `high` (Python floats, `None` before the
# first batch) and counts the batches in `batches`; `qparams(bits)` (given) turns
# the range into an affine scale and zero point. The first batch sets `low` and
# `high` to its own range, for either method. For the percentile average, a
# running mean needs no list of past batches: after $n$ batches,
# $m_n = m_{n-1} + (v_n - m_{n-1}) / n$ for $n \ge 2$, starting from $m_1 = v_1$
# (the first batch's value: there is no $m_0$, `low` and `high` are `None`). `xp.percentile(array, p)` takes $p$ in
# percent. Read a 0-d array out with `float(...)`.

# %% export="quantization"
class Observer:
    """Records the range of the values it is shown, batch after batch: the calibration of static quantization.

    ``method="minmax"``: ``low`` and ``high`` are the smallest and largest value of every batch seen.
    ``method="percentile"``: per batch, the ``100 - percentile``-th and ``percentile``-th percentiles of
    its values, averaged over the batches (after ``n`` batches ``m_n = m_{n-1} + (v_n - m_{n-1}) / n``).
    ``low`` and ``high`` are Python floats (``None`` before the first batch, which sets them to its own
    range); ``batches`` counts them.
    """

    METHODS = ("minmax", "percentile")

    def __init__(self, method: str = "minmax", percentile: float = 99.99) -> None:
        if method not in self.METHODS:
            raise ValueError(f"Observer: method must be one of {', '.join(self.METHODS)}, got method={method!r}")
        self.method = method
        self.percentile = check_number("percentile", percentile, minimum=50, maximum=100)
        self.low: float | None = None
        self.high: float | None = None
        self.batches = 0

    def observe(self, x: Tensor) -> None:
        """Take the range of the batch ``x`` into ``low`` and ``high``: the first batch sets them, later ones
        widen them (min/max) or move their running mean (percentile). ``x`` is a non-empty tensor
        (``ValueError`` if empty); its dtype is not checked: a layer's inputs are floating-point, and an
        integer batch would be observed by its values all the same."""
        check_type("x", x, Tensor, "a Tensor")
        if x.size == 0:
            raise ValueError(f"Observer.observe: the batch is empty (shape {x.shape})")
        ### BEGIN SOLUTION
        xp = x._backend.xp
        if self.method == "minmax":
            low, high = float(x.data.min()), float(x.data.max())
            if self.batches:
                low, high = min(low, self.low), max(high, self.high)
        else:
            low = float(xp.percentile(x.data, 100 - self.percentile))
            high = float(xp.percentile(x.data, self.percentile))
            if self.batches:
                low = self.low + (low - self.low) / (self.batches + 1)
                high = self.high + (high - self.high) / (self.batches + 1)
        self.low, self.high, self.batches = low, high, self.batches + 1
        ### END SOLUTION

    def qparams(self, bits: int = 8, device: Any = None) -> tuple[Tensor, Tensor]:
        """The affine ``(scale, zero_point)`` of the range observed (``choose_qparams``), 0-d tensors on ``device``
        (default: the CPU); ``RuntimeError`` before any batch."""
        if self.batches == 0:
            raise RuntimeError("Observer: no batch observed yet; run the model on calibration batches first")
        low, high = Tensor(self.low, device=device), Tensor(self.high, device=device)
        # NumPy gives a 0-d result as a scalar; a layer keeps these as buffers, which load_state_dict fills in place
        return tuple(Tensor._make(t._backend.xp.asarray(t.data), t._backend) for t in choose_qparams(low, high, bits))

    def __repr__(self) -> str:
        return f"Observer(method={self.method!r}, low={self.low}, high={self.high}, batches={self.batches})"


# %% check=2
rng = np.random.default_rng(0)
batches = [rng.standard_normal(10_000).astype(np.float32) for _ in range(3)]
batches[1][7] = 50.0
minmax, percentile = Observer(), Observer("percentile", 99.9)
for batch in batches:
    minmax.observe(tt.tensor(batch))
    percentile.observe(tt.tensor(batch))
assert minmax.batches == 3 and minmax.high == 50.0, minmax
assert np.isclose(minmax.low, min(b.min() for b in batches)), "low: the smallest value of every batch"
want = np.mean([np.percentile(b, 99.9) for b in batches]), np.mean([np.percentile(b, 0.1) for b in batches])
assert np.allclose([percentile.high, percentile.low], want, rtol=1e-5), (percentile, want)
scale, zero_point = percentile.qparams()
print(f"min/max {minmax}: step {minmax.qparams()[0].item():.4f}\n"
      f"99.9th percentile {percentile}: step {scale.item():.4f}")

# %% [markdown]
# ## 5. The integer matrix product
#
# Put the two together. The input of a layer, per tensor and affine, is $x_j
# \approx s_x (q_{x,j} - z_x)$; its weight, per channel and symmetric, $W_{ij}
# \approx s_i q_{ij}$. Then
#
# $$y_i = \sum_j W_{ij} x_j \approx s_i s_x \sum_j q_{ij} (q_{x,j} - z_x)
#       = s_i s_x \Big( \underbrace{\sum_j q_{ij}\, q_{x,j}}_{\text{int8} \times \text{int8, summed in int32}}
#         - z_x \underbrace{\sum_j q_{ij}}_{\text{a constant of row } i} \Big).$$
#
# The first sum is what int8 hardware does: a GPU's tensor cores and a CPU's
# VNNI instructions multiply int8 pairs and add them into int32 accumulators.
# The second is the **zero-point correction** (Jacob et al., eq. 7), computed
# once per row. Why not subtract $z_x$ first? $q_x - z_x$ lies in $[-255, 255]$:
# no longer an int8. Then one float multiplication per output, by $s_i s_x$,
# turns the int32 sums back into real numbers (the *rescale*).
#
# Why int32 accumulators: a product of two int8 is at most $128 \cdot 128 =
# 2^{14}$ in magnitude, and a sum of $K$ of them needs $14 + \log_2 K$ bits —
# 21 bits at $K = 128$, far more than int16, well within int32 (which holds any
# $K$ up to $2^{17}$).
#
# **In NumPy.** There is no int8 BLAS. Two honest ways:
#
# * an **int32 matmul**, `a.astype(np.int32) @ b.astype(np.int32).T`: exact, but
#   NumPy multiplies integer matrices with its own loops, without BLAS;
# * the codes as **float32** in a float32 GEMM. float32 has a 24-bit
#   significand: every integer of magnitude up to $2^{24} = 16{,}777{,}216$ is
#   exactly representable, and so every product and sum of integers whose
#   result stays within $2^{24}$ is computed **exactly** — no rounding happens.
#   A product of codes is at most $2^{14}$, so a sum of at most $2^{10} = 1024$
#   products has every partial sum within $1024 \cdot 2^{14} = 2^{24}$: exact
#   **in whatever order BLAS adds the terms** (blocked, fused multiply-adds,
#   vector lanes). For longer rows, cut $K$ into chunks of at most
#   `EXACT_TERMS = 1024` columns, multiply each chunk in float32, convert each
#   chunk's result to int32 (exact: it is an integer) and add the chunks in
#   int32. The GPT of this course has $K = 128$ and $512$: one GEMM.
#
# Section 9 measures both against the float32 layer. Write `int8_matmul(a, b)`:
# `a @ b.T` for int8 `a` $(M, K)$ and `b` $(N, K)$, an exact int32 $(M, N)$.

# %% export="quantization"
# A product of two int8 codes is at most 2**14 in magnitude (-128 * -128): every partial sum of
# EXACT_TERMS of them stays within 2**24, below which float32 holds every integer exactly.
EXACT_TERMS = 2 ** 24 // 2 ** 14


def int8_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` of int8 matrices ``a`` ``(M, K)`` and ``b`` ``(N, K)``, exactly: an int32 ``(M, N)`` tensor.

    NumPy has no int8 GEMM. The columns are taken in chunks of at most ``EXACT_TERMS``: each chunk's
    product is one float32 GEMM of the codes (exact, since every partial sum is an integer within
    2**24), converted to int32 and added up in int32 — the accumulation int8 hardware does.
    """
    for name, matrix in (("a", a), ("b", b)):
        check_type(name, matrix, Tensor, "a Tensor")
        if matrix.ndim != 2 or matrix.dtype != np.int8:
            raise TypeError(f"int8_matmul: {name} must be a 2-D int8 tensor, got {matrix.dtype} of shape {matrix.shape}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"int8_matmul computes a @ b.T: a is {a.shape} and b is {b.shape}, whose rows differ in length")
    if a._backend is not b._backend:
        raise RuntimeError(f"int8_matmul: a is on {a.device}, b on {b.device}")
    ### BEGIN SOLUTION
    xp = a._backend.xp
    out = xp.zeros((a.shape[0], b.shape[0]), dtype=xp.int32)
    for start in range(0, a.shape[1], EXACT_TERMS):
        chunk = slice(start, start + EXACT_TERMS)
        out += (a.data[:, chunk].astype(xp.float32) @ b.data[:, chunk].astype(xp.float32).T).astype(xp.int32)
    return Tensor._make(out, a._backend)
    ### END SOLUTION


# %% check=2
rng = np.random.default_rng(0)
a, b = rng.integers(-128, 128, (5, 300)).astype(np.int8), rng.integers(-128, 128, (7, 300)).astype(np.int8)
product = int8_matmul(tt.tensor(a, dtype="int8"), tt.tensor(b, dtype="int8"))
assert product.dtype == np.int32 and product.shape == (5, 7), product
assert np.array_equal(product.numpy(), a.astype(np.int64) @ b.astype(np.int64).T), "exact"
long_a = np.full((1, 4096), 127, np.int8)
long_b = np.full((1, 4096), 127, np.int8)
long_b[0, 0] = 126  # 127 * (127 * 4095 + 126) = 66,064,257: odd and above 2**24, beyond float32
want = 127 * (127 * 4095 + 126)
assert int((long_a.astype(np.float32) @ long_b.astype(np.float32).T)[0, 0]) != want, "one float32 GEMM rounds"
got = int8_matmul(tt.tensor(long_a, dtype="int8"), tt.tensor(long_b, dtype="int8")).item()
assert got == want, f"K = 4096: take the columns in chunks of EXACT_TERMS = 1024; expected {want}, got {got}"
print("int8_matmul OK")

# %% [markdown]
# Now the forward of a quantized layer, on a batch of rows `x` $(M, K)$:
#
# 1. the input's scale and zero point: the calibrated ones (static), or —
#    when `input_scale` is None — this batch's own, `choose_qparams(x.min(),
#    x.max())` (dynamic, affine, 8 bits);
# 2. `q_x = quantize(x, input_scale, input_zero_point)`, int8 in $[-128, 127]$;
# 3. the int32 sums: `int8_matmul(q_x, weight_codes)`, minus the input's zero
#    point times each row's sum of weight codes. Sum them in int32:
#    `weight_codes.data.sum(axis=1, dtype=xp.int32)` — a plain `.sum()` of
#    int8 (or int32) values gives int64 on Linux, NumPy's default for integer
#    sums, and the result would leave int32;
# 4. the rescale: times `input_scale * weight_scale` (one factor per output
#    column), in `x`'s dtype.
#
# The result equals `dequantize(q_x, ...) @ dequantize(weight_codes, ...).T`
# up to float rounding — the integer path computes exactly what the codes
# stand for.

# %% export="quantization"
def int8_linear(x: Tensor, weight_codes: Tensor, weight_scale: Tensor, input_scale: Any = None,
                input_zero_point: Any = None) -> Tensor:
    """The integer forward of a quantized Linear layer (no bias): ``x`` ``(M, K)`` floats -> ``(M, N)`` in
    ``x``'s dtype, about ``x @ W.T`` for ``W = weight_scale[:, None] * weight_codes``.

    The input's ``(input_scale, input_zero_point)`` are given (static), or, both None, this batch's
    ``choose_qparams(min of x, max of x)`` (dynamic). Then ``q_x = quantize(x, input_scale,
    input_zero_point)`` (int8), the int32 sums ``int8_matmul(q_x, weight_codes) - input_zero_point *
    (row sums of weight_codes)``, the row sums taken with ``dtype=int32`` (NumPy sums integers in int64
    otherwise), and the rescale by ``input_scale * weight_scale``.
    """
    check_type("x", x, Tensor, "a Tensor")
    check_floating_input("int8_linear", x)
    if x.ndim != 2 or weight_codes.ndim != 2 or x.shape[1] != weight_codes.shape[1]:
        raise ValueError(f"int8_linear: expected x of shape (M, {weight_codes.shape[-1]}) for weight codes of shape "
                         f"{weight_codes.shape}, got x of shape {x.shape}")
    if (input_scale is None) != (input_zero_point is None):
        raise ValueError("int8_linear: give both input_scale and input_zero_point (static) or neither (dynamic)")
    if input_scale is not None:  # static: as tensors on x's device
        input_scale, input_zero_point = qparams_like(x, input_scale, input_zero_point)
    ### BEGIN SOLUTION
    xp = x._backend.xp
    if input_scale is None:
        input_scale, input_zero_point = choose_qparams(x.min(), x.max())
    codes = quantize(x, input_scale, input_zero_point)
    row_sums = weight_codes.data.sum(axis=1, dtype=xp.int32)
    sums = int8_matmul(codes, weight_codes).data - input_zero_point.data * row_sums
    return Tensor._make(sums.astype(x.dtype) * (input_scale.data * weight_scale.data).astype(x.dtype), x._backend)
    ### END SOLUTION


# %% check=3
rng = np.random.default_rng(1)
weight = tt.tensor(rng.standard_normal((6, 20)) * 0.3)
codes, scale = quantize_per_channel(weight)
x = tt.tensor(rng.standard_normal((4, 20)) + 1.0)
s_x, z_x = choose_qparams(x.numpy().min(), x.numpy().max())
assert z_x.item() != 0, "an input with a zero point of its own, so that the correction shows"
stands_for = dequantize(quantize(x, s_x, z_x), s_x, z_x).numpy() @ dequantize(codes, scale.reshape(-1, 1)).numpy().T
dynamic = int8_linear(x, codes, scale)
assert dynamic.dtype == np.float32 and dynamic.shape == (4, 6), dynamic
assert np.allclose(dynamic.numpy(), stands_for, rtol=1e-5, atol=1e-5), "subtract input_zero_point * row sums"
assert np.allclose(dynamic.numpy(), x.numpy() @ weight.numpy().T, atol=0.05), "close to the float layer"
static = int8_linear(x, codes, scale, s_x * 0.5, 0)  # a narrower calibrated range: large inputs clip
clipped = np.clip(np.round(x.numpy() / (s_x.item() * 0.5)), -128, 127) * s_x.item() * 0.5
assert np.allclose(static.numpy(), clipped @ dequantize(codes, scale.reshape(-1, 1)).numpy().T, rtol=1e-5, atol=1e-5), \
    "static: quantize with the given input_scale and input_zero_point (inputs beyond their range clip)"
print("int8_linear OK")

# %% [markdown]
# ## 6. The quantized layer and the quantized model
#
# The rest is given: it wraps your functions into a layer and a model.
#
# `QuantizedLinear.from_linear(linear, observer=None)` keeps `weight_codes`
# (int8, per channel: your `quantize_per_channel`), `weight_scale` (float32 per
# row) and the float `bias`; with an observer that has seen calibration batches,
# also the input's `input_scale` and `input_zero_point` (static); without one,
# each forward measures its batch (dynamic). Its forward flattens the leading
# axes, runs your `int8_linear` and adds the bias.
#
# **A quantized layer is frozen.** Its codes are a `Parameter` that does not
# require grad — as `bitsandbytes` keeps its 8- and 4-bit weights — so an
# optimizer built over `model.parameters()` refuses them (Module 07's check
# "does not require grad, so it can never be updated"). Yet the layer is
# differentiable with respect to its **input**: backward gives `x` the gradient
# of `x @ Ŵ.T`, with `Ŵ` the dequantized weight computed again in backward (the
# float weight is never kept between the passes), and zero where a static range
# clipped the input — the straight-through rule of section 7. Module 20 relies on
# this: it trains small adapters *on top of* a frozen quantized model, and their
# gradients must flow through it. A quantized tensor that requires grad anyway
# (`layer.weight_codes.requires_grad = True`) makes backward raise instead of
# quietly giving it nothing.
#
# `quantize_model(model, dtype="int8" | "nf4", calibration=None)` replaces the
# model's `Linear` layers, in place, and returns the model. It leaves alone what
# is not a `Linear` (embeddings, LayerNorms) and a Linear whose weight another
# module shares: GPT's `lm_head` *is* `wte`'s table (Module 15), and quantizing it
# would leave the embedding its float copy — more bytes, not fewer. Name the
# layers to quantize with `layers=[...]` to choose yourself. `calibration`, an
# iterable of input batches (each run as `model(batch)`, in evaluation mode,
# without gradients), makes int8 static: an observer (`observer=Observer` by
# default; e.g. `lambda: Observer("percentile", 99.9)`) sits at each layer's input
# during calibration. `model_bytes(model)` counts every byte the model holds: its
# parameters (the codes too) and buffers (scales, zero points), each tensor once.
#
# A quantized model saves like any other: `state_dict()` holds int8 arrays and
# float32 scales, plain data for Module 10's checkpoints. To load one, quantize a
# model of the same architecture the same way (any weights; static: any
# calibration batch), then `load_state_dict`.

# %% export="quantization"
class FrozenQuantizedLinear(Function):
    """``x @ Ŵ.T`` through a frozen quantized layer: the gradient reaches the input only.

    ``apply(x, *frozen, layer=layer)``: ``x`` is ``(M, K)``, ``frozen`` the layer's quantized tensors
    (``layer.frozen()``, in that order), so that backward sees whether one requires grad. Forward runs
    ``layer.quantized_forward(x)``. Backward: ``grad @ Ŵ``, ``Ŵ = layer.dequantized_weight()`` computed
    again (the float weight is never kept between the passes), times ``layer.input_gradient_mask(x)``
    where there is one (a static input range: 0 where the input was clipped). A quantized tensor that
    requires grad raises ``RuntimeError`` naming it: quantized weights are frozen.
    """

    def forward(self, x: Any, *frozen: Any, layer: "FrozenQuantizedLayer") -> Any:
        self.layer = layer
        self.mask = layer.input_gradient_mask(x)
        return layer.quantized_forward(Tensor._make(x, self.backend)).data

    def backward(self, grad: Any) -> tuple:
        for (name, _), tensor in zip(self.layer.frozen(), self.inputs[1:]):
            if tensor.requires_grad:
                raise RuntimeError(
                    f"{type(self.layer).__name__}.{name} requires grad, but a quantized layer is frozen: its codes and "
                    "scales get no gradient. Train the float model with fake quantization (prepare_qat, then "
                    "convert_qat), or train adapters on top of the frozen layer")
        grad_x = grad @ self.layer.dequantized_weight().data.astype(grad.dtype)
        if self.mask is not None:
            grad_x *= self.mask
        return (grad_x,) + (None,) * (len(self.inputs) - 1)


class FrozenQuantizedLayer(Module):
    """What a frozen quantized Linear layer shares: checking its input, flattening the leading axes,
    ``FrozenQuantizedLinear``, the float ``bias``. A subclass keeps ``in_features``, ``out_features`` and
    ``bias``, and defines ``frozen``, ``quantized_forward``, ``dequantized_weight`` and ``input_gradient_mask``."""

    def frozen(self) -> list[tuple[str, Tensor]]:
        """The quantized tensors, by name: they get no gradient."""
        raise NotImplementedError(f"{type(self).__name__} must define frozen()")

    def quantized_forward(self, x: Tensor) -> Tensor:
        """``x`` ``(M, in)`` -> ``(M, out)``, without the bias and without recording a graph."""
        raise NotImplementedError(f"{type(self).__name__} must define quantized_forward()")

    def dequantized_weight(self) -> Tensor:
        """The float ``(out, in)`` weight the codes stand for."""
        raise NotImplementedError(f"{type(self).__name__} must define dequantized_weight()")

    def input_gradient_mask(self, x: Any) -> Any:
        """Where the input's gradient passes (a boolean array of ``x``'s shape), or None for everywhere."""
        return None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__}: expected input of shape (..., {self.in_features}), got {x.shape}")
        check_floating_input(type(self).__name__, x)
        rows = x.reshape(-1, self.in_features)
        y = FrozenQuantizedLinear.apply(rows, *(tensor for _, tensor in self.frozen()), layer=self)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class QuantizedLinear(FrozenQuantizedLayer):
    """A frozen Linear layer with int8 weights: ``y ≈ x @ W.T + bias``.

    ``weight_codes``: int8 ``(out, in)``, symmetric per output channel, a Parameter that does not
    require grad; ``weight_scale``: float32 ``(out,)`` (a buffer); ``bias``: the float bias (or None).
    The input is quantized per tensor, affine, to int8: with ``static``, by the calibrated
    ``input_scale`` and ``input_zero_point`` (0-d buffers); otherwise by each batch's own range.
    Forward runs ``int8_linear`` through ``FrozenQuantizedLinear`` (the gradient reaches the input).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, static: bool = False) -> None:
        super().__init__()
        self.in_features = check_int("in_features", in_features, minimum=1)
        self.out_features = check_int("out_features", out_features, minimum=1)
        self.static = bool(static)
        self.weight_codes = Parameter(np.zeros((out_features, in_features), np.int8), requires_grad=False, dtype="int8")
        self.register_buffer("weight_scale", Tensor(np.ones(out_features, np.float32)))
        self.bias = Parameter(np.zeros(out_features, np.float32)) if bias else None
        if self.static:
            self.register_buffer("input_scale", Tensor(np.float32(1.0)))
            self.register_buffer("input_zero_point", Tensor(np.int32(0), dtype="int32"))

    @classmethod
    def from_linear(cls, linear: Any, observer: Observer | None = None, weight_bits: int = 8) -> "QuantizedLinear":
        """The quantized copy of ``linear`` (a Linear, or anything with its ``weight`` and ``bias``): its
        weight through ``quantize_per_channel(weight, weight_bits)`` (fewer bits: the same int8 storage, fewer
        codes used); static with the range ``observer`` saw, else dynamic."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, static=observer is not None)
        with no_grad():
            codes, scale = quantize_per_channel(linear.weight, weight_bits)
            layer.weight_codes = Parameter(codes, requires_grad=False)
            layer.weight_scale = scale
            if linear.bias is not None:
                layer.bias = Parameter(linear.bias)
            if observer is not None:
                layer.input_scale, layer.input_zero_point = observer.qparams()
        return layer.to(linear.weight.device)

    def frozen(self) -> list[tuple[str, Tensor]]:
        names = ["weight_codes", "weight_scale"] + (["input_scale", "input_zero_point"] if self.static else [])
        return [(name, getattr(self, name)) for name in names]

    def quantized_forward(self, x: Tensor) -> Tensor:
        if self.static:
            return int8_linear(x, self.weight_codes, self.weight_scale, self.input_scale, self.input_zero_point)
        return int8_linear(x, self.weight_codes, self.weight_scale)

    def dequantized_weight(self) -> Tensor:
        return dequantize(self.weight_codes, self.weight_scale.reshape(-1, 1))

    def input_gradient_mask(self, x: Any) -> Any:
        """A static range clips the input where its code falls outside int8: there the output does not follow it."""
        if not self.static:
            return None
        xp = self.weight_codes._backend.xp
        codes = xp.round(x / self.input_scale.data.astype(x.dtype)) + self.input_zero_point.data
        return (codes >= -128) & (codes <= 127)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activations={'static' if self.static else 'dynamic'}")


class ObservedLinear(Module):
    """A Linear layer with an ``Observer`` at its input, for calibration: ``forward`` shows the observer
    the input, then runs the layer."""

    def __init__(self, layer: Linear, observer: Observer) -> None:
        super().__init__()
        self.layer, self.observer = layer, observer

    def forward(self, x: Tensor) -> Tensor:
        self.observer.observe(x)
        return self.layer(x)


def replace_module(model: Module, old: Module, new: Module) -> None:
    """Put ``new`` wherever ``model``'s tree holds ``old`` (every parent that holds it, under the same name)."""
    for parent in model.modules():
        for name, child in list(parent._modules.items()):
            if child is old:
                setattr(parent, name, new)


def linear_layers(model: Module, layers: Iterable[str] | None = None, kind: type = Linear) -> list[tuple[str, Module]]:
    """``(name, layer)`` of the ``kind`` layers to replace: those named in ``layers``, or by default every one
    whose weight no other module holds (GPT's ``lm_head`` shares ``wte``'s). An unknown name raises
    ``KeyError``, a named layer of another kind ``TypeError``, both naming it."""
    check_type("model", model, Module, "a tinytrain Module")
    named = dict(model.named_modules())
    if layers is not None:
        layers = [layers] if isinstance(layers, str) else list(layers)
        unknown = [name for name in layers if name not in named]
        if unknown:
            raise KeyError(f"no module named {', '.join(map(repr, unknown))} in the model")
        wrong = [f"{name} ({type(named[name]).__name__})" for name in layers if not isinstance(named[name], kind)]
        if wrong:
            raise TypeError(f"only {kind.__name__} layers are replaced, got {', '.join(wrong)}")
        return [(name, named[name]) for name in layers]
    holders = Counter(id(p) for module in named.values() for p in module._parameters.values() if p is not None)
    return [(name, module) for name, module in named.items()
            if isinstance(module, kind) and holders[id(module.weight)] == 1]


def quantize_model(model: Module, dtype: str = "int8", calibration: Iterable[Any] | None = None,
                   layers: Iterable[str] | None = None, observer: Callable[[], Observer] = Observer) -> Module:
    """Replace ``model``'s Linear layers by quantized ones, in place; returns ``model``.

    ``dtype="int8"``: ``QuantizedLinear`` — dynamic activations, or static when ``calibration`` (an
    iterable of input batches, each run as ``model(batch)`` in evaluation mode without gradients)
    is given: an ``observer()`` records each layer's input range. ``dtype="nf4"``: ``NF4Linear``
    (weights only: no calibration). ``layers``: the dotted names of the Linear layers to replace;
    by default every Linear whose weight no other module holds (a tied output layer stays float).
    The model's training mode is restored after calibration, and on any error the model keeps
    its Linear layers.
    """
    if dtype not in ("int8", "nf4"):
        raise ValueError(f"quantize_model: dtype must be 'int8' or 'nf4', got dtype={dtype!r}")
    if dtype == "nf4" and calibration is not None:
        raise ValueError("quantize_model: NF4 quantizes weights only (activations stay float); calibration is for int8")
    check_callable("observer", observer, "a function that returns a new Observer (the class itself, or a lambda)")
    targets = linear_layers(model, layers)
    if not targets:
        raise ValueError(f"quantize_model: {type(model).__name__} has no Linear layer to quantize (shared "
                         "weights are left alone unless named in layers=)")
    observers = None if calibration is None else calibrate(model, [layer for _, layer in targets], calibration,
                                                           observer)
    for index, (_, layer) in enumerate(targets):
        if dtype == "nf4":
            replacement = NF4Linear.from_linear(layer)
        else:
            replacement = QuantizedLinear.from_linear(layer, None if observers is None else observers[index])
        replace_module(model, layer, replacement)
    return model


def calibrate(model: Module, layers: list[Linear], calibration: Iterable[Any],
              observer: Callable[[], Observer]) -> list[Observer]:
    """Run ``model`` on the ``calibration`` batches with an ``observer()`` at the input of each of ``layers``;
    the observers, in that order. The model ends as it was (its layers and its training mode)."""
    wrappers = [ObservedLinear(layer, observer()) for layer in layers]
    was_training = model.training
    for wrapper in wrappers:
        replace_module(model, wrapper.layer, wrapper)
    try:
        model.eval()
        with no_grad():
            batches = sum(1 for batch in calibration if model(batch) is not None)
    finally:
        for wrapper in wrappers:
            replace_module(model, wrapper, wrapper.layer)
        model.train(was_training)
    if batches == 0:
        raise ValueError("quantize_model: calibration gave no batch; pass an iterable of the model's input batches")
    unseen = [type(wrapper.layer).__name__ for wrapper in wrappers if wrapper.observer.batches == 0]
    if unseen:
        raise ValueError(f"quantize_model: {len(unseen)} layer(s) saw no input during calibration (the model does "
                         "not call them)")
    return [wrapper.observer for wrapper in wrappers]


def model_bytes(model: Module) -> int:
    """The bytes ``model`` holds: every parameter (quantized codes too) and buffer (scales, zero points), each
    tensor once (a shared weight counts once)."""
    check_type("model", model, Module, "a tinytrain Module")
    return sum(int(tensor.data.nbytes) for tensor in model.parameters() + model.buffers())


# %% check=2
def small_mlp(state: dict | None = None) -> tt.nn.Sequential:
    model = tt.nn.Sequential(tt.nn.Linear(64, 128), tt.nn.ReLU(), tt.nn.Linear(128, 10))
    if state is not None:
        model.load_state_dict(state)
    return model


tt.manual_seed(0)
float_model = small_mlp()
x = tt.randn(32, 64, requires_grad=True)
want = float_model(x).numpy()
dynamic = quantize_model(small_mlp(float_model.state_dict()))
static = quantize_model(small_mlp(float_model.state_dict()), calibration=[tt.randn(32, 64) for _ in range(4)])
assert isinstance(dynamic[0], QuantizedLinear) and not dynamic[0].static and static[2].static, static
for model in (dynamic, static):
    error = np.abs(model(x).numpy() - want).max() / np.abs(want).max()
    assert error < 0.03, f"{model}: the quantized outputs are off by {error:.1%} of the largest"
float_bytes, int8_bytes = model_bytes(float_model), model_bytes(dynamic)
assert int8_bytes < 0.3 * float_bytes, (float_bytes, int8_bytes)
dynamic(x).sum().backward()
assert x.grad is not None and dynamic[0].weight_codes.grad is None, "the gradient reaches the input, not the codes"
try:
    tt.optim.SGD(dynamic.parameters(), lr=0.1)
    raise AssertionError("an optimizer must refuse the frozen codes")
except ValueError as error:
    print("an optimizer over the quantized model:", error)
again = quantize_model(small_mlp())
again.load_state_dict(dynamic.state_dict())
assert np.array_equal(again(x).numpy(), dynamic(x).numpy()), "a state_dict round trip"
print(f"quantized model OK: {float_bytes:,} bytes in float32, {int8_bytes:,} in int8 "
      f"({int8_bytes / float_bytes:.0%})")

# %% [markdown]
# ## 7. Training through the rounding: fake quantization
#
# Post-training quantization (PTQ, all of the above) rounds a model that was
# trained without knowing it would be rounded. **Quantization-aware training**
# (QAT) lets training see the rounding: the forward pass uses
#
# $$\operatorname{fq}(x) = s\,\big(\operatorname{clamp}(\operatorname{round}(x/s) + z,\ q_{\min},\ q_{\max}) - z\big),$$
#
# floats that are exactly the values the int8 model will hold. This is **fake
# quantization**: quantize and dequantize in one step, on the weights and on
# each layer's input, so the loss is the quantized model's loss.
#
# Its gradient is the problem. `round` is a staircase: its derivative is 0
# everywhere except at the steps, where it does not exist. The true gradient
# would stop all learning. The **straight-through estimator** (Bengio, Léonard
# and Courville, 2013; used for QAT by Jacob et al.) treats `round` as the
# identity in the backward pass, and keeps the clamp:
#
# $$\frac{\partial L}{\partial x} = \frac{\partial L}{\partial \operatorname{fq}(x)} \cdot
#   \mathbb 1\big[q_{\min} \le \operatorname{round}(x/s) + z \le q_{\max}\big].$$
#
# The gradient **passes unchanged where the code was inside the range** and is
# **0 where the clamp cut it** — there the output truly does not move with $x$.
# The test is on the *rounded* code, before clamping, exactly as PyTorch's
# `torch.fake_quantize_per_tensor_affine` does it: with $s = 0.5$ and $q_{\max} =
# 2$, $x = 1.24$ (code $\operatorname{round}(2.48) = 2$) passes its gradient and
# $x = 1.26$ (code 3, clamped to 2) does not.
#
# `FakeQuantize` is a `Function` (Module 02) on arrays: its forward gets `x` and,
# as parameters, `scale` and `zero_point` (arrays of `x`'s dtype that broadcast
# against it) and `qmin`, `qmax`; it returns $\operatorname{fq}(x)$ in `x`'s
# dtype and keeps what backward needs (a boolean array: inside the range or
# not). Backward returns one gradient, for `x`. Note what this backward is *not*:
# the derivative of the forward. `gradcheck` compares with central differences of
# the forward, which see the staircase: it would reject this backward by design.
# It agrees only where the forward is differentiable — outside the range, where
# both are 0 — and around fake quantization, for what is not rounded (a layer's
# bias).

# %% export="quantization"
class FakeQuantize(Function):
    """``x -> scale * (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point)``: the values the codes stand
    for, as floats, with the straight-through estimator as backward."""

    def forward(self, x: Any, *, scale: Any, zero_point: Any, qmin: int, qmax: int) -> Any:
        """The fake-quantized ``x`` in ``x``'s dtype (``scale`` and ``zero_point``: arrays of ``x``'s dtype that
        broadcast against it); keeps where the code ``round(x / scale) + zero_point`` lies in ``[qmin, qmax]``."""
        ### BEGIN SOLUTION
        xp = self.xp
        codes = xp.round(x / scale) + zero_point
        self.inside = (codes >= qmin) & (codes <= qmax)
        return (xp.clip(codes, qmin, qmax) - zero_point) * scale
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        """The straight-through estimator: ``grad`` unchanged where the code was inside ``[qmin, qmax]``, 0 where
        the clamp cut it; one gradient, for ``x``."""
        ### BEGIN SOLUTION
        return (grad * self.inside,)
        ### END SOLUTION


def fake_quantize(x: Tensor, scale: Any, zero_point: Any = 0, qmin: int = -128, qmax: int = 127) -> Tensor:
    """``FakeQuantize`` of ``x`` with ``scale`` (> 0) and ``zero_point`` (numbers or tensors that broadcast against
    ``x``) and codes in ``[qmin, qmax]``: differentiable by the straight-through estimator."""
    check_type("x", x, Tensor, "a Tensor")
    check_floating_input("fake_quantize", x)
    qmin, qmax = check_int("qmin", qmin), check_int("qmax", qmax)
    if not qmin < qmax:
        raise ValueError(f"fake_quantize: need qmin < qmax, got qmin={qmin}, qmax={qmax}")
    scale, zero_point = qparams_like(x, scale, zero_point)
    return FakeQuantize.apply(x, scale=scale.data, zero_point=zero_point.data.astype(x.dtype), qmin=qmin, qmax=qmax)


class QATLinear(Module):
    """A Linear layer that trains the way int8 will run it (quantization-aware training).

    Holds the float ``weight`` and ``bias`` of the Linear it replaces (the same Parameters: training
    moves them). Forward: ``linear(fake_quantize(x), fake_quantize(weight), bias)`` -- the weight per
    output channel, symmetric (the scales of the current weight), the input per tensor, affine, by
    the range ``observer`` has recorded; in training mode the observer first records ``x``. The weight's
    codes have ``weight_bits`` bits (``integer_range(weight_bits, symmetric=True)``).
    ``convert_qat`` turns it into a static ``QuantizedLinear`` with those codes.
    """

    def __init__(self, layer: Linear, observer: Observer | None = None, weight_bits: int = 8) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight, self.bias = layer.weight, layer.bias
        self.observer = Observer() if observer is None else check_type("observer", observer, Observer, "an Observer")
        self.weight_bits = weight_bits
        self.weight_range = integer_range(weight_bits, symmetric=True)

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            self.observer.observe(x)
        input_scale, input_zero_point = self.observer.qparams(device=x.device)
        with no_grad():
            amax = self.weight.abs().max(axis=1)
            weight_scale, _ = choose_qparams(-amax, amax, self.weight_bits, symmetric=True)
        weight = fake_quantize(self.weight, weight_scale.reshape(-1, 1), 0, *self.weight_range)
        return linear(fake_quantize(x, input_scale, input_zero_point), weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"weight_bits={self.weight_bits}")


def prepare_qat(model: Module, layers: Iterable[str] | None = None, observer: Callable[[], Observer] = Observer,
                weight_bits: int = 8) -> Module:
    """Replace ``model``'s Linear layers (``layers``, or those ``quantize_model`` would take) by ``QATLinear``
    layers with an ``observer()`` each and ``weight_bits``-bit weights, in place; returns ``model``. Their
    weights are the same Parameters, so an optimizer over ``model.parameters()`` trains them."""
    check_callable("observer", observer, "a function that returns a new Observer (the class itself, or a lambda)")
    targets = linear_layers(model, layers)
    if not targets:
        raise ValueError(f"prepare_qat: {type(model).__name__} has no Linear layer to prepare")
    for _, layer in targets:
        replace_module(model, layer, QATLinear(layer, observer(), weight_bits))
    return model


def convert_qat(model: Module) -> Module:
    """Replace every ``QATLinear`` of ``model`` by a static ``QuantizedLinear`` (its trained weight in codes of its
    ``weight_bits``, the input range its observer recorded), in place; returns ``model``."""
    layers = linear_layers(model, kind=QATLinear)
    if not layers:
        raise ValueError(f"convert_qat: {type(model).__name__} has no QATLinear layer; prepare_qat(model) first")
    unseen = [name for name, layer in layers if layer.observer.batches == 0]
    if unseen:
        raise RuntimeError(f"convert_qat: {', '.join(unseen)} never ran in training mode, so their input ranges are "
                           "unknown; train (or run the model in training mode on a few batches) first")
    for _, layer in layers:
        replace_module(model, layer, QuantizedLinear.from_linear(layer, layer.observer, layer.weight_bits))
    return model


# %% check=2
x = tt.tensor([-3.0, -1.02, -0.26, 0.0, 0.24, 0.76, 1.24, 1.26, 2.0], requires_grad=True)
y = fake_quantize(x, 0.5, 0, -2, 2)
assert np.allclose(y.numpy(), [-1, -1, -0.5, 0, 0, 1, 1, 1, 1]) and y.dtype == np.float32, y
y.backward(tt.arange(1.0, 10.0))
assert x.grad.numpy().tolist() == [0, 2, 3, 4, 5, 6, 7, 0, 0], \
    f"straight through inside the range, 0 where round(x / s) + z is outside [qmin, qmax]: got {x.grad}"
outside = tt.tensor([-9.0, 5.0, 7.5], dtype="float64", requires_grad=True)
assert tt.gradcheck(lambda v: fake_quantize(v, 0.5, 1, -3, 4), [outside]), "where it is differentiable"
tt.manual_seed(0)
model = prepare_qat(small_mlp(float_model.state_dict()))
optimizer = tt.optim.SGD(model.parameters(), lr=0.01)
inputs, targets = tt.randn(64, 64), tt.tensor(np.arange(64) % 10)
for _ in range(3):
    optimizer.zero_grad()
    loss = tt.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
assert isinstance(model[0], QATLinear) and model[0].weight.grad is not None, "QAT trains the float weights"
fake = model.eval()(inputs).numpy()
converted = convert_qat(model)
assert isinstance(converted[0], QuantizedLinear) and converted[0].static, converted
assert np.allclose(converted(inputs).numpy(), fake, atol=1e-4), "the int8 model computes what QAT trained"
print("FakeQuantize and QAT OK")

# %% [markdown]
# ## 8. Four bits: NF4
#
# With 256 levels, evenly spaced codes are fine. With 16, *where* the levels sit
# decides everything. Trained weights are roughly normally distributed: most
# near 0, few large. Sixteen evenly spaced levels spend most of themselves on
# the rare tails. **NF4** (4-bit NormalFloat, Dettmers et al. 2023) puts the
# levels at **quantiles of the normal distribution**, so that each level is used
# about equally often — for normal data, the best a 16-level code can do.
#
# QLoRA's table, exactly as it defines it (and `bitsandbytes` ships it): 0 must
# be a level (padding and pruned weights must stay 0), so the table is
# asymmetric — 8 positive levels at the quantiles of $\mathcal N(0, 1)$ for 9
# probabilities evenly spaced from $\tfrac12$ to $1 - \delta$ (the first, at
# $\tfrac12$, is the 0 itself), 7 negative ones mirrored from 8 probabilities
# from $\tfrac12$ to $1 - \delta$, and 0; then everything divided by the largest,
# so the levels run from $-1$ to $1$. $\delta = \tfrac12(\tfrac1{32} + \tfrac1{30})$
# keeps the outermost quantiles finite. Python's `statistics.NormalDist` gives the
# quantiles:

# %%
def normal_float_levels() -> list[float]:
    """The 16 NF4 levels from quantiles of N(0, 1), as QLoRA constructs them."""
    quantile = statistics.NormalDist().inv_cdf
    end = 1 - (1 / 32 + 1 / 30) / 2

    def evenly(count: int) -> list[float]:
        return [0.5 + (end - 0.5) * i / (count - 1) for i in range(1, count)]  # from 0.5 (left out) to `end`

    levels = sorted([quantile(p) for p in evenly(9)] + [0.0] + [-quantile(p) for p in evenly(8)])
    return [level / levels[-1] for level in levels]


print(np.round(normal_float_levels(), 4))

# %% [markdown]
# These agree with QLoRA's published table, `NF4_LEVELS` below, to $10^{-7}$
# (QLoRA computed the probabilities in float32). Denser near 0, sparser at the
# ends: $0.08$ apart around 0, $0.28$ between the last two.
#
# **Blocks of 64.** A weight is flattened (row-major) and cut into blocks of
# `NF4_BLOCK = 64` values; each block is divided by its **absmax** (largest
# magnitude), so its values lie in $[-1, 1]$, and each value becomes the index
# (0 to 15) of the **nearest level**. Small blocks keep an outlier from ruining
# more than 63 neighbours. A weight whose size is not a multiple of 64 gets its
# last block padded with zeros (`blocks(values, size)`, given), which change no
# absmax. An all-zero block is divided by 1 instead of 0 (its codes all point at
# the level 0), but its absmax is recorded as it is: 0.
#
# **Double quantization.** A float32 absmax per 64 weights costs $32/64 = 0.5$
# bits per weight — an eighth of the 4 bits. So QLoRA quantizes the absmax
# values too, to 8 bits: they are all positive, so first subtract their mean
# (centred, a symmetric code uses all of its range), then cut them into groups of
# `DOUBLE_QUANT_BLOCK = 256`, each quantized symmetrically to int8 in
# $[-127, 127]$ with its own float32 scale (your `choose_qparams` and `quantize`).
# Cost: $8/64 + 32/(64 \cdot 256) = 0.127$ bits per weight instead of 0.5, so
# NF4 holds a weight in **4.127 bits**. (QLoRA codes the absmax values with an
# 8-bit float; int8 takes the same bytes.)
#
# **Packing.** NumPy's smallest integer is a byte, so two 4-bit codes share one:
# the first in the high half, `byte = (first << 4) | second`; back with
# `byte >> 4` and `byte & 0x0F`.
#
# Write `double_quantize` first, then `nf4_quantize` (which returns an
# `NF4Weight`, given: the packed codes, the three tensors of the double-quantized
# absmax, and the shape) and `nf4_dequantize`. For the nearest level, compare
# every value with the 16 levels (`nf4_levels(backend)`, given: the table as a
# float32 array on the device) and take the `argmin` of the distances: a value
# exactly halfway between two levels takes the lower one, as `argmin` takes the
# first. Take the distances in the weight's own dtype, promoted with the
# levels' float32 (float64 for a float64 weight): no cast first. `argmin` gives
# int64 indices; cast them to uint8 before packing, so that the bytes are uint8.

# %% export="quantization"
# QLoRA's NF4 data type (Dettmers et al. 2023, appendix E; bitsandbytes' table): 16 levels at quantiles of N(0, 1).
NF4_LEVELS = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
NF4_BLOCK = 64  # values per absmax scale
DOUBLE_QUANT_BLOCK = 256  # absmax scales per float32 scale of theirs
_LEVELS_ON: dict[Any, Any] = {}  # backend -> NF4_LEVELS as a float32 array on its device


def nf4_levels(backend: Any) -> Any:
    """``NF4_LEVELS`` as a float32 array on ``backend``'s device (made once per device)."""
    if backend not in _LEVELS_ON:
        _LEVELS_ON[backend] = backend.from_host(np.array(NF4_LEVELS, np.float32))
    return _LEVELS_ON[backend]


def blocks(values: Tensor, size: int) -> Tensor:
    """``values``, flattened, as rows of ``size``: ``(ceil(n / size), size)``, the last row padded with zeros."""
    flat = values.data.reshape(-1)
    missing = -flat.size % size
    if missing:
        flat = values._backend.pad(flat, (0, missing))
    return Tensor._make(flat.reshape(-1, size), values._backend)


@dataclass(frozen=True)
class NF4Weight:
    """A weight in NF4. ``codes``: uint8, two 4-bit level indices per byte (the first in the high half), for
    the weight flattened and padded to whole blocks of ``NF4_BLOCK``; the absmax of each block,
    double-quantized: ``absmax ≈ absmax_scale[b // DOUBLE_QUANT_BLOCK] * absmax_codes[b] + absmax_mean``
    (int8 codes, float32 scales, a float32 0-d mean); ``shape``: the weight's shape."""

    codes: Tensor
    absmax_codes: Tensor
    absmax_scale: Tensor
    absmax_mean: Tensor
    shape: tuple[int, ...]


def double_quantize(absmax: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The block scales of NF4 in 8 bits (QLoRA's double quantization).

    The ``n`` values (taken as float32) lose their mean — a float32 mean of the float32 values
    (``absmax.mean()``), and that float32 number is the one returned — are cut into groups of ``DOUBLE_QUANT_BLOCK``
    (``blocks``: the last one padded with zeros), and each group is quantized symmetrically to int8
    codes in ``[-127, 127]`` with its own scale (``choose_qparams(-amax, amax, symmetric=True)``,
    ``quantize``). Returns ``(codes, scale, mean)``: int8 ``(n,)`` (the padding dropped), float32
    ``(groups,)`` and float32 0-d, so that ``absmax ≈ scale[i // DOUBLE_QUANT_BLOCK] * codes[i] + mean``.
    """
    check_type("absmax", absmax, Tensor, "a Tensor")
    if absmax.ndim != 1 or absmax.size == 0:
        raise ValueError(f"double_quantize expects a non-empty 1-D tensor of block scales, got shape {absmax.shape}")
    absmax = as_tensor(absmax, absmax, np.float32, "absmax")
    ### BEGIN SOLUTION
    mean = absmax.mean()
    groups = blocks(absmax - mean, DOUBLE_QUANT_BLOCK)
    amax = groups.abs().max(axis=1)
    scale, zero_point = choose_qparams(-amax, amax, symmetric=True)
    codes = quantize(groups, scale.reshape(-1, 1), zero_point.reshape(-1, 1), -127, 127)
    return codes.reshape(-1)[:absmax.shape[0]], scale, mean
    ### END SOLUTION


# %% check=2
absmax = tt.tensor([1.0, 3.0, 2.0] + [2.5] * 300)
codes, scale, mean = double_quantize(absmax)
assert codes.dtype == np.int8 and codes.shape == (303,) and scale.shape == (2,) and mean.shape == (), \
    (codes.shape, scale.shape, mean.shape)
assert np.isclose(mean.item(), absmax.numpy().mean()) and mean.dtype == np.float32, "the mean, float32"
centred = absmax.numpy() - mean.item()
assert np.allclose(scale.numpy(), [np.abs(centred[:256]).max() / 127, np.abs(centred[256:]).max() / 127]), \
    f"a scale per group of 256 centred values, its largest magnitude / 127; got {scale.numpy()}"
assert codes.numpy()[0] == -127, "the largest magnitude of a group maps to -127 or 127"
back = scale.numpy().repeat(256)[:303] * codes.numpy() + mean.item()
assert np.abs(back - absmax.numpy()).max() <= scale.numpy().max() / 2 * (1 + 1e-5), "within half a step"
print("double_quantize OK")

# %% export="quantization"
def nf4_quantize(weight: Tensor) -> NF4Weight:
    """NF4 codes of a floating-point ``weight`` of any shape (QLoRA's 4-bit NormalFloat).

    The weight, flattened, is cut into blocks of ``NF4_BLOCK`` values (``blocks``); each block is divided
    by its absmax (largest magnitude; an all-zero block by 1) and each value replaced by the index of the
    nearest of the 16 ``NF4_LEVELS`` (halfway: the lower); the indices are packed two per byte, the first
    in the high half (``(first << 4) | second``, uint8); the absmax values go through ``double_quantize``.

    The weight keeps its dtype (no cast): the distances to the float32 levels are taken in NumPy's
    promotion of the two (float64 for a float64 weight, float32 for float16 or float32). ``argmin`` gives
    int64 indices: cast them to uint8 before ``(first << 4) | second``. The absmax of an all-zero block
    goes to ``double_quantize`` as it is, 0 (the 1 is only the divisor).
    """
    check_type("weight", weight, Tensor, "a Tensor")
    check_floating_input("nf4_quantize", weight)
    if weight.size == 0:
        raise ValueError(f"nf4_quantize: the weight is empty (shape {weight.shape})")
    ### BEGIN SOLUTION
    xp = weight._backend.xp
    values = blocks(weight, NF4_BLOCK).data
    absmax = xp.abs(values).max(axis=1)
    normalized = values / xp.where(absmax == 0, 1, absmax)[:, None]
    codes = xp.abs(normalized[:, :, None] - nf4_levels(weight._backend)).argmin(axis=-1).astype(xp.uint8)
    packed = (codes[:, 0::2] << 4) | codes[:, 1::2]
    absmax_codes, absmax_scale, absmax_mean = double_quantize(Tensor._make(absmax, weight._backend))
    return NF4Weight(Tensor._make(packed.reshape(-1), weight._backend), absmax_codes, absmax_scale, absmax_mean,
                     weight.shape)
    ### END SOLUTION


# %% [markdown]
# A block worked by hand. Its largest magnitude is 2, so it is divided by 2:
# $2 \to 1$, the last level (index 15); $-1 \to -0.5$, nearest $-0.5251$
# (index 2); $0.5 \to 0.25$, nearest $0.2461$ (index 10); $0.1 \to 0.05$, nearer
# to $0.0796$ (index 8) than to 0; $0 \to 0$ (index 7). Packed: $15, 2 \to
# \texttt{0xF2} = 242$; $10, 8 \to \texttt{0xA8} = 168$; $7, 7 \to 119$. With a
# single block, double quantization is exact: the mean is the absmax itself, and
# the centred value 0 comes back as 0.

# %% check=2
block = tt.tensor([2.0, -1.0, 0.5, 0.1] + [0.0] * 60)
packed = nf4_quantize(block)
assert packed.codes.dtype == np.uint8 and packed.codes.shape == (32,), packed.codes
assert packed.codes.numpy()[:3].tolist() == [242, 168, 119], f"(first << 4) | second: got {packed.codes.numpy()[:3]}"
assert packed.absmax_codes.numpy().tolist() == [0] and np.isclose(packed.absmax_mean.item(), 2.0), packed
assert packed.shape == (64,), f"the weight's shape, got {packed.shape}"
weight = tt.tensor(np.random.default_rng(0).standard_normal((3, 50)))
packed = nf4_quantize(weight)
assert packed.codes.shape == (96,) and packed.absmax_codes.shape == (3,), "150 values: 3 blocks, the last padded"
print("nf4_quantize OK")

# %% [markdown]
# And back: unpack the two halves of each byte, look the indices up in the
# table, rebuild each block's absmax from its 8-bit code ($s_g \cdot q + m$),
# multiply, drop the padding, and restore the shape. The result is float32.
#
# `NF4Linear` (given) is the frozen layer: `weight_codes` (the packed bytes, a
# Parameter that does not require grad), the three absmax tensors as buffers, the
# float bias. Its input is **not** quantized: each forward dequantizes the
# weight and multiplies in floating point, in the input's dtype — QLoRA's
# *compute dtype* (bfloat16 on a GPU). NF4 saves memory, not arithmetic; and
# since the input is not rounded, the layer is exactly differentiable in it.

# %% export="quantization"
def nf4_dequantize(weight: NF4Weight) -> Tensor:
    """The float32 tensor of ``weight.shape`` that NF4 codes stand for: ``NF4_LEVELS[index] * absmax`` of the
    index's block, the absmax rebuilt from its double quantization (``absmax_scale`` of its group times
    ``absmax_codes``, plus ``absmax_mean``); the high half of each byte is the first index."""
    check_type("weight", weight, NF4Weight, "an NF4Weight (what nf4_quantize returns)")
    ### BEGIN SOLUTION
    xp = weight.codes._backend.xp
    count = weight.absmax_codes.shape[0]
    groups = blocks(weight.absmax_codes, DOUBLE_QUANT_BLOCK)
    absmax = dequantize(groups, weight.absmax_scale.reshape(-1, 1)).data.reshape(-1)[:count] + weight.absmax_mean.data
    packed = weight.codes.data.reshape(count, NF4_BLOCK // 2)
    indices = xp.stack([packed >> 4, packed & 0x0F], axis=-1).reshape(count, NF4_BLOCK)
    values = nf4_levels(weight.codes._backend)[indices] * absmax[:, None]
    return Tensor._make(values.reshape(-1)[:math.prod(weight.shape)].reshape(weight.shape), weight.codes._backend)
    ### END SOLUTION


class NF4Linear(FrozenQuantizedLayer):
    """A frozen Linear layer with a 4-bit NF4 weight: ``y ≈ x @ W.T + bias``, the input left in floating point.

    ``weight_codes``: the packed uint8 codes, a Parameter that does not require grad; ``absmax_codes``
    (int8), ``absmax_scale`` (float32) and ``absmax_mean`` (float32 0-d): the double-quantized block
    scales (buffers); ``bias``: the float bias (or None). Forward dequantizes the weight and multiplies
    in the input's dtype (QLoRA's compute dtype), through ``FrozenQuantizedLinear``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = check_int("in_features", in_features, minimum=1)
        self.out_features = check_int("out_features", out_features, minimum=1)
        count = -(-in_features * out_features // NF4_BLOCK)  # blocks of the flattened weight
        self.weight_codes = Parameter(np.zeros(count * NF4_BLOCK // 2, np.uint8), requires_grad=False, dtype="uint8")
        self.register_buffer("absmax_codes", Tensor(np.zeros(count, np.int8), dtype="int8"))
        self.register_buffer("absmax_scale", Tensor(np.ones(-(-count // DOUBLE_QUANT_BLOCK), np.float32)))
        self.register_buffer("absmax_mean", Tensor(np.float32(0.0)))
        self.bias = Parameter(np.zeros(out_features, np.float32)) if bias else None

    @classmethod
    def from_linear(cls, linear: Any) -> "NF4Linear":
        """The NF4 copy of ``linear`` (a Linear, or anything with its ``weight`` and ``bias``)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with no_grad():
            weight = nf4_quantize(linear.weight)
            layer.weight_codes = Parameter(weight.codes, requires_grad=False)
            layer.absmax_codes, layer.absmax_scale, layer.absmax_mean = (weight.absmax_codes, weight.absmax_scale,
                                                                         weight.absmax_mean)
            if linear.bias is not None:
                layer.bias = Parameter(linear.bias)
        return layer.to(linear.weight.device)

    def frozen(self) -> list[tuple[str, Tensor]]:
        return [(name, getattr(self, name)) for name in ("weight_codes", "absmax_codes", "absmax_scale", "absmax_mean")]

    def nf4_weight(self) -> NF4Weight:
        return NF4Weight(self.weight_codes, self.absmax_codes, self.absmax_scale, self.absmax_mean,
                         (self.out_features, self.in_features))

    def dequantized_weight(self) -> Tensor:
        return nf4_dequantize(self.nf4_weight())

    def quantized_forward(self, x: Tensor) -> Tensor:
        weight = self.dequantized_weight()
        return linear(x, Tensor._make(weight.data.astype(x.dtype), weight._backend))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# %% check=2
values = nf4_dequantize(nf4_quantize(block)).numpy()
assert values.dtype == np.float32 and values.shape == (64,), values
assert np.allclose(values[:5], [2.0, -1.0501461, 0.4922246, 0.1591606, 0.0]), values[:5]
weight = tt.tensor(np.random.default_rng(1).standard_normal((40, 96)) * 0.05)
back = nf4_dequantize(nf4_quantize(weight)).numpy()
assert back.shape == (40, 96), f"nf4_dequantize gives the weight's shape (40, 96), got {back.shape}"
flat, restored = weight.numpy().reshape(-1, 64), back.reshape(-1, 64)
widest_gap = np.diff(NF4_LEVELS).max() / 2 * np.abs(flat).max(axis=1, keepdims=True)
assert (np.abs(restored - flat) <= widest_gap * 1.01).all(), "each value within half the widest gap of its block"
layer = NF4Linear.from_linear(tt.nn.Linear(96, 40))
x = tt.randn(3, 96, dtype="float64", requires_grad=True)
assert tt.gradcheck(lambda x: layer(x), [x]), "the NF4 layer is differentiable in its input"
print(f"nf4 OK: relative error {np.abs(back - weight.numpy()).mean() / np.abs(weight.numpy()).mean():.3f}, "
      f"{model_bytes(layer) * 8 / weight.size:.3f} bits per weight with the float32 bias")

# %% [markdown]
# ## 9. Systems
#
# ### The integer product on this CPU
#
# Time the layers at the size of the GPT milestone's MLP (a batch of $12 \times
# 64 = 768$ positions, 128 channels in, 512 out): the float32 `Linear`, the int8
# layer (dynamic), its `int8_matmul` alone, the int32 matmul it avoids, and the
# NF4 layer. Each time is the best of a few runs, the candidates taken in turns
# in a shuffled order, so that a busy machine slows them alike.

# %%
def best_times(candidates: dict, rounds: int = 15) -> dict:
    """name -> the best of `rounds` timed calls (seconds), the candidates called in turns, in a new order each round."""
    times = {name: math.inf for name in candidates}
    order = list(candidates)
    shuffle = np.random.default_rng(0).permutation
    for _ in range(rounds):
        for name in (order[i] for i in shuffle(len(order))):
            start = time.perf_counter()
            candidates[name]()
            times[name] = min(times[name], time.perf_counter() - start)
    return times


rng = np.random.default_rng(0)
layer = tt.nn.Linear(128, 512)
x = tt.tensor(rng.standard_normal((768, 128)))
int8_layer, nf4_layer = QuantizedLinear.from_linear(layer), NF4Linear.from_linear(layer)
scale, zero_point = choose_qparams(x.min(), x.max())
x_codes = quantize(x, scale, zero_point)
x_int32, w_int32 = x_codes.numpy().astype(np.int32), int8_layer.weight_codes.numpy().astype(np.int32)
with tt.no_grad():
    times = best_times({"float32 Linear": lambda: layer(x), "int8 layer (dynamic)": lambda: int8_layer(x),
                        "int8_matmul (float32 GEMM of codes)": lambda: int8_matmul(x_codes, int8_layer.weight_codes),
                        "NF4 layer": lambda: nf4_layer(x)})
times["int32 matmul (NumPy's loops)"] = best_times({"int32": lambda: x_int32 @ w_int32.T}, rounds=2)["int32"]
for name, seconds in times.items():
    print(f"{name:36s} {seconds * 1e3:8.2f} ms  {seconds / times['float32 Linear']:6.1f}x the float32 layer")

# %% [markdown]
# On the 2-core machine this lesson was written on: float32 layer 1.2 ms,
# `int8_matmul` 1.3 ms (the float32 GEMM of the codes runs at BLAS speed), the
# int8 layer 2.5–3.5 ms, NF4 1.5–1.9 ms — and the int32 matmul 270–370 ms,
# 200–300 times the float layer: NumPy's integer matmul is a plain loop without
# blocking or vector units. The int8 layer pays for its extra passes (quantize
# the input, cast the codes, subtract the zero-point term, rescale) with
# nothing to gain: the GEMM itself still reads and multiplies float32.
#
# **What quantization buys here is memory**: a quarter of the bytes for int8
# weights, an eighth for NF4 — a model that fits, and fewer bytes to read. Where
# there are **int8 units**, it buys arithmetic too. An NVIDIA A100 does 19.5
# TFLOP/s in float32, 312 in bfloat16 on its tensor cores, and **624 int8
# TOP/s** (dense, datasheet figures); an H100 SXM 67 TFLOP/s in float32, 989 in
# bfloat16 and **1,979 int8 TOP/s**. int8 tensor-core GEMMs run twice as fast as
# bfloat16 ones and 30 times the plain float32 units, and read half the bytes
# of bfloat16. CPUs have them too (AVX-512 VNNI, AMX): PyTorch's int8 kernels
# (fbgemm, oneDNN) use them; NumPy does not. And NF4 has no 4-bit arithmetic
# anywhere: QLoRA dequantizes to bfloat16 for every product, and wins on memory
# alone — which, for generating text one token at a time, is what limits the
# speed.
#
# ### A GPT, quantized
#
# Train a small GPT on Tiny Shakespeare (two blocks of 64 channels, 300 steps:
# under a minute on two idle cores, a few minutes on a busy machine), then quantize copies of it and measure their validation
# loss on the same held-out windows. (`tinytrain quantize runs/gpt-shakespeare`
# prints the same table for the GPT milestone's model, four blocks of 128 channels
# trained 2,000 steps: its int8 layers hold 26% of their float32 bytes at +0.02%
# validation loss, its NF4 layers 13.4% at +0.29%; `python milestones/gpt.py
# --quantize nf4` quantizes the model at the end of training and evaluates it
# again.)

# %%
text = tt.datasets.shakespeare()
tokenizer = tt.text.CharTokenizer().train(text)
cut = int(len(text) * 0.9)
train_ids, val_ids = np.array(tokenizer.encode(text[:cut])), np.array(tokenizer.encode(text[cut:]))
CONTEXT = 64


def windows(ids: np.ndarray, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` random windows of CONTEXT ids and their next ids."""
    starts = rng.integers(0, len(ids) - CONTEXT - 1, count)
    both = np.stack([ids[start:start + CONTEXT + 1] for start in starts])
    return both[:, :-1], both[:, 1:]


def train(model: tt.nn.Module, steps: int, lr: float, seed: int, schedule: bool = False) -> tt.nn.Module:
    """AdamW on batches of 16 training windows; with `schedule`, a warm-up and a cosine to lr / 10."""
    optimizer = tt.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.99))
    rng = np.random.default_rng(seed)
    model.train()
    for step in range(steps):
        if schedule:
            optimizer.lr = lr * min(1, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        inputs, targets = windows(train_ids, 16, rng)
        optimizer.zero_grad()
        _, loss = model(tt.tensor(inputs), targets=tt.tensor(targets))
        loss.backward()
        tt.clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()
    return model


validation = [windows(val_ids, 32, np.random.default_rng(1)) for _ in range(16)]
calibration = [windows(train_ids, 32, np.random.default_rng(2))[0] for _ in range(4)]


def validation_loss(model: tt.nn.Module) -> float:
    model.eval()
    with tt.no_grad():
        return float(np.mean([model(tt.tensor(x), targets=tt.tensor(y))[1].item() for x, y in validation]))


config = tt.nn.GPTConfig(tokenizer.vocab_size, CONTEXT, n_layer=2, n_head=4, n_embd=64)
tt.manual_seed(0)
start = time.perf_counter()
trained = train(tt.nn.GPT(config), steps=300, lr=4e-3, seed=0, schedule=True).state_dict()
print(f"trained in {time.perf_counter() - start:.0f} s")


def copy_of(state: dict) -> tt.nn.GPT:
    model = tt.nn.GPT(config)
    model.load_state_dict(state)
    return model


LINEAR_NAMES = [name for name, _ in linear_layers(copy_of(trained))]  # the layers quantize_model replaces


def linear_bytes(model: tt.nn.Module) -> int:
    """The bytes of the layers named LINEAR_NAMES: float, or their quantized replacements."""
    named = dict(model.named_modules())
    return sum(model_bytes(named[name]) for name in LINEAR_NAMES)


variants = {
    "float32": lambda: copy_of(trained),
    "int8 dynamic": lambda: quantize_model(copy_of(trained), "int8"),
    "int8 static, min/max": lambda: quantize_model(copy_of(trained), "int8", calibration=calibration),
    "int8 static, 99.9th percentile": lambda: quantize_model(copy_of(trained), "int8", calibration=calibration,
                                                             observer=lambda: Observer("percentile", 99.9)),
    "NF4": lambda: quantize_model(copy_of(trained), "nf4"),
}
results = {}
for name, make in variants.items():
    model = make()
    results[name] = (model_bytes(model), linear_bytes(model), validation_loss(model))
base_bytes, base_linear, base_loss = results["float32"]
print(f"{'':32s} {'model bytes':>12s} {'Linear layers':>14s} {'val loss':>9s}")
for name, (total, in_linear, loss) in results.items():
    print(f"{name:32s} {total:12,d} {in_linear / base_linear:13.1%} {loss:9.4f} {loss / base_loss - 1:+7.2%}")

# %% [markdown]
# In the run this lesson was written with: the int8 Linear layers hold 27% of
# their float32 bytes (a quarter, plus a float32 scale per row and the float32
# bias), NF4's 14% (4.127 bits per weight, plus the bias); the whole model
# shrinks less, since the embeddings and LayerNorms stay float32. The validation
# loss moved by at most 0.02% in int8 — dynamic, or static with either observer —
# and by 0.04% in NF4. The percentile observer did not clearly beat min/max (they
# differ by hundredths of a percent): clipping a transformer's largest
# activations is rarely free. Transformers carry
# information in a few large activations (Dettmers et al. 2022, *LLM.int8()*,
# found whole outlier feature dimensions in large models); a percentile observer
# is for inputs whose extremes are noise.
#
# ### The error of each layer
#
# Which layers suffer? Record every Linear layer's input in the float model on a
# validation batch, then compare each layer's output with its quantized twin's on
# that same input: $\|y_q - y\| / \|y\|$.

# %%
class Recorder(tt.nn.Module):
    """Runs `layer`, keeping its last input."""

    def __init__(self, layer: tt.nn.Module) -> None:
        super().__init__()
        self.layer, self.input = layer, None

    def forward(self, x: Tensor) -> Tensor:
        self.input = x
        return self.layer(x)


float_model = copy_of(trained).eval()
recorders = {name: Recorder(layer) for name, layer in linear_layers(float_model)}
for recorder in recorders.values():
    replace_module(float_model, recorder.layer, recorder)
with tt.no_grad():
    float_model(tt.tensor(validation[0][0]))
quantized = {name: dict(variants[name]().named_modules()) for name in ("int8 dynamic", "int8 static, min/max", "NF4")}
print(f"{'layer':18s}" + "".join(f"{name:>22s}" for name in quantized))
with tt.no_grad():
    for layer_name, recorder in recorders.items():
        want = recorder.layer(recorder.input).numpy()
        errors = [np.linalg.norm(modules[layer_name](recorder.input).numpy() - want) / np.linalg.norm(want)
                  for modules in quantized.values()]
        print(f"{layer_name:18s}" + "".join(f"{error:22.4f}" for error in errors))

# %% [markdown]
# int8 layers are off by about half a percent of their output, NF4 layers by 2
# to 6% — and still the loss barely moves: the errors are small, unbiased noise,
# and the residual stream and the LayerNorms average them out. Static and
# dynamic int8 differ little here, since the calibration batches come from the
# same text as the validation windows.
#
# ### Quantization-aware training
#
# Fine-tune with fake quantization for 100 steps, then convert to int8 (static),
# and compare with a float control fine-tuned the same 100 steps and quantized
# after training (post-training quantization, PTQ: `prepare_qat`, a few forward
# passes in training mode to record the ranges, then `convert_qat` — QAT with
# zero training steps). At 8 bits there is little to recover; so the same with
# **3-bit** weights (7 levels per row, stored one per byte here: the point is the
# accuracy), where rounding hurts.

# %%
def post_training(state: dict, weight_bits: int) -> tt.nn.Module:
    """PTQ through the QAT layers: record the input ranges on the calibration batches, train nothing, convert."""
    model = prepare_qat(copy_of(state), weight_bits=weight_bits).train()
    with tt.no_grad():
        for batch in calibration:
            model(tt.tensor(batch))
    return convert_qat(model)


control = train(copy_of(trained), steps=100, lr=4e-4, seed=3).state_dict()
control_loss = validation_loss(copy_of(control))
print(f"float32 control, fine-tuned 100 steps: {control_loss:.4f}")
for bits in (8, 3):
    ptq = validation_loss(post_training(control, bits))
    qat = validation_loss(convert_qat(train(prepare_qat(copy_of(trained), weight_bits=bits), 100, 4e-4, seed=3)))
    print(f"{bits}-bit weights: PTQ {ptq:.4f} ({ptq / control_loss - 1:+.2%}), "
          f"QAT {qat:.4f} ({qat / control_loss - 1:+.2%})")

# %% [markdown]
# With 8-bit weights both stay within a few hundredths of a percent of the float
# control: nothing to recover. With 3-bit weights, post-training quantization
# lost 0.28% in the run this lesson was written with, and the QAT fine-tune
# brought it back to 0.19%: the weights have learned to sit where rounding hurts
# least, and the layers after them to expect the rounded values.
#
# ## How PyTorch does it
#
# * `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`
#   is `quantize_model(model, "int8")`: int8 weights per channel, activations
#   quantized per batch. Static quantization is `prepare` (observers in place:
#   `MinMaxObserver`, `HistogramObserver`, `PerChannelMinMaxObserver`),
#   calibration, then `convert` — our `quantize_model(..., calibration=...)`.
# * `torch.quantize_per_channel(w, scales, zero_points, axis=0, dtype=torch.qint8)`
#   gives a quantized tensor; `.int_repr()` its codes, `.dequantize()` the floats.
# * `torch.fake_quantize_per_tensor_affine` / `..._per_channel_affine` are
#   `fake_quantize`, with the same straight-through backward (gradient where the
#   rounded code lies in `[quant_min, quant_max]`); `prepare_qat` and `convert`
#   are the QAT workflow; `torch._int_mm(a, b)` is an int8 × int8 → int32 matmul.
# * `bitsandbytes` holds LLMs in 8 and 4 bits: `Linear8bitLt` (LLM.int8(),
#   keeping outlier features in 16 bits), and `Linear4bit` with `quant_type="nf4"`,
#   `compress_statistics=True` (double quantization) and a `compute_dtype`
#   (bfloat16) — as Hugging Face's `BitsAndBytesConfig(load_in_4bit=True,
#   bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)` sets them up.
#   Its weights are Parameters that do not require grad, as ours.
# * `torchao` (`quantize_(model, int8_weight_only())`, ...) is PyTorch's newer home
#   for all of it, including NF4 and int4 kernels.
#
# ## Summary
#
# * A code stands for $s(q - z)$. Affine ranges include 0 exactly; symmetric ones
#   ($z = 0$, $[-127, 127]$) keep the integer product simple. Round half to even,
#   then clamp: error $\le s/2$ inside the range, clipping outside.
# * Weights: symmetric, a scale per output channel — it factors out of the sum.
# * Activations: dynamic (each batch's range) or static (calibrated by observers:
#   min/max keeps every value; a percentile clips the extremes, which a
#   transformer needs).
# * The integer product: $s_i s_x (\sum_j q_{ij} q_{x,j} - z_x \sum_j q_{ij})$,
#   int8 products summed in int32. In NumPy: float32 GEMMs of the codes, exact
#   while every partial sum stays within $2^{24}$ — chunks of 1,024 terms.
# * QAT: fake quantization forward, straight-through backward (pass inside the
#   range, 0 outside).
# * NF4: 16 levels at normal quantiles, absmax per 64 weights, the absmax values
#   in 8 bits per 256 (double quantization), two codes a byte: 4.127 bits.
# * On a CPU without int8 kernels, quantization buys memory, not speed; where
#   int8 units exist, it buys both.
