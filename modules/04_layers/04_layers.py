# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 04 — Layers
#
# *One sitting, about 2 hours: the lesson, 7 functions to write, and the measurements.*
#
# With tensors (Module 01), gradients (Module 02) and activations (Module 03) you
# could already train a network: create weight tensors by hand, write the forward
# pass as a formula, and update every weight after `backward()`. That stops being
# fun at the third layer. This module builds the abstraction every deep-learning
# library has: the **module** — an object that owns its parameters, computes a
# forward pass, and can be nested inside other modules.
#
# **You will**
# 1. write `Module`: parameters and sub-modules found automatically, saving and
#    loading weights (`state_dict`), moving a model between devices (train/eval
#    modes are given);
# 2. write `Linear`'s fused backward rule (its initialisation, the one PyTorch
#    uses, is derived from a variance argument and given) and `ModuleList`;
#    `Sequential`, the activation modules and `Flatten` are given;
# 3. count the parameters and bytes of an MLP and time its training step.
#
# Module 05 adds the layers that regularise and normalise: `Dropout`,
# `LayerNorm` and `BatchNorm1d`.

# %%
import time

import numpy as np

import tinytrain as tt
from tinytrain import Tensor

# %% [markdown]
# ## 1. Why a `Module`?
#
# Here is a two-layer network written by hand:
#
# ```python
# w1, b1 = tt.randn(784, 256, requires_grad=True), tt.zeros(256, requires_grad=True)
# w2, b2 = tt.randn(256, 10, requires_grad=True), tt.zeros(10, requires_grad=True)
# logits = (x @ w1 + b1).relu() @ w2 + b2
# ```
#
# Every tensor that the optimizer must update has to be listed by hand, again
# for saving a checkpoint, again for moving to a GPU. Forget one and the model
# silently trains without it. A `Module` does the bookkeeping instead:
#
# * a **`Parameter`** is a tensor that marks itself as "a weight to train";
# * assigning a `Parameter` or another `Module` to an attribute of a module
#   (`self.weight = Parameter(...)`, `self.encoder = Linear(...)`) *registers* it,
#   in the order of assignment (re-assigning a name keeps its place, as in PyTorch);
# * `parameters()` then walks the tree of sub-modules and returns every parameter
#   exactly once — also when one layer is used twice (*weight sharing*);
# * the same walk gives `named_parameters()` (names like `layers.0.weight`),
#   `train()` / `eval()` (switch every sub-module's mode), `zero_grad()`,
#   `to(device)` and `state_dict()`.
#
# Registration happens in `__setattr__`, which Python calls for every
# `self.name = value`. Besides parameters and sub-modules a module can own
# **buffers**: tensors that are part of its state but not trained, such as
# BatchNorm's running averages (Module 05). They are registered explicitly with
# `register_buffer(name, tensor)`, move with `to(device)` and are saved in
# `state_dict()`.
#
# `Parameter` subclasses `Tensor` and only changes the defaults: it requires grad.
# Operations on parameters return plain tensors, because operations build their
# results with `Tensor._make`.

# %% export="nn/module"
"""``Module`` and ``Parameter``: the containers that every layer is built from.

A ``Module`` registers the ``Parameter``s, buffers and sub-modules assigned to its
attributes, so ``parameters()``, ``train()``/``eval()``, ``state_dict()``,
``zero_grad()`` and ``to(device)`` reach the whole tree of sub-modules.
"""
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from tinytrain.arguments import check_type
from tinytrain.backend import get_backend, is_floating
from tinytrain.tensor import Tensor


class Parameter(Tensor):
    """A tensor that a ``Module`` registers as trainable; it requires grad by default.

    Built from data like ``Tensor`` (a copy; floats become float32).
    """

    __slots__ = ()

    def __init__(self, data: Any, requires_grad: bool = True, dtype: Any = None, device: Any = None) -> None:
        super().__init__(data, requires_grad=requires_grad, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` skipped."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _loadable(module: "Module", state: Any, own: dict[str, Tensor]) -> dict[str, Any]:
    """``state`` with each value for one of ``own``'s tensors checked, and made an array unless it is a tensor.

    A value must hold numbers that its tensor's dtype takes without changing kind
    (``np.can_cast(..., "same_kind")``: no strings, no floats into an integer buffer).
    Raises ``TypeError`` naming every bad key with the value's dtype and shape, before
    anything is copied; values under other keys are left as they are.
    """
    check_type("state", state, Mapping, "a dict of name -> tensor or array, as state_dict() returns")
    values, problems = dict(state), []
    for name, tensor in own.items():
        if name not in values:
            continue
        value = values[name]
        if not isinstance(value, Tensor):
            try:
                value = values[name] = np.asarray(value)
            except (TypeError, ValueError) as error:  # a ragged list
                problems.append(f"{name} holds a {type(value).__name__} that is not an array ({error})")
                continue
        numbers = value.dtype.kind in "biu" or is_floating(value.dtype)
        if not numbers or not np.can_cast(value.dtype, tensor.dtype, "same_kind"):
            problems.append(f"{name} holds {value.dtype} values of shape {tuple(value.shape)}, "
                            f"expected numbers for a {tensor.dtype} tensor of shape {tensor.shape}")
    if problems:
        raise TypeError(f"cannot load the state into {type(module).__name__}: " + "; ".join(problems))
    return values


def _indent(text: str) -> str:
    """Indent every line but the first by two spaces (for nested reprs)."""
    return text.replace("\n", "\n  ")


class Module:
    """Base class of every layer and model.

    Subclasses call ``super().__init__()`` first, assign parameters, buffers and
    sub-modules to attributes, and define ``forward``; ``module(x)`` calls
    ``forward(x)``.
    """

    def __init__(self) -> None:
        # object.__setattr__: our own __setattr__ needs these dicts to exist already.
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    # -- registration --------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        """Register ``Parameter`` and ``Module`` values; keep buffers up to date.

        Assigning any other value to the name of a registered parameter or module
        removes that registration (``model.scale = 3.0`` makes ``scale`` a plain
        attribute, no longer in ``parameters()``).

        A ``Tensor`` or ``None`` assigned to the name of a registered buffer replaces
        the buffer, which stays registered (also while it is ``None``); a plain
        ``Tensor`` assigned to any other name is an ordinary attribute, not a buffer
        (only ``register_buffer`` makes one). Assigning a ``Parameter``, a ``Module``
        or a ``Tensor`` before ``Module.__init__`` ran (the registries do not exist
        yet) raises ``AttributeError`` telling to call ``super().__init__()`` first;
        any other value is then an ordinary attribute, as in PyTorch. Re-assigning a
        registered name keeps its place in the registration order.
        """
        ### BEGIN SOLUTION
        if "_parameters" not in self.__dict__:
            if isinstance(value, (Parameter, Module, Tensor)):
                raise AttributeError(
                    f"cannot assign {name!r} before Module.__init__() ran: call super().__init__() first "
                    f"in {type(self).__name__}.__init__"
                )
            object.__setattr__(self, name, value)
            return
        if isinstance(value, Parameter):
            home = self._parameters
        elif isinstance(value, Module):
            home = self._modules
        elif name in self._buffers and (value is None or isinstance(value, Tensor)):
            home = self._buffers
        else:
            home = None  # an ordinary attribute
        for registry in (self._parameters, self._buffers, self._modules):
            if registry is not home:
                registry.pop(name, None)
        if home is not None:
            home[name] = value  # re-assigning keeps the name's place in the order
        object.__setattr__(self, name, value)
        ### END SOLUTION

    def __delattr__(self, name: str) -> None:
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Tensor | None) -> None:
        """Register ``tensor`` as state that is saved and moved but not trained.

        As in PyTorch, ``name`` must be a non-empty ``str`` without ``"."`` (``TypeError``,
        ``KeyError``), and a name that is already an attribute (a parameter, a sub-module,
        a method, a plain attribute) and not a buffer raises ``KeyError``: delete that
        attribute first to reuse its name. Nothing changes when it raises.
        """
        check_type("name", name, str, "a str")
        if name == "" or "." in name:
            raise KeyError(f"buffer name {name!r} must be non-empty and must not contain a dot "
                           f"(dotted names address sub-modules)")
        if hasattr(self, name) and name not in self._buffers:
            kind = ("a parameter" if name in self._parameters else "a sub-module" if name in self._modules
                    else "a method" if callable(getattr(self, name)) else "an attribute")
            raise KeyError(f"attribute {name!r} already exists: it is {kind} of {type(self).__name__}; "
                           f"register the buffer under another name (or delete the attribute first)")
        if not isinstance(tensor, (Tensor, type(None))):
            raise TypeError(f"buffer {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        if isinstance(tensor, Parameter):
            raise TypeError(f"buffer {name!r} is a Parameter; assign parameters as attributes instead")
        self.__setattr__(name, tensor)
        self._buffers[name] = tensor

    # -- forward -------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- walking the tree ------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> list[tuple[str, "Module"]]:
        """``(name, module)`` for this module (name ``prefix``) and every descendant, once each:
        depth first, children in registration order (``""``, ``"a"``, ``"a.inner"``, ``"b"``)."""
        ### BEGIN SOLUTION
        found: list[tuple[str, Module]] = []
        seen: set[int] = set()
        stack = [(prefix, self)]
        while stack:  # depth first, children in registration order
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            found.append((name, module))
            children = [(f"{name}.{child_name}" if name else child_name, child)
                        for child_name, child in module._modules.items() if child is not None]
            stack.extend(reversed(children))
        return found
        ### END SOLUTION

    def modules(self) -> list["Module"]:
        """This module and all its descendants, each once, parents before children."""
        return [module for _, module in self.named_modules()]

    def named_children(self) -> list[tuple[str, "Module"]]:
        """The direct sub-modules with their attribute names (a shared one once)."""
        unique = {}
        for name, module in self._modules.items():
            if module is not None and id(module) not in unique:
                unique[id(module)] = (name, module)
        return list(unique.values())

    def children(self) -> list["Module"]:
        return [module for _, module in self.named_children()]

    def _named_tensors(self, kind: str) -> list[tuple[str, Tensor]]:
        """Dotted names and tensors of registry ``kind`` over the tree; each tensor once."""
        found = []
        seen: set[int] = set()
        for module_name, module in self.named_modules():
            for name, tensor in getattr(module, kind).items():
                if tensor is None or id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                found.append((f"{module_name}.{name}" if module_name else name, tensor))
        return found

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """``(dotted name, parameter)`` pairs, each parameter once, in registration order."""
        return self._named_tensors("_parameters")

    def parameters(self) -> list[Parameter]:
        """Every parameter of the tree once (shared layers count once).

        A list (PyTorch returns an iterator; a list works wherever one is expected).
        """
        return [parameter for _, parameter in self.named_parameters()]

    def named_buffers(self) -> list[tuple[str, Tensor]]:
        return self._named_tensors("_buffers")

    def buffers(self) -> list[Tensor]:
        return [buffer for _, buffer in self.named_buffers()]

    def num_parameters(self) -> int:
        """The number of trainable numbers (shared parameters count once)."""
        return sum(parameter.size for parameter in self.parameters())

    # -- modes and gradients ----------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Set training mode (``mode=False``: evaluation mode) on every sub-module; returns ``self``.

        ``mode`` must be a bool (``TypeError`` otherwise: ``train("no")`` would be training mode)."""
        check_type("mode", mode, (bool, np.bool_), "True or False")
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        """Evaluation mode on every sub-module (``train(False)``); returns ``self``."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop every parameter's gradient (sets ``.grad`` to ``None``)."""
        for parameter in self.parameters():
            parameter.grad = None

    # -- devices and dtypes --------------------------------------------------------------
    def to(self, device: Any = None, dtype: Any = None) -> "Module":
        """Move (and/or cast) every parameter, gradient and buffer in place; returns ``self``.

        The tensor objects stay the same, so an optimizer built on ``parameters()``
        before the move keeps working, and every array keeps its memory order
        (``Linear``'s column-major weight stays column-major). ``dtype`` applies to
        floating-point tensors only (``is_floating(t.dtype)``, which counts bfloat16 in);
        without it no dtype changes. An unknown ``dtype``,
        or one that is not floating point (``"int32"``, ``"bool"``, complex: PyTorch takes
        complex ones, tinytrain has none), raises ``TypeError`` naming it before anything
        moves (the given first lines, which also make ``dtype`` a NumPy dtype).
        """
        if dtype is not None:
            dtype = np.dtype(dtype)  # TypeError for an unknown dtype
            if not is_floating(dtype):
                raise TypeError(f"{type(self).__name__}.to: dtype must be a floating-point dtype (bfloat16, float16, "
                                f"float32 or float64), got dtype={dtype}; a module's parameters stay floating point")
        ### BEGIN SOLUTION
        target = None if device is None else get_backend(device)
        for tensor in self.parameters() + self.buffers():
            for t in (tensor, tensor.grad):
                if t is None:
                    continue
                if target is not None and t._backend is not target:
                    t.data = target.from_host(t._backend.to_host(t.data))
                    t._backend = target
                if dtype is not None and is_floating(t.dtype) and t.dtype != dtype:
                    t.data = t.data.astype(dtype)
        return self
        ### END SOLUTION

    # -- saving and loading -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """Every parameter and buffer by dotted name: detached *copies*, on their device;
        first every parameter (in ``named_parameters()`` order), then every buffer.

        Unlike PyTorch, which hands out references, the copies do not change when
        training goes on, so ``best = model.state_dict()`` keeps the best weights.
        """
        ### BEGIN SOLUTION
        return {
            name: Tensor._make(tensor.data.copy(), tensor._backend)
            for name, tensor in self.named_parameters() + self.named_buffers()
        }
        ### END SOLUTION

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy the values of ``state`` into this module's tensors: tensors (on any device),
        NumPy arrays, or lists and numbers that ``np.asarray`` takes.

        Values are copied into the existing arrays, so they keep their device and
        dtype and share no memory with ``state``. Raises ``RuntimeError`` listing
        every missing key and every unexpected key (unless ``strict=False``) and
        every shape mismatch with both shapes (always); nothing is copied when it raises.

        Given: ``own`` maps each name to this module's tensor, and ``state`` has been
        checked by ``_loadable`` (a mapping whose values for ``own``'s names are
        tensors or NumPy arrays of numbers their tensor's dtype takes; a bad one
        raises ``TypeError`` naming its key before anything is copied).
        """
        own = dict(self.named_parameters() + self.named_buffers())
        state = _loadable(self, state, own)
        ### BEGIN SOLUTION
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        problems = []
        if strict and missing:
            problems.append(f"missing keys: {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"unexpected keys: {', '.join(unexpected)}")
        sources = {}
        for name, tensor in own.items():
            if name not in state:
                continue
            value = state[name]  # a tensor or a NumPy array (given: _loadable)
            if tuple(value.shape) != tensor.shape:
                problems.append(
                    f"shape mismatch for {name}: the model has {tensor.shape}, the state has {tuple(value.shape)}"
                )
            sources[name] = value
        if problems:
            raise RuntimeError(f"cannot load the state into {type(self).__name__}: " + "; ".join(problems))
        for name, value in sources.items():
            tensor = own[name]
            if not isinstance(value, Tensor):
                array = tensor._backend.from_host(value)
            elif value._backend is tensor._backend:
                array = value.data
            else:
                array = tensor._backend.from_host(value._backend.to_host(value.data))
            tensor.data[...] = array  # in place: same array, same device and dtype, no sharing
        return IncompatibleKeys(missing, unexpected)
        ### END SOLUTION

    # -- printing ----------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The arguments shown inside ``Name(...)``; layers override it."""
        return ""

    def __repr__(self) -> str:
        children = [f"({name}): {_indent(repr(module))}" for name, module in self.named_children()]
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = ([self.extra_repr()] if self.extra_repr() else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


# %% [markdown]
# A model is a class with an `__init__` that creates its pieces and a `forward`
# that uses them. Here the same `Scale` module is used twice — its parameter must
# still be counted once, or an optimizer would update it twice per step:

# %%
class Scale(Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.factor = Parameter([value])
        self.register_buffer("calls", tt.zeros((), dtype="int64"))

    def forward(self, x: Tensor) -> Tensor:
        self.calls.data += 1  # a buffer: state that is saved but not trained
        return x * self.factor


class Twice(Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Scale(2.0)
        self.second = self.first  # weight sharing: the same module twice
        self.last = Scale(0.5)
        self.name = "just an attribute"  # neither a Parameter nor a Module: not registered

    def forward(self, x: Tensor) -> Tensor:
        return self.last(self.second(self.first(x)))


model = Twice()
print(model)
print([name for name, _ in model.named_parameters()])
print(model(tt.tensor([1.0, 3.0])), model.state_dict())

# %% check=2
model = Twice()
assert [name for name, _ in model.named_parameters()] == ["first.factor", "last.factor"]
assert model.parameters()[0] is model.first.factor and len(model.parameters()) == 2
assert [name for name, _ in model.named_modules()] == ["", "first", "last"]
assert model.modules()[0] is model and model.children() == [model.first, model.last]
assert [name for name, _ in model.named_buffers()] == ["first.calls", "last.calls"]
assert model.num_parameters() == 2
model.first = Scale(3.0)  # re-assigning replaces the registration
assert model.parameters()[0].item() == 3.0 and len(model.parameters()) == 3, \
    "model.first = Scale(3.0) keeps 'first' in its place: its factor first, 3 parameters in all"
try:
    class Forgot(Module):
        def __init__(self):
            self.w = Parameter([1.0])
    Forgot()
except AttributeError as error:
    assert "super().__init__()" in str(error), error
else:
    raise AssertionError("assigning before Module.__init__ ran must raise a clear AttributeError")
print("registration OK")

# %% check=1
model = Twice()
assert model.training and model.last.training
assert model.eval() is model and not model.training and not model.first.training and not model.last.training
assert model.train() is model and all(m.training for m in model.modules())
out = model(tt.tensor([1.0, 3.0]))
out.sum().backward()
assert model.first.factor.grad is not None
model.zero_grad()
assert all(p.grad is None for p in model.parameters())
print("train/eval/zero_grad OK")

# %% [markdown]
# `state_dict()` maps each dotted name to a *copy* of the tensor, and
# `load_state_dict` copies values back into the existing arrays. A mistake —
# a layer renamed, a width changed — must not load silently: every missing key,
# unexpected key and shape mismatch is reported at once, and nothing is copied.

# %% check=2
source, target = Twice(), Twice()
source.first.factor.data[...] = 7.0
saved = source.state_dict()
assert list(saved) == ["first.factor", "last.factor", "first.calls", "last.calls"]
saved["first.factor"].data[...] = 8.0
assert source.first.factor.item() == 7.0, "state_dict() must return copies"
target.load_state_dict(source.state_dict())
assert target.first.factor.item() == 7.0
source.first.factor.data[...] = 9.0
assert target.first.factor.item() == 7.0, "load_state_dict must copy, not share"
target.load_state_dict({k: v.numpy() for k, v in saved.items()})  # NumPy arrays work too
assert target.first.factor.item() == 8.0 and target.first.factor.dtype == np.float32
broken = dict(saved, extra=tt.zeros(1), **{"last.factor": tt.zeros(2)})
del broken["first.calls"]
try:
    target.load_state_dict(broken)
except RuntimeError as error:
    message = str(error)
    assert "first.calls" in message and "extra" in message and "(1,)" in message and "(2,)" in message, message
else:
    raise AssertionError("a bad state must raise RuntimeError")
assert target.first.factor.item() == 8.0, "nothing is copied when loading fails"
print("state_dict OK")

# %% [markdown]
# `to(device)` moves every parameter and buffer *in place*: the `Parameter`
# objects stay the same, so an optimizer created before the move still holds the
# right tensors. (`"strict"` is the test stand-in for a GPU from Module 01.)

# %% check=1
model = Twice()
factor = model.first.factor
assert model.to("strict") is model and model.first.factor is factor
assert all(t.device == "strict:0" for t in model.parameters() + model.buffers())
print(model(tt.tensor([1.0], device="strict")).device)
model.to("cpu", dtype="float64")
assert factor.device == "cpu" and factor.dtype == np.float64 and model.first.calls.dtype == np.int64
print("to(device) OK")

# %% [markdown]
# ## 2. `Linear`: the fully connected layer
#
# A linear (fully connected, dense) layer computes $y = x W^\top + b$ for every
# row $x$ of the input. We store $W$ as an `(out_features, in_features)` matrix —
# PyTorch's layout, and the same as `Conv2d`'s `(out_ch, in_ch, kH, kW)` — so
# weights load from PyTorch without transposing.
#
# Written as `x @ W.T + b`, a layer would record three operations (transpose,
# matmul, add). We fuse them into one `Function`. For $Y = X W^\top + b$ with
# upstream gradient $G = \bar Y$:
#
# $$\bar X = G W, \qquad \bar W = G^\top X, \qquad \bar b = \textstyle\sum_{\text{rows}} G.$$
#
# Check the shapes: $G$ is `(N, out)`, $W$ is `(out, in)`, $X$ is `(N, in)`. Inputs
# with more leading axes, `(..., in)`, are flattened to rows for $\bar W$ and
# $\bar b$. (`G @ W` on a stack `(..., out)` is right too, but NumPy multiplies a
# stack by a matrix one slice at a time: the given forward, and the reference's
# $\bar X$, multiply the rows as one `(N, in)` matrix and reshape back, up to
# 1.4x faster for a GPT's `(B, T, C)` activations.)
#
# ### Initialisation: why $U(-1/\sqrt{n}, 1/\sqrt{n})$
#
# Take one output $y = \sum_{i=1}^{n} w_i x_i$ of a layer with $n$ inputs, with
# independent, zero-mean weights. Then
# $$\operatorname{Var}(y) = \sum_i \operatorname{Var}(w_i x_i) = n\,\operatorname{Var}(w)\,\mathbb E[x^2].$$
# Each layer multiplies the size of the signal (its mean square) by
# $n\,\operatorname{Var}(w)$, times what the activation function does. Unless that
# factor is 1, after 20 layers the signal has exploded or vanished.
# $\operatorname{Var}(w) = 1/n$ keeps it constant (LeCun et al., 1998);
# $2/n$ compensates for a ReLU zeroing half of its inputs (He et al., 2015).
#
# A uniform $U(-a, a)$ has variance $a^2/3$. PyTorch initialises `Linear` with
# `kaiming_uniform_(W, a=sqrt(5))`: standard deviation
# $\text{gain}/\sqrt n$ with $\text{gain} = \sqrt{2/(1 + 5)}$, i.e. a bound of
# $\sqrt 3 \cdot \sqrt{1/3}/\sqrt n = 1/\sqrt{n}$, so
# $\operatorname{Var}(w) = 1/(3n)$: each layer shrinks the variance by 3 (a
# historical default that PyTorch keeps for compatibility). The bias uses the same
# bound. We match PyTorch, and Module 05 shows what this does to a deep network.
#
# ### Memory order
#
# A shape says how to index a matrix; its *memory order* says how its numbers
# lie in memory: row after row (C order, NumPy's default) or column after column
# (Fortran order, "F"). `W.T` of a C-ordered `W` is an F-ordered *view*: no number
# moves. BLAS reads either order, but not equally fast: on our test machine
# (OpenBLAS, one thread) a product whose **right-hand** matrix is stored
# transposed takes about 20% longer, while the left-hand one is free to be either.
# The forward product $X W^\top$ and the input gradient $G W$ both have $W$ on the
# right, in opposite orders, so one of the two always pays. The first layer of a
# network needs no input gradient (nobody asks for the gradient of the data), so
# `Linear` stores `W` **column-major**: the same `(out, in)` shape and values, in
# the memory order of an `(in, out)` matrix. Then the first layer's forward pass
# is a plain product and nothing pays; section 4 measures it. In NumPy that is
# one call: `np.asfortranarray(w)`.
#
# One trap comes with it. An elementwise operation on two arrays of one shape but
# different orders (`a += b`, `a` C-ordered, `b` F-ordered) walks one of them
# across its rows, a cache miss for nearly every number: up to 40x slower. So
# everything that meets the weight elementwise takes its order: its gradient
# ($G^\top X$ is written straight into `xp.empty_like(weight)`, which keeps the
# order), and the optimizer's buffers (Module 07). The autograd engine copies a
# gradient into its leaf's order when an operation returns another one
# (`tinytrain.backend.memory_order(array)` tells the two apart).

# %% export="nn/layers"
"""The layers: ``Linear``, ``ModuleList`` and ``Sequential``, the activation modules and
``Flatten``, plus ``linear``, the functional form of ``Linear``.

``Linear`` stores its weight as ``(out_features, in_features)``, PyTorch's shape,
in column-major memory order, and computes ``x @ weight.T + bias`` in one fused
operation.
"""
import math
from typing import Any, Iterable, Iterator

import numpy as np

from tinytrain.arguments import check_int, check_type
from tinytrain.autograd import Function
from tinytrain.backend import bfloat16_operands, get_backend, is_floating
from tinytrain.nn.activations import gelu, log_softmax, softmax
from tinytrain.nn.module import Module, Parameter
from tinytrain.tensor import Tensor


class LinearFunction(Function):
    """``x @ weight.T + bias`` for ``x`` of shape ``(..., in)`` and ``weight`` of shape ``(out, in)``."""

    def forward(self, x: Any, weight: Any, bias: Any = None) -> Any:
        x, weight, rounding = bfloat16_operands(x, weight)  # a bfloat16 operand: a bfloat16 product (Module 17)
        self.x, self.weight = x, weight
        xp, shape = self.xp, (*x.shape[:-1], weight.shape[0])
        # (..., in) as one (rows, in) matrix: NumPy multiplies a stack by a matrix one slice at a time, which
        # makes a GPT's (B, T, C) products up to 1.4x slower. BLAS reads weight.T directly: no copy.
        rows = x.reshape(-1, x.shape[-1])
        if rounding is None:  # written straight into a new array of the result's shape (not a view of one)
            out = xp.empty(shape, dtype=xp.result_type(x.dtype, weight.dtype))
            xp.matmul(rows, weight.T, out=out.reshape(len(rows), weight.shape[0]))
        else:
            out = (rows @ weight.T).reshape(shape).astype(rounding)
        if bias is not None:
            out += bias  # in place: `out` is a fresh array
        return out

    def backward(self, grad: Any) -> tuple:
        """Gradients for ``x``, ``weight`` (and ``bias``): ``G W``, ``G^T X``, row sums of ``G``.

        One gradient per input: two without a bias (``len(self.inputs)`` is 2), and
        ``None`` for ``x`` or ``weight`` when that input needs none
        (``self.inputs[i].requires_grad``: the first layer skips ``G W``). The weight's
        gradient is written into ``xp.empty_like(weight)``, so it has the weight's dtype
        and memory order (the others come out in ``grad``'s dtype).
        """
        ### BEGIN SOLUTION
        x, weight, xp = self.x, self.weight, self.xp
        rows = grad.reshape(-1, grad.shape[-1])  # (..., out) -> (N, out): one product, as forward's
        grad_x = None
        if self.inputs[0].requires_grad:  # G W, as (N, in), back to x's shape
            grad_x = rows @ weight
            if grad.ndim != 2:  # a reshape is a view, which the engine may not overwrite (a ReLU's backward would)
                grad_x = grad_x.reshape(*grad.shape[:-1], weight.shape[1])
        grad_weight = None
        if self.inputs[1].requires_grad:
            # G^T X written straight into an array of W's memory order, so the optimizer's updates stay fast
            grad_weight = xp.matmul(rows.T, x.reshape(-1, x.shape[-1]), out=xp.empty_like(weight))
        if len(self.inputs) == 2:
            return grad_x, grad_weight
        # Row sums as the product 1^T G: BLAS does it about 3x faster than rows.sum(axis=0).
        return grad_x, grad_weight, self.xp.ones(len(rows), dtype=rows.dtype) @ rows
        ### END SOLUTION


def check_floating_input(operation: str, x: Tensor) -> None:
    """TypeError naming ``x``'s dtype and shape unless it holds floats: NumPy would quietly make
    an integer input times a float32 weight a float64 product, and so every later layer."""
    if x.dtype.kind != "c" and not is_floating(x.dtype):
        raise TypeError(f"{operation}: expected a floating-point input, got {x.dtype} of shape {x.shape}; convert it "
                        f"with x.astype('float32')")


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias``: ``x`` is ``(..., in)``, ``weight`` ``(out, in)``, ``bias`` ``(out,)``.

    Raises ``ValueError`` naming both shapes when ``x``'s last axis is not ``in``, and
    ``TypeError`` naming the dtype for an integer or boolean ``x`` (as PyTorch does).
    """
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: expected input of shape (..., {weight.shape[1]}) for a weight of shape "
            f"{weight.shape}, got input of shape {x.shape}"
        )
    check_floating_input("linear", x)
    operands = [x._operand(weight)] + ([] if bias is None else [x._operand(bias)])
    return LinearFunction.apply(x, *operands)


def _uniform_parameter(shape: tuple[int, ...], bound: float) -> Parameter:
    """A float32 parameter of samples of U(-bound, bound), from the CPU's generator."""
    uniform = get_backend("cpu").random_uniform(shape)  # U[0, 1), seeded by tt.manual_seed
    return Parameter((uniform * 2 - 1) * bound)


class Linear(Module):
    """Fully connected layer: ``y = x @ weight.T + bias`` for inputs of shape ``(..., in_features)``.

    ``weight`` is ``(out_features, in_features)`` (PyTorch's shape) and ``bias``
    ``(out_features,)``, both initialised from U(-1/sqrt(in_features), 1/sqrt(in_features))
    like PyTorch. The weight is stored column-major (Fortran order), so that
    ``x @ weight.T`` is a plain matrix product for BLAS; its gradient takes the
    same order. Raises ``ValueError`` for an input whose last axis is not ``in_features``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = check_int("in_features", in_features, minimum=1)
        self.out_features = check_int("out_features", out_features, minimum=1)
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform_parameter((out_features, in_features), bound)
        self.weight.data = np.asfortranarray(self.weight.data)  # column-major: x @ W.T is then a plain product for BLAS
        self.bias = _uniform_parameter((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)  # which checks x's width against the weight's

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# %% check=2
tt.manual_seed(0)
layer = Linear(400, 30)
assert layer.weight.shape == (30, 400) and layer.bias.shape == (30,)
assert isinstance(layer.weight, Parameter) and layer.weight.dtype == np.float32
w = layer.weight.numpy()
assert np.abs(w).max() <= 1 / 20 and np.abs(w).max() > 0.95 / 20, "weights must fill U(-1/sqrt(400), 1/sqrt(400))"
assert abs(w.std() - 1 / 20 / np.sqrt(3)) < 1e-3
assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
x = tt.randn(5, 400)
np.testing.assert_allclose(layer(x).numpy(), x.numpy() @ w.T + layer.bias.numpy(), rtol=1e-5, atol=1e-5)
assert layer(tt.randn(2, 3, 400)).shape == (2, 3, 30)
assert Linear(4, 2, bias=False).parameters()[0].shape == (2, 4) and len(Linear(4, 2, bias=False).parameters()) == 1
small = Linear(3, 2).to(dtype="float64")
assert tt.gradcheck(lambda x, w, b: linear(x, w, b), [tt.randn(4, 3, dtype="float64", requires_grad=True),
                                                     small.weight, small.bias])
try:
    layer(tt.randn(5, 300))
except ValueError as error:
    assert "400" in str(error) and "(5, 300)" in str(error), error
else:
    raise AssertionError("an input of the wrong width must raise ValueError")
print(layer, "OK")

# %% [markdown]
# Check the variance argument: push standard-normal inputs through one layer with
# $n = 1000$ inputs. The output variance should be about $n \cdot \frac{1}{3n} \cdot 1 = 1/3$
# (plus the bias's $1/(3n)$):

# %%
tt.manual_seed(0)
x = tt.randn(2000, 1000)
y = Linear(1000, 500)(x)
print(f"input variance {x.numpy().var():.3f}, output variance {y.numpy().var():.3f} (theory 0.334)")

# %% [markdown]
# ## 3. `Sequential` and `ModuleList`
#
# Most models are a chain: `Sequential(Linear(784, 256), ReLU(), Linear(256, 10))`
# feeds each module's output to the next. Its sub-modules are registered under the
# names `"0"`, `"1"`, … — hence parameter names like `2.weight`. `ModuleList` is
# the same container without a `forward`, for models that loop over their layers
# themselves; `Sequential` builds on it. Both support `len`, iteration and
# indexing (a slice gives a new container sharing the same modules).
#
# The activation modules are thin wrappers around the functions of Module 03, so
# that they can sit in a `Sequential`; `Flatten` turns `(N, C, H, W)` images into
# `(N, C*H*W)` rows for a `Linear`, keeping the batch axis. You write
# `ModuleList.append`; `Sequential`, the activations and `Flatten` are given.

# %% export="nn/layers"
class ModuleList(Module):
    """A list of sub-modules, registered under the names ``"0"``, ``"1"``, ...

    Indexing with an int gives the module, with a slice a new container of the
    same modules. It has no ``forward``: the owner loops over it.
    """

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(modules)

    def append(self, module: Module) -> "ModuleList":
        """Add ``module`` at the end; returns ``self``. Raises ``TypeError`` naming the
        type of anything that is not a ``Module``."""
        ### BEGIN SOLUTION
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} holds Modules, got {type(module).__name__}")
        setattr(self, str(len(self._modules)), module)
        return self
        ### END SOLUTION

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index: int | slice) -> Any:
        check_type("index", index, (int, np.integer, slice), "an int or a slice")
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return self._of(modules[index])
        if not -len(modules) <= index < len(modules):
            raise IndexError(f"index {index} is out of range for a {type(self).__name__} of {len(modules)} modules")
        return modules[index]

    @classmethod
    def _of(cls, modules: list[Module]) -> "ModuleList":
        return cls(modules)


class Sequential(ModuleList):
    """``Sequential(a, b, c)(x) == c(b(a(x)))``; indexable, iterable, ``len``."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    @classmethod
    def _of(cls, modules: list[Module]) -> "Sequential":
        return cls(*modules)

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.relu()  # relu(x) in one call fewer: this runs in every forward pass


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.sigmoid()


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()


class GELU(Module):
    """GELU with the tanh approximation (PyTorch's ``nn.GELU(approximate="tanh")``)."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        return softmax(x, axis=self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    def forward(self, x: Tensor) -> Tensor:
        return log_softmax(x, axis=self.axis)


class Flatten(Module):
    """``(N, d1, d2, ...) -> (N, d1 * d2 * ...)``: keeps the batch axis, flattens the rest.

    Works for an empty batch too (``N = 0``), where ``reshape(N, -1)`` cannot tell
    the size of the rest: compute it as the product of ``d1, d2, ...``. An input
    with fewer than two axes raises ``ValueError`` (as PyTorch's ``Flatten`` does):
    a single unbatched sample of shape ``(784,)`` would become 784 samples of one feature.
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise ValueError(f"Flatten needs a batch axis and at least one more, got shape {x.shape}; "
                             f"for one unbatched sample use x.reshape(1, -1)")
        return x.reshape(x.shape[0], math.prod(x.shape[1:]))


# %% check=2
tt.manual_seed(0)
mlp = Sequential(Flatten(), Linear(12, 8), ReLU(), Linear(8, 3), LogSoftmax())
assert len(mlp) == 5 and isinstance(mlp[1], Linear) and mlp[-1] is list(mlp)[-1]
assert [name for name, _ in mlp.named_parameters()] == ["1.weight", "1.bias", "3.weight", "3.bias"]
images = tt.randn(4, 3, 2, 2)
out = mlp(images)
assert out.shape == (4, 3)
np.testing.assert_allclose(np.exp(out.numpy()).sum(axis=1), 1.0, rtol=1e-5)
assert isinstance(mlp[1:3], Sequential) and len(mlp[1:3]) == 2 and mlp[1:3][0] is mlp[1]
stack = ModuleList([Linear(2, 2) for _ in range(3)])
stack.append(Tanh())
assert len(stack) == 4 and len(stack.parameters()) == 6
shared = Linear(3, 3)
assert len(Sequential(shared, ReLU(), shared).parameters()) == 2, "shared layers count once"
assert Flatten()(tt.zeros(0, 2, 5)).shape == (0, 10)
print(mlp)

# %% [markdown]
# ## 4. Systems: the size and speed of an MLP
#
# The MLP milestone trains a 784-256-128-10 network on images of 28×28 pixels.
# A `Linear(n_in, n_out)` holds $n_\text{in} n_\text{out} + n_\text{out}$ numbers:

# %%
tt.manual_seed(0)
mlp = Sequential(Linear(784, 256), ReLU(), Linear(256, 128), ReLU(), Linear(128, 10))
for name, parameter in mlp.named_parameters():
    print(f"{name:9s} {str(parameter.shape):11s} {parameter.size:9,d}")
count = mlp.num_parameters()
size = sum(p.data.nbytes for p in mlp.parameters())
print(f"total     {count:,} parameters, {size / 2**20:.2f} MiB in float32")

# %% [markdown]
# Training needs more than the weights: every parameter gets a gradient of the
# same size, Adam (Module 07) keeps two more arrays per parameter, and the
# forward pass saves activations for backward — for a batch of $B$ images,
# `LinearFunction` keeps each layer's input, $B \times (784 + 256 + 128)$ numbers;
# each ReLU keeps its output, which is the next layer's input, so nothing more.
# For this small MLP the weights dominate until the batch reaches a few hundred
# images:

# %%
batch = 64
weights_and_grads = 2 * size
adam_state = 2 * size
saved_activations = batch * (784 + 256 + 128) * 4  # the Linear inputs (the ReLU outputs among them)
print(f"weights + grads {weights_and_grads / 2**20:.2f} MiB, Adam state {adam_state / 2**20:.2f} MiB, "
      f"saved activations at batch {batch}: {saved_activations / 2**20:.2f} MiB")

# %% [markdown]
# Now time one training step's forward and backward pass. When PyTorch is
# installed, the same weights go into a `torch.nn.Sequential` — with no transposing,
# since the layouts agree — and we time the two alternately, keeping the best
# round of each, so that other programs on the machine disturb both alike.

# %%
def best_times(functions: dict, runs: int = 20, rounds: int = 5) -> dict:
    """Seconds per call of each function: the best of ``rounds`` interleaved rounds of ``runs`` calls."""
    best = dict.fromkeys(functions, float("inf"))
    for fn in functions.values():
        fn()  # warm up
    for _ in range(rounds):
        for name, fn in functions.items():
            start = time.perf_counter()
            for _ in range(runs):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / runs)
    return best


images = tt.randn(batch, 784)


def step() -> None:
    mlp.zero_grad()
    mlp(images).sum().backward()


steps = {"tinytrain": step}
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    reference = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                    torch.nn.ReLU(), torch.nn.Linear(128, 10))
    reference.load_state_dict({name: torch.from_numpy(p.numpy()) for name, p in mlp.named_parameters()})
    torch_images = torch.from_numpy(images.numpy())
    assert np.allclose(reference(torch_images).detach().numpy(), mlp(images).numpy(), atol=1e-5)

    def torch_step() -> None:
        reference.zero_grad()
        reference(torch_images).sum().backward()

    steps["PyTorch"] = torch_step
for name, seconds in best_times(steps).items():
    print(f"{name:9s} forward + backward, batch {batch}: {seconds * 1e3:.2f} ms")

# %% [markdown]
# Finally, the memory order of the weight (section 2). Time the three products
# of one `Linear(784, 256)` at batch 128 — forward $X W^\top$, input gradient
# $G W$, weight gradient $G^\top X$ — with the same `(out, in)` weight stored
# row-major and column-major, and the elementwise trap next to them:

# %%
rng = np.random.default_rng(0)
x_host = rng.standard_normal((128, 784), dtype=np.float32)
g_host = rng.standard_normal((128, 256), dtype=np.float32)
orders = {"row-major (C)": rng.standard_normal((256, 784), dtype=np.float32)}
orders["column-major (F)"] = np.asfortranarray(orders["row-major (C)"])
for name, w in orders.items():
    times = best_times({
        "forward X W^T": lambda: x_host @ w.T,
        "input grad G W": lambda: g_host @ w,
        "weight grad G^T X": lambda: np.matmul(g_host.T, x_host, out=np.empty_like(w)),
        "update w - 0.01 dW, dW C-ordered": lambda: w - 0.01 * orders["row-major (C)"],
    })
    print(f"{name:17s}" + "".join(f" | {product} {seconds * 1e6:4.0f} µs" for product, seconds in times.items()))

# %% [markdown]
# On our 2-core test machine, column-major storage made the forward product
# faster (444 → 375 µs) and the input gradient slower (358 → 429 µs), by about
# the same amount; the weight gradient did not care. A hidden layer computes all
# three, so for it the order is a wash; the first layer skips the input
# gradient, so there column-major saves the difference: about 3% of the whole
# MLP training step that `benchmarks/mlp_step.py` times. The last column is the
# trap: the update that mixes orders took 3x as long as the one that does not
# (389 vs 117 µs), and an in-place `w -= dW` 40x as long. Your numbers will
# differ with the CPU and BLAS; re-run the cell to see how much they move.

# %% [markdown]
# ## How PyTorch does it
#
# The names are PyTorch's: `torch.nn.Module` with `parameters()`,
# `named_parameters()`, `modules()`, `children()`, `train()`/`eval()`,
# `state_dict()`/`load_state_dict()`, `register_buffer`, `zero_grad()`, `to()`,
# `extra_repr()`; `nn.Parameter`, `nn.Linear` (weight `(out_features,
# in_features)`, the same initialisation), `nn.Sequential`, `nn.ModuleList`,
# `nn.Flatten`, and `F.linear`.
# The differences: PyTorch's `parameters()` returns an iterator (ours a list);
# its `state_dict()` returns references to the live tensors (ours copies, so a
# saved "best" state cannot change under you); `nn.Flatten` takes `start_dim` and
# `end_dim`; `nn.GELU` defaults to the exact erf form; PyTorch stores a `Linear`
# weight row-major where ours is column-major (same shape and values, so state
# dicts move between the two unchanged); and PyTorch runs hooks
# around `forward` in `__call__`.
#
# ## Summary
#
# * A `Module` registers the parameters, buffers and sub-modules assigned to its
#   attributes; everything else — `parameters()`, modes, `state_dict()`,
#   `to(device)` — is a walk over that tree. Shared layers count once.
# * `Linear` stores `(out, in)` weights, computes `x @ W.T + b` in one fused
#   operation and starts from $U(-1/\sqrt n, 1/\sqrt n)$: variance $1/(3n)$.
#   It keeps `W` column-major, so the first layer's forward is a plain product
#   for BLAS; the gradient and optimizer buffers follow the weight's order.
# * The 784-256-128-10 MLP has 235,146 parameters (0.9 MiB in float32).
