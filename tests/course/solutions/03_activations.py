"""Module 03 (activations): a student's solutions, written from the lesson alone."""


def relu(x):
    return x.relu()


def sigmoid(x):
    return x.sigmoid()


def tanh(x):
    return x.tanh()


class GELUTanh:
    def forward(self, x):
        p, _ = self._cdf_and_clipped(x)
        self.x = x  # the input array itself, no copy
        self.p = p
        return x * p

    def backward(self, grad):
        x, p = self.x, self.p
        clipped = self.xp.clip(x, -GELU_CLIP, GELU_CLIP)  # no overflow in x**2; p(1 - p) is 0 beyond the clip
        du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * clipped * clipped)
        slope = p + 2.0 * clipped * p * (1.0 - p) * du
        result = grad * slope
        if result.dtype != grad.dtype:
            result = result.astype(grad.dtype)
        return (result,)


def gelu(x, approximate="tanh"):
    if approximate != "tanh":
        raise ValueError(
            f"gelu(approximate={approximate!r}) is not supported: only the tanh approximation "
            "(approximate='tanh') is available, since NumPy has no vectorised erf"
        )
    return GELUTanh.apply(x)


def softmax(x, axis=-1):
    return x.softmax(axis)


def log_softmax(x, axis=-1):
    return x.log_softmax(axis)
