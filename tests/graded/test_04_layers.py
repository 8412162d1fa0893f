"""Graded checks of Module 04 (layers): Module's registration, tree walking, devices
and state; Linear's fused backward and ModuleList.

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


@check(points=2, hint="compute on the tensors' device: LinearFunction uses self.xp, load_state_dict copies host arrays "
                      "onto the model's device (backend.from_host), never np")
def test_layers_run_on_another_device(student):
    tt.manual_seed(0)
    linear = student.Linear(4, 3)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    results = {}
    for device in ("cpu", "strict"):
        layer = student.Linear(4, 3).to(device)
        inputs = tt.tensor(x, device=device, requires_grad=True)
        try:
            layer.load_state_dict({name: value.numpy() for name, value in linear.state_dict().items()})
            out = layer(inputs)
            out.sum().backward()
        except TypeError as error:
            raise AssertionError(f"on the {device!r} device: {error}") from None
        assert layer.weight.device == inputs.device, "load_state_dict keeps each tensor on its device"
        results[device] = [out.numpy(), inputs.grad.numpy(), layer.weight.grad.numpy(), layer.bias.grad.numpy()]
    for name, cpu, strict in zip(("output", "input gradient", "weight gradient", "bias gradient"), *results.values()):
        np.testing.assert_allclose(strict, cpu, rtol=1e-5, err_msg=f"Linear's {name} on the strict device")


