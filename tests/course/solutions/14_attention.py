"""Module 14 (tokens and attention): a student's solutions, written from the lesson alone."""


def merge(ids, pair, new_id):
    result = []
    skip = False
    for i in range(len(ids)):
        if skip:
            skip = False
            continue
        if i < len(ids) - 1 and (ids[i], ids[i + 1]) == tuple(pair):
            result.append(new_id)
            skip = True
        else:
            result.append(ids[i])
    return result


class BPETokenizer:
    def train(self, text, vocab_size):
        ids = list(text.encode("utf-8"))
        self.merges = {}
        next_id = 256
        while next_id < vocab_size:
            counts = pair_counts(ids)
            if len(counts) == 0:
                break
            best = max(counts, key=counts.get)
            ids = merge(ids, best, next_id)
            self.merges[best] = next_id
            next_id += 1
        return self

    def encode(self, text):
        ids = list(text.encode("utf-8"))
        for pair in self.merges:
            ids = merge(ids, pair, self.merges[pair])
        return ids


class EmbeddingFunction:
    def backward(self, grad):
        dim = self.weight_shape[1]
        grad_weight = self.xp.zeros(self.weight_shape, dtype=grad.dtype)
        self.backend.scatter_add(grad_weight, self.ids.reshape(-1), grad.reshape(-1, dim))
        return (grad_weight,)


def sinusoidal_encoding(length, dim, base=10000.0):
    table = np.zeros((length, dim))
    positions = np.arange(length)
    for i in range(dim // 2):
        angle = positions / base ** (2 * i / dim)
        table[:, 2 * i] = np.sin(angle)
        table[:, 2 * i + 1] = np.cos(angle)
    return table


class MaskedSoftmax:
    def forward(self, scores, *, allowed):
        xp = self.xp
        if allowed is not None:
            scores = xp.where(allowed, scores, -xp.inf)
        row_max = scores.max(axis=-1, keepdims=True)
        row_max = xp.where(xp.isneginf(row_max), 0.0, row_max)
        exps = xp.exp(scores - row_max)
        sums = exps.sum(axis=-1, keepdims=True)
        sums = xp.where(sums == 0, 1.0, sums)
        self.out = exps / sums
        return self.out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    L = query.shape[-2]
    S = key.shape[-2]
    if is_causal:
        xp = query._backend.xp
        rows = xp.arange(L).reshape(L, 1)
        cols = xp.arange(S).reshape(1, S)
        allowed = cols <= rows + (S - L)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    key_t = key.transpose(*range(key.ndim - 2), -1, -2)
    scores = (query @ key_t) * scale
    weights = MaskedSoftmax.apply(scores, allowed=allowed)
    if dropout_p > 0:
        weights = dropout(weights, dropout_p)
    return weights @ value


class CausalSelfAttention:
    def forward(self, x):
        B, T, C = x.shape
        H, D = self.num_heads, self.head_dim
        qkv = self.c_attn(x)

        def heads(part):
            return part.reshape(B, T, H, D).transpose(0, 2, 1, 3)

        q = heads(qkv[:, :, 0:C])
        k = heads(qkv[:, :, C:2 * C])
        v = heads(qkv[:, :, 2 * C:3 * C])
        p = self.dropout if self.training else 0.0
        y = scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
        y = self.c_proj(y)
        return self.resid_dropout(y)
