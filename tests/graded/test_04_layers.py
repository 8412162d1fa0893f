"""Graded checks of Module 04 (layers): Module's registration, tree walking, modes,
devices and state; Linear, ModuleList/Sequential, Flatten, dropout, the fused
normalisation and LayerNorm/BatchNorm.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 04``). Its ``Parameter`` and ``Module`` are the student's own.
"""
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.course.checks import check

RNG = np.random.default_rng(0)


def _tree(student):
    """A small tree of the student's modules: a parameter, a buffer and a shared child."""

    class Leaf(student.Module):
        def __init__(self, n):
            super().__init__()
            self.w = student.Parameter(np.arange(n, dtype=np.float32))
            self.register_buffer("count", tt.tensor(0))

    class Root(student.Module):
        def __init__(self):
            super().__init__()
            self.first = Leaf(2)
            self.scale = student.Parameter(np.ones(1, dtype=np.float32))
            self.second = Leaf(3)
            self.again = self.first  # shared: counted once

    return Root()


@check(points=2, hint="__setattr__ files a Parameter under _parameters, a Module under _modules, a Tensor (or None) for a "
                      "registered buffer under _buffers; anything else is a plain attribute; re-assigning moves it")
def test_setattr_registers(student):
    root = _tree(student)
    assert list(root._parameters) == ["scale"] and list(root._modules) == ["first", "second", "again"]
    assert list(root.first._buffers) == ["count"]
    root.scale = 3.0  # no longer a parameter
    assert "scale" not in root._parameters and root.scale == 3.0
    root.first.count = tt.tensor(5)  # a registered buffer stays one
    assert root.first._buffers["count"] is root.first.count
    root.second = None
    assert "second" not in root._modules or root._modules["second"] is None

    class Early(student.Module):
        def __init__(self):
            self.w = student.Parameter([1.0])  # before super().__init__()
            super().__init__()

    with pytest.raises(AttributeError):
        Early()


@check(points=2, hint="named_modules walks depth first, children in registration order, each module once, names dotted")
def test_named_modules(student):
    root = _tree(student)
    names = [name for name, _ in root.named_modules()]
    assert names == ["", "first", "second"], f"got {names}: each module once, parents first"
    assert [name for name, _ in root.named_modules(prefix="model")] == ["model", "model.first", "model.second"]
    assert [name for name, _ in root.named_parameters()] == ["scale", "first.w", "second.w"]
    assert len(root.parameters()) == 3 and len(root.modules()) == 3


@check(points=2, hint="to(device, dtype) changes every parameter, gradient and buffer in place (same objects); "
                      "dtype casts floating-point tensors only")
def test_to_device_and_dtype(student):
    root = _tree(student)
    weight = root.first.w
    weight.grad = tt.ones(2)
    assert root.to("strict") is root
    assert root.first.w is weight and weight.device == "strict:0" and weight.grad.device == "strict:0"
    assert root.first.count.device == "strict:0"
    root.to("cpu", dtype="float64")
    assert weight.device == "cpu" and weight.dtype == np.float64 and weight.grad.dtype == np.float64
    assert root.first.count.dtype == np.int64, "integer buffers keep their dtype"
    np.testing.assert_array_equal(weight.numpy(), [0.0, 1.0])


@check(points=2, hint="state_dict: every parameter and buffer by dotted name, as detached copies on their device")
def test_state_dict(student):
    root = _tree(student)
    state = root.state_dict()
    assert list(state) == ["scale", "first.w", "second.w", "first.count", "second.count"]
    copy = state["first.w"]
    assert not copy.requires_grad and not np.shares_memory(copy.data, root.first.w.data)
    root.first.w.data[0] = 42.0
    assert copy.numpy()[0] == 0.0, "the state must not change when training goes on"


@check(points=2, hint="load_state_dict copies values into the existing arrays; strict mode lists missing/unexpected "
                      "keys, shape mismatches always raise, and nothing is copied when it raises")
def test_load_state_dict(student):
    root = _tree(student)
    array = root.first.w.data
    state = {name: value.numpy() + 1 for name, value in root.state_dict().items()}
    root.load_state_dict(state)
    assert root.first.w.data is array, "copy in place: same array"
    np.testing.assert_array_equal(root.first.w.numpy(), [1.0, 2.0])
    state["first.w"][0] = 99.0
    assert root.first.w.numpy()[0] == 1.0, "no memory shared with the state"
    with pytest.raises(RuntimeError) as error:
        root.load_state_dict({"scale": np.ones(1), "extra": np.ones(1)})
    assert "first.w" in str(error.value) and "extra" in str(error.value)
    with pytest.raises(RuntimeError):
        root.load_state_dict({**state, "scale": np.ones(5)})
    assert root.scale.numpy().tolist() == [2.0], "nothing is copied when loading fails"
    result = root.load_state_dict({"scale": np.full(1, 7.0), "extra": np.ones(1)}, strict=False)
    assert list(result.unexpected_keys) == ["extra"] and "first.w" in result.missing_keys
    assert root.scale.numpy().tolist() == [7.0]


@check(points=2, hint="LinearFunction.backward: grad_x = G W, grad_weight = G^T X over all leading axes, grad_bias = row sums of G")
def test_linear_backward(student):
    fused = student.LinearFunction.apply  # the installed Function.apply and engine, the student's backward
    x = tt.tensor(RNG.standard_normal((2, 3, 4)), dtype="float64", requires_grad=True)
    w = tt.tensor(RNG.standard_normal((5, 4)), dtype="float64", requires_grad=True)
    b = tt.tensor(RNG.standard_normal(5), dtype="float64", requires_grad=True)
    assert tt.gradcheck(fused, [x, w, b])
    assert tt.gradcheck(fused, [x, w])


@check(points=1, hint="ModuleList.append registers the module under the next index name ('0', '1', ...), refuses "
                      "non-Modules with TypeError, returns self")
def test_module_list_append(student):
    layers = student.ModuleList()
    first, second = student.Linear(2, 2), student.Linear(2, 1)
    assert layers.append(first) is layers
    layers.append(second)
    assert list(layers._modules) == ["0", "1"] and layers[1] is second and len(layers) == 2
    assert [name for name, _ in layers.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(TypeError):
        layers.append("not a module")


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


@check(points=2, hint="compute on the tensors' device: dropout draws from x._backend, LinearFunction uses self.xp, "
                      "load_state_dict copies host arrays onto the model's device (backend.from_host), never np")
def test_layers_run_on_another_device(student):
    tt.manual_seed(0)
    linear = student.Linear(4, 3)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    results = {}
    for device in ("cpu", "strict"):
        layer = student.Linear(4, 3)
        layer.load_state_dict({name: value.numpy() for name, value in linear.state_dict().items()})
        layer.to(device)
        inputs = tt.tensor(x, device=device, requires_grad=True)
        try:
            out = student.dropout(layer(inputs), 0.0, training=True)
            out.sum().backward()
            dropped = student.dropout(tt.ones(8, 8, device=device), 0.5)
            on_device = student.Linear(4, 3).to(device)
            on_device.load_state_dict({name: value.numpy() for name, value in linear.state_dict().items()})
        except TypeError as error:
            raise AssertionError(f"on the {device!r} device: {error}") from None
        assert dropped.device == tt.tensor(0.0, device=device).device
        assert on_device.weight.device == dropped.device, "load_state_dict keeps each tensor on its device"
        results[device] = [out.numpy(), inputs.grad.numpy(), layer.weight.grad.numpy(), layer.bias.grad.numpy()]
    for name, cpu, strict in zip(("output", "input gradient", "weight gradient", "bias gradient"), *results.values()):
        np.testing.assert_allclose(strict, cpu, rtol=1e-5, err_msg=f"Linear's {name} on the strict device")


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
