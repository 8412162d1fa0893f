"""Module 19 (quantization): a student's solutions, written from the lesson alone."""


def choose_qparams(low, high, bits=8, symmetric=False):
    xp = low._backend.xp
    lo, hi = low.data, high.data
    if symmetric:
        amax = xp.maximum(xp.abs(lo), xp.abs(hi))
        scale = amax / qmax
        scale = xp.where(amax == 0, 1.0, scale).astype(np.float32)
        zero_point = xp.zeros(scale.shape, dtype=np.int32)
    else:
        lo = xp.minimum(lo, 0.0)
        hi = xp.maximum(hi, 0.0)
        width = hi - lo
        scale = width / (qmax - qmin)
        scale = xp.where(width == 0, 1.0, scale).astype(np.float32)
        zero_point = (qmin - xp.round(lo / scale)).astype(np.int32)
    scale = xp.asarray(scale, dtype=np.float32)
    zero_point = xp.asarray(zero_point, dtype=np.int32)
    return Tensor._make(scale, low._backend), Tensor._make(zero_point, low._backend)


def quantize(x, scale, zero_point=0, qmin=-128, qmax=127):
    xp = x._backend.xp
    shifted = xp.round(x.data / scale.data) + zero_point.data.astype(x.dtype)
    codes = xp.clip(shifted, qmin, qmax).astype(np.int8)
    return Tensor._make(xp.asarray(codes), x._backend)


def dequantize(codes, scale, zero_point=0):
    xp = codes._backend.xp
    dtype = scale.dtype
    values = scale.data * (codes.data.astype(dtype) - zero_point.data.astype(dtype))
    return Tensor._make(xp.asarray(values, dtype=dtype), codes._backend)


def quantize_per_channel(weight, bits=8):
    xp = weight._backend.xp
    amax = Tensor._make(xp.abs(weight.data).max(axis=1), weight._backend)
    scale, _ = choose_qparams(-amax, amax, bits, symmetric=True)
    qmin, qmax = integer_range(bits, symmetric=True)
    codes = quantize(weight, scale.reshape(-1, 1), 0, qmin, qmax)
    return codes, scale


class Observer:
    def observe(self, x):
        xp = x._backend.xp
        if self.method == "minmax":
            low = float(x.data.min())
            high = float(x.data.max())
            self.low = low if self.low is None else min(self.low, low)
            self.high = high if self.high is None else max(self.high, high)
            self.batches += 1
        else:
            low = float(xp.percentile(x.data, 100 - self.percentile))
            high = float(xp.percentile(x.data, self.percentile))
            self.batches += 1
            if self.low is None:
                self.low, self.high = low, high
            else:
                self.low = self.low + (low - self.low) / self.batches
                self.high = self.high + (high - self.high) / self.batches


def int8_matmul(a, b):
    xp = a._backend.xp
    M, K = a.shape
    N = b.shape[0]
    result = xp.zeros((M, N), dtype=np.int32)
    for start in range(0, K, EXACT_TERMS):
        a_chunk = a.data[:, start:start + EXACT_TERMS].astype(np.float32)
        b_chunk = b.data[:, start:start + EXACT_TERMS].astype(np.float32)
        result += (a_chunk @ b_chunk.T).astype(np.int32)
    return Tensor._make(result, a._backend)


def int8_linear(x, weight_codes, weight_scale, input_scale=None, input_zero_point=None):
    xp = x._backend.xp
    if input_scale is None:
        input_scale, input_zero_point = choose_qparams(x.min(), x.max())
    q_x = quantize(x, input_scale, input_zero_point)
    sums = int8_matmul(q_x, weight_codes).data
    row_sums = weight_codes.data.astype(np.int32).sum(axis=1, dtype=np.int32)
    sums = sums - input_zero_point.data.astype(np.int32) * row_sums
    factor = input_scale.data.astype(x.dtype) * weight_scale.data.astype(x.dtype)
    y = sums.astype(x.dtype) * factor
    return Tensor._make(xp.asarray(y), x._backend)


class FakeQuantize:
    def forward(self, x, *, scale, zero_point, qmin, qmax):
        xp = self.xp
        codes = xp.round(x / scale) + zero_point
        self.inside = (codes >= qmin) & (codes <= qmax)
        y = scale * (xp.clip(codes, qmin, qmax) - zero_point)
        return y.astype(x.dtype, copy=False)

    def backward(self, grad):
        return (grad * self.inside,)


def double_quantize(absmax):
    xp = absmax._backend.xp
    backend = absmax._backend
    n = absmax.size
    mean = xp.asarray(absmax.data.mean(), dtype=np.float32)
    centred = Tensor._make(absmax.data - mean, backend)
    groups = blocks(centred, DOUBLE_QUANT_BLOCK)
    amax = Tensor._make(xp.abs(groups.data).max(axis=1), backend)
    scale, _ = choose_qparams(-amax, amax, symmetric=True)
    codes = quantize(groups, scale.reshape(-1, 1), 0, -127, 127)
    codes = Tensor._make(codes.data.reshape(-1)[:n], backend)
    return codes, scale, Tensor._make(mean, backend)


def nf4_quantize(weight):
    backend = weight._backend
    xp = backend.xp
    values = blocks(weight, NF4_BLOCK).data
    absmax = xp.abs(values).max(axis=1)
    absmax = xp.where(absmax == 0, xp.ones_like(absmax), absmax)
    normalized = values / absmax[:, None]
    levels = nf4_levels(backend)
    distances = xp.abs(normalized[:, :, None] - levels)
    indices = xp.argmin(distances, axis=-1).astype(np.uint8).reshape(-1, 2)
    packed = (indices[:, 0] << 4) | indices[:, 1]
    absmax_codes, absmax_scale, absmax_mean = double_quantize(Tensor._make(absmax, backend))
    return NF4Weight(Tensor._make(packed.astype(np.uint8), backend), absmax_codes, absmax_scale, absmax_mean,
                     tuple(weight.shape))


def nf4_dequantize(weight):
    backend = weight.codes._backend
    xp = backend.xp
    packed = weight.codes.data
    indices = xp.stack([packed >> 4, packed & 0x0F], axis=1).reshape(-1)
    values = nf4_levels(backend)[indices].reshape(-1, NF4_BLOCK)
    n = weight.absmax_codes.shape[0]
    group_scale = xp.repeat(weight.absmax_scale.data.astype(np.float32), DOUBLE_QUANT_BLOCK)[:n]
    absmax = group_scale * weight.absmax_codes.data.astype(np.float32) + weight.absmax_mean.data.astype(np.float32)
    size = math.prod(weight.shape)
    out = (values * absmax[:, None]).reshape(-1)[:size].reshape(weight.shape)
    return Tensor._make(out, backend)
