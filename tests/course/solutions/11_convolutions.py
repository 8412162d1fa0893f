"""Module 11 (convolutions): a student's solutions, written from the lesson alone."""


def conv2d_loops(x, weight, bias=None, stride=1, padding=0):
    n_images, channels, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out_h = (height + 2 * padding - kh) // stride + 1
    out_w = (width + 2 * padding - kw) // stride + 1
    out = np.zeros((n_images, out_channels, out_h, out_w), dtype=np.result_type(x, weight))
    for n in range(n_images):
        for o in range(out_channels):
            for r in range(out_h):
                for q in range(out_w):
                    window = padded[n, :, r * stride:r * stride + kh, q * stride:q * stride + kw]
                    total = np.sum(window * weight[o])
                    if bias is not None:
                        total = total + bias[o]
                    out[n, o, r, q] = total
    return out


def im2col(xp, x, kernel, stride, out=None):
    n, c, height, width = x.shape
    kh, kw = kernel
    sh, sw = stride
    out_h, out_w = output_size(height, kh, sh), output_size(width, kw, sw)
    windows = xp.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    # (N, C, H_out, W_out, kH, kW) -> (N, C, kH, kW, H_out, W_out): rows in (c, i, j) order, columns r * W_out + q
    ordered = windows.transpose(0, 1, 4, 5, 2, 3)
    if out is None:
        return ordered.reshape(n, c * kh * kw, out_h * out_w)  # the one copy
    out.reshape(n, c, kh, kw, out_h, out_w)[...] = ordered
    return out


def col2im(xp, cols, shape, kernel, stride, out=None):
    n, c, height, width = shape
    kh, kw = kernel
    sh, sw = stride
    out_h, out_w = output_size(height, kh, sh), output_size(width, kw, sw)
    image = xp.zeros(shape, dtype=cols.dtype) if out is None else out
    blocks = cols.reshape(n, c, kh, kw, out_h, out_w)
    for i in range(kh):
        for j in range(kw):
            image[:, :, i:i + sh * out_h:sh, j:j + sw * out_w:sw] += blocks[:, :, i, j]
    return image


class Conv2dFunction:
    def forward(self, x, weight, bias=None, *, stride, padding):
        xp = self.xp
        ph, pw = padding
        self.input_shape = x.shape
        if ph or pw:
            x = self.backend.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        n, c, height, width = x.shape
        out_channels, _, kh, kw = weight.shape
        out_h, out_w = output_size(height, kh, stride[0]), output_size(width, kw, stride[1])
        cols = im2col(xp, x, (kh, kw), stride)  # (N, C*kH*kW, L)
        w_rows = weight.reshape(out_channels, c * kh * kw)
        out = xp.matmul(w_rows, cols)  # (N, O, L)
        if bias is not None:
            out += bias.reshape(1, out_channels, 1)  # `out` is a new array of ours
        self.cols, self.weight = cols, weight
        self.padded_shape, self.kernel, self.stride, self.padding = x.shape, (kh, kw), stride, padding
        return out.reshape(n, out_channels, out_h, out_w)

    def backward(self, grad):
        xp = self.xp
        weight, cols = self.weight, self.cols
        n, out_channels = grad.shape[0], grad.shape[1]
        g = grad.reshape(n, out_channels, -1)  # (N, O, L)
        w_rows = weight.reshape(out_channels, -1)
        grad_x = grad_weight = grad_bias = None
        if self.inputs[0].requires_grad:
            grad_cols = xp.matmul(w_rows.T, g)  # (N, C*kH*kW, L)
            grad_padded = col2im(xp, grad_cols, self.padded_shape, self.kernel, self.stride)
            ph, pw = self.padding
            height, width = self.input_shape[2], self.input_shape[3]
            grad_x = grad_padded[:, :, ph:ph + height, pw:pw + width]
        if self.inputs[1].requires_grad:
            grad_weight = xp.matmul(g, cols.transpose(0, 2, 1)).sum(axis=0).reshape(weight.shape)
        if len(self.inputs) == 2:
            return grad_x, grad_weight
        if self.inputs[2].requires_grad:
            grad_bias = g.sum(axis=(0, 2))
        return grad_x, grad_weight, grad_bias


def conv2d(x, weight, bias=None, stride=1, padding=0, *, b=None):
    weight = x._operand(weight)
    if bias is not None:
        bias = x._operand(bias)
    if x.ndim != 4 or weight.ndim != 4:
        raise ValueError(f"conv2d expects input (N, C, H, W) and weight (O, C, kH, kW), "
                         f"got input of shape {x.shape} and weight of shape {weight.shape}")
    out_channels, in_channels, kh, kw = weight.shape
    if x.shape[1] != in_channels:
        raise ValueError(f"conv2d: input of shape {x.shape} has {x.shape[1]} channels, but the weight of shape "
                         f"{weight.shape} expects {in_channels}")
    if bias is not None and bias.shape != (out_channels,):
        raise ValueError(f"conv2d: bias must have shape ({out_channels},) for a weight of shape {weight.shape}, "
                         f"got {bias.shape}")
    padded_h, padded_w = x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1]
    if padded_h < kh or padded_w < kw:
        raise ValueError(f"conv2d: the input {x.shape} (padded to {padded_h}x{padded_w}) is smaller than "
                         f"the kernel {kh}x{kw}")
    if bias is None:
        return Conv2dFunction.apply(x, weight, stride=stride, padding=padding)
    return Conv2dFunction.apply(x, weight, bias, stride=stride, padding=padding)


class Conv2d:
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        kh, kw = self.kernel_size
        bound = 1 / math.sqrt(in_channels * kh * kw)
        self.weight = _uniform_parameter((out_channels, in_channels, kh, kw), bound)
        self.bias = _uniform_parameter((out_channels,), bound) if bias else None


class MaxPool2dFunction:
    def forward(self, x, *, kernel, stride):
        xp = self.xp
        slices = window_slices(xp, x, kernel, stride)
        best = slices[0].copy()  # the views belong to x: work on a copy
        index = xp.zeros(best.shape, dtype=np.int64)
        check_nan = np.dtype(x.dtype).kind == "f"
        for k, candidate in enumerate(slices[1:], start=1):
            wins = candidate > best  # strictly greater: the first maximum stays
            if check_nan:
                wins = wins | xp.isnan(candidate)  # a NaN in the window makes the result NaN
            best = xp.where(wins, candidate, best)
            index = xp.where(wins, k, index)
        self.index, self.input_shape, self.kernel, self.stride = index, x.shape, kernel, stride
        return best

    def backward(self, grad):
        xp = self.xp
        grad_x, slices, tiled = gradient_slices(xp, self.input_shape, self.kernel, self.stride, grad.dtype)
        for k, part in enumerate(slices):
            share = xp.where(self.index == k, grad, 0)
            if tiled:
                part[...] = share
            else:
                part += share
        return (grad_x,)


class AvgPool2dFunction:
    def forward(self, x, *, kernel, stride):
        xp = self.xp
        slices = window_slices(xp, x, kernel, stride)
        total = slices[0].copy()  # the views belong to x: work on a copy
        for part in slices[1:]:
            total += part
        self.input_shape, self.kernel, self.stride = x.shape, kernel, stride
        return total / (kernel[0] * kernel[1])

    def backward(self, grad):
        xp = self.xp
        share = grad / (self.kernel[0] * self.kernel[1])
        grad_x, slices, tiled = gradient_slices(xp, self.input_shape, self.kernel, self.stride, grad.dtype)
        for part in slices:
            if tiled:
                part[...] = share
            else:
                part += share
        return (grad_x,)
