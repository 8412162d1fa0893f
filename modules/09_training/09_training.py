# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 09 — Training: schedules, clipping, accumulation, evaluation
#
# *One sitting, about 2 hours: the lesson, 7 functions to write, and the measurements.*
#
# You have layers, losses, optimizers and a data loader. Gluing them into a
# training loop takes ten lines — and those ten lines are where most silent bugs
# in deep learning live. A loop can run, print a falling loss, and still be wrong:
#
# | the textbook version | what actually happens |
# |---|---|
# | accumulate gradients over `k` micro-batches and call `loss.backward()` on each | the step uses the **sum** of `k` mean gradients: `k` times too large, as if the learning rate were `k·lr` |
# | after training epoch `e`, set `optimizer.lr = schedule(e)` | epoch 1 trains at epoch 0's rate: the whole schedule runs one epoch late |
# | report the mean of the per-batch mean losses | a short last batch of 4 samples counts as much as a full one of 128 |
# | set `model.training = False` before evaluating | the flag changes on the top module only; the `Dropout` nested inside keeps dropping |
#
# In this module you build the reference versions, each with the check that
# catches the textbook bug. Module 10 then makes a run survive interruptions:
# checkpoints that resume exactly, and callbacks.
#
# **You will**
# 1. write learning-rate schedules (cosine with warmup, warm restarts) and plot
#    five of them;
# 2. clip gradients by their global norm;
# 3. write the heart of the `Trainer`: gradient accumulation with correct
#    weighting, non-finite losses kept away from the weights, evaluation in eval
#    mode (the schedule applied at the start of each epoch and per-sample loss
#    averages come with it);
# 4. train for a number of steps instead of epochs, with a schedule over steps
#    and an evaluation every few steps, as language models are trained;
# 5. measure what training costs in memory, and train a classifier on real
#    handwritten digits.

# %%
import math
import time

import numpy as np

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.datasets import Digits

# %% [markdown]
# ## 1. Learning-rate schedules
#
# A large learning rate makes fast progress early; a small one settles into a
# minimum late. A **schedule** gives the rate for each epoch. The most used one,
# *cosine annealing* (Loshchilov & Hutter, *SGDR*, ICLR 2017), glides from
# `max_lr` to `min_lr` along half a cosine over `T` epochs:
#
# $$\eta(e) = \eta_{\min} + \frac{\eta_{\max} - \eta_{\min}}{2}\left(1 + \cos\frac{\pi e}{T}\right), \qquad e = 0, 1, \dots$$
#
# Epochs count from 0 and **`get_lr(e)` is the rate used throughout epoch `e`**:
# epoch 0 trains at $\eta_{\max}$ and every epoch $e \ge T$ at $\eta_{\min}$.
# Worked example, `max_lr=0.1, min_lr=0.01, T=4`: the cosine factor
# $(1+\cos(\pi e/4))/2$ is $1, 0.854, 0.5, 0.146, 0$, so the rates are
# $0.1, 0.0868, 0.055, 0.0232, 0.01$.
#
# That sentence in bold is where the textbook loop goes wrong: it trains epoch `e`
# and *then* sets `optimizer.lr = schedule(e)` — so epoch 0's rate is first used
# in epoch 1, and everything runs one epoch late. Our schedules are functions of
# the epoch, with no hidden counter to get out of step, and the `Trainer` sets
# the rate **before** each epoch.
#
# **Warmup.** Adaptive optimizers start with poor estimates of the gradient's
# scale, and big models can diverge in their first steps at the full rate. With
# `warmup_epochs=W` the first `W` epochs ramp up linearly, $\eta_{\max}(e+1)/(W+1)$,
# so epoch `W` is the first at $\eta_{\max}$; the cosine then runs over the
# remaining epochs, $\eta_{\min} + \frac{\eta_{\max}-\eta_{\min}}{2}(1+\cos\frac{\pi(e-W)}{T-W})$.
#
# **Epochs or steps.** Nothing in a schedule is about epochs: `get_lr(t)` is the
# rate of period `t`. A language model trains for a number of optimizer *steps*
# and is never near the end of an epoch, so its schedule counts steps: with
# `Trainer(..., scheduler_interval="step")` the rate before step `t` (counted
# from 0) is `get_lr(t)`, and `CosineSchedule(max_lr=1e-3, min_lr=1e-4,
# total_epochs=2000, warmup_epochs=100)` warms up over 100 steps and anneals
# until step 2000 — exactly nanoGPT's schedule (section 4).
#
# A schedule's only state is its settings, so `state_dict()` returns them and a
# checkpoint can restore them. The given base class `Schedule` checks the epoch
# before any subclass's `get_lr` runs, yours included: `get_lr(1.5)` or
# `get_lr(-1)` raises, naming the epoch, and your code always gets a whole number >= 0.

# %% export="schedules"
"""Learning-rate schedules: ``schedule.get_lr(e)`` is the rate for all of epoch ``e``.

Epochs count from 0. :class:`~tinytrain.training.Trainer` sets the optimizer's
rate to ``get_lr(epoch)`` at the *start* of each epoch, or, with
``scheduler_interval="step"``, to ``get_lr(t)`` before optimizer step ``t``: then
every number of a schedule (``total_epochs``, ``warmup_epochs``, ``step_size``)
counts steps. A schedule is a pure function of its argument and its settings,
so ``state_dict()`` holds the settings.
"""
import functools
import math
from typing import Any

from tinytrain.arguments import check_int, check_number


def _min_lr(min_lr: float, max_lr: float) -> float:
    """``min_lr`` as a float in [0, max_lr]."""
    min_lr = check_number("min_lr", min_lr, minimum=0)
    if min_lr > max_lr:
        raise ValueError(f"min_lr must be in [0, max_lr={max_lr}], got min_lr={min_lr}")
    return min_lr


class Schedule:
    """Base class. A subclass stores its ``__init__`` arguments as attributes of
    the same names and defines ``get_lr``; ``state_dict`` and ``load_state_dict``
    come for free, and so does the check of the epoch: every subclass's ``get_lr``
    gets a whole number >= 0 (anything else raises, naming the epoch)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Wrap the subclass's own get_lr, so that no schedule answers for epoch 1.5 or -1.
        super().__init_subclass__(**kwargs)
        if "get_lr" in vars(cls):
            get_lr = cls.get_lr

            @functools.wraps(get_lr)
            def checked_get_lr(self: "Schedule", epoch: int) -> float:
                return get_lr(self, check_int("epoch", epoch, minimum=0))

            cls.get_lr = checked_get_lr

    def get_lr(self, epoch: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} must define get_lr(epoch)")

    def __call__(self, epoch: int) -> float:
        return self.get_lr(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The settings as plain data, with the schedule's type."""
        return {"type": type(self).__name__, **vars(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore settings from :meth:`state_dict` (validated as in ``__init__``)."""
        if state.get("type") != type(self).__name__:
            raise ValueError(f"cannot load the state of a {state.get('type')!r} into a {type(self).__name__}")
        settings = {key: value for key, value in state.items() if key != "type"}
        if set(settings) != set(vars(self)):
            raise ValueError(f"{type(self).__name__} state needs keys {sorted(vars(self))}, got {sorted(settings)}")
        vars(self).update(vars(type(self)(**settings)))

    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({settings})"


class CosineSchedule(Schedule):
    """Cosine annealing from ``max_lr`` (epoch ``warmup_epochs``) to ``min_lr``
    (epoch ``total_epochs`` and later), after an optional linear warmup.

    Stepped per optimizer step (``Trainer(scheduler_interval="step")``) the epochs
    are steps: ``CosineSchedule(1e-3, 1e-4, total_epochs=2000, warmup_epochs=100)``
    warms up over 100 steps and anneals until step 2000, as nanoGPT does."""

    def __init__(self, max_lr: float = 0.1, min_lr: float = 0.01, total_epochs: int = 100,
                 warmup_epochs: int = 0) -> None:
        self.max_lr = check_number("max_lr", max_lr, above=0)
        self.min_lr = _min_lr(min_lr, self.max_lr)
        self.total_epochs = check_int("total_epochs", total_epochs, minimum=1)
        self.warmup_epochs = check_int("warmup_epochs", warmup_epochs, minimum=0)
        if warmup_epochs >= total_epochs:
            raise ValueError(f"warmup_epochs ({warmup_epochs}) must be less than total_epochs ({total_epochs})")

    def get_lr(self, epoch: int) -> float:
        """The rate for epoch ``epoch`` (0-based, a whole number: ``Schedule`` checks it):
        warmup ramp, cosine, then ``min_lr``."""
        ### BEGIN SOLUTION
        warmup, total = self.warmup_epochs, self.total_epochs
        if epoch < warmup:
            return self.max_lr * (epoch + 1) / (warmup + 1)
        if epoch >= total:
            return self.min_lr
        progress = (epoch - warmup) / (total - warmup)
        return self.min_lr + (self.max_lr - self.min_lr) * (1 + math.cos(math.pi * progress)) / 2
        ### END SOLUTION


# %% check=2
schedule = CosineSchedule(max_lr=0.1, min_lr=0.01, total_epochs=4)
assert np.allclose([schedule.get_lr(e) for e in range(6)], [0.1, 0.08681980515, 0.055, 0.02318019485, 0.01, 0.01])
warm = CosineSchedule(max_lr=1.0, min_lr=0.0, total_epochs=10, warmup_epochs=3)
assert np.allclose([warm.get_lr(e) for e in range(4)], [0.25, 0.5, 0.75, 1.0]), "warmup ramps up to max_lr at epoch W"
assert warm.get_lr(10) == 0.0 and warm.get_lr(4) < 1.0
copy = CosineSchedule()
copy.load_state_dict(warm.state_dict())
assert copy.get_lr(5) == warm.get_lr(5)
try:
    schedule.get_lr(-1)
except ValueError:
    pass
else:
    raise AssertionError("a negative epoch must raise ValueError")
print("CosineSchedule OK")

# %% [markdown]
# ### Warm restarts, and three classics
#
# SGDR itself does not anneal once: it *restarts*. The first cycle lasts
# `first_cycle` epochs, each next one `cycle_mult` times longer, and within a
# cycle of length $T_i$ the rate follows the cosine with $e$ replaced by the
# epochs since the cycle began, $t$. The jump back to $\eta_{\max}$ kicks the
# weights out of a sharp minimum; the ends of the cycles are good snapshots.
# Find the cycle by walking through the cycles until the one that contains `e`.
#
# For comparison, three schedules given to you: **step decay** (multiply by
# `gamma` every `step_size` epochs — the ResNet recipe), **exponential decay**
# ($\eta_0\gamma^e$) and **inverse square root** ($\eta_{\max}\sqrt{(W+1)/(e+1)}$
# after a warmup, the original Transformer's).

# %% export="schedules"
class CosineWarmRestarts(Schedule):
    """SGDR: cosine cycles from ``max_lr`` to ``min_lr``; cycle ``i`` lasts
    ``first_cycle * cycle_mult**i`` epochs and starts again at ``max_lr``."""

    def __init__(self, max_lr: float = 0.1, min_lr: float = 0.0, first_cycle: int = 10, cycle_mult: int = 1) -> None:
        self.max_lr = check_number("max_lr", max_lr, above=0)
        self.min_lr = _min_lr(min_lr, self.max_lr)
        self.first_cycle = check_int("first_cycle", first_cycle, minimum=1)
        self.cycle_mult = check_int("cycle_mult", cycle_mult, minimum=1)

    def get_lr(self, epoch: int) -> float:
        ### BEGIN SOLUTION
        length = self.first_cycle
        if self.cycle_mult == 1:
            since_restart = epoch % length
        else:
            since_restart = epoch
            while since_restart >= length:
                since_restart -= length
                length *= self.cycle_mult
        return self.min_lr + (self.max_lr - self.min_lr) * (1 + math.cos(math.pi * since_restart / length)) / 2
        ### END SOLUTION


class StepSchedule(Schedule):
    """``lr * gamma ** (epoch // step_size)``: a drop by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, lr: float = 0.1, step_size: int = 30, gamma: float = 0.1) -> None:
        self.lr = check_number("lr", lr, above=0)
        self.step_size = check_int("step_size", step_size, minimum=1)
        self.gamma = check_number("gamma", gamma, above=0)

    def get_lr(self, epoch: int) -> float:
        return self.lr * self.gamma ** (epoch // self.step_size)


class ExponentialSchedule(Schedule):
    """``lr * gamma ** epoch``."""

    def __init__(self, lr: float = 0.1, gamma: float = 0.95) -> None:
        self.lr = check_number("lr", lr, above=0)
        self.gamma = check_number("gamma", gamma, above=0)

    def get_lr(self, epoch: int) -> float:
        return self.lr * self.gamma ** epoch


class InverseSqrtSchedule(Schedule):
    """Linear warmup to ``max_lr`` at epoch ``warmup_epochs``, then ``max_lr * sqrt((W + 1) / (epoch + 1))``."""

    def __init__(self, max_lr: float = 0.1, warmup_epochs: int = 0) -> None:
        self.max_lr = check_number("max_lr", max_lr, above=0)
        self.warmup_epochs = check_int("warmup_epochs", warmup_epochs, minimum=0)

    def get_lr(self, epoch: int) -> float:
        warmup = self.warmup_epochs
        if epoch < warmup:
            return self.max_lr * (epoch + 1) / (warmup + 1)
        return self.max_lr * math.sqrt((warmup + 1) / (epoch + 1))


# %% check=1
sgdr = CosineWarmRestarts(max_lr=1.0, min_lr=0.0, first_cycle=2, cycle_mult=2)
# cycles: epochs 0-1 (length 2), 2-5 (length 4), 6-13 (length 8)
assert np.allclose([sgdr.get_lr(e) for e in (0, 1, 2, 3, 4, 6, 10)], [1.0, 0.5, 1.0, 0.8535533906, 0.5, 1.0, 0.5])
assert np.allclose([CosineWarmRestarts(1.0, 0.0, 3).get_lr(e) for e in (0, 3, 4, 6)], [1.0, 1.0, 0.75, 1.0])
print("CosineWarmRestarts OK")

# %% [markdown]
# All five over 100 epochs, in one figure:

# %%
import matplotlib.pyplot as plt

schedules = {
    "cosine, 5 warmup": CosineSchedule(max_lr=0.1, min_lr=0.001, total_epochs=100, warmup_epochs=5),
    "warm restarts (10, x2)": CosineWarmRestarts(max_lr=0.1, min_lr=0.001, first_cycle=10, cycle_mult=2),
    "step (x0.1 every 30)": StepSchedule(lr=0.1, step_size=30, gamma=0.1),
    "exponential (0.95)": ExponentialSchedule(lr=0.1, gamma=0.95),
    "inverse sqrt, 5 warmup": InverseSqrtSchedule(max_lr=0.1, warmup_epochs=5),
}
epochs = np.arange(100)
fig, ax = plt.subplots(figsize=(8, 4))
for label, s in schedules.items():
    ax.plot(epochs, [s.get_lr(int(e)) for e in epochs], label=label)
ax.set(xlabel="epoch", ylabel="learning rate", yscale="log", title="Learning-rate schedules")
ax.legend()
plt.show()

# %% [markdown]
# ## 2. Clipping gradients by their global norm
#
# One bad batch can produce a gradient a thousand times larger than usual, and one
# step along it can undo an epoch of training. **Clipping** caps the step: treat
# the gradients of *all* parameters as one long vector $g$, compute its L2 norm
# $\|g\| = \sqrt{\sum_i g_i^2}$, and if it exceeds `max_norm`, scale every gradient
# by `max_norm / (‖g‖ + 1e-6)` (the `+ 1e-6` is PyTorch's, so our numbers match
# its; the clipped norm is a hair below `max_norm`). Scaling all of them by the
# same factor keeps the **direction** of the step and shortens only its length
# (Pascanu et al., *On the difficulty of training recurrent neural networks*,
# 2013). Clipping each parameter separately would change the direction.
#
# Worked example: a gradient $(100, 200, 50)$ has norm $\sqrt{52500} \approx 229.1$;
# clipped to norm 1 it becomes $(0.436, 0.873, 0.218)$ — same direction.
#
# `clip_grad_norm` returns the norm **before** clipping (worth logging: it is
# the best early warning of instability) and skips parameters without a
# gradient. If the norm is `inf` or `nan`, some gradient overflowed; scaling
# cannot repair that, so the gradients are left alone and the caller must not
# step (or, with `error_if_nonfinite=True`, it raises). Squares are summed on
# the device, one partial sum per device, so a GPU waits for one number only.

# %% export="training"
"""Training: global-norm gradient clipping, the :class:`Trainer`, memory and plots.

The Trainer runs epochs of gradient-accumulated, optionally clipped optimizer
steps with the learning rate of a schedule, evaluates in eval mode, drives
callbacks from ``fit``, and saves and restores its complete state in checkpoints
(:mod:`tinytrain.serialization`) so that a resumed run is bit-identical.
"""
import functools
import itertools
import math
import sys
import time
import warnings
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from tinytrain.arguments import check_callable, check_int, check_methods, check_number, check_type
from tinytrain.autograd import no_grad
from tinytrain.backend import is_floating
from tinytrain.resume import Resumable, callback_keys
from tinytrain.tensor import Tensor


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float = 1.0, error_if_nonfinite: bool = False) -> float:
    """Scale all gradients together so that their global L2 norm is at most ``max_norm``.

    The global norm is ``sqrt(sum of every gradient element squared)`` over all
    parameters that have a gradient (the others are skipped). When it exceeds
    ``max_norm``, every gradient is multiplied in place by ``max_norm / (norm + 1e-6)``,
    which keeps the direction, and keeps its dtype: a float32 gradient stays float32
    (float64 is for the sum of squares only; a float64 gradient would make the
    optimizer compute in float64, and take twice the memory). Returns the norm
    *before* clipping, as a float.
    The norm of finite gradients is finite: float32 squares overflow above about
    1.8e19, so add the squares up in float64 (or, faster, add them in the
    gradients' dtype and do it again in float64 when that sum is ``inf``).
    A non-finite norm leaves the gradients untouched (the caller must not take
    the step) or, with ``error_if_nonfinite=True``, raises ``FloatingPointError``
    whose message gives the norm (``inf`` or ``nan``).
    ``parameters`` may be any iterable, a generator too (it runs only once: scale
    the gradients in ``grads``), or a single tensor. Add the squares up on each
    gradient's device and read the sum from it once per device (on a GPU every
    read waits for the device), not once per gradient.
    """
    max_norm = check_number("max_norm", max_norm, above=0, finite=False)  # inf: measure, never clip
    if isinstance(parameters, Tensor):  # one tensor, not an iterable of its rows
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    ### BEGIN SOLUTION
    by_device: dict[Any, list] = {}
    for grad in grads:  # flat in memory order: a view, and vdot of a column-major matrix is 50x slower
        by_device.setdefault(grad._backend, []).append(grad.data.ravel(order="K"))
    total = 0.0
    for backend, arrays in by_device.items():
        squares = float(backend.to_host(sum(backend.xp.vdot(a, a) for a in arrays)))  # vdot: no temporaries
        if math.isinf(squares):  # overflowed in float32, or a gradient is inf: float64 tells which
            wide = [a.astype(np.float64) for a in arrays]
            squares = float(backend.to_host(sum(backend.xp.vdot(a, a) for a in wide)))
        total += squares  # one host transfer per device (two after an overflow)
    norm = math.sqrt(total)
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise FloatingPointError(f"the global gradient norm is {norm} over {len(grads)} gradients")
        return norm
    if norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for grad in grads:
            grad.data *= scale
    return norm
    ### END SOLUTION


# %% check=2
weights = tt.zeros(3, requires_grad=True)
weights.grad = tt.tensor([100.0, 200.0, 50.0])
bias = tt.zeros(1, requires_grad=True)  # no gradient: skipped
norm = clip_grad_norm([weights, bias], max_norm=1.0)
assert abs(norm - math.sqrt(52500)) < 1e-3, f"returns the norm before clipping, got {norm}"
clipped = weights.grad.numpy()
assert abs(np.linalg.norm(clipped) - 1.0) < 1e-5, clipped
assert np.allclose(clipped / np.linalg.norm(clipped), np.array([100, 200, 50]) / math.sqrt(52500)), "keeps the direction"
a, b = tt.zeros(2, requires_grad=True), tt.zeros(1, requires_grad=True)
a.grad, b.grad = tt.tensor([3.0, 0.0]), tt.tensor([4.0])
assert clip_grad_norm([a, b], max_norm=10.0) == 5.0 and a.grad.numpy().tolist() == [3.0, 0.0], "global norm, no clip below max"
assert clip_grad_norm([a, b], max_norm=1.0) == 5.0 and np.allclose(b.grad.numpy(), [0.8], atol=1e-6)
a.grad = tt.tensor([np.inf, 1.0])
assert math.isinf(clip_grad_norm([a, b], max_norm=1.0)) and a.grad.numpy()[1] == 1.0, "non-finite: untouched"
print("clip_grad_norm OK")


# %% [markdown]
# ## 3. The `Trainer`
#
# The loop every framework hides behind `fit()`:
#
# ```
# for epoch:
#     optimizer.lr = schedule.get_lr(epoch)          # the rate for THIS epoch, set first
#     model.train()                                   # reaches every sub-module
#     for each window of k batches:
#         zero the gradients
#         for each batch in the window: forward, loss, backward (weighted!)
#         if the loss is finite: clip, and step if the norm is finite too
#     evaluate on held-out data in eval mode
# ```
#
# ### Gradient accumulation, weighted correctly
#
# A batch of 128 may not fit in memory while a batch of 32 does. Accumulation
# runs `k` micro-batches, lets their gradients add up in `.grad`, and steps once.
# For that step to equal the step of one big batch, the accumulated gradient must
# be the gradient of the **mean loss over all samples of the window**:
#
# $$\nabla \frac{1}{n}\sum_{j=1}^{n} \ell_j = \sum_{b \in \text{window}} \frac{n_b}{n}\,\nabla\Big(\underbrace{\frac{1}{n_b}\sum_{j \in b}\ell_j}_{\text{loss of batch } b\text{, reduction="mean"}}\Big), \qquad n = \sum_b n_b .$$
#
# So each micro-batch's (mean) loss is multiplied by $n_b / n$ before
# `backward()`. The textbook loop calls `loss.backward()` on every micro-batch
# unscaled, and its step is $k$ times too large; dividing by $k$ instead is right
# only when every micro-batch has the same size — not for the epoch's last, short
# window. We need $n$ *before* the first backward of a window, so the trainer
# first collects the window's `k` batches (data only, no activations: cheap),
# then runs them.
#
# ### Losses per sample, not per batch
#
# The epoch's loss is $\frac{\sum_j \ell_j}{\sum_b n_b}$: each batch's mean times
# its size, summed, divided by the number of samples. Averaging the batch means
# would let a last batch of 4 samples weigh as much as one of 128.
#
# ### Keep the hot path lean
#
# The loss of each window is added up **on the device**; the trainer reads it
# once per optimizer step (it must know whether the loss is finite before it
# steps). On a GPU every read is a synchronisation that stalls the pipeline, so
# there is no `loss.item()` per micro-batch, and evaluation reads its sums once
# at the end.
#
# ### Non-finite steps are skipped
#
# A single `nan` in the weights is permanent: every later output is `nan`. If a
# window's loss, or the gradient norm (when clipping), is `inf` or `nan`, the
# step is skipped and counted in `trainer.skipped_steps` and
# `history["skipped_steps"]` — or, with `on_nonfinite="raise"`, training stops
# with a `FloatingPointError` that says where. Without clipping only the loss is
# checked (the norm costs a pass over every gradient), so a finite loss whose
# gradient overflows does reach the weights: clip when that can happen. A skipped
# step's norm is not part of `history["grad_norm"]`, the mean over steps taken.
#
# ### Modes
#
# `model.train()` and `model.eval()` (Module 04) set `training` on **every**
# sub-module. `evaluate` records each module's mode, switches to eval mode, runs
# under `no_grad()` (no graph: less memory, less time) and puts every module back
# as it was — even when an exception interrupts it.
#
# You write three methods: `_accumulate` (one window: clear the gradients, a
# weighted backward per batch, the window's loss), `_clip_and_step` (check, clip,
# step) and `evaluate`. The rest is given: `train_epoch` cuts the epoch into
# windows and calls `_accumulate`, then `_take_step`; `fit` loops over epochs and
# calls the callbacks that Module 10 writes; `save_checkpoint` and
# `load_checkpoint` come from Module 10's `Resumable`, which `Trainer` inherits.
#
# Two given methods are the Trainer's **extension points**, which Module 13 plugs
# into: every training batch's loss comes from `self._batch_loss(inputs, targets)`
# (mixed precision computes it in float16 there), and every step goes through
# `self._take_step` (mixed precision unscales the gradients there, data
# parallelism averages them over the processes; Module 18's sharded strategy takes
# the whole step there). So `_accumulate` must get each
# batch's loss from `self._batch_loss`, not by calling the model itself: a
# trainer asked for `precision="16-mixed"` stops with an error that says so.

# %% export="training"
HISTORY_KEYS = ("train_loss", "eval_loss", "eval_accuracy", "learning_rates", "grad_norm", "skipped_steps", "epoch_time",
                "step")
# fit(max_steps=...) reads an endless stream: this many skipped steps in a row stop it (with
# 16-mixed the loss scale gives up after about 40 overflows in a row anyway).
MAX_SKIPPED_IN_A_ROW = 100


def _pair(batch: Any) -> tuple[Tensor, Tensor]:
    """``batch`` as ``(inputs, targets)``, or a clear error."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        kind = f"a {len(batch)}-tuple" if isinstance(batch, (tuple, list)) else type(batch).__name__
        raise TypeError(f"the Trainer needs batches of (inputs, targets), got {kind}")
    return batch


def _check_loader(name: str, loader: Any) -> None:
    """Raise ``TypeError`` naming ``name`` unless ``loader`` can be iterated (``fit(None)`` fails here)."""
    check_methods(name, loader, ("__iter__",), "a data loader: an iterable of (inputs, targets) batches")


_CALLBACK_HOOKS = ("on_fit_begin", "on_epoch_end", "on_checkpoint", "on_fit_end")  # what fit calls


def _windows(batches: Iterable[Any], size: int) -> Iterator[list]:
    """Consecutive groups of ``size`` ``(inputs, targets)`` batches; the last group may be shorter."""
    window = []
    for batch in batches:
        window.append(_pair(batch))
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def _correct(outputs: Tensor, targets: Tensor) -> Tensor | None:
    """How many rows of ``(N, C)`` scores have their maximum at the target class
    (integer labels, or one-hot / probability rows); ``None`` when not a classifier."""
    if outputs.ndim != 2 or outputs.shape[1] < 2:
        return None
    if targets.ndim == 1 and targets.dtype.kind in "iu":
        labels = targets
    elif targets.shape == outputs.shape:
        labels = targets.argmax(axis=1)
    else:
        return None
    return (outputs.argmax(axis=1) == labels).sum()


def _reduction(loss_fn: Any) -> str:
    """How ``loss_fn`` reduces over the batch: its ``reduction`` attribute (a loss module's), the
    ``reduction=`` bound by ``functools.partial`` (a functional loss's), else ``"mean"``."""
    if hasattr(loss_fn, "reduction"):
        return loss_fn.reduction
    if isinstance(loss_fn, functools.partial):
        return loss_fn.keywords.get("reduction", "mean")
    return "mean"


def _in_jupyter_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _progress_enabled() -> bool:
    """Whether to draw progress bars: stdout is a terminal, or this is a Jupyter kernel."""
    return getattr(sys.stdout, "isatty", lambda: False)() or _in_jupyter_kernel()


def _progress_bar(enabled: bool, **options: Any) -> Any:
    """A text ``tqdm`` bar with ``options`` when enabled and tqdm is installed, else None.

    Text, also in a notebook: a widget bar (``tqdm.auto``) is saved in the notebook
    as a view of a widget that exists only while the kernel runs, and reopened it
    shows "Error displaying widget" instead, once per bar. A text bar redraws
    itself with carriage returns, which Jupyter folds into the last line it drew,
    so the saved notebook keeps just the finished bars. In a notebook it goes to
    stdout, whose output is not shown as an error.
    """
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if _in_jupyter_kernel():
        options.setdefault("file", sys.stdout)
    return tqdm(**options)


def _progress(iterable: Iterable[Any], enabled: bool, **options: Any) -> Iterable[Any]:
    """``iterable`` wrapped in a text ``tqdm`` bar when enabled and tqdm is installed.

    The bar gets an iterator: a bar may call ``iter()`` on what it is given more
    than once, and for a data loader each ``iter()`` is a new epoch (a new shuffle).
    """
    if "total" not in options and hasattr(iterable, "__len__"):
        options["total"] = len(iterable)
    bar = _progress_bar(enabled, iterable=iter(iterable), **options)
    return iterable if bar is None else bar


def _endless(loader: Iterable[Any], role: str) -> Iterator[Any]:
    """The batches of ``loader`` as one stream: a new ``iter(loader)`` (a new epoch) whenever one ends."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError(f"the {role} loader yielded no batches")


def _has_len(loader: Any) -> bool:
    """Whether ``len(loader)`` works: a loader without it may never end."""
    try:
        len(loader)
    except TypeError:
        return False
    return True


class Trainer(Resumable):
    """Trains ``model`` with ``optimizer`` on ``loss_fn(model(inputs), targets)``.

    Batches are ``(inputs, targets)`` pairs of tensors, first axis = samples.
    ``scheduler``: anything with ``get_lr(t)``. With ``scheduler_interval="epoch"``
    the optimizer's rate is set to ``get_lr(epoch)`` at the start of every epoch;
    with ``"step"`` to ``get_lr(t)`` before every optimizer step, ``t`` the steps
    taken so far (``self.step``; a skipped step does not count, so the next one
    gets the same rate). ``grad_clip_norm``: clip the accumulated
    gradient to this global L2 norm before every step. ``on_nonfinite``:
    ``"skip"`` drops a step whose loss or gradient norm is inf/nan and counts it,
    ``"raise"`` stops with ``FloatingPointError`` (the gradient norm is computed,
    and checked, only when clipping; without it the loss is checked).
    ``precision``: one of Lightning's names, ``tinytrain.precision.PRECISIONS``:
    ``"32-true"``; ``"16-mixed"`` for float16 compute with float32 master weights and
    dynamic loss scaling (Module 13, :mod:`tinytrain.amp`); ``"bf16-mixed"``, ``"16-true"``
    and ``"bf16-true"`` (Module 17, :mod:`tinytrain.precision`).
    ``strategy``: ``tinytrain.distributed.DataParallel()`` for data parallelism over MPI
    (Module 13), ``tinytrain.distributed.ZeRO(stage)`` to shard the optimizer, gradients and
    parameters over the ranks too (Module 18).
    ``loss_fn`` returns the batch's mean loss, unless its ``reduction`` attribute (or
    the ``reduction=`` that ``functools.partial`` binds) says ``"sum"`` or ``"none"``.

    ``epoch`` counts completed epochs, ``step`` the optimizer steps taken,
    ``skipped_steps`` the steps dropped; ``history`` holds one row per epoch (or,
    in ``fit(max_steps=...)``, per evaluation) under each of ``HISTORY_KEYS``:
    ``eval_*`` and ``epoch_time`` (the row's seconds) are added by ``fit``;
    ``learning_rates`` is the rate of the row's last step, ``grad_norm`` the row's
    mean pre-clip norm (nan without clipping), ``step`` the steps taken at its end.
    """

    def __init__(self, model: Any, optimizer: Any, loss_fn: Any, scheduler: Any = None,
                 grad_clip_norm: float | None = None, on_nonfinite: str = "skip", precision: str = "32-true",
                 strategy: Any = None, scheduler_interval: str = "epoch") -> None:
        check_methods("model", model, ("__call__", "parameters"), "a model, such as nn.Sequential(...)")
        check_methods("optimizer", optimizer, ("step",), "an optimizer, such as tt.SGD(model.parameters(), lr=0.1)")
        check_callable("loss_fn", loss_fn, "a loss function or module, such as nn.CrossEntropyLoss()")
        if scheduler is not None:
            check_methods("scheduler", scheduler, ("get_lr",), "None or a schedule, such as tt.CosineSchedule()")
        if grad_clip_norm is not None:  # inf: measure the norm (and skip non-finite steps), never clip
            grad_clip_norm = check_number("grad_clip_norm", grad_clip_norm, above=0, finite=False)
        if on_nonfinite not in ("skip", "raise"):
            raise ValueError(f"on_nonfinite must be 'skip' or 'raise', got {on_nonfinite!r}")
        if scheduler_interval not in ("epoch", "step"):
            raise ValueError(f"scheduler_interval must be 'epoch' or 'step', got {scheduler_interval!r}")
        self.model, self.optimizer, self.loss_fn, self.scheduler = model, optimizer, loss_fn, scheduler
        self.scheduler_interval = scheduler_interval
        self.grad_clip_norm = grad_clip_norm
        self.on_nonfinite = on_nonfinite
        self.epoch = self.step = self.skipped_steps = 0
        self.history: dict[str, list] = {key: [] for key in HISTORY_KEYS}
        self.stop_training = False  # a callback sets it to end fit() after the current epoch
        self._loaders: dict[str, Any] = {}  # "train"/"val" -> loader, whose position checkpoints keep
        self._callbacks: tuple = ()
        self._pending: dict[str, dict] = {"loaders": {}, "callbacks": {}}  # from load_checkpoint, for the next fit
        # Modules 13 and 17: the precision's plugin (None for "32-true"; tinytrain.precision), and
        # strategy=DataParallel() (tinytrain.distributed)
        from tinytrain.precision import precision_plugin

        self.precision, self.strategy = precision, strategy
        self._amp = precision_plugin(precision)
        self._plugins = [plugin for plugin in (strategy, self._amp) if plugin is not None]
        for plugin in self._plugins:
            plugin.setup(self)

    # -- one epoch -------------------------------------------------------------------
    def _reduce(self, loss: Tensor) -> tuple[Tensor, bool]:
        """``(loss, is_mean)``: a scalar loss, and whether it is a mean over the batch's samples.

        A 2-byte loss (float16 or bfloat16: a model in ``precision="16-true"`` or ``"bf16-true"``,
        Module 17) is widened to float32 first: the sums of losses over an epoch or an evaluation
        would otherwise add up in 2 bytes, where 256 + 1 is 256.
        """
        if loss.dtype.itemsize < 4 and is_floating(loss.dtype):
            loss = loss.astype(np.float32)
        reduction = _reduction(self.loss_fn)
        if reduction == "none":
            return loss.sum(), False
        return loss, reduction == "mean"

    def _batch_loss(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, bool]:
        """``(loss, is_mean)`` of one training batch: ``loss_fn(model(inputs), targets)``
        reduced to a scalar, and whether it is a mean over the batch's samples.

        Given. Module 13's mixed precision computes the loss here in float16, so
        every training batch's loss must come from this method.
        """
        if self._amp is not None:
            return self._reduce(self._amp.forward_loss(self.model, self.loss_fn, inputs, targets))
        return self._reduce(self.loss_fn(self.model(inputs), targets))

    def _take_step(self, parameters: list[Tensor], loss: float, norms: list[float]) -> bool:
        """Step on the accumulated gradients unless something is wrong; whether the step was taken.

        Given. Module 13's plugins go first: mixed precision unscales the float16
        gradients, data parallelism averages them over the ranks, and either may
        veto the step (:meth:`_plugins_allow`). Then :meth:`_clip_and_step`.
        A strategy with a ``take_step`` method (Module 18's ZeRO, which holds 1/P of
        every gradient and of the optimizer, so that only all ranks together know the
        gradient norm) takes the whole step itself, by the same rules.
        """
        take_step = getattr(self.strategy, "take_step", None)
        if take_step is not None:
            return take_step(self, parameters, loss, norms)
        if self._plugins:
            allowed = [plugin.before_step(parameters, loss) for plugin in self._plugins]  # all: collective calls
            if not self._plugins_allow(loss, getattr(self.strategy, "nonfinite_ranks", 0), all(allowed)):
                return False
        return self._clip_and_step(parameters, loss, norms)

    def _plugins_allow(self, loss: float, bad_ranks: int, allowed: bool) -> bool:
        """Whether a step may go on once the plugins have done their work; if not, it is skipped.

        Given. ``bad_ranks`` ranks (this one included) had a non-finite loss; ``allowed``
        is false when the float16 gradients overflowed. A non-finite loss (on this
        rank or another) is handled by :meth:`_skip` like any other, so
        ``on_nonfinite="raise"`` raises; a float16 overflow of finite losses is part of
        loss scaling and is only counted.
        """
        if bad_ranks:  # every rank decides alike, so none waits for the others at the next step
            return self._skip(f"the loss is not finite on {bad_ranks} of {self.strategy.world_size} ranks "
                              f"(this rank's: {loss})")
        if not math.isfinite(loss):
            return self._skip(f"the loss is {loss}")
        if not allowed:  # a float16 overflow: the loss scale backs off, this step is dropped
            self.skipped_steps += 1
            return False
        return True

    def _clip_and_step(self, parameters: list[Tensor], loss: float, norms: list[float]) -> bool:
        """Check, clip and step; whether the step was taken.

        ``loss`` is the window's summed loss. When it is not finite, skip the step
        with ``self._skip(reason)`` (which counts it, or raises under
        ``on_nonfinite="raise"``); the reason gives the value, as in
        ``f"the loss is {loss}"``. When clipping (``grad_clip_norm`` is not None),
        clip ``parameters``' gradients with :func:`clip_grad_norm`; skip the same
        way (``self._skip``, the reason giving the norm) when the norm it returns is
        not finite, and otherwise append it to
        ``norms``. Then ``self.optimizer.step()`` and count it in ``self.step``.
        """
        ### BEGIN SOLUTION
        if not math.isfinite(loss):
            return self._skip(f"the loss is {loss}")
        if self.grad_clip_norm is not None:
            norm = clip_grad_norm(parameters, self.grad_clip_norm)
            if not math.isfinite(norm):
                return self._skip(f"the gradient norm is {norm}")
            norms.append(norm)
        self.optimizer.step()
        self.step += 1
        return True
        ### END SOLUTION

    def _skip(self, reason: str) -> bool:
        if self.on_nonfinite == "raise":
            raise FloatingPointError(
                f"{reason} in epoch {self.epoch} after {self.step} optimizer steps; stopping because "
                "on_nonfinite='raise' (lower the learning rate, clip the gradients, or check the data)"
            )
        self.skipped_steps += 1
        return False

    def train_epoch(self, dataloader: Iterable[Any], accumulation_steps: int = 1, progress: bool = False) -> float:
        """Train one epoch; return the mean loss per sample over the steps taken.

        First, with ``scheduler_interval="epoch"``, sets the optimizer's rate to
        ``scheduler.get_lr(epoch)``. Then, for each window of ``accumulation_steps``
        consecutive batches (the last window may be shorter), one optimizer step
        on the gradient of the mean loss over all samples of the window
        (:meth:`_train_windows`). Appends one history row.
        """
        _check_loader("dataloader", dataloader)
        check_int("accumulation_steps", accumulation_steps, minimum=1)
        self._use_loader("train", dataloader)
        if self.scheduler is not None and self.scheduler_interval == "epoch":
            self.optimizer.lr = self.scheduler.get_lr(self.epoch)
        batches = _progress(dataloader, progress, desc=f"epoch {self.epoch + 1}", leave=False, unit="batch")
        mean_loss = self._train_windows(_windows(batches, accumulation_steps))
        self.epoch += 1
        return mean_loss

    def _train_windows(self, windows: Iterable[list], until: int | None = None, bar: Any = None) -> float:
        """Train on ``windows`` (until ``self.step == until``, when given) in training mode; append a history row
        and return its mean loss per sample over the steps taken.

        Each window is one optimizer step (:meth:`_accumulate`, then :meth:`_take_step`),
        after setting the rate to ``scheduler.get_lr(self.step)`` with ``scheduler_interval="step"``.
        A skipped step changes nothing: the model's buffers (BatchNorm's running
        statistics) are put back as they were before its window. ``bar`` counts the steps taken.
        """
        self.model.train()
        parameters = self.model.parameters()
        buffers = [buffer for buffer in self.model.buffers() if buffer is not None]
        loss_sum, samples, count, skipped_before, norms = 0.0, 0, 0, self.skipped_steps, []
        skipped_in_a_row = 0
        for window in windows:
            count += 1
            if self.scheduler is not None and self.scheduler_interval == "step":
                self.optimizer.lr = self.scheduler.get_lr(self.step)  # the rate of step number self.step
            before = [buffer.data.copy() for buffer in buffers]  # running statistics, for a skipped step
            taken = False
            try:
                window_loss = self._accumulate(window, parameters)
                taken = self._take_step(parameters, window_loss, norms)
            finally:
                if not taken:  # a skipped (or failed) step leaves the model as it was, buffers included
                    for buffer, data in zip(buffers, before):
                        buffer.data[...] = data
            if taken:
                skipped_in_a_row = 0
                loss_sum += window_loss
                samples += sum(len(inputs) for inputs, _ in window)
                if bar is not None:
                    bar.update()
            else:
                skipped_in_a_row += 1
                if until is not None and skipped_in_a_row == MAX_SKIPPED_IN_A_ROW:  # an endless stream: it would
                    raise FloatingPointError(  # never reach its step count
                        f"{skipped_in_a_row} steps in a row were skipped (non-finite loss or gradients) after "
                        f"{self.step} optimizer steps; fit(max_steps=...) would never reach step {until} "
                        "(lower the learning rate, clip the gradients, or check the data)")
            if until is not None and self.step >= until:  # stop before reading another batch: a checkpoint
                break  # taken now holds the loaders' positions exactly
        if count == 0:
            raise ValueError("the train loader yielded no batches")
        mean_loss = loss_sum / samples if samples else math.nan
        for key, value in (("learning_rates", float(self.optimizer.lr)), ("train_loss", mean_loss),
                           ("grad_norm", sum(norms) / len(norms) if norms else math.nan),
                           ("skipped_steps", self.skipped_steps - skipped_before), ("step", self.step)):
            self.history[key].append(value)
        return mean_loss

    def _accumulate(self, window: list[tuple[Tensor, Tensor]], parameters: list[Tensor]) -> float:
        """Forward and backward one window of ``(inputs, targets)`` batches; the window's summed loss.

        First clear every parameter's gradient (``.grad = None``). Then, for each
        batch, ``loss, is_mean = self._batch_loss(inputs, targets)`` and
        ``backward()`` on that loss weighted so that the gradients add up to the
        gradient of the mean loss over all ``n`` samples of the window: a mean
        loss of ``n_b`` samples weighs ``n_b / n``, a summed loss (``is_mean``
        false) ``1 / n``. Returns the sum of the per-sample losses of the window
        (a mean loss counts ``n_b`` times), as a float read from the device once.
        """
        ### BEGIN SOLUTION
        window_samples = sum(len(inputs) for inputs, _ in window)
        for parameter in parameters:  # what model.zero_grad() does, without walking the tree each step
            parameter.grad = None
        window_loss = None  # the window's summed per-sample loss, kept on the device
        for inputs, targets in window:
            loss, is_mean = self._batch_loss(inputs, targets)
            weight = (len(inputs) if is_mean else 1) / window_samples
            (loss * weight if weight != 1 else loss).backward()
            summed = loss.detach() * len(inputs) if is_mean else loss.detach()
            window_loss = summed if window_loss is None else window_loss + summed
        return window_loss.item()  # the one host read per step
        ### END SOLUTION

    def evaluate(self, dataloader: Iterable[Any]) -> tuple[float, float]:
        """``(mean loss per sample, accuracy in [0, 1])`` over ``dataloader``.

        Runs in eval mode under ``no_grad`` and afterwards restores every module's
        previous mode. Accuracy compares the argmax of ``(N, C)`` outputs with
        integer targets (or with the argmax of one-hot targets); it is ``nan``
        when the outputs are not class scores. Both are Python floats (logs write
        them as JSON), added up on the device and read from it at the end, not per
        batch (on a GPU every read waits for the device). A loader that yields
        no batches raises ``ValueError`` saying it yielded no batches. Each batch's
        loss goes through ``self._reduce``, as in training: a mean counts its batch
        size times, a sum (``is_mean`` false) as it is.
        """
        _check_loader("dataloader", dataloader)
        modes = [(module, module.training) for module in self.model.modules()]
        self.model.eval()
        try:
            ### BEGIN SOLUTION
            loss_sum = correct = None  # device scalars: read once, at the end
            samples, classifier = 0, True
            with no_grad():
                for batch in dataloader:
                    inputs, targets = _pair(batch)
                    outputs = self.model(inputs)
                    loss, is_mean = self._reduce(self.loss_fn(outputs, targets))
                    summed = loss * len(inputs) if is_mean else loss
                    loss_sum = summed if loss_sum is None else loss_sum + summed
                    hits = _correct(outputs, targets) if classifier else None
                    classifier = hits is not None
                    if classifier:
                        correct = hits if correct is None else correct + hits
                    samples += len(inputs)
            if samples == 0:
                raise ValueError("evaluate: the data loader yielded no batches")
            accuracy = correct.item() / samples if classifier else math.nan
            return loss_sum.item() / samples, accuracy
            ### END SOLUTION
        finally:
            for module, training in modes:
                module.training = training

    # -- many epochs -------------------------------------------------------------------
    def fit(self, train_loader: Iterable[Any], val_loader: Iterable[Any] | None = None, epochs: int | None = None,
            callbacks: Sequence[Any] = (), accumulation_steps: int = 1, progress: bool | None = None,
            max_steps: int | None = None, eval_every: int | None = None, eval_batches: int | None = None) -> dict:
        """Train until ``self.epoch == epochs`` (1 without ``epochs`` or ``max_steps``), evaluating on
        ``val_loader`` after each epoch; or, with ``max_steps``, until ``self.step == max_steps``.

        A trainer restored from a checkpoint continues to the same target.
        ``callbacks`` are :class:`~tinytrain.callbacks.Callback` objects: after
        every history row (an epoch, or an evaluation) each one's
        ``on_epoch_end(trainer, logs)`` runs (one may set ``trainer.stop_training
        = True``), then each one's ``on_checkpoint``; ``logs`` holds ``epoch``,
        ``step``, ``lr``, ``train_loss``, ``eval_loss``, ``eval_accuracy``,
        ``grad_norm`` and ``seconds``. ``progress=None`` draws ``tqdm`` bars only
        in a terminal or a notebook.

        Steps: ``fit(train, val, max_steps=N, eval_every=M, eval_batches=B)`` reads
        the train loader as one stream of batches (a new ``iter()``, a new epoch,
        whenever one ends) and continues where the last ``fit`` or checkpoint left
        it, mid-epoch included. When ``self.step`` reaches a multiple of ``M``, and
        at ``N``, it appends a history row (the mean loss per sample since the last
        row) and evaluates: on all of ``val_loader``, or on its next ``B`` batches,
        the val loader read as a stream too (one without ``len()`` needs ``B``).
        A schedule must count steps then (``scheduler_interval="step"``).

        Returns ``history``. Every argument is checked before anything runs; a
        trainer already past its target trains nothing and warns (``UserWarning``).
        """
        _check_loader("train_loader", train_loader)
        if val_loader is not None:
            _check_loader("val_loader", val_loader)
        check_int("accumulation_steps", accumulation_steps, minimum=1)
        check_type("callbacks", callbacks, (list, tuple), "a list of callbacks")
        for i, callback in enumerate(callbacks):
            check_methods(f"callbacks[{i}]", callback, _CALLBACK_HOOKS, "a callback, such as a tt.callbacks.Callback")
        if max_steps is None:
            for name, value in (("eval_every", eval_every), ("eval_batches", eval_batches)):
                if value is not None:
                    raise ValueError(f"{name} belongs to fit(max_steps=...): an epoch of fit(epochs=...) is evaluated "
                                     f"on all of val_loader, got {name}={value!r} without max_steps")
            target = epochs = 1 if epochs is None else check_int("epochs", epochs, minimum=0)
            position, counter = self.epoch, "epochs"
        else:
            if epochs is not None:
                raise ValueError(f"fit takes epochs or max_steps, not both: got epochs={epochs!r}, max_steps={max_steps!r}")
            target = max_steps = check_int("max_steps", max_steps, minimum=0)
            eval_every = None if eval_every is None else check_int("eval_every", eval_every, minimum=1)
            eval_batches = None if eval_batches is None else check_int("eval_batches", eval_batches, minimum=1)
            if self.scheduler is not None and self.scheduler_interval != "step":
                raise ValueError("fit(max_steps=...) counts steps, but the schedule is set per epoch: create the "
                                 "Trainer with scheduler_interval='step' (and a schedule whose numbers count steps)")
            if val_loader is not None and eval_batches is None and not _has_len(val_loader):
                raise ValueError(f"val_loader (a {type(val_loader).__name__}) has no len(), so evaluating on all of it "
                                 "may never end: pass eval_batches=N to evaluate on N of its batches each time")
            position, counter = self.step, "max_steps"
        if position > target:
            unit = counter.removeprefix("max_").removesuffix("s")
            warnings.warn(f"fit({counter}={target}): the trainer is at {unit} {position}, past the target {target}; "
                          "nothing to train", UserWarning, stacklevel=2)
        progress = _progress_enabled() if progress is None else progress
        self._callbacks = tuple(callbacks)
        for key, callback in zip(callback_keys(self._callbacks), self._callbacks):
            state = self._pending["callbacks"].pop(key, None)
            if state is not None:
                callback.load_state_dict(state)
        if val_loader is not None:
            self._use_loader("val", val_loader, stream=eval_batches is not None)
        if max_steps is not None:
            self._use_loader("train", train_loader, stream=True)
        self.stop_training = False
        for callback in self._callbacks:
            callback.on_fit_begin(self)
        if max_steps is None:
            self._fit_epochs(train_loader, val_loader, epochs, accumulation_steps, progress)
        else:
            self._fit_steps(train_loader, val_loader, max_steps, eval_every, eval_batches, accumulation_steps, progress)
        for callback in self._callbacks:
            callback.on_fit_end(self)
        return self.history

    def _fit_epochs(self, train_loader: Iterable[Any], val_loader: Iterable[Any] | None, epochs: int,
                    accumulation_steps: int, progress: bool) -> None:
        """Epochs until ``self.epoch == epochs``, each evaluated on all of ``val_loader``."""
        bar = _progress(range(self.epoch, epochs), progress, desc="training", unit="epoch",
                        initial=self.epoch, total=epochs)
        # A notebook shows text bars one line each (it ignores the escape code that moves a nested bar up a
        # line): there the bar of epochs is the only one.
        batch_bars = progress and not _in_jupyter_kernel()
        for _ in bar:
            start = time.perf_counter()
            self.train_epoch(train_loader, accumulation_steps, batch_bars)
            self._end_row(val_loader, start, time.perf_counter() - start, bar)
            if self.stop_training:
                break
        if hasattr(bar, "close"):
            bar.close()

    def _fit_steps(self, train_loader: Iterable[Any], val_loader: Iterable[Any] | None, max_steps: int,
                   eval_every: int | None, eval_batches: int | None, accumulation_steps: int, progress: bool) -> None:
        """Steps until ``self.step == max_steps``, a history row and an evaluation at every multiple of
        ``eval_every`` (and at ``max_steps``)."""
        windows = _windows(_endless(train_loader, "train"), accumulation_steps)
        val_stream = None if val_loader is None or eval_batches is None else _endless(val_loader, "val")
        bar = _progress_bar(progress and self.step < max_steps, desc="training", unit="step", initial=self.step,
                            total=max_steps)
        while self.step < max_steps and not self.stop_training:
            until = max_steps if eval_every is None else min(max_steps, (self.step // eval_every + 1) * eval_every)
            start = time.perf_counter()
            self._train_windows(windows, until, bar)
            train_seconds = time.perf_counter() - start
            self._end_row(val_loader if val_stream is None else itertools.islice(val_stream, eval_batches), start,
                          train_seconds, bar)
        if bar is not None:
            bar.close()

    def _end_row(self, val_batches: Iterable[Any] | None, start: float, train_seconds: float, bar: Any) -> None:
        """Finish the history row that training has just appended: evaluate on ``val_batches`` (when
        given), record the row's seconds since ``start``, then the callbacks. Their ``logs`` also
        hold ``train_seconds``, the row's training alone (without the evaluation): what throughput
        (tokens or samples a second) is measured over."""
        eval_loss = accuracy = None
        if val_batches is not None:
            eval_loss, accuracy = self.evaluate(val_batches)
            self.history["eval_loss"].append(eval_loss)
            self.history["eval_accuracy"].append(accuracy)
        self.history["epoch_time"].append(time.perf_counter() - start)
        logs = {"epoch": self.epoch, "step": self.step, "lr": self.history["learning_rates"][-1],
                "train_loss": self.history["train_loss"][-1], "eval_loss": eval_loss, "eval_accuracy": accuracy,
                "grad_norm": self.history["grad_norm"][-1], "seconds": self.history["epoch_time"][-1],
                "train_seconds": train_seconds}
        for callback in self._callbacks:
            callback.on_epoch_end(self, logs)
        for callback in self._callbacks:  # every callback's state is final now: a checkpoint holds it
            callback.on_checkpoint(self, logs)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix({k: f"{v:.4g}" for k, v in logs.items() if k in ("train_loss", "eval_loss", "eval_accuracy") and v is not None})

    def _use_loader(self, role: str, loader: Any, stream: bool = False) -> None:
        """Remember ``loader`` for checkpoints; give it its saved position if a checkpoint was loaded.

        A ``stream`` (read across ``fit(max_steps=...)`` calls) continues where it
        stands even without a checkpoint: reloading its own state makes its next
        ``iter()`` finish an epoch left midway, as in a resumed run, not start a new one.
        """
        self._loaders[role] = loader
        state = self._pending["loaders"].pop(role, None)
        if state is None and stream and hasattr(loader, "state_dict"):
            state = loader.state_dict()
        if state is not None and hasattr(loader, "load_state_dict"):
            loader.load_state_dict(state)



# %% [markdown]
# Check the accumulation rule where it is hardest: 100 samples, so batches of 32
# with `k=3` form windows of 96 and 4 samples — which must give exactly the two
# steps that batches of 96 and 4 without accumulation give. The naive "divide by
# k" would weight the last window's 4 samples with 1/3 instead of 1/1.

# %%
rng = np.random.default_rng(0)
toy = TensorDataset(rng.standard_normal((100, 6)).astype(np.float32), rng.integers(0, 3, 100))


def toy_model():
    tt.manual_seed(0)  # the same initial weights every time
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


class RecordedLoss:
    """Cross-entropy that remembers each batch's mean loss and size."""

    reduction = "mean"

    def __init__(self):
        self.inner, self.batches = nn.CrossEntropyLoss(), []

    def __call__(self, outputs, targets):
        loss = self.inner(outputs, targets)
        self.batches.append((loss.item(), len(targets)))
        return loss


def one_epoch(batch_size, accumulation_steps):
    model = toy_model()
    loss_fn = RecordedLoss()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.5), loss_fn)
    loss = trainer.train_epoch(DataLoader(toy, batch_size=batch_size), accumulation_steps)
    return loss, [p.numpy() for p in model.parameters()], trainer, loss_fn.batches


# %% check=3
big_loss, big_weights, big_trainer, _ = one_epoch(96, 1)  # steps on 96 and on 4 samples
loss, weights, trainer, batches = one_epoch(32, 3)  # windows of 32+32+32 and of 4 samples
assert trainer.step == big_trainer.step == 2, (trainer.step, big_trainer.step)
assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(weights, big_weights)), "k=3 x 32 must equal 96 x 1"
assert abs(loss - big_loss) < 1e-6
per_sample = sum(mean * n for mean, n in batches) / sum(n for _, n in batches)
assert abs(loss - per_sample) < 1e-6, "the epoch loss is a mean per sample, not per batch"
assert abs(per_sample - np.mean([mean for mean, _ in batches])) > 1e-4
assert trainer.epoch == 1 and trainer.history["train_loss"] == [loss]
print("accumulation OK")

# %% [markdown]
# Next, the schedule: the optimizer must see `get_lr(e)` during **every step of**
# epoch `e` — a recording optimizer tells us what it saw. Then modes: a `Dropout`
# two levels down must be off during `evaluate` (so two evaluations agree) and
# every module must come back in the mode it had. Finally a loss that turns
# `nan` once: the step is skipped, the weights stay finite.

# %% check=2
seen = []


class RecordingSGD(optim.SGD):
    def step(self):
        seen.append(self.lr)
        super().step()


model = toy_model()
schedule = CosineSchedule(max_lr=0.4, min_lr=0.1, total_epochs=3)
trainer = Trainer(model, RecordingSGD(model.parameters(), lr=1.0), nn.CrossEntropyLoss(), scheduler=schedule)
trainer.fit(DataLoader(toy, batch_size=50, shuffle=True, seed=0), epochs=4, progress=False)
expected = [schedule.get_lr(e) for e in range(4)]
assert seen == [lr for lr in expected for _ in range(2)], f"the optimizer saw {seen}"
assert trainer.history["learning_rates"] == expected and trainer.epoch == 4 and trainer.step == 8
print("learning rate per epoch OK")

# %% check=2
model = nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 3)))
trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
loader = DataLoader(toy, batch_size=32)
model.train()
first, second = trainer.evaluate(loader), trainer.evaluate(loader)
assert first == second, "a nested Dropout must be off in evaluate"
assert all(m.training for m in model.modules()), "evaluate must restore training mode everywhere"
model[1].eval()  # a mixed state is restored as it was, too
trainer.evaluate(loader)
assert [m.training for m in model.modules()] == [True, True, False, False, False]
loss, accuracy = first
assert loss > 0 and 0.0 <= accuracy <= 1.0
print("evaluate and modes OK")


# %% check=1
class NanOnce:
    reduction = "mean"

    def __init__(self):
        self.calls = 0

    def __call__(self, outputs, targets):
        self.calls += 1
        loss = nn.CrossEntropyLoss()(outputs, targets)
        return loss * float("nan") if self.calls == 2 else loss


model = toy_model()
trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanOnce(), grad_clip_norm=1.0)
trainer.train_epoch(DataLoader(toy, batch_size=25))
assert trainer.skipped_steps == 1 and trainer.step == 3 and trainer.history["skipped_steps"] == [1]
assert all(np.isfinite(p.numpy()).all() for p in model.parameters()), "nan must never reach the weights"
model = toy_model()
strict = Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanOnce(), on_nonfinite="raise")
try:
    strict.train_epoch(DataLoader(toy, batch_size=25))
except FloatingPointError as error:
    print("raised:", error)
else:
    raise AssertionError("on_nonfinite='raise' must stop with FloatingPointError")
print("non-finite losses OK")

# %% [markdown]
# ## 4. Training for a number of steps
#
# An epoch is the natural unit when a model sees its data many times. A
# language model does not: Tiny Shakespeare's million characters make a million
# training windows (Module 08), and a run of 2,000 steps of 12 windows reads
# 2% of them. Its budget is a number of optimizer **steps**, its schedule counts
# steps, and it is evaluated every few hundred steps on held-out text. nanoGPT's
# character model on a CPU, for instance:
#
# | | |
# |---|---|
# | steps | 2,000, each on 12 windows of 64 characters |
# | rate | 100 warm-up steps up to $10^{-3}$, then a cosine down to $10^{-4}$ at step 2,000 |
# | optimizer | AdamW, betas (0.9, 0.99), weight decay 0.1 on the matrices only (Module 07) |
# | clipping | global norm 1.0 |
# | evaluation | every 250 steps, on 20 batches of held-out text (the last 10%) |
#
# The rate before optimizer step $t$ (counted from 0: the steps taken so far) is
# `get_lr(t)` of section 1, with $W = 100$ and $T = 2000$ steps:
#
# $$\eta_t = \begin{cases} \eta_{\max}\,\dfrac{t + 1}{W + 1} & t < W\\[4pt]
# \eta_{\min} + \dfrac{\eta_{\max} - \eta_{\min}}{2}\left(1 + \cos\dfrac{\pi (t - W)}{T - W}\right) & W \le t \le T\\[4pt]
# \eta_{\min} & t > T \end{cases}$$
#
# With our Trainer (given code, on top of the methods you wrote):
#
# ```python
# trainer = Trainer(model, optim.AdamW(optim.weight_decay_groups(model.parameters(), 0.1), lr=1e-3, betas=(0.9, 0.99)),
#                   loss_fn, scheduler=CosineSchedule(1e-3, 1e-4, total_epochs=2000, warmup_epochs=100),
#                   scheduler_interval="step", grad_clip_norm=1.0)
# trainer.fit(train_loader, val_loader, max_steps=2000, eval_every=250, eval_batches=20)
# ```
#
# * `scheduler_interval="step"` sets the rate to `get_lr(trainer.step)` before
#   every step. A skipped step (a non-finite loss) is not counted, so the next
#   window trains at the same rate.
# * `fit(max_steps=N, eval_every=M)` reads the train loader as one stream of
#   batches: when an epoch ends, the next starts, unseen by the loop. When
#   `trainer.step` reaches a multiple of `M`, and at `N`, it appends a
#   `history` row — the mean loss per sample of the steps since the last row,
#   the evaluation, and `history["step"]` — and calls the callbacks, so a
#   checkpoint (Module 10) can be taken mid-run.
# * `eval_batches=B` evaluates on the next `B` batches of `val_loader`, read as a
#   stream too; without it, on all of it. (To evaluate on the same batches every
#   time, give a val loader of just those batches.)
# * A second `fit`, or a run resumed from a checkpoint, continues both streams
#   where they stood — mid-epoch included — so a run stopped at step 1,200 and
#   continued ends bit for bit where the uninterrupted run does.
#
# Check it on the toy data: 7 steps of 25 samples cross an epoch of 4 batches.

# %% check=2
seen.clear()
model = toy_model()
schedule = CosineSchedule(max_lr=0.4, min_lr=0.1, total_epochs=6, warmup_epochs=2)
trainer = Trainer(model, RecordingSGD(model.parameters(), lr=1.0), nn.CrossEntropyLoss(), scheduler=schedule,
                  scheduler_interval="step")
history = trainer.fit(DataLoader(toy, batch_size=25, shuffle=True, seed=0), DataLoader(toy, batch_size=50),
                      max_steps=7, eval_every=3, progress=False)
assert seen == [schedule.get_lr(t) for t in range(7)], f"step t trains at get_lr(t); the optimizer saw {seen}"
assert history["step"] == [3, 6, 7] and len(history["eval_loss"]) == 3 and trainer.step == 7
assert history["learning_rates"] == [seen[2], seen[5], seen[6]], "a row records the rate of its last step"
print("training by steps OK")

# %% [markdown]
# ## 5. Systems: what training costs in memory
#
# Inference needs the weights. Training keeps, between steps, the weights, **one
# gradient per weight**, and the optimizer's state: nothing for plain SGD, one
# velocity per weight with momentum, two moments per weight for Adam. So
# training needs about 2x (SGD), 3x (momentum) or 4x (Adam) the model's size —
# before the activations that the backward pass needs, which grow with the batch
# (Rajbhandari et al., *ZeRO*, 2020, count 16 bytes per parameter for mixed-
# precision Adam). `memory_report` measures the real arrays: the parameters' and
# gradients' `nbytes`, and every array in `optimizer.state_dict()`. Gradients
# exist after a backward pass and Adam creates its moments at its first step, so
# measure after one step.

# %% export="training"
def _array_bytes(value: Any) -> int:
    """Total ``nbytes`` of the tensors and arrays in a nest of dicts and lists."""
    if isinstance(value, Tensor):
        return value.data.nbytes
    if isinstance(value, dict):
        return sum(_array_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_array_bytes(item) for item in value)
    return int(getattr(value, "nbytes", 0))  # NumPy and device arrays; 0 for Python numbers


def memory_report(model: Any, optimizer: Any) -> dict[str, int | float]:
    """Bytes that training holds between steps, measured on the arrays as they are now.

    Returns ``parameters``, ``gradients`` (the ``.grad`` arrays that exist),
    ``optimizer_state`` (every array in ``optimizer.state_dict()``), their
    ``total`` (each an int), and ``ratio = total / parameters`` (a float).
    Activations, which depend on the batch and are freed by ``backward``, are not
    included.
    """
    parameters = model.parameters()
    ### BEGIN SOLUTION
    report = {
        "parameters": sum(p.data.nbytes for p in parameters),
        "gradients": sum(p.grad.data.nbytes for p in parameters if p.grad is not None),
        "optimizer_state": _array_bytes(optimizer.state_dict()),
    }
    ### END SOLUTION
    report["total"] = report["parameters"] + report["gradients"] + report["optimizer_state"]
    report["ratio"] = report["total"] / max(report["parameters"], 1)
    return report


# %% [markdown]
# Measure it on the MLP of this course's first milestone (784-256-128-10,
# about 235,000 parameters), after one training step with each optimizer:

# %%
def milestone_mlp():
    tt.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


one_batch = [(tt.randn(64, 784), tt.tensor(np.random.default_rng(0).integers(0, 10, 64)))]
reports = {}
for name, make in [("SGD", lambda p: optim.SGD(p, lr=0.1)),
                   ("SGD + momentum", lambda p: optim.SGD(p, lr=0.1, momentum=0.9)),
                   ("Adam", lambda p: optim.Adam(p, lr=1e-3))]:
    mlp = milestone_mlp()
    opt = make(mlp.parameters())
    Trainer(mlp, opt, nn.CrossEntropyLoss()).train_epoch(one_batch)
    reports[name] = memory_report(mlp, opt)
print(f"{'optimizer':16s} {'params':>9s} {'grads':>9s} {'state':>9s} {'total':>9s}  x model")
for name, r in reports.items():
    kib = [r[k] / 1024 for k in ("parameters", "gradients", "optimizer_state", "total")]
    print(f"{name:16s} " + " ".join(f"{v:7.0f}Ki" for v in kib) + f"  {r['ratio']:.2f}")

# %% check=1
adam = reports["Adam"]
params = milestone_mlp().parameters()
assert adam["parameters"] == sum(p.size for p in params) * 4, "float32: 4 bytes per parameter"
assert adam["gradients"] == adam["parameters"]
assert 2 * adam["parameters"] <= adam["optimizer_state"] <= 2 * adam["parameters"] + 1024, "Adam: two moments"
assert reports["SGD"]["optimizer_state"] < 1024 and abs(reports["SGD + momentum"]["ratio"] - 3) < 0.01
assert abs(adam["ratio"] - 4) < 0.01
print("memory_report OK")

# %% [markdown]
# ## 6. Training a digit classifier
#
# Everything together, on the real 8x8 handwritten digits that ship with the
# package: an MLP with dropout, AdamW, a cosine schedule with one warmup epoch
# and clipping. `plot_history` draws the loss curves, the accuracy and the
# learning rate. (Module 10 adds checkpoints of the best epoch and a CSV log.)

# %% export="training"
def plot_history(history: dict[str, list], path: Any = None) -> Any:
    """Plot losses (train, eval), eval accuracy and learning rate per epoch, side by side.

    Returns the matplotlib ``Figure``; with ``path`` it is also saved there (and
    closed). Needs matplotlib (``pip install matplotlib``).
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot_history needs matplotlib: pip install matplotlib") from None
    fig, (loss_ax, accuracy_ax, lr_ax) = plt.subplots(1, 3, figsize=(13, 3.6))
    for key, label in (("train_loss", "train"), ("eval_loss", "eval")):
        if history.get(key):
            loss_ax.plot(range(1, len(history[key]) + 1), history[key], marker=".", label=label)
    loss_ax.set(title="loss per sample", xlabel="epoch")
    loss_ax.legend()
    if history.get("eval_accuracy"):
        accuracy = history["eval_accuracy"]
        accuracy_ax.plot(range(1, len(accuracy) + 1), accuracy, marker=".", color="tab:green")
    else:
        accuracy_ax.text(0.5, 0.5, "no evaluation", ha="center", va="center", transform=accuracy_ax.transAxes)
    accuracy_ax.set(title="eval accuracy", xlabel="epoch")
    rates = history.get("learning_rates", [])
    lr_ax.plot(range(1, len(rates) + 1), rates, marker=".", color="tab:red")
    lr_ax.set(title="learning rate", xlabel="epoch")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


# %%
train_set, test_set = Digits(train=True), Digits(train=False)
print(f"{len(train_set)} training and {len(test_set)} test images of shape {train_set[0][0].shape}")
tt.manual_seed(0)
digits_model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10))
epochs = 20
digits_trainer = Trainer(
    digits_model,
    optim.AdamW(digits_model.parameters(), lr=3e-3, weight_decay=1e-4),
    nn.CrossEntropyLoss(),
    scheduler=CosineSchedule(max_lr=3e-3, min_lr=1e-4, total_epochs=epochs, warmup_epochs=1),
    grad_clip_norm=5.0,
)
history = digits_trainer.fit(DataLoader(train_set, batch_size=64, shuffle=True), DataLoader(test_set, batch_size=256),
                             epochs=epochs)
print(f"test accuracy after {epochs} epochs: {history['eval_accuracy'][-1]:.3f} "
      f"(best {max(history['eval_accuracy']):.3f}); {sum(history['epoch_time']):.1f} s in all")
plot_history(history)
plt.show()

# %% [markdown]
# ### How much does the Trainer cost?
#
# The Trainer adds bookkeeping to every step: the window, the weighting, one
# host read of the loss. Compare one epoch with a bare loop that does only
# forward, backward and step:

# %%
def bare_epoch(model, opt, loss_fn, loader):
    for inputs, targets in loader:
        model.zero_grad()
        loss_fn(model(inputs), targets).backward()
        opt.step()


loader = DataLoader(train_set, batch_size=64, shuffle=True, seed=0)
runs = {}
for name in ("bare loop", "Trainer"):
    tt.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt, loss_fn = optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss()
    if name == "bare loop":
        runs[name] = lambda loader, m=model, o=opt, f=loss_fn: bare_epoch(m, o, f, loader)
    else:
        runs[name] = Trainer(model, opt, loss_fn).train_epoch
timings = {name: math.inf for name in runs}
for _ in range(4):  # alternate, keep each one's best epoch: less noise from the machine
    for name, run in runs.items():
        start = time.perf_counter()
        run(loader)
        timings[name] = min(timings[name], (time.perf_counter() - start) / len(loader))
for name, seconds in timings.items():
    print(f"{name:10s} {seconds * 1e6:7.0f} µs per step")
print(f"Trainer overhead: {100 * (timings['Trainer'] / timings['bare loop'] - 1):+.0f}%")

# %% [markdown]
# ## How PyTorch does it
#
# * Schedules live in `torch.optim.lr_scheduler` (`CosineAnnealingLR`,
#   `CosineAnnealingWarmRestarts`, `StepLR`, `ExponentialLR`, `LinearLR` +
#   `SequentialLR` for warmup). They are *stateful*: construction sets epoch 0's
#   rate and you call `scheduler.step()` once after each epoch. Correct when done
#   exactly so — calling it at the start of the epoch, or per batch by mistake,
#   shifts or compresses the schedule, and nothing warns you.
# * `torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False)`
#   returns the total norm before clipping, like ours.
# * Accumulation is left to you; the documented recipe divides the loss by the
#   number of accumulation steps, which is right only when all micro-batches
#   have the same size.
# * `model.train()` / `model.eval()` propagate as ours do; `torch.no_grad()` and
#   `torch.inference_mode()` turn off graph recording.
# * Per-step schedules: PyTorch's `scheduler.step()` called after every
#   `optimizer.step()` instead of every epoch; PyTorch Lightning's
#   `{"interval": "step"}`. Training by steps: Lightning's
#   `Trainer(max_steps=..., val_check_interval=..., limit_val_batches=...)`, the
#   models for our `max_steps`, `eval_every` and `eval_batches`.
# * PyTorch Lightning's `Trainer` (`accumulate_grad_batches`, `gradient_clip_val`)
#   and Keras' `Model.fit` are the models for ours.
#
# ## Summary
#
# * `get_lr(e)` is the rate for all of epoch `e`, set *before* the epoch; cosine
#   annealing with warmup, warm restarts, step, exponential and inverse-sqrt
#   schedules are a few lines each.
# * Clip by the **global** norm (direction kept), return the pre-clip norm, and
#   never step on a non-finite gradient or loss.
# * Accumulate the gradient of the **mean over the window's samples**: weight each
#   micro-batch by `n_b / n`. Report losses per sample.
# * `evaluate` = eval mode + `no_grad` + restore the previous modes.
# * Training holds 2-4x the model's size between steps; the Trainer's own
#   bookkeeping costs a few percent of a step.
# * Language models train for a number of steps: a schedule over steps
#   (`scheduler_interval="step"`), `fit(max_steps=..., eval_every=...)`, and
#   loaders read as streams that resume mid-epoch.
