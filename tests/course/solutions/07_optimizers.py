"""Module 07 (optimizers): a student's solutions, written from the lesson alone."""


class SGD:
    def update(self, param, grad, state, group, xp):
        lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
        if wd:
            grad = grad + wd * param  # a new array: the caller's grad stays as it was
        if mu:
            buf = state["momentum_buffer"]
            buf *= mu
            buf += grad
            if group["nesterov"]:
                direction = grad + mu * buf
            else:
                direction = buf
        else:
            direction = grad
        param -= lr * direction


class Adam:
    def adam_update(self, param, grad, state, group, xp):
        beta1, beta2 = group["betas"]
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        scratch = self.scratch_like(param, xp)
        # m = b1 m + (1 - b1) g
        m *= beta1
        xp.multiply(grad, 1 - beta1, out=scratch)
        m += scratch
        # v = b2 v + (1 - b2) g^2
        v *= beta2
        xp.multiply(grad, grad, out=scratch)
        scratch *= 1 - beta2
        v += scratch
        # denominator sqrt(v / (1 - b2^t)) + eps = sqrt(v) / sqrt(1 - b2^t) + eps
        xp.sqrt(v, out=scratch)
        scratch /= math.sqrt(1 - beta2**t)
        scratch += group["eps"]
        # param -= lr / (1 - b1^t) * m / denominator
        xp.divide(m, scratch, out=scratch)
        scratch *= group["lr"] / (1 - beta1**t)
        param -= scratch


class AdamW:
    def update(self, param, grad, state, group, xp):
        param *= 1 - group["lr"] * group["weight_decay"]
        self.adam_update(param, grad, state, group, xp)
