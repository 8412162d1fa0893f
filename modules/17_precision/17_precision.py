# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 17 — Precision and attention memory
#
# *One sitting, about 2.5 hours: the lesson, 7 functions to write, and the measurements.*
#
# Module 13 trained in float16 with float32 master weights and a loss scale, and
# Module 14 ended at a wall: attention keeps a $(T, T)$ matrix of weights for
# the backward pass, so its memory grows with the square of the context. This
# module takes both further, the way large models are trained today.
#
# **Precision.** Practitioners pick from a table of five modes (Lightning's
# names, which `Trainer(precision=...)` takes):
#
# | precision | weights kept in | compute in | gradients | optimizer state | loss scale |
# |---|---|---|---|---|---|
# | `32-true` | float32 | float32 | float32 | float32 | — |
# | `16-mixed` | float32 (+ float16 copies) | float16 | float32 | float32 | dynamic |
# | `bf16-mixed` | float32 (+ bfloat16 copies) | bfloat16 | float32 | float32 | none needed |
# | `16-true` | float16 | float16 | float16 | float16 | none |
# | `bf16-true` | bfloat16 | bfloat16 | bfloat16 | bfloat16 | none |
#
# The *mixed* modes keep float32 master weights and compute on low-precision
# copies; the *true* modes put everything in 2 bytes a number: half the memory
# of weights, gradients and optimizer state, the fastest on a GPU, and the
# riskiest. **bfloat16** ("brain float", Google Brain) is float32 with the last
# 16 bits cut off: float32's range, far less precision, and so no loss scaling.
#
# **Attention memory.** FlashAttention (Dao et al., 2022) computes exactly the
# same attention tile by tile, keeping one number per query instead of the
# $(T, T)$ weights, and recomputes the tiles in the backward pass: memory
# linear in $T$.
#
# **You will**
# 1. take float32 apart bit by bit, and write the rounding to bfloat16 (to
#    nearest, ties to even, NaN kept NaN) and the widening back, checked bit for
#    bit against the `ml_dtypes` package;
# 2. measure what bfloat16 arithmetic costs on a CPU, where NumPy has no
#    bfloat16 kernels;
# 3. write the plugin of the two *true* modes, and train the same models in all
#    five modes: bytes of weights, gradients and optimizer state, step time,
#    validation loss, skipped steps;
# 4. write FlashAttention: the online softmax, the tiled forward pass that keeps
#    only each row's log-sum-exp, and the backward pass that recomputes the
#    tiles; check it against plain attention, against PyTorch, and with
#    `gradcheck`;
# 5. measure the peak memory and the time of both attentions from $T = 256$ to
#    $2048$.

# %%
import math
import time
import tracemalloc

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np

import tinytrain as tt
from tinytrain import nn
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.datasets import Digits

try:
    import torch  # optional: only for comparisons
except ImportError:
    torch = None

# %% [markdown]
# ## 1. Three formats, bit by bit
#
# A float32 is 32 bits: 1 sign bit $s$, 8 exponent bits $e$ and 23 mantissa
# bits $m$. A normal number is
#
# $$x = (-1)^s \cdot 2^{e - 127} \cdot (1.m)_2 ,$$
#
# so the exponent sets the **range** (how large and how small a number can be)
# and the mantissa the **precision** (how many numbers there are between two
# powers of two: $2^{23}$). Exponent bits all 0 are zero and the *subnormals*,
# closer to 0 than the smallest normal number; all 1 are infinity ($m = 0$)
# and NaN ($m \ne 0$). The two 16-bit formats split their bits differently:
#
# | format | sign | exponent | mantissa | largest | smallest normal | spacing at 1 ($\epsilon$) |
# |---|---|---|---|---|---|---|
# | float32 | 1 | 8 | 23 | $3.4 \cdot 10^{38}$ | $1.2 \cdot 10^{-38}$ | $2^{-23} \approx 1.2 \cdot 10^{-7}$ |
# | float16 | 1 | 5 | 10 | 65,504 | $6.1 \cdot 10^{-5}$ | $2^{-10} \approx 9.8 \cdot 10^{-4}$ |
# | bfloat16 | 1 | 8 | 7 | $3.4 \cdot 10^{38}$ | $1.2 \cdot 10^{-38}$ | $2^{-7} \approx 7.8 \cdot 10^{-3}$ |
#
# bfloat16 is exactly **the upper half of a float32**: same sign, same 8-bit
# exponent, the first 7 of the 23 mantissa bits. It holds every magnitude a
# float32 holds — gradients of $10^{-20}$ and activations of $10^{30}$ —
# with 2 to 3 significant decimal digits. float16 is the opposite trade: 3
# digits, but nothing above 65,504 and nothing (not even a subnormal) below
# $6 \cdot 10^{-8}$: hence Module 13's loss scale. NumPy has no bfloat16; the
# `ml_dtypes` package (from the JAX project) adds it, and tinytrain stores
# `tt.bfloat16` tensors in it, 2 bytes a number.

# %%
for name in ("float32", "float16", "bfloat16"):
    info = ml_dtypes.finfo(name)
    print(f"{name:8s} max {float(info.max):9.3g}  smallest normal {float(info.smallest_normal):9.3g}  "
          f"eps {float(info.eps):9.3g}  decimal digits {info.precision}")

# %% [markdown]
# ### Rounding to bfloat16
#
# Cutting a float32 down to bfloat16 drops the low 16 bits. Dropping them
# (truncation) always rounds toward zero, a bias that adds up over millions of
# operations. The IEEE rule is **round to nearest, ties to even**, and on the
# bit pattern it is one addition. Read the 32 bits as an unsigned integer $b$
# and let $r = \lfloor b / 2^{16} \rfloor \bmod 2$, the lowest bit that is kept:
#
# $$\text{bfloat16 bits} = \lfloor (b + \texttt{0x7FFF} + r) / 2^{16} \rfloor .$$
#
# If the dropped half is above `0x8000` (more than half a step), the sum carries
# into the kept bits: round up. Below `0x8000`, no carry: round down. Exactly
# `0x8000` (a tie) carries only when $r = 1$, so the result ends in an even
# bit. A carry that runs through all 7 mantissa bits rounds up into the next
# power of two — the exponent field grows by one, which is right — and from
# the largest finite numbers to infinity.
#
# A worked example: $1/3$ is `0x3EAAAAAB` in float32. The dropped half
# `0xAAAB` is above `0x8000`, so it rounds up to `0x3EAB`:
# $0.333984375$ (truncation would give `0x3EAA`, $0.33203125$).
#
# One exception: **NaN**. A NaN's mantissa may be nonzero only in the dropped
# bits (`0x7F800001`), and the addition would turn it into infinity, or, for a
# negative NaN such as `0xFFFFFFFF`, carry out of the 32 bits altogether. A
# NaN must stay a NaN: it becomes the *quiet NaN* `0x7FC0`, with the input's
# sign bit (`0xFFC0` for a negative NaN) — what `ml_dtypes` gives. (Every
# library keeps a NaN a NaN; which NaN bits it picks differs: PyTorch's CPU
# cast gives `0xFFFF` for these two.)
#
# Widening back is exact: put the 16 bits back on top and zeros below.
#
# Write both, on NumPy arrays. The bits of an array are a *view* with another
# dtype, no copy: `x.view(np.uint32)` for float32, `.view(np.uint16)` for
# bfloat16, and back with `.view(np.float32)` / `.view(BFLOAT16)` (the export
# cell imports bfloat16's dtype as `BFLOAT16` from `tinytrain.backend`; `tt` is
# not imported there, so `tt.bfloat16` fails in the library). NumPy's
# shifts and adds work on unsigned integers (`bits >> 16`, `bits + 0x7FFF`)
# and keep their dtype; `np.where(condition, a, b)` picks elementwise.
#
# A view reinterprets bytes, so the integer's width must match the float's:
# - narrowing: `(b + 0x7FFF + r) >> 16` is still `uint32` (4 bytes a number).
#   Cast it with `.astype(np.uint16)` *before* `.view(BFLOAT16)`; viewing 4
#   bytes as 2-byte bfloat16 would give two numbers for each, the last axis
#   twice as long.
# - widening: `bits << 16` on `uint16` shifts every bit out and gives 0.
#   Widen first, `bits.astype(np.uint32) << 16`, then `.view(np.float32)`.

# %% export="precision"
"""Precision: bfloat16's bits, and the five precision modes of ``Trainer(precision=...)``.

:func:`float32_to_bfloat16` rounds float32 numbers to bfloat16 (to nearest, ties to
even, on the bit pattern; NaN stays NaN) and :func:`bfloat16_to_float32` widens them
back, exactly. ``PRECISIONS`` describes Lightning's five modes; :func:`precision_plugin`
makes the Trainer's plugin for one: none for ``"32-true"``, Module 13's
:class:`~tinytrain.amp.MixedPrecision` for ``"16-mixed"`` and ``"bf16-mixed"``, and
:class:`HalfPrecision` for ``"16-true"`` and ``"bf16-true"``.
"""
from typing import Any

import numpy as np

from tinytrain.amp import MIXED_PRECISIONS, MixedPrecision, require_dtype
from tinytrain.backend import BFLOAT16, is_floating
from tinytrain.optim import Optimizer
from tinytrain.tensor import Tensor

# Lightning's names, with what each keeps in which dtype (the milestones' --precision help shows these).
PRECISIONS = {
    "32-true": "float32 everywhere",
    "16-mixed": "float16 compute, float32 master weights, dynamic loss scaling",
    "bf16-mixed": "bfloat16 compute, float32 master weights, no loss scaling",
    "16-true": "float16 weights, gradients and optimizer state; no master weights, no loss scaling (Adam's "
               "eps=1e-8 is 0 in float16)",
    "bf16-true": "bfloat16 weights, gradients and optimizer state; no master weights",
}
TRUE_PRECISIONS = {"16-true": np.dtype("float16"), "bf16-true": BFLOAT16}  # the dtype of everything


def float32_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """The float32 array ``x`` rounded to bfloat16: a new bfloat16 array of ``x``'s shape.

    Round to nearest, ties to even, on the bits: with ``b`` the 32 bits of a number
    (``x.view(np.uint32)``) and ``r`` bit 16 of ``b`` (the lowest bit kept), the result's
    16 bits are ``(b + 0x7FFF + r) >> 16``. A NaN becomes the quiet NaN ``0x7FC0`` with
    its sign bit (``0xFFC0`` when negative). Bit for bit what ``x.astype(ml_dtypes.bfloat16)``
    gives, for every float32 (subnormals, infinities and the largest numbers, which round
    to infinity, included).

    The shifted bits are still ``uint32``: narrow them with ``.astype(np.uint16)`` before
    ``.view(BFLOAT16)`` (a view of 4-byte numbers as 2-byte ones doubles the last axis).
    ``x`` is not changed.
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    ### BEGIN SOLUTION
    kept = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # wraps around only for NaNs, replaced below
    quiet_nan = ((bits >> 16) & 0x8000) | 0x7FC0
    return np.where(np.isnan(x), quiet_nan, kept).astype(np.uint16).view(BFLOAT16)
    ### END SOLUTION


def bfloat16_to_float32(x: np.ndarray) -> np.ndarray:
    """The bfloat16 array ``x`` as float32, exactly: a new float32 array of ``x``'s shape whose
    upper 16 bits are ``x``'s bits and whose lower 16 bits are 0.

    Widen the ``uint16`` bits to ``np.uint32`` before shifting them up by 16 (on ``uint16``
    the shift moves every bit out and gives 0), then ``.view(np.float32)``.
    """
    bits = np.ascontiguousarray(x, dtype=BFLOAT16).view(np.uint16)
    ### BEGIN SOLUTION
    return (bits.astype(np.uint32) << 16).view(np.float32)
    ### END SOLUTION


# %% check=2
def _bits(values):
    return np.array(values, dtype=np.uint32).view(np.float32)


_third = _bits([0x3EAAAAAB])
assert float32_to_bfloat16(_third).view(np.uint16)[0] == 0x3EAB, "1/3 rounds up to 0x3EAB (the dropped half > 0x8000)"
_ties = _bits([0x3F808000, 0x3F818000, 0x00008000, 0x00018000])  # exactly half a step: to the even neighbour
assert float32_to_bfloat16(_ties).view(np.uint16).tolist() == [0x3F80, 0x3F82, 0x0000, 0x0002], "ties go to even"
_special = _bits([0x7F7FFFFF, 0x7F800000, 0x7F800001, 0xFFFFFFFF, 0x7FC00000])
assert float32_to_bfloat16(_special).view(np.uint16).tolist() == [0x7F80, 0x7F80, 0x7FC0, 0xFFC0, 0x7FC0], \
    "the largest float32 rounds to inf; every NaN becomes the quiet NaN with its sign"
_all_kinds = np.random.default_rng(0).integers(0, 2**32, 200_000, dtype=np.uint32).view(np.float32)
with np.errstate(invalid="ignore"):  # ml_dtypes warns when it casts a NaN
    expected = _all_kinds.astype(ml_dtypes.bfloat16)
assert np.array_equal(float32_to_bfloat16(_all_kinds).view(np.uint16), expected.view(np.uint16)), \
    "bit for bit what ml_dtypes gives"
_kept = _all_kinds.copy()
_rounded = float32_to_bfloat16(_all_kinds.reshape(400, 500))
assert (_rounded.dtype, _rounded.shape) == (BFLOAT16, (400, 500)), \
    f"a bfloat16 array of the input's shape (400, 500), got {_rounded.dtype} {_rounded.shape} " \
    "(narrow the uint32 bits with .astype(np.uint16) before .view(BFLOAT16))"
assert np.array_equal(_all_kinds.view(np.uint32), _kept.view(np.uint32)), "the input stays as it was"
_back = bfloat16_to_float32(expected)
assert _back.dtype == np.float32, f"bfloat16_to_float32 gives float32, got {_back.dtype}"
assert np.array_equal(_back.view(np.uint32), expected.view(np.uint16).astype(np.uint32) << 16), \
    "the bfloat16 bits on top, zeros below (widen to np.uint32 before << 16: on uint16 the shift gives 0)"
_widened = bfloat16_to_float32(expected.reshape(400, 500))
assert _widened.shape == (400, 500), f"the input's shape (400, 500), got {_widened.shape}"
print("bfloat16 rounding OK")

# %% [markdown]
# What those 16 lost bits mean, in numbers. bfloat16 keeps the extremes that
# float16 loses, and loses the small differences that float16 keeps:

# %%
for value in (1e-30, 3e-6, 1 + 1 / 256, 1 + 1 / 64, 70_000.0, 3e38):
    x = np.array([value], np.float32)
    with np.errstate(over="ignore"):
        print(f"{value:10.6g}:  float16 {float(x.astype(np.float16)[0]):12.6g}   "
              f"bfloat16 {float(bfloat16_to_float32(float32_to_bfloat16(x))[0]):12.6g}")

# %% [markdown]
# The spacing between neighbouring bfloat16 numbers is $2^{-7}$ of the number
# itself. So adding something smaller than half of that does nothing at all.
# Add 1 to a bfloat16 running sum, ten thousand times:

# %%
total32, total16 = np.float32(0), np.array([0.0], ml_dtypes.bfloat16)
one = np.array([1.0], ml_dtypes.bfloat16)
for _ in range(10_000):
    total32 += np.float32(1)
    total16 = total16 + one
print(f"float32 sum: {total32:.0f}   bfloat16 sum: {float(total16[0]):.0f}")

# %% [markdown]
# The bfloat16 sum stops at 256: from there on, the spacing is 2, and 256 + 1
# is a tie that rounds back to the even 256. Training is full of such sums —
# a weight plus a small update, a running average of gradients — which is why
# the mixed modes keep the weights and the optimizer state in float32, and why
# hardware multiplies bfloat16 numbers but **accumulates** the products in
# float32.
#
# ## 2. What bfloat16 costs on a CPU
#
# A GPU's tensor cores multiply bfloat16 matrices several times faster than
# float32 ones. NumPy has no bfloat16 kernels at all: `ml_dtypes` registers the
# dtype with loops for the element-wise functions (each element widened to
# float32, computed, rounded back: correct, and slower than NumPy's vectorised
# float32 loops), and for a **matrix product** NumPy finds no bfloat16 loop: it
# widens both operands to float32, multiplies them with BLAS and returns
# float32. tinytrain rounds that product back to bfloat16
# (`tinytrain.backend.bfloat16_operands`): a product with a bfloat16 operand
# runs in bfloat16 — the same numbers as bfloat16 hardware, which adds its
# products up in float32 and rounds the result once. Sums are the other trap:
# `ml_dtypes` adds bfloat16 numbers in bfloat16, one by one, so 4,096 ones sum
# to 256 (section 1). tinytrain's sums and means (and the statistics of a
# normalisation, the mean of a loss) add bfloat16 up in float32
# (`tinytrain.backend.sum_dtype`) and round once, as PyTorch's kernels do.
# float16 is a different story: NumPy has its own float16 loops, matrix
# product included, without BLAS. Measure tinytrain's operations on 512×512
# tensors of each dtype (the median of 5 runs):

# %%
def median_seconds(function, repeats: int = 5) -> float:
    function()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


squares = {dtype: tt.randn(512, 512).astype(dtype) for dtype in ("float32", "float16", "bfloat16")}
print(f"{'operation':12s} {'float32':>10s} {'float16':>10s} {'bfloat16':>10s}   (ms)")
for label, operation in (("add", lambda t: t + t), ("exp", lambda t: t.exp()), ("sum", lambda t: t.sum()),
                         ("matmul", lambda t: t @ t)):
    times = [median_seconds(lambda: operation(square)) * 1e3 for square in squares.values()]
    print(f"{label:12s} {times[0]:10.3f} {times[1]:10.3f} {times[2]:10.3f}")

# %% [markdown]
# On this CPU bfloat16 saves memory, not time: the element-wise functions run
# several times slower than float32's, and the matrix product, done in
# float32, pays for the conversions around it (float16's product, without
# BLAS, is far slower still). The
# point of what follows is the method and the memory; the speed comes on a GPU.
#
# One more difference from PyTorch. NumPy decides the dtype of
# "an `ml_dtypes` array times a Python number" by the number's value, and makes
# `bfloat16_array * 0.5` a float32 array (PyTorch keeps bfloat16). So a layer
# whose code multiplies an array by a Python constant — a normalisation's
# `eps`, GELU's coefficients, dropout's scale — hands on float32, and the next
# matrix product rounds back to bfloat16. (The masked softmax's `-inf` even
# makes float64 weights.) Layer by layer, on a bfloat16 input:

# %%
tt.manual_seed(0)
x16 = tt.randn(4, 8).astype("bfloat16")
for layer in (nn.Linear(8, 8), nn.ReLU(), nn.GELU(), nn.LayerNorm(8), nn.Dropout(0.5)):
    print(f"{type(layer).__name__:10s} -> {layer.to(dtype='bfloat16')(x16).dtype}")
q16 = tt.randn(1, 4, 8).astype("bfloat16")
print(f"{'attention':10s} -> {nn.functional.scaled_dot_product_attention(q16, q16, q16, is_causal=True).dtype}")

# %% [markdown]
# ## 3. The five precision modes
#
# **`bf16-mixed`** is Module 13's `MixedPrecision` with bfloat16 copies of the
# weights and no `GradScaler` (read its `forward_loss` and `before_step`): the
# masters, their gradients and the optimizer state stay float32; the forward
# and backward run on the bfloat16 copies; the loss and its softmax are
# computed in float32. Loss scaling exists because float16's gradients
# underflow below $6 \cdot 10^{-8}$; bfloat16's go down to $10^{-38}$, as far
# as float32's. Nothing to scale, nothing to skip.
#
# **`16-true` and `bf16-true`** (Lightning's `HalfPrecision`) cast the model
# once, when the Trainer is built, and never go back: weights, gradients,
# and — because the optimizer makes its state from the weights — momentum
# and Adam's moments are 2 bytes a number. Half the memory of `32-true` for all
# three. The risks are the sums of section 1: a weight of 1 takes an update
# of $10^{-3}$ only if the spacing at 1 is below $2 \cdot 10^{-3}$ — true
# for float16 ($2^{-10}$), false for bfloat16 ($2^{-7}$); Adam's second moment
# $g^2$ of a gradient of $10^{-4}$ is $10^{-8}$, which float16 cannot hold
# (its `eps=1e-8` rounds to 0 as well), while bfloat16 holds it with 2
# digits. With no loss scale, a `16-true` gradient below $6 \cdot 10^{-8}$ is
# simply 0.
#
# Write `HalfPrecision`'s two methods that do the work. It plugs into the same
# two extension points of the Trainer (Module 09) as `MixedPrecision`:
#
# * `setup(trainer)` runs once, in `Trainer(...)`: cast every floating-point
#   parameter of `trainer.model`, its gradient if it has one, and every
#   floating-point buffer (BatchNorm's running statistics; not its integer
#   count) to `self.dtype`, **in place**: `t.data = t.data.astype(self.dtype)`,
#   so the optimizer, which holds the same parameter objects, sees them. Use
#   `is_floating(t.dtype)`: bfloat16 counts, integers do not. The given first
#   lines refuse a device that has no such dtype, and cast an optimizer state
#   that exists already. Module 04's `Module.to(dtype=...)` does exactly this
#   cast in place (floating parameters, gradients and buffers; integers kept),
#   so `trainer.model.to(dtype=self.dtype)` is a one-line answer; the loop
#   over `parameters()` and `buffers()` is the other.
# * `forward_loss(model, loss_fn, inputs, targets)` computes one batch's loss:
#   a floating-point tensor `inputs` cast to `self.dtype` (integer inputs —
#   token ids — and anything that is not a tensor, such as a list of ids, as
#   they are), `outputs = model(inputs)`, a floating-point output tensor cast to
#   float32 for the loss (its softmax and logs, as PyTorch's kernels add up in
#   float32; an output that is not a tensor, a tuple say, as it is), and
#   `loss_fn(outputs, targets)`. Use the tensors' `astype`, which is
#   differentiable: the loss's gradient reaches the model in `self.dtype`.

# %% export="precision"
class HalfPrecision:
    """The Trainer's ``precision="16-true"`` and ``"bf16-true"`` (Lightning's ``HalfPrecision``):
    the model's weights, their gradients and the optimizer's state all in ``self.dtype``
    (float16 or bfloat16, 2 bytes a number), with no master weights and no loss scale.

    It plugs into the Trainer's extension points (Module 09) like Module 13's
    ``MixedPrecision``: ``setup`` casts the model once, :meth:`forward_loss` computes each
    training batch's loss, :meth:`before_step` lets every step through (the Trainer itself
    skips or stops on a non-finite loss or gradient norm).
    """

    name = "precision"

    def __init__(self, precision: str) -> None:
        if precision not in TRUE_PRECISIONS:
            raise ValueError(f"HalfPrecision runs precision={' or '.join(map(repr, TRUE_PRECISIONS))}, "
                             f"got {precision!r}")
        self.precision = precision
        self.dtype = TRUE_PRECISIONS[precision]

    def setup(self, trainer: Any) -> None:
        """Cast ``trainer.model``'s floating-point parameters, their gradients (where they have
        one) and its floating-point buffers to ``self.dtype`` in place
        (``t.data = t.data.astype(self.dtype)``: the same tensor objects, which the optimizer
        holds); integer buffers stay as they are: what ``trainer.model.to(dtype=self.dtype)``
        (Module 04) does. The given first lines raise ``RuntimeError`` for a device that cannot
        hold the dtype and cast the state of a tinytrain optimizer that has one already."""
        require_dtype(trainer.model, self.dtype, self.precision)
        if isinstance(trainer.optimizer, Optimizer):
            for state in trainer.optimizer.state:
                for key, value in state.items():
                    if is_floating(getattr(value, "dtype", np.dtype(object))):
                        state[key] = value.astype(self.dtype)
        ### BEGIN SOLUTION
        model = trainer.model
        for tensor in model.parameters() + model.buffers():
            for t in (tensor, tensor.grad):
                if t is not None and is_floating(t.dtype):
                    t.data = t.data.astype(self.dtype)
        ### END SOLUTION

    def forward_loss(self, model: Any, loss_fn: Any, inputs: Any, targets: Any) -> Tensor:
        """``loss_fn(model(inputs), targets)``: ``inputs`` cast to ``self.dtype`` first when it is
        a floating-point Tensor (other inputs, integer tensors or lists of ids, as they are); the
        output cast to float32 before ``loss_fn`` when it is a floating-point Tensor (any other
        output, a tuple say, as it is). Casts with ``Tensor.astype``, so the gradient flows back
        through them."""
        ### BEGIN SOLUTION
        if isinstance(inputs, Tensor) and is_floating(inputs.dtype):
            inputs = inputs.astype(self.dtype)
        outputs = model(inputs)
        if isinstance(outputs, Tensor) and is_floating(outputs.dtype):
            outputs = outputs.astype(np.float32)
        return loss_fn(outputs, targets)
        ### END SOLUTION

    def before_step(self, parameters: list[Tensor], loss: float) -> bool:
        """Every step may be taken: there is no scale to undo and no master to copy back."""
        return True

    def state_dict(self) -> dict:
        return {"precision": self.precision}

    def load_state_dict(self, state: dict) -> None:
        pass  # nothing to restore: the weights and the optimizer state carry the dtype


def precision_plugin(precision: str) -> Any:
    """The Trainer's plugin for ``Trainer(precision=...)``: ``None`` for ``"32-true"``, a
    :class:`~tinytrain.amp.MixedPrecision` for ``"16-mixed"`` and ``"bf16-mixed"``, a
    :class:`HalfPrecision` for ``"16-true"`` and ``"bf16-true"``. Any other value raises
    ``ValueError`` naming it and listing the five."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    if precision in MIXED_PRECISIONS:
        return MixedPrecision(precision)
    if precision in TRUE_PRECISIONS:
        return HalfPrecision(precision)
    return None


# %% check=2
class _Stub:
    """What setup reads of a trainer: the model and the optimizer."""

    def __init__(self, model):
        self.model, self.optimizer = model, tt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


tt.manual_seed(0)
_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
_model[0].weight.grad = tt.ones(8, 4)
_weight = _model[0].weight
_plugin = HalfPrecision("bf16-true")
_plugin.setup(_Stub(_model))
assert all(p.dtype == tt.bfloat16 for p in _model.parameters()), [p.dtype for p in _model.parameters()]
assert _model[0].weight is _weight, "the same tensor objects, cast in place: the optimizer holds them"
assert _model[0].weight.grad.dtype == tt.bfloat16 and _model[3].weight.grad is None, \
    "a gradient that exists is cast too; one that does not stays None"
assert _model[1].running_var.dtype == tt.bfloat16 and _model[1].num_batches_tracked.dtype == np.int64, \
    "floating-point buffers are cast, the integer count is not"
_seen = []
_spy = lambda x: _seen.append(x.dtype) or _model(x)  # noqa: E731
_loss = _plugin.forward_loss(_spy, nn.CrossEntropyLoss(), tt.randn(6, 4), tt.tensor([0, 1, 2, 0, 1, 2]))
assert _seen == [tt.bfloat16] and _loss.dtype == np.float32, "the model gets bfloat16, the loss is float32"
_loss.backward()
assert _model[3].weight.grad.dtype == tt.bfloat16, "the gradients are in the low dtype"
_gpt = nn.GPT(nn.GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))
_plugin.setup(_Stub(_gpt))
_plugin.forward_loss(lambda ids: _seen.append(ids.dtype) or _gpt(ids), lambda out, y: out.sum(), tt.tensor([[1, 2]]), None)
assert _seen[-1] == np.int64, "integer inputs (token ids) as they are"
_pair_loss = lambda pair, targets: nn.functional.mse_loss(pair[0], targets)  # noqa: E731
assert _plugin.forward_loss(lambda ids: (_gpt(ids), None), _pair_loss, [[1, 2, 3]], tt.zeros(1, 3, 5)).dtype == \
    tt.bfloat16, "token ids as a list and an output tuple pass as they are"
print("HalfPrecision OK")

# %% [markdown]
# Now all five, in the Trainer, on the milestone MLP (Digits; the MLP
# milestone's recipe: SGD with Nesterov momentum and a cosine schedule). For
# each: the test accuracy, and `tt.memory_report` after training — the bytes of
# the weights, gradients and optimizer state held between steps.

# %%
def train_mlp(precision: str, epochs: int = 8) -> tuple[float, float, dict]:
    tt.manual_seed(0)
    train, test = Digits(train=True), Digits(train=False)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    optimizer = tt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    trainer = tt.Trainer(model, optimizer, nn.CrossEntropyLoss(), precision=precision,
                         scheduler=tt.CosineSchedule(max_lr=0.1, min_lr=0.001, total_epochs=epochs))
    trainer.fit(DataLoader(TensorDataset(train.images, train.labels), batch_size=64, shuffle=True, seed=0),
                epochs=epochs, progress=False)
    loss, accuracy = trainer.evaluate(DataLoader(TensorDataset(test.images, test.labels), batch_size=512))
    return loss, accuracy, tt.memory_report(model, optimizer)


print(f"{'precision':10s} {'test loss':>9s} {'accuracy':>9s} {'weights':>9s} {'grads':>9s} {'optimizer':>10s} "
      f"{'total':>9s}  (bytes)")
mlp_runs = {}
for precision in tt.precision.PRECISIONS:
    loss, accuracy, report = mlp_runs[precision] = train_mlp(precision)
    print(f"{precision:10s} {loss:9.4f} {accuracy:9.3f} {report['parameters']:9,d} {report['gradients']:9,d} "
          f"{report['optimizer_state']:10,d} {report['total']:9,d}")
assert mlp_runs["bf16-true"][2]["total"] * 2 == mlp_runs["32-true"][2]["total"], \
    "bf16-true keeps weights, gradients and optimizer state in half the bytes of 32-true"

# %% [markdown]
# The true modes hold exactly half the bytes; the mixed modes hold what
# `32-true` holds between steps (during a step they hold the 2-byte copies
# too). On this small, well-conditioned problem every mode trains to the same
# accuracy; the test losses show the rounding.
#
# Now the GPT milestone's recipe (nanoGPT's AdamW, warm-up and cosine decay,
# clipping at 1.0), shortened to a small model and a few dozen steps on Tiny
# Shakespeare: the bytes, the time per step, the validation loss, and the
# steps skipped (an overflow in `16-mixed`, a non-finite loss or gradient norm
# in any mode).

# %%
def train_gpt(precision: str, steps: int = 30, context: int = 32) -> dict:
    tt.manual_seed(0)
    text = tt.datasets.shakespeare()[:200_000]
    tokenizer = tt.text.CharTokenizer().train(text)
    ids = np.array(tokenizer.encode(text))
    split = int(len(ids) * 0.9)
    train = tt.data.TokenWindows(ids[:split], context)
    val = tt.data.TokenWindows(ids[split:], context, stride=context)
    model = nn.GPT(nn.GPTConfig(tokenizer.vocab_size, context, n_layer=2, n_head=4, n_embd=32))
    optimizer = tt.optim.AdamW(model.parameters(), lr=4e-3, betas=(0.9, 0.99), weight_decay=0.1)
    schedule = tt.CosineSchedule(max_lr=4e-3, min_lr=4e-4, total_epochs=steps, warmup_epochs=5)
    loss_fn = lambda logits, targets: nn.functional.cross_entropy(  # noqa: E731
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    trainer = tt.Trainer(model, optimizer, loss_fn, scheduler=schedule, scheduler_interval="step",
                         grad_clip_norm=1.0, precision=precision, on_nonfinite="raise")
    start, stopped = time.perf_counter(), ""
    try:
        trainer.fit(DataLoader(train, batch_size=8, shuffle=True, seed=0), max_steps=steps, progress=False)
    except FloatingPointError:  # a non-finite loss or gradient norm: the weights are those of the last good step
        stopped = f"stopped at step {trainer.step}"
    seconds = (time.perf_counter() - start) / max(trainer.step, 1)
    return {"bytes": tt.memory_report(model, optimizer)["total"], "step ms": seconds * 1e3,
            "val loss": trainer.evaluate(DataLoader(val, batch_size=64))[0], "skipped": trainer.skipped_steps,
            "stopped": stopped}


with np.errstate(all="ignore"):  # 16-true's overflows are the point here
    gpt_runs = {precision: train_gpt(precision) for precision in tt.precision.PRECISIONS}
print(f"{'precision':10s} {'bytes':>9s} {'step ms':>8s} {'val loss':>9s} {'skipped':>8s}")
for precision, run in gpt_runs.items():
    print(f"{precision:10s} {run['bytes']:9,d} {run['step ms']:8.1f} {run['val loss']:9.3f} {run['skipped']:8d}  "
          f"{run['stopped']}")

# %% [markdown]
# Read it row by row (the times are noisy on a shared machine). The two true
# modes hold half the bytes. `bf16-mixed` and `bf16-true` end near `32-true`,
# with no step skipped and no scale to tune. The float16 modes run NumPy's
# BLAS-less float16 products and so are the slowest here; on a GPU the 2-byte
# modes are the fast ones. `16-true` does not survive its first step: AdamW
# divides by $\sqrt{v} + \epsilon$, and in float16 a second moment $v$ of
# small gradients underflows to 0 and $\epsilon = 10^{-8}$ rounds to 0 too, so
# some updates are infinite and the next loss is NaN (the Trainer, told
# `on_nonfinite="raise"`, stops there). That is why `16-true` is rarely used
# for training (a larger `eps` helps), while `bf16-true` is used by runs that
# can afford its rounding — often with float32 optimizer state or stochastic
# rounding to keep the small updates.
#
# ## 4. FlashAttention
#
# Attention for one query row $i$ is
#
# $$o_i = \sum_j p_{ij} v_j, \qquad p_{ij} = \frac{e^{s_{ij}}}{\sum_k e^{s_{ik}}}, \qquad s_{ij} = q_i \cdot k_j \cdot \text{scale}.$$
#
# Plain attention computes all of row $i$'s scores, then the softmax, then the
# weighted sum, and keeps the $(L, S)$ weights for the backward pass. The
# softmax seems to need the whole row at once: its maximum (for stability)
# and its sum. It does not.
#
# ### The online softmax
#
# Walk the keys in tiles and keep, per query row, three running values: the
# largest score so far $m$, the sum $\ell = \sum_j e^{s_j - m}$ over the keys
# seen, and the unnormalised output $a = \sum_j e^{s_j - m} v_j$. A new tile of
# scores $s_j$ and values $v_j$:
#
# $$m' = \max(m, \max_j s_j), \quad \ell' = e^{m - m'} \ell + \sum_j e^{s_j - m'}, \quad a' = e^{m - m'} a + \sum_j e^{s_j - m'} v_j .$$
#
# The factor $e^{m - m'} \le 1$ re-expresses what was summed relative to the new
# maximum. After the last tile, $o = a / \ell$ — exactly the softmax-weighted
# sum (Milakov and Gimelshein, 2018, *Online normalizer calculation for
# softmax*). A worked example, one value per key: scores $(1, 2)$ then $(4)$,
# values $(10, 20)$ then $(40)$. After tile 1: $m = 2$,
# $\ell = e^{-1} + 1 = 1.368$, $a = 10 e^{-1} + 20 = 23.68$. Tile 2: $m' = 4$,
# $e^{m - m'} = e^{-2} = 0.135$, so $\ell' = 0.185 + 1 = 1.185$,
# $a' = 3.205 + 40 = 43.21$, and $o = 36.46$: the same as
# $(10 e^1 + 20 e^2 + 40 e^4) / (e^1 + e^2 + e^4)$.
#
# Masked keys have score $-\infty$ and add nothing. One trap: a row whose keys
# so far are all masked has $m' = -\infty$, and $s - m'$ is
# $-\infty - (-\infty)$, NaN. Subtract 0 instead of $m'$ for such rows (every
# $e^{-\infty - 0}$ is 0), exactly as Module 14's masked softmax did; $e^{m - m'}$
# with $m = -\infty$ is then $e^{-\infty} = 0$ too.
#
# Write `online_softmax_update(top, total, acc, scores, values, xp)`: `top` and
# `total` are $m$ and $\ell$, shape $(\dots, B_r)$ (one per query row of the
# block), `acc` is $a$, $(\dots, B_r, E_v)$, `scores` the new tile
# $(\dots, B_r, B_c)$ (masked entries already $-\infty$), `values` its
# $(\dots, B_c, E_v)$, and `xp` the arrays' namespace (NumPy, CuPy or the
# strict device's, as `self.xp` in a `Function`). Return the new
# `(top, total, acc)` as new arrays: the caller may still hold the old ones.

# %% export="nn/flash_attention"
"""FlashAttention (Dao et al., 2022): exact attention, computed tile by tile, in memory linear in
the sequence lengths.

``flash_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
scale=None)`` -- what ``scaled_dot_product_attention(..., flash=True)`` calls -- gives the
result of Module 14's attention. The forward pass walks the keys in tiles of
``block_size`` with the *online softmax* (a running maximum and a running sum per query,
:func:`online_softmax_update`), never forming the (L, S) weights, and keeps only each
query's log-sum-exp; the backward pass recomputes each tile's weights from it
(:func:`flash_backward`). Tiles that a causal mask hides entirely are skipped. There
is no dropout on the weights: ``dropout_p > 0`` raises.
"""
import math
from typing import Any, Iterator

import numpy as np

from tinytrain.arguments import check_int, check_number
from tinytrain.autograd import Function, sum_to_shape
from tinytrain.nn.attention import _attention_mask
from tinytrain.tensor import Tensor

BLOCK_SIZE = 128  # query rows and key columns per tile: (B, H, 128, 128) scores at a time


def online_softmax_update(top: Any, total: Any, acc: Any, scores: Any, values: Any, xp: Any) -> tuple[Any, Any, Any]:
    """One key tile of the online softmax, for a block of query rows.

    ``top`` (..., R): each row's largest score so far (``-inf`` before the first tile);
    ``total`` (..., R): the sum of ``exp(score - top)`` over the keys so far; ``acc``
    (..., R, Ev): the sum of ``exp(score - top) * value``; ``scores`` (..., R, C): the new
    tile's scores, masked ones ``-inf``; ``values`` (..., C, Ev): its keys' values; ``xp``
    the arrays' namespace. Returns the new ``(top, total, acc)``, new arrays:
    ``top' = max(top, max of the tile's scores)``, then with ``shift`` = ``top'`` (0 where
    ``top'`` is ``-inf``: nothing allowed so far), ``total' = exp(top - shift) * total +
    sum of exp(scores - shift)`` and ``acc' = exp(top - shift) * acc + exp(scores - shift) @ values``.
    """
    ### BEGIN SOLUTION
    new_top = xp.maximum(top, scores.max(axis=-1))
    shift = xp.where(new_top == -xp.inf, 0, new_top)
    weights = xp.exp(scores - shift[..., None])
    rescale = xp.exp(top - shift)
    return new_top, rescale * total + weights.sum(axis=-1), rescale[..., None] * acc + weights @ values
    ### END SOLUTION


# %% check=2
_scores = np.array([[1.0, 2.0], [-np.inf, -np.inf]])
_values = np.array([[10.0], [20.0]])
_start = (np.full(2, -np.inf), np.zeros(2), np.zeros((2, 1)))
_top, _total, _acc = online_softmax_update(*_start, _scores, _values, np)
assert not any(new is old for new, old in zip((_top, _total, _acc), _start)), "new arrays, not the old ones"
assert np.allclose(_top, [2.0, -np.inf]) and np.allclose(_total, [np.exp(-1) + 1, 0.0]), (_top, _total)
assert np.allclose(_acc[:, 0], [10 * np.exp(-1) + 20, 0.0]), _acc
_top, _total, _acc = online_softmax_update(_top, _total, _acc, np.array([[4.0], [-np.inf]]), np.array([[40.0]]), np)
assert np.allclose(_acc[0, 0] / _total[0], (10 * np.e + 20 * np.e**2 + 40 * np.e**4) / (np.e + np.e**2 + np.e**4)), \
    "after both tiles, acc / total is the softmax-weighted sum of the values"
assert _top[1] == -np.inf and _total[1] == 0 and _acc[1, 0] == 0, "a row with nothing allowed stays empty, never nan"
print("online softmax OK")

# %% [markdown]
# ### The tiled forward pass
#
# Now the whole forward pass. Cut the $L$ query rows into blocks of $B_r$ and
# the $S$ keys into blocks of $B_c$. For each query block: start with
# $m = -\infty$, $\ell = 0$, $a = 0$; for each key block, compute the tile's
# scores $Q_i K_j^\top$ (only $B_r \times B_c$ of them), mask them, and update;
# then write the block's output $a / \ell$. A row with nothing allowed has
# $\ell = 0$ and gets an output of 0, as in Module 14.
#
# For the backward pass keep, per row, one number instead of $S$ weights: the
# **log-sum-exp** $\text{lse} = m + \log \ell$, since then every weight can be
# recomputed from its score as $p_{ij} = e^{s_{ij} - \text{lse}_i}$. For a row
# with nothing allowed, keep $+\infty$: every $e^{s - \infty}$ is 0.
#
# The given `Tiles` knows the blocks: `tiles.query_blocks()` lists the row
# slices, and `tiles.key_blocks(rows)` yields, for one row slice, each key
# slice with its mask — `None` when the whole tile is allowed, else a boolean
# array (True where allowed) that broadcasts against the tile's scores. With
# `is_causal`, it leaves out the tiles that lie entirely above the diagonal
# (shifted by $S - L$, Module 14's alignment): a causal attention computes
# about half the tiles, and most of them need no mask. `tiles.xp` is the
# arrays' namespace.
#
# Write `flash_forward(query, key, value, tiles)`; `query` comes already
# multiplied by the scale, all three in one floating-point dtype with the same
# leading axes. Return `(out, lse)`, shapes $(\dots, L, E_v)$ and
# $(\dots, L)$, in the inputs' dtype. Index a block of rows with
# `query[..., rows, :]`, of `lse` with `lse[..., rows]`; the transpose of a
# key tile is `xp.swapaxes(k, -1, -2)`; a masked tile is
# `xp.where(mask, scores, -xp.inf)`.
#
# Two traps:
# - *dtype*: `xp.zeros(shape)` and `xp.full(shape, -xp.inf)` make float64
#   arrays. Pass `dtype=query.dtype` to every array you allocate (`out`,
#   `lse`, and each block's `top`, `total`, `acc`), or a float32 attention
#   computes, and returns, float64.
# - *empty rows*: for a row with nothing allowed `total` is 0, and
#   `xp.log(0)` warns "divide by zero" (`acc / 0`, which is 0 / 0, "invalid
#   value") even when `xp.where` replaces the result afterwards: `xp.where`
#   evaluates both branches. Divide by, and take the log of,
#   `safe_total = xp.where(total == 0, 1, total)` instead, then put $+\infty$
#   into those rows' `lse`.

# %% export="nn/flash_attention"
class Tiles:
    """The tiles that attention computes for ``length`` query rows and ``source`` keys.

    ``query_blocks()``: the slices of ``block_size`` rows (the last one may be shorter);
    ``key_blocks(rows)``: for those rows, ``(columns, mask)`` for each slice of ``block_size``
    keys that any of them may attend, in order; ``mask`` is None when they may attend every key
    of the tile, else a boolean array, True where allowed, that broadcasts against the tile's
    scores (..., rows, columns). ``allowed`` is the mask of ``scaled_dot_product_attention``
    (a boolean array broadcasting to (..., L, S), or None); with ``is_causal``, row ``i`` may
    attend key ``j`` when ``j <= i + (S - L)`` (Module 14), and the tiles entirely above
    that line are left out.
    """

    def __init__(self, xp: Any, length: int, source: int, block_size: int, allowed: Any = None,
                 is_causal: bool = False) -> None:
        self.xp, self.length, self.source, self.block_size = xp, length, source, block_size
        self.is_causal, self.offset = is_causal, source - length
        # a view of shape (..., L, S): every tile of it is a slice, whatever axes the mask has
        self.allowed = None if allowed is None else xp.broadcast_to(allowed, (*allowed.shape[:-2], length, source))

    def query_blocks(self) -> list[slice]:
        return [slice(start, min(start + self.block_size, self.length))
                for start in range(0, self.length, self.block_size)]

    def key_blocks(self, rows: slice) -> Iterator[tuple[slice, Any]]:
        xp = self.xp
        for start in range(0, self.source, self.block_size):
            columns = slice(start, min(start + self.block_size, self.source))
            if self.allowed is not None:
                yield columns, self.allowed[..., rows, columns]
            elif not self.is_causal or columns.stop - 1 <= rows.start + self.offset:
                yield columns, None  # the whole tile is allowed
            elif columns.start <= rows.stop - 1 + self.offset:
                yield columns, xp.arange(columns.start, columns.stop) <= xp.arange(rows.start, rows.stop)[:, None] + \
                    self.offset
            else:
                return  # causal: this tile and every later one lie above the diagonal


def flash_forward(query: Any, key: Any, value: Any, tiles: Tiles) -> tuple[Any, Any]:
    """Attention of ``query`` (..., L, E; already times the scale) over ``key`` (..., S, E) and
    ``value`` (..., S, Ev), tile by tile: ``(out, lse)``, ``out`` (..., L, Ev) the attention's
    output and ``lse`` (..., L) each row's log-sum-exp of its allowed scores (``top + log(total)``;
    ``+inf`` for a row with nothing allowed, whose output is 0).

    For each row block of ``tiles.query_blocks()``: ``top`` = -inf, ``total`` = 0, ``acc`` = 0;
    for each ``(columns, mask)`` of ``tiles.key_blocks(rows)``: the tile's scores
    ``q @ k^T`` (masked ones -inf where ``mask`` is not None) go through
    :func:`online_softmax_update`; then the block's ``out = acc / total`` and ``lse``. The
    arrays are new ones of the inputs' dtype (allocate each with ``dtype=query.dtype``:
    ``xp.zeros`` and ``xp.full`` default to float64); no (L, S) array is ever made. A row
    with nothing allowed has ``total == 0``: divide by and take the log of 1 in its place
    (``xp.where(total == 0, 1, total)``), so no divide-by-zero warning is raised, and set its
    ``lse`` to ``+inf``.
    """
    ### BEGIN SOLUTION
    xp = tiles.xp
    out = xp.zeros((*query.shape[:-1], value.shape[-1]), dtype=query.dtype)
    lse = xp.zeros(query.shape[:-1], dtype=query.dtype)
    for rows in tiles.query_blocks():
        q = query[..., rows, :]
        top = xp.full(q.shape[:-1], -xp.inf, dtype=query.dtype)
        total = xp.zeros(q.shape[:-1], dtype=query.dtype)
        acc = xp.zeros((*q.shape[:-1], value.shape[-1]), dtype=query.dtype)
        for columns, mask in tiles.key_blocks(rows):
            scores = q @ xp.swapaxes(key[..., columns, :], -1, -2)
            if mask is not None:
                scores = xp.where(mask, scores, -xp.inf)
            top, total, acc = online_softmax_update(top, total, acc, scores, value[..., columns, :], xp)
        empty = total == 0
        safe_total = xp.where(empty, 1, total)
        out[..., rows, :] = acc / safe_total[..., None]
        lse[..., rows] = xp.where(empty, xp.inf, top + xp.log(safe_total))
    return out, lse
    ### END SOLUTION


# %% check=3
def _plain_attention(q, k, v, allowed):
    scores = q @ np.swapaxes(k, -1, -2)
    scores = np.where(allowed, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = weights.sum(axis=-1, keepdims=True)
    return weights / np.where(total == 0, 1, total) @ v, total[..., 0]


_rng = np.random.default_rng(0)
_q, _k, _v = _rng.standard_normal((2, 7, 3)), _rng.standard_normal((2, 10, 3)), _rng.standard_normal((2, 10, 4))
_causal = np.arange(10) <= np.arange(7)[:, None] + 3  # L < S: the queries are the last 7 positions
for _allowed, _is_causal in ((None, True), (_rng.random((2, 7, 10)) < 0.5, False), (None, False)):
    _mask = _causal if _is_causal else (np.ones((7, 10), bool) if _allowed is None else _allowed)
    _out, _lse = flash_forward(_q, _k, _v, Tiles(np, 7, 10, 3, _allowed, _is_causal))
    _expected, _total = _plain_attention(_q, _k, _v, _mask)
    assert _out.shape == (2, 7, 4) and _lse.shape == (2, 7), (_out.shape, _lse.shape)
    assert np.allclose(_out, _expected), "flash_forward must equal plain attention, tile size 3"
    _scores = np.where(_mask, _q @ np.swapaxes(_k, -1, -2), -np.inf)
    with np.errstate(divide="ignore"):
        assert np.allclose(_lse, np.where(_total == 0, np.inf, np.log(np.exp(_scores).sum(axis=-1)))), \
            "lse: each row's log-sum-exp of its allowed scores, +inf for a row with nothing allowed"
_out, _lse = flash_forward(_q[:, :3], _k[:, :2], _v[:, :2], Tiles(np, 3, 2, 2, None, True))  # L > S
assert np.all(_out[:, 0] == 0) and np.all(_lse[:, 0] == np.inf), "a row with nothing allowed: output 0, lse +inf"


class _RecordingNumpy:
    """NumPy as tiles.xp, noting the dtype of every floating-point array its functions return."""

    def __init__(self):
        self.dtypes = set()

    def __getattr__(self, name):
        value = getattr(np, name)
        if not callable(value) or isinstance(value, type):
            return value

        def call(*args, **kwargs):
            out = value(*args, **kwargs)
            for array in out if isinstance(out, tuple) else (out,):
                if isinstance(array, np.ndarray) and array.dtype.kind == "f":
                    self.dtypes.add(str(array.dtype))
            return out

        return call


_xp = _RecordingNumpy()
_out, _lse = flash_forward(*(a.astype(np.float32) for a in (_q, _k, _v)), Tiles(_xp, 7, 10, 3, None, True))
assert (_out.dtype, _lse.dtype) == (np.float32, np.float32) and _xp.dtypes == {"float32"}, \
    f"every array in the inputs' dtype (float32), got {_out.dtype}, {_lse.dtype}, {_xp.dtypes}"
_long = np.random.default_rng(1).standard_normal((768, 8))
tracemalloc.start()
flash_forward(_long, _long, _long, Tiles(np, 768, 768, 64, None, True))
_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
assert _peak < 768 * 768 * 8 / 4, f"no (L, S) array: the peak was {_peak:,} bytes, one (768, 768) array is {768 * 768 * 8:,}"
print("flash_forward OK")

# %% [markdown]
# ### The backward pass
#
# Given the output's gradient $\bar o$ (`grad`), attention's gradients are, with
# the weights $P$ and the row-wise softmax rule of Module 02,
#
# $$\bar V = P^\top \bar O, \qquad \bar P = \bar O V^\top, \qquad \bar S_{ij} = p_{ij} \big(\bar P_{ij} - \textstyle\sum_k p_{ik} \bar P_{ik}\big), \qquad \bar Q = \bar S K, \qquad \bar K = \bar S^\top Q .$$
#
# The sum $\sum_k p_{ik} \bar P_{ik} = \sum_k p_{ik}\, \bar o_i \cdot v_k = \bar o_i \cdot o_i$
# needs no row of $P$: it is $D_i = \sum_e \bar O_{ie} O_{ie}$, computed once
# from the output the forward pass kept. So every term is a sum over tiles.
# For each tile $(i, j)$: recompute the scores, mask them, take
# $P_{ij} = e^{S_{ij} - \text{lse}_i}$, and add the tile's share into
# $\bar V_j$, $\bar Q_i$ and $\bar K_j$. This is the FlashAttention backward
# pass (Dao et al., 2022, Algorithm 2): it does the forward's products again —
# about 2.5 times the forward's arithmetic instead of 2 — and in return never
# holds more than one tile of $P$.
#
# Write `flash_backward(query, key, value, out, lse, grad, tiles)`: the same
# arguments as the forward (scaled `query`), its `out` and `lse`, and `grad`
# $(\dots, L, E_v)$. Return `(d_query, d_key, d_value)`, new arrays of the
# inputs' shapes and dtype (`d_query` is the gradient of the *scaled* query:
# the given caller multiplies it by the scale). Start them at 0 and add each
# tile's share into its slice: `d_key[..., columns, :] += ...`.

# %% export="nn/flash_attention"
def flash_backward(query: Any, key: Any, value: Any, out: Any, lse: Any, grad: Any,
                   tiles: Tiles) -> tuple[Any, Any, Any]:
    """The gradients ``(d_query, d_key, d_value)`` of :func:`flash_forward`'s ``out`` weighted by
    ``grad`` (..., L, Ev), from the same ``query`` (scaled), ``key``, ``value`` and ``tiles``
    and the forward's ``out`` and ``lse``, recomputing each tile's weights
    ``p = exp(scores - lse)`` (masked scores -inf, so their weights are 0; an ``lse`` of
    ``+inf`` makes a whole row 0). With ``delta = sum over the last axis of grad * out``, per
    tile: ``d_value[cols] += p^T @ grad[rows]``, ``ds = p * (grad[rows] @ v^T - delta[rows])``,
    ``d_query[rows] += ds @ k``, ``d_key[cols] += ds^T @ q``. New arrays of the inputs'
    shapes and dtype; no (L, S) array is made.
    """
    ### BEGIN SOLUTION
    xp = tiles.xp
    d_query, d_key, d_value = xp.zeros_like(query), xp.zeros_like(key), xp.zeros_like(value)
    delta = (grad * out).sum(axis=-1)
    for rows in tiles.query_blocks():
        q, g = query[..., rows, :], grad[..., rows, :]
        for columns, mask in tiles.key_blocks(rows):
            k, v = key[..., columns, :], value[..., columns, :]
            scores = q @ xp.swapaxes(k, -1, -2)
            if mask is not None:
                scores = xp.where(mask, scores, -xp.inf)
            p = xp.exp(scores - lse[..., rows, None])
            d_value[..., columns, :] += xp.swapaxes(p, -1, -2) @ g
            ds = p * (g @ xp.swapaxes(v, -1, -2) - delta[..., rows, None])
            d_query[..., rows, :] += ds @ k
            d_key[..., columns, :] += xp.swapaxes(ds, -1, -2) @ q
    return d_query, d_key, d_value
    ### END SOLUTION


class FlashAttention(Function):
    """Attention by FlashAttention as one graph node: :func:`flash_forward` forward,
    :func:`flash_backward` backward. Keeps the (scaled) queries, keys, values, output and
    log-sum-exp -- memory linear in L and S -- in float32 (float64 for float64 inputs, as
    gradcheck needs): a float16 or bfloat16 attention adds up its tiles in float32, as the
    GPU kernels do, and rounds the output to its dtype. Gradients come back in each input's
    dtype and shape (summed over the leading axes it was broadcast along)."""

    def forward(self, query: Any, key: Any, value: Any, *, allowed: Any, is_causal: bool, scale: float,
                block_size: int) -> Any:
        xp = self.xp
        self.dtypes = (query.dtype, key.dtype, value.dtype)
        self.shapes = (query.shape, key.shape, value.shape)
        work = np.dtype("float64" if np.dtype("float64") in self.dtypes else "float32")
        leading = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        # views where no cast is needed: only the scaled queries are a new (L, E) array
        query, key, value = (xp.broadcast_to(t, (*leading, *t.shape[-2:])).astype(work, copy=False)
                             for t in (query, key, value))
        self.tiles = Tiles(xp, query.shape[-2], key.shape[-2], block_size, allowed, is_causal)
        self.scale = scale
        query = query * scale
        out, lse = flash_forward(query, key, value, self.tiles)
        self.saved = query, key, value, out, lse
        return out.astype(xp.result_type(*self.dtypes))

    def backward(self, grad: Any) -> tuple:
        query, key, value, out, lse = self.saved
        d_query, d_key, d_value = flash_backward(query, key, value, out, lse, grad.astype(query.dtype),
                                                 self.tiles)
        d_query = d_query * self.scale
        return tuple(sum_to_shape(g, shape).astype(dtype)
                     for g, shape, dtype in zip((d_query, d_key, d_value), self.shapes, self.dtypes))


def flash_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
                    is_causal: bool = False, scale: float | None = None, block_size: int = BLOCK_SIZE) -> Tensor:
    """``scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)``
    computed by FlashAttention, in tiles of ``block_size`` queries by ``block_size`` keys:
    the same result, masks and KV-cache alignment as Module 14's (a query that may attend no
    key gets 0), with memory linear in the lengths. Dropout on the attention weights is not
    implemented: the tiles would need the plain attention's random numbers, drawn for the
    whole (L, S) matrix, so ``dropout_p`` other than 0 raises ``ValueError`` naming it.
    The arguments are checked as ``scaled_dot_product_attention`` checks them; a
    ``block_size`` below 1 raises ``ValueError``.
    """
    allowed = _attention_mask(query, key, value, attn_mask, is_causal)
    if check_number("dropout_p", dropout_p, minimum=0, below=1) > 0:
        raise ValueError(f"flash attention has no dropout on the attention weights, got dropout_p={dropout_p}; "
                         "use dropout_p=0 (or the plain attention, flash=False)")
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else check_number("scale", scale)
    block_size = check_int("block_size", block_size, minimum=1)
    return FlashAttention.apply(query, query._operand(key), query._operand(value), allowed=allowed,
                                is_causal=bool(is_causal), scale=scale, block_size=block_size)


# %% check=3
_q, _k, _v = _rng.standard_normal((2, 7, 3)), _rng.standard_normal((2, 10, 3)), _rng.standard_normal((2, 10, 4))
_weights = _rng.standard_normal((2, 7, 4))
for _options in ({"is_causal": True}, {"attn_mask": _rng.random((7, 10)) < 0.6}, {}):
    _grads = []
    for flash in (False, True):
        _t = [tt.tensor(a, dtype="float64", requires_grad=True) for a in (_q, _k, _v)]
        if flash:
            _result = flash_attention(*_t, block_size=3, **_options)
        else:
            _result = nn.functional.scaled_dot_product_attention(*_t, **_options)
        (_result * tt.tensor(_weights)).sum().backward()
        _grads.append([_result.numpy()] + [t.grad.numpy() for t in _t])
    for _name, _plain, _flash in zip(("output", "d_query", "d_key", "d_value"), *_grads):
        assert np.allclose(_flash, _plain), f"{_name} of flash attention differs from the plain one ({_options})"
_t = [tt.tensor(a, dtype="float64", requires_grad=True) for a in (_q, _k[:, :5], _v[:, :5])]
assert tt.gradcheck(lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_size=2), _t), \
    "flash attention's gradients differ from the numerical ones (causal, L > S, tiles of 2)"
_tiles = Tiles(np, 768, 768, 64, None, True)
_out, _lse = flash_forward(_long, _long, _long, _tiles)
tracemalloc.start()
flash_backward(_long, _long, _long, _out, _lse, np.ones_like(_out), _tiles)
_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
assert _peak < 768 * 768 * 8 / 4, f"no (L, S) array: the peak was {_peak:,} bytes, one (768, 768) array is {768 * 768 * 8:,}"
print("flash_backward OK")

# %% [markdown]
# `scaled_dot_product_attention(..., flash=True)` calls `flash_attention`, and
# so does every call inside `with tt.nn.attention.use_flash_attention():` —
# how `GPTConfig(flash=True)` switches a whole GPT (its attention layers, and
# the recomputation of a checkpointed block, run inside it). A float32
# comparison, causal, $T = 300$ (tiles of 128 that do not divide it):

# %%
q, k, v = (tt.randn(2, 4, 300, 32, requires_grad=True) for _ in range(3))
plain = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
plain.sum().backward()
plain_grads = [t.grad.numpy() for t in (q, k, v)]
for t in (q, k, v):
    t.grad = None
flash = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, flash=True)
flash.sum().backward()
print(f"largest difference: output {np.abs(flash.numpy() - plain.numpy()).max():.1e}, gradients "
      f"{max(np.abs(t.grad.numpy() - g).max() for t, g in zip((q, k, v), plain_grads)):.1e}")
if torch is not None:
    theirs = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(t.numpy()) for t in (q, k, v)),
                                                              is_causal=True).numpy()
    print(f"largest difference from PyTorch: {np.abs(flash.numpy() - theirs).max():.1e}")

# %% [markdown]
# ## 5. Systems: memory and time
#
# The peak memory of one forward and backward pass of attention alone, batch 1,
# 4 heads of 32 channels, causal, measured with `tracemalloc` (which NumPy
# reports its arrays to) from $T = 256$ to $2048$; and the time (the median of a
# few runs: this machine is shared, so expect noise of 10% or more).

# %%
def attention_step(length: int, flash: bool, repeats: int = 3) -> tuple[int, float]:
    """(peak bytes, median seconds) of one causal attention forward + backward."""
    tt.manual_seed(0)
    q, k, v = (tt.randn(1, 4, length, 32, requires_grad=True) for _ in range(3))

    def step():
        nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, flash=flash).sum().backward()

    seconds = median_seconds(step, repeats)
    tracemalloc.start()
    step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, seconds


lengths = [256, 512, 1024, 2048]
measured = {flash: [attention_step(length, flash) for length in lengths] for flash in (False, True)}
print(f"{'T':>5s} {'plain MiB':>10s} {'flash MiB':>10s} {'plain ms':>9s} {'flash ms':>9s}")
for i, length in enumerate(lengths):
    (plain_peak, plain_s), (flash_peak, flash_s) = measured[False][i], measured[True][i]
    print(f"{length:5d} {plain_peak / 2**20:10.2f} {flash_peak / 2**20:10.2f} {plain_s * 1e3:9.1f} {flash_s * 1e3:9.1f}")
ratio = measured[True][2][0] / measured[False][2][0]
print(f"at T = 1024 flash attention's peak is {ratio:.1%} of the plain one's")
assert ratio <= 0.25, f"at T = 1024 flash attention should peak at no more than 25% of the plain one, got {ratio:.1%}"

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for flash, label in ((False, "plain"), (True, "flash")):
    left.loglog(lengths, [peak / 2**20 for peak, _ in measured[flash]], "o-", label=label)
    right.loglog(lengths, [seconds * 1e3 for _, seconds in measured[flash]], "o-", label=label)
left.set_title("peak memory of forward + backward (MiB)")
right.set_title("time of forward + backward (ms)")
for ax in (left, right):
    ax.set_xlabel("sequence length T")
    ax.legend()
plt.show()

# %% [markdown]
# Plain attention's peak grows about 4× per doubling of $T$: the $(T, T)$
# scores, weights and their temporaries. FlashAttention's grows about 2×:
# the queries, keys, values, their gradients and one tile's temporaries, all
# linear in $T$. The time is a different matter: both do the $O(T^2)$
# arithmetic, and on a CPU in NumPy the flash version pays a Python loop over
# tiles and the backward's recomputation. On a GPU the same idea is *faster*,
# because the tiles stay in the fast on-chip memory and the $(T, T)$ matrix
# never travels to and from the slow main memory — memory traffic, not
# arithmetic, is what attention is bound by there.
#
# The same in a GPT: `GPTConfig(flash=True)` gives the same loss as the
# plain model, in less memory.

# %%
def gpt_step(flash: bool) -> tuple[float, int]:
    tt.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(vocab_size=65, block_size=512, n_layer=2, n_head=4, n_embd=64, flash=flash))
    ids = tt.tensor(np.random.default_rng(0).integers(0, 65, (2, 512)))
    tracemalloc.start()
    _, loss = model(ids, targets=ids)
    loss.backward()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return loss.item(), peak


(plain_loss, plain_peak), (flash_loss, flash_peak) = gpt_step(False), gpt_step(True)
print(f"loss plain {plain_loss:.6f}, flash {flash_loss:.6f}; peak {plain_peak / 2**20:.1f} MiB -> "
      f"{flash_peak / 2**20:.1f} MiB")
assert abs(plain_loss - flash_loss) < 1e-4, f"the same loss with and without flash attention, got {plain_loss} and {flash_loss}"

# %% [markdown]
# ## How PyTorch does it
#
# * **bfloat16**: `torch.bfloat16`; `x.to(torch.bfloat16)` rounds to nearest,
#   ties to even, as ours does (c10's `round_to_nearest_even`), and keeps a NaN
#   a NaN (with other bits than `ml_dtypes`). PyTorch has bfloat16 kernels on
#   CPUs too, which add up sums and products in float32 (with AVX-512 BF16 or
#   AMX they are fast); NumPy has none, hence `ml_dtypes`.
# * **Precision modes**: Lightning's `Trainer(precision=...)` takes our five
#   names and maps them to precision plugins: `MixedPrecision("16-mixed")`
#   with `torch.amp.GradScaler`, `MixedPrecision("bf16-mixed")` without one,
#   and `HalfPrecision("16-true" / "bf16-true")`, which converts the module and
#   the inputs as ours does. Its mixed modes use `torch.autocast`, which picks
#   the dtype per *operation* (matrix products and convolutions in the low
#   dtype, softmax, normalisation and losses in float32) rather than casting
#   the weights once per step.
# * **FlashAttention**: `F.scaled_dot_product_attention` (our signature) runs
#   FlashAttention-2 kernels on GPUs for float16 and bfloat16, and a
#   memory-efficient kernel or the plain "math" one otherwise;
#   `with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION):` forces
#   the choice, as our `use_flash_attention()` does. Its kernels do support
#   dropout: they draw the random numbers from a counter-based generator
#   (Philox), so the backward pass can regenerate each tile's mask from the
#   seed and the tile's position — a generator we do not have, which is why
#   ours refuses `dropout_p > 0`. FlashAttention-2 (Dao, 2023) reorders the
#   loops (query blocks outside, as ours) and FlashAttention-3 (Shah et al.,
#   2024) uses the asynchronous units of NVIDIA's Hopper GPUs.
#
# ## Summary
#
# * bfloat16 is the top half of a float32: the same range, 8 bits of
#   precision. Rounding is one addition on the bits, `(b + 0x7FFF + r) >> 16`,
#   with NaN kept NaN.
# * Small additions vanish in 2-byte sums: master weights and float32
#   accumulation exist for that. float16 also underflows (loss scaling);
#   bfloat16 does not (no scaler in `bf16-mixed`).
# * The true modes halve the bytes of weights, gradients and optimizer state,
#   and pay in rounding; `16-true` with Adam is fragile.
# * FlashAttention: the online softmax (running maximum and sum, rescaled by
#   $e^{m - m'}$), one log-sum-exp per row kept for backward, the tiles
#   recomputed there with $D = \text{rowsum}(\bar O \circ O)$. Same result,
#   memory linear in $T$, the same $O(T^2)$ arithmetic.
