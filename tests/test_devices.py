"""The whole library on every device, with no change to model code (Module 12).

Every case below is written once, device-agnostically -- tensors are created
with ``device=device``, models are built as usual and moved with
``model.to(device)`` -- and runs on:

* ``cpu``: NumPy, the reference every other device is compared with;
* ``strict``: the stand-in device whose arrays, like CuPy's, refuse implicit
  conversion to NumPy and refuse mixing devices (a host/device leak fails here);
* ``fakecuda:1``: the package's CUDA backend, :class:`tinytrain.cuda.CupyBackend`,
  driving a FAKE CuPy with two fake GPUs (:mod:`tinytrain.testing.fake_cupy`; not a GPU),
  on its *second* GPU, so the CUDA backend's own code -- the current device,
  host copies, scatter-add routing, the random stream -- runs under the whole
  library;
* ``cuda``: a real GPU, skipped unless CuPy sees one.

On ``strict`` and ``fakecuda:1`` the arithmetic is NumPy's, so values must equal
the CPU's exactly (but for a convolution with a bias and attention's softmax: see
``ROUNDED_ANOTHER_WAY``);
on ``cuda`` they must agree to float32 tolerance.

Inventory tests make the coverage a contract: every ``Function`` subclass in
``tinytrain`` must run in one of these cases, and every public layer, loss,
functional and optimizer must have a case, so a new op cannot skip the devices.
"""
from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import tinytrain as tt
import tinytrain.nn.functional as F
from tinytrain import autograd, nn, optim, quantization
from tinytrain.kernels.layer_norm import compiled_kernels_available
from tinytrain.nn.flash_attention import flash_attention
from tinytrain.serialization import read_checkpoint
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.testing.fake_cupy import forget_fake_gpu, register_fake_gpu

REPO = Path(__file__).resolve().parents[1]


def _cuda_available() -> bool:
    try:
        tt.get_backend("cuda")
    except (RuntimeError, ValueError):
        return False
    return True


FAKE = "fakecuda:1"
OTHER = "strict:1"  # a device none of the parametrised ones is: for crossing and mixing


@pytest.fixture(scope="module", autouse=True)
def fake_gpu():
    """Devices fakecuda:0 and fakecuda:1: the package's CupyBackend on a fake CuPy (two fake GPUs)."""
    from tinytrain.cuda import CupyBackend

    fake = register_fake_gpu(CupyBackend, devices=2)
    yield fake
    forget_fake_gpu()


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("cpu", id="cpu"),
        pytest.param("strict", id="strict"),
        pytest.param(FAKE, id="fakecuda"),
        pytest.param("cuda", id="cuda",
                     marks=pytest.mark.skipif(not _cuda_available(), reason="needs CuPy and a CUDA GPU")),
    ],
)
def device(request, fake_gpu) -> str:
    """The device a case runs on (this module's own list: it adds the fake GPU)."""
    return request.param


def backend(device: str):
    return tt.get_backend(device)


# Cases whose CPU result is rounded another way than every other device's: on NumPy a convolution runs the
# library's kernel (tinytrain.kernels.convolution), whose matrix product adds the bias as the weight of a row of
# ones; elsewhere it runs the lesson's recipe, which adds the bias to the product's result. Attention's softmax
# (tinytrain.kernels.softmax) shifts the scores of a NumPy array by its largest one where that is safe, and
# elsewhere each row by its own maximum (a GPU would have to wait to read the check back). With numba
# installed, a NumPy LayerNorm runs compiled loops (tinytrain.kernels.layer_norm) that add in another order.
ROUNDED_ANOTHER_WAY = {"F_conv2d", "Conv2d", "F_scaled_dot_product_attention", "F_scaled_dot_product_attention_mask",
                       "CausalSelfAttention", "CachedSelfAttention", "Block", "GPT"} | (
    {"LayerNorm"} if compiled_kernels_available() else set())


def assert_same(device: str, got: np.ndarray, expected: np.ndarray, what: str = "", exact: bool = True) -> None:
    """Equal to the CPU's result: bit for bit on NumPy-backed devices (unless not ``exact``: then to float32
    rounding), to float32 tolerance on a GPU."""
    if device == "cuda":
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5, err_msg=what)
    elif not exact:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def on_device(device: str, *tensors: tt.Tensor) -> bool:
    target = backend(device)
    return all(t._backend is target and target.is_array(t.data) for t in tensors)


RNG = np.random.default_rng(2024)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def positive(*shape: int) -> np.ndarray:
    return RNG.uniform(0.5, 2.0, shape).astype(np.float32)


def labels(n: int, classes: int) -> np.ndarray:
    return RNG.integers(0, classes, n)


# -- operations: forward and backward of every differentiable op ----------------------------------
LABELS, PROBABILITIES = labels(6, 4), RNG.dirichlet(np.ones(4), 6)


def seeded_linear(in_features: int, out_features: int) -> nn.Linear:
    """The same Linear layer on every call: its weights drawn after seeding, on the CPU."""
    tt.manual_seed(0)
    return nn.Linear(in_features, out_features)
TOKENS = np.array([[1, 4, 1], [0, 1, 1]])  # repeated ids: the embedding's backward adds them up
TINY_GPT = nn.GPTConfig(vocab_size=6, block_size=4, n_layer=1, n_head=2, n_embd=6)
ATTENTION_MASK = np.array([[True, False, True], [False, False, False], [True, True, True]])  # row 1: nothing allowed
REGRESSION, BINARY = normal(6, 2), RNG.random(6)
# name -> (input arrays (all get requires_grad), fn(device, *tensors) -> Tensor)
OPS = {
    "amp_scale_grad": ([normal(3, 4)], lambda d, a: tt.amp.ScaleGrad.apply(a, scale=8.0)),
    "add_broadcast": ([normal(3, 4), normal(4)], lambda d, a, b: a + b),
    "sub_broadcast": ([normal(3, 4), normal(3, 1)], lambda d, a, b: a - b),
    "mul_scalar_and_tensor": ([normal(3, 4), normal(1, 4)], lambda d, a, b: a * b * 0.5),
    "div": ([normal(3, 4), positive(3, 4)], lambda d, a, b: a / b + 1 / b),
    "neg": ([normal(5)], lambda d, a: -a),
    "pow_scalar": ([normal(3, 4)], lambda d, a: a**2),
    "pow_tensor": ([positive(3, 4), normal(3, 4)], lambda d, a, b: a**b),
    "matmul": ([normal(3, 4), normal(4, 5)], lambda d, a, b: a @ b),
    "matmul_batched": ([normal(2, 3, 4), normal(4, 5)], lambda d, a, b: a @ b),
    "sum_axes": ([normal(2, 3, 4)], lambda d, a: a.sum(axis=(0, 2))),
    "mean_keepdims": ([normal(3, 4)], lambda d, a: a.mean(axis=1, keepdims=True)),
    "max_min": ([normal(3, 4)], lambda d, a: a.max(axis=0) + a.min()),
    "reshape_transpose": ([normal(3, 4)], lambda d, a: a.reshape(2, 6).T.transpose(1, 0).reshape((12,))),
    "getitem_slices": ([normal(4, 5)], lambda d, a: a[1:, ::2]),
    "getitem_repeated_list": ([normal(4, 3)], lambda d, a: a[[0, 2, 0, 0]]),  # backward: scatter-add
    "getitem_host_index": ([normal(4, 3)], lambda d, a: a[np.array([1, 1, 3])]),
    "getitem_device_index": ([normal(5)], lambda d, a: a[tt.tensor([4, 0, 4, 4], device=d)]),
    "getitem_pairs": ([normal(3, 4)], lambda d, a: a[[0, 0, 2], [1, 1, 3]]),
    "getitem_mask": ([normal(3, 4)], lambda d, a: a[a > 0]),
    "exp_log_sqrt": ([positive(3, 4)], lambda d, a: a.exp() + a.log() + a.sqrt()),
    "tanh_sigmoid_relu_abs": ([normal(3, 4)], lambda d, a: a.tanh() + a.sigmoid() + a.relu() + a.abs()),
    "clip": ([normal(3, 4)], lambda d, a: a.clip(-0.5, 0.5)),
    "softmax": ([normal(3, 4)], lambda d, a: a.softmax(axis=1)),
    "log_softmax": ([normal(3, 4)], lambda d, a: a.log_softmax(axis=0)),
    "stack": ([normal(3, 4), normal(3, 4)], lambda d, a, b: tt.stack([a, b], axis=1)),
    "concatenate": ([normal(2, 4), normal(3, 4)], lambda d, a, b: tt.concatenate([a, b], axis=0)),
    "where": ([normal(3, 4), normal(3, 4)], lambda d, a, b: tt.where(a > b, a, b * 2)),
    "astype": ([normal(3, 4)], lambda d, a: a.astype("float64") * 2),
    "to_another_device_and_back": ([normal(3, 4)], lambda d, a: (a.to(OTHER) * 3).to(d)),
    # functional forms
    "F_activations": ([normal(3, 4)], lambda d, a: F.relu(a) + F.sigmoid(a) + F.tanh(a) + F.gelu(a)),
    "F_softmaxes": ([normal(3, 4)], lambda d, a: F.softmax(a, axis=-1) + F.log_softmax(a, axis=0)),
    "F_linear": ([normal(5, 4), normal(3, 4), normal(3)], lambda d, x, w, b: F.linear(x, w, b)),
    "F_dropout_eval": ([normal(3, 4)], lambda d, a: F.dropout(a, 0.5, training=False)),
    "F_cross_entropy": ([normal(6, 4)], lambda d, z: F.cross_entropy(z, tt.tensor(LABELS, device=d))),
    "F_cross_entropy_probs": ([normal(6, 4)],
                              lambda d, z: F.cross_entropy(z, tt.tensor(PROBABILITIES, device=d))),
    "F_mse_loss": ([normal(6, 2)], lambda d, p: F.mse_loss(p, tt.tensor(REGRESSION, device=d))),
    "F_binary_cross_entropy": ([normal(6)],
                               lambda d, z: F.binary_cross_entropy(z.sigmoid(), tt.tensor(BINARY, device=d))),
    "F_binary_cross_entropy_with_logits": (
        [normal(6)], lambda d, z: F.binary_cross_entropy_with_logits(z, tt.tensor(BINARY, device=d))),
    "F_conv2d": ([normal(2, 3, 7, 7), normal(4, 3, 3, 3), normal(4)],
                 lambda d, x, w, b: F.conv2d(x, w, b, stride=2, padding=1)),
    "F_conv2d_no_bias": ([normal(1, 2, 5, 5), normal(3, 2, 2, 2)], lambda d, x, w: F.conv2d(x, w)),
    "F_max_pool2d": ([normal(2, 3, 6, 6)], lambda d, x: F.max_pool2d(x, 2) + F.max_pool2d(x, 2, stride=2)),
    "F_max_pool2d_overlapping": ([normal(1, 2, 7, 7)], lambda d, x: F.max_pool2d(x, 3, stride=2)),
    "F_avg_pool2d": ([normal(2, 3, 6, 6)], lambda d, x: F.avg_pool2d(x, 2)),
    "F_avg_pool2d_overlapping": ([normal(1, 2, 7, 7)], lambda d, x: F.avg_pool2d(x, 3, stride=2)),
    "F_embedding": ([normal(5, 3)], lambda d, w: F.embedding(tt.tensor(TOKENS, device=d), w)),  # backward: scatter-add
    "F_scaled_dot_product_attention": ([normal(2, 4, 3), normal(2, 5, 3), normal(2, 5, 2)],
                                       lambda d, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    "F_scaled_dot_product_attention_mask": (
        [normal(2, 3, 4), normal(2, 3, 4), normal(2, 3, 2)],
        lambda d, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=tt.tensor(ATTENTION_MASK, device=d))),
    "F_scaled_dot_product_attention_flash": (  # FlashAttention: tiles of 2 that do not divide L=5, S=7
        [normal(2, 5, 3), normal(2, 7, 3), normal(2, 7, 2)],
        lambda d, q, k, v: flash_attention(q, k, v, is_causal=True, block_size=2)),
    "F_distillation_loss": ([normal(6, 4), normal(6, 4)],
                            lambda d, s, t: F.distillation_loss(s, t, tt.tensor(LABELS, device=d), temperature=2.0)),
    # Module 19: fake quantization's straight-through gradient, and a frozen int8 layer's input gradient
    "fake_quantize": ([normal(3, 4)], lambda d, a: quantization.fake_quantize(a, 0.1, 0)),
    "quantized_linear": ([normal(5, 4)], lambda d, x: quantization.QuantizedLinear.from_linear(
        seeded_linear(4, 3).to(d))(x)),
}
FUNCTIONAL_CASES = {  # every public name of tt.nn.functional -> the OPS cases that run it
    "relu": "F_activations", "sigmoid": "F_activations", "tanh": "F_activations", "gelu": "F_activations",
    "softmax": "F_softmaxes", "log_softmax": "F_softmaxes", "linear": "F_linear", "dropout": "F_dropout_eval",
    "cross_entropy": "F_cross_entropy", "mse_loss": "F_mse_loss", "binary_cross_entropy": "F_binary_cross_entropy",
    "binary_cross_entropy_with_logits": "F_binary_cross_entropy_with_logits", "conv2d": "F_conv2d",
    "max_pool2d": "F_max_pool2d", "avg_pool2d": "F_avg_pool2d", "embedding": "F_embedding",
    "scaled_dot_product_attention": "F_scaled_dot_product_attention", "distillation_loss": "F_distillation_loss",
}


def run_op(device: str, name: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """Output and input gradients of case ``name`` on ``device``; checks everything stayed there."""
    arrays, fn = OPS[name]
    inputs = [tt.tensor(array, requires_grad=True, device=device) for array in arrays]
    out = fn(device, *inputs)
    assert on_device(device, out), f"{name}: the result left {device}"
    upstream = np.random.default_rng(len(name)).standard_normal(out.shape).astype(out.dtype)
    out.backward(tt.tensor(upstream, dtype=out.dtype, device=device))
    for x in inputs:
        assert x.grad is None or on_device(device, x.grad), f"{name}: a gradient left {device}"
    return out.numpy(), [None if x.grad is None else x.grad.numpy() for x in inputs]


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_forward_and_backward_matches_the_cpu(device: str, name: str) -> None:
    expected_out, expected_grads = run_op("cpu", name)
    out, grads = run_op(device, name)
    exact = name not in ROUNDED_ANOTHER_WAY
    assert_same(device, out, expected_out, f"{name} forward", exact)
    for i, (got, expected) in enumerate(zip(grads, expected_grads)):
        assert (got is None) == (expected is None), f"{name}: input {i} has a gradient on one device only"
        if got is not None:
            assert_same(device, got, expected, f"{name} gradient of input {i}", exact)


def test_comparisons_argmax_and_reads(device: str) -> None:
    a, b = normal(3, 4), normal(3, 4)
    x, y = tt.tensor(a, device=device), tt.tensor(b, device=device)
    for op, expected in ((x < y, a < b), (x <= y, a <= b), (x > y, a > b), (x >= y, a >= b),
                         (x == x, np.ones_like(a, bool)), (x != y, a != b)):
        assert on_device(device, op) and op.dtype == np.bool_
        np.testing.assert_array_equal(op.numpy(), expected)
    np.testing.assert_array_equal(x.argmax(axis=1).numpy(), a.argmax(axis=1))
    assert float(x.sum()) == pytest.approx(float(a.sum()), rel=1e-5)
    assert isinstance(x[0, 0].item(), float) and bool(x[0, 0] == x[0, 0])
    with tt.no_grad():
        x[0] = 7.0
    assert x.numpy()[0].tolist() == [7.0] * 4


def test_factories_make_tensors_on_the_device(device: str) -> None:
    for t in (tt.zeros(2, 3, device=device), tt.ones((2,), device=device), tt.randn(4, device=device),
              tt.rand(2, 2, device=device), tt.arange(5, device=device), tt.tensor([1, 2], device=device)):
        assert on_device(device, t)
    tt.manual_seed(3)
    first = tt.randn(5, device=device).numpy(), tt.rand(5, device=device).numpy()
    tt.manual_seed(3)
    assert np.array_equal(tt.randn(5, device=device).numpy(), first[0])
    assert np.array_equal(tt.rand(5, device=device).numpy(), first[1])


def test_mixing_devices_is_refused(device: str) -> None:
    x = tt.ones(3, device=device)
    with pytest.raises(RuntimeError, match="same device"):
        x + tt.ones(3, device=OTHER)
    with pytest.raises(RuntimeError, match="same device"):
        F.cross_entropy(tt.ones((2, 3), device=device), tt.tensor([0, 1], device=OTHER))


def test_dropout_in_training_uses_the_device_generator(device: str) -> None:
    x = tt.tensor(positive(200, 50), requires_grad=True, device=device)
    tt.manual_seed(0)
    out = F.dropout(x, 0.25, training=True)
    assert on_device(device, out)
    kept = out.numpy() != 0
    assert 0.70 < kept.mean() < 0.80
    np.testing.assert_allclose(out.numpy()[kept], x.numpy()[kept] / 0.75, rtol=1e-6)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.75, rtol=1e-6)
    tt.manual_seed(0)
    assert np.array_equal(F.dropout(x, 0.25, training=True).numpy() != 0, kept), "seeded masks repeat"


# -- layers and losses: built as usual, moved with .to(device) ---------------------------------
class WithModuleList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).tanh()
        return x


# name -> (make the module (seeded, on the CPU), input arrays, extra constant arrays for the call)
MODULES = {
    "Linear": (lambda: nn.Linear(4, 3), [normal(5, 4)], []),
    "Sequential_activations": (lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Sigmoid(), nn.Tanh(), nn.GELU(),
                                                     nn.Softmax(axis=-1), nn.LogSoftmax(axis=-1)), [normal(5, 4)], []),
    "ModuleList": (WithModuleList, [normal(5, 4)], []),
    "Flatten": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 2)), [normal(2, 3, 4)], []),
    "Dropout_eval": (lambda: nn.Dropout(0.5).eval(), [normal(5, 4)], []),
    "LayerNorm": (lambda: nn.LayerNorm(4), [normal(5, 4)], []),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(4), [normal(6, 4)], []),
    "BatchNorm1d_eval": (lambda: nn.BatchNorm1d(4).eval(), [normal(6, 4)], []),
    "Conv2d": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), [normal(2, 3, 7, 7)], []),
    "Conv2d_no_bias": (lambda: nn.Conv2d(2, 2, 2, bias=False), [normal(1, 2, 5, 5)], []),
    "MaxPool2d": (lambda: nn.MaxPool2d(2), [normal(2, 3, 6, 6)], []),
    "AvgPool2d": (lambda: nn.AvgPool2d(3, stride=2), [normal(1, 2, 7, 7)], []),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3), [normal(2, 3, 4, 4)], []),
    "BatchNorm2d_eval": (lambda: nn.BatchNorm2d(3).eval(), [normal(2, 3, 4, 4)], []),
    "Checkpoint": (lambda: nn.Checkpoint(nn.Sequential(nn.Linear(4, 6), nn.Tanh())), [normal(5, 4)], []),
    "MSELoss": (nn.MSELoss, [normal(6, 2)], [normal(6, 2)]),
    "CrossEntropyLoss": (nn.CrossEntropyLoss, [normal(6, 4)], [labels(6, 4)]),
    "BCELoss": (nn.BCELoss, [RNG.uniform(0.1, 0.9, 6).astype(np.float32)], [RNG.random(6)]),
    "BCEWithLogitsLoss": (nn.BCEWithLogitsLoss, [normal(6)], [RNG.random(6)]),
    "Embedding": (lambda: nn.Embedding(6, 3), [], [TOKENS]),
    "LearnedPositionalEncoding": (lambda: nn.LearnedPositionalEncoding(5, 3), [normal(2, 4, 3)], []),
    "SinusoidalPositionalEncoding": (lambda: nn.SinusoidalPositionalEncoding(5, 4), [normal(2, 4, 4)], []),
    "CausalSelfAttention": (lambda: nn.CausalSelfAttention(6, 2), [normal(2, 4, 6)], []),
    "CachedSelfAttention": (lambda: nn.CachedSelfAttention(6, 2), [normal(2, 4, 6)], []),
    "MLP": (lambda: nn.MLP(TINY_GPT), [normal(2, 4, 6)], []),
    "Block": (lambda: nn.Block(TINY_GPT), [normal(2, 4, 6)], []),
    "GPT": (lambda: nn.GPT(TINY_GPT), [], [TOKENS]),
}
MODULE_CASES = {  # every public Module class of tt.nn -> a case that runs it
    "Linear": "Linear", "ReLU": "Sequential_activations", "Sigmoid": "Sequential_activations",
    "Tanh": "Sequential_activations", "GELU": "Sequential_activations", "Softmax": "Sequential_activations",
    "LogSoftmax": "Sequential_activations", "Sequential": "Sequential_activations", "ModuleList": "ModuleList",
    "Flatten": "Flatten", "Dropout": "Dropout_eval", "LayerNorm": "LayerNorm", "BatchNorm1d": "BatchNorm1d",
    "Conv2d": "Conv2d", "MaxPool2d": "MaxPool2d", "AvgPool2d": "AvgPool2d", "BatchNorm2d": "BatchNorm2d",
    "MSELoss": "MSELoss", "CrossEntropyLoss": "CrossEntropyLoss", "BCELoss": "BCELoss",
    "BCEWithLogitsLoss": "BCEWithLogitsLoss", "Checkpoint": "Checkpoint", "Embedding": "Embedding",
    "LearnedPositionalEncoding": "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding": "SinusoidalPositionalEncoding", "CausalSelfAttention": "CausalSelfAttention",
    "CachedSelfAttention": "CachedSelfAttention", "MLP": "MLP", "Block": "Block", "GPT": "GPT",
}


def run_module(device: str, name: str) -> dict[str, np.ndarray]:
    """Outputs, gradients and state of module case ``name`` on ``device``."""
    make, inputs, constants = MODULES[name]
    tt.manual_seed(0)
    module = make().to(device)  # the only device-specific line: the model code is the same everywhere
    xs = [tt.tensor(x, requires_grad=True, device=device) for x in inputs]
    out = module(*xs, *[tt.tensor(c, device=device) for c in constants])
    assert on_device(device, out), f"{name}: the output left {device}"
    upstream = np.random.default_rng(7).standard_normal(out.shape).astype(out.dtype)
    out.backward(tt.tensor(upstream, device=device))
    found = {"output": out.numpy()}
    found.update({f"input {i} grad": x.grad.numpy() for i, x in enumerate(xs)})
    for key, tensor in module.state_dict().items():
        assert on_device(device, tensor), f"{name}: {key} left {device}"
        found[key] = tensor.numpy()
    for key, parameter in module.named_parameters():
        assert on_device(device, parameter.grad), f"{name}: the gradient of {key} left {device}"
        found[f"{key} grad"] = parameter.grad.numpy()
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_layer_and_loss_matches_the_cpu(device: str, name: str) -> None:
    expected = run_module("cpu", name)
    got = run_module(device, name)
    assert got.keys() == expected.keys()
    for key in expected:
        assert_same(device, got[key], expected[key], f"{name}: {key}", name not in ROUNDED_ANOTHER_WAY)


# -- optimizers ------------------------------------------------------------------------------------------
OPTIMIZERS = {
    "SGD": lambda params: optim.SGD(params, lr=0.1),
    "SGD_momentum_nesterov_decay": lambda params: optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True,
                                                            weight_decay=0.01),
    "Adam": lambda params: optim.Adam(params, lr=0.01, weight_decay=0.01),
    "AdamW": lambda params: optim.AdamW(params, lr=0.01),
}
OPTIMIZER_CASES = {"SGD": "SGD_momentum_nesterov_decay", "Adam": "Adam", "AdamW": "AdamW"}
X, Y = normal(16, 4), labels(16, 3)


def small_model() -> nn.Module:
    tt.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def optimize(device: str, name: str, steps: int = 3):
    model = small_model().to(device)
    optimizer = OPTIMIZERS[name](model.parameters())
    x, y = tt.tensor(X, device=device), tt.tensor(Y, device=device)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(x), y).backward()
        optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_steps_on_the_device(device: str, name: str) -> None:
    reference, _ = optimize("cpu", name)
    model, optimizer = optimize(device, name)
    for (key, p), q in zip(model.named_parameters(), reference.parameters()):
        assert on_device(device, p, p.grad)
        assert_same(device, p.numpy(), q.numpy(), f"{name}: {key}")
    for state in optimizer.state:
        for key, value in state.items():
            if hasattr(value, "shape"):
                assert backend(device).is_array(value), f"{name}: optimizer state {key} is not on {device}"
    saved = optimizer.state_dict()  # host copies: loads into an optimizer on any device
    assert all(type(v) is not tt.Tensor for s in saved["state"] for v in s.values())
    on_cpu, cpu_optimizer = optimize("cpu", name, steps=0)
    for p, q in zip(on_cpu.parameters(), model.parameters()):
        with tt.no_grad():
            p[...] = q.to("cpu")
    cpu_optimizer.load_state_dict(pickle.loads(pickle.dumps(saved)))
    for optimizer_, model_, dev in ((optimizer, model, device), (cpu_optimizer, on_cpu, "cpu")):
        optimizer_.zero_grad()
        nn.CrossEntropyLoss()(model_(tt.tensor(X, device=dev)), tt.tensor(Y, device=dev)).backward()
        optimizer_.step()
    for p, q in zip(model.parameters(), on_cpu.parameters()):
        assert_same(device, p.numpy(), q.numpy(), f"{name}: one more step after moving the state to the CPU")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_state_follows_the_model_to_another_device(device: str, name: str) -> None:
    straight, _ = optimize("cpu", name, steps=4)
    model, optimizer = optimize("cpu", name, steps=2)
    for target in (device, "cpu"):  # there, one step, and back again
        model.to(target)
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(tt.tensor(X, device=target)), tt.tensor(Y, device=target)).backward()
        optimizer.step()
        for state in optimizer.state:
            for key, value in state.items():
                if hasattr(value, "shape"):
                    assert backend(target).is_array(value), f"{name}: state {key} stayed behind on the way to {target}"
    for p, q in zip(model.parameters(), straight.parameters()):
        assert_same(device, p.numpy(), q.numpy(), f"{name}: after moving there and back")


def test_the_optimizer_state_follows_the_model_through_load_state_dict(device: str) -> None:
    model, optimizer = optimize("cpu", "Adam", steps=2)
    straight, straight_optimizer = optimize("cpu", "Adam", steps=3)
    model.to(device)
    optimizer.load_state_dict(optimizer.state_dict())  # moves the state to each parameter's device
    optimizer.zero_grad()
    nn.CrossEntropyLoss()(model(tt.tensor(X, device=device)), tt.tensor(Y, device=device)).backward()
    optimizer.step()
    for p, q in zip(model.parameters(), straight.parameters()):
        assert on_device(device, p)
        assert_same(device, p.numpy(), q.numpy())


# -- Module.to -------------------------------------------------------------------------------------------
def test_module_to_moves_everything_in_place_and_back(device: str) -> None:
    model = small_model()
    x = tt.tensor(X)
    model(x).sum().backward()  # gradients and BatchNorm's running statistics exist before the move
    params, grads = model.parameters(), [p.grad for p in model.parameters()]
    before = {k: v.numpy() for k, v in model.state_dict().items()}
    assert model.to(device) is model
    assert all(a is b for a, b in zip(model.parameters(), params)), "the Parameter objects stay the same"
    assert all(p.grad is g for p, g in zip(model.parameters(), grads)), "so do their gradient tensors"
    assert on_device(device, *model.parameters(), *model.buffers(), *grads)
    assert model[1].num_batches_tracked.dtype == np.int64
    model.to(device)  # moving to where it is changes nothing
    model.to(OTHER).to("cpu")
    after = {k: v.numpy() for k, v in model.state_dict().items()}
    assert all(np.array_equal(before[k], after[k]) for k in before), "a round trip keeps every value"


def test_module_to_moves_shared_parameters_once(device: str) -> None:
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.ReLU(), shared).to(device)
    assert len(model.parameters()) == 2 and on_device(device, *model.parameters())
    model(tt.ones(2, 3, device=device)).sum().backward()
    assert on_device(device, shared.weight.grad)


def test_a_model_moved_with_to_runs_on_inputs_of_its_device_only(device: str) -> None:
    model = small_model().to(device)
    assert on_device(device, model(tt.tensor(X, device=device)))
    with pytest.raises((RuntimeError, TypeError)):
        model(tt.tensor(X, device=OTHER))


def test_deepcopy_and_pickle_keep_the_device(device: str) -> None:
    model = small_model().to(device)
    clone = copy.deepcopy(model)
    assert on_device(device, *clone.parameters(), *clone.buffers())
    assert all(a.data is not b.data for a, b in zip(clone.parameters(), model.parameters()))
    state = pickle.loads(pickle.dumps({k: v.numpy() for k, v in model.state_dict().items()}))
    fresh = small_model()
    fresh.load_state_dict(state)
    for a, b in zip(fresh.parameters(), model.parameters()):
        assert np.array_equal(a.numpy(), b.numpy())


# -- DataLoader(device=) ------------------------------------------------------------------------------------
def test_the_loader_delivers_every_batch_on_its_device(device: str) -> None:
    features = RNG.random((23, 2, 3))
    targets = np.arange(23) % 4
    loader = DataLoader(TensorDataset(features, targets), batch_size=5, shuffle=True, seed=4, device=device)
    reference = DataLoader(TensorDataset(features, targets), batch_size=5, shuffle=True, seed=4)
    assert loader.device == backend(device).device
    for _ in range(2):  # two epochs: the order is the host generator's, the same on every device
        for (x, y), (rx, ry) in zip(loader, reference, strict=True):
            assert on_device(device, x, y) and (x.dtype, y.dtype) == (np.float32, np.int64)
            np.testing.assert_array_equal(x.numpy(), rx.numpy())
            np.testing.assert_array_equal(y.numpy(), ry.numpy())


def test_a_dataset_of_tensors_on_one_device_feeds_a_loader_on_another(device: str) -> None:
    source = "cpu" if device != "cpu" else OTHER
    data = TensorDataset(tt.tensor(normal(7, 3), device=source), tt.tensor(labels(7, 2), device=source))
    batches = list(DataLoader(data, batch_size=4, device=device))
    assert len(batches) == 2 and all(on_device(device, *batch) for batch in batches)


# -- the Trainer keeps data and model on one device -----------------------------------------------------------
DATA = TensorDataset(normal(96, 6), labels(96, 3))


def trainer_on(device: str, dropout: float = 0.0) -> tt.Trainer:
    tt.manual_seed(0)
    layers = [nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else [])
    model = nn.Sequential(*layers, nn.Linear(16, 3)).to(device)
    return tt.Trainer(model, optim.Adam(model.parameters(), lr=0.02), nn.CrossEntropyLoss(),
                      scheduler=tt.CosineSchedule(max_lr=0.02, min_lr=0.002, total_epochs=4), grad_clip_norm=1.0)


def loaders(device: str) -> tuple[DataLoader, DataLoader]:
    return (DataLoader(DATA, batch_size=16, shuffle=True, seed=1, device=device),
            DataLoader(DATA, batch_size=32, device=device))


def test_the_trainer_trains_evaluates_and_keeps_everything_on_the_device(device: str) -> None:
    reference = trainer_on("cpu")
    reference.fit(*loaders("cpu"), epochs=2, accumulation_steps=2, progress=False)
    trainer = trainer_on(device)
    history = trainer.fit(*loaders(device), epochs=2, accumulation_steps=2, progress=False)
    model = trainer.model
    assert on_device(device, *model.parameters(), *model.buffers(), *[p.grad for p in model.parameters()])
    for state in trainer.optimizer.state:
        assert all(backend(device).is_array(v) for v in state.values() if hasattr(v, "shape"))
    for key in ("train_loss", "eval_loss", "eval_accuracy", "grad_norm"):
        np.testing.assert_allclose(history[key], reference.history[key], rtol=0 if device != "cuda" else 1e-4,
                                   err_msg=key)
    for p, q in zip(model.parameters(), reference.model.parameters()):
        assert_same(device, p.numpy(), q.numpy())
    loss, accuracy = trainer.evaluate(loaders(device)[1])
    assert isinstance(loss, float) and 0.0 <= accuracy <= 1.0


def test_the_trainer_refuses_data_on_another_device_than_the_model(device: str) -> None:
    trainer = trainer_on(device)
    with pytest.raises((RuntimeError, TypeError), match="device|strict"):
        trainer.train_epoch(DataLoader(DATA, batch_size=16, device=OTHER))


# -- checkpoints: saved on one device, loaded on another ------------------------------------------------------
def test_a_checkpoint_holds_host_data_only(device: str, tmp_path: Path) -> None:
    trainer = trainer_on(device)
    trainer.fit(loaders(device)[0], epochs=1, progress=False)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    state = read_checkpoint(tmp_path / "c.ckpt")  # the safe unpickler builds NumPy arrays and plain data only

    def arrays(value):
        if isinstance(value, dict):
            return [a for item in value.values() for a in arrays(item)]
        if isinstance(value, list):
            return [a for item in value for a in arrays(item)]
        return [value] if hasattr(value, "shape") else []

    found = arrays(state["model"]) + arrays(state["optimizer"])
    assert found and all(type(a) is np.ndarray for a in found)
    assert backend(device).device in state["rng"]["backends"]


@pytest.mark.parametrize("source,target", [("strict", "cpu"), ("cpu", "strict"), (FAKE, "cpu"), ("cpu", FAKE),
                                           (FAKE, "strict")])
def test_a_checkpoint_saved_on_one_device_resumes_on_another(source: str, target: str, tmp_path: Path) -> None:
    straight = trainer_on(source)
    straight.fit(*loaders(source), epochs=4, progress=False)
    first = trainer_on(source)
    first.fit(*loaders(source), epochs=2, progress=False)
    first.save_checkpoint(tmp_path / "half.ckpt")
    resumed = trainer_on(target)
    resumed.load_checkpoint(tmp_path / "half.ckpt")
    assert (resumed.epoch, resumed.step) == (first.epoch, first.step)
    assert on_device(target, *resumed.model.parameters(), *resumed.model.buffers())
    for state in resumed.optimizer.state:
        assert all(backend(target).is_array(v) for v in state.values() if hasattr(v, "shape"))
    resumed.fit(*loaders(target), epochs=4, progress=False)
    for p, q in zip(resumed.model.parameters(), straight.model.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())  # no dropout: nothing draws on the devices
    assert resumed.history["train_loss"] == straight.history["train_loss"]


@pytest.mark.parametrize("where", ["strict", FAKE])
def test_resume_on_the_device_is_bit_identical_with_dropout(where: str, tmp_path: Path) -> None:
    """Dropout draws from the device's generator: its state must travel in the checkpoint."""
    straight = trainer_on(where, dropout=0.3)
    straight.fit(*loaders(where), epochs=4, progress=False)
    first = trainer_on(where, dropout=0.3)
    first.fit(*loaders(where), epochs=2, progress=False)
    first.save_checkpoint(tmp_path / "half.ckpt")
    tt.manual_seed(99)  # a different start: everything must come from the checkpoint
    resumed = trainer_on(where, dropout=0.3)
    tt.manual_seed(99)
    resumed.load_checkpoint(tmp_path / "half.ckpt")
    resumed.fit(*loaders(where), epochs=4, progress=False)
    for p, q in zip(resumed.model.parameters(), straight.model.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_a_gpu_checkpoint_loads_in_a_process_that_has_no_such_device(tmp_path: Path) -> None:
    trainer = trainer_on(FAKE)
    trainer.fit(loaders(FAKE)[0], epochs=1, progress=False)
    trainer.save_checkpoint(tmp_path / "gpu.ckpt")
    weights = {k: v.numpy() for k, v in trainer.model.state_dict().items()}
    np.savez(tmp_path / "weights.npz", **weights)
    script = textwrap.dedent(
        f"""
        import warnings
        import numpy as np
        import tinytrain as tt
        from tinytrain import nn, optim
        tt.manual_seed(5)
        model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
        trainer = tt.Trainer(model, optim.Adam(model.parameters(), lr=0.02), nn.CrossEntropyLoss(),
                             scheduler=tt.CosineSchedule(max_lr=0.02, min_lr=0.002, total_epochs=4))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.load_checkpoint({str(tmp_path / "gpu.ckpt")!r})
        assert any("fakecuda:1" in str(w.message) for w in caught), [str(w.message) for w in caught]
        expected = np.load({str(tmp_path / "weights.npz")!r})
        for name, tensor in model.state_dict().items():
            assert np.array_equal(tensor.numpy(), expected[name]), name
        assert all(p.device == "cpu" for p in model.parameters())
        print("loaded", trainer.epoch)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "loaded 1" in result.stdout


# -- inventory: nothing escapes the devices ------------------------------------------------------------------
def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_every_function_in_tinytrain_runs_in_a_device_case(monkeypatch) -> None:
    seen: set[type] = set()
    apply = autograd.Function.apply.__func__

    def spy(cls, *inputs, **params):
        seen.add(cls)
        return apply(cls, *inputs, **params)

    monkeypatch.setattr(autograd.Function, "apply", classmethod(spy))
    for name in OPS:
        run_op("strict", name)
    for name in MODULES:
        run_module("strict", name)
    for name in OPTIMIZERS:
        optimize("strict", name, steps=1)
    ours = {cls for cls in _subclasses(autograd.Function) if cls.__module__.startswith("tinytrain.")}
    missing = sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in ours - seen)
    # ZeRO stage 3's recomputation needs a sharded trainer: tests/test_zero.py trains stage 3 on every device
    missing = [name for name in missing if name != "tinytrain.sharding.GatheredRecompute"]
    assert not missing, f"operations that no case in tests/test_devices.py runs on a device: {missing}"


def test_every_public_layer_loss_functional_and_optimizer_has_a_device_case() -> None:
    layers = {name for name, value in vars(nn).items()
              if isinstance(value, type) and issubclass(value, nn.Module) and value is not nn.Module}
    missing = sorted(layers - set(MODULE_CASES))
    assert not missing, f"tt.nn modules without a case: {missing}"
    assert set(MODULE_CASES.values()) <= set(MODULES)
    functional = {name for name in dir(F) if not name.startswith("_") and callable(getattr(F, name))}
    missing = sorted(functional - set(FUNCTIONAL_CASES))
    assert not missing, f"tt.nn.functional without a case: {missing}"
    assert set(FUNCTIONAL_CASES.values()) <= set(OPS)
    optimizers = {name for name, value in vars(optim).items()
                  if isinstance(value, type) and issubclass(value, optim.Optimizer) and value is not optim.Optimizer}
    missing = sorted(optimizers - set(OPTIMIZER_CASES))
    assert not missing, f"optimizers without a case: {missing}"
    assert set(OPTIMIZER_CASES.values()) <= set(OPTIMIZERS)


def test_the_fake_gpu_really_exercises_the_cuda_backend(fake_gpu) -> None:
    """fakecuda:1 is the package's CupyBackend on its second fake GPU, with the device-aware namespace."""
    from tinytrain.cuda import GENERATOR, CupyBackend, _OnDevice

    gpu = tt.get_backend(FAKE)
    assert type(gpu) is CupyBackend and gpu.index == 1 and isinstance(gpu.xp, _OnDevice)
    fake_gpu.cuda.Device(0).use()
    x = tt.zeros(3, device=FAKE)
    assert x.data.device.id == 1, "tensors of fakecuda:1 are made on fake GPU 1 even when GPU 0 was current"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CUDA backend's random state is saved like any other
        state = tt.serialization.capture_rng_state()
    assert state["backends"][FAKE]["generator"] == GENERATOR


@pytest.mark.parametrize("model_name", ["cnn", "gpt"])
def test_a_float32_training_step_makes_no_float64_array(model_name: str) -> None:
    """NumPy promotes float32 arrays to float64 when a NumPy float64 scalar (np.sqrt(2.0), np.float64(eps))
    or an int64 array meets them: twice the memory traffic, silently. No library code may do that."""
    from tinytrain.nn.transformer import GPT, GPTConfig
    from tinytrain.testing.strict import float64_promotions
    from tinytrain.training import clip_grad_norm

    tt.manual_seed(0)
    rng = np.random.default_rng(0)
    if model_name == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                              nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16),
                              nn.Dropout(0.1), nn.Linear(16, 10)).to("strict")
        inputs = tt.tensor(rng.standard_normal((8, 1, 8, 8)), device="strict")
        targets = tt.tensor(np.arange(8), device="strict")
        optimizer = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

        def loss() -> tt.Tensor:
            return nn.CrossEntropyLoss()(model(inputs), targets)
    else:
        model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.1)).to("strict")
        ids = tt.tensor(rng.integers(0, 11, (2, 9)), device="strict")
        optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)

        def loss() -> tt.Tensor:
            return model(ids[:, :-1], targets=ids[:, 1:])[1]
    before = float64_promotions()
    for _ in range(2):
        optimizer.zero_grad()
        loss().backward()
        clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()
    assert float64_promotions() - before == 0
    assert {p.dtype for p in model.parameters()} == {np.dtype(np.float32)}
