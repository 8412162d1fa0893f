"""Module 06 (losses): a student's solutions, written from the lesson alone."""


def mse_loss(pred, target, reduction="mean"):
    diff = pred - target.astype(pred.dtype)
    return _reduce(diff * diff, reduction)


class CrossEntropy:
    def forward(self, logits, target, reduction):
        xp = self.xp
        n = logits.shape[0]
        shifted = logits - logits.max(axis=1, keepdims=True)
        exps = xp.exp(shifted)
        sums = exps.sum(axis=1, keepdims=True)
        log_sums = xp.log(sums)[:, 0]
        if target.ndim == 1:  # class indices
            losses = log_sums - shifted[xp.arange(n), target]
        else:  # probabilities of shape (N, C)
            losses = log_sums * target.sum(axis=1) - (target * shifted).sum(axis=1)
        self.probs = exps / sums
        self.target = target
        self.reduction = reduction
        self.count = losses.size
        return _reduce_array(losses, reduction)

    def backward(self, grad):
        xp = self.xp
        g = _unreduce(grad, self.reduction, self.count)
        g_rows = g.reshape(-1, 1) if g.ndim == 1 else g  # one value per row for "none"
        target = self.target
        if target.ndim == 1:
            grad_logits = self.probs * g_rows
            grad_logits[xp.arange(target.shape[0]), target] -= g
        else:
            grad_logits = (self.probs * target.sum(axis=1, keepdims=True) - target) * g_rows
        return grad_logits, None


def cross_entropy(logits, target, reduction="mean"):
    return CrossEntropy.apply(logits, target, reduction=reduction)


class BinaryCrossEntropy:
    def forward(self, probs, target, reduction):
        xp = self.xp
        smallest = np.finfo(probs.dtype).smallest_subnormal
        log_p = xp.maximum(xp.log(xp.maximum(probs, smallest)), LOG_FLOOR)
        log_not_p = xp.maximum(xp.log(xp.maximum(1 - probs, smallest)), LOG_FLOOR)
        losses = -(target * log_p + (1 - target) * log_not_p)
        self.probs = probs
        self.target = target
        self.reduction = reduction
        self.count = losses.size
        return _reduce_array(losses, reduction)

    def backward(self, grad):
        xp = self.xp
        p, t = self.probs, self.target
        g = _unreduce(grad, self.reduction, self.count)
        return (p - t) / xp.maximum(p * (1 - p), GRAD_EPS) * g, None


class BinaryCrossEntropyWithLogits:
    def forward(self, logits, target, reduction):
        xp = self.xp
        losses = xp.maximum(logits, 0) - logits * target + xp.log1p(xp.exp(-xp.abs(logits)))
        self.logits = logits
        self.target = target
        self.reduction = reduction
        self.count = losses.size
        return _reduce_array(losses, reduction)

    def backward(self, grad):
        xp = self.xp
        x = self.logits
        decay = xp.exp(-xp.abs(x))  # in (0, 1]: never overflows
        sig = xp.where(x >= 0, 1, decay) / (1 + decay)
        g = _unreduce(grad, self.reduction, self.count)
        return (sig - self.target) * g, None


def binary_cross_entropy(probs, target, reduction="mean"):
    return BinaryCrossEntropy.apply(probs, target.astype(probs.dtype), reduction=reduction)


def binary_cross_entropy_with_logits(logits, target, reduction="mean"):
    return BinaryCrossEntropyWithLogits.apply(logits, target.astype(logits.dtype), reduction=reduction)


