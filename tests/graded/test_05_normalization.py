"""Graded checks of Module 05 (normalization): dropout, the fused normalisation's
backward, LayerNorm and BatchNorm (training, running statistics, evaluation).

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 05``). Modules and layers of Module 04 come from the package.
"""
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.course.checks import check

RNG = np.random.default_rng(0)


@check(points=2, hint="dropout: keep each element with probability 1-p (x's backend's random_uniform >= p), scale kept "
                      "ones by 1/(1-p); identity when not training or p == 0")
def test_dropout(student):
    x = tt.ones(200, 100)
    assert student.dropout(x, 0.5, training=False) is x or np.array_equal(student.dropout(x, 0.5, False).numpy(), x.numpy())
    np.testing.assert_array_equal(student.dropout(x, 0.0, True).numpy(), x.numpy())
    out = student.dropout(x, 0.25, training=True).numpy()
    kept = out != 0
    assert abs(kept.mean() - 0.75) < 0.02, f"kept {kept.mean():.3f} of the values, expected 0.75"
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
    w = tt.ones(1000, requires_grad=True)
    dropped = student.dropout(w, 0.5, training=True)
    dropped.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), dropped.numpy(), err_msg="the gradient is the same mask")
    tt.manual_seed(3)
    first = student.dropout(x, 0.5).numpy()
    tt.manual_seed(3)
    assert np.array_equal(first, student.dropout(x, 0.5).numpy()), "the mask comes from the seeded generator"
    layer = student.Dropout(0.5)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy())
    half = student.dropout(tt.ones(50, 20, dtype="float16"), 0.5)  # what mixed precision feeds it
    assert half.dtype == np.float16, f"dropout of float16 must stay float16, got {half.dtype}"


@check(points=2, hint="Normalize.backward: inv_std * (g - mean(g) - x_hat * mean(g * x_hat)), means over axes")
def test_normalize_backward(student):
    x = tt.tensor(RNG.standard_normal((4, 3, 2)), dtype="float64", requires_grad=True)
    assert tt.gradcheck(lambda t: student.normalize(t, (0, 2))[0], [x])
    assert tt.gradcheck(lambda t: student.normalize(t, (1, 2), eps=1e-3)[0] * t, [x])


@check(points=2, hint="LayerNorm.forward: normalise over the last len(normalized_shape) axes, then * weight + bias; "
                      "wrong trailing axes raise ValueError")
def test_layer_norm(student):
    layer = student.LayerNorm((3, 4))
    layer.weight.data[...] = RNG.standard_normal((3, 4))
    layer.bias.data[...] = RNG.standard_normal((3, 4))
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32) * 5 + 2
    mean = x.mean(axis=(1, 2), keepdims=True)
    var = x.var(axis=(1, 2), keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-5) * layer.weight.numpy() + layer.bias.numpy()
    np.testing.assert_allclose(layer(tt.tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-5)
    layer.to(dtype="float64")
    gx = tt.tensor(RNG.standard_normal((2, 3, 4)), dtype="float64", requires_grad=True)
    assert tt.gradcheck(lambda t, w, b: layer(t), [gx, layer.weight, layer.bias])
    with pytest.raises(ValueError):
        layer(tt.zeros(2, 4, 3))


@check(points=1, hint="_update_running_stats: running = (1 - momentum) * running + momentum * batch for the mean and the "
                      "unbiased variance, in place; num_batches_tracked += 1")
def test_batch_norm_running_stats(student):
    norm = student.BatchNorm1d(3, momentum=0.2)
    arrays = [buffer.data for buffer in (norm.running_mean, norm.running_var, norm.num_batches_tracked)]
    norm._update_running_stats(np.array([1.0, 2.0, 3.0]), np.array([4.0, 4.0, 4.0]))
    np.testing.assert_allclose(norm.running_mean.numpy(), [0.2, 0.4, 0.6], rtol=1e-6)
    np.testing.assert_allclose(norm.running_var.numpy(), [0.8 + 0.8] * 3, rtol=1e-6)
    assert norm.num_batches_tracked.item() == 1
    for name, array in zip(("running_mean", "running_var", "num_batches_tracked"), arrays):
        assert getattr(norm, name).data is array, f"{name} must be updated in place (its array replaced)"


@check(points=2, hint="BatchNorm training mode: normalise with the batch's mean and biased variance over every axis but "
                      "1, update the running stats with the unbiased variance, then * weight + bias per channel")
def test_batch_norm_training(student):
    norm = student.BatchNorm1d(3)
    x = RNG.standard_normal((8, 3, 5)).astype(np.float32) * 3 + 1
    out = norm(tt.tensor(x)).numpy()
    mean = x.mean(axis=(0, 2), keepdims=True)
    var = x.var(axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(out, (x - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(norm.running_mean.numpy(), 0.1 * mean.ravel(), rtol=1e-4, atol=1e-6)
    unbiased = x.var(axis=(0, 2), ddof=1)
    np.testing.assert_allclose(norm.running_var.numpy(), 0.9 + 0.1 * unbiased, rtol=1e-4)
    assert norm.num_batches_tracked.item() == 1
    norm.to(dtype="float64")
    gx = tt.tensor(RNG.standard_normal((6, 3)), dtype="float64", requires_grad=True)
    assert tt.gradcheck(lambda t, w, b: norm(t), [gx, norm.weight, norm.bias])


@check(points=1, hint="BatchNorm evaluation mode: (x - running_mean) / sqrt(running_var + eps) * weight + bias, "
                      "running stats unchanged")
def test_batch_norm_eval(student):
    norm = student.BatchNorm1d(2)
    norm.running_mean.data[...] = [1.0, -1.0]
    norm.running_var.data[...] = [4.0, 0.25]
    norm.weight.data[...] = [2.0, 1.0]
    norm.bias.data[...] = [0.5, 0.0]
    norm.eval()
    x = np.array([[3.0, 0.0], [1.0, -1.0]], dtype=np.float32)
    expected = (x - [1.0, -1.0]) / np.sqrt(np.array([4.0, 0.25]) + 1e-5) * [2.0, 1.0] + [0.5, 0.0]
    np.testing.assert_allclose(norm(tt.tensor(x)).numpy(), expected, rtol=1e-5)
    assert norm.running_mean.numpy().tolist() == [1.0, -1.0] and norm.num_batches_tracked.item() == 0


@check(points=1, hint="compute on the input's device: dropout draws from x._backend, the normalisation uses self.xp "
                      "and the tensors' own arrays, never np")
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
        assert out.device == inputs.device and norm.running_mean.device == inputs.device
        results[device] = [out.numpy(), inputs.grad.numpy(), norm.running_var.numpy(), evaluated.numpy()]
    for name, cpu, strict in zip(("output", "input gradient", "running variance", "evaluation"), *results.values()):
        np.testing.assert_allclose(strict, cpu, rtol=1e-5, atol=1e-6, err_msg=f"{name} on the strict device")
