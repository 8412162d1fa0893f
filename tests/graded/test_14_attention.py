"""Graded checks of Module 14 (tokens and attention): byte-pair encoding (merge, train, encode),
the embedding's backward pass, the sinusoidal positional encoding, the masked softmax, scaled
dot-product attention (its scale, the causal mask, boolean masks, dropout) and multi-head causal
self-attention (the heads' channels, the causal mask, both dropouts).

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 14``). Every value is compared with a plain Python or NumPy
reference written here: BPE training and merging one pair at a time, encoding by
minbpe's rule (merge the earliest-learned pair present until none is), attention
one query and one head at a time.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck

RNG = np.random.default_rng(14)


# -- references -------------------------------------------------------------------------------

def ref_merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i:i + 2] == list(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def ref_train(text, vocab_size):
    """The merges, in order: the most frequent adjacent pair, the first to occur among equals."""
    ids, merges = list(text.encode("utf-8")), []
    while 256 + len(merges) < vocab_size and len(ids) > 1:
        counts = {}
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + 1
        best = None
        for pair, count in counts.items():
            if best is None or count > counts[best]:
                best = pair
        merges.append(best)
        ids = ref_merge(ids, best, 255 + len(merges))
    return merges


def ref_encode(text, merges):
    """minbpe's encode: merge the earliest-learned pair that is present, until none is."""
    rank = {pair: k for k, pair in enumerate(merges)}
    ids = list(text.encode("utf-8"))
    while len(ids) > 1:
        present = [pair for pair in zip(ids, ids[1:]) if pair in rank]
        if not present:
            break
        pair = min(present, key=rank.get)
        ids = ref_merge(ids, pair, 256 + rank[pair])
    return ids


def ref_attention(q, k, v, allowed=None, scale=None):
    """One query at a time: softmax over its allowed keys of (q . k) * scale, times the values; zeros when none is."""
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (np.broadcast_to(a, lead + a.shape[-2:]) for a in (q, k, v))
    length, source = q.shape[-2], k.shape[-2]
    allowed = np.ones((length, source), bool) if allowed is None else allowed
    allowed = np.broadcast_to(allowed, lead + (length, source))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = np.zeros(lead + (length, v.shape[-1]))
    for index in np.ndindex(*lead):
        for i in range(length):
            keys = [j for j in range(source) if allowed[index + (i, j)]]
            if not keys:
                continue
            s = np.array([q[index + (i,)] @ k[index + (j,)] * scale for j in keys])
            w = np.exp(s - s.max())
            w /= w.sum()
            out[index + (i,)] = sum(wj * v[index + (j,)] for wj, j in zip(w, keys))
    return out


def scale_mistake(got, q, k, v):
    """How ``got`` got the scale wrong, when it is attention with a scale of 1 or of 1 / E instead of
    1 / sqrt(E); None when it is neither."""
    got, features = np.asarray(got.numpy() if hasattr(got, "numpy") else got), q.shape[-1]
    for scale, mistake in ((1.0, f"the scores are not scaled: scale=None means 1 / sqrt(E) = 1 / sqrt({features})"),
                           (1 / features, f"the scores are divided by E = {features}, not by sqrt(E)")):
        wrong = ref_attention(q, k, v, scale=scale)
        if got.shape == wrong.shape and np.allclose(got, wrong, rtol=1e-9, atol=1e-12):
            return mistake
    return None


def causal(length, source):
    return np.array([[j <= i + source - length for j in range(source)] for i in range(length)])


def ref_masked_softmax(scores, allowed):
    allowed = np.broadcast_to(allowed, scores.shape) & (scores > -np.inf)
    out = np.zeros(scores.shape)
    for index in np.ndindex(*scores.shape[:-1]):
        row = allowed[index]
        if row.any():
            s = scores[index][row]
            w = np.exp(s - s.max())
            out[index + (row,)] = w / w.sum()
    return out


def ref_self_attention(x, layer, keep_weights=None, keep_out=None):
    """GPT-2's layer by hand, head by head: channels [hD, (h+1)D) of q, k and v are head h's."""
    w_attn, b_attn = layer.c_attn.weight.numpy(), layer.c_attn.bias
    w_proj, b_proj = layer.c_proj.weight.numpy(), layer.c_proj.bias
    qkv = x @ w_attn.T + (0 if b_attn is None else b_attn.numpy())
    batch, length, channels = x.shape
    heads, size = layer.num_heads, channels // layer.num_heads
    y = np.zeros(x.shape)
    for h in range(heads):
        q, k, v = (qkv[..., part * channels + h * size: part * channels + (h + 1) * size] for part in range(3))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(size) + np.where(causal(length, length), 0.0, -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        if keep_weights is not None:
            w = w * keep_weights[:, h]
        y[..., h * size:(h + 1) * size] = w @ v
    out = y @ w_proj.T + (0 if b_proj is None else b_proj.numpy())
    return out if keep_out is None else out * keep_out


def t64(array, requires_grad=False):
    return tt.tensor(np.asarray(array, dtype=np.float64), dtype="float64", requires_grad=requires_grad)


def dropout_keep(shape, p, seed):
    """The inverted-dropout factors that dropout(x, p) draws after tt.manual_seed(seed), in order, per shape."""
    tt.manual_seed(seed)
    cpu = tt.get_backend("cpu")
    return [(cpu.random_uniform(s) >= p).astype(np.float64) / (1 - p) for s in shape]


# -- byte-pair encoding ------------------------------------------------------------------------------

@check(points=2, hint="merge: one pass from the left over a NEW list; where ids[i], ids[i + 1] equal pair[0], pair[1] "
                      "append new_id and move on by 2, otherwise append ids[i] and move on by 1 (mind the last id: "
                      "it has no neighbour)")
def test_merge(student):
    a, b, c, d = map(ord, "abcd")
    for ids, pair, new_id in [([a, a, a, b, d, a, a, a, b, a, c], (a, a), 256), ([5, 5, 5], (5, 5), 9),
                              ([5, 5, 5, 5], (5, 5), 9), ([1, 2, 3, 1, 2], (1, 2), 7), ([2, 1, 2], (1, 2), 7),
                              ([3, 1], (1, 2), 7), ([1, 3, 2], (1, 2), 7), ([2, 1], (1, 2), 7), ([], (1, 2), 7),
                              ([4], (4, 4), 8), ([256, 97, 98], (256, 97), 300)]:
        given = list(ids)
        merged = student.merge(given, pair, new_id)
        expect_equal(merged, ref_merge(ids, pair, new_id), f"merge({ids}, {pair}, {new_id})")
        expect_equal(given, ids, f"the list given to merge({ids}, {pair}, {new_id}) afterwards (merge must not change it)")
        expect_equal(merged is given, False, f"whether merge({ids}, {pair}, {new_id}) returned the list it was given "
                     "(it returns a new list, also when nothing merges: appending to the result must not change ids)")


@check(points=2, hint="train: ids = list(text.encode('utf-8')); for each new id 256, 257, ... up to vocab_size - 1: "
                      "count the pairs, take the most frequent (max(counts, key=counts.get)), merge it, record "
                      "merges[pair] = new_id; return self", after="test_merge")
def test_bpe_train_worked_example(student):
    a, b = ord("a"), ord("b")
    tokenizer = student.BPETokenizer()
    expect_equal(tokenizer.train("aaabdaaabac", 259) is tokenizer, True, "train(...) returns the tokenizer itself")
    expect_equal(list(tokenizer.merges.items()), [((a, a), 256), ((256, a), 257), ((257, b), 258)],
                 "the merges (pair, new id) learned from 'aaabdaaabac' with vocab_size=259, in order")
    expect_equal(tokenizer.vocab_size, 259, "vocab_size after train(..., 259)")


@check(points=3, hint="train: among equally frequent pairs the one that occurs FIRST wins (max over pair_counts, "
                      "which lists pairs in order of first occurrence); stop early when no pair is left; learn exactly "
                      "vocab_size - 256 merges otherwise; training again replaces the old merges",
       after="test_bpe_train_worked_example")
def test_bpe_train_rules(student):
    texts = [("abcdabcdcd", 262), ("xyzzyxyzzy" * 3, 270), ("the cat sat on the mat; the hat", 280),
             ("naïve café, déjà vu", 275), ("ba ab ba ab", 258), ("ab", 300), ("a", 260), ("", 256), ("hello", 256),
             ("zz" + "ab" * 3 + "zz" * 3, 258)]
    for text, vocab_size in texts:
        got = list(student.BPETokenizer().train(text, vocab_size).merges.items())
        expected = [(pair, 256 + k) for k, pair in enumerate(ref_train(text, vocab_size))]
        expect_equal(got, expected, f"the merges learned from {text!r} with vocab_size={vocab_size}")
    tokenizer = student.BPETokenizer().train("abababab", 260)
    tokenizer.train("xyxy", 257)
    expect_equal(tokenizer.merges, {(ord("x"), ord("y")): 256}, "the merges after training on 'abababab' and then "
                                                                 "again on 'xyxy' with vocab_size=257 (replaced)")
    tokenizer.train("x", 300)
    expect_equal((tokenizer.merges, tokenizer.vocab_size), ({}, 256), "(merges, vocab_size) after training again on "
                 "'x', which has no pair at all (the old merges are replaced by none)")


@check(points=2, hint="encode: ids = list(text.encode('utf-8')), then for pair, new_id in self.merges.items() (the "
                      "order learned): ids = merge(ids, pair, new_id)", after="test_merge")
def test_bpe_encode(student):
    a, b, c = map(ord, "abc")
    tokenizer = student.BPETokenizer()
    tokenizer.load_state_dict({"kind": "bpe", "merges": [[b, c], [a, b]]})
    expect_equal(tokenizer.encode("abc"), [a, 256], "encode('abc') with the merges b c -> 256, then a b -> 257 "
                                                    "(applied in the order learned)")
    tokenizer.load_state_dict({"kind": "bpe", "merges": [[a, b], [b, c], [256, c]]})
    expect_equal(tokenizer.encode("abcbc"), [258, 257], "encode('abcbc') with the merges a b -> 256, b c -> 257, "
                                                        "256 c -> 258")
    expect_equal(tokenizer.encode(""), [], "encode('')")
    corpus = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
    merges = ref_train(corpus, 300)
    tokenizer.load_state_dict({"kind": "bpe", "merges": [list(pair) for pair in merges]})
    for text in ("to be or not to be", "the question of the mind", "naïve – ünïcode", "z"):
        ids = tokenizer.encode(text)
        expect_equal(ids, ref_encode(text, merges), f"encode({text!r}) with 44 merges learned from Hamlet's line")
        expect_equal(tokenizer.decode(ids), text, f"decode(encode({text!r}))")


# -- embeddings and positions ---------------------------------------------------------------------------

@check(points=2, hint="EmbeddingFunction.backward: zeros of the weight's shape (self.weight_shape) in grad's dtype, "
                      "then self.backend.scatter_add(zeros, self.ids, grad): repeated ids must ADD their gradients "
                      "(zeros[ids] += grad keeps only one of them)")
def test_embedding_backward(student):
    weight = np.arange(12.0).reshape(4, 3)
    for ids in ([[1, 3, 1], [1, 0, 0]], [2, 2, 2, 2], [[[0]], [[3]]], [1]):
        ids = np.array(ids)
        upstream = RNG.standard_normal(ids.shape + (3,))
        w = tt.tensor(weight, requires_grad=True)
        out = student.EmbeddingFunction.apply(w, ids=tt.tensor(ids).data)
        expect_close(out, weight[ids], f"EmbeddingFunction forward for ids {ids.tolist()}")
        out.backward(tt.tensor(upstream, dtype="float32"))
        expected = np.zeros((4, 3))
        for position in np.ndindex(*ids.shape):
            expected[ids[position]] += upstream[position]
        expect_close(w.grad, expected.astype(np.float32), f"the weight's gradient for ids {ids.tolist()} (each row "
                     f"the sum over the positions of its id)", rtol=1e-5, atol=1e-6, dtype="float32")
    node = student.EmbeddingFunction.apply(tt.tensor(weight, requires_grad=True), ids=tt.tensor([0, 2]).data)._ctx
    grads = node.backward(tt.ones(2, 3, dtype="float32").data)
    expect_equal(str(grads[0].dtype), "float32", "the dtype of the gradient EmbeddingFunction.backward returns for a "
                                                 "float32 grad (grad's dtype)")
    for dtype in ("float64", "float16"):
        node = student.EmbeddingFunction.apply(tt.tensor(weight, dtype=dtype, requires_grad=True),
                                               ids=tt.tensor([0, 2, 0]).data)._ctx
        upstream = np.full((3, 3), 0.1 + 1e-12, dtype=dtype)
        grads = node.backward(upstream)
        expect_equal((str(grads[0].dtype), grads[0][0].tolist()), (dtype, (2 * upstream[0]).tolist()),
                     f"(dtype, row 0) of the gradient EmbeddingFunction.backward returns for a {dtype} grad of "
                     f"0.1 + 1e-12 everywhere and ids [0, 2, 0] (zeros in grad's dtype)")
    grads = {}
    for device in ("cpu", "strict"):
        tt.manual_seed(0)
        table = student.Embedding(5, 2).to(device)
        try:
            (table(tt.tensor([[4, 4, 0]], device=device)) * tt.tensor([[[1.0, 2.0]] * 3], device=device)).sum().backward()
        except TypeError as error:
            raise AssertionError(f"Embedding(5, 2) on the {device!r} device, forward and backward: expected the "
                                 f"weight's gradient, got TypeError: {error} (make the zeros with self.xp)") from None
        grads[device] = table.weight.grad.numpy()
    expect_equal(grads["strict"], grads["cpu"], "the weight's gradient of Embedding(5, 2) on the strict device "
                 "(against the cpu's)")
    layer = student.Embedding(5, 2).to(dtype="float64")
    expect_gradcheck(lambda w: layer(tt.tensor([[4, 4, 0], [2, 4, 1]])), [layer.weight],
                     "Embedding(5, 2) in float64 for ids [[4, 4, 0], [2, 4, 1]]")


@check(points=2, hint="sinusoidal_encoding: angles[p, i] = p / base ** (2i / dim) for p = 0 .. length - 1 and "
                      "i = 0 .. dim/2 - 1; sin in the even columns 0, 2, 4, ..., cos in the odd ones; float64 (length, "
                      "dim); position 0 is [0, 1, 0, 1, ...]")
def test_sinusoidal_encoding(student):
    for length, dim, base in [(50, 8, 10000.0), (7, 2, 10000.0), (3, 16, 10000.0), (6, 6, 100.0), (0, 4, 10000.0)]:
        expected = np.zeros((length, dim))
        for p in range(length):
            for i in range(dim // 2):
                expected[p, 2 * i] = math.sin(p / base ** (2 * i / dim))
                expected[p, 2 * i + 1] = math.cos(p / base ** (2 * i / dim))
        expect_close(student.sinusoidal_encoding(length, dim, base=base), expected,
                     f"sinusoidal_encoding({length}, {dim}, base={base})", rtol=1e-9, atol=1e-12, dtype="float64")


# -- attention ------------------------------------------------------------------------------------------

@check(points=2, hint="MaskedSoftmax.forward: scores = where(allowed, scores, -inf) (unless allowed is None); "
                      "m = row max (keepdims), 0 where it is -inf; e = exp(scores - m); out = e / (row sum, 1 where "
                      "it is 0); save it as self.out -- a row with nothing allowed is all 0, never nan; new arrays "
                      "in the scores' dtype (the scores stay as they were)")
def test_masked_softmax(student):
    scores = RNG.standard_normal((2, 3, 4, 5)) * 3
    scores[0, 0, 0] = [1000.0, -1000.0, 999.0, 0.0, 5.0]
    scores[1, 2, 3, 1] = -np.inf
    masks = {"a (4, 5) mask": RNG.random((4, 5)) < 0.6, "a (2, 3, 4, 5) mask": RNG.random((2, 3, 4, 5)) < 0.5,
             "no mask (None)": None}
    masks["a (4, 5) mask"][2] = False  # a row with nothing allowed
    masks["a (4, 5) mask"][0] = True
    for name, allowed in masks.items():
        x = t64(scores, requires_grad=True)
        out = student.MaskedSoftmax.apply(x, allowed=allowed)
        expected = ref_masked_softmax(scores, True if allowed is None else allowed)
        expect_close(out, expected, f"MaskedSoftmax of (2, 3, 4, 5) scores with {name}", rtol=1e-9, atol=1e-12)
        expect_equal(x.numpy(), scores, f"the scores after MaskedSoftmax with {name} (forward must not write into "
                                        "its input: another operation may have saved it)")
        upstream = RNG.standard_normal(scores.shape)
        out.backward(t64(upstream))
        expected_grad = expected * (upstream - (upstream * expected).sum(axis=-1, keepdims=True))
        expect_close(x.grad, expected_grad, f"the gradient of MaskedSoftmax with {name} (the given backward uses "
                                            "self.out)", rtol=1e-9, atol=1e-12)
    out = student.MaskedSoftmax.apply(t64([[0.0, 1.0], [2.0, 3.0]]), allowed=np.array([[False, False], [True, False]]))
    expect_equal(out.numpy(), np.array([[0.0, 0.0], [1.0, 0.0]]), "MaskedSoftmax of [[0, 1], [2, 3]] with "
                                                                  "[[False, False], [True, False]] allowed")
    out = student.MaskedSoftmax.apply(t64([[1000.0, 0.0, 1.0]]), allowed=np.array([[False, True, True]]))
    expect_close(out, [[0.0, 1 / (1 + math.e), math.e / (1 + math.e)]], "MaskedSoftmax of [[1000, 0, 1]] with "
                 "[[False, True, True]] allowed (m is the largest ALLOWED score, 1, not 1000)", rtol=1e-9)
    out = student.MaskedSoftmax.apply(tt.tensor([[-np.inf, -np.inf], [3.0, 1.0]]), allowed=None)
    expect_close(out, [[0.0, 0.0], [1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))]],
                 "MaskedSoftmax of float32 [[-inf, -inf], [3, 1]] without a mask", dtype="float32")
    out = student.MaskedSoftmax.apply(tt.tensor([[2.0, 3.0], [3.0, 1.0]]), allowed=np.array([[True, False]] * 2))
    expect_close(out, [[1.0, 0.0], [1.0, 0.0]], "MaskedSoftmax of float32 scores with a mask", dtype="float32")


@check(points=2, hint="scaled_dot_product_attention: scale = 1 / sqrt(E) when scale is None (E = query.shape[-1]); "
                      "scores = (query * scale) @ key with its last two axes swapped "
                      "(key.transpose(*range(key.ndim - 2), -1, -2)), weights = MaskedSoftmax.apply(scores, "
                      "allowed=allowed), return weights @ value; any number of leading axes, L != S, E != Ev",
       after="test_masked_softmax")
def test_attention_values(student):
    for q_shape, k_shape, v_shape in [((2, 4, 3), (2, 6, 3), (2, 6, 5)), ((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 2)),
                                      ((1, 3, 2, 4), (2, 1, 5, 4), (2, 3, 5, 3)), ((4, 3), (7, 3), (7, 2))]:
        q, k, v = RNG.standard_normal(q_shape), RNG.standard_normal(k_shape), RNG.standard_normal(v_shape)
        got = student.scaled_dot_product_attention(t64(q), t64(k), t64(v))
        what = f"attention of query {q_shape}, key {k_shape}, value {v_shape}"
        try:
            expect_close(got, ref_attention(q, k, v), what, rtol=1e-9, atol=1e-12)
        except AssertionError as failure:
            mistake = scale_mistake(got, q, k, v)
            if mistake is None:
                raise
            raise AssertionError(f"{what}: {mistake} (attention_scale checks the scale); "
                                 f"{str(failure).removeprefix(what + ': ')}") from None
    q, k, v = (RNG.standard_normal((2, 3, 4)) for _ in range(3))
    expect_gradcheck(lambda q, k, v: student.scaled_dot_product_attention(q, k, v),
                     [t64(q, True), t64(k, True), t64(v, True)], "attention of (2, 3, 4) query, key and value")


@check(points=2, hint="scale: 1 / sqrt(E), E = query.shape[-1] (the features of the queries and keys), unless "
                      "scale= is given; the scores are (query * scale) @ key^T", after="test_attention_values")
def test_attention_scale(student):
    q, k, v = RNG.standard_normal((3, 16)) * 2, RNG.standard_normal((5, 16)) * 2, RNG.standard_normal((5, 2))
    expect_close(student.scaled_dot_product_attention(t64(q), t64(k), t64(v)), ref_attention(q, k, v),
                 "attention of query (3, 16), key (5, 16): scores divided by sqrt(16) = 4", rtol=1e-9, atol=1e-12)
    expect_close(student.scaled_dot_product_attention(t64(q), t64(k), t64(v), scale=0.3),
                 ref_attention(q, k, v, scale=0.3), "attention with scale=0.3", rtol=1e-9, atol=1e-12)
    expect_close(student.scaled_dot_product_attention(t64(q), t64(k), t64(v), scale=0.0),
                 np.broadcast_to(v.mean(axis=0), (3, 2)), "attention with scale=0.0 (every score 0: each query "
                 "weighs the 5 values equally; only scale=None means 1 / sqrt(E))", rtol=1e-9, atol=1e-12)


@check(points=3, hint="is_causal: allowed[i, j] = j <= i + (S - L), an (L, S) boolean array (xp.arange(S) <= "
                      "xp.arange(L)[:, None] + (S - L), with xp = query._backend.xp); a query that may attend no key "
                      "gets zeros. The mask goes INTO the softmax (MaskedSoftmax.apply(scores, allowed=allowed)): "
                      "weights zeroed after the softmax no longer sum to 1",
       after=("test_attention_values", "test_masked_softmax"))
def test_attention_causal(student):
    for length, source in [(5, 5), (2, 6), (1, 4), (6, 3)]:
        q, k, v = RNG.standard_normal((2, length, 3)), RNG.standard_normal((2, source, 3)), RNG.standard_normal(
            (2, source, 4))
        got = student.scaled_dot_product_attention(t64(q), t64(k), t64(v), is_causal=True)
        expect_close(got, ref_attention(q, k, v, causal(length, source)),
                     f"causal attention of {length} queries and {source} keys (query i may attend key j <= i + "
                     f"{source - length})", rtol=1e-9, atol=1e-12)
    q, k, v = (RNG.standard_normal((1, 6, 4)) for _ in range(3))
    before = student.scaled_dot_product_attention(t64(q), t64(k), t64(v), is_causal=True).numpy()
    k[:, 4:] += 50.0
    v[:, 4:] -= 50.0
    after = student.scaled_dot_product_attention(t64(q), t64(k), t64(v), is_causal=True).numpy()
    leaked = [i for i in range(4) if not np.allclose(before[0, i], after[0, i])]
    assert not leaked, (f"causal attention: expected the outputs of queries 0-3 to stay the same when only keys and "
                        f"values 4 and 5 change, but those of queries {leaked} changed: the mask lets the future in")
    expect_gradcheck(lambda q, k, v: student.scaled_dot_product_attention(q, k, v, is_causal=True),
                     [t64(q[:, :4], True), t64(k[:, :4], True), t64(v[:, :4], True)], "causal attention of 4 positions")
    on_devices = {}
    for device in ("cpu", "strict"):
        q32, k32, v32 = (tt.tensor(a, device=device) for a in (q[:, :5], k, v))
        try:
            on_devices[device] = student.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
        except TypeError as error:
            raise AssertionError(f"causal attention of float32 tensors on the {device!r} device: expected its output, "
                                 f"got TypeError: {error} (build the mask with query._backend.xp)") from None
    expect_equal(on_devices["strict"].dtype, np.dtype(np.float32), "the dtype of causal attention of float32 tensors")
    expect_close(on_devices["strict"].numpy(), on_devices["cpu"].numpy(), "causal attention on the strict device "
                 "(against the cpu's)", rtol=1e-5, atol=1e-6)


@check(points=2, hint="attn_mask arrives as the boolean array allowed (True where attention is allowed) and goes "
                      "to MaskedSoftmax unchanged; dropout(weights, dropout_p) on the weights after the softmax "
                      "(dropout is the identity for dropout_p=0)",
       after=("test_attention_values", "test_masked_softmax"))
def test_attention_mask_and_dropout(student):
    q, k, v = RNG.standard_normal((2, 4, 3)), RNG.standard_normal((2, 5, 3)), RNG.standard_normal((2, 5, 2))
    mask = RNG.random((4, 5)) < 0.6
    mask[1] = False
    mask[0, 0] = True
    expect_close(student.scaled_dot_product_attention(t64(q), t64(k), t64(v), attn_mask=mask),
                 ref_attention(q, k, v, mask), f"attention with the boolean attn_mask {mask.astype(int).tolist()} "
                                               f"(row 1 allows nothing: zeros)", rtol=1e-9, atol=1e-12)
    tt.manual_seed(3)
    got = student.scaled_dot_product_attention(t64(q), t64(k), t64(v), dropout_p=0.5)
    keep, = dropout_keep([(2, 4, 5)], 0.5, seed=3)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(3)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    expected = (w / w.sum(axis=-1, keepdims=True) * keep) @ v
    expect_close(got, expected, "attention with dropout_p=0.5 after tt.manual_seed(3): dropout(weights, 0.5) of "
                                "the softmax weights, then @ value", rtol=1e-9, atol=1e-12)


@check(points=3, hint="CausalSelfAttention.forward: qkv = self.c_attn(x); q, k, v = channels [0, C), [C, 2C), [2C, 3C); "
                      "each .reshape(B, T, H, D).transpose(0, 2, 1, 3) (NOT reshape(B, H, T, D): that mixes tokens "
                      "into heads); causal attention; back with .transpose(0, 2, 1, 3).reshape(B, T, C); then "
                      "self.resid_dropout(self.c_proj(y))", after="test_attention_causal")
def test_causal_self_attention(student):
    for channels, heads, bias in [(6, 2, True), (12, 3, True), (8, 1, False), (8, 8, True)]:
        tt.manual_seed(channels + heads)
        layer = student.CausalSelfAttention(channels, heads, bias=bias).to(dtype="float64")
        x = RNG.standard_normal((2, 5, channels))
        expect_close(layer(t64(x)), ref_self_attention(x, layer),
                     f"CausalSelfAttention({channels}, num_heads={heads}, bias={bias}) of x {x.shape} (head h owns "
                     f"channels [hD, (h+1)D) of q, k, v and of the output)", rtol=1e-9, atol=1e-12)
    layer = student.CausalSelfAttention(6, 2).to(dtype="float64")
    x = RNG.standard_normal((1, 6, 6))
    before = layer(t64(x)).numpy()
    x[:, 3:] += 10.0
    after = layer(t64(x)).numpy()
    expect_close(after[:, :3], before[:, :3], "CausalSelfAttention's outputs at positions 0-2 after changing the "
                                              "input at positions 3-5 (they must not see the future)", rtol=1e-9)
    expect_gradcheck(lambda x: layer(x), [t64(RNG.standard_normal((2, 3, 6)), True)],
                     "CausalSelfAttention(6, 2) of a (2, 3, 6) input")


@check(points=2, hint="dropout: in training mode pass dropout_p=self.dropout to scaled_dot_product_attention and "
                      "end with self.resid_dropout(...); in evaluation mode dropout_p=0.0 (resid_dropout does "
                      "nothing there)", after="test_causal_self_attention")
def test_causal_self_attention_dropout(student):
    tt.manual_seed(0)
    layer = student.CausalSelfAttention(6, 2, dropout=0.4).to(dtype="float64")
    x = RNG.standard_normal((2, 4, 6))
    tt.manual_seed(7)
    got = layer(t64(x))
    keep_weights, keep_out = dropout_keep([(2, 2, 4, 4), (2, 4, 6)], 0.4, seed=7)
    expect_close(got, ref_self_attention(x, layer, keep_weights, keep_out),
                 "CausalSelfAttention(6, 2, dropout=0.4) in training mode after tt.manual_seed(7): dropout on the "
                 "attention weights, then resid_dropout on the output", rtol=1e-9, atol=1e-12)
    layer.eval()
    expect_close(layer(t64(x)), ref_self_attention(x, layer), "CausalSelfAttention(6, 2, dropout=0.4) in evaluation "
                                                              "mode (no dropout)", rtol=1e-9, atol=1e-12)
