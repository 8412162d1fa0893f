"""Graded checks of Module 04 (layers): Module's registration, tree walking, devices
and state; Linear's fused backward and ModuleList.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 04``). Its ``Parameter`` and ``Module`` are the student's own.
"""
import numpy as np

import tinytrain as tt
from tinytrain.backend import memory_order
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck, expect_raises

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


def _names(pairs):
    return [name for name, _ in pairs]


@check(points=2, hint="__setattr__ files a Parameter under _parameters, a Module under _modules, a Tensor (or None) for a "
                      "registered buffer under _buffers; anything else (a plain Tensor too) is an ordinary attribute; "
                      "assigning to a registered name moves it to the value's registry (and out of the others) or "
                      "keeps its place in the order; before Module.__init__ ran, assigning a Parameter, Module or "
                      "Tensor raises AttributeError saying to call super().__init__() first (a plain value is fine)")
def test_setattr_registers(student):
    root = _tree(student)
    expect_equal(list(root._parameters), ["scale"], "root._parameters after __init__")
    expect_equal(list(root._modules), ["first", "second", "again"], "root._modules after __init__")
    expect_equal(list(root.first._buffers), ["count"], "a Leaf's _buffers after register_buffer")
    root.scale = 3.0  # no longer a parameter
    expect_equal("scale" in root._parameters, False, "'scale' in _parameters after root.scale = 3.0")
    expect_equal(root.scale, 3.0, "root.scale after root.scale = 3.0")
    root.first.count = tt.tensor(5)  # a registered buffer stays one
    assert root.first._buffers.get("count") is root.first.count, \
        "assigning a Tensor to a registered buffer: expected _buffers['count'] to be the new tensor, " \
        f"got {root.first._buffers.get('count')!r}"
    root.first.count = None  # a buffer set to None stays registered ...
    expect_equal("count" in root.first._buffers, True, "'count' in _buffers after first.count = None")
    root.first.count = tt.tensor(2)  # ... so the next tensor is a buffer again
    expect_equal(_names(root.named_buffers()), ["first.count", "second.count"],
                 "named_buffers() after first.count = None, then = tt.tensor(2)")
    root.cache = tt.zeros(2)  # a plain tensor under a new name: an ordinary attribute
    root.nothing = None
    for name in ("cache", "nothing"):
        for registry in ("_parameters", "_buffers", "_modules"):
            expect_equal(name in getattr(root, registry), False,
                         f"{name!r} in root.{registry} after assigning a plain {type(getattr(root, name)).__name__}")
    expect_equal(list(root.state_dict()), ["first.w", "second.w", "first.count", "second.count"],
                 "state_dict() keys ('scale' is a float now, 'cache' and 'nothing' are plain attributes)")
    root.second = None
    assert "second" not in root._modules or root._modules["second"] is None, \
        f"root.second = None: expected no module 'second', got {root._modules['second']!r}"
    root = _tree(student)
    root.first = _tree(student).first  # a new module under a registered name keeps the name's place
    expect_equal(list(root._modules), ["first", "second", "again"], "root._modules after root.first = another Leaf")
    root.first = student.Parameter(np.zeros(3, dtype=np.float32))  # a module's name becomes a parameter's
    expect_equal(("first" in root._modules, "first" in root._parameters), (False, True),
                 "('first' in _modules, 'first' in _parameters) after root.first = Parameter(...)")
    expect_equal(_names(root.named_parameters()), ["scale", "first", "second.w", "again.w"],
                 "named_parameters() after root.first (a Leaf) became a Parameter")
    root.scale = student.Parameter(np.ones(1, dtype=np.float32))  # a new parameter under a registered name
    expect_equal(_names(root.named_parameters()), ["scale", "first", "second.w", "again.w"],
                 "named_parameters() after root.scale = another Parameter (the name keeps its place)")
    leaf = _tree(student).first
    leaf.register_buffer("total", tt.zeros(1))
    leaf.count = tt.tensor(7)  # a new tensor under a registered buffer's name
    expect_equal(list(leaf._buffers), ["count", "total"], "a Leaf's _buffers after register_buffer('total', ...) "
                 "and then leaf.count = tt.tensor(7) (the name keeps its place)")

    class Early(student.Module):
        def __init__(self):
            self.w = student.Parameter([1.0])  # before super().__init__()
            super().__init__()

    expect_raises(AttributeError, Early, "assigning a Parameter before super().__init__()",
                  mentions=("super().__init__()",))

    class EarlyTensor(student.Module):
        def __init__(self):
            self.cache = tt.zeros(2)  # a tensor before super().__init__()
            super().__init__()

    expect_raises(AttributeError, EarlyTensor, "assigning a Tensor before super().__init__()",
                  mentions=("super().__init__()",))

    class EarlyNumber(student.Module):
        def __init__(self):
            self.size = 3  # a plain value before super().__init__(): allowed, as in PyTorch
            super().__init__()
            self.w = student.Parameter([1.0])

    early = EarlyNumber()
    expect_equal((early.size, _names(early.named_parameters())), (3, ["w"]),
                 "(size, parameter names) of a module that set size = 3 before super().__init__()")


@check(points=2, hint="named_modules walks depth first, children in registration order, each module once, names dotted",
       after="test_setattr_registers")
def test_named_modules(student):
    root = _tree(student)
    expect_equal(_names(root.named_modules()), ["", "first", "second"],
                 "named_modules() names (each module once, parents first)")
    expect_equal(_names(root.named_modules(prefix="model")), ["model", "model.first", "model.second"],
                 "named_modules(prefix='model') names")
    expect_equal(_names(root.named_parameters()), ["scale", "first.w", "second.w"], "named_parameters() names")
    expect_equal(len(root.parameters()), 3, "len(parameters())")
    expect_equal(len(root.modules()), 3, "len(modules())")
    deep = student.Module()
    deep.a, deep.b = student.Module(), student.Module()
    deep.a.inner = student.Module()
    expect_equal(_names(deep.named_modules()), ["", "a", "a.inner", "b"],
                 "named_modules() of a root with children a (which has a child inner) and b: depth first")
    shared = student.Module()
    outer = student.Module()
    outer.first, outer.box = shared, student.Module()
    outer.box.again = shared  # the same module one level down: still once in the whole tree
    expect_equal(_names(outer.named_modules()), ["", "first", "box"],
                 "named_modules() of a root whose child 'first' is also its grandchild 'box.again' (once in the tree)")


@check(points=2, hint="to(device, dtype) changes every parameter, gradient and buffer in place (same objects), on its "
                      "device when no device is given; dtype casts floating-point tensors only, no dtype casts nothing; "
                      "an unknown dtype raises TypeError before anything moves", after="test_named_modules")
def test_to_device_and_dtype(student):
    root = _tree(student)
    weight = root.first.w
    weight.grad = tt.ones(2)
    assert root.to("strict") is root, "to() must return the module itself"
    assert root.first.w is weight, "to() must keep the same Parameter objects"
    for what, t in (("weight", weight), ("its gradient", weight.grad), ("a buffer", root.first.count)):
        expect_equal(t.device, "strict:0", f"the device of {what} after to('strict')")
    expect_equal(weight.dtype, np.dtype(np.float32), "weight dtype after to('strict') (no dtype: no cast)")
    expect_equal(weight.grad.dtype, np.dtype(np.float32), "gradient dtype after to('strict') (no dtype: no cast)")
    assert root.to(dtype="float16") is root, "to(dtype=...) must return the module itself"
    expect_equal(weight.device, "strict:0", "weight device after to(dtype='float16') (no device: it stays)")
    expect_equal(weight.dtype, np.dtype(np.float16), "weight dtype after to(dtype='float16')")
    expect_raises(TypeError, lambda: root.to("cpu", dtype="not a dtype"), "to('cpu', dtype='not a dtype')")
    expect_equal([t.device for t in root.parameters() + root.buffers()], ["strict:0"] * 5,
                 "devices after a to() that raised (nothing may move)")
    root.to("cpu", dtype="float64")
    expect_equal(weight.device, "cpu", "weight device after to('cpu', dtype='float64')")
    expect_equal(weight.dtype, np.dtype(np.float64), "weight dtype after to('cpu', dtype='float64')")
    expect_equal(weight.grad.dtype, np.dtype(np.float64), "gradient dtype after to('cpu', dtype='float64')")
    expect_equal(root.first.count.dtype, np.dtype(np.int64), "an integer buffer's dtype after to(dtype='float64')")
    expect_equal(weight.numpy(), np.array([0.0, 1.0]), "weight values after the moves")

    layer = student.Module()
    layer.weight = student.Parameter(np.arange(6, dtype=np.float32).reshape(3, 2))
    layer.weight.data = layer.weight.data.T  # column-major, as Linear's weight (a new Tensor is row-major)
    layer.register_buffer("running_mean", tt.zeros(3))
    buffer = layer.running_mean
    layer.to("strict", dtype="float64")
    assert layer.running_mean is buffer, "to('strict', dtype='float64'): expected the same buffer object, got a new one"
    expect_equal((buffer.device, buffer.dtype), ("strict:0", np.dtype(np.float64)),
                 "a float32 buffer's (device, dtype) after to('strict', dtype='float64')")
    expect_equal(memory_order(layer.weight.data), "F", "the memory order of a column-major weight after "
                 "to('strict', dtype='float64') (arrays keep theirs)")


@check(points=2, hint="state_dict: every parameter and buffer by dotted name, as detached copies on their device",
       after="test_named_modules")
def test_state_dict(student):
    root = _tree(student)
    state = root.state_dict()
    expect_equal(list(state), ["scale", "first.w", "second.w", "first.count", "second.count"],
                 "state_dict() keys (parameters first, then buffers)")
    copy = state["first.w"]
    expect_equal(copy.requires_grad, False, "state_dict()['first.w'].requires_grad")
    assert not np.shares_memory(copy.data, root.first.w.data), "state_dict() must copy: it shares memory with first.w"
    root.first.w.data[0] = 42.0
    expect_equal(copy.numpy()[0], np.float32(0.0), "the saved first.w[0] after the model's changed to 42")
    root.first.count.data[...] = 7
    expect_equal(state["first.count"].numpy(), np.array(0), "the saved first.count after the model's changed to 7 "
                 "(buffers are copied too)")
    root.to("strict", dtype="float64")
    state = root.state_dict()
    expect_equal((state["first.w"].device, state["first.w"].dtype), ("strict:0", np.dtype(np.float64)),
                 "(device, dtype) of state_dict()['first.w'] of a float64 model on 'strict' (copies stay where and "
                 "what they are)")


@check(points=2, hint="load_state_dict copies values (tensors, arrays, lists, numbers) into the existing arrays; "
                      "strict mode lists missing/unexpected keys, shape mismatches always raise naming both shapes, "
                      "and nothing is copied when it raises", after="test_state_dict")
def test_load_state_dict(student):
    root = _tree(student)
    array = root.first.w.data
    state = {name: value.numpy() + 1 for name, value in root.state_dict().items()}
    root.load_state_dict(state)
    assert root.first.w.data is array, "load_state_dict must copy into the existing array, not replace it"
    expect_equal(root.first.w.numpy(), np.array([1.0, 2.0], dtype=np.float32), "first.w after loading NumPy arrays")
    state["first.w"][0] = 99.0
    expect_equal(root.first.w.numpy()[0], np.float32(1.0), "first.w[0] after changing the loaded array (no sharing)")
    expect_raises(RuntimeError, lambda: root.load_state_dict({"scale": np.ones(1), "extra": np.ones(1)}),
                  "load_state_dict of a state missing keys and with an extra one",
                  mentions=("first.w", "second.count", "extra"))
    expect_raises(RuntimeError, lambda: root.load_state_dict({**state, "scale": np.ones(5)}),
                  "load_state_dict with 'scale' of shape (5,) for a (1,) parameter", mentions=("scale", "(1,)", "(5,)"))
    expect_equal(root.scale.numpy(), np.array([2.0], dtype=np.float32), "scale after a load that raised (no copy)")
    result = root.load_state_dict({"scale": np.full(1, 7.0), "extra": np.ones(1)}, strict=False)
    expect_equal(list(result.unexpected_keys), ["extra"], "unexpected_keys with strict=False")
    assert "first.w" in result.missing_keys, f"missing_keys with strict=False: expected 'first.w' in it, " \
                                             f"got {result.missing_keys}"
    expect_equal(root.scale.numpy(), np.array([7.0], dtype=np.float32), "scale after the strict=False load")
    expect_raises(RuntimeError, lambda: root.load_state_dict({"first.w": np.ones(5)}, strict=False),
                  "load_state_dict(strict=False) with 'first.w' of shape (5,) for a (2,) parameter (a shape mismatch "
                  "raises always)", mentions=("first.w", "(2,)", "(5,)"))
    expect_raises(RuntimeError, lambda: root.load_state_dict({**state, "second.w": np.ones(9)}),
                  "load_state_dict with a bad shape for 'second.w' only", mentions=("second.w",))
    expect_raises(RuntimeError, lambda: root.load_state_dict({**state, "second.w": np.ones(1)}),
                  "load_state_dict with 'second.w' of shape (1,) for a (3,) parameter (shapes must be equal, not "
                  "broadcastable)", mentions=("second.w", "(3,)", "(1,)"))
    expect_equal(root.first.w.numpy(), np.array([1.0, 2.0], dtype=np.float32), "first.w after a load that raised on "
                 "a later key, second.w (check every value before copying any)")

    other = _tree(student)
    other.first.w.data[...] = [5.0, 6.0]
    other.second.count.data[...] = 4
    root.load_state_dict(other.state_dict())  # tensors on the same device
    assert root.first.w.data is array, "loading tensors must copy into the existing array, not replace it"
    expect_equal(root.first.w.numpy(), np.array([5.0, 6.0], dtype=np.float32), "first.w after loading tensors")
    expect_equal(root.second.count.numpy(), np.array(4), "second.count after loading tensors")
    other.first.w.data[0] = -1.0
    expect_equal(root.first.w.numpy()[0], np.float32(5.0), "first.w[0] after changing the loaded tensor (no sharing)")
    root.load_state_dict({"scale": [3.0], "first.w": [1.0, -1.0], "second.w": [0, 1, 2], "first.count": 7,
                          "second.count": np.int64(8)})  # lists and numbers: through np.asarray
    expect_equal(root.first.w.numpy(), np.array([1.0, -1.0], dtype=np.float32), "first.w after loading a list")
    expect_equal(root.first.count.numpy(), np.array(7), "first.count after loading the number 7")
    expect_equal(root.scale.dtype, np.dtype(np.float32), "scale's dtype after loading a list")


@check(points=2, hint="LinearFunction.backward: grad_x = G W (when x needs it), grad_weight = G^T X over all leading "
                      "axes written into xp.empty_like(weight), grad_bias = row sums of G; one gradient per input, "
                      "in grad's dtype, None for x or weight when it needs none")
def test_linear_backward(student):
    fused = student.LinearFunction.apply  # the installed Function.apply and engine, the student's backward
    x = tt.tensor(RNG.standard_normal((2, 3, 4)), dtype="float64", requires_grad=True)
    w = tt.tensor(RNG.standard_normal((5, 4)), dtype="float64", requires_grad=True)
    b = tt.tensor(RNG.standard_normal(5), dtype="float64", requires_grad=True)
    try:
        expect_gradcheck(fused, [x, w, b], "gradcheck of LinearFunction(x, weight, bias) with x of shape (2, 3, 4)")
    except ValueError as error:  # typically G^T X written for 2-D x only
        raise AssertionError(f"LinearFunction(x, weight, bias) with x of shape (2, 3, 4), weight (5, 4): expected "
                             f"gradients summed over all leading axes of x (grad_weight = G^T X over its 6 rows), "
                             f"got ValueError: {error}") from None
    expect_gradcheck(fused, [x, w], "gradcheck of LinearFunction(x, weight) without a bias")

    # a frozen weight: x still gets its gradient, the weight none
    upstream = RNG.standard_normal((2, 3, 5))
    frozen = w.detach()
    x.grad = b.grad = None
    fused(x, frozen, b).backward(tt.tensor(upstream, dtype="float64"))  # grad's dtype is the inputs' here
    expect_close(x.grad, upstream @ w.numpy(), "x.grad = G W with a weight that needs no grad", rtol=1e-10)
    expect_close(b.grad, upstream.reshape(-1, 5).sum(axis=0), "bias.grad with a weight that needs no grad", rtol=1e-10)
    expect_equal(frozen.grad, None, "the frozen weight's grad")

    # backward called directly: what it hands the engine
    tt.manual_seed(0)
    layer = student.Linear(4, 3)  # float32, weight stored column-major
    inputs = tt.tensor(RNG.standard_normal((6, 4)).astype(np.float32), requires_grad=True)
    g = RNG.standard_normal((6, 3)).astype(np.float32)
    for args, what in (((inputs, layer.weight, layer.bias), "with a bias"), ((inputs, layer.weight), "without a bias")):
        out = fused(*args)
        grads = out._ctx.backward(g)
        expect_equal(len(grads), len(args), f"the number of gradients backward returns {what}")
        grad_weight = grads[1]
        expect_close(tt.get_backend("cpu").to_host(grad_weight), g.T @ inputs.numpy(), f"grad_weight {what}",
                     rtol=1e-5, atol=1e-5)
        expect_equal(memory_order(grad_weight), memory_order(layer.weight.data),
                     f"the memory order of grad_weight {what} (the weight's: write into xp.empty_like(weight))")
        for name, array in zip(("grad_x", "grad_weight", "grad_bias"), grads):
            expect_equal(np.dtype(array.dtype), np.dtype(np.float32), f"the dtype of {name} {what} for float32 inputs")
    data = tt.tensor(RNG.standard_normal((6, 4)).astype(np.float32))  # needs no gradient: the first layer
    grads = fused(data, layer.weight, layer.bias)._ctx.backward(g)
    expect_equal(grads[0] is None, True, "whether backward returns None for an x that needs no gradient (the first "
                 "layer skips G W)")
    frozen = fused(inputs, layer.weight.detach(), layer.bias)
    expect_equal(frozen._ctx.backward(g)[1] is None, True, "whether backward returns None for a weight that needs "
                 "no gradient")
    wide = tt.tensor(RNG.standard_normal((6, 4)), dtype="float64", requires_grad=True)
    grads = fused(wide, layer.weight, layer.bias)._ctx.backward(g.astype(np.float64))
    expect_equal(np.dtype(grads[0].dtype), np.dtype(np.float64), "the dtype of grad_x for a float64 grad and a "
                 "float32 weight (grad's dtype)")


@check(points=1, hint="ModuleList.append registers the module under the next index name ('0', '1', ...), refuses "
                      "non-Modules with a TypeError naming their type, returns self", after="test_setattr_registers")
def test_module_list_append(student):
    layers = student.ModuleList()
    first, second = student.Linear(2, 2), student.Linear(2, 1)
    assert layers.append(first) is layers, "append must return the ModuleList itself"
    layers.append(second)
    expect_equal(list(layers._modules), ["0", "1"], "the names of two appended modules")
    assert layers[1] is second, "layers[1] must be the second module appended"
    expect_equal(len(layers), 2, "len after two appends")
    expect_equal(_names(layers.named_parameters()), ["0.weight", "0.bias", "1.weight", "1.bias"],
                 "named_parameters() of the ModuleList")
    expect_raises(TypeError, lambda: layers.append("not a module"), "ModuleList.append('not a module')",
                  mentions=("str",))
    expect_equal(len(layers), 2, "len after a refused append")


@check(points=2, hint="compute on the tensors' device: LinearFunction uses self.xp, load_state_dict copies host arrays "
                      "onto the model's device (backend.from_host) and tensors of another device through the host "
                      "(to_host, then from_host), never np", after=("test_load_state_dict", "test_linear_backward"))
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
        expect_equal(layer.weight.device, inputs.device, "the weight's device after load_state_dict of NumPy arrays")
        results[device] = [out.numpy(), inputs.grad.numpy(), layer.weight.grad.numpy(), layer.bias.grad.numpy()]
    for name, cpu, strict in zip(("output", "input gradient", "weight gradient", "bias gradient"), *results.values()):
        expect_close(strict, cpu, f"Linear's {name} on the strict device (against the cpu's)", rtol=1e-5)

    for source, target in (("cpu", "strict"), ("strict", "cpu")):  # a state of tensors from the other device
        saved = student.Linear(4, 3).to(source)
        layer = student.Linear(4, 3).to(target)
        array = layer.weight.data
        try:
            layer.load_state_dict(saved.state_dict())
        except TypeError as error:
            raise AssertionError(f"loading a {source!r} state into a {target!r} model: {error}") from None
        assert layer.weight.data is array, f"loading a {source!r} state into a {target!r} model must copy in place"
        expect_equal(layer.weight.device, "strict:0" if target == "strict" else "cpu",
                     f"the weight's device after loading a {source!r} state into a {target!r} model")
        expect_equal(layer.weight.numpy(), saved.weight.numpy(), f"the weight after loading a {source!r} state")
        expect_equal(layer.bias.numpy(), saved.bias.numpy(), f"the bias after loading a {source!r} state")
