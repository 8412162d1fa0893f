"""Graded checks of Module 17 (precision and attention memory): the rounding of float32 to
bfloat16 and the widening back, the ``HalfPrecision`` plugin of ``"16-true"`` and
``"bf16-true"``, and FlashAttention's online softmax, tiled forward pass and backward pass.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 17``). The roundings are compared with ml_dtypes' own cast bit for bit;
the plugin through a stand-in trainer and through ``tt.Trainer``; the attention with a plain
NumPy computation of the whole (L, S) matrix, on tiles that do not divide the lengths.
"""
import tracemalloc

import ml_dtypes
import numpy as np

import tinytrain as tt
from tinytrain import nn
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck, expect_raises

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(17)


def bits(patterns) -> np.ndarray:
    return np.array(patterns, dtype=np.uint32).view(np.float32)


def ml_dtypes_bits(x) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(x, np.float32).astype(BF16).view(np.uint16)


def rounded_bits(student, x, what) -> np.ndarray:
    out = student.float32_to_bfloat16(x)
    expect_equal((getattr(out, "dtype", None), getattr(out, "shape", None)), (BF16, x.shape),
                 f"(dtype, shape) of float32_to_bfloat16 of {what}")
    return out.view(np.uint16)


# -- bfloat16's bits ------------------------------------------------------------------------------------

@check(points=2, hint="float32_to_bfloat16: b = x.view(np.uint32); the 16 bits are (b + 0x7FFF + ((b >> 16) & 1)) >> 16 "
                      "(round to nearest, ties to the even neighbour), as uint16 viewed as bfloat16, shape kept")
def test_float32_to_bfloat16_rounds_to_nearest_even(student):
    cases = {"1/3 (0x3EAAAAAB, rounds up)": [0x3EAAAAAB], "-1/3": [0xBEAAAAAB],
             "ties (exactly half a step) to even": [0x3F808000, 0x3F818000, 0x00008000, 0x00018000, 0xBF818000],
             "below and above half a step": [0x3F807FFF, 0x3F808001],
             "a carry into the exponent, the largest numbers to infinity": [0x3FFF8000, 0x7F7FFFFF, 0xFF7F8000],
             "zeros, subnormals and infinities": [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x7F800000,
                                                  0xFF800000]}
    for what, patterns in cases.items():
        x = bits(patterns)
        expect_equal(rounded_bits(student, x, what), ml_dtypes_bits(x), f"bits of float32_to_bfloat16 of {what}")
    x = RNG.standard_normal((40, 50)).astype(np.float32) * np.float32(10.0) ** RNG.integers(-40, 38, (40, 50))
    before = x.copy()
    expect_equal(rounded_bits(student, x, "a (40, 50) array"), ml_dtypes_bits(x),
                 "bits of float32_to_bfloat16 of a (40, 50) array of all magnitudes")
    expect_equal(x, before, "the input after float32_to_bfloat16 (it must not change)")
    random = RNG.integers(0, 2**32, 100_000, dtype=np.uint32).view(np.float32)
    random = random[~np.isnan(random)]
    expect_equal(rounded_bits(student, random, "random bit patterns"), ml_dtypes_bits(random),
                 "bits of float32_to_bfloat16 of 100,000 random float32 bit patterns (NaNs left out)")


@check(points=1, hint="float32_to_bfloat16: a NaN must stay a NaN: the quiet NaN 0x7FC0 with the input's sign bit "
                      "(0xFFC0 for a negative NaN), whatever its payload; np.where(np.isnan(x), ..., ...)",
       after="test_float32_to_bfloat16_rounds_to_nearest_even")
def test_float32_to_bfloat16_keeps_nan_a_nan(student):
    x = bits([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000, 0xFFC00000, 0xFF800001, 0xFFFFFFFF, 0xFFFF8000])
    expect_equal(rounded_bits(student, x, "NaNs"), np.array([0x7FC0] * 4 + [0xFFC0] * 4, np.uint16),
                 "bits of float32_to_bfloat16 of NaNs with payloads (4 positive, 4 negative)")


@check(points=1, hint="bfloat16_to_float32: (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32): the 16 bits "
                      "on top, zeros below")
def test_bfloat16_to_float32_is_exact(student):
    every = np.arange(2**16, dtype=np.uint16).view(BF16)
    wide = student.bfloat16_to_float32(every)
    expect_equal(getattr(wide, "dtype", None), np.dtype(np.float32), "dtype of bfloat16_to_float32")
    expect_equal(wide.view(np.uint32), np.arange(2**16, dtype=np.uint32) << 16,
                 "bits of bfloat16_to_float32 of every bfloat16 bit pattern")
    grid = every[:12].reshape(3, 4)
    expect_equal(student.bfloat16_to_float32(grid).shape, (3, 4), "shape of bfloat16_to_float32 of a (3, 4) array")


# -- the true precision modes -----------------------------------------------------------------------------

class StandIn:
    """What a plugin's setup reads of a trainer."""

    def __init__(self, model):
        self.model, self.optimizer = model, tt.optim.SGD(model.parameters(), lr=0.1)


def small_model(seed=0):
    tt.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


@check(points=2, hint="HalfPrecision.setup: for every tensor of trainer.model.parameters() + trainer.model.buffers(), "
                      "and its .grad when it has one: if is_floating(t.dtype), t.data = t.data.astype(self.dtype) "
                      "(in place on the same tensor; integer buffers stay)")
def test_half_precision_setup_casts_the_model_in_place(student):
    for precision, dtype in (("bf16-true", BF16), ("16-true", np.dtype(np.float16))):
        model = small_model()
        model[0].weight.grad = tt.ones(6, 4)
        params, values = model.parameters(), [p.numpy() for p in model.parameters()]
        student.HalfPrecision(precision).setup(StandIn(model))
        expect_equal([p is q for p, q in zip(model.parameters(), params)], [True] * len(params),
                     f"{precision}: whether each parameter is the same tensor object after setup (cast in place)")
        expect_equal([str(p.dtype) for p in model.parameters()], [str(dtype)] * len(params),
                     f"{precision}: dtypes of the parameters after setup")
        expect_equal((str(model[0].weight.grad.dtype), model[3].weight.grad),
                     (str(dtype), None), f"{precision}: (dtype of the first layer's gradient of ones, the last "
                                         "layer's gradient, which does not exist)")
        expect_equal([str(b.dtype) for b in model[1].buffers()], [str(dtype), str(dtype), "int64"],
                     f"{precision}: dtypes of BatchNorm's running_mean, running_var and num_batches_tracked")
        expect_close(model[0].weight.numpy().astype(np.float32), values[0].astype(dtype).astype(np.float32),
                     f"{precision}: the first weight's values (rounded)", rtol=0, atol=0)


@check(points=2, hint="HalfPrecision.forward_loss: a floating-point Tensor input -> inputs.astype(self.dtype); "
                      "outputs = model(inputs); a floating-point Tensor output -> outputs.astype(np.float32); return "
                      "loss_fn(outputs, targets). Anything that is not a Tensor (a list of ids, a tuple of outputs) "
                      "passes as it is", after="test_half_precision_setup_casts_the_model_in_place")
def test_half_precision_forward_loss(student):
    model = small_model(1)
    plugin = student.HalfPrecision("bf16-true")
    plugin.setup(StandIn(model))
    x, labels = tt.tensor(RNG.standard_normal((5, 4))), tt.tensor([0, 1, 2, 1, 0])
    seen = []
    loss = plugin.forward_loss(lambda t: seen.append(t.dtype) or model(t), nn.CrossEntropyLoss(), x, labels)
    expect_equal((str(seen[0]), str(loss.dtype)), ("bfloat16", "float32"),
                 "(dtype of the input the model got, dtype of the loss) for a float32 input")
    with tt.no_grad():
        expected = nn.functional.cross_entropy(model(x.astype("bfloat16")).astype("float32"), labels).item()
    expect_close(loss.item(), expected, "the loss: loss_fn(model(x in bfloat16) in float32, targets)", rtol=1e-6)
    loss.backward()
    expect_equal(str(model[0].weight.grad.dtype), "bfloat16", "dtype of a weight's gradient after backward")
    ids = tt.tensor([[1, 2, 3]])
    gpt = nn.GPT(nn.GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))
    plugin.setup(StandIn(gpt))
    got = []
    plugin.forward_loss(lambda t: got.append(t.dtype) or gpt(t), lambda out, y: out.sum(), ids, None)
    expect_equal(str(got[0]), "int64", "dtype of token ids (int64) as the model got them")
    pair = plugin.forward_loss(lambda t: (gpt(t), "extra"), lambda out, y: out[0].sum() if out[1] == "extra" else None,
                               [[1, 2, 3]], None)
    expect_equal(str(getattr(pair, "dtype", None)), "bfloat16",
                 "dtype of the loss when the input is a list of ids and the output a tuple (both pass as they are)")


@check(points=1, hint="Trainer(precision='bf16-true') uses HalfPrecision: setup casts the model, forward_loss gives a "
                      "float32 loss; after a step every parameter, gradient and momentum buffer is bfloat16",
       after="test_half_precision_forward_loss")
def test_a_bf16_true_trainer_keeps_everything_in_bfloat16(student):
    model = small_model(2)
    optimizer = tt.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = tt.Trainer(model, optimizer, nn.CrossEntropyLoss(), precision="bf16-true")
    data = tt.data.TensorDataset(RNG.standard_normal((32, 4)).astype(np.float32), RNG.integers(0, 3, 32))
    losses = [trainer.train_epoch(tt.data.DataLoader(data, batch_size=8)) for _ in range(3)]
    expect_equal(sorted({str(t.dtype) for p in model.parameters() for t in (p, p.grad)}
                        | {str(b.dtype) for state in optimizer.state for b in state.values()}), ["bfloat16"],
                 "dtypes of the parameters, their gradients and the momentum buffers after three epochs")
    expect_equal(bool(np.isfinite(losses).all() and losses[-1] < losses[0]), True,
                 f"whether the loss fell and stayed finite over three epochs ({losses})")


# -- FlashAttention ---------------------------------------------------------------------------------------

@check(points=2, hint="online_softmax_update: new_top = xp.maximum(top, scores.max(axis=-1)); shift = new_top, 0 where "
                      "it is -inf; rescale = exp(top - shift); return new_top, rescale * total + sum of exp(scores - "
                      "shift[..., None]), rescale[..., None] * acc + exp(scores - shift[..., None]) @ values")
def test_online_softmax_update(student):
    scores = RNG.standard_normal((2, 3, 4))
    scores[0, 1] = -np.inf  # a row with nothing allowed in this tile
    scores[1, 2, :2] = -np.inf
    values = RNG.standard_normal((2, 4, 5))
    top, total, acc = np.full((2, 3), -np.inf), np.zeros((2, 3)), np.zeros((2, 3, 5))
    old = (top.copy(), total.copy(), acc.copy())
    top, total, acc = student.online_softmax_update(top, total, acc, scores, values, np)
    expect_equal((top.shape, total.shape, acc.shape), ((2, 3), (2, 3), (2, 3, 5)), "shapes of (top, total, acc)")
    expect_close(top, scores.max(axis=-1), "top after the first tile: each row's largest score")
    weights = np.exp(scores - np.where(top == -np.inf, 0, top)[..., None])
    expect_close(total, weights.sum(axis=-1), "total after the first tile: sum of exp(score - top)")
    expect_close(acc, weights @ values, "acc after the first tile: exp(score - top) @ values")
    expect_equal([a is b for a, b in zip((top, total, acc), old)], [False] * 3, "whether it returned the old arrays")
    more, more_values = RNG.standard_normal((2, 3, 2)) + 1.0, RNG.standard_normal((2, 2, 5))
    more[0, 1] = [-np.inf, 0.5]  # the empty row gets its first allowed key
    top2, total2, acc2 = student.online_softmax_update(top, total, acc, more, more_values, np)
    both = np.concatenate([scores, more], axis=-1)
    both_values = np.concatenate([values, more_values], axis=-2)
    best = both.max(axis=-1)
    w = np.exp(both - best[..., None])
    expect_close(top2, best, "top after a second tile")
    expect_close(total2, w.sum(axis=-1), "total after a second tile: the first tile's rescaled by exp(top - top')")
    expect_close(acc2, w @ both_values, "acc after a second tile: the first tile's rescaled, plus the new products")


def plain_attention(q, k, v, allowed):
    scores = np.where(allowed, q @ np.swapaxes(k, -1, -2), -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = weights.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.where(total == 0, np.inf, np.log(np.where(total == 0, 1, total)) + top[..., 0])
    return weights / np.where(total == 0, 1, total)[..., None] @ v, lse, weights / np.where(total == 0, 1, total)[
        ..., None]


CASES = [  # (L, S, block, mask: "causal" / "boolean" / None)
    (7, 10, 3, "causal"), (10, 7, 4, "causal"), (9, 9, 2, "causal"), (6, 11, 4, "boolean"), (8, 5, 3, None),
    (5, 5, 16, "causal"),
]


def case(student, length, source, block, mask, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 2, length, 3)), rng.standard_normal((2, 2, source, 3)), \
        rng.standard_normal((2, 2, source, 4))
    if mask == "causal":
        allowed, given = np.arange(source) <= np.arange(length)[:, None] + (source - length), None
    elif mask == "boolean":
        given = rng.random((2, 1, length, source)) < 0.5
        given[0, 0, 1] = False  # a query that may attend nothing
        allowed = given
    else:
        allowed, given = np.ones((length, source), bool), None
    tiles = student.Tiles(np, length, source, block, given, mask == "causal")
    return q, k, v, allowed, tiles


@check(points=3, hint="flash_forward: per block of rows: top = -inf, total = 0, acc = 0; per (columns, mask) of "
                      "tiles.key_blocks(rows): scores = q @ swapaxes(key[..., columns, :]), -inf where mask is False "
                      "(mask None: all allowed), online_softmax_update; then out = acc / total and lse = top + "
                      "log(total), a row with total 0 getting out 0 and lse +inf",
       after="test_online_softmax_update")
def test_flash_forward_equals_plain_attention(student):
    for i, (length, source, block, mask) in enumerate(CASES):
        q, k, v, allowed, tiles = case(student, length, source, block, mask, i)
        out, lse = student.flash_forward(q, k, v, tiles)
        expected, expected_lse, _ = plain_attention(q, k, v, allowed)
        what = f"L={length}, S={source}, tiles of {block}, mask {mask}"
        expect_close(out, expected, f"out of flash_forward ({what})", rtol=1e-10, atol=1e-12)
        expect_close(lse, expected_lse, f"lse of flash_forward ({what}; +inf where nothing is allowed)", rtol=1e-10)


class RecordingNumpy:
    """NumPy as ``tiles.xp``, recording the dtype of every floating-point array its functions return."""

    def __init__(self):
        self.dtypes = set()

    def __getattr__(self, name):
        value = getattr(np, name)
        if not callable(value) or isinstance(value, type):
            return value

        def call(*args, **kwargs):
            out = value(*args, **kwargs)
            for array in out if isinstance(out, tuple) else (out,):
                if isinstance(array, np.ndarray) and array.dtype.kind == "f":
                    self.dtypes.add(str(array.dtype))
            return out

        return call


@check(points=1, hint="flash_forward: every array it makes has the inputs' dtype: give xp.zeros and xp.full "
                      "dtype=query.dtype (for float32 inputs, out, lse, top, total and acc are float32)",
       after="test_flash_forward_equals_plain_attention")
def test_flash_forward_keeps_the_inputs_dtype(student):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 9, 4)).astype(np.float32) for _ in range(3))
    xp = RecordingNumpy()
    out, lse = student.flash_forward(q, k, v, student.Tiles(xp, 9, 9, 4, None, True))
    expect_equal((str(out.dtype), str(lse.dtype), sorted(xp.dtypes)), ("float32", "float32", ["float32"]),
                 "(dtype of out, dtype of lse, the floating dtypes of every array tiles.xp made) for float32 inputs")


@check(points=3, hint="flash_backward: delta = (grad * out).sum(-1); per tile recompute the masked scores, p = exp(scores "
                      "- lse[..., rows, None]); d_value[cols] += p^T @ grad[rows]; ds = p * (grad[rows] @ v^T - "
                      "delta[..., rows, None]); d_query[rows] += ds @ k; d_key[cols] += ds^T @ q",
       after="test_flash_forward_equals_plain_attention")
def test_flash_backward_gives_the_attention_gradients(student):
    for i, (length, source, block, mask) in enumerate(CASES):
        q, k, v, allowed, tiles = case(student, length, source, block, mask, 10 + i)
        out, lse = student.flash_forward(q, k, v, tiles)
        grad = np.random.default_rng(i).standard_normal(out.shape)
        d_query, d_key, d_value = student.flash_backward(q, k, v, out, lse, grad, tiles)
        _, _, weights = plain_attention(q, k, v, allowed)
        d_weights = grad @ np.swapaxes(v, -1, -2)
        d_scores = weights * (d_weights - (d_weights * weights).sum(axis=-1, keepdims=True))
        what = f"L={length}, S={source}, tiles of {block}, mask {mask}"
        expect_close(d_value, np.swapaxes(weights, -1, -2) @ grad, f"d_value ({what})", rtol=1e-9, atol=1e-12)
        expect_close(d_query, d_scores @ k, f"d_query ({what})", rtol=1e-9, atol=1e-12)
        expect_close(d_key, np.swapaxes(d_scores, -1, -2) @ q, f"d_key ({what})", rtol=1e-9, atol=1e-12)
    t = [tt.tensor(RNG.standard_normal(shape), dtype="float64", requires_grad=True) for shape in
         ((1, 2, 5, 3), (1, 2, 6, 3), (1, 2, 6, 2))]
    expect_gradcheck(lambda q, k, v: student.flash_attention(q, k, v, is_causal=True, block_size=2), t,
                     "flash_attention(q, k, v, is_causal=True, block_size=2) with L=5, S=6")
    expect_raises(ValueError, lambda: student.flash_attention(*t, dropout_p=0.1), "flash_attention with dropout_p=0.1",
                  mentions=("dropout_p=0.1",))


@check(points=1, hint="flash_forward and flash_backward work tile by tile: never build the (L, S) scores or weights "
                      "(compute q @ k^T for one (rows, columns) tile at a time)",
       after=("test_flash_forward_equals_plain_attention", "test_flash_backward_gives_the_attention_gradients"))
def test_flash_attention_never_makes_the_square_matrix(student):
    length = 768
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((length, 8)) for _ in range(3))
    tiles = student.Tiles(np, length, length, 64, None, True)
    square = length * length * 8
    tracemalloc.start()
    try:  # a stub that raises must not leave memory tracing on for the checks after it
        out, lse = student.flash_forward(q, k, v, tiles)
        forward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        student.flash_backward(q, k, v, out, lse, np.ones_like(out), tiles)
        backward_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    expect_equal((forward_peak < square / 4, backward_peak < square / 4), (True, True),
                 f"whether the peak memory of (flash_forward, flash_backward) at L = S = {length} stays below a "
                 f"quarter of one (L, S) float64 array ({square // 4:,} bytes; peaks {forward_peak:,} and "
                 f"{backward_peak:,})")
