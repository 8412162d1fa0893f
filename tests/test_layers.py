"""Module 04: the layers — values against NumPy, gradients with ``tt.gradcheck``
(float64, with respect to inputs and parameters), initialisation, modes, errors,
and BatchNorm's running statistics by hand and against PyTorch (when installed).
Every test runs on every device.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinytrain as tt
import tinytrain.nn as nn
import tinytrain.nn.functional as F
from tinytrain.nn.layers import LinearFunction
from tinytrain.nn.normalization import normalize

SEEDS = st.integers(0, 2**32 - 1)


def leaf(a, device):
    return tt.tensor(a, dtype="float64", device=device, requires_grad=True)


def randn(device, *shape, seed=0, requires_grad=False):
    a = np.random.default_rng(seed).standard_normal(shape)
    return tt.tensor(a, dtype="float64", device=device, requires_grad=requires_grad)


def to64(layer, device):
    return layer.to(device, dtype="float64")


# -- Linear -----------------------------------------------------------------------------

def test_linear_layout_and_values(device) -> None:
    tt.manual_seed(0)
    layer = nn.Linear(5, 3).to(device)
    assert layer.weight.shape == (3, 5) and layer.bias.shape == (3,), "weight layout is (out, in)"
    assert isinstance(layer.weight, nn.Parameter) and layer.weight.dtype == np.float32
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    out = layer(tt.tensor(x, device=device))
    np.testing.assert_allclose(out.numpy(), x @ layer.weight.numpy().T + layer.bias.numpy(), rtol=1e-5, atol=1e-6)
    assert out.dtype == np.float32


@given(leading=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3), seed=SEEDS)
def test_linear_any_leading_axes(device, leading, seed) -> None:
    tt.manual_seed(seed % 1000)
    layer = to64(nn.Linear(3, 2), device)
    x = randn(device, *leading, 3, seed=seed, requires_grad=True)
    out = layer(x)
    assert out.shape == (*leading, 2)
    np.testing.assert_allclose(out.numpy(), x.numpy() @ layer.weight.numpy().T + layer.bias.numpy(), rtol=1e-10)
    assert tt.gradcheck(lambda x, w, b: layer(x), [x, layer.weight, layer.bias])


def test_linear_takes_leading_axes_in_one_operation(device) -> None:
    """NumPy's matmul takes a stack slice by slice (up to 1.4x slower for a GPT's (B, T, C)): ``LinearFunction``
    multiplies the rows as one (rows, in) matrix itself, so ``linear`` records one operation, no reshapes."""
    layer = to64(nn.Linear(3, 2), device)
    x = randn(device, 2, 4, 3, requires_grad=True)
    out = layer(x)
    assert out.shape == (2, 4, 2) and type(out._ctx) is LinearFunction and out._ctx.inputs[0] is x
    rows = layer(x.reshape(8, 3))
    np.testing.assert_allclose(out.numpy(), rows.numpy().reshape(2, 4, 2), rtol=1e-12)
    assert tt.gradcheck(lambda x, w, b: layer(x), [x, layer.weight, layer.bias])


def test_linear_without_bias_gradcheck(device) -> None:
    layer = to64(nn.Linear(4, 3, bias=False), device)
    assert layer.bias is None and layer.parameters() == [layer.weight]
    assert [n for n, _ in layer.named_parameters()] == ["weight"]
    assert tt.gradcheck(lambda x, w: layer(x), [randn(device, 2, 4, requires_grad=True), layer.weight])
    assert "bias=False" in repr(layer)


def test_linear_skips_gradients_nobody_needs(device) -> None:
    layer = nn.Linear(3, 2).to(device)
    x = tt.randn(4, 3, device=device)  # input data: no gradient wanted
    layer(x).sum().backward()
    assert x.grad is None and layer.weight.grad.shape == (2, 3)
    np.testing.assert_allclose(layer.bias.grad.numpy(), [4.0, 4.0])
    np.testing.assert_allclose(layer.weight.grad.numpy(), np.tile(x.numpy().sum(0), (2, 1)), rtol=1e-5)


def test_functional_linear(device) -> None:
    x, w, b = randn(device, 2, 3, requires_grad=True), randn(device, 4, 3, seed=1, requires_grad=True), \
        randn(device, 4, seed=2, requires_grad=True)
    assert tt.gradcheck(F.linear, [x, w, b])
    assert tt.gradcheck(F.linear, [x, w])
    assert isinstance(F.linear(x, w)._ctx, LinearFunction)
    with pytest.raises(ValueError, match=r"\(4, 3\).*\(2, 5\)|\(2, 5\).*\(4, 3\)"):
        F.linear(randn(device, 2, 5), w)


def test_linear_wrong_width_names_both_shapes(device) -> None:
    layer = nn.Linear(784, 10).to(device)
    with pytest.raises(ValueError) as info:
        layer(tt.randn(32, 100, device=device))
    assert "784" in str(info.value) and "(32, 100)" in str(info.value)
    with pytest.raises(ValueError):
        layer(tt.tensor(1.0, device=device))
    with pytest.raises(ValueError):
        nn.Linear(0, 3)


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_linear_and_conv2d_refuse_integer_inputs_naming_the_dtype(device, dtype) -> None:
    """NumPy promotes int @ float32 to float64: the model would silently run in float64 (PyTorch raises)."""
    x = tt.tensor(np.ones((2, 1, 4, 4)), dtype=dtype, device=device)
    with pytest.raises(TypeError, match=rf"linear: expected a floating-point input, got {dtype} of shape \(2, 16\)"):
        nn.Linear(16, 3).to(device)(x.reshape(2, 16))
    with pytest.raises(TypeError, match=rf"conv2d: expected a floating-point input, got {dtype} of shape \(2, 1, 4, 4\)"):
        nn.Conv2d(1, 2, 3).to(device)(x)
    assert nn.Linear(16, 3).to(device)(x.reshape(2, 16).astype("float32")).dtype == np.float32


@pytest.mark.parametrize("size", [2.5, "4", True])
def test_linear_size_of_the_wrong_type_raises_naming_it(size) -> None:
    with pytest.raises(TypeError, match=rf"in_features must be a whole number, got in_features={size!r}"):
        nn.Linear(size, 3)
    with pytest.raises(TypeError, match=rf"out_features={size!r}"):
        nn.Linear(3, size)


def test_linear_init_bounds_and_variance() -> None:
    """PyTorch's default: weight and bias from U(-1/sqrt(in), 1/sqrt(in)), variance 1/(3 in)."""
    tt.manual_seed(0)
    layer = nn.Linear(256, 512)
    bound = 1 / math.sqrt(256)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() > 0.99 * bound and w.min() < -0.99 * bound  # fills the interval
    assert abs(w.mean()) < 0.01 * bound
    np.testing.assert_allclose(w.var(), bound**2 / 3, rtol=0.02)
    # the variance argument: unit-variance input -> output variance n * 1/(3n) (+ bias variance)
    y = layer(tt.randn(4000, 256)).numpy()
    np.testing.assert_allclose(y.var(), 1 / 3 + b.var(), rtol=0.05)


def test_linear_init_is_reproducible() -> None:
    tt.manual_seed(3)
    a = nn.Linear(4, 4)
    tt.manual_seed(3)
    b = nn.Linear(4, 4)
    c = nn.Linear(4, 4)
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    assert not np.array_equal(b.weight.numpy(), c.weight.numpy())


def test_linear_weight_and_its_gradient_are_column_major(device, other_device) -> None:
    """The weight is stored column-major, so ``x @ W.T`` is a plain product for BLAS; moves, casts and
    loads keep that order, and the gradient takes the weight's order, column- or row-major."""
    from tinytrain.backend import memory_order

    layer = nn.Linear(5, 3).to(other_device).to(device)
    assert memory_order(layer.weight.data) == "F"
    layer.load_state_dict(nn.Linear(5, 3).state_dict())
    assert memory_order(layer.weight.data) == "F"
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((4, 5)), rng.standard_normal((4, 3))
    for order in "FC":
        layer = to64(layer, device)
        layer.weight.data = layer.weight._backend.xp.array(layer.weight.data, order=order)
        layer.zero_grad()
        layer(tt.tensor(x, dtype="float64", device=device)).backward(tt.tensor(g, dtype="float64", device=device))
        assert memory_order(layer.weight.data) == memory_order(layer.weight.grad.data) == order
        np.testing.assert_allclose(layer.weight.grad.numpy(), g.T @ x, rtol=1e-12)
        assert tt.gradcheck(lambda x, w, b: layer(x), [randn(device, 2, 5, requires_grad=True), layer.weight,
                                                       layer.bias])


def test_linear_matches_pytorch_layout() -> None:
    torch = pytest.importorskip("torch")
    layer = nn.Linear(5, 3)
    reference = torch.nn.Linear(5, 3)
    reference.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in layer.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(layer(tt.tensor(x)).numpy(), reference(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


# -- Sequential, ModuleList, activations, Flatten ----------------------------------------------

def test_sequential_container(device) -> None:
    tt.manual_seed(0)
    a, relu, b = nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)
    model = nn.Sequential(a, relu, b).to(device)
    assert len(model) == 3 and list(model) == [a, relu, b]
    assert model[0] is a and model[-1] is b and model[-3] is a
    sliced = model[1:]
    assert isinstance(sliced, nn.Sequential) and list(sliced) == [relu, b]
    with pytest.raises(IndexError, match="3"):
        model[3]
    x = tt.randn(5, 4, device=device)
    np.testing.assert_allclose(model(x).numpy(), b(relu(a(x))).numpy())
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert nn.Sequential()(x) is x
    with pytest.raises(TypeError, match="int"):
        nn.Sequential(a, 3)


@pytest.mark.parametrize("index", ["0", 1.0, None, (0,)])
def test_container_index_of_the_wrong_type_raises_naming_it(index) -> None:
    for container in (nn.Sequential(nn.ReLU(), nn.Tanh()), nn.ModuleList([nn.ReLU(), nn.Tanh()])):
        with pytest.raises(TypeError, match=re.escape(f"index must be an int or a slice, got index={index!r} of type "
                                                      f"{type(index).__name__}")):
            container[index]
    assert isinstance(nn.Sequential(nn.ReLU(), nn.Tanh())[np.int64(1)], nn.Tanh)


def test_module_list() -> None:
    layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))
    assert layers.append(nn.Tanh()) is layers and len(layers) == 3
    layers.extend([nn.ReLU()])
    assert len(layers) == 4 and isinstance(layers[1:], nn.ModuleList) and len(layers.parameters()) == 4
    assert [n for n, _ in layers.named_children()] == ["0", "1", "2", "3"]
    with pytest.raises(NotImplementedError):
        layers(tt.zeros(2))


ACTIVATIONS = [
    (nn.ReLU(), lambda a: np.maximum(a, 0)),
    (nn.Sigmoid(), lambda a: 1 / (1 + np.exp(-a))),
    (nn.Tanh(), np.tanh),
    (nn.GELU(), lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))),
    (nn.Softmax(), lambda a: np.exp(a) / np.exp(a).sum(-1, keepdims=True)),
    (nn.Softmax(axis=0), lambda a: np.exp(a) / np.exp(a).sum(0, keepdims=True)),
    (nn.LogSoftmax(), lambda a: a - np.log(np.exp(a).sum(-1, keepdims=True))),
    (nn.LogSoftmax(axis=0), lambda a: a - np.log(np.exp(a).sum(0, keepdims=True))),
]


@pytest.mark.parametrize("module, reference", ACTIVATIONS, ids=lambda v: repr(v) if isinstance(v, nn.Module) else "")
def test_activation_modules(device, module, reference) -> None:
    a = np.random.default_rng(0).uniform(0.1, 2, (3, 4)) * np.random.default_rng(1).choice([-1, 1], (3, 4))
    x = leaf(a, device)
    np.testing.assert_allclose(module(x).numpy(), reference(a), rtol=1e-10, atol=1e-12)
    assert tt.gradcheck(module, [x])
    assert module.parameters() == []


def test_activation_reprs() -> None:
    assert repr(nn.ReLU()) == "ReLU()" and repr(nn.Softmax(axis=1)) == "Softmax(axis=1)"
    assert repr(nn.LogSoftmax()) == "LogSoftmax(axis=-1)" and repr(nn.GELU()) == "GELU(approximate='tanh')"


def test_flatten(device) -> None:
    x = randn(device, 2, 3, 4, 5, requires_grad=True)
    out = nn.Flatten()(x)
    assert out.shape == (2, 60)
    np.testing.assert_array_equal(out.numpy(), x.numpy().reshape(2, 60))
    assert nn.Flatten()(randn(device, 3, 1)).shape == (3, 1)
    assert nn.Flatten()(tt.zeros(0, 2, 2, device=device)).shape == (0, 4)
    assert tt.gradcheck(nn.Flatten(), [randn(device, 2, 3, 2, requires_grad=True)])


@pytest.mark.parametrize("shape", [(), (784,)])
def test_flatten_without_a_feature_axis_raises_naming_the_shape(device, shape) -> None:
    """As PyTorch's Flatten: an unbatched (784,) sample became 784 samples of one feature, shape (784, 1)."""
    with pytest.raises(ValueError, match=re.escape(f"Flatten needs a batch axis and at least one more, got shape {shape}")):
        nn.Flatten()(tt.zeros(*shape, device=device))


# -- Dropout ----------------------------------------------------------------------------------

def test_dropout_keeps_the_expectation(device) -> None:
    tt.manual_seed(0)
    x = tt.ones(200_000, device=device)
    out = F.dropout(x, 0.25).numpy()
    assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.005
    assert abs(out.mean() - 1.0) < 0.01
    assert out.dtype == np.float32


def test_dropout_identity_cases(device) -> None:
    x = tt.randn(10, device=device)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    layer = nn.Dropout(0.5).eval()
    assert layer(x) is x
    assert nn.Dropout(0.0)(x) is x


@pytest.mark.parametrize("p", [1.0, 1.5, -0.1])
def test_dropout_rejects_bad_probability(p) -> None:
    with pytest.raises(ValueError, match=str(p)):
        nn.Dropout(p)
    with pytest.raises(ValueError, match=str(p)):
        F.dropout(tt.ones(3), p)


@pytest.mark.parametrize("p", ["0.5", None])
def test_dropout_probability_of_the_wrong_type_raises_naming_it(p) -> None:
    with pytest.raises(TypeError, match=rf"p must be a real number, got p={p!r}"):
        nn.Dropout(p)
    with pytest.raises(TypeError, match=rf"p={p!r}"):
        F.dropout(tt.ones(3), p)


def test_dropout_is_seeded_and_the_mask_ignores_dtype(device) -> None:
    tt.manual_seed(5)
    a = F.dropout(tt.ones(100, device=device), 0.5).numpy()
    tt.manual_seed(5)
    b = F.dropout(tt.ones(100, dtype="float64", device=device), 0.5).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, F.dropout(tt.ones(100, device=device), 0.5).numpy())


def test_dropout_gradient(device) -> None:
    x = randn(device, 4, 5, requires_grad=True)

    def fixed_mask_dropout(x):
        tt.manual_seed(0)  # gradcheck calls this many times: the same mask each time
        return F.dropout(x, 0.4)

    assert tt.gradcheck(fixed_mask_dropout, [x])
    layer = nn.Dropout(0.4)

    def seeded_layer(x):
        tt.manual_seed(1)
        return layer(x)

    assert tt.gradcheck(seeded_layer, [x])
    x.grad = None
    out = seeded_layer(x)
    out.backward(tt.ones(4, 5, dtype="float64", device=device))
    np.testing.assert_allclose(x.grad.numpy(), (out.numpy() != 0) / 0.6)


# -- normalisation ------------------------------------------------------------------------------

@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=4), seed=SEEDS, data=st.data())
def test_normalize_gradcheck(device, shape, seed, data) -> None:
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    x = randn(device, *shape, seed=seed, requires_grad=True)
    out, mean, var = normalize(x, axes)
    a = x.numpy()
    np.testing.assert_allclose(out.numpy(), (a - a.mean(axes, keepdims=True)) / np.sqrt(a.var(axes, keepdims=True)
                                                                                         + 1e-5), rtol=1e-8)
    assert mean.shape == var.shape == tuple(1 if i in axes else n for i, n in enumerate(shape))
    assert tt.gradcheck(lambda x: normalize(x, axes)[0], [x])


def test_layernorm_values_and_gradcheck(device) -> None:
    layer = to64(nn.LayerNorm(5), device)
    with tt.no_grad():
        layer.weight[...] = tt.tensor(np.linspace(0.5, 2, 5), device=device)
        layer.bias[...] = tt.tensor(np.linspace(-1, 1, 5), device=device)
    x = randn(device, 3, 4, 5, requires_grad=True)
    a = x.numpy()
    expected = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(layer(x).numpy(), expected * np.linspace(0.5, 2, 5) + np.linspace(-1, 1, 5),
                               rtol=1e-10)
    assert tt.gradcheck(lambda x, w, b: layer(x), [x, layer.weight, layer.bias])
    np.testing.assert_array_equal(layer.eval()(x).numpy(), layer.train()(x).numpy())  # no mode dependence
    assert layer.buffers() == []


@pytest.mark.parametrize("shape, axes, transposed", [((3, 4, 5), (2,), False), ((2, 3, 4), (1, 2), False),
                                                    ((2, 3, 4), (-2, -1), False), ((6,), (0,), False),
                                                    ((4, 5, 3), (2,), True)])
def test_normalize_with_weight_and_bias_is_one_node_equal_to_the_affine_map(device, shape, axes, transposed) -> None:
    """normalize(x, axes, eps, weight, bias): x_hat * weight + bias as one AffineNormalize node, same values and
    gradients as the three nodes; a transposed (not contiguous) input is read as it is."""
    x = randn(device, *shape, seed=1, requires_grad=True)
    source = x.transpose(0, 2, 1) if transposed else x
    trailing = source.shape[source.ndim - len(axes):]
    weight = randn(device, *trailing, seed=2, requires_grad=True)
    bias = randn(device, *trailing, seed=3, requires_grad=True)
    grad = randn(device, *source.shape, seed=4)
    fused, mean, var = normalize(source, axes, 1e-3, weight, bias)
    assert type(fused._ctx).__name__ == "AffineNormalize" and fused._ctx.inputs == (source, weight, bias)
    x_hat, mean_alone, var_alone = normalize(source, axes, 1e-3)
    composed = x_hat * weight + bias
    np.testing.assert_allclose(fused.numpy(), composed.numpy(), rtol=1e-12, atol=1e-12)
    host = x._backend.to_host
    np.testing.assert_allclose(host(mean), host(mean_alone), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(host(var), host(var_alone), rtol=1e-12)
    assert mean.shape == var.shape == mean_alone.shape
    grads = []
    for out in (fused, composed):
        x.grad = weight.grad = bias.grad = None
        out.backward(grad, retain_graph=True)  # the transpose is shared by both
        grads.append([t.grad.numpy() for t in (x, weight, bias)])
    for ours, expected in zip(*grads):
        np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-12)
    assert tt.gradcheck(lambda x, w, b: normalize(x.transpose(0, 2, 1) if transposed else x, axes, 1e-3, w, b)[0],
                        [x, weight, bias])


def test_normalize_with_frozen_weight_and_bias_gives_them_no_gradient(device) -> None:
    x = randn(device, 3, 4, requires_grad=True)
    weight, bias = randn(device, 4, seed=2), randn(device, 4, seed=3)
    normalize(x, (1,), 1e-5, weight, bias)[0].sum().backward()
    expected = x.grad.numpy()
    x.grad = None
    (normalize(x, (1,))[0] * weight + bias).sum().backward()
    np.testing.assert_allclose(expected, x.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert weight.grad is None and bias.grad is None
    with tt.no_grad():
        assert normalize(x, (1,), 1e-5, weight, bias)[0]._ctx is None


def test_normalize_with_weight_and_bias_on_another_device_raises(device) -> None:
    if device == "cpu":
        pytest.skip("needs a second device")
    with pytest.raises(RuntimeError, match="same device"):
        normalize(tt.randn(3, 4), (1,), 1e-5, tt.ones(4, device=device), tt.zeros(4, device=device))


@pytest.mark.parametrize("axes, weight_shape, bias_shape", [((0,), (4,), (4,)), ((1,), (4,), None),
                                                           ((1,), (3,), (3,)), ((1,), (4,), (1, 4))])
def test_normalize_with_weight_and_bias_refuses_what_does_not_fit(axes, weight_shape, bias_shape) -> None:
    x = tt.randn(3, 4)
    weight = None if weight_shape is None else tt.ones(*weight_shape)
    bias = None if bias_shape is None else tt.zeros(*bias_shape)
    with pytest.raises(ValueError, match=re.escape(f"got x (3, 4), axes={axes}, weight {weight_shape}, "
                                                   f"bias {bias_shape}")):
        normalize(x, axes, 1e-5, weight, bias)


def test_layernorm_over_several_axes(device) -> None:
    layer = to64(nn.LayerNorm((3, 4)), device)
    assert layer.weight.shape == (3, 4) and repr(layer) == "LayerNorm((3, 4), eps=1e-05)"
    x = randn(device, 2, 3, 4, requires_grad=True)
    out = layer(x).numpy()
    np.testing.assert_allclose(out.mean(axis=(1, 2)), 0, atol=1e-12)
    np.testing.assert_allclose(out.var(axis=(1, 2)), 1, rtol=1e-4)
    assert tt.gradcheck(lambda x, w, b: layer(x), [x, layer.weight, layer.bias])
    with pytest.raises(ValueError, match=r"\(2, 4, 3\)"):
        layer(randn(device, 2, 4, 3))
    with pytest.raises(ValueError):
        layer(randn(device, 4))


def test_layernorm_constant_input_is_finite(device) -> None:
    out = nn.LayerNorm(4).to(device)(tt.ones(2, 4, device=device) * 3)
    np.testing.assert_array_equal(out.numpy(), 0.0)


def batchnorm_reference(a, axes):
    return (a - a.mean(axes, keepdims=True)) / np.sqrt(a.var(axes, keepdims=True) + 1e-5)


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5)])
def test_batchnorm_train_values_and_gradcheck(device, shape) -> None:
    bn = to64(nn.BatchNorm1d(3), device)
    with tt.no_grad():
        bn.weight[...] = tt.tensor([0.5, 1.0, 2.0], device=device)
        bn.bias[...] = tt.tensor([0.0, -1.0, 1.0], device=device)
    x = randn(device, *shape, requires_grad=True)
    axes = (0,) if len(shape) == 2 else (0, 2)
    channel = (3,) if len(shape) == 2 else (3, 1)
    expected = batchnorm_reference(x.numpy(), axes) * np.array([0.5, 1.0, 2.0]).reshape(channel) \
        + np.array([0.0, -1.0, 1.0]).reshape(channel)
    np.testing.assert_allclose(bn(x).numpy(), expected, rtol=1e-10, atol=1e-12)
    assert tt.gradcheck(lambda x, w, b: bn(x), [x, bn.weight, bn.bias])


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5)])
def test_batchnorm_eval_gradcheck(device, shape) -> None:
    bn = to64(nn.BatchNorm1d(3), device)
    for seed in range(3):
        bn(randn(device, *shape, seed=seed) * 2 + 1)
    bn.eval()
    x = randn(device, *shape, seed=9, requires_grad=True)
    assert tt.gradcheck(lambda x, w, b: bn(x), [x, bn.weight, bn.bias])


def test_batchnorm_running_statistics_by_hand(device) -> None:
    bn = nn.BatchNorm1d(2, momentum=0.2).to(device)
    rng = np.random.default_rng(0)
    mean, var = np.zeros(2), np.ones(2)
    for step in range(4):
        a = rng.normal([[1.0], [-2.0]], [[2.0], [0.5]], size=(5, 2, 3))
        bn(tt.tensor(a, device=device))
        batch_mean = a.mean(axis=(0, 2))
        batch_var = a.var(axis=(0, 2), ddof=1)  # unbiased: 15 values per channel, divide by 14
        mean, var = 0.8 * mean + 0.2 * batch_mean, 0.8 * var + 0.2 * batch_var
        np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-5)
        np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-5)
        assert bn.num_batches_tracked.item() == step + 1
    assert bn.running_mean.dtype == np.float32 and not bn.running_mean.requires_grad
    bn.eval()
    a = rng.normal(size=(3, 2, 3))
    np.testing.assert_allclose(bn(tt.tensor(a, device=device)).numpy(),
                               (a - mean[:, None]) / np.sqrt(var[:, None] + 1e-5), rtol=1e-5, atol=1e-6)


def test_batchnorm_running_statistics_stay_out_of_the_graph(device) -> None:
    bn = nn.BatchNorm1d(3).to(device)
    x = tt.randn(4, 3, device=device, requires_grad=True)
    bn(x).sum().backward()
    for buffer in bn.buffers():
        assert not buffer.requires_grad and buffer.grad is None and buffer._ctx is None
    with tt.no_grad():
        bn(x)  # updates happen under no_grad too (training mode)
    assert bn.num_batches_tracked.item() == 2


def test_batchnorm_errors(device) -> None:
    bn = nn.BatchNorm1d(3).to(device)
    with pytest.raises(ValueError, match=r"\(4, 2\)"):
        bn(tt.randn(4, 2, device=device))
    with pytest.raises(ValueError, match=r"\(2, 3, 4, 4\)"):
        bn(tt.randn(2, 3, 4, 4, device=device))
    with pytest.raises(ValueError, match="more than one value per channel"):
        bn(tt.randn(1, 3, device=device))
    assert bn.eval()(tt.randn(1, 3, device=device)).shape == (1, 3)


@pytest.mark.parametrize("layer", [nn.BatchNorm1d, nn.BatchNorm2d])
@pytest.mark.parametrize("argument, value, error, message", [
    ("num_features", 0, ValueError, "num_features must be a whole number >= 1, got num_features=0"),
    ("num_features", -3, ValueError, "num_features=-3"),
    ("num_features", 3.0, TypeError, "num_features=3.0 of type float"),
    ("num_features", "3", TypeError, "num_features='3' of type str"),
    ("eps", 0.0, ValueError, "eps must be a finite number > 0, got eps=0.0"),
    ("eps", -1.0, ValueError, "eps=-1.0"),
    ("eps", float("nan"), ValueError, "eps=nan"),
    ("eps", float("inf"), ValueError, "eps=inf"),
    ("eps", "1e-5", TypeError, "eps='1e-5' of type str"),
    ("momentum", None, TypeError, "momentum=None.*cumulative.*not supported"),
    ("momentum", -0.1, ValueError, r"momentum must be a finite number in \[0, 1\], got momentum=-0.1"),
    ("momentum", 1.5, ValueError, "momentum=1.5"),
    ("momentum", float("nan"), ValueError, "momentum=nan"),
])
def test_batchnorm_refuses_bad_settings_naming_them(layer, argument, value, error, message) -> None:
    """At construction, not at the first forward pass (or never: eps=-1 gives NaN, momentum=None a TypeError
    in the middle of the running-average update, momentum=1.5 running averages that diverge)."""
    settings = {"num_features": 3, **{argument: value}}
    with pytest.raises(error, match=message):
        layer(**settings)


def test_batchnorm_momentum_at_the_ends_of_its_range() -> None:
    x = tt.randn(8, 2)
    assert np.array_equal(nn.BatchNorm1d(2, momentum=0)(x).numpy(), nn.BatchNorm1d(2)(x).numpy())
    frozen, latest = nn.BatchNorm1d(2, momentum=0), nn.BatchNorm1d(2, momentum=1)
    frozen(x), latest(x)
    assert np.array_equal(frozen.running_mean.numpy(), [0, 0])
    np.testing.assert_allclose(latest.running_mean.numpy(), x.numpy().mean(0), rtol=1e-6)


@pytest.mark.parametrize("shape, error, message", [
    (0, ValueError, "normalized_shape must be a whole number >= 1, got normalized_shape=0"),
    (-2, ValueError, "normalized_shape=-2"),
    ((4, 0), ValueError, r"normalized_shape\[1\] must be a whole number >= 1, got normalized_shape\[1\]=0"),
    ((), ValueError, r"normalized_shape must hold at least one size, got normalized_shape=\(\)"),
    (2.5, TypeError, "normalized_shape must be an int or a tuple of ints, got normalized_shape=2.5 of type float"),
    ((4, 2.0), TypeError, r"normalized_shape\[1\]=2.0 of type float"),
    ("ab", TypeError, "normalized_shape='ab' of type str"),
])
def test_layernorm_refuses_a_bad_shape_naming_it(shape, error, message) -> None:
    with pytest.raises(error, match=message):
        nn.LayerNorm(shape)


@pytest.mark.parametrize("eps, error", [(0.0, ValueError), (-1e-5, ValueError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), (None, TypeError)])
def test_layernorm_refuses_a_bad_eps_naming_it(eps, error) -> None:
    with pytest.raises(error, match=f"eps={eps!r}"):
        nn.LayerNorm(4, eps=eps)


def test_layernorm_takes_numpy_integers_and_lists() -> None:
    assert nn.LayerNorm(np.int64(4)).normalized_shape == (4,)
    assert nn.LayerNorm([2, np.int32(3)]).normalized_shape == (2, 3)
    assert type(nn.LayerNorm([2, np.int32(3)]).normalized_shape[1]) is int


def test_batchnorm_state_dict_and_repr() -> None:
    bn = nn.BatchNorm1d(4)
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert bn.state_dict()["num_batches_tracked"].dtype == np.int64
    assert repr(bn) == "BatchNorm1d(4, eps=1e-05, momentum=0.1)"


@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5)])
def test_batchnorm_matches_pytorch(shape) -> None:
    torch = pytest.importorskip("torch")
    bn, reference = nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    rng = np.random.default_rng(0)
    with tt.no_grad():
        bn.weight[...] = tt.tensor([0.5, 1.0, 1.5])
        bn.bias[...] = tt.tensor([0.1, 0.2, 0.3])
    reference.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in bn.state_dict().items()})
    for _ in range(3):
        a = rng.normal(2.0, 3.0, size=shape).astype(np.float32)
        x, tx = tt.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        out, expected = bn(x), reference(tx)
        np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
        g = rng.normal(size=shape).astype(np.float32)
        out.backward(tt.tensor(g))
        expected.backward(torch.from_numpy(g))
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(bn.state_dict()[name].numpy(), value.numpy(), rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(bn.weight.grad.numpy(), reference.weight.grad.numpy(), rtol=1e-4)
    np.testing.assert_allclose(bn.bias.grad.numpy(), reference.bias.grad.numpy(), rtol=1e-4)
    bn.eval(), reference.eval()
    a = rng.normal(size=shape).astype(np.float32)
    np.testing.assert_allclose(bn(tt.tensor(a)).numpy(), reference(torch.from_numpy(a)).detach().numpy(),
                               rtol=1e-4, atol=1e-5)


def test_layernorm_matches_pytorch() -> None:
    torch = pytest.importorskip("torch")
    layer, reference = nn.LayerNorm((2, 3)), torch.nn.LayerNorm((2, 3))
    with tt.no_grad():
        layer.weight[...] = tt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    reference.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in layer.state_dict().items()})
    a = np.random.default_rng(0).normal(size=(4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(layer(tt.tensor(a)).numpy(), reference(torch.from_numpy(a)).detach().numpy(),
                               rtol=1e-4, atol=1e-5)


# -- a whole model on a device ------------------------------------------------------------------

def test_mlp_trains_on_every_device(device) -> None:
    """A few SGD steps on a tiny problem, entirely on ``device``: the loss goes down."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.LayerNorm(16), nn.GELU(), nn.Dropout(0.1),
                          nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(64, 4))
    x = tt.tensor(a, device=device)
    y = tt.tensor((a[:, :1] * a[:, 1:2] > 0).astype(np.float32), device=device)
    losses = []
    for _ in range(30):
        model.zero_grad()
        loss = ((model(x).sigmoid() - y) ** 2).mean()
        loss.backward()
        with tt.no_grad():
            for p in model.parameters():
                assert p.grad is not None and p.grad.device == p.device
                p[...] = p - 0.5 * p.grad
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    model.eval()
    with tt.no_grad():
        assert model(x).shape == (64, 1)
