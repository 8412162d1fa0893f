"""Module 04: ``Module`` and ``Parameter`` — registration, tree walks, modes,
``state_dict`` / ``load_state_dict``, ``zero_grad``, ``to(device)`` and ``repr``.

Layers from ``tinytrain.nn.layers`` serve as realistic children; the layers
themselves are tested in ``test_layers.py``.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import tinytrain as tt
import tinytrain.nn as nn
from tinytrain.nn import BatchNorm1d, Dropout, Linear, Module, Parameter, ReLU, Sequential


class Block(Module):
    """Linear -> BatchNorm -> ReLU -> Dropout, as a Sequential inside a custom module."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = Sequential(Linear(width, width), BatchNorm1d(width), ReLU(), Dropout(0.5))
        self.scale = Parameter([1.0])

    def forward(self, x):
        return self.layers(x) * self.scale


class Net(Module):
    """Two levels of nesting: Net -> Block -> Sequential -> layers."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.block = Block(width)
        self.head = Linear(width, 2)

    def forward(self, x):
        return self.head(self.block(x))


def make_net(seed: int = 0, width: int = 4) -> Net:
    tt.manual_seed(seed)
    return Net(width)


# -- Parameter -------------------------------------------------------------------------

def test_parameter_defaults_and_copy() -> None:
    source = np.array([1.0, 2.0])
    p = Parameter(source)
    assert isinstance(p, tt.Tensor) and p.requires_grad and p.dtype == np.float32 and p.is_leaf
    source[0] = 9.0
    assert p.numpy()[0] == 1.0, "a Parameter copies its data"
    assert not Parameter([1.0], requires_grad=False).requires_grad
    assert Parameter([1.0], dtype="float64").dtype == np.float64
    assert "Parameter containing" in repr(p)
    out = p * 2
    assert type(out) is tt.Tensor and out.requires_grad, "operations on parameters return plain tensors"
    with pytest.raises(TypeError):
        Parameter([1, 2])  # integer tensors cannot require grad


def test_parameter_on_device(device, canonical_device) -> None:
    p = Parameter([1.0, 2.0], device=device)
    assert p.device == canonical_device and p.requires_grad


# -- registration ------------------------------------------------------------------------

def test_registration_order_and_dotted_names() -> None:
    net = make_net()
    names = [name for name, _ in net.named_parameters()]
    assert names == [  # a module's own parameters, then its children's (as in PyTorch)
        "block.scale", "block.layers.0.weight", "block.layers.0.bias", "block.layers.1.weight",
        "block.layers.1.bias", "head.weight", "head.bias",
    ]
    assert [p for _, p in net.named_parameters()] == net.parameters()
    assert [name for name, _ in net.named_buffers()] == [
        "block.layers.1.running_mean", "block.layers.1.running_var", "block.layers.1.num_batches_tracked",
    ]
    assert [name for name, _ in net.named_modules()] == [
        "", "block", "block.layers", "block.layers.0", "block.layers.1", "block.layers.2", "block.layers.3", "head",
    ]
    assert net.modules()[0] is net and len(net.modules()) == 8
    assert net.children() == [net.block, net.head]
    assert [name for name, _ in net.block.named_children()] == ["layers"]
    assert net.num_parameters() == 4 * 4 + 4 + 4 + 4 + 1 + 4 * 2 + 2


def test_plain_attributes_are_not_registered_and_reassignment_keeps_order() -> None:
    class M(Module):
        def __init__(self):
            super().__init__()
            self.a = Parameter([1.0])
            self.b = Parameter([2.0])
            self.plain = tt.tensor([3.0])  # a Tensor that is neither Parameter nor buffer
            self.number = 5

    m = M()
    assert [n for n, _ in m.named_parameters()] == ["a", "b"]
    m.a = Parameter([4.0])
    assert [n for n, _ in m.named_parameters()] == ["a", "b"] and m.parameters()[0].item() == 4.0
    m.a = None  # no longer a parameter
    assert [n for n, _ in m.named_parameters()] == ["b"]
    m.b = Linear(1, 1)  # a parameter name re-used for a module
    assert m.parameters() == m.b.parameters() and m.children() == [m.b]
    del m.b
    assert m.parameters() == [] and m.children() == [] and not hasattr(m, "b")


def test_shared_layers_count_once() -> None:
    shared = Linear(3, 3)
    model = Sequential(shared, ReLU(), shared, Sequential(shared))
    assert len(model.parameters()) == 2
    assert len({id(p) for p in model.parameters()}) == 2
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias"]
    assert model.num_parameters() == 12
    assert len(model.modules()) == 4  # model, shared, ReLU, inner Sequential

    class Tied(Module):  # the same Parameter under two names
        def __init__(self):
            super().__init__()
            self.encoder = Linear(2, 3)
            self.decoder_weight = self.encoder.weight

    assert len(Tied().parameters()) == 2


def test_assignment_before_init_is_a_clear_error() -> None:
    class Forgot(Module):
        def __init__(self):
            self.weight = Parameter([1.0])

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Forgot()


def test_register_buffer() -> None:
    m = Module()
    m.register_buffer("steps", tt.zeros((), dtype="int64"))
    assert m.buffers() == [m.steps] and m.parameters() == []
    m.steps = tt.ones((), dtype="int64")  # re-assigning a Tensor keeps it a buffer
    assert m.buffers() == [m.steps] and m.steps.item() == 1
    with pytest.raises(TypeError):
        m.register_buffer("bad", [1.0])
    with pytest.raises(TypeError):
        m.register_buffer("bad", Parameter([1.0]))


def test_register_buffer_refuses_names_that_are_taken_or_invalid() -> None:
    """As PyTorch: a name that is already an attribute (a parameter, a sub-module, a method, a plain
    attribute) and not a buffer raises KeyError and changes nothing; so do "" and dotted names."""
    m = Net()
    weight, head = m.head.weight, m.head
    for owner, name in ((m.head, "weight"), (m, "head"), (m, "forward"), (m, "training"), (m.block, "scale")):
        with pytest.raises(KeyError, match=f"attribute '{name}' already exists"):
            owner.register_buffer(name, tt.zeros(1))
    assert m.head is head and m.head.weight is weight and callable(m.forward) and m.training is True
    assert "head.weight" in dict(m.named_parameters()) and "head.weight" not in dict(m.named_buffers())
    with pytest.raises(KeyError, match="buffer name '' must be non-empty"):
        m.register_buffer("", tt.zeros(1))
    with pytest.raises(KeyError, match="buffer name 'a.b' must .*not contain a dot"):
        m.register_buffer("a.b", tt.zeros(1))
    with pytest.raises(TypeError, match="int"):
        m.register_buffer(3, tt.zeros(1))
    assert "" not in m.__dict__ and "a.b" not in m.__dict__ and len(m.buffers()) == 3
    m.register_buffer("steps", tt.zeros(1))
    m.register_buffer("steps", None)  # a buffer may be registered again
    assert "steps" in m._buffers and m.steps is None


def test_forward_must_be_defined() -> None:
    with pytest.raises(NotImplementedError, match="Module must define forward"):
        Module()(tt.zeros(1))


# -- modes and gradients --------------------------------------------------------------------

def test_train_eval_reach_two_levels_deep(device) -> None:
    """Dropout and BatchNorm inside Sequential inside Block inside Net change behaviour."""
    net = make_net(width=64).to(device)
    dropout, batchnorm = net.block.layers[3], net.block.layers[1]
    x = tt.randn(32, 64, device=device)
    assert net.training and dropout.training and batchnorm.training

    tt.manual_seed(1)
    first = net.block(x).numpy()
    tt.manual_seed(2)
    second = net.block(x).numpy()
    assert (first == 0).mean() > 0.5, "training mode: Dropout zeroes units (on top of the ReLU's zeros)"
    assert not np.array_equal(first, second), "training mode: different masks per call"
    assert batchnorm.num_batches_tracked.item() == 2

    assert net.eval() is net
    assert all(not m.training for m in net.modules())
    running_mean = batchnorm.running_mean.numpy()
    out1, out2 = net.block(x).numpy(), net.block(x).numpy()
    np.testing.assert_array_equal(out1, out2)  # no dropout, no batch statistics
    np.testing.assert_array_equal(batchnorm.running_mean.numpy(), running_mean)
    assert batchnorm.num_batches_tracked.item() == 2
    # eval uses running statistics: the result for one sample does not depend on the rest of the batch
    np.testing.assert_allclose(net.block(x[:1]).numpy(), out1[:1], rtol=1e-5, atol=1e-6)

    assert net.train() is net and all(m.training for m in net.modules())
    assert net.train(False) is net and not net.block.layers.training


@pytest.mark.parametrize("mode", ["no", "False", 0, None, 1.0])
def test_train_mode_must_be_a_bool(mode) -> None:
    net = make_net()
    with pytest.raises(TypeError, match=f"mode must be True or False, got mode={mode!r}"):
        net.train(mode)
    assert all(m.training for m in net.modules()), "nothing changes"
    assert net.train(np.bool_(False)) is net and not any(m.training for m in net.modules())


def test_zero_grad_sets_grads_to_none() -> None:
    net = make_net()
    net(tt.randn(5, 4)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


# -- state_dict ------------------------------------------------------------------------------

def trained_net(device, seed=0):
    """A net whose BatchNorm running statistics moved away from their initial values."""
    net = make_net(seed).to(device)
    for _ in range(3):
        net(tt.randn(8, 4, device=device) * 3 + 1)
    return net


def test_state_dict_keys_values_and_copies(device, canonical_device) -> None:
    net = trained_net(device)
    state = net.state_dict()
    assert list(state) == [n for n, _ in net.named_parameters()] + [n for n, _ in net.named_buffers()]
    for name, tensor in list(net.named_parameters()) + list(net.named_buffers()):
        saved = state[name]
        assert type(saved) is tt.Tensor and not saved.requires_grad and saved.device == canonical_device
        assert saved.data is not tensor.data
        np.testing.assert_array_equal(saved.numpy(), tensor.numpy())
    assert state["block.layers.1.num_batches_tracked"].item() == 3
    before = state["head.weight"].numpy()
    with tt.no_grad():
        net.head.weight[...] = 0.0
    np.testing.assert_array_equal(state["head.weight"].numpy(), before)  # a copy, not a view


def test_round_trip_gives_identical_outputs_and_shares_nothing(device) -> None:
    source = trained_net(device, seed=0)
    target = make_net(seed=1).to(device)
    x = tt.randn(6, 4, device=device)
    assert not np.allclose(source.eval()(x).numpy(), target.eval()(x).numpy())
    result = target.load_state_dict(source.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(source(x).numpy(), target(x).numpy())
    for (_, a), (_, b) in zip(source.named_parameters() + source.named_buffers(),
                              target.named_parameters() + target.named_buffers()):
        assert a.data is not b.data
        if device == "cpu":
            assert not np.shares_memory(a.data, b.data)
    with tt.no_grad():
        for p in source.parameters():
            p[...] = 0.0
    assert not np.allclose(target(x).numpy(), source(x).numpy()), "loaded values must not follow the source"


def test_load_state_dict_keeps_tensor_objects_device_and_dtype(device, canonical_device) -> None:
    target = make_net(seed=1).to(device)
    params = target.parameters()
    state = {k: v.numpy().astype(np.float64) if v.dtype == np.float32 else v.numpy()
             for k, v in trained_net("cpu").state_dict().items()}
    target.load_state_dict(state)  # NumPy arrays (float64) into float32 tensors on `device`
    assert target.parameters() == params and all(a is b for a, b in zip(target.parameters(), params))
    for name, tensor in target.named_parameters() + target.named_buffers():
        assert tensor.device == canonical_device
        np.testing.assert_allclose(tensor.numpy(), state[name], rtol=1e-6)
    assert target.head.weight.dtype == np.float32 and target.block.layers[1].num_batches_tracked.dtype == np.int64


def test_load_state_dict_from_another_device(device, other_device) -> None:
    source = trained_net(other_device)
    target = make_net(seed=1).to(device)
    target.load_state_dict(source.state_dict())
    x = tt.randn(3, 4)
    np.testing.assert_allclose(target.eval()(x.to(device)).numpy(), source.eval()(x.to(other_device)).numpy(),
                               rtol=1e-6)


def test_load_state_dict_reports_every_problem_and_copies_nothing() -> None:
    target = make_net(seed=1)
    before = {k: v.numpy() for k, v in target.state_dict().items()}
    state = trained_net("cpu").state_dict()
    del state["head.bias"]
    del state["block.layers.1.running_var"]
    state["head.extra"] = tt.zeros(1)
    state["block.scale"] = tt.zeros(3)
    state["head.weight"] = tt.zeros(4, 2)  # transposed
    with pytest.raises(RuntimeError) as info:
        target.load_state_dict(state)
    message = str(info.value)
    for expected in ("missing", "head.bias", "block.layers.1.running_var", "unexpected", "head.extra",
                     "block.scale", "(1,)", "(3,)", "head.weight", "(2, 4)", "(4, 2)"):
        assert expected in message, (expected, message)
    for key, value in target.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[key])  # all or nothing


def test_load_state_dict_of_a_list_raises_naming_the_argument() -> None:
    with pytest.raises(TypeError, match=r"state must be a dict.*got state=\[1, 2\] of type list"):
        make_net().load_state_dict([1, 2])


def test_load_state_dict_checks_every_value_before_copying_any() -> None:
    target = make_net(seed=1)
    before = {k: v.numpy() for k, v in target.state_dict().items()}
    state = trained_net("cpu").state_dict()
    state["head.bias"] = np.array(["a", "b"])  # the right shape, but no numbers: the last key, after all others
    with pytest.raises(TypeError) as info:
        target.load_state_dict(state)
    message = str(info.value)
    for expected in ("head.bias", "<U1", "(2,)", "float32"):
        assert expected in message, (expected, message)
    for key, value in target.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[key])  # nothing was copied
    state["head.bias"] = [[1.0], [2.0, 3.0]]  # ragged: no array at all
    with pytest.raises(TypeError, match="head.bias"):
        target.load_state_dict(state)
    state["head.bias"] = np.zeros(2)
    state["block.layers.1.num_batches_tracked"] = np.array(2.5)  # a float into an int64 buffer would truncate
    with pytest.raises(TypeError, match=r"num_batches_tracked holds float64 values.*int64"):
        target.load_state_dict(state)


def test_load_state_dict_non_strict() -> None:
    target = make_net(seed=1)
    state = trained_net("cpu").state_dict()
    del state["head.bias"]
    state["other"] = tt.zeros(1)
    result = target.load_state_dict(state, strict=False)
    assert result.missing_keys == ["head.bias"] and result.unexpected_keys == ["other"]
    np.testing.assert_array_equal(target.head.weight.numpy(), state["head.weight"].numpy())
    state["head.weight"] = tt.zeros(5, 5)
    with pytest.raises(RuntimeError, match="head.weight"):
        target.load_state_dict(state, strict=False)  # shapes are checked even when not strict


def test_state_dict_survives_pickle_as_numpy() -> None:
    """The checkpoint path: state to host arrays, pickle, load into a fresh model."""
    source = trained_net("cpu")
    blob = pickle.dumps({k: v.numpy() for k, v in source.state_dict().items()})
    target = make_net(seed=5)
    target.load_state_dict(pickle.loads(blob))
    x = tt.randn(2, 4)
    np.testing.assert_array_equal(source.eval()(x).numpy(), target.eval()(x).numpy())


# -- to(device) ------------------------------------------------------------------------------

def test_to_moves_parameters_buffers_and_grads_in_place(device, canonical_device) -> None:
    net = make_net()
    x = tt.randn(5, 4)
    net(x).sum().backward()  # training mode: gradients, and running statistics move
    expected = net.eval()(x).numpy()
    params = net.parameters()
    assert net.to(device) is net
    assert all(a is b for a, b in zip(net.parameters(), params)), "the Parameter objects stay the same"
    for tensor in net.parameters() + net.buffers():
        assert tensor.device == canonical_device
    assert all(p.grad.device == canonical_device for p in net.parameters())
    np.testing.assert_allclose(net.eval()(x.to(device)).numpy(), expected, rtol=1e-6)
    net.to("cpu")
    assert all(t.device == "cpu" for t in net.parameters() + net.buffers())


def test_to_dtype_casts_floating_tensors_only(device) -> None:
    net = make_net().to(device, dtype="float64")
    assert all(p.dtype == np.float64 for p in net.parameters())
    bn = net.block.layers[1]
    assert bn.running_mean.dtype == np.float64 and bn.num_batches_tracked.dtype == np.int64
    x = tt.randn(3, 4, dtype="float64", device=device)
    assert net(x).dtype == np.float64


@pytest.mark.parametrize("dtype", ["int32", np.int64, "bool", "complex64", np.complex128, "uint8"])
def test_to_refuses_a_dtype_that_is_not_floating_point(dtype) -> None:
    """PyTorch: "nn.Module.to only accepts floating point or complex dtypes"; ours only floating point."""
    net = make_net()
    before = net.state_dict()
    with pytest.raises(TypeError, match=f"floating-point.*got dtype={np.dtype(dtype)}"):
        net.to(dtype=dtype)
    with pytest.raises(TypeError, match=f"got dtype={np.dtype(dtype)}"):
        net.to("strict", dtype=dtype)
    for name, tensor in net.state_dict().items():  # nothing moved or changed
        assert tensor.device == "cpu" and tensor.dtype == before[name].dtype
        np.testing.assert_array_equal(tensor.numpy(), before[name].numpy())
    with pytest.raises(TypeError):
        net.to(dtype="no such dtype")


def test_module_on_wrong_device_fails_loudly(device, other_device) -> None:
    net = make_net().to(device)
    with pytest.raises((RuntimeError, TypeError)):
        net(tt.randn(2, 4, device=other_device))


# -- repr -------------------------------------------------------------------------------------

def test_repr_is_nested_like_pytorch() -> None:
    text = repr(make_net())
    assert text == (
        "Net(\n"
        "  (block): Block(\n"
        "    (layers): Sequential(\n"
        "      (0): Linear(in_features=4, out_features=4, bias=True)\n"
        "      (1): BatchNorm1d(4, eps=1e-05, momentum=0.1)\n"
        "      (2): ReLU()\n"
        "      (3): Dropout(p=0.5)\n"
        "    )\n"
        "  )\n"
        "  (head): Linear(in_features=4, out_features=2, bias=True)\n"
        ")"
    )
    assert repr(Module()) == "Module()"


def test_public_names() -> None:
    for name in ("Module", "Parameter", "Linear", "Sequential", "ModuleList", "ReLU", "Sigmoid", "Tanh", "GELU",
                 "Softmax", "LogSoftmax", "Dropout", "Flatten", "LayerNorm", "BatchNorm1d"):
        assert hasattr(nn, name), name
    assert nn.Module is tt.nn.Module
    assert callable(nn.functional.dropout) and callable(nn.functional.linear)
