# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 07 — Optimizers
#
# *One sitting, about 1.5 hours: the lesson, 3 functions to write, and the measurements.*
#
# `backward()` tells every weight which way is downhill. An **optimizer** decides
# how far to go, and whether to remember where it went before. It is the smallest
# piece of a training library — a few lines of arithmetic per weight — and one of
# the most consequential: the same network trains in minutes or not at all
# depending on the update rule and its learning rate.
#
# **You will**
# 1. see why plain gradient descent crawls on an *ill-conditioned* loss surface;
# 2. write the three update rules every course and paper uses — SGD (with
#    momentum, Nesterov momentum and weight decay), Adam and AdamW — exactly as
#    PyTorch defines them, updating weights *in place*, in their own dtype;
# 3. work out why Adam needs *bias correction* and why AdamW's *decoupled* weight
#    decay is not the same as an L2 penalty;
# 4. give parameters their own hyperparameters with *parameter groups*, and
#    decay the weight matrices only, as GPT recipes do;
# 5. save and restore an optimizer's state so a resumed run continues
#    bit for bit;
# 6. measure the memory an optimizer's state takes and the time of one step for
#    a 235k-parameter model.

# %%
import math
import time

import matplotlib.pyplot as plt
import numpy as np

import tinytrain as tt
from tinytrain import Tensor

# %% [markdown]
# ## 1. Gradient descent on a bowl
#
# Gradient descent moves the parameters $\theta$ a small step against the gradient
# of the loss $L$, with a **learning rate** $\eta$:
#
# $$\theta_{t} = \theta_{t-1} - \eta\, \nabla L(\theta_{t-1}).$$
#
# To see what can go wrong, take the simplest loss with a minimum — a quadratic
# bowl — and stretch it:
#
# $$L(x, y) = \tfrac12 \left(x^2 + 25\, y^2\right), \qquad \nabla L = (x,\ 25\, y).$$
#
# One step multiplies $x$ by $(1 - \eta)$ and $y$ by $(1 - 25\eta)$. The steep
# direction $y$ only stays stable while $|1 - 25\eta| < 1$, that is $\eta < 2/25 =
# 0.08$; at $\eta = 0.07$ it flips sign every step ($1 - 1.75 = -0.75$) and the
# path zig-zags. The shallow direction $x$ then shrinks by only $1 - 0.07 = 0.93$
# per step: 60 steps leave $0.93^{60} \approx 1.3\%$ of the distance. The ratio
# of the largest to the smallest curvature, here $25$, is the **condition number**
# $\kappa$; plain gradient descent needs on the order of $\kappa$ steps, because
# the steepest direction caps the learning rate and the flattest one sets the pace.
# Real networks have condition numbers in the thousands.

# %%
CURVATURE = np.array([1.0, 25.0])
START = np.array([-4.0, 1.0])


def bowl(points: np.ndarray) -> np.ndarray:
    """The loss at each point of a (..., 2) array."""
    return 0.5 * (CURVATURE * points**2).sum(axis=-1)


def draw_bowl(ax: plt.Axes) -> None:
    xs, ys = np.meshgrid(np.linspace(-4.5, 1.5, 200), np.linspace(-1.6, 1.6, 200))
    ax.contour(xs, ys, bowl(np.stack([xs, ys], axis=-1)), levels=np.geomspace(0.01, 20, 12), colors="0.8")
    ax.plot(0, 0, "k*", markersize=10)
    ax.set_xlabel("x")
    ax.set_ylabel("y")


fig, ax = plt.subplots(figsize=(8, 4))
draw_bowl(ax)
for lr in (0.02, 0.07):
    theta, path = START.copy(), [START.copy()]
    for _ in range(60):
        theta = theta - lr * CURVATURE * theta  # the gradient of the bowl is CURVATURE * theta
        path.append(theta)
    path = np.array(path)
    ax.plot(path[:, 0], path[:, 1], ".-", label=f"lr={lr}: loss after 60 steps {bowl(theta):.4f}")
ax.set_title("Gradient descent on an ill-conditioned bowl (60 steps)")
ax.legend(loc="lower left", fontsize="small")
plt.show()

# %% [markdown]
# Two fixes recur in every optimizer since: **momentum** — keep a running sum of
# past gradients so the zig-zag cancels out and the steady drift along $x$ adds
# up — and **per-coordinate step sizes** — divide each coordinate's step by the
# typical size of its gradient, so the steep and the shallow direction move at
# similar speeds (Adam).
#
# ## 2. What an optimizer object does
#
# Every optimizer in this module shares one skeleton, the `Optimizer` class
# below, which is given. It
#
# * keeps the **parameters** in a list. It accepts any iterable of tensors —
#   a list, or the generator `model.parameters()` returns — and materialises it,
#   because a generator can be walked only once. Each parameter must require grad;
# * keeps the hyperparameters in **parameter groups**, as PyTorch does:
#   `optimizer.param_groups` is a list of dicts, each with its `"params"` and its
#   own values (`"lr"`, `"weight_decay"`, ...). A plain list of tensors makes one
#   group with the constructor's values; section 6 uses two groups to decay
#   only the weight matrices;
# * keeps one **state dict per parameter** (a momentum buffer, Adam's moment
#   estimates and step count), created by `init_state` the first time the
#   parameter gets a gradient. Its buffers come from `xp.zeros_like(param)`,
#   which copies the parameter's dtype, device *and memory order*: a `Linear`
#   weight is column-major (Module 04), and an update that mixed the two orders
#   in one in-place operation would run up to 40x slower;
# * in `step()`, skips every parameter whose `.grad` is `None` (a layer that took
#   no part in this loss: it does not move, and its state does not change), and
#   calls `update(param, grad, state, group, xp)` for the others — an all-zero
#   gradient too: it is still a step (momentum keeps moving the weight, Adam's
#   $t$ counts it and its moments decay). `param` and
#   `grad` are the raw backend arrays, `group` the parameter's group — read every
#   hyperparameter from it, `group["lr"]`, never from the optimizer — and `xp`
#   the arrays' namespace (NumPy on the CPU, CuPy on a GPU), so one `update`
#   serves every device;
# * in `zero_grad()`, sets every `.grad` back to `None`, since gradients add up
#   across `backward()` calls;
# * exposes the learning rate as the property `lr`, checked on every assignment,
#   because a learning-rate schedule (Module 09) changes it every epoch or step.
#   Assigning it sets every group's `"lr"`; a group that was given a rate of its
#   own keeps its ratio to the optimizer's (section 6);
# * turns its state into **plain data** with `state_dict()` — NumPy arrays copied
#   to the host, numbers, strings, lists, dicts — and back with
#   `load_state_dict()`, which copies each buffer onto its parameter's device and
#   dtype. Checkpoints (Module 10) are restricted pickles of plain data, so a
#   checkpoint can never smuggle in executable objects.
#
# An `update` **changes `param` in place** (`param -= ...`) rather than making a
# new array. That is not only cheaper: other objects hold the same array — the
# `Tensor` of a `Linear` layer, a second layer sharing the weight — and an update
# that built a new array would leave them holding stale values.
#
# Every hyperparameter is stored as a Python `float`. That is a dtype decision:
# under NumPy's promotion rules a Python number adapts to the array
# (`float32_array * 0.1` is float32), while a NumPy `float64` scalar does not —
# `float32_array * np.float64(0.1)` is a float64 array, twice the memory traffic
# of a float32 one, on every step.

# %% export="optim"
"""Optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW.

An optimizer holds a list of parameters (tensors that require grad) and, per
parameter, a dict of state (momentum buffers, moment estimates, step counts).
``step()`` updates every parameter that has a gradient, in place, with the array
namespace of the parameter's own device and in the parameter's dtype.
``state_dict()`` and ``load_state_dict()`` turn that state into plain data
(host NumPy arrays, numbers, strings, lists, dicts) and back.

The update rules are PyTorch's (``torch.optim.SGD``, ``Adam``, ``AdamW``, without
dampening, AMSGrad or ``maximize``), and so are parameter groups: ``params`` may
be a list of dicts, ``[{"params": [...], "weight_decay": 0.1}, ...]``, each group
with its own hyperparameters (the constructor's for those it does not set).
"""
import math
from typing import Any, Iterable

import numpy as np

from tinytrain.arguments import check_int, check_number, check_type
from tinytrain.backend import is_floating, memory_order
from tinytrain.tensor import Tensor


def _as_list(params: Any, where: str) -> list:
    """``params`` (any iterable but a single tensor or a dict) as a list."""
    if isinstance(params, Tensor):
        raise TypeError(f"{where} must be an iterable of tensors, got a single Tensor; pass [tensor]")
    if isinstance(params, dict):
        raise TypeError(f"{where} must be an iterable of tensors or a list of parameter groups (dicts), got a dict; "
                        "pass [group]")
    try:
        return list(params)
    except TypeError:
        raise TypeError(f"{where} must be an iterable of tensors, got {type(params).__name__}") from None


def _parameter_list(params: Iterable[Tensor], where: str = "params") -> list[Tensor]:
    """The parameters as a list, each checked: a leaf tensor that requires grad (``where`` names the list)."""
    params = _as_list(params, where)
    for i, param in enumerate(params):
        if not isinstance(param, Tensor):
            raise TypeError(f"{where}[{i}] is a {type(param).__name__}, not a Tensor")
        if not param.requires_grad:
            raise ValueError(
                f"{where}[{i}] (shape {param.shape}) does not require grad, so it can never be updated; "
                "leave frozen parameters out: [p for p in params if p.requires_grad]"
            )
        if not param.is_leaf:
            raise ValueError(f"{where}[{i}] (shape {param.shape}) is the result of an operation, not a leaf tensor")
    return params


def _parameter_groups(params: Any, defaults: dict[str, Any], check: Any) -> list[dict[str, Any]]:
    """The parameter groups of ``params`` (tensors: one group), each with every hyperparameter and its ``lr_scale``.

    A group's missing hyperparameters come from ``defaults``; ``check(**hyperparameters)``
    validates them. Every parameter is checked and may appear once in all the groups.
    """
    params = _as_list(params, "params")
    is_group = [isinstance(item, dict) for item in params]
    if any(is_group) and not all(is_group):
        raise TypeError("params mixes tensors and parameter groups (dicts); pass a list of tensors or a list of groups")
    grouped = bool(params) and all(is_group)
    specs = params if grouped else [{"params": params}]
    allowed = {"params", *defaults}
    groups, seen = [], {}
    for g, spec in enumerate(specs):
        name = f"params[{g}]['params']" if grouped else "params"
        if "params" not in spec or spec.keys() - allowed:
            raise ValueError(f"params[{g}] is a parameter group with keys {sorted(spec)}: it needs 'params' and may "
                             f"set {', '.join(sorted(defaults))}")
        members = _parameter_list(spec["params"], name)
        for i, param in enumerate(members):
            first = seen.setdefault(id(param), f"{name}[{i}]")
            if first != f"{name}[{i}]":
                raise ValueError(f"{name}[{i}] (shape {param.shape}) appears more than once in the parameters "
                                 f"(also as {first}); a parameter belongs to one group")
        try:
            settings = check(**{**defaults, **{key: value for key, value in spec.items() if key != "params"}})
        except (TypeError, ValueError) as error:
            raise type(error)(f"params[{g}] (a parameter group): {error}") from None
        # a group's rate follows the optimizer's (Optimizer.lr) at its own ratio: 1 unless it set its own lr
        groups.append({"params": members, **settings, "lr_scale": settings["lr"] / defaults["lr"]})
    if not any(group["params"] for group in groups):
        raise ValueError("the optimizer got an empty parameter list")
    return groups


def _plain(value: Any) -> Any:
    """A hyperparameter as plain data for a state dict (a tuple becomes a list)."""
    return list(value) if isinstance(value, tuple) else value


def weight_decay_groups(params: Iterable[Tensor], weight_decay: float) -> list[dict[str, Any]]:
    """``params`` as two parameter groups: the matrices decay, the rest does not.

    ``[{"params": matrices, "weight_decay": weight_decay}, {"params": the others, "weight_decay": 0.0}]``,
    where the matrices are the parameters with ``ndim >= 2`` (the weights of
    Linear and Conv2d layers, embedding tables) and the others the vectors
    (biases, the gains and shifts of normalisation layers), as nanoGPT splits
    them. Pass the result as an optimizer's ``params``: ``AdamW(weight_decay_groups(
    model.parameters(), 0.1), lr=1e-3)``. Either group may be empty.
    """
    weight_decay = check_number("weight_decay", weight_decay, minimum=0)
    params = _parameter_list(params)
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


class Optimizer:
    """Base class: holds the parameters in groups, and their state, and steps them.

    ``params`` is an iterable of tensors (one group) or a list of parameter groups,
    ``{"params": [...], "lr": ..., ...}``; ``defaults`` are the constructor's
    hyperparameters, which fill in what a group does not set. ``param_groups``
    holds the groups (each with every hyperparameter, and ``lr_scale``: see
    ``lr``), ``params`` all parameters in group order, ``state`` one dict per
    parameter. A subclass sets ``hyperparameters`` (the names that ``state_dict``
    saves), validates them in ``_check_hyperparameters``, creates a parameter's
    state in ``init_state``, declares its keys in ``state_layout`` and implements
    the update rule in ``update``.
    """

    hyperparameters: tuple[str, ...] = ("lr",)
    # Every key that a parameter's state may hold, and what its value is: "count" (an int >= 0),
    # "array" (of the parameter's shape) or "array >= 0" (also every number >= 0). load_state_dict
    # refuses other keys and values; the keys that init_state creates must all be there.
    state_layout: dict[str, str] = {}

    def __init__(self, params: Iterable[Any], **defaults: Any) -> None:
        self.defaults = self._check_hyperparameters(**defaults)
        self.param_groups = _parameter_groups(params, self.defaults, self._check_hyperparameters)
        self.params = [param for group in self.param_groups for param in group["params"]]
        self._groups = [group for group in self.param_groups for _ in group["params"]]  # each parameter's group
        self._lr = self.defaults["lr"]
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        self._state_backends: list[Any] = [None] * len(self.params)  # where each state's arrays live
        self._scratch: dict[Any, Any] = {}  # (xp, dtype, device) -> flat buffer: see scratch_like
        self._scratch_views: dict[Any, Any] = {}  # (xp, dtype, device, *shape) -> view of that buffer

    def __repr__(self) -> str:
        settings = ", ".join(f"{name}={value!r}" for name, value in {**self.defaults, "lr": self.lr}.items())
        groups = f" in {len(self.param_groups)} groups" if len(self.param_groups) > 1 else ""
        return f"{type(self).__name__}({len(self.params)} parameters{groups}, {settings})"

    @property
    def lr(self) -> float:
        """The optimizer's learning rate: that of every group that did not set its own.

        Assigning sets every group's rate to ``value * group["lr_scale"]``: a group
        created with its own ``lr`` keeps its ratio to the optimizer's (as PyTorch's
        schedulers scale each group's initial rate), every other group gets ``value``.
        """
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        value = check_number("lr", value, above=0)  # a Python float: it never promotes float32 math to float64
        for group in self.param_groups:
            group["lr"] = value * group["lr_scale"]
        self._lr = value

    def _check_hyperparameters(self, lr: float) -> dict[str, Any]:
        """The hyperparameters validated and normalised (Python floats, tuples), or an error naming the value;
        a subclass with more hyperparameters than ``lr`` overrides it."""
        return {"lr": check_number("lr", lr, above=0)}

    def init_state(self, param: Any, group: dict[str, Any], xp: Any) -> dict[str, Any]:
        """The state of a parameter of ``group`` before its first update (``param`` is its array)."""
        return {}

    def update(self, param: Any, grad: Any, state: dict[str, Any], group: dict[str, Any], xp: Any) -> None:
        """Apply one step of the rule, with ``group``'s hyperparameters, to the array ``param`` in place."""
        raise NotImplementedError

    def scratch_like(self, param: Any, xp: Any) -> Any:
        """An uninitialised array of ``param``'s shape, dtype and memory order, for intermediate results of one update.

        All updates share one flat buffer per device and dtype, as large as the
        largest parameter, kept from step to step. A new temporary the size of a
        weight matrix in every update can cost more than its arithmetic: the C
        heap may hand such blocks back to the operating system when they are
        freed, and the next step faults the memory in again, page by page.
        """
        key = (xp, param.dtype, getattr(param, "device", None))
        order = memory_order(param)  # an in-place update mixing orders is up to 40x slower
        view = self._scratch_views.get(key + (order,) + param.shape)  # a step asks for the same few again
        if view is None:
            buffer = self._scratch.get(key)
            if buffer is None or buffer.size < param.size:
                buffer = self._scratch[key] = xp.empty_like(param, order="C").reshape(-1)
                self._scratch_views = {k: v for k, v in self._scratch_views.items() if k[:3] != key}  # old buffer
            view = buffer[: param.size].reshape(param.shape, order=order)
            self._scratch_views[key + (order,) + param.shape] = view
        return view

    def step(self) -> None:
        """Update every parameter that has a gradient; skip (and keep the state of) the others.

        State follows its parameter: after ``model.to(device)`` the next step
        moves each state's arrays to the parameter's new device first. Every
        gradient is checked before anything changes (a ``Tensor`` of its
        parameter's shape, floating point, on its device: ``TypeError``,
        ``ValueError`` or ``RuntimeError`` naming the parameter's index), so a step
        that raises updates no parameter and no state (no step count goes up).
        """
        stepping = [(index, param) for index, param in enumerate(self.params) if param.grad is not None]
        for index, param in stepping:
            self._check_grad(index, param)
        for index, param in stepping:
            backend = param._backend
            if self._state_backends[index] is not backend:  # the first step, or the parameter has moved since
                self._settle_state(index, backend)
            self.update(param.data, param.grad.data, self.state[index], self._groups[index], backend.xp)

    @staticmethod
    def _check_grad(index: int, param: Tensor) -> None:
        """Raise naming parameter ``index`` unless its ``.grad`` is a floating-point ``Tensor`` of its shape
        on its device (what ``update`` takes for granted)."""
        grad = param.grad
        if not isinstance(grad, Tensor):
            raise TypeError(f"the gradient of parameter {index} must be a Tensor, got {type(grad).__name__}")
        if grad.shape != param.shape:
            raise ValueError(f"parameter {index} has shape {param.shape} and a gradient of shape {grad.shape}")
        if not is_floating(grad.dtype):
            raise TypeError(f"the gradient of parameter {index} has dtype {grad.dtype}, expected floating point "
                            f"(the parameter's is {param.dtype})")
        if grad._backend is not param._backend:
            raise RuntimeError(f"parameter {index} is on {param.device}, its gradient on {grad.device}; "
                               "move the gradient with .to(device)")

    def _settle_state(self, index: int, backend: Any) -> None:
        """Create parameter ``index``'s state, or copy its arrays (through the host) to ``backend``."""
        state, home = self.state[index], self._state_backends[index]
        if not state:
            state.update(self.init_state(self.params[index].data, self._groups[index], backend.xp))
        for key, value in state.items():
            if home is not None and home.is_array(value):
                state[key] = backend.from_host(home.to_host(value))
        self._state_backends[index] = backend

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (``.grad = None``)."""
        for param in self.params:
            param.grad = None

    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        """The learning rate, the parameter groups and the per-parameter state as plain data (arrays copied to the host).

        ``{"optimizer": "Adam", "lr": ..., "param_groups": [{"params": [0, 1], "lr": ...,
        "betas": [...], ..., "lr_scale": 1.0}, ...], "state": [{"step": 3, "exp_avg":
        ndarray, ...}, ...]}``: each group lists its parameters by their position in
        ``params``; one state dict per parameter in order (empty for a parameter
        that has not been updated yet). ``copy=False`` skips the copy of arrays
        already on the host, so they are the optimizer's own buffers: for writing
        straight to a file (a checkpoint).
        """
        groups, start = [], 0
        for group in self.param_groups:
            count = len(group["params"])
            groups.append({"params": list(range(start, start + count)),
                           **{name: _plain(group[name]) for name in (*self.hyperparameters, "lr_scale")}})
            start += count
        states = []
        for param, state in zip(self.params, self.state):
            backend = param._backend
            states.append(
                {
                    key: np.array(backend.to_host(value), copy=copy or None) if backend.is_array(value) else value
                    for key, value in state.items()
                }
            )
        return {"optimizer": type(self).__name__, "lr": self.lr, "param_groups": groups, "state": states}

    def load_state_dict(self, state_dict: dict[str, Any], copy: bool = True) -> None:
        """Restore what ``state_dict()`` returned: copies, on each parameter's device and dtype.

        ``copy=False`` keeps host arrays that already have the parameter's dtype
        (and can be written) instead of copying them: for a state dict that no
        one else holds, such as one just read from a checkpoint file.
        Raises ``ValueError`` (changing nothing) for the state of another optimizer
        type, another number of parameters, other parameter groups or invalid
        hyperparameters; and ``TypeError`` or ``ValueError`` naming the parameter's
        index, the key and the value for per-parameter state that does not fit
        ``state_layout`` (see ``_loaded_state``). A state dict saved before
        tinytrain had parameter groups (one ``"hyperparameters"`` dict) loads as one group.
        """
        if not isinstance(state_dict, dict) or not {"optimizer", "state"} <= state_dict.keys() or not (
                {"lr", "param_groups"} <= state_dict.keys() or "hyperparameters" in state_dict):
            raise ValueError("not an optimizer state dict: expected a dict with keys "
                             "'optimizer', 'lr', 'param_groups' and 'state'")
        kind, states = state_dict["optimizer"], state_dict["state"]
        if kind != type(self).__name__:
            raise ValueError(f"cannot load the state of a {kind} optimizer into a {type(self).__name__}")
        if not isinstance(states, list) or len(states) != len(self.params):
            count = len(states) if isinstance(states, list) else type(states).__name__
            raise ValueError(f"the state dict holds state for {count} parameters, this optimizer has {len(self.params)}")
        lr, groups = self._saved_groups(state_dict)
        settings_of = [settings for group, settings in zip(self.param_groups, groups) for _ in group["params"]]
        restored = [self._loaded_state(i, saved, settings, copy)
                    for i, (saved, settings) in enumerate(zip(states, settings_of))]
        for group, settings in zip(self.param_groups, groups):
            group.update(settings)
        self._lr = lr
        self.state = restored
        self._state_backends = [param._backend if state else None for param, state in zip(self.params, restored)]

    def _loaded_state(self, index: int, saved: Any, group: dict[str, Any], copy: bool) -> dict[str, Any]:
        """Parameter ``index``'s saved state, checked against ``state_layout``, with its arrays on the
        parameter's device in its dtype and memory order (copies unless ``copy=False`` allows otherwise).

        An empty state loads as it is (a parameter not updated yet). Otherwise it must hold
        every key that ``init_state`` creates for ``group`` (the loaded hyperparameters;
        called on an empty array, to learn the keys only) and no key outside ``state_layout``
        (``ValueError``); a count must be an int >= 0, an array a NumPy array of real numbers
        (not bool or complex) of the parameter's shape, every number >= 0 where the layout
        says so (``TypeError`` or ``ValueError`` naming ``state[index][key]`` and the value).
        """
        param = self.params[index]
        if not isinstance(saved, dict):
            raise ValueError(f"the state of parameter {index} is a {type(saved).__name__}, not a dict")
        if not saved:
            return {}
        layout = self.state_layout
        kept = ", ".join(layout) or "no state"
        for key in saved:
            if key not in layout:
                raise ValueError(f"the state of parameter {index} has an unknown key {key!r}: a "
                                 f"{type(self).__name__} keeps {kept}")
        for key in self.init_state(np.zeros(0, dtype=param.dtype), group, np):
            if key not in saved:
                raise ValueError(f"the state of parameter {index} lacks {key!r}: a {type(self).__name__} keeps "
                                 f"{kept}, the state holds {', '.join(map(repr, saved))}")
        state = {}
        for key, value in saved.items():
            name = f"state[{index}][{key!r}]"
            if layout[key] == "count":
                state[key] = check_int(name, value, minimum=0)
                continue
            check_type(name, value, np.ndarray, "a NumPy array of the parameter's shape")
            if value.dtype.kind not in "iu" and not is_floating(value.dtype):
                raise TypeError(f"{name} holds {value.dtype} values, expected real numbers for a {param.dtype} "
                                f"parameter")
            if value.shape != param.shape:
                raise ValueError(f"{name} has shape {value.shape}, the parameter has shape {param.shape}")
            if layout[key] == "array >= 0" and not (value >= 0).all():
                where = tuple(int(i) for i in np.unravel_index(np.argmin(value >= 0), value.shape))
                raise ValueError(f"{name} must hold numbers >= 0, got {value[where]} at index {where}")
            order = memory_order(param.data)  # the buffers are updated in place, together with it
            if copy or value.dtype != param.dtype or not value.flags.writeable or memory_order(value) != order:
                value = np.array(value, dtype=param.dtype, order=order, copy=True)
            state[key] = param._backend.from_host(value)
        return state

    def _saved_groups(self, state_dict: dict[str, Any]) -> tuple[float, list[dict[str, Any]]]:
        """The checked learning rate and groups' hyperparameters of a state dict, or ``ValueError``."""
        if "param_groups" in state_dict:
            lr, saved = state_dict["lr"], state_dict["param_groups"]
        else:  # saved before parameter groups: one group of every parameter
            hyperparameters = state_dict["hyperparameters"]
            if not isinstance(hyperparameters, dict):
                raise ValueError(f"the state dict's hyperparameters must be a dict, got {hyperparameters!r}")
            lr = hyperparameters.get("lr")
            saved = [{"params": list(range(len(self.params))), **hyperparameters, "lr_scale": 1.0}]
        if not isinstance(saved, list) or len(saved) != len(self.param_groups):
            count = len(saved) if isinstance(saved, list) else type(saved).__name__
            raise ValueError(f"the state dict holds {count} parameter groups, this optimizer has {len(self.param_groups)}")
        keys = {"params", "lr_scale", *self.hyperparameters}
        groups, start = [], 0
        for g, (group, mine) in enumerate(zip(saved, self.param_groups)):
            if not isinstance(group, dict) or group.keys() != keys:
                shown = sorted(group) if isinstance(group, dict) else repr(group)
                raise ValueError(f"parameter group {g} of the state dict has keys {shown}, a {type(self).__name__} "
                                 f"group has {sorted(keys)}")
            members = list(range(start, start + len(mine["params"])))
            if group["params"] != members:
                raise ValueError(f"parameter group {g} of the state dict holds parameters {group['params']}, "
                                 f"this optimizer's holds {members}")
            settings = self._check_hyperparameters(**{name: group[name] for name in self.hyperparameters})
            settings["lr_scale"] = check_number("lr_scale", group["lr_scale"], above=0)
            groups.append(settings)
            start += len(members)
        return check_number("lr", lr, above=0), groups


# %% [markdown]
# The skeleton refuses what can only be a mistake, and says which value it was:

# %%
for bad in ([], [tt.zeros(3)]):
    try:
        Optimizer(bad, lr=0.1)
    except ValueError as error:
        print("ValueError:", error)

# %% [markdown]
# ## 3. SGD: momentum, Nesterov, weight decay
#
# PyTorch's `torch.optim.SGD` — and ours — computes, for a parameter $\theta$ with
# gradient $g_t$, learning rate $\eta$, momentum $\mu$ and weight decay $\lambda$:
#
# $$
# \begin{aligned}
# g_t &\leftarrow g_t + \lambda\, \theta_{t-1} && \text{(weight decay, if } \lambda > 0)\\
# b_t &= \mu\, b_{t-1} + g_t, \quad b_1 = g_1 && \text{(momentum buffer, if } \mu > 0)\\
# d_t &= \begin{cases} g_t + \mu\, b_t & \text{Nesterov}\\ b_t & \text{otherwise}\end{cases}\\
# \theta_t &= \theta_{t-1} - \eta\, d_t \qquad (d_t = g_t \text{ without momentum})
# \end{aligned}
# $$
#
# * **Momentum** (Polyak's heavy ball) lets the buffer $b$ accumulate the
#   gradients: a direction that keeps the same sign grows to up to
#   $1/(1-\mu)$ times the gradient (10x for $\mu = 0.9$), one that flips sign
#   every step cancels out.
# * **Nesterov** momentum steps along the gradient plus the buffer that is
#   about to be applied — a look-ahead that damps overshooting
#   (Sutskever et al., 2013, give this form).
# * **Weight decay** adds $\lambda\theta$ to the gradient: the gradient of an
#   L2 penalty $\tfrac{\lambda}{2}\lVert\theta\rVert^2$, pulling weights to 0.
#
# Note that PyTorch's momentum buffer is a plain sum, not an average: the
# learning rate multiplies it afterwards. Starting the buffer at zero gives
# $b_1 = \mu \cdot 0 + g_1 = g_1$ exactly, so a zero-filled buffer is all the
# first step needs.
#
# **Worked example.** Minimise $L = \theta^2/2$ (so $g = \theta$) from
# $\theta_0 = 1$ with $\eta = 0.1$, $\mu = 0.9$:
#
# | step | $g$ | $b$ | $\theta$ |
# |---|---|---|---|
# | 1 | 1 | 1 | $1 - 0.1 \cdot 1 = 0.9$ |
# | 2 | 0.9 | $0.9 \cdot 1 + 0.9 = 1.8$ | $0.9 - 0.18 = 0.72$ |
# | 3 | 0.72 | $0.9 \cdot 1.8 + 0.72 = 2.34$ | $0.72 - 0.234 = 0.486$ |
#
# With Nesterov the first step is $\theta_1 = 1 - 0.1\,(1 + 0.9 \cdot 1) = 0.81$.
#
# Write `update`. Read the hyperparameters from `group` (`group["lr"]`,
# `group["momentum"]`, `group["nesterov"]`, `group["weight_decay"]`). Change
# `param` and the buffer **in place** (`buf *= mu`, `param -= ...`); never change
# `grad` — it belongs to the parameter, and whoever called `step()` may still
# read it.
#
# `param -= lr * d` builds `lr * d`, a temporary as large as the parameter, on
# every step, exactly as hand-written NumPy does. That is cheaper than it looks:
# the C heap hands the block freed one step earlier straight back, still in the
# cache. (A buffer kept for the purpose was no faster in our MLP measurements:
# it is one more array competing for the cache.)

# %% export="optim"
class SGD(Optimizer):
    """Stochastic gradient descent, optionally with (Nesterov) momentum and weight decay.

    ``SGD(params, lr, momentum=0.0, nesterov=False, weight_decay=0.0)``. With
    momentum, each parameter's state holds ``momentum_buffer`` (one array of its
    shape); without, SGD keeps no state. Raises ``ValueError`` for ``lr <= 0``,
    ``momentum < 0``, ``weight_decay < 0`` or ``nesterov`` without momentum.
    """

    hyperparameters = ("lr", "momentum", "nesterov", "weight_decay")
    state_layout = {"momentum_buffer": "array"}

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)

    def _check_hyperparameters(self, lr: float, momentum: float, nesterov: bool, weight_decay: float) -> dict[str, Any]:
        lr = check_number("lr", lr, above=0)
        momentum = check_number("momentum", momentum, minimum=0)
        weight_decay = check_number("weight_decay", weight_decay, minimum=0)
        check_type("nesterov", nesterov, (bool, np.bool_), "True or False")
        if nesterov and momentum == 0:
            raise ValueError(f"nesterov=True needs momentum > 0, got momentum={momentum!r}")
        return {"lr": lr, "momentum": momentum, "nesterov": bool(nesterov), "weight_decay": weight_decay}

    def init_state(self, param: Any, group: dict[str, Any], xp: Any) -> dict[str, Any]:
        """A zero momentum buffer (so the first step gives ``b = g``), or nothing without momentum."""
        return {"momentum_buffer": xp.zeros_like(param)} if group["momentum"] else {}

    def update(self, param: Any, grad: Any, state: dict[str, Any], group: dict[str, Any], xp: Any) -> None:
        """One SGD step on the array ``param``, in place (``grad`` is left untouched).

        With ``group``'s ``lr``, ``momentum``, ``nesterov`` and ``weight_decay``:
        ``g = grad + weight_decay * param`` (a new array); with momentum
        ``b = momentum * b + g`` (in place on ``state["momentum_buffer"]``) and ``d = g + momentum * b``
        (Nesterov) or ``d = b``; without, ``d = g``. Then ``param -= lr * d``.
        Keeps no state but the momentum buffer (section 9 counts every array in ``state``).
        """
        ### BEGIN SOLUTION
        lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
        if weight_decay:
            decayed = param * weight_decay  # a new array: the caller's grad stays as it was
            decayed += grad
            grad = decayed
        direction = grad
        if momentum:
            buffer = state["momentum_buffer"]
            buffer *= momentum
            buffer += grad
            if group["nesterov"]:
                direction = buffer * momentum
                direction += grad
            else:
                direction = buffer
        param -= direction * lr
        ### END SOLUTION


# %% [markdown]
# Check it on the worked example, with autograd computing the gradients:

# %% check=1
def descend(optimizer_class, steps, start=1.0, **settings):
    """Minimise theta**2 / 2 with an optimizer; the value of theta after each step."""
    theta = tt.tensor([start], requires_grad=True)
    optimizer = optimizer_class([theta], **settings)
    values = []
    for _ in range(steps):
        optimizer.zero_grad()
        (theta * theta * 0.5).sum().backward()
        optimizer.step()
        values.append(theta.numpy()[0])
    return values


assert np.allclose(descend(SGD, 3, lr=0.1), [0.9, 0.81, 0.729])
assert np.allclose(descend(SGD, 3, lr=0.1, momentum=0.9), [0.9, 0.72, 0.486]), descend(SGD, 3, lr=0.1, momentum=0.9)
assert np.allclose(descend(SGD, 1, lr=0.1, momentum=0.9, nesterov=True), [0.81])
assert np.allclose(descend(SGD, 2, lr=0.1, weight_decay=0.5), [0.85, 0.7225])  # g = theta + 0.5 theta
theta = tt.tensor([1.0, -2.0], requires_grad=True)
array, gradient = theta.data, np.array([0.5, 0.5], dtype=np.float32)
theta.grad = tt.tensor(gradient)
optimizer = SGD([theta], lr=0.1, momentum=0.9, weight_decay=0.1)
optimizer.step()
buffer = optimizer.state[0]["momentum_buffer"]
optimizer.step()
assert theta.data is array, "update param in place: other objects hold the same array"
assert optimizer.state[0]["momentum_buffer"] is buffer, "update the momentum buffer in place"
assert np.array_equal(theta.grad.numpy(), gradient), "step() must not change the gradient"
assert theta.dtype == np.float32 and buffer.dtype == np.float32
print("SGD OK")

# %% [markdown]
# ## 4. Adam
#
# Adam (Kingma & Ba, *Adam: A Method for Stochastic Optimization*, ICLR 2015)
# keeps two running averages per weight: of the gradient, $m$ (momentum), and of
# the squared gradient, $v$ (the typical gradient size). It steps along
# $m / \sqrt{v}$ — roughly the gradient's *sign* with a confidence factor, so every
# coordinate moves at about the same speed $\eta$ whatever the scale of its
# gradient. On our bowl, $x$ and $y$ get comparable steps although their gradients
# differ 25-fold.
#
# $$
# \begin{aligned}
# g_t &\leftarrow g_t + \lambda\, \theta_{t-1} && \text{(L2 weight decay, if } \lambda > 0)\\
# m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t, \quad m_0 = 0\\
# v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2, \quad v_0 = 0\\
# \hat m_t &= m_t / (1 - \beta_1^t), \qquad \hat v_t = v_t / (1 - \beta_2^t)\\
# \theta_t &= \theta_{t-1} - \eta\, \hat m_t / \left(\sqrt{\hat v_t} + \epsilon\right)
# \end{aligned}
# $$
#
# with $\beta_1 = 0.9$, $\beta_2 = 0.999$, $\epsilon = 10^{-8}$ by default. The
# step count $t$ is kept **per parameter** (a parameter that got no gradient
# did not take a step).
#
# ### Why bias correction?
#
# Both averages start at zero, so early on they are averages of the few
# gradients seen so far *and of zeros*. After step 1, $m_1 = 0.1\, g_1$ and
# $v_1 = 0.001\, g_1^2$ — ten and a thousand times too small. Uncorrected, the
# first step would be $\eta \cdot 0.1 g_1 / \sqrt{0.001 g_1^2} = 3.16\, \eta$ in the
# direction of $g_1$: three times the learning rate, at exactly the moment the
# estimates are least reliable. Dividing by $1 - \beta^t$ — the total weight the
# average has given to real gradients so far — undoes that: $\hat m_1 = g_1$,
# $\hat v_1 = g_1^2$, and the first step is $\eta\, g_1/(|g_1| + \epsilon)
# \approx \eta$, whatever the size of $g_1$. The table computes the step size of
# the first steps on a constant gradient with and without the correction (the
# corrected one is exactly $\eta$ for a constant gradient):

# %%
beta1, beta2 = 0.9, 0.999
m = v = 0.0
print(" step   m_t       v_t        uncorrected step/lr   corrected step/lr")
for t in range(1, 10_001):
    m = beta1 * m + (1 - beta1) * 1.0
    v = beta2 * v + (1 - beta2) * 1.0
    if t in (1, 2, 3, 10, 100, 1000, 10_000):
        corrected = (m / (1 - beta1**t)) / math.sqrt(v / (1 - beta2**t))
        print(f"{t:5d}   {m:.4f}   {v:.6f}   {m / math.sqrt(v):19.3f}   {corrected:17.3f}")

# %% [markdown]
# Uncorrected, the step grows to $6.5\,\eta$ around step 10 and is still three
# times too large at step 100: $m$ forgets its zero start within tens of steps,
# $v$ (with $\beta_2 = 0.999$) only after thousands.
#
# **Worked example.** $L = \theta^2/2$ from $\theta_0 = 1$ with $\eta = 0.1$:
# step 1 has $g = 1$, $\hat m = \hat v = 1$, so $\theta_1 = 1 - 0.1 \cdot 1 /
# (1 + 10^{-8}) \approx 0.9$. Step 2 has $g = 0.9$, $m = 0.09 + 0.09 = 0.18$,
# $v = 0.000999 + 0.00081 = 0.001809$, $\hat m = 0.18/0.19 = 0.94737$,
# $\hat v = 0.001809/0.001999 = 0.90495$, so $\theta_2 = 0.9 - 0.1 \cdot
# 0.94737/0.95129 = 0.80041$.
#
# ### Writing it without temporaries
#
# Written as in the formulas, one Adam step allocates about six arrays the size
# of the parameter (`(1 - beta1) * grad`, `grad * grad`, `v / bias2`, its square
# root, ...) and reads and writes memory for each. The update is memory-bound —
# a few flops per number loaded — so those passes *are* its cost. The state
# buffers can be updated in place (`m *= beta1; m += ...`), and the remaining
# intermediate results can share **one** scratch array — the given
# `self.scratch_like(param, xp)`, one buffer that all updates share and that lives
# as long as the optimizer — filled with the `out=` argument of the array functions
# (`xp.multiply(grad, grad, out=scratch)`, `xp.sqrt(v, out=scratch)`). The bias
# corrections are Python numbers: fold them into scalars ($\eta / (1 - \beta_1^t)$ and $\sqrt{1 - \beta_2^t}$) instead of
# dividing whole arrays. Keep $\epsilon$ where the formula has it: it is added to
# $\sqrt{v}/\sqrt{1 - \beta_2^t}$, after the correction. (The Adam paper's
# shortcut that moves $\sqrt{1 - \beta_2^t}$ into the step size adds $\epsilon$
# before it: a different, "$\hat\epsilon$" rule, and not PyTorch's numbers.)
#
# `Adam.update` (given) adds the L2 term and calls `adam_update`, which you
# write: the step from "$m_t = \dots$" on, for a gradient that already includes
# any weight decay. `state` holds `step` (an int), `exp_avg` ($m$) and
# `exp_avg_sq` ($v$) — PyTorch's names; `group` holds `"lr"`, `"betas"` and `"eps"`.

# %% export="optim"
class Adam(Optimizer):
    """Adam with L2 weight decay (added to the gradient) and bias correction.

    ``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)``.
    Each parameter's state holds ``step`` (an int) and ``exp_avg`` / ``exp_avg_sq``
    (arrays of its shape: twice the parameters' memory). Raises ``ValueError`` for
    ``lr <= 0``, betas outside ``[0, 1)``, ``eps <= 0`` or ``weight_decay < 0``.
    """

    hyperparameters = ("lr", "betas", "eps", "weight_decay")
    state_layout = {"step": "count", "exp_avg": "array", "exp_avg_sq": "array >= 0"}

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def _check_hyperparameters(self, lr: float, betas: tuple[float, float], eps: float,
                               weight_decay: float) -> dict[str, Any]:
        lr = check_number("lr", lr, above=0)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got betas={betas!r}")
        betas = tuple(check_number(f"betas[{i}]", beta, minimum=0, below=1) for i, beta in enumerate(betas))
        eps = check_number("eps", eps, above=0)
        weight_decay = check_number("weight_decay", weight_decay, minimum=0)
        return {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}

    def init_state(self, param: Any, group: dict[str, Any], xp: Any) -> dict[str, Any]:
        return {"step": 0, "exp_avg": xp.zeros_like(param), "exp_avg_sq": xp.zeros_like(param)}

    def update(self, param: Any, grad: Any, state: dict[str, Any], group: dict[str, Any], xp: Any) -> None:
        """L2 weight decay joins the gradient, then the Adam step."""
        if group["weight_decay"]:
            decayed = param * group["weight_decay"]  # a new array: the caller's grad stays as it was
            decayed += grad
            grad = decayed
        self.adam_update(param, grad, state, group, xp)

    def adam_update(self, param: Any, grad: Any, state: dict[str, Any], group: dict[str, Any], xp: Any) -> None:
        """One Adam step on the array ``param``, in place, for ``grad`` (decay already included).

        With ``group``'s ``lr``, ``betas = (b1, b2)`` and ``eps``:
        increments ``state["step"]`` to ``t``; updates ``m = state["exp_avg"]`` and
        ``v = state["exp_avg_sq"]`` in place (``m = b1 m + (1 - b1) g``,
        ``v = b2 v + (1 - b2) g^2``); then
        ``param -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``.
        Keeps no state but these three entries. Computes in the parameter's dtype
        (float64 stays float64) and reads nothing from the device: the bias
        corrections are Python numbers (``**`` and ``math.sqrt``, not ``xp.power``,
        nor ``np.sqrt``, whose NumPy float64 makes float32 arithmetic run in float64:
        a new array comes out float64, and even ``x /= np.sqrt(c)`` runs a float64 loop).
        """
        ### BEGIN SOLUTION
        beta1, beta2 = group["betas"]
        state["step"] += 1
        step = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        scratch = self.scratch_like(param, xp)  # the one temporary array of this update
        xp.multiply(grad, 1 - beta1, out=scratch)
        m *= beta1
        m += scratch
        xp.multiply(grad, grad, out=scratch)
        scratch *= 1 - beta2
        v *= beta2
        v += scratch
        xp.sqrt(v, out=scratch)
        scratch /= math.sqrt(1 - beta2**step)
        scratch += group["eps"]  # sqrt(v_hat) + eps
        xp.divide(m, scratch, out=scratch)
        scratch *= group["lr"] / (1 - beta1**step)
        param -= scratch
        ### END SOLUTION


# %% check=1
values = descend(Adam, 2, lr=0.1)
assert np.allclose(values, [0.9, 0.80041], atol=1e-5), values
theta = tt.tensor([1.0, -2.0, 3.0], requires_grad=True)
array = theta.data
theta.grad = tt.tensor([1e-4, -10.0, 1e3])  # wildly different gradient scales
optimizer = Adam([theta], lr=0.01)
optimizer.step()
assert np.allclose(theta.numpy(), [0.99, -1.99, 2.99], atol=1e-6), "Adam's first step is lr * sign(g)"
state = optimizer.state[0]
assert state["step"] == 1 and theta.data is array
assert np.allclose(state["exp_avg"], [1e-5, -1.0, 100.0]) and np.allclose(state["exp_avg_sq"], [1e-11, 0.1, 1e3])
exp_avg = state["exp_avg"]
optimizer.step()
assert state["step"] == 2 and state["exp_avg"] is exp_avg, "update the moment buffers in place"
assert theta.dtype == np.float32 and exp_avg.dtype == np.float32
decayed = descend(Adam, 1, start=2.0, lr=0.1, weight_decay=0.5)  # g = 2 + 0.5 * 2: still a step of lr
assert np.allclose(decayed, [1.9]), decayed
print("Adam OK")

# %% [markdown]
# ## 5. AdamW: decoupled weight decay
#
# For SGD, "add $\lambda\theta$ to the gradient" and "shrink the weights by a
# factor $1 - \eta\lambda$ each step" are the same thing. For Adam they are not:
# the L2 term $\lambda\theta$ joins the gradient *before* the division by
# $\sqrt{\hat v}$, so a weight with large gradients is hardly decayed at all,
# and a weight with tiny gradients is decayed enormously. Loshchilov & Hutter
# (*Decoupled Weight Decay Regularization*, ICLR 2019) showed that this is why
# Adam with L2 regularisation generalised worse than SGD, and proposed to
# **decouple** the decay from the gradient: shrink the weights directly, then take
# a plain Adam step,
#
# $$\theta \leftarrow \theta\,(1 - \eta\lambda), \qquad \text{then the Adam step with } \lambda = 0.$$
#
# That is PyTorch's `AdamW` (default $\lambda = 0.01$), the standard optimizer for
# training transformers. PyTorch multiplies the decay by the learning rate, so a
# learning-rate schedule scales both together; the paper's original form had a
# separate schedule multiplier.
#
# Write `AdamW.update`: decay `param` in place with `group["lr"]` and
# `group["weight_decay"]`, then call `adam_update` (with the same `group`).

# %% export="optim"
class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    ``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)``:
    each step first shrinks the parameter, ``param *= 1 - lr * weight_decay``,
    then takes the Adam step on the gradient alone. Same state and errors as ``Adam``.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def update(self, param: Any, grad: Any, state: dict[str, Any], group: dict[str, Any], xp: Any) -> None:
        """Decay ``param`` in place by ``1 - lr * weight_decay`` (``group``'s), then ``adam_update``."""
        ### BEGIN SOLUTION
        if group["weight_decay"]:
            param *= 1 - group["lr"] * group["weight_decay"]
        self.adam_update(param, grad, state, group, xp)
        ### END SOLUTION


# %% check=1
# With a zero gradient Adam does not move, so only the decay acts: 2 * (1 - 0.1 * 0.5) per step.
theta = tt.tensor([2.0, -4.0], requires_grad=True)
array = theta.data
optimizer = AdamW([theta], lr=0.1, weight_decay=0.5)
for _ in range(2):
    theta.grad = tt.zeros(2)
    optimizer.step()
assert np.allclose(theta.numpy(), [2.0 * 0.95**2, -4.0 * 0.95**2]), theta.numpy()
assert theta.data is array and optimizer.state[0]["step"] == 2
assert np.allclose(descend(AdamW, 1, start=2.0, lr=0.1, weight_decay=0.5), [2.0 * 0.95 - 0.1])
assert np.allclose(descend(AdamW, 2, lr=0.1, weight_decay=0.0), descend(Adam, 2, lr=0.1))
print("AdamW OK")

# %% [markdown]
# ### L2 and decoupled decay, side by side
#
# Take two weights, both starting at 1, whose loss gradients alternate between
# $+s$ and $-s$ — the loss pulls them nowhere on average — at scales $s = 10$
# and $s = 0.001$: think of a weight on a busy feature and one on a rare
# feature. Run 500 steps with $\eta = 0.01$, without decay and with
# $\lambda = 0.1$ either way. Decoupled decay shrinks both weights by the same
# factor, $(1 - \eta\lambda)^{500} = 0.999^{500} \approx 0.61$ of where the
# gradients alone leave them. L2 decay inside Adam hardly touches the busy weight
# and wipes out the quiet one:

# %%
signs = np.where(np.arange(500) % 2 == 0, 1.0, -1.0).astype(np.float32)
scales = np.array([10.0, 0.001], dtype=np.float32)  # busy weight, quiet weight
for name, optimizer_class, weight_decay in (("no decay", Adam, 0.0), ("Adam + L2", Adam, 0.1), ("AdamW", AdamW, 0.1)):
    theta = tt.tensor([1.0, 1.0], requires_grad=True)
    optimizer = optimizer_class([theta], lr=0.01, weight_decay=weight_decay)
    for sign in signs:
        theta.grad = tt.tensor(sign * scales)
        optimizer.step()
    busy, quiet = theta.numpy()
    print(f"{name:10s} busy weight {busy:.3f}   quiet weight {quiet:.5f}")
print(f"(1 - lr * wd) ** 500 = {0.999**500:.3f}")

# %% [markdown]
# With L2, the decay term $\lambda\theta = 0.1$ of the quiet weight dwarfs its
# gradient $0.001$, so Adam normalises *the decay itself* into a step of about
# $\eta$: the weight falls by about $0.01$ per step until it reaches zero. The busy
# weight's decay is divided by $\sqrt{\hat v} \approx 10$ and shrinks it ten times
# less than intended. AdamW decays both alike, independently of their gradients.
#
# ## 6. Parameter groups: decay the matrices only
#
# Weight decay pulls every weight towards 0. For a weight matrix that is the
# point: small rows make a smoother function of the input. For the vectors of a
# network it is not: a bias says where a unit switches on, a normalisation
# layer's gain starts at 1 because 1 leaves its input's scale alone, and pulling
# either to 0 fights the loss without making the function any simpler. They are
# also few (under 1% of a transformer's numbers), so they hardly overfit. GPT-2's
# recipe, nanoGPT's and most since therefore decay the parameters with two or
# more dimensions — weight matrices, convolution kernels, embedding tables —
# and leave the one-dimensional ones alone.
#
# That takes two sets of hyperparameters in one optimizer: **parameter groups**.
# Instead of a list of tensors, pass a list of dicts, each with its `"params"`
# and the hyperparameters it sets; the constructor's arguments fill in the
# rest. For a parameter $\theta$ of group $g$, AdamW then takes its step with
# that group's values,
#
# $$\theta \leftarrow \theta\,(1 - \eta_g \lambda_g), \qquad \text{then the Adam step with } \eta_g, \beta_g, \epsilon_g,$$
#
# which is why `update` reads everything from `group`. `weight_decay_groups(params,
# weight_decay)` (given) makes the two groups:
#
# ```python
# AdamW(weight_decay_groups(model.parameters(), 0.1), lr=1e-3, betas=(0.9, 0.99))
# # = AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}], ...)
# ```
#
# **The learning rate of a group.** A schedule sets one rate, `optimizer.lr = x`.
# A group that did not set its own `lr` gets $x$; a group created with its own
# rate $\eta_g^0$ keeps its ratio to the optimizer's, $x \cdot \eta_g^0/\eta^0$
# (`group["lr_scale"]`), as PyTorch's schedulers scale each group's initial rate.
# A group at a tenth of the rate stays at a tenth all through a cosine schedule.

# %% check=1
matrix = tt.tensor([[2.0, -2.0], [4.0, 1.0]], requires_grad=True)
bias = tt.tensor([1.0, -1.0], requires_grad=True)
optimizer = AdamW(weight_decay_groups([matrix, bias], 0.5), lr=0.1)
assert [group["weight_decay"] for group in optimizer.param_groups] == [0.5, 0.0]
matrix.grad, bias.grad = tt.zeros(2, 2), tt.zeros(2)  # no gradient: only the decay acts
optimizer.step()
assert np.allclose(matrix.numpy(), [[1.9, -1.9], [3.8, 0.95]]) and np.allclose(bias.numpy(), [1.0, -1.0])
optimizer = AdamW([{"params": [matrix], "lr": 0.01}, {"params": [bias]}], lr=0.1, weight_decay=0.5)
before = matrix.numpy(), bias.numpy()
optimizer.step()  # each group decays with its own rate: 1 - 0.01 * 0.5 and 1 - 0.1 * 0.5
assert np.allclose(matrix.numpy(), before[0] * 0.995) and np.allclose(bias.numpy(), before[1] * 0.95)
optimizer.lr = 0.2  # a schedule's new rate: the first group keeps its tenth of it
assert np.allclose([group["lr"] for group in optimizer.param_groups], [0.02, 0.2])
print("parameter groups OK")

# %% [markdown]
# ## 7. The race on the bowl
#
# Now run the three rules on the bowl of section 1, with the classes you wrote and
# autograd computing the gradient. The learning rates are roughly the best for
# each within a few tries; gradient descent is already at 90% of its stability
# limit.

# %%
CURVATURE_T = tt.tensor(CURVATURE)


def trajectory(optimizer_class, steps=60, **settings):
    theta = tt.tensor(START, requires_grad=True)
    optimizer = optimizer_class([theta], **settings)
    path = [theta.numpy()]
    for _ in range(steps):
        optimizer.zero_grad()
        ((theta * theta * CURVATURE_T).sum() * 0.5).backward()
        optimizer.step()
        path.append(theta.numpy())
    return np.array(path)


runs = {
    "SGD lr=0.07": trajectory(SGD, lr=0.07),
    "SGD lr=0.03, momentum=0.8": trajectory(SGD, lr=0.03, momentum=0.8),
    "Adam lr=0.3": trajectory(Adam, lr=0.3),
}
fig, ax = plt.subplots(figsize=(8, 4))
draw_bowl(ax)
for label, path in runs.items():
    ax.plot(path[:, 0], path[:, 1], ".-", label=f"{label}: loss after 60 steps {bowl(path[-1]):.1e}")
ax.set_title("SGD, momentum and Adam on the ill-conditioned bowl")
ax.legend(loc="lower left", fontsize="small")
plt.show()

# %% [markdown]
# Momentum gets the zig-zag under control and races along the valley: with the
# same 60 steps it ends almost two orders of magnitude lower than plain gradient
# descent. Adam's first steps move both coordinates by the same amount $\eta$ —
# a 45° line, not the steepest slope — and it overshoots the minimum and circles
# back: its step is sign-like, and does not shrink with the gradient until its
# running averages catch up. (Adam's per-coordinate scaling is
# ideal here because the bowl's axes are the coordinate axes; a rotated bowl
# would not be fixed by it.) On real networks with noisy gradients, Adam's
# robustness to the scale of each weight's gradient is what makes it the
# default first choice, and well-tuned SGD with momentum often generalises
# slightly better on vision models.
#
# ## 8. Saving and restoring the state
#
# A checkpoint must hold the optimizer's state as well as the weights: resuming
# Adam with zeroed moments restarts the bias correction and jolts the weights
# with $\eta$-sized steps. `state_dict()` copies everything to plain host data;
# `load_state_dict` copies it back. Train 3 steps, save, restore into a *new*
# optimizer over a copy of the weights, train 3 more — the result is bit for bit
# the same as 6 steps straight:

# %%
def quadratic_steps(optimizer, theta, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        ((theta - 3.0) ** 2).sum().backward()
        optimizer.step()


tt.manual_seed(0)
start = tt.randn(5)
straight = tt.tensor(start, requires_grad=True)
quadratic_steps(Adam([straight], lr=0.1), straight, 6)

first = tt.tensor(start, requires_grad=True)
optimizer = Adam([first], lr=0.1)
quadratic_steps(optimizer, first, 3)
saved_weights, saved_state = first.numpy(), optimizer.state_dict()
print({key: type(value).__name__ for key, value in saved_state["state"][0].items()})

resumed = tt.tensor(saved_weights, requires_grad=True)
optimizer = Adam([resumed], lr=0.5)  # the saved learning rate (0.1) comes back with the state
optimizer.load_state_dict(saved_state)
quadratic_steps(optimizer, resumed, 3)
print("bit-identical after resuming:", np.array_equal(resumed.numpy(), straight.numpy()))

# %% [markdown]
# ## 9. Systems: memory and time of the optimizer
#
# ### Memory
#
# An optimizer's state lives as long as training does, next to the weights.
# Plain SGD keeps nothing, momentum one buffer per weight, Adam two. Measure it on
# the parameters of this course's MLP — 784 → 256 → 128 → 10, 235,146 weights — by
# summing the bytes of the real state arrays after one step:

# %%
SHAPES = [(784, 256), (256,), (256, 128), (128,), (128, 10), (10,)]


def mlp_parameters():
    tt.manual_seed(0)
    params = [tt.randn(*shape) * 0.05 for shape in SHAPES]
    return [tt.tensor(p, requires_grad=True) for p in params]


def with_random_grads(params):
    for p in params:
        p.grad = tt.randn(*p.shape) * 0.01
    return params


params = with_random_grads(mlp_parameters())
param_bytes = sum(p.data.nbytes for p in params)
print(f"parameters: {sum(p.size for p in params):,} numbers, {param_bytes / 2**20:.2f} MiB")
optimizers = {
    "SGD": lambda ps: SGD(ps, lr=0.01),
    "SGD momentum": lambda ps: SGD(ps, lr=0.01, momentum=0.9),
    "Adam": lambda ps: Adam(ps, lr=1e-3),
    "AdamW": lambda ps: AdamW(ps, lr=1e-3),
}
for name, make in optimizers.items():
    optimizer = make(params)
    optimizer.step()
    state_bytes = sum(value.nbytes for state in optimizer.state for value in state.values() if hasattr(value, "nbytes"))
    print(f"{name:13s} state {state_bytes / 2**20:5.2f} MiB = {state_bytes / param_bytes:.1f}x the parameters")

# %% [markdown]
# Count the whole bill for training with Adam in float32: weights (1x) +
# gradients (1x) + Adam's moments (2x) = 16 bytes per parameter, before a single
# activation is stored. A 7-billion-parameter model needs 112 GB for that alone —
# more than one GPU holds, which is why large-model training shards the optimizer
# state across GPUs (ZeRO, Rajbhandari et al., 2020) or keeps the moments in
# lower precision (8-bit Adam, Dettmers et al., 2022).
#
# ### Time
#
# Time one `step()` on the same 235k parameters, against the same rules written
# the obvious way in NumPy (`p -= lr * g`, and Adam as in the formulas, with
# temporaries). For scale, also time one forward and backward pass of the MLP on
# a batch of 64 images, written with our tensors.

# %%
def best_time(fn, repeat=7, number=20):
    """The fastest of ``repeat`` timings of ``number`` calls, per call, in seconds."""
    fn()
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


arrays = [p.numpy() for p in params]
grads = [p.grad.numpy() for p in params]
moments = [(np.zeros_like(a), np.zeros_like(a)) for a in arrays]
buffers = [np.zeros_like(a) for a in arrays]


def numpy_sgd():
    for a, g in zip(arrays, grads):
        a -= 0.01 * g


def numpy_momentum():
    for a, g, b in zip(arrays, grads, buffers):
        b[...] = 0.9 * b + g
        a -= 0.01 * b


def numpy_adam(t=10):
    for a, g, (m, v) in zip(arrays, grads, moments):
        m[...] = 0.9 * m + 0.1 * g
        v[...] = 0.999 * v + 0.001 * g * g
        a -= 1e-3 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)


x = tt.randn(64, 784)
labels = tt.tensor(np.arange(64) % 10)


def forward_backward():
    w1, b1, w2, b2, w3, b3 = params
    logits = ((x @ w1 + b1).relu() @ w2 + b2).relu() @ w3 + b3
    loss = -logits.log_softmax(axis=1)[np.arange(64), labels.numpy()].mean()
    loss.backward()


baselines = {"SGD": numpy_sgd, "SGD momentum": numpy_momentum, "Adam": numpy_adam, "AdamW": None}
print(f"{'':13s} {'tinytrain':>10s} {'NumPy, naive':>13s}")
for name, make in optimizers.items():
    ours = best_time(make(params).step)
    naive = f"{best_time(baselines[name]) * 1e6:10.0f} µs" if baselines[name] else ""
    print(f"{name:13s} {ours * 1e6:7.0f} µs {naive:>13s}")
print(f"forward + backward, batch 64: {best_time(forward_backward, number=5) * 1e6:.0f} µs")

# %% [markdown]
# Three things to read from this:
#
# * SGD is about two passes over memory (`lr * g`, then the subtraction), Adam
#   about ten (the scratch array, two moments, the square root, the division,
#   the parameter). Both are memory-bound: how fast they go is how fast the
#   machine streams arrays, not how fast it multiplies. Our SGD step is the
#   hand-written NumPy one, so it costs the same.
# * Written with in-place updates and one scratch array, the Adam step beats
#   the naive NumPy version, which allocates and streams about six temporary
#   arrays per parameter.
# * The optimizer is a small part of a training step — the matrix products of
#   forward and backward dominate. It becomes significant for very large models
#   on GPUs, where each of those array operations is a separate kernel launch per
#   parameter; PyTorch therefore fuses them (`foreach=True` processes all
#   parameters in one launch per operation, `fused=True` does the whole update in
#   one kernel).
#
# ## How PyTorch does it
#
# `torch.optim.SGD`, `Adam` and `AdamW` compute exactly these rules (our tests
# compare trajectories with PyTorch's when it is installed), with these
# differences in the interface:
#
# * **Parameter groups** are PyTorch's: a list of dicts, each with its own
#   parameters and hyperparameters (`[{"params": backbone, "lr": 1e-4},
#   {"params": head}]`), kept in `optimizer.param_groups`. PyTorch has no
#   `optimizer.lr`: its schedulers set `group["lr"]` for every group from the
#   group's initial rate (`initial_lr`), which our `lr` setter does with
#   `lr_scale`. PyTorch has no `weight_decay_groups` either; nanoGPT's
#   `configure_optimizers` splits by `p.dim() >= 2` as it does.
# * `zero_grad()` sets gradients to `None` by default (since PyTorch 2.0), as ours does.
# * `state_dict()` has keys `"state"` (per-parameter state indexed by position,
#   with `step`, `momentum_buffer`, `exp_avg`, `exp_avg_sq` — the names we use)
#   and `"param_groups"` (hyperparameters, parameters by position), as ours
#   does; it holds tensors, which `torch.save` pickles.
# * Options we leave out: SGD's `dampening`, Adam's `amsgrad`, `maximize`,
#   `step(closure)` (for L-BFGS, which needs to re-evaluate the loss), and the
#   `foreach` / `fused` multi-tensor implementations that make the GPU update fast.
#
# ## Summary
#
# * An optimizer owns per-parameter state and updates parameters **in place**, in
#   their own dtype, skipping those without a gradient.
# * SGD: $\theta \leftarrow \theta - \eta\, d$ with $d$ the gradient, the momentum
#   buffer $b = \mu b + g$, or Nesterov's $g + \mu b$; weight decay adds
#   $\lambda\theta$ to $g$. State: 0x (plain) or 1x the parameters.
# * Adam steps along $\hat m / (\sqrt{\hat v} + \epsilon)$: about $\eta$ per
#   coordinate whatever the gradient's scale. Bias correction removes the zero
#   start of the averages (without it, the first step is $3.16\,\eta$). State: 2x.
# * AdamW decays the weights directly, $\theta \leftarrow \theta(1 - \eta\lambda)$,
#   instead of adding $\lambda\theta$ to a gradient that Adam then rescales.
# * Parameter groups give parameters their own hyperparameters; decay the
#   matrices (`ndim >= 2`) and leave biases and norm gains alone.
# * `state_dict()` is plain host data; restoring it makes a resumed run
#   bit-identical to an uninterrupted one.
