"""Module 17 (precision and attention memory): a student's solutions, written from the lesson alone."""


def float32_to_bfloat16(x):
    kept_low_bit = (bits >> 16) & 1  # r: the lowest bit that is kept
    rounded = (bits + 0x7FFF + kept_low_bit) >> 16  # to nearest, ties to even
    # a NaN: exponent bits all 1 and a nonzero mantissa; it becomes the quiet NaN with its sign
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    quiet_nan = ((bits >> 16) & 0x8000) | 0x7FC0
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16).view(BFLOAT16)


def bfloat16_to_float32(x):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class HalfPrecision:
    def setup(self, trainer):
        model = trainer.model
        for t in model.parameters():
            if is_floating(t.dtype):
                t.data = t.data.astype(self.dtype)
            if t.grad is not None and is_floating(t.grad.dtype):
                t.grad.data = t.grad.data.astype(self.dtype)
        for t in model.buffers():
            if is_floating(t.dtype):
                t.data = t.data.astype(self.dtype)

    def forward_loss(self, model, loss_fn, inputs, targets):
        if isinstance(inputs, Tensor) and is_floating(inputs.dtype):
            inputs = inputs.astype(self.dtype)
        outputs = model(inputs)
        if isinstance(outputs, Tensor) and is_floating(outputs.dtype):
            outputs = outputs.astype(np.float32)  # the loss's softmax and logs in float32
        return loss_fn(outputs, targets)


def online_softmax_update(top, total, acc, scores, values, xp):
    new_top = xp.maximum(top, scores.max(axis=-1))
    # a row with nothing allowed so far: subtract 0, not -inf (-inf - -inf is nan)
    shift = xp.where(new_top == -xp.inf, 0, new_top)
    factor = xp.exp(top - shift)
    weights = xp.exp(scores - shift[..., None])
    new_total = factor * total + weights.sum(axis=-1)
    new_acc = factor[..., None] * acc + weights @ values
    return new_top, new_total, new_acc


def flash_forward(query, key, value, tiles):
    xp = tiles.xp
    dtype = query.dtype
    leading = query.shape[:-2]
    out = xp.zeros((*leading, query.shape[-2], value.shape[-1]), dtype=dtype)
    lse = xp.zeros((*leading, query.shape[-2]), dtype=dtype)
    for rows in tiles.query_blocks():
        q = query[..., rows, :]
        count = rows.stop - rows.start
        top = xp.full((*leading, count), -xp.inf, dtype=dtype)
        total = xp.zeros((*leading, count), dtype=dtype)
        acc = xp.zeros((*leading, count, value.shape[-1]), dtype=dtype)
        for columns, mask in tiles.key_blocks(rows):
            k = key[..., columns, :]
            v = value[..., columns, :]
            scores = q @ xp.swapaxes(k, -1, -2)
            if mask is not None:
                scores = xp.where(mask, scores, -xp.inf)
            top, total, acc = online_softmax_update(top, total, acc, scores, v, xp)
        empty = total == 0  # rows with nothing allowed: output 0, lse +inf
        safe_total = xp.where(empty, 1, total)
        out[..., rows, :] = acc / safe_total[..., None]
        lse[..., rows] = xp.where(empty, xp.inf, top + xp.log(safe_total))
    return out, lse


def flash_backward(query, key, value, out, lse, grad, tiles):
    xp = tiles.xp
    d_query = xp.zeros(query.shape, dtype=query.dtype)
    d_key = xp.zeros(key.shape, dtype=key.dtype)
    d_value = xp.zeros(value.shape, dtype=value.dtype)
    delta = (grad * out).sum(axis=-1)  # D_i = sum_e dO_ie O_ie, one number per row
    for rows in tiles.query_blocks():
        q = query[..., rows, :]
        g = grad[..., rows, :]
        row_lse = lse[..., rows, None]
        row_delta = delta[..., rows, None]
        for columns, mask in tiles.key_blocks(rows):
            k = key[..., columns, :]
            v = value[..., columns, :]
            scores = q @ xp.swapaxes(k, -1, -2)
            if mask is not None:
                scores = xp.where(mask, scores, -xp.inf)
            p = xp.exp(scores - row_lse)  # the tile's weights, recomputed
            d_value[..., columns, :] += xp.swapaxes(p, -1, -2) @ g
            ds = p * (g @ xp.swapaxes(v, -1, -2) - row_delta)
            d_query[..., rows, :] += ds @ k
            d_key[..., columns, :] += xp.swapaxes(ds, -1, -2) @ q
    return d_query, d_key, d_value
