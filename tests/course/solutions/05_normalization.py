"""Module 05 (normalization): a student's solutions, written from the lesson alone."""


def dropout(x, p=0.5, training=True):
    if not training or p == 0:
        return x
    keep = x._backend.random_uniform(x.shape) >= p
    mask = keep.astype(x.dtype) / (1 - p)
    return x * Tensor._make(mask, x._backend)


class Normalize:
    def backward(self, grad):
        x_hat, s = self.x_hat, self.inv_std
        mean_g = grad.mean(axis=self.axes, keepdims=True)
        mean_gx = (grad * x_hat).mean(axis=self.axes, keepdims=True)
        return (s * (grad - mean_g - x_hat * mean_gx),)


class LayerNorm:
    def forward(self, x):
        k = len(self.normalized_shape)
        if x.ndim < k or tuple(x.shape[x.ndim - k:]) != self.normalized_shape:
            raise ValueError(
                f"LayerNorm({self.normalized_shape}) expects input whose last axes are {self.normalized_shape}, "
                f"got shape {x.shape}"
            )
        axes = tuple(range(x.ndim - k, x.ndim))
        x_hat, _, _ = normalize(x, axes, self.eps)
        return x_hat * self.weight + self.bias


class _BatchNorm:
    def _update_running_stats(self, mean, unbiased_var):
        m = self.momentum
        mean = mean.reshape(self.running_mean.shape)
        unbiased_var = unbiased_var.reshape(self.running_var.shape)
        self.running_mean.data[...] = (1 - m) * self.running_mean.data + m * mean
        self.running_var.data[...] = (1 - m) * self.running_var.data + m * unbiased_var
        self.num_batches_tracked.data += 1

    def forward(self, x):
        axes = (0,) + tuple(range(2, x.ndim))
        if self.training:
            n = x.size // self.num_features
            if n < 2:
                raise ValueError(
                    f"{type(self).__name__} needs more than 1 value per channel in training mode, "
                    f"got shape {x.shape}"
                )
            x_hat, mean, var = normalize(x, axes, self.eps)
            self._update_running_stats(mean, var * (n / (n - 1)))
        else:
            xp = x._backend.xp
            mean = self.running_mean.data.reshape(channel_shape)
            inv_std = 1 / xp.sqrt(self.running_var.data.reshape(channel_shape) + self.eps)
            x_hat = (x - Tensor._make(mean, x._backend)) * Tensor._make(inv_std, x._backend)
        return x_hat * self.weight.reshape(channel_shape) + self.bias.reshape(channel_shape)
