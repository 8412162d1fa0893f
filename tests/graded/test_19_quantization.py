"""Graded checks of Module 19 (quantization): scales and zero points, quantize and dequantize,
int8 codes per output channel, observers, the exact int8 matrix product, a quantized layer's
integer forward, fake quantization with the straight-through estimator, and NF4 with double
quantization.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 19``). Every result is compared with a plain NumPy reference written here
from the lesson's formulas (the codes exactly, the floats within float32 rounding), on the CPU
and on the strict device, where a computation that leaves the device fails as it would on a GPU.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises

RNG = np.random.default_rng(19)
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)


def ref_qparams(low, high, bits=8, symmetric=False):
    """The lesson's formulas in NumPy: (scale float32, zero point int32)."""
    low = np.minimum(np.asarray(low, np.float32), 0)
    high = np.maximum(np.asarray(high, np.float32), 0)
    top = 2 ** (bits - 1) - 1
    if symmetric:
        scale = np.maximum(-low, high) / np.float32(top)
    else:
        scale = (high - low) / np.float32(2 * top + 1)
    scale = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
    zero_point = np.zeros(scale.shape) if symmetric else -top - 1 - np.round(low / scale)
    return scale, zero_point.astype(np.int32)


def ref_quantize(x, scale, zero_point, qmin=-128, qmax=127):
    """Codes of x (float32, or float64 kept) divided by the scale in x's dtype, as quantize computes them."""
    x = np.asarray(x)
    x = x if x.dtype == np.float64 else x.astype(np.float32)
    return np.clip(np.round(x / np.asarray(scale, x.dtype)) + np.asarray(zero_point), qmin, qmax).astype(np.int8)


def on(device, array, dtype=None):
    return tt.tensor(array, dtype=dtype if dtype is not None else np.asarray(array).dtype, device=device)


def expect_on(device, result, what):
    expect_equal(str(result.device), tt.get_backend(device).device, f"the device of {what} (the input's: compute "
                 "with xp = x._backend.xp on x.data and wrap with Tensor._make(array, x._backend))")


# -- scales and zero points -----------------------------------------------------------------------

@check(points=2, hint="choose_qparams: low = min(low, 0) and high = max(high, 0); symmetric: scale = max(-low, high) "
                      "/ qmax and zero_point 0; affine: scale = (high - low) / (qmax - qmin) and zero_point = qmin - "
                      "round(low / scale) (round half to even), with (qmin, qmax) = integer_range(bits, symmetric); "
                      "scale 1 where the range is empty; scale float32, zero_point int32, of low's shape")
def test_choose_qparams(student):
    cases = [(-1.0, 3.0), (0.5, 2.0), (-2.0, -0.5), (0.0, 0.0), (-2.5, 252.5), (-3.5, 251.5), (-7.0, 8.0)]
    for bits in (8, 4):
        for symmetric in (False, True):
            for low, high in cases:
                scale, zero_point = student.choose_qparams(low, high, bits=bits, symmetric=symmetric)
                want_scale, want_zero_point = ref_qparams(low, high, bits, symmetric)
                what = f"choose_qparams({low}, {high}, bits={bits}, symmetric={symmetric})"
                expect_close(scale, want_scale, f"the scale of {what}", rtol=1e-6, dtype="float32")
                expect_equal(zero_point.numpy(), want_zero_point, f"the zero point of {what}")
                expect_equal(zero_point.dtype, np.dtype("int32"), f"the dtype of the zero point of {what}")
    low = RNG.uniform(-3, 1, 7).astype(np.float32)
    high = low + RNG.uniform(0, 4, 7).astype(np.float32)
    low[2] = high[2] = 0.0
    for device in ("cpu", "strict"):
        for bits, symmetric in ((8, False), (6, True), (3, False)):
            scale, zero_point = student.choose_qparams(on(device, low), on(device, high), bits, symmetric)
            what = f"choose_qparams of a range per channel on {device} (bits={bits}, symmetric={symmetric})"
            expect_on(device, scale, what)
            want_scale, want_zero_point = ref_qparams(low, high, bits, symmetric)
            expect_close(scale.numpy(), want_scale, f"the scales of {what}", rtol=1e-6, dtype="float32")
            expect_equal(zero_point.numpy(), want_zero_point, f"the zero points of {what}")


# -- quantize and dequantize ------------------------------------------------------------------------

@check(points=2, hint="quantize: codes = xp.round(x.data / scale.data) + zero_point.data (round first, then add the "
                      "zero point), xp.clip to [qmin, qmax] BEFORE .astype(xp.int8), a Tensor on x's device",
       after="test_choose_qparams")
def test_quantize(student):
    ties = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.2, -3.7]
    x = np.array(ties + [200.0, -300.0, 1000.0], np.float32) * 0.25
    for zero_point, qmin, qmax in ((3, -128, 127), (0, -8, 7), (-5, -127, 127)):
        what = f"quantize({x.tolist()}, scale=0.25, zero_point={zero_point}, qmin={qmin}, qmax={qmax})"
        codes = student.quantize(tt.tensor(x), 0.25, zero_point, qmin, qmax)
        expect_equal(codes.dtype, np.dtype("int8"), f"the dtype of {what}")
        expect_equal(codes.numpy(), ref_quantize(x, 0.25, zero_point, qmin, qmax),
                     f"{what} (half to even: round(2.5) = 2; the zero point added after rounding)")
    weight = RNG.standard_normal((5, 9)).astype(np.float32) * np.array([[0.1], [1], [10], [0.01], [3]], np.float32)
    scale = np.abs(weight).max(axis=1, keepdims=True) / 100
    zero_point = np.array([[0], [1], [-2], [5], [0]], np.int32)
    for device in ("cpu", "strict"):
        what = f"quantize of a (5, 9) matrix with a scale and zero point per row, shape (5, 1), on {device}"
        codes = student.quantize(on(device, weight), on(device, scale), on(device, zero_point, "int32"))
        expect_on(device, codes, what)
        expect_equal(codes.numpy(), ref_quantize(weight, scale, zero_point), what)


@check(points=1, hint="dequantize: (codes.data.astype(dtype) - zero_point.data.astype(dtype)) * scale.data with dtype "
                      "= scale.dtype: cast BEFORE subtracting (int8 codes minus a zero point overflow int8), and an "
                      "int32 array times a float32 one is float64 in NumPy")
def test_dequantize(student):
    codes = np.array([[-128, -1, 0, 127], [100, -100, 5, -5]], np.int8)
    scale = np.array([[0.5], [0.01]], np.float32)
    zero_point = np.array([[5], [-30]], np.int32)
    want = (codes.astype(np.float64) - zero_point) * scale
    for device in ("cpu", "strict"):
        what = f"dequantize(codes {codes.tolist()}, scale {scale.ravel().tolist()}, zero_point " \
               f"{zero_point.ravel().tolist()}) per row on {device}"
        got = student.dequantize(on(device, codes, "int8"), on(device, scale), on(device, zero_point, "int32"))
        expect_on(device, got, what)
        expect_close(got.numpy(), want, what, rtol=1e-6, dtype="float32")
    got = student.dequantize(tt.tensor(np.array([3, -3], np.int8), dtype="int8"), 0.5, 1)
    expect_close(got, [1.0, -2.0], "dequantize of codes [3, -3] with scale 0.5 and zero point 1", dtype="float32")


# -- per channel --------------------------------------------------------------------------------------

@check(points=2, hint="quantize_per_channel: amax = max |weight| of each ROW (axis 1); (scale, zero_point) = "
                      "choose_qparams(-amax, amax, bits, symmetric=True); codes = quantize(weight, scale.reshape(-1, 1), "
                      "zero_point.reshape(-1, 1), -qmax, qmax) with qmax from integer_range(bits, symmetric=True); "
                      "return (codes, scale) with scale of shape (out,)", after="test_quantize")
def test_quantize_per_channel(student):
    weight = (RNG.standard_normal((6, 11)) * 10.0 ** RNG.uniform(-3, 1, (6, 1))).astype(np.float32)
    weight[3] = 0.0
    for device in ("cpu", "strict"):
        for bits in (8, 4, 2):
            what = f"quantize_per_channel of a (6, 11) weight (rows of different sizes, row 3 all 0), bits={bits}, " \
                   f"on {device}"
            codes, scale = student.quantize_per_channel(on(device, weight), bits)
            expect_on(device, codes, what)
            top = 2 ** (bits - 1) - 1
            want_scale = np.abs(weight).max(axis=1) / np.float32(top)
            want_scale[3] = 1.0
            expect_close(scale.numpy(), want_scale, f"the scales of {what}", rtol=1e-6, dtype="float32")
            expect_equal(codes.numpy(), ref_quantize(weight, want_scale[:, None], 0, -top, top), f"the codes of {what}")
            error = np.abs(weight - want_scale[:, None] * codes.numpy().astype(np.float32))
            if not (error <= want_scale[:, None] / 2 * (1 + 1e-5)).all():
                raise AssertionError(f"{what}: every weight must come back within half its row's step")


# -- observers ------------------------------------------------------------------------------------------

@check(points=2, hint="Observer.observe: minmax: low = min over every batch's minimum, high = max over every batch's "
                      "maximum; percentile: per batch xp.percentile(x.data, 100 - percentile) and xp.percentile(x.data, "
                      "percentile), averaged over the batches (m_n = m_(n-1) + (v_n - m_(n-1)) / n); Python floats; "
                      "count the batches")
def test_observer(student):
    batches = [RNG.standard_normal((4, 50)).astype(np.float32) * scale + shift
               for scale, shift in ((1.0, 0.0), (0.5, -3.0), (3.0, 2.0), (0.1, 0.0))]
    for device in ("cpu", "strict"):
        minmax = student.Observer()
        for n, batch in enumerate(batches, 1):
            minmax.observe(on(device, batch))
            seen = batches[:n]
            what = f"Observer() on {device} after {n} batches"
            expect_equal(minmax.batches, n, f"the batches counted by {what}")
            expect_close([minmax.low, minmax.high], [min(b.min() for b in seen), max(b.max() for b in seen)],
                         f"[low, high] of {what}")
            expect_equal((type(minmax.low), type(minmax.high)), (float, float), f"the types of low and high of {what}")
        for percentile in (99.0, 90.0):
            observer = student.Observer("percentile", percentile)
            for n, batch in enumerate(batches, 1):
                observer.observe(on(device, batch))
                seen = batches[:n]
                want = [np.mean([np.percentile(b, 100 - percentile) for b in seen]),
                        np.mean([np.percentile(b, percentile) for b in seen])]
                expect_close([observer.low, observer.high], want, f"[low, high] of Observer('percentile', {percentile})"
                             f" on {device} after {n} batches (the mean of each batch's percentiles)", rtol=1e-5)
            expect_equal(observer.batches, 4, f"the batches counted by Observer('percentile', {percentile})")


# -- the integer product ------------------------------------------------------------------------------

@check(points=2, hint="int8_matmul: out = xp.zeros((M, N), dtype=xp.int32); for each chunk of at most EXACT_TERMS "
                      "columns, out += (a_chunk.astype(float32) @ b_chunk.astype(float32).T).astype(int32); one float32 "
                      "GEMM of more than 1,024 columns rounds sums above 2**24")
def test_int8_matmul(student):
    for device in ("cpu", "strict"):
        for m, k, n in ((3, 5, 4), (4, 1024, 3), (5, 2500, 6), (2, 1025, 7)):
            a = RNG.integers(90, 128, (m, k)) * RNG.choice([-1, 1], (m, k))
            b = RNG.integers(90, 128, (n, k)) * RNG.choice([-1, 1], (1, k))
            a[:, 0], b[:, 0] = -128, -128
            what = f"int8_matmul of int8 a {a.shape} and b {b.shape} on {device}"
            got = student.int8_matmul(on(device, a, "int8"), on(device, b, "int8"))
            expect_on(device, got, what)
            expect_equal(got.dtype, np.dtype("int32"), f"the dtype of {what}")
            expect_equal(got.numpy(), a @ b.T, f"{what} (exactly a @ b.T)")


def ref_int8_linear(x, codes, weight_scale, input_scale=None, input_zero_point=None):
    """The integer forward in NumPy: quantize x, sum (q_x - z_x) q_w, rescale."""
    if input_scale is None:
        input_scale, input_zero_point = ref_qparams(x.min(), x.max())
    q_x = ref_quantize(x, input_scale, input_zero_point).astype(np.int64)
    sums = (q_x - input_zero_point) @ codes.astype(np.int64).T
    return sums * (np.float64(input_scale) * weight_scale)


@check(points=3, hint="int8_linear: dynamic (input_scale None): input_scale, input_zero_point = choose_qparams(x.min(), "
                      "x.max()); codes = quantize(x, input_scale, input_zero_point); sums = int8_matmul(codes, "
                      "weight_codes) - input_zero_point * (the sum of each ROW of weight_codes, in int32); return sums "
                      "times input_scale * weight_scale, in x's dtype, on x's device",
       after=("test_quantize", "test_int8_matmul"))
def test_int8_linear(student):
    codes = RNG.integers(-127, 128, (5, 12)).astype(np.int8)
    weight_scale = RNG.uniform(0.001, 0.02, 5).astype(np.float32)
    inputs = {"positive": RNG.uniform(0.5, 3.0, (7, 12)), "negative": RNG.uniform(-4.0, -0.1, (7, 12)),
              "mixed": RNG.standard_normal((7, 12)) + 0.7}
    for device in ("cpu", "strict"):
        for name, x in inputs.items():
            x = x.astype(np.float32)
            what = f"int8_linear (dynamic) of {name} inputs (7, 12) with (5, 12) codes on {device}"
            got = student.int8_linear(on(device, x), on(device, codes, "int8"), on(device, weight_scale))
            expect_on(device, got, what)
            expect_close(got.numpy(), ref_int8_linear(x, codes, weight_scale), what, rtol=1e-5, atol=1e-6,
                         dtype="float32")
        x = inputs["mixed"].astype(np.float32)
        what = f"int8_linear (static: input_scale 0.01, input_zero_point 9, inputs beyond its range clip) on {device}"
        got = student.int8_linear(on(device, x), on(device, codes, "int8"), on(device, weight_scale), 0.01, 9)
        expect_close(got.numpy(), ref_int8_linear(x, codes, weight_scale, np.float32(0.01), 9), what, rtol=1e-5,
                     atol=1e-6, dtype="float32")
    x = inputs["mixed"]
    got = student.int8_linear(tt.tensor(x, dtype="float64"), tt.tensor(codes, dtype="int8"), tt.tensor(weight_scale))
    expect_close(got, ref_int8_linear(x.astype(np.float32), codes, weight_scale), "int8_linear of float64 inputs",
                 rtol=1e-5, dtype="float64")


# -- fake quantization --------------------------------------------------------------------------------

def ref_fake_quantize(x, scale, zero_point, qmin, qmax):
    codes = np.round(x / scale) + zero_point
    return (np.clip(codes, qmin, qmax) - zero_point) * scale, (codes >= qmin) & (codes <= qmax)


FQ_CASES = [  # (x, scale, zero_point, qmin, qmax)
    (np.array([-3.0, -1.02, -0.26, 0.0, 0.24, 0.76, 1.24, 1.26, 2.0, 0.25, 0.75]), 0.5, 0.0, -2, 2),
    (np.array([63.25, 63.3, -64.75, -64.7, -64.25, 5.125, 0.0]), 0.5, 1.0, -128, 127),
    (np.array([-1.0, -0.1, 0.0, 0.3, 0.9, 1.3, 2.2, -1.1]), 0.2, -3.0, -8, 7),
]


@check(points=1, hint="FakeQuantize.forward: codes = xp.round(x / scale) + zero_point; keep self.inside = (codes >= "
                      "qmin) & (codes <= qmax) for backward; return (xp.clip(codes, qmin, qmax) - zero_point) * scale, "
                      "in x's dtype")
def test_fake_quantize_forward(student):
    for device in ("cpu", "strict"):
        for x, scale, zero_point, qmin, qmax in FQ_CASES:
            what = f"fake_quantize({x.tolist()}, scale={scale}, zero_point={zero_point}, qmin={qmin}, qmax={qmax}) " \
                   f"on {device}"
            got = student.fake_quantize(on(device, x, "float32"), scale, zero_point, qmin, qmax)
            expect_on(device, got, what)
            want, _ = ref_fake_quantize(x.astype(np.float32), np.float32(scale), np.float32(zero_point), qmin, qmax)
            expect_close(got.numpy(), want, what, rtol=1e-6, atol=1e-7, dtype="float32")
    weight = RNG.standard_normal((4, 6)).astype(np.float32)
    scale = (np.abs(weight).max(axis=1, keepdims=True) / 7).astype(np.float32)
    got = student.fake_quantize(tt.tensor(weight), tt.tensor(scale), 0, -7, 7)
    expect_close(got, ref_fake_quantize(weight, scale, 0, -7, 7)[0], "fake_quantize of a weight with a scale per row",
                 rtol=1e-6, dtype="float32")


@check(points=2, hint="FakeQuantize.backward: the straight-through estimator, (grad * self.inside,): the gradient "
                      "passes unchanged where round(x / scale) + zero_point lies in [qmin, qmax] (the ROUNDED code, "
                      "before clipping) and is 0 where the clamp cut it; one gradient, for x",
       after="test_fake_quantize_forward")
def test_fake_quantize_straight_through(student):
    for device in ("cpu", "strict"):
        for x, scale, zero_point, qmin, qmax in FQ_CASES:
            what = f"the gradient of fake_quantize({x.tolist()}, scale={scale}, zero_point={zero_point}, qmin={qmin}, " \
                   f"qmax={qmax}) on {device}, for an incoming gradient 1, 2, 3, ..."
            inputs = on(device, x, "float32").requires_grad_()
            out = student.fake_quantize(inputs, scale, zero_point, qmin, qmax)
            incoming = np.arange(1, x.size + 1, dtype=np.float32)
            out.backward(on(device, incoming))
            _, inside = ref_fake_quantize(x.astype(np.float32), np.float32(scale), np.float32(zero_point), qmin, qmax)
            expect_close(inputs.grad.numpy(), incoming * inside, what, dtype="float32")
    outside = tt.tensor([-9.0, 5.0, 7.5], dtype="float64", requires_grad=True)
    try:
        tt.gradcheck(lambda v: student.fake_quantize(v, 0.5, 1, -3, 4), [outside])
    except AssertionError as error:
        raise AssertionError(f"gradcheck of fake_quantize at [-9, 5, 7.5], all clipped (gradient 0 on both sides): "
                             f"expected to pass, got {error}") from None


# -- NF4 ----------------------------------------------------------------------------------------------

@check(points=2, hint="double_quantize: mean = absmax.mean(); groups = blocks(absmax - mean, DOUBLE_QUANT_BLOCK); amax = "
                      "the largest magnitude of each group; (scale, zero_point) = choose_qparams(-amax, amax, "
                      "symmetric=True); codes = quantize(groups, scale.reshape(-1, 1), zero_point.reshape(-1, 1), -127, "
                      "127); return the codes flattened without the padding, the scales and the mean",
       after="test_quantize")
def test_double_quantize(student):
    for device in ("cpu", "strict"):
        for count in (1, 5, 256, 600):
            absmax = RNG.uniform(0.01, 0.2, count).astype(np.float32)
            what = f"double_quantize of {count} absmax values on {device}"
            codes, scale, mean = student.double_quantize(on(device, absmax))
            expect_on(device, codes, what)
            want_mean = absmax.mean(dtype=np.float64)
            expect_close(mean.numpy(), np.float32(want_mean), f"the mean of {what}", rtol=1e-6, dtype="float32")
            centred = np.zeros(-(-count // 256) * 256, np.float32)
            centred[:count] = absmax - np.float32(mean.item())
            groups = centred.reshape(-1, 256)
            want_scale = ref_qparams(-np.abs(groups).max(axis=1), np.abs(groups).max(axis=1), symmetric=True)[0]
            expect_close(scale.numpy(), want_scale, f"the scale of each group of 256 of {what}", rtol=1e-6,
                         dtype="float32")
            want_codes = ref_quantize(groups, want_scale[:, None], 0, -127, 127).reshape(-1)[:count]
            expect_equal(codes.numpy(), want_codes, f"the codes of {what} (int8, one per value, the padding dropped)")


def ref_nf4_codes(weight):
    flat = np.zeros(-(-weight.size // 64) * 64, np.float32)
    flat[:weight.size] = weight.reshape(-1)
    blocks = flat.reshape(-1, 64)
    absmax = np.abs(blocks).max(axis=1)
    normalized = blocks / np.where(absmax == 0, 1, absmax)[:, None]
    indices = np.abs(normalized[:, :, None] - NF4).argmin(axis=-1).astype(np.uint8)
    return ((indices[:, 0::2] << 4) | indices[:, 1::2]).reshape(-1), absmax


@check(points=3, hint="nf4_quantize: values = blocks(weight, NF4_BLOCK).data; absmax = the largest magnitude of each "
                      "block (1 where it is 0, for the division); the index of the nearest of the 16 levels "
                      "(xp.abs(normalized[:, :, None] - nf4_levels(backend)).argmin(axis=-1)); packed = (index[:, 0::2] "
                      "<< 4) | index[:, 1::2] as uint8; the absmax through double_quantize",
       after="test_double_quantize")
def test_nf4_quantize(student):
    block = np.array([2.0, -1.0, 0.5, 0.1, 0.0, -2.0, NF4[8], -0.04] + [0.0] * 56, np.float32)
    packed = student.nf4_quantize(tt.tensor(block))
    expect_equal(packed.codes.numpy()[:4], np.array([242, 168, 112, 119], np.uint8),
                 f"the first 4 bytes of the NF4 codes of the hand-worked block [2, -1, 0.5, 0.1, 0, -2, {NF4[8]}, "
                 "-0.04, 0, ...] (index pairs (15, 2), (10, 8), (7, 0), (7, 7): the first in the high half; "
                 f"{NF4[8]} / 2 lies halfway between the levels 0 and {NF4[8]}, and takes the lower)")
    expect_equal(packed.absmax_codes.numpy(), np.array([0], np.int8), "the absmax codes of one block of absmax 2")
    expect_close(packed.absmax_mean.numpy(), 2.0, "the absmax mean of one block of absmax 2", dtype="float32")
    for device in ("cpu", "strict"):
        for shape in ((4, 32), (3, 50), (1, 200)):
            weight = (RNG.standard_normal(shape) * 10.0 ** RNG.uniform(-2, 0, (shape[0], 1))).astype(np.float32)
            weight[0, :5] = 0.0
            what = f"nf4_quantize of a {shape} weight on {device}"
            packed = student.nf4_quantize(on(device, weight))
            expect_on(device, packed.codes, what)
            want_codes, absmax = ref_nf4_codes(weight)
            expect_equal(packed.codes.numpy(), want_codes, f"the packed codes of {what}")
            expect_equal(tuple(packed.shape), shape, f"the shape kept by {what}")
            want = student.double_quantize(tt.tensor(absmax))
            expect_equal(packed.absmax_codes.numpy(), want[0].numpy(), f"the absmax codes of {what}")
            expect_close(packed.absmax_scale.numpy(), want[1].numpy(), f"the absmax scales of {what}", rtol=1e-6)
    zeros = student.nf4_quantize(tt.tensor(np.zeros((2, 64), np.float32)))
    expect_equal(zeros.codes.numpy(), np.full(64, 0x77, np.uint8), "the codes of an all-zero weight (level 7 is 0)")


@check(points=2, hint="nf4_dequantize: absmax = dequantize(blocks(absmax_codes, DOUBLE_QUANT_BLOCK), "
                      "absmax_scale.reshape(-1, 1)), flattened, without the padding, + absmax_mean; the indices: the "
                      "high half (byte >> 4) first, then the low half (byte & 0x0F); NF4_LEVELS[index] * the absmax of "
                      "its block; drop the padding and reshape to weight.shape (float32)", after="test_dequantize")
def test_nf4_dequantize(student):
    for device in ("cpu", "strict"):
        for rows, columns in ((2, 64), (3, 50), (300, 64)):
            count = -(-rows * columns // 64)
            codes = RNG.integers(0, 256, count * 32).astype(np.uint8)
            absmax_codes = RNG.integers(-127, 128, count).astype(np.int8)
            groups = -(-count // 256)
            absmax_scale = RNG.uniform(0.001, 0.002, groups).astype(np.float32)
            mean = np.float32(0.5)
            weight = student.NF4Weight(on(device, codes), on(device, absmax_codes), on(device, absmax_scale),
                                       on(device, np.asarray(mean)), (rows, columns))
            what = f"nf4_dequantize of a ({rows}, {columns}) weight in {count} blocks ({groups} groups) on {device}"
            got = student.nf4_dequantize(weight)
            expect_on(device, got, what)
            absmax = absmax_scale.repeat(256)[:count] * absmax_codes + mean
            indices = np.stack([codes >> 4, codes & 15], axis=-1).reshape(count, 64)
            want = (NF4[indices] * absmax[:, None]).reshape(-1)[:rows * columns].reshape(rows, columns)
            expect_close(got.numpy(), want, what, rtol=1e-6, dtype="float32")


# -- the layers, on the student's functions -------------------------------------------------------------

@check(points=2, hint="quantize_model runs your functions: int8 layers call quantize_per_channel and int8_linear, NF4 "
                      "layers nf4_quantize and nf4_dequantize; each must keep its arrays on the input's device",
       after=("test_quantize_per_channel", "test_int8_linear", "test_nf4_quantize", "test_nf4_dequantize"))
def test_quantized_models(student):
    for device in ("cpu", "strict"):
        tt.manual_seed(0)
        model = tt.nn.Sequential(tt.nn.Linear(64, 96), tt.nn.GELU(), tt.nn.Linear(96, 8)).to(device)
        x = tt.randn(16, 64, device=device)
        with tt.no_grad():
            want = model(x).numpy()
        for dtype, calibration, bound in (("int8", None, 0.03), ("int8", [x, x * 1.1], 0.03), ("nf4", None, 0.2)):
            quantized = tt.nn.Sequential(tt.nn.Linear(64, 96), tt.nn.GELU(), tt.nn.Linear(96, 8)).to(device)
            quantized.load_state_dict(model.state_dict())
            student.quantize_model(quantized, dtype, calibration=calibration)
            what = f"quantize_model(an MLP, {dtype!r}, {'static' if calibration else 'no calibration'}) on {device}"
            with tt.no_grad():
                got = quantized(x)
            expect_on(device, got, f"the output of {what}")
            error = np.linalg.norm(got.numpy() - want) / np.linalg.norm(want)
            if error > bound:
                raise AssertionError(f"{what}: expected outputs off the float model's by at most {bound:.0%} (relative "
                                     f"norm of the difference), got {error:.1%}")
    layer = student.NF4Linear.from_linear(tt.nn.Linear(64, 3))
    x = tt.tensor(RNG.standard_normal((2, 64)), dtype="float64", requires_grad=True)
    try:
        tt.gradcheck(lambda v: layer(v), [x])
    except AssertionError as error:
        raise AssertionError(f"gradcheck of an NF4Linear layer in its float64 input: expected to pass, got {error}") \
            from None
