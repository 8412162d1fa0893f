"""Graded checks of Module 15 (transformers): the pre-LayerNorm block, the tied output layer,
GPT-2's initialisation, the GPT forward pass and its loss, next-token probabilities with a
temperature and top-k, and attention with a KV cache (cached logits equal the uncached ones).

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 15``). The block and the model are compared with the same computation
written here from the student's own sub-layers (Module 14's attention, the given MLP, the
LayerNorms); probabilities with a plain NumPy reference.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck

RNG = np.random.default_rng(15)


def float64_model(student, seed=0, **sizes):
    """A float64 GPT in evaluation mode, its LayerNorms and biases made random so that every term shows."""
    config = dict(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=8)
    config.update(sizes)
    tt.manual_seed(seed)
    model = student.GPT(student.GPTConfig(**config)).to(dtype="float64")
    rng = np.random.default_rng(seed)
    for name, parameter in model.named_parameters():
        if name.startswith("h.") or name.startswith("ln_f"):
            parameter.data[...] = rng.standard_normal(parameter.shape) * (0.3 if parameter.ndim == 2 else 0.5) + \
                (1.0 if "ln" in name and name.endswith("weight") else 0.0)
    return model


def reference_logits(model, idx):
    """wte[idx] + wpe[0..T-1], the blocks, ln_f, then the token table as the output layer."""
    with tt.no_grad():
        x = model.wte(idx) + model.wpe.weight[:idx.shape[1]]
        for block in model.h:
            x = block(x)
        return (model.ln_f(x) @ model.wte.weight.T).numpy()


def ref_probs(z, temperature, top_k):
    z = np.asarray(z, dtype=np.float64)
    out = np.zeros_like(z)
    for b, row in enumerate(z):
        if temperature == 0:
            out[b, int(np.argmax(row))] = 1.0
            continue
        keep = np.ones(row.shape, bool) if top_k is None else row >= np.sort(row)[-min(top_k, row.size)]
        e = np.where(keep, np.exp((row - row[keep].max()) / temperature), 0.0)
        out[b] = e / e.sum()
    return out


# -- the block ----------------------------------------------------------------------------------------

@check(points=3, hint="Block.forward: pre-LN with residuals: x = x + self.attn(self.ln_1(x), cache=cache), then "
                      "return x + self.mlp(self.ln_2(x)). Normalise each sub-layer's INPUT (not the sum), and ADD its "
                      "output to x (do not replace x)")
def test_block_pre_ln(student):
    model = float64_model(student)
    block = model.h[0]
    x = tt.tensor(RNG.standard_normal((2, 5, 8)), dtype="float64", requires_grad=True)
    with tt.no_grad():
        h = x + block.attn(block.ln_1(x))
        want = h + block.mlp(block.ln_2(h))
        post = block.ln_1(x + block.attn(x))
        post_ln = block.ln_2(post + block.mlp(post))
        got = block(x)
    if np.allclose(got.numpy(), post_ln.numpy()):
        raise AssertionError("Block: got the post-LN order LN(x + attn(x)); expected pre-LN x + attn(ln_1(x))")
    expect_close(got, want, "Block(x) = h + mlp(ln_2(h)) with h = x + attn(ln_1(x))", rtol=1e-10, atol=1e-12)
    expect_gradcheck(lambda x: block(x), [x], "gradcheck of Block in float64")


# -- the model ----------------------------------------------------------------------------------------

@check(points=1, hint="GPT.__init__: end with self.lm_head.weight = self.wte.weight, so both are ONE Parameter")
def test_tied_weights(student):
    config = student.GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)
    model = student.GPT(config)
    expect_equal(model.lm_head.weight is model.wte.weight, True, "model.lm_head.weight is model.wte.weight")
    expect_equal(model.num_parameters(), student.gpt_num_parameters(config),
                 "the number of parameters (the tied matrix counted once)")


@check(points=2, hint="init_weights: normal_(weight, 0.02) for every Linear, Embedding and LearnedPositionalEncoding "
                      "(wte, wpe); every Linear bias that exists set to 0; then each block's attn.c_proj.weight and "
                      "mlp.c_proj.weight with std 0.02 / math.sqrt(2 * n_layer)")
def test_init_scale(student):
    for bias in (True, False):
        tt.manual_seed(1)
        model = student.GPT(student.GPTConfig(vocab_size=400, block_size=300, n_layer=3, n_head=2, n_embd=48,
                                              bias=bias))
        scaled = 0.02 / math.sqrt(6)
        for name, parameter in model.named_parameters():
            values = parameter.numpy()
            if name.startswith("ln") or ".ln_" in name:
                want = 1.0 if name.endswith("weight") else 0.0
                expect_close(values, np.full(values.shape, want), f"{name} (LayerNorms keep their ones and zeros)")
            elif name.endswith("bias"):
                expect_close(values, np.zeros(values.shape), f"{name} (biases start at 0)")
            else:
                std = scaled if name.endswith("c_proj.weight") else 0.02
                if abs(values.mean()) > 0.2 * std or abs(values.std() - std) > 0.05 * std:
                    raise AssertionError(f"{name} (bias={bias}, n_layer=3): expected mean 0 and std {std:.5f}, got "
                                         f"mean {values.mean():.5f} and std {values.std():.5f}")


@check(points=3, hint="GPT.forward: x = self.drop(self.wpe(self.wte(idx), start=past)); logits = "
                      "self.lm_head(self.ln_f(self.run_blocks(x, cache))); with targets return (logits, "
                      "cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))), else the logits",
       after=("test_block_pre_ln", "test_tied_weights"))
def test_forward_and_loss(student):
    model = float64_model(student)
    idx = RNG.integers(0, 11, (3, 7))
    logits = model(tt.tensor(idx))
    expect_close(logits, reference_logits(model, tt.tensor(idx)),
                 "GPT(idx) logits: lm_head(ln_f(blocks(wte[idx] + wpe[0..T-1])))", rtol=1e-9, atol=1e-12)
    targets = RNG.integers(0, 11, (3, 7))
    result = model(tt.tensor(idx), targets=tt.tensor(targets))
    expect_equal(isinstance(result, tuple) and len(result) == 2, True, "GPT(idx, targets) returns (logits, loss)")
    expect_close(result[0], logits.numpy(), "the logits of GPT(idx, targets): (B, T, vocab_size), as without targets",
                 rtol=1e-9, atol=1e-12)
    z = logits.numpy().reshape(-1, 11)
    log_probs = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    want = -log_probs[np.arange(21), targets.reshape(-1)].mean()
    expect_close(result[1].item(), want, "the loss: mean cross-entropy over all B*T = 21 positions", rtol=1e-9)
    params = [model.wte.weight, model.h[1].attn.c_attn.weight]
    expect_gradcheck(lambda a, b: model(tt.tensor(idx), targets=tt.tensor(targets))[1], params,
                     "gradcheck of GPT's loss in wte.weight and h[1].attn.c_attn.weight")
    # dropout after the embeddings: the same random draws as the composition in this order
    train = float64_model(student, dropout=0.3).train()
    tt.manual_seed(3)
    got = train(tt.tensor(idx)).numpy()
    tt.manual_seed(3)
    x = train.run_blocks(train.drop(train.wte(tt.tensor(idx)) + train.wpe.weight[:7]))
    expect_close(got, (train.ln_f(x) @ train.wte.weight.T).numpy(), "GPT(idx) in training mode with dropout=0.3: "
                 "drop(wte[idx] + wpe) first, then the blocks", rtol=1e-9, atol=1e-12)


# -- generation -------------------------------------------------------------------------------------

@check(points=2, hint="next_token_probs: temperature == 0: a one-hot row at argmax (the first maximum); otherwise "
                      "z = logits / temperature, with top_k set every z below the k-th largest of its row to -inf "
                      "(xp.sort(z, axis=-1)[:, -top_k]), then a stable softmax over the last axis; the result on "
                      "the logits' device, in their dtype (xp = logits._backend.xp, Tensor._make(array, "
                      "logits._backend))")
def test_next_token_probs(student):
    z = np.array([[2.0, 1.0, 0.0, -1.0, 0.5], [0.0, 3.0, 3.0, 1.0, 3.0], [-5.0, 7.0, 1.0, 1.0, 6.5]])
    for temperature, top_k in [(1.0, None), (0.5, None), (2.0, None), (1.0, 2), (0.7, 3), (1.0, 1), (1.5, 4),
                               (1.0, 5), (1.0, 9), (0, None), (0, 2)]:
        logits = tt.tensor(z)
        what = f"next_token_probs(logits, temperature={temperature}, top_k={top_k}) for float32 logits {z.tolist()}"
        got = student.next_token_probs(logits, temperature=temperature, top_k=top_k)
        expect_close(got, ref_probs(z, temperature, top_k), what, dtype="float32")
        expect_equal(logits.numpy(), z.astype(np.float32), f"the logits after {what} (they must stay as they were)")
    rows = [[1000.0, 999.0, -1000.0], [-1000.0, -1001.0, -3000.0]]
    expect_close(student.next_token_probs(tt.tensor(rows)), ref_probs(rows, 1.0, None),
                 f"next_token_probs of logits {rows} (subtract each ROW's maximum before exp)")
    for temperature, top_k in [(1.0, None), (0.7, 3), (0, None)]:
        expect_probs_on_the_device(student, z, temperature, top_k)


def expect_probs_on_the_device(student, z, temperature, top_k):
    """next_token_probs of logits on the strict device: there, in float32, the same numbers as on the cpu
    (on a GPU, generate appends the ids drawn from them to a context that lives on the GPU)."""
    what = f"next_token_probs(logits, temperature={temperature}, top_k={top_k}) of float32 logits on the strict device"
    try:
        got = student.next_token_probs(tt.tensor(z, device="strict"), temperature=temperature, top_k=top_k)
    except TypeError as error:
        raise AssertionError(f"{what}: expected its probabilities, got TypeError: {error} (work with "
                             "xp = logits._backend.xp, not NumPy)") from None
    expect_equal(str(got.device), "strict:0", f"the device of {what} (the logits' device: build the result with "
                                              "xp and Tensor._make(array, logits._backend), not on the host)")
    expect_close(got.numpy(), ref_probs(z, temperature, top_k), what, dtype="float32")


@check(points=1, hint="generate draws from next_token_probs: top-k must give the other logits probability 0, and "
                      "temperature 0 must be the argmax", after="test_next_token_probs")
def test_generate_top_k_and_greedy(student):
    model = float64_model(student, vocab_size=30, block_size=16)
    idx = RNG.integers(0, 30, (4, 3))
    tt.manual_seed(0)
    out = model.generate(tt.tensor(idx), 5, temperature=2.0, top_k=3, use_cache=False)
    tokens = out.numpy()
    for t in range(3, 8):
        top = np.argsort(reference_logits(model, tt.tensor(tokens[:, :t]))[:, -1], axis=-1)[:, -3:]
        for b in range(4):
            if tokens[b, t] not in top[b]:
                raise AssertionError(f"generate(top_k=3): expected token {t} of row {b} among the 3 most likely "
                                     f"{sorted(top[b].tolist())}, got {tokens[b, t]}")
    greedy = model.generate(tt.tensor(idx), 4, temperature=0, use_cache=False).numpy()
    for t in range(3, 7):
        expect_equal(greedy[:, t], reference_logits(model, tt.tensor(greedy[:, :t]))[:, -1].argmax(-1),
                     f"generate(temperature=0): token {t} is the argmax of the logits")


@check(points=3, hint="CachedSelfAttention.forward with a cache: q, k, v from c_attn split into heads (B, H, T, D); "
                      "k = concatenate([cache.k, k], axis=2) (same for v) when the cache holds some; store them back "
                      "in cache.k, cache.v; attend with scaled_dot_product_attention(q, k, v, is_causal=True); merge "
                      "the heads, c_proj. And in GPT.forward the positions start at the cache's length BEFORE this "
                      "call (wpe(..., start=cache.length))", after="test_forward_and_loss")
def test_kv_cache(student):
    model = float64_model(student, dropout=0.2).eval()  # evaluation mode: no dropout on either path
    idx = RNG.integers(0, 11, (2, 10))
    full = model(tt.tensor(idx)).numpy()
    cache = student.KVCache(2)
    chunks = [(0, 3), (3, 4), (4, 5), (5, 7), (7, 8), (8, 10)]
    for start, end in chunks:
        got = model(tt.tensor(idx[:, start:end]), cache=cache)
        expect_close(got, full[:, start:end], f"cached logits of positions {start}..{end - 1} after {start} cached "
                     f"positions (the uncached logits of those positions)", rtol=1e-9, atol=1e-12)
        expect_equal(cache.length, end, f"the cache's length after positions {start}..{end - 1}")
    expect_equal(cache.layers[1].v.shape, (2, 2, 10, 4), "the shape of a layer's cached values (B, H, S, D)")
    tt.manual_seed(2)
    cached = model.generate(tt.tensor(idx[:, :2]), 14, top_k=4).numpy()
    tt.manual_seed(2)
    plain = model.generate(tt.tensor(idx[:, :2]), 14, top_k=4, use_cache=False).numpy()
    expect_equal(cached, plain, "generate(..., 14 tokens past block_size=12) with the cache (expected: the tokens "
                                "without it)")
