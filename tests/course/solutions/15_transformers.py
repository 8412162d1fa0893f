"""Module 15 (transformers): a student's solutions, written from the lesson alone."""


class Block:
    def forward(self, x, cache=None):
        a = self.attn(self.ln_1(x), cache=cache)
        x = x + a
        m = self.mlp(self.ln_2(x))
        x = x + m
        return x


class CachedSelfAttention:
    def forward(self, x, cache=None):
        B, T, C = x.shape
        H, D = self.num_heads, self.head_dim
        qkv = self.c_attn(x)

        def heads(part):
            return part.reshape(B, T, H, D).transpose(0, 2, 1, 3)

        q = heads(qkv[:, :, 0:C])
        k = heads(qkv[:, :, C:2 * C])
        v = heads(qkv[:, :, 2 * C:3 * C])
        if cache.length > 0:
            k = concatenate([cache.k, k], axis=2)
            v = concatenate([cache.v, v], axis=2)
        cache.k = k
        cache.v = v
        y = scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
        return self.c_proj(y)


class GPT:
    def __init__(self, config):
        self.lm_head.weight = self.wte.weight

    def init_weights(self):
        for m in self.modules():
            if isinstance(m, Linear):
                normal_(m.weight, 0.02)
                if m.bias is not None:
                    m.bias.data[...] = 0.0
        normal_(self.wte.weight, 0.02)
        normal_(self.wpe.weight, 0.02)
        std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.h:
            normal_(block.attn.c_proj.weight, std)
            normal_(block.mlp.c_proj.weight, std)

    def forward(self, idx, targets=None, cache=None):
        tok = self.wte(idx)
        x = self.wpe(tok, start=past)
        x = self.drop(x)
        x = self.run_blocks(x, cache)
        x = self.ln_f(x)
        logits = self.lm_head(x)
        if targets is None:
            return logits
        B, T, V = logits.shape
        loss = cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))
        return logits, loss


def next_token_probs(logits, temperature=1.0, top_k=None):
    if temperature == 0:
        best = logits.argmax(axis=-1).numpy()
        probs = np.zeros(logits.shape)
        probs[np.arange(logits.shape[0]), best] = 1.0
        return Tensor(probs, dtype=logits.dtype, device=logits.device)
    z = logits / temperature
    if top_k is not None:
        xp = logits._backend.xp
        values = xp.sort(z.data, axis=-1)
        kth = values[:, z.shape[-1] - top_k]
        z = Tensor._make(xp.where(z.data < kth[:, None], -xp.inf, z.data), logits._backend)
    return z.softmax(axis=-1)
