"""Graded checks of Module 05 (normalization): dropout, the fused normalisation's
backward, LayerNorm and BatchNorm (training, running statistics, evaluation).

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 05``). Modules and layers of Module 04 come from the package.
"""
import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck, expect_raises

RNG = np.random.default_rng(0)


@check(points=2, hint="dropout: keep each element whose draw u from x's backend's random_uniform is >= p, scale kept "
                      "ones by 1/(1-p), same mask in backward; return x itself when not training or p == 0")
def test_dropout(student, monkeypatch):
    x = tt.ones(200, 100)
    assert student.dropout(x, 0.5, training=False) is x, "dropout(x, 0.5, training=False) must return x itself"
    assert student.dropout(x, 0.0, training=True) is x, "dropout(x, 0.0) must return x itself"
    out = student.dropout(x, 0.25, training=True).numpy()
    kept = out != 0
    expect_close(kept.mean(), 0.75, "the share of values dropout(ones, 0.25) keeps", atol=0.02)
    expect_close(out[kept], np.full(kept.sum(), 1 / 0.75, dtype=np.float32), "the kept values of dropout(ones, 0.25)",
                 rtol=1e-6)
    w = tt.ones(1000, requires_grad=True)
    dropped = student.dropout(w, 0.5, training=True)
    dropped.sum().backward()
    expect_equal(w.grad.numpy(), dropped.numpy(), "the gradient of dropout(ones, 0.5).sum() (the same mask)")
    rows_alike = (kept == kept[0]).all(axis=1).sum()
    assert rows_alike < 2, (f"dropout(ones(200, 100), 0.25): expected a mask drawn for every element (x.shape), got "
                            f"{rows_alike} of 200 rows with the mask of row 0")
    tt.manual_seed(3)
    first = student.dropout(x, 0.5).numpy()
    tt.manual_seed(3)
    expect_equal(student.dropout(x, 0.5).numpy(), first, "dropout after the same tt.manual_seed (the seeded generator)")
    wide = tt.ones(200, 100, dtype="float64")
    tt.manual_seed(3)
    expected = (wide._backend.random_uniform(wide.shape) >= 0.5) * 2.0  # the generator's float32 draws
    tt.manual_seed(3)
    expect_equal(student.dropout(wide, 0.5).numpy(), expected, "dropout(float64 ones, 0.5) after tt.manual_seed(3): "
                 "the mask of the generator's float32 draws (drawn in float32 whatever x's dtype)")
    layer = student.Dropout(0.5)
    layer.eval()
    expect_equal(layer(x).numpy(), x.numpy(), "Dropout(0.5) in evaluation mode")
    try:
        half = student.dropout(tt.ones(50, 20, dtype="float16"), 0.5)  # what mixed precision feeds it
    except TypeError as error:
        raise AssertionError(f"dropout of a float16 tensor: expected a float16 result, got TypeError: {error} (draw "
                             "the uniforms in float32, the generators' default, then cast the mask)") from None
    expect_equal(half.dtype, np.dtype(np.float16), "the dtype of dropout of a float16 tensor")

    # the rule itself, on known draws: keep where u >= p (u == p is kept)
    draws = np.array([[0.0, 0.25, 0.2499999], [0.5, 0.75, 0.9999999]], dtype=np.float32)
    values = tt.tensor(np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3))

    def known_draws(shape, *args, **kwargs):
        assert tuple(shape) == draws.shape, (f"dropout of a {draws.shape} tensor: expected one draw per element, "
                                             f"random_uniform{draws.shape}, got random_uniform({shape})")
        return draws.copy()

    monkeypatch.setattr(values._backend, "random_uniform", known_draws)
    expected = values.numpy() * (draws >= 0.25) / 0.75
    expect_close(student.dropout(values, 0.25), expected, f"dropout([[1, 2, 3], [4, 5, 6]], 0.25) with the draws "
                 f"u = {draws.tolist()}", rtol=1e-6)


@check(points=2, hint="Normalize.backward: inv_std * (g - mean(g) - x_hat * mean(g * x_hat)), means over axes, "
                      "computed into new arrays (grad and x_hat, the output's own array, stay as they are)")
def test_normalize_backward(student):
    x = tt.tensor(RNG.standard_normal((4, 3, 2)), dtype="float64", requires_grad=True)
    out = student.normalize(x, (0, 2))[0]
    before = out.numpy().copy()
    out.backward(tt.tensor(RNG.standard_normal((4, 3, 2))))
    expect_equal(out.numpy(), before, "normalize's output after its backward (self.x_hat is the output's array: "
                 "backward must leave it unchanged)")
    expect_gradcheck(lambda t: student.normalize(t, (0, 2))[0], [x], "gradcheck of normalize over axes (0, 2)")
    expect_gradcheck(lambda t: student.normalize(t, (1, 2), eps=1e-3)[0] * t, [x],
                     "gradcheck of normalize(x, (1, 2), eps=1e-3) * x")


def _layer_norm_reference(x, weight, bias, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


@check(points=2, hint="LayerNorm.forward: normalise over the last len(normalized_shape) axes with self.eps, then "
                      "* weight + bias; trailing axes other than normalized_shape raise a ValueError naming the shape",
       after="test_normalize_backward")
def test_layer_norm(student):
    layer = student.LayerNorm((3, 4))
    layer.weight.data[...] = RNG.standard_normal((3, 4))
    layer.bias.data[...] = RNG.standard_normal((3, 4))
    weight, bias = layer.weight.numpy(), layer.bias.numpy()
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32) * 5 + 2
    expect_close(layer(tt.tensor(x)), _layer_norm_reference(x, weight, bias, (1, 2), 1e-5),
                 "LayerNorm((3, 4)) of a (2, 3, 4) input", rtol=1e-4, atol=1e-5)
    expect_close(layer(tt.tensor(x[0])), _layer_norm_reference(x[0], weight, bias, (0, 1), 1e-5),
                 "LayerNorm((3, 4)) of one (3, 4) sample", rtol=1e-4, atol=1e-5)
    wide = student.LayerNorm(4, eps=0.5)
    small = RNG.standard_normal((3, 4)).astype(np.float32) * 0.5
    expect_close(wide(tt.tensor(small)), _layer_norm_reference(small, 1.0, 0.0, (1,), 0.5),
                 "LayerNorm(4, eps=0.5) (eps = 0.5 under the square root)", rtol=1e-4, atol=1e-5)
    layer.to(dtype="float64")
    gx = tt.tensor(RNG.standard_normal((2, 3, 4)), dtype="float64", requires_grad=True)
    expect_gradcheck(lambda t, w, b: layer(t), [gx, layer.weight, layer.bias],
                     "gradcheck of LayerNorm((3, 4)) in x, weight and bias")
    expect_raises(ValueError, lambda: layer(tt.zeros(2, 4, 3, dtype="float64")), "LayerNorm((3, 4)) of a (2, 4, 3) input",
                  mentions=("(2, 4, 3)",))
    expect_raises(ValueError, lambda: student.LayerNorm(3)(tt.zeros(2, 1)), "LayerNorm(3) of a (2, 1) input",
                  mentions=("(2, 1)",))
    expect_raises(ValueError, lambda: layer(tt.zeros(4, dtype="float64")), "LayerNorm((3, 4)) of a (4,) input",
                  mentions=("(4,)",))


@check(points=1, hint="_update_running_stats: running = (1 - momentum) * running + momentum * batch for the mean and the "
                      "unbiased variance, in place; num_batches_tracked += 1")
def test_batch_norm_running_stats(student):
    norm = student.BatchNorm1d(3, momentum=0.2)
    arrays = [buffer.data for buffer in (norm.running_mean, norm.running_var, norm.num_batches_tracked)]
    norm._update_running_stats(np.array([1.0, 2.0, 3.0]), np.array([4.0, 4.0, 4.0]))
    expect_close(norm.running_mean, np.array([0.2, 0.4, 0.6], dtype=np.float32),
                 "running_mean after one update with momentum 0.2", rtol=1e-6)
    expect_close(norm.running_var, np.full(3, 0.8 + 0.8, dtype=np.float32),
                 "running_var after one update with momentum 0.2", rtol=1e-6)
    expect_equal(norm.num_batches_tracked.item(), 1, "num_batches_tracked after one update")
    for name, array in zip(("running_mean", "running_var", "num_batches_tracked"), arrays):
        assert getattr(norm, name).data is array, f"{name} must be updated in place: expected the same array, " \
                                                  "got a new one"
    norm._update_running_stats(np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1), np.full((1, 3, 1), 4.0))  # kept dims
    expect_close(norm.running_mean, np.array([0.36, 0.72, 1.08], dtype=np.float32),
                 "running_mean after a second update, with statistics of shape (1, 3, 1)", rtol=1e-6)


@check(points=2, hint="BatchNorm training mode: normalise with the batch's mean and biased variance over every axis but "
                      "1 (with self.eps), update the running stats with the unbiased variance, then * weight + bias per "
                      "channel", after=("test_normalize_backward", "test_batch_norm_running_stats"))
def test_batch_norm_training(student):
    norm = student.BatchNorm1d(3)
    x = RNG.standard_normal((8, 3, 5)).astype(np.float32) * 3 + 1
    out = norm(tt.tensor(x))
    mean = x.mean(axis=(0, 2), keepdims=True)
    var = x.var(axis=(0, 2), keepdims=True)
    expect_close(out, (x - mean) / np.sqrt(var + 1e-5), "BatchNorm1d(3) of an (8, 3, 5) input", rtol=1e-4, atol=1e-4)
    expect_close(norm.running_mean, 0.1 * mean.ravel(), "running_mean after one (8, 3, 5) batch", rtol=1e-4, atol=1e-6)
    unbiased = x.var(axis=(0, 2), ddof=1)
    expect_close(norm.running_var, 0.9 + 0.1 * unbiased, "running_var after one (8, 3, 5) batch", rtol=1e-4)
    expect_equal(norm.num_batches_tracked.item(), 1, "num_batches_tracked after one batch")

    affine = student.BatchNorm1d(3, eps=0.5)
    affine.weight.data[...] = [2.0, -1.0, 0.5]
    affine.bias.data[...] = [0.1, -0.2, 0.3]
    pair = RNG.standard_normal((2, 3)).astype(np.float32)  # two samples: the smallest batch training takes
    expected = ((pair - pair.mean(axis=0)) / np.sqrt(pair.var(axis=0) + 0.5) * np.array([2.0, -1.0, 0.5])
                + np.array([0.1, -0.2, 0.3]))
    expect_close(affine(tt.tensor(pair)), expected, "BatchNorm1d(3, eps=0.5) with weight [2, -1, 0.5] and bias "
                 "[0.1, -0.2, 0.3] of a (2, 3) batch", rtol=1e-4, atol=1e-5)
    expect_close(affine.running_var, 0.9 + 0.1 * pair.var(axis=0, ddof=1), "running_var after a (2, 3) batch",
                 rtol=1e-4)
    short = RNG.standard_normal((1, 3, 2)).astype(np.float32)  # one sample, two positions: two values per channel
    try:
        short_out = affine(tt.tensor(short))
    except ValueError as error:
        raise AssertionError(f"BatchNorm1d(3) in training mode of a (1, 3, 2) batch: expected its output (two values "
                             f"per channel are enough), got ValueError: {error}") from None
    expect_close(short_out, (short - short.mean(axis=(0, 2), keepdims=True))
                 / np.sqrt(short.var(axis=(0, 2), keepdims=True) + 0.5) * np.array([2.0, -1.0, 0.5])[:, None]
                 + np.array([0.1, -0.2, 0.3])[:, None], "BatchNorm1d(3, eps=0.5) of a (1, 3, 2) batch",
                 rtol=1e-4, atol=1e-5)

    norm.to(dtype="float64")
    gx = tt.tensor(RNG.standard_normal((6, 3)), dtype="float64", requires_grad=True)
    expect_gradcheck(lambda t, w, b: norm(t), [gx, norm.weight, norm.bias],
                     "gradcheck of BatchNorm1d(3) in training mode in x, weight and bias")


@check(points=1, hint="BatchNorm training mode needs at least two values per channel: a (1, C) batch raises ValueError "
                      "naming the layer and the shape, before the running statistics change")
def test_batch_norm_training_needs_two_values(student):
    norm = student.BatchNorm1d(3)
    expect_raises(ValueError, lambda: norm(tt.ones(1, 3)), "BatchNorm1d(3) in training mode of a (1, 3) batch",
                  mentions=("BatchNorm1d", "(1, 3)"))
    expect_equal(norm.num_batches_tracked.item(), 0, "num_batches_tracked after a batch that raised")
    expect_equal(norm.running_var.numpy(), np.ones(3, dtype=np.float32), "running_var after a batch that raised")
    norm.eval()
    expect_equal(norm(tt.ones(1, 3)).shape, (1, 3), "the shape of BatchNorm1d(3) in evaluation mode of a (1, 3) input")


@check(points=1, hint="BatchNorm evaluation mode: (x - running_mean) / sqrt(running_var + self.eps) * weight + bias, "
                      "per channel (reshaped to channel_shape), running stats unchanged; they are constants, so the "
                      "input's gradient is only the scale weight / sqrt(running_var + eps) (not Normalize, which "
                      "differentiates through its statistics), while weight and bias get theirs as in training")
def test_batch_norm_eval(student):
    norm = student.BatchNorm1d(2)
    norm.running_mean.data[...] = [1.0, -1.0]
    norm.running_var.data[...] = [4.0, 0.25]
    norm.weight.data[...] = [2.0, 1.0]
    norm.bias.data[...] = [0.5, 0.0]
    norm.eval()
    x = np.array([[3.0, 0.0], [1.0, -1.0]], dtype=np.float32)
    expected = (x - [1.0, -1.0]) / np.sqrt(np.array([4.0, 0.25]) + 1e-5) * [2.0, 1.0] + [0.5, 0.0]
    inputs = tt.tensor(x, requires_grad=True)
    out = norm(inputs)
    expect_close(out, expected.astype(np.float32), "BatchNorm1d(2) in evaluation mode", rtol=1e-5)
    upstream = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=np.float32)
    out.backward(tt.tensor(upstream))
    expect_close(inputs.grad, upstream * [2.0, 1.0] / np.sqrt(np.array([4.0, 0.25]) + 1e-5),
                 "the input's gradient of BatchNorm1d(2) in evaluation mode (the running statistics are constants)",
                 rtol=1e-5)
    expect_equal(norm.running_mean.numpy(), np.array([1.0, -1.0], dtype=np.float32), "running_mean after evaluation")
    expect_equal(norm.num_batches_tracked.item(), 0, "num_batches_tracked after evaluation")

    # (N, C, L) with eps = 0.5: each channel's statistics broadcast over its positions; weight and bias learn
    wide = student.BatchNorm1d(3, eps=0.5)
    mean, var = np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.5, 3.5])
    weight, bias = np.array([2.0, -1.0, 0.5]), np.array([0.1, -0.2, 0.3])
    for name, value in (("running_mean", mean), ("running_var", var), ("weight", weight), ("bias", bias)):
        getattr(wide, name).data[...] = value
    wide.eval()
    x3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    x_hat = (x3 - mean[:, None]) / np.sqrt(var[:, None] + 0.5)
    out3 = wide(tt.tensor(x3))
    expect_close(out3, (x_hat * weight[:, None] + bias[:, None]).astype(np.float32),
                 f"BatchNorm1d(3, eps=0.5) in evaluation mode of a (2, 3, 4) input, running_mean {mean.tolist()}, "
                 f"running_var {var.tolist()}, weight {weight.tolist()}, bias {bias.tolist()}", rtol=1e-5, atol=1e-6)
    upstream3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    out3.backward(tt.tensor(upstream3))
    for name, expected_grad in (("weight", (upstream3 * x_hat).sum(axis=(0, 2))), ("bias", upstream3.sum(axis=(0, 2)))):
        grad = getattr(wide, name).grad
        assert grad is not None, (f"BatchNorm1d in evaluation mode: expected {name}.grad {expected_grad.tolist()} "
                                  f"({name} is a parameter in the graph, as in training), got None")
        expect_close(grad, expected_grad.astype(np.float32), f"{name}.grad of BatchNorm1d(3, eps=0.5) in evaluation "
                     "mode, summed over the batch and the positions", rtol=1e-4, atol=1e-5)


@check(points=1, hint="compute on the input's device: dropout draws from x._backend, the normalisation uses self.xp "
                      "and the tensors' own arrays, never np",
       after=("test_dropout", "test_layer_norm", "test_batch_norm_training", "test_batch_norm_eval"))
def test_normalization_runs_on_another_device(student):
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    results = {}
    for device in ("cpu", "strict"):
        tt.manual_seed(1)
        norm, layer = student.BatchNorm1d(4).to(device), student.LayerNorm(4).to(device)
        inputs = tt.tensor(x, device=device, requires_grad=True)
        try:
            out = student.dropout(layer(norm(inputs)), 0.3)
            out.sum().backward()
            norm.eval()
            evaluated = norm(inputs)
        except TypeError as error:
            raise AssertionError(f"on the {device!r} device: {error}") from None
        expect_equal(out.device, inputs.device, "the output's device")
        expect_equal(norm.running_mean.device, inputs.device, "running_mean's device")
        results[device] = [out.numpy(), inputs.grad.numpy(), norm.running_var.numpy(), evaluated.numpy()]
    for name, cpu, strict in zip(("output", "input gradient", "running variance", "evaluation"), *results.values()):
        expect_close(strict, cpu, f"the {name} on the strict device (against the cpu's)", rtol=1e-5, atol=1e-6)
