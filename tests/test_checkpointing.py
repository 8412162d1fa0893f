"""Gradient checkpointing (Module 13): ``tt.checkpoint(fn, *inputs)`` and ``nn.Checkpoint``.

Checkpointed gradients equal plain ones exactly in float64 (dropout included: the
recompute draws the same masks and leaves the generators where a plain run
leaves them), pass gradcheck, and the peak memory of a deep MLP drops.
"""
import random
import tracemalloc

import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn
from tinytrain.serialization import capture_rng_state
from tinytrain.nn.checkpointing import Recompute, checkpoint


def block(width: int = 6, dtype: str = "float64", device: str = "cpu", p: float = 0.3) -> nn.Module:
    tt.manual_seed(0)
    module = nn.Sequential(nn.Linear(width, 9), nn.Tanh(), nn.Dropout(p), nn.Linear(9, width), nn.ReLU())
    module.to(device)
    for parameter in module.parameters():
        parameter.data = parameter.data.astype(dtype)
    return module


def grads(model: nn.Module, x: tt.Tensor) -> list[np.ndarray]:
    return ([] if x.grad is None else [x.grad.numpy()]) + [p.grad.numpy() for p in model.parameters()]


def run(model, x, wrap):
    tt.manual_seed(7)
    model.zero_grad()
    x.grad = None
    out = wrap(model, x)
    (out * out).sum().backward()
    return grads(model, x), out.numpy()


def test_tt_checkpoint_is_gradient_checkpointing():
    x = tt.tensor([1.0, 2.0], requires_grad=True)
    tt.checkpoint(lambda t: t * t, x).sum().backward()
    assert x.grad.numpy().tolist() == [2.0, 4.0]


def test_checkpointed_gradients_equal_plain_gradients_with_dropout(device):
    model = block(device=device)
    x = tt.tensor(np.random.default_rng(0).standard_normal((5, 6)), dtype="float64", device=device,
                  requires_grad=True)
    plain, plain_out = run(model, x, lambda m, t: m(t))
    state_after_plain = tt.get_backend(device).rng_state()
    ckpt, ckpt_out = run(model, x, checkpoint)
    assert tt.get_backend(device).rng_state() == state_after_plain, "the recompute must not move the generators"
    np.testing.assert_array_equal(plain_out, ckpt_out)
    for a, b in zip(plain, ckpt):
        np.testing.assert_array_equal(a, b)
    layer, layer_out = run(model, x, lambda m, t: nn.Checkpoint(m)(t))
    for a, b in zip(plain, layer):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_restores_python_and_numpy_generators_too():
    def noisy(t):
        return t * float(np.random.rand()) + random.random()

    x = tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    np.random.seed(3)
    random.seed(3)
    plain = noisy(x)
    plain.sum().backward()
    expected, after = x.grad.numpy(), capture_rng_state()
    np.random.seed(3)
    random.seed(3)
    x.grad = None
    checkpoint(noisy, x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    draw = np.random.rand()  # the generator stands where the plain run left it
    np.random.set_state(after["numpy"])
    assert np.random.rand() == draw


def test_gradcheck_through_checkpoint():
    rng = np.random.default_rng(1)
    x = tt.tensor(rng.standard_normal((3, 4)), dtype="float64", requires_grad=True)
    w = tt.tensor(rng.standard_normal((4, 5)), dtype="float64", requires_grad=True)
    b = tt.tensor(rng.standard_normal(5), dtype="float64", requires_grad=True)
    assert tt.gradcheck(lambda x, w, b: checkpoint(lambda x, w, b: (x @ w + b).tanh() * x.sum(), x, w, b), [x, w, b])


def test_parameters_get_gradients_when_no_input_requires_grad():
    model = block(p=0.0)
    x = tt.tensor(np.ones((2, 6)), dtype="float64")  # data: no gradient wanted
    checkpoint(model, x).sum().backward()
    assert all(p.grad is not None and np.abs(p.grad.numpy()).sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("wrap", [lambda m: nn.Checkpoint(m), lambda m: (lambda t: checkpoint(m, t))],
                         ids=["Checkpoint", "checkpoint"])
def test_batchnorm_inside_a_checkpoint_counts_each_batch_once(device, wrap):
    def model():
        tt.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU()).to(device, dtype="float64")

    plain, checkpointed = model(), model()
    run = wrap(checkpointed)
    x = tt.tensor(np.random.default_rng(1).standard_normal((8, 3)), dtype="float64", device=device)
    for _ in range(3):
        plain(x).sum().backward()
        run(x).sum().backward()
    for (name, expected), (_, found) in zip(plain.named_buffers(), checkpointed.named_buffers()):
        np.testing.assert_allclose(found.numpy(), expected.numpy(), rtol=1e-12, err_msg=name)
    assert int(checkpointed[1].num_batches_tracked.item()) == 3
    for p, q in zip(plain.parameters(), checkpointed.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-10)


def test_nested_checkpoints_and_segments_match_plain():
    tt.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(6)]
    for layer in layers:
        for p in layer.parameters():
            p.data = p.data.astype("float64")
    plain = nn.Sequential(*layers)
    segmented = nn.Sequential(nn.Checkpoint(nn.Sequential(layers[0], nn.Checkpoint(layers[1]))),
                              nn.Checkpoint(nn.Sequential(*layers[2:4])), *layers[4:])
    x = tt.tensor(np.random.default_rng(2).standard_normal((3, 4)), dtype="float64", requires_grad=True)
    expected, _ = run(plain, x, lambda m, t: m(t))
    got, _ = run(segmented, x, lambda m, t: m(t))
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert [name for name, _ in segmented.named_parameters()][0] == "0.module.0.0.weight"


def test_the_graph_keeps_no_activations_of_the_segment():
    model = block(p=0.0)
    x = tt.tensor(np.ones((2, 6)), dtype="float64", requires_grad=True)
    out = checkpoint(model, x)
    assert isinstance(out._ctx, Recompute)
    assert all(parent is x or parent.size == 1 for parent in out._ctx.inputs)  # the input and the anchor


def test_no_grad_just_calls_the_function_and_bad_input_is_named():
    x = tt.tensor([1.0], requires_grad=True)
    with tt.no_grad():
        out = checkpoint(lambda t: t * 3.0, x)
    assert out._ctx is None and out.item() == 3.0
    with pytest.raises(TypeError, match="inputs must be one or more Tensors"):
        checkpoint(lambda t: t, np.ones(2))
    with pytest.raises(TypeError, match="must return one Tensor"):
        checkpoint(lambda t: (t, t), x)


def peak(model: nn.Module, x: tt.Tensor) -> int:
    tracemalloc.start()
    model(x).sum().backward()
    result = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    model.zero_grad()
    return result


def test_checkpointing_lowers_peak_memory_of_a_deep_mlp_by_at_least_40_percent():
    def deep(every):
        tt.manual_seed(0)
        layers = [nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(16)]
        if every:
            layers = [nn.Checkpoint(nn.Sequential(*layers[i:i + every])) for i in range(0, 16, every)]
        return nn.Sequential(*layers)

    x = tt.randn(256, 128)
    plain, ckpt = peak(deep(0), x), peak(deep(4), x)
    assert ckpt <= 0.6 * plain, (plain, ckpt)
