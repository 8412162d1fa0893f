"""Export a model to ONNX, the graph format that deployment runtimes (ONNX Runtime, TensorRT, ...) read.

``tt.onnx.export(model, example_inputs, path)`` runs the model once on
``example_inputs`` in evaluation mode and records every
:class:`~tinytrain.autograd.Function` it applies -- the same operations that
autograd records for a backward pass, here with their arguments. Each recorded
operation becomes one or a few ONNX nodes built with ``onnx.helper``:

* an operation whose inputs all come from the weights and constants (BatchNorm's
  running statistics folded into a scale and a shift, say) is computed already:
  its result is stored in the file as a constant (*constant folding*);
* every other one maps to ONNX operators: ``LinearFunction`` to ``Gemm``,
  ``Conv2dFunction`` to ``Conv``, ``Normalize`` to the reductions of LayerNorm's
  formula ``(x - mean) / sqrt(var + eps)`` (``AffineNormalize``: then ``* weight + bias``), ``GELUTanh`` to its tanh formula, ...

The graph has the shapes of ``example_inputs`` (a fixed batch and length); the
model's parameters and buffers are stored under their ``state_dict()`` names.
An operation with no mapping raises ``NotImplementedError`` naming it. The
file passes ``onnx.checker``, and ONNX Runtime computes the model's outputs
from it (to float32 rounding).

Needs the ``onnx`` package (``pip install 'tinytrain[onnx]'``; ``onnxruntime`` to run the file).
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tinytrain.autograd import Function, no_grad
from tinytrain.serialization import atomic_write
from tinytrain.tensor import Tensor, tensor

OPSET = 17  # run by every recent ONNX Runtime; LayerNorm and GELU are written out, so nothing newer is needed


@dataclass
class Call:
    """One recorded operation: the Function's class, its input tensors, its keyword arguments, its result."""

    name: str
    inputs: tuple
    params: dict
    output: Tensor


@contextlib.contextmanager
def trace() -> Iterator[list[Call]]:
    """Record every ``Function.apply`` made inside the ``with`` block, in order, into the list it yields."""
    calls: list[Call] = []
    original = Function.__dict__["apply"]

    def recording_apply(cls: type, *inputs: Any, **params: Any) -> Any:
        output = original.__func__(cls, *inputs, **params)
        calls.append(Call(cls.__name__, inputs, params, output))
        return output

    Function.apply = classmethod(recording_apply)
    try:
        yield calls
    finally:
        Function.apply = original


@dataclass
class _Graph:
    """The ONNX graph being built: nodes, initializers, and the ONNX name of every tensor met so far."""

    helper: Any
    numpy_helper: Any
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    names: dict = field(default_factory=dict)  # id(tensor) -> ONNX value name of a graph value
    constants: dict = field(default_factory=dict)  # id(tensor) -> (tensor, name or None): values known when exporting
    counter: int = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}_{self.counter}"

    def constant(self, array: Any, name: str | None = None) -> str:
        """An initializer holding ``array`` (a NumPy array or scalar); its name."""
        name = name or self.fresh("constant")
        self.initializers.append(self.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], **attributes: Any) -> str:
        """Append the node ``op(inputs)`` with ``attributes``; the name of its one output."""
        output = self.fresh(op.lower())
        self.nodes.append(self.helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def value(self, t: Tensor) -> str:
        """The ONNX name of tensor ``t``: a graph value, or a constant made an initializer on first use."""
        key = id(t)
        if key in self.names:
            return self.names[key]
        known, name = self.constants.get(key, (t, None))
        self.names[key] = self.constant(known._backend.to_host(known.data), name)
        return self.names[key]


def _host(t: Tensor) -> np.ndarray:
    return t._backend.to_host(t.data)


def _like(graph: _Graph, call: Call, value: float) -> str:
    """A scalar constant ``value`` in the dtype of the call's first input (ONNX does not mix dtypes)."""
    return graph.constant(np.asarray(value, dtype=call.inputs[0].dtype))


# -- one converter per Function: (graph, call, names of the inputs) -> name of the output ---------------------------
def _elementwise(op: str) -> Callable:
    return lambda graph, call, x: graph.node(op, x)


def _reshape(graph: _Graph, call: Call, x: list[str]) -> str:
    return graph.node("Reshape", [x[0], graph.constant(np.asarray(call.params["shape"], dtype=np.int64))])


def _transpose(graph: _Graph, call: Call, x: list[str]) -> str:
    ndim = call.inputs[0].ndim
    axes = call.params["axes"] or tuple(reversed(range(ndim)))
    return graph.node("Transpose", x, perm=[axis % ndim for axis in axes])


def _get_item(graph: _Graph, call: Call, x: list[str]) -> str:
    """Basic indexing: slices (any step), integers (their axis removed) and one Ellipsis."""
    index = call.params["index"]
    index = index if isinstance(index, tuple) else (index,)
    shape = call.inputs[0].shape
    if sum(item is Ellipsis for item in index) > 1 or not all(
            item is Ellipsis or isinstance(item, (slice, int, np.integer)) for item in index):
        raise NotImplementedError(f"tt.onnx.export: indexing with {index!r} has no ONNX mapping here "
                                  "(slices, integers and one Ellipsis do)")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (len(shape) - len(index) + 1) + index[at + 1:]
    cuts, dropped = [], []  # (start, end, axis, step) of every axis not taken whole; the integer-indexed axes
    for axis, item in enumerate(index):
        if isinstance(item, slice):
            start, stop, step = item.indices(shape[axis])
            if (start, stop, step) == (0, shape[axis], 1):
                continue
            # a negative step's stop of -1 means "past the front": ONNX spells that as a very negative end
            cuts.append((start, stop if stop >= 0 else -(2 ** 62), axis, step))
        else:
            start = int(item) % shape[axis]
            cuts.append((start, start + 1, axis, 1))
            dropped.append(axis)
    out = x[0]
    if cuts:
        out = graph.node("Slice", [out, *(graph.constant(np.asarray(column, dtype=np.int64)) for column in zip(*cuts))])
    if dropped:
        out = graph.node("Squeeze", [out, graph.constant(np.asarray(dropped, dtype=np.int64))])
    return out if out != x[0] else graph.node("Identity", x)


def _reduce(op: str) -> Callable:
    def convert(graph: _Graph, call: Call, x: list[str]) -> str:
        axis, ndim = call.params["axis"], call.inputs[0].ndim
        axes = list(range(ndim)) if axis is None else [a % ndim for a in (axis if isinstance(axis, tuple) else (axis,))]
        keepdims = int(bool(call.params.get("keepdims", False)))
        if op == "ReduceSum":  # since opset 13 its axes are an input; the others' still an attribute in 17
            return graph.node(op, [x[0], graph.constant(np.asarray(axes, dtype=np.int64))], keepdims=keepdims)
        return graph.node(op, x, axes=axes, keepdims=keepdims)
    return convert


def _softmax(op: str) -> Callable:
    return lambda graph, call, x: graph.node(op, x, axis=call.params["axis"])


def _linear(graph: _Graph, call: Call, x: list[str]) -> str:
    """``x @ weight.T + bias``: ``Gemm`` with ``transB`` for a matrix ``x``, else ``MatMul`` then ``Add``."""
    if call.inputs[0].ndim == 2:
        return graph.node("Gemm", x, transB=1)
    out = graph.node("MatMul", [x[0], graph.node("Transpose", [x[1]], perm=[1, 0])])
    return graph.node("Add", [out, x[2]]) if len(x) > 2 else out


def _conv2d(graph: _Graph, call: Call, x: list[str]) -> str:
    (pad_h, pad_w), kernel = call.params["padding"], call.inputs[1].shape[2:]
    return graph.node("Conv", x, kernel_shape=list(kernel), strides=list(call.params["stride"]),
                      pads=[pad_h, pad_w, pad_h, pad_w])


def _pool(op: str) -> Callable:
    return lambda graph, call, x: graph.node(op, x, kernel_shape=list(call.params["kernel"]),
                                             strides=list(call.params["stride"]))


def _gelu_tanh(graph: _Graph, call: Call, x: list[str]) -> str:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, written out (ONNX's Gelu needs opset 20)."""
    cube = graph.node("Mul", [x[0], graph.node("Mul", [x[0], x[0]])])
    inner = graph.node("Add", [x[0], graph.node("Mul", [cube, _like(graph, call, 0.044715)])])
    tanh = graph.node("Tanh", [graph.node("Mul", [inner, _like(graph, call, math.sqrt(2 / math.pi))])])
    half_x = graph.node("Mul", [x[0], _like(graph, call, 0.5)])
    return graph.node("Mul", [half_x, graph.node("Add", [tanh, _like(graph, call, 1.0)])])


def _normalize(graph: _Graph, call: Call, x: list[str]) -> str:
    """``(x - mean) / sqrt(var + eps)`` over ``axes``, the mean and (biased) variance taken from ``x``."""
    data, axes = _host(call.inputs[0]), tuple(call.params["axes"])
    mean, var = np.asarray(call.params["mean"]), np.asarray(call.params["var"])
    if not (np.allclose(mean, data.mean(axis=axes, keepdims=True), atol=1e-5)
            and np.allclose(var, data.var(axis=axes, keepdims=True), rtol=1e-4, atol=1e-5)):
        raise NotImplementedError("tt.onnx.export: Normalize with statistics that are not its input's own (a "
                                  "BatchNorm in training mode?) has no ONNX mapping; export runs in eval mode")
    centred = graph.node("Sub", [x[0], graph.node("ReduceMean", x, axes=list(axes), keepdims=1)])
    variance = graph.node("ReduceMean", [graph.node("Mul", [centred, centred])], axes=list(axes), keepdims=1)
    return graph.node("Div", [centred, graph.node("Sqrt", [graph.node("Add", [variance, _like(graph, call,
                                                                                                call.params["eps"])])])])


def _affine_normalize(graph: _Graph, call: Call, x: list[str]) -> str:
    """A LayerNorm's ``AffineNormalize``: ``Normalize``'s formula over the trailing axes, then ``* weight + bias``."""
    return graph.node("Add", [graph.node("Mul", [_normalize(graph, call, x[:1]), x[1]]), x[2]])


def _embedding(graph: _Graph, call: Call, x: list[str]) -> str:
    return graph.node("Gather", [x[0], x[1]], axis=0)


def _masked_softmax(graph: _Graph, call: Call, x: list[str]) -> str:
    """Softmax over the last axis of the allowed scores (the others set to -inf first)."""
    allowed = call.params["allowed"]
    scores = x[0]
    if allowed is not None:
        mask = graph.constant(np.asarray(call.inputs[0]._backend.to_host(allowed), dtype=bool))
        scores = graph.node("Where", [mask, scores, _like(graph, call, -np.inf)])
    return graph.node("Softmax", [scores], axis=-1)


def _clip(graph: _Graph, call: Call, x: list[str]) -> str:
    bounds = [("" if call.params[k] is None else _like(graph, call, call.params[k])) for k in ("low", "high")]
    return graph.node("Clip", [x[0], *bounds])


def _concatenate(graph: _Graph, call: Call, x: list[str]) -> str:
    return graph.node("Concat", x, axis=call.params["axis"])


def _stack(graph: _Graph, call: Call, x: list[str]) -> str:
    axis = graph.constant(np.asarray([call.params["axis"]], dtype=np.int64))
    return graph.node("Concat", [graph.node("Unsqueeze", [name, axis]) for name in x], axis=call.params["axis"])


CONVERTERS: dict[str, Callable] = {
    **{name: _elementwise(name) for name in ("Add", "Sub", "Mul", "Div", "MatMul", "Pow", "Neg", "Exp", "Log",
                                            "Sqrt", "Tanh", "Sigmoid", "Abs")},
    "ReLU": _elementwise("Relu"),
    "Reshape": _reshape,
    "Transpose": _transpose,
    "GetItem": _get_item,
    "Sum": _reduce("ReduceSum"),
    "Mean": _reduce("ReduceMean"),
    "Max": _reduce("ReduceMax"),
    "Softmax": _softmax("Softmax"),
    "LogSoftmax": _softmax("LogSoftmax"),
    "LinearFunction": _linear,
    "Conv2dFunction": _conv2d,
    "MaxPool2dFunction": _pool("MaxPool"),
    "AvgPool2dFunction": _pool("AveragePool"),
    "GELUTanh": _gelu_tanh,
    "Normalize": _normalize,
    "AffineNormalize": _affine_normalize,
    "EmbeddingFunction": _embedding,
    "MaskedSoftmax": _masked_softmax,
    "Clip": _clip,
    "Concatenate": _concatenate,
    "Stack": _stack,
}


def _onnx() -> tuple[Any, Any, Any]:
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise ImportError("tt.onnx.export needs the onnx package: pip install 'tinytrain[onnx]'") from None
    return onnx, helper, numpy_helper


def _as_tensors(example_inputs: Any) -> tuple[Tensor, ...]:
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not inputs:
        raise ValueError("tt.onnx.export needs at least one example input")
    return tuple(item if isinstance(item, Tensor) else tensor(item) for item in inputs)


def export(model: Any, example_inputs: Any, path: str | os.PathLike, input_names: list[str] | None = None,
           output_names: list[str] | None = None) -> Path:
    """Write ``model`` as an ONNX graph (opset 17) to ``path``; returns the path.

    ``example_inputs`` is a tensor (or array) or a tuple of them: the model is
    called as ``model(*example_inputs)`` once, in evaluation mode (its mode is
    restored) without gradients, and returns a tensor or a tuple of tensors. The
    graph's inputs are named ``input_names`` (default ``input``, or ``input_0``,
    ``input_1``, ...) and have those inputs' shapes and dtypes; its outputs
    ``output_names`` (default ``output``, ``output_0``, ...). Raises
    ``NotImplementedError`` naming the first operation that has no ONNX mapping,
    and ``onnx.checker``'s error for a graph it rejects; a failed export leaves
    ``path`` as it was.
    """
    onnx, helper, numpy_helper = _onnx()
    inputs = _as_tensors(example_inputs)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with no_grad(), trace() as calls:
            result = model(*inputs)
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    if not all(isinstance(out, Tensor) for out in outputs):
        raise TypeError(f"tt.onnx.export: the model must return a tensor or a tuple of tensors, got "
                        f"{type(result).__name__}")
    input_names = input_names or (["input"] if len(inputs) == 1 else [f"input_{i}" for i in range(len(inputs))])
    output_names = output_names or (["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))])
    for kind, names, values in (("input_names", input_names, inputs), ("output_names", output_names, outputs)):
        if len(names) != len(values):
            raise ValueError(f"tt.onnx.export: {len(values)} {kind[:-6]}s but {kind}={names!r}")

    graph = _Graph(helper, numpy_helper)
    owned = model.named_parameters() + model.named_buffers() if hasattr(model, "named_parameters") else []
    graph.constants.update({id(t): (t, name) for name, t in owned})
    input_arrays = {}  # id(array) -> graph input name: an Embedding's ids arrive as an input's raw array
    for name, t in zip(input_names, inputs):
        graph.names[id(t)] = name
        input_arrays[id(t.data)] = name
    for call in calls:
        ids = call.params.get("ids") if call.name == "EmbeddingFunction" else None
        if not any(id(t) in graph.names for t in call.inputs) and id(ids) not in input_arrays:
            graph.constants[id(call.output)] = (call.output, None)  # computable now: folded into a constant
            continue
        converter = CONVERTERS.get(call.name)
        if converter is None:
            shapes = ", ".join(str(t.shape) for t in call.inputs)
            raise NotImplementedError(f"tt.onnx.export: the operation {call.name} (inputs of shapes {shapes}) has no "
                                      f"ONNX mapping; mapped: {', '.join(sorted(CONVERTERS))}")
        names = [graph.value(t) for t in call.inputs]
        if ids is not None:
            names.append(input_arrays.get(id(ids)) or graph.constant(call.inputs[0]._backend.to_host(ids)))
        graph.names[id(call.output)] = converter(graph, call, names)

    for name, out in zip(output_names, outputs):
        graph.nodes.append(helper.make_node("Identity", [graph.value(out)], [name], name=name))

    def info(name: str, t: Tensor) -> Any:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape))

    onnx_graph = helper.make_graph(graph.nodes, type(model).__name__, [info(n, t) for n, t in zip(input_names, inputs)],
                                   [info(n, t) for n, t in zip(output_names, outputs)], graph.initializers)
    onnx_model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                   producer_name="tinytrain")
    onnx.checker.check_model(onnx_model, full_check=True)
    path = Path(path)
    encoded = onnx_model.SerializeToString()
    atomic_write(path, lambda file: file.write(encoded))
    return path
