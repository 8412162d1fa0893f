# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 13 — Scale: gradient checkpointing, mixed precision, data parallelism
#
# *One sitting, about 2 hours: the lesson, 5 functions to write, and the measurements.*
#
# The milestone MLP fits in a few megabytes. Real models do not: a model
# outgrows its memory (activations, weights, optimizer state) long before it
# outgrows your patience, and then it outgrows one machine. This module builds
# the three techniques practitioners reach for first, each as a trade:
#
# | technique | saves | pays with |
# |---|---|---|
# | gradient checkpointing | activation memory, $O(L) \to O(\sqrt{L})$ | one extra forward pass |
# | mixed precision (float16) | activation memory and bandwidth, 2x | rounding; a loss scale to keep small gradients alive |
# | data parallelism (MPI) | wall-clock time per epoch | one all-reduce of the gradients per step |
#
# **You will**
# 1. count, for each technique, the bytes it saves (the memory arithmetic);
# 2. write `checkpoint(fn, *inputs)`: run a segment without keeping its
#    activations, and recompute it — with the *same random numbers* — during
#    backward; then measure the peak memory of a deep MLP with `tracemalloc`;
# 3. write a `GradScaler` that grows the loss scale after a run of clean steps
#    and halves it (skipping the step) on overflow, and train Digits in
#    `"16-mixed"` precision with float32 master weights;
# 4. shard a dataset across ranks and average gradients with an all-reduce, and
#    run `mpirun -n 2 python milestones/mlp.py --distributed`;
# 5. see how PyTorch names the same things: `torch.utils.checkpoint`,
#    `torch.amp.GradScaler`, `DistributedDataParallel`.

# %%
import math
import tracemalloc

import numpy as np

import tinytrain as tt
from tinytrain import nn
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.datasets import Digits

# %% [markdown]
# ## 1. Where the memory goes
#
# Training a network of $L$ layers, each of width $d$, on a batch of $B$
# samples holds four kinds of arrays (float32: 4 bytes a number):
#
# * **weights** $\approx L d^2$ numbers, **gradients** the same;
# * **optimizer state**: SGD with momentum one more copy, Adam two;
# * **activations**: every operation keeps what its backward needs — a Linear
#   layer its input ($B d$), a ReLU its output ($B d$): about $2 B d$ numbers
#   *per layer*, $2 L B d$ in all, kept from the forward pass until backward
#   reaches that layer.
#
# Weights do not depend on the batch; activations grow with it. For a
# 32-layer MLP of width 256 at batch 1,024: weights $32 \cdot 256^2 \cdot 4$ B
# = 8 MiB, activations $2 \cdot 32 \cdot 1024 \cdot 256 \cdot 4$ B = 64 MiB.
# Activations dominate — and they are what checkpointing and float16 shrink.

# %%
def activation_bytes(layers: int, batch: int, width: int, itemsize: int = 4) -> int:
    """Bytes of activations an MLP of Linear+ReLU layers keeps for backward."""
    return 2 * layers * batch * width * itemsize


print(f"weights     {32 * 256 * 256 * 4 / 2**20:6.1f} MiB")
print(f"activations {activation_bytes(32, 1024, 256) / 2**20:6.1f} MiB")

# %% [markdown]
# ## 2. Gradient checkpointing
#
# Cut the network into $k$ segments. In the forward pass, run each segment
# under `no_grad`: nothing inside it is kept, only its input. In the backward
# pass, when the gradient reaches the end of a segment, run that segment's
# forward again — this time recording the graph — and backpropagate through the
# fresh graph. Memory: the $k$ segment inputs plus one segment's activations,
# $k + L/k$ layers' worth instead of $L$; the best $k = \sqrt{L}$ gives
# $2\sqrt{L}$ (Chen et al. 2016, *Training Deep Nets with Sublinear Memory
# Cost*). Time: one more forward pass, about a third more compute.
#
# One trap: a segment that draws random numbers (dropout) must draw **the
# same** numbers when it is recomputed, or the gradient belongs to a different
# network than the loss. So the forward saves the random state of every
# generator, and the recompute restores it — and afterwards puts back the state
# the rest of training is at. The same goes for a module's *buffers*: BatchNorm
# updates its running statistics on every training-mode forward, so a
# checkpointed module gets its buffers put back after the recompute — otherwise
# every step would count its batch twice.
#
# `Recompute` is a `Function` (Module 02) whose forward runs `function` under
# `no_grad` and whose backward re-runs it with gradients on. Tensors that
# `function` uses without taking them as inputs — a layer's weights — are
# leaves of the recomputed graph, so the inner `backward` adds their gradients
# directly into their `.grad`. An always-on *anchor* input makes sure the
# checkpoint is recorded even when none of the inputs needs a gradient (the
# first segment gets the data, but its weights still do).

# %% export="nn/checkpointing"
"""Gradient checkpointing: trade one extra forward pass for activation memory.

``checkpoint(fn, *inputs)`` runs ``fn`` without recording its graph, keeping
only its inputs and the random state; during backward it runs ``fn`` again with
the graph recorded and the random state restored (so dropout draws the same
masks) and backpropagates through that. ``Checkpoint(module)`` is the layer form.
"""
from typing import Any, Callable

from tinytrain import autograd
from tinytrain.autograd import Function, no_grad
from tinytrain.serialization import capture_rng_state, restore_rng_state
from tinytrain.nn.module import Module
from tinytrain.tensor import Tensor


class _enable_grad:
    """Record the graph inside, whatever the mode outside (backward may run under ``no_grad``)."""

    def __enter__(self) -> None:
        self._previous = autograd._grad_enabled
        autograd._grad_enabled = True

    def __exit__(self, *exc_info: Any) -> None:
        autograd._grad_enabled = self._previous


class Recompute(Function):
    """A checkpointed segment: forward keeps no activations, backward recomputes them."""

    def forward(self, *arrays: Any, function: Callable[..., Tensor], count: int) -> Any:
        """Run ``function`` on the first ``count`` arrays (the rest is the anchor) under
        ``no_grad``; remember ``function`` and every generator's state for the recompute.
        A function that returns anything but one Tensor raises ``TypeError`` naming the
        type it returned (``tuple``, say)."""
        ### BEGIN SOLUTION
        self.function = function
        self.rng = capture_rng_state()
        with no_grad():
            out = function(*[Tensor._make(array, self.backend) for array in arrays[:count]])
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: the function must return one Tensor, got {type(out).__name__}")
        return out.data
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        """Recompute the segment with the saved random state (then put the current state
        back, even if the function raises), backpropagate ``grad`` through it, return the
        inputs' gradients (None for the anchor: it never gets a ``.grad``).

        ``grad`` is the output's gradient as a bare array: the recomputed output's
        ``backward`` takes it in the output's dtype.

        The recompute records its graph even when backward runs under ``no_grad``
        (``_enable_grad``), and runs on fresh leaves holding the inputs' arrays
        (``Tensor._make(t.data, t._backend, t.requires_grad)``): on the input tensors
        themselves, the inner backward would run on into the outer graph, which the
        outer backward then reaches a second time.

        The recomputed output may need no gradient at all: a frozen segment (no parameter
        requires grad) fed by data gets its node from the anchor alone. Then there is
        nothing to backpropagate (``backward`` on it raises): return None for every input."""
        ### BEGIN SOLUTION
        inputs = [Tensor._make(t.data, t._backend, t.requires_grad) for t in self.inputs[:-1]]
        now = capture_rng_state()
        restore_rng_state(self.rng)
        try:
            with _enable_grad():
                out = self.function(*inputs)
        finally:
            restore_rng_state(now)
        if out.requires_grad:
            out.backward(Tensor._make(grad, out._backend))
        return tuple(None if t.grad is None else t.grad.data for t in inputs) + (None,)
        ### END SOLUTION


_anchors: dict[Any, Tensor] = {}  # backend -> a scalar that requires grad


def _recompute_keeps_buffers(module: Module) -> Callable[..., Tensor]:
    """``module`` as a function whose second and later runs (the recompute) put its buffers back.

    Only the first run, the real forward, may change running statistics.
    """
    runs = 0

    def run(*inputs: Tensor) -> Tensor:
        nonlocal runs
        runs += 1
        if runs == 1:
            return module(*inputs)
        buffers = [buffer for buffer in module.buffers() if buffer is not None]
        saved = [buffer.data.copy() for buffer in buffers]
        try:
            return module(*inputs)
        finally:
            for buffer, value in zip(buffers, saved):
                buffer.data[...] = value

    return run


def checkpoint(function: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
    """``function(*inputs)`` (one Tensor out) without keeping the activations inside it.

    The segment runs again during backward, with the random state it first ran
    with. Gradients reach the inputs and every tensor ``function`` uses (its
    parameters) as if it had run normally. A Module's buffers (BatchNorm's running
    statistics) change once, in the forward, not again in the recompute. Under
    ``no_grad`` it is just a call.
    """
    if not inputs or not all(isinstance(t, Tensor) for t in inputs):
        raise TypeError(f"checkpoint(fn, *inputs): inputs must be one or more Tensors, got "
                        f"{[type(t).__name__ for t in inputs]}")
    if not autograd._grad_enabled:
        return function(*inputs)
    backend = inputs[0]._backend
    anchor = _anchors.get(backend)
    if anchor is None:
        anchor = _anchors[backend] = Tensor._make(backend.xp.zeros((), dtype="float32"), backend, True)
    if isinstance(function, Module):
        function = _recompute_keeps_buffers(function)
    return Recompute.apply(*inputs, anchor, function=function, count=len(inputs))


class Checkpoint(Module):
    """Wraps ``module`` so that its forward is checkpointed (its parameters are
    registered under ``module.``; its buffers change once per forward, as without it)."""

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs: Tensor) -> Tensor:
        return checkpoint(self.module, *inputs)

    def __repr__(self) -> str:
        return f"Checkpoint({self.module!r})"


# %% check=2
def _segment_check():
    tt.manual_seed(0)
    block = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Dropout(0.5), nn.Linear(7, 3))
    for p in block.parameters():
        p.data = p.data.astype(np.float64)
    x = tt.tensor(np.random.default_rng(1).standard_normal((4, 5)), dtype="float64", requires_grad=True)
    grads = []
    for wrap in (False, True):
        tt.manual_seed(5)
        block.zero_grad(); x.grad = None
        out = checkpoint(block, x) if wrap else block(x)
        (out * out).sum().backward()
        grads.append([x.grad.numpy()] + [p.grad.numpy() for p in block.parameters()])
    for plain, ckpt in zip(*grads):
        assert np.array_equal(plain, ckpt), "checkpointed gradients differ from plain ones (dropout masks?)"
    # the graph holds no activations of the segment: its output's node is the checkpoint itself
    out = checkpoint(block, x)
    assert type(out._ctx).__name__ == "Recompute", type(out._ctx)
    assert checkpoint(lambda t: t * 2.0, x).requires_grad


_segment_check()
print("checkpoint OK")

# %% [markdown]
# ### Measure it
#
# NumPy reports its allocations to Python's `tracemalloc`, so the peak of
# traced memory during one forward and backward pass is the activation memory
# (the weights were allocated before tracing started). Below: a 32-layer MLP,
# plain and with every block of 4 layers checkpointed ($k = 8$ segments).

# %%
def deep_mlp(depth: int, width: int, checkpointed_every: int = 0) -> nn.Module:
    tt.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
    if checkpointed_every:
        layers = [nn.Checkpoint(nn.Sequential(*layers[i:i + checkpointed_every]))
                  for i in range(0, depth, checkpointed_every)]
    return nn.Sequential(*layers)


def peak_training_bytes(model: nn.Module, x: tt.Tensor) -> int:
    tracemalloc.start()
    model(x).sum().backward()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    model.zero_grad()
    return peak


x = tt.randn(512, 256)
plain = peak_training_bytes(deep_mlp(32, 256), x)
ckpt = peak_training_bytes(deep_mlp(32, 256, checkpointed_every=4), x)
print(f"plain {plain / 2**20:.1f} MiB, checkpointed {ckpt / 2**20:.1f} MiB: {1 - ckpt / plain:.0%} lower peak")

# %% [markdown]
# `benchmarks/checkpointing_memory.py` runs the same measurement (and the time
# it costs) from the command line.
#
# ## 3. Mixed precision
#
# float16 has 5 exponent bits and 10 mantissa bits: it holds numbers from about
# $6 \cdot 10^{-8}$ (smallest subnormal) to 65,504, with about 3 decimal digits.
# Two things go wrong when a whole training run uses it:
#
# 1. **Updates vanish.** $w + \eta g$ with $w = 1$ and $\eta g = 10^{-4}$ rounds
#    back to 1 in float16 (its spacing near 1 is $2^{-10} \approx 10^{-3}$).
#    So the weights and the optimizer state stay float32 (*master weights*);
#    each step the forward and backward use float16 *copies*.
# 2. **Small gradients underflow** to zero. So the loss is multiplied by a
#    *scale* $S$ (say $2^{16}$) before backward — every gradient is $S$ times
#    larger and clear of the underflow — and the gradients are divided by $S$
#    in float32 before the step. If $S$ was too large, some gradient is inf or
#    nan: skip that step and halve $S$. After $N$ clean steps in a row, double
#    $S$. This is *dynamic loss scaling* (Micikevicius et al. 2018,
#    *Mixed Precision Training*).
#
# Memory per parameter: 4 (master) + 2 (compute copy) + 4 (gradient, float32)
# + 4·k (optimizer state) bytes — a little *more* than float32 training for the
# weights; the saving is in the activations (2 bytes instead of 4) and in
# memory bandwidth, which on a GPU with tensor cores also means 2-16x faster
# matrix products. On a CPU, NumPy has no fast float16 matmul: here we learn
# the method, not the speed.

# %%
with np.errstate(over="ignore"):
    print("1 + 1e-4 in float16:", np.float16(1) + np.float16(1e-4))
    print("1e-8 in float16:", np.float16(1e-8), "  70000 in float16:", np.float16(70000))

# %% export="amp"
"""Mixed precision: float16 compute, float32 master weights, dynamic loss scaling.

:class:`GradScaler` holds the loss scale: the loss is multiplied by it before
backward, the gradients divided by it before the step, which is skipped (and the
scale halved) when a gradient overflowed; after ``growth_interval`` clean steps
in a row the scale doubles. :class:`MixedPrecision` is what
``Trainer(precision="16-mixed")`` uses: it casts the weights to float16 copies
for the forward and backward, and back to the float32 masters for the step.
"""
from typing import Any, Iterable

import numpy as np

from tinytrain.autograd import Function
from tinytrain.tensor import Tensor

PRECISIONS = ("32-true", "16-mixed")
# Below float16's smallest step (2**-24) the scaled gradients are zero or still overflow: the run
# is dead, and halving on would reach 0.0 (then 1 / scale fails) after about 1,100 more steps.
MIN_LOSS_SCALE = 2.0 ** -24


class GradScaler:
    """Dynamic loss scaling.

    ``scale`` starts at ``init_scale``. :meth:`update` after every step: an
    overflow multiplies it by ``backoff_factor`` and restarts the count of clean
    steps; ``growth_interval`` clean steps in a row multiply it by
    ``growth_factor``.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError(
                f"GradScaler needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                f"growth_interval >= 1; got {init_scale}, {growth_factor}, {backoff_factor}, {growth_interval}")
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.clean_steps = 0  # clean steps since the scale last changed
        self.skipped_steps = 0

    def update(self, found_inf: bool) -> None:
        """Adjust the scale after a step: back off on overflow, grow after a run of clean steps.

        On overflow (``found_inf``): multiply ``scale`` by ``backoff_factor`` (however
        small it gets: below ``MIN_LOSS_SCALE`` MixedPrecision stops the run), restart
        ``clean_steps`` at 0 and count the skipped step in ``skipped_steps``. Otherwise
        count a clean step; the ``growth_interval``-th in a row multiplies ``scale``
        by ``growth_factor`` and restarts the count.
        """
        ### BEGIN SOLUTION
        if found_inf:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped_steps += 1
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale *= self.growth_factor
                self.clean_steps = 0
        ### END SOLUTION

    def unscale_(self, parameters: Iterable[Tensor]) -> bool:
        """Divide every gradient by the scale, in float32 and in place; whether one
        is inf or nan (``found_inf``: then the step must be skipped)."""
        inverse = 1.0 / self.scale
        finite = {}  # backend -> whether its gradients so far are all finite, kept on the device
        for p in parameters:
            if p.grad is None:
                continue
            backend = p.grad._backend
            grad = p.grad.data.astype(p.dtype) * inverse  # the parameter's (master) dtype
            p.grad = Tensor._make(grad, backend)
            clean = backend.xp.isfinite(grad).all()
            finite[backend] = backend.xp.logical_and(finite[backend], clean) if backend in finite else clean
        # One read per device, not per gradient: on a GPU every read back waits for all queued work.
        return not all(bool(backend.to_host(clean)) for backend, clean in finite.items())

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped_steps": self.skipped_steps,
                "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval}

    def load_state_dict(self, state: dict) -> None:
        """Restore the scale, the step counts and the settings that :meth:`state_dict` saved.

        The settings come back too, as in PyTorch: a resumed run grows and backs off as the
        saved one did (with this scaler's own growth_interval, a count of clean steps
        saved under a shorter one would never reach it again). Checked before anything
        changes: bad settings, or a count outside ``[0, growth_interval)``, raise ``ValueError``.
        """
        settings = {name: state.get(name, getattr(self, name))
                    for name in ("growth_factor", "backoff_factor", "growth_interval")}
        loaded = GradScaler(float(state["scale"]), **settings)  # checks the settings
        loaded.clean_steps, loaded.skipped_steps = int(state["clean_steps"]), int(state.get("skipped_steps", 0))
        if not 0 <= loaded.clean_steps < loaded.growth_interval or loaded.skipped_steps < 0:
            raise ValueError(f"GradScaler state: clean_steps must lie in [0, growth_interval={loaded.growth_interval}) "
                             f"and skipped_steps be >= 0; got {loaded.clean_steps} and {loaded.skipped_steps}")
        vars(self).update(vars(loaded))

    def __repr__(self) -> str:
        return f"GradScaler(scale={self.scale:g}, clean_steps={self.clean_steps}/{self.growth_interval})"


class ScaleGrad(Function):
    """The identity in the forward pass; multiplies the gradient by ``scale`` in backward.

    The Trainer reports the loss it sees (unscaled) while backward runs on
    ``scale * loss``."""

    def forward(self, a: Any, scale: float) -> Any:
        self.scale = scale
        return a.copy()

    def backward(self, grad: Any) -> tuple:
        return (grad * grad.dtype.type(self.scale),)


class MixedPrecision:
    """The Trainer's ``precision="16-mixed"``: float16 compute copies of the weights,
    float32 master weights, gradients and optimizer state, dynamic loss scaling.

    It plugs into the Trainer's two extension points (Module 09): the Trainer's
    ``_batch_loss`` calls :meth:`forward_loss` for every training batch, and its
    ``_take_step`` calls :meth:`before_step` before every step. Per optimizer
    step: the first :meth:`forward_loss` replaces every float32 parameter's data
    with a float16 copy (keeping the master), casts the inputs to float16,
    computes the loss in float32 and scales its gradient; :meth:`before_step`
    puts the masters back, unscales the gradients into float32 and returns
    whether the step may be taken (no overflow). A step whose batches did not
    go through :meth:`forward_loss` would be a silent float32 step: it raises.
    """

    name = "precision"

    def __init__(self, precision: str = "16-mixed", scaler: GradScaler | None = None,
                 compute_dtype: Any = "float16") -> None:
        if precision != "16-mixed":
            raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
        self.precision = precision
        self.scaler = GradScaler() if scaler is None else scaler
        self.compute_dtype = np.dtype(compute_dtype)
        self._masters: list | None = None  # [(parameter, float32 data)] while the copies are in place

    def setup(self, trainer: Any) -> None:
        pass

    def _to_compute(self, model: Any) -> None:
        self._masters = [(p, p.data) for p in model.parameters() if p.dtype == np.float32]
        for p, master in self._masters:
            p.data = master.astype(self.compute_dtype)

    def _to_master(self) -> None:
        for p, master in self._masters or ():
            p.data = master
        self._masters = None

    def forward_loss(self, model: Any, loss_fn: Any, inputs: Any, targets: Any) -> Tensor:
        """``loss_fn(model(inputs), targets)`` computed in float16, the loss in float32,
        its gradient scaled."""
        if self._masters is None:
            self._to_compute(model)
        if isinstance(inputs, Tensor) and inputs.dtype.kind == "f":
            inputs = inputs.astype(self.compute_dtype)
        outputs = model(inputs)
        if isinstance(outputs, Tensor) and outputs.dtype.kind == "f":
            outputs = outputs.astype(np.float32)  # softmax and logs in float32
        return ScaleGrad.apply(loss_fn(outputs, targets), scale=self.scaler.scale)

    def before_step(self, parameters: list[Tensor], loss: float) -> bool:
        """Masters back, gradients unscaled into float32; False (skip) on overflow."""
        if self._masters is None:
            raise RuntimeError(
                "precision='16-mixed': no batch of this step was computed in float16. The Trainer's "
                "_accumulate must get every batch's loss from self._batch_loss(inputs, targets) (Module 09), "
                "where mixed precision casts the weights and inputs; this one computed the loss another way"
            )
        self._to_master()
        found_inf = self.scaler.unscale_(parameters)
        self.scaler.update(found_inf)
        if self.scaler.scale < MIN_LOSS_SCALE:
            raise FloatingPointError(
                f"precision='16-mixed': the loss scale fell to {self.scaler.scale:g} after "
                f"{self.scaler.skipped_steps} skipped steps: the gradients are inf or nan at any scale, so "
                "the model itself overflows (lower the learning rate, clip the gradients, or check the data)"
            )
        return not found_inf

    def state_dict(self) -> dict:
        return {"precision": self.precision, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])


# %% check=2
_scaler = GradScaler(init_scale=8.0, growth_interval=3)
_scaler.update(found_inf=True)
assert _scaler.scale == 4.0 and _scaler.clean_steps == 0, _scaler
for _ in range(2):
    _scaler.update(found_inf=False)
assert _scaler.scale == 4.0 and _scaler.clean_steps == 2, _scaler
_scaler.update(found_inf=False)
assert _scaler.scale == 8.0 and _scaler.clean_steps == 0, "grows after growth_interval clean steps"
_scaler.update(found_inf=False); _scaler.update(found_inf=True)
assert _scaler.scale == 4.0 and _scaler.clean_steps == 0, "an overflow restarts the count"
print("GradScaler OK")

# %% [markdown]
# Now the whole thing in the Trainer. An overflow first: a huge input makes
# float16 overflow; the scaler must skip that step (the weights do not move)
# and halve the scale.

# %%
tt.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), precision="16-mixed")
before = [p.numpy() for p in model.parameters()]
huge = TensorDataset(np.full((8, 4), 6e4, np.float32), np.zeros(8, np.int64))
with np.errstate(over="ignore", invalid="ignore"):  # the overflow is the point here
    trainer.train_epoch(DataLoader(huge, batch_size=8))
scaler = trainer._amp.scaler
print(f"after an overflow: scale {scaler.scale:g}, skipped steps {trainer.skipped_steps}")
assert scaler.scale == 2.0**15 and trainer.skipped_steps == 1
assert all(np.array_equal(b, p.numpy()) for b, p in zip(before, model.parameters()))
assert all(p.dtype == np.float32 for p in model.parameters()), "master weights stay float32"

# %% [markdown]
# And a real run: the milestone MLP on Digits, float32 against 16-mixed, same
# seed, same batches.

# %%
def train_digits(precision: str, epochs: int = 15) -> float:
    tt.manual_seed(0)
    train, test = Digits(train=True), Digits(train=False)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    optimizer = tt.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = tt.Trainer(model, optimizer, nn.CrossEntropyLoss(), precision=precision)
    trainer.fit(DataLoader(TensorDataset(train.images, train.labels), batch_size=64, shuffle=True, seed=0),
                epochs=epochs, progress=False)
    return trainer.evaluate(DataLoader(TensorDataset(test.images, test.labels), batch_size=512))[1]


accuracy = {precision: train_digits(precision) for precision in ("32-true", "16-mixed")}
print(accuracy)
assert abs(accuracy["32-true"] - accuracy["16-mixed"]) <= 0.01

# %% [markdown]
# ## 4. Data parallelism over MPI
#
# $P$ processes (*ranks*) each hold a full copy of the model. Every step, each
# rank takes a different $B$ samples, computes its gradient $g_r$, and then all
# ranks sum their gradients with an **all-reduce** and divide by $P$. Since the
# loss is a mean, $\frac{1}{P}\sum_r g_r$ is exactly the gradient of the mean
# loss over all $P B$ samples: $P$ ranks at batch $B$ take *the same step* as
# one process at batch $P B$. Every rank applies the same averaged gradient to
# the same weights, so the weights stay identical without ever being sent.
#
# Memory: nothing saved per rank (each holds everything, as in PyTorch's DDP —
# ZeRO/FSDP shard the optimizer state and weights to save memory too). Traffic:
# a ring all-reduce sends about $2 \frac{P-1}{P}$ times the gradient bytes per
# rank per step, independent of $P$.
#
# The data: each epoch every rank draws **the same** permutation (same seed)
# and takes every $P$-th index starting at its rank. If $N$ is not a multiple
# of $P$, the permutation wraps around to pad it, so every rank has the same
# number of batches — a rank with one batch more would wait forever in an
# all-reduce that the others never join. It keeps wrapping for as long as it
# takes, even with more ranks than samples: `[5, 3, 9, 1, 7]` on 2 ranks pads to
# `[5, 3, 9, 1, 7, 5]` (rank 0 takes `[5, 9, 7]`, rank 1 `[3, 1, 5]`), and `[4, 2]`
# on 5 ranks pads to `[4, 2, 4, 2, 4]` (ranks 0 to 4 take `[4]`, `[2]`, `[4]`,
# `[2]`, `[4]`), where one copy of the start, `[4, 2, 4, 2]`, would be too short.

# %% export="distributed"
"""Data-parallel training over MPI (mpi4py).

Every rank runs the same script on its own shard of the data
(:class:`DistributedDataLoader`, or :func:`shard_indices` for a permutation that
every rank draws identically); :class:`DataParallel`, given to
``Trainer(strategy=...)``, sends rank 0's weights to every rank once and, before
every optimizer step, replaces each gradient by its average over the ranks (one
all-reduce of all gradients at once), so the ranks' weights stay identical.
Only rank 0 writes checkpoints. Run with ``mpirun -n P python script.py``.
"""
import math
from typing import Any

import numpy as np

from tinytrain.data import DataLoader
from tinytrain.tensor import Tensor


def shard_indices(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s share of an epoch's sample ``order``: every ``world_size``-th index
    from position ``rank``, after padding ``order`` by wrapping around (as often as it takes)
    to a multiple of ``world_size`` (so every rank gets ``ceil(len(order) / world_size)`` indices)."""
    ### BEGIN SOLUTION
    total = -(-len(order) // world_size) * world_size
    padded = np.resize(order, total) if total != len(order) else order  # np.resize repeats from the start
    return padded[rank::world_size]
    ### END SOLUTION


class SingleProcess:
    """A one-rank stand-in for an MPI communicator (for running without mpirun)."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def Allreduce(self, send: Any, receive: Any, op: Any = None) -> None:
        receive[...] = send

    def Bcast(self, buffer: Any, root: int = 0) -> None:
        pass

    def bcast(self, value: Any, root: int = 0) -> Any:
        return value


def world() -> Any:
    """``mpi4py``'s ``COMM_WORLD``, or a clear error when mpi4py is missing."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise ImportError("data-parallel training needs mpi4py and an MPI runtime: "
                          "pip install mpi4py mpich   (then run with: mpirun -n 2 python script.py)") from error
    return MPI.COMM_WORLD


def _communicator(comm: Any) -> Any:
    return world() if comm is None else comm


class DistributedDataLoader(DataLoader):
    """A :class:`~tinytrain.data.DataLoader` that serves this rank's shard of each epoch.

    All ranks draw the same epoch order (the seed is rank 0's, sent to all) and
    each keeps :func:`shard_indices` of it; ``batch_size`` is per rank.
    ``len(loader)`` is the same on every rank.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int | None = None, device: Any = None, comm: Any = None) -> None:
        comm = _communicator(comm)
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed,
                         device=device)
        if self.shuffle:
            self.seed = comm.bcast(self.seed, root=0)
            self.generator = np.random.Generator(np.random.PCG64(self.seed))
            self._start_state = self._generator_state()

    def __len__(self) -> int:
        n = -(-len(self.dataset) // self.world_size)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _epoch_order(self) -> np.ndarray:
        return shard_indices(super()._epoch_order(), self.rank, self.world_size)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("world_size", self.world_size) != self.world_size:
            raise ValueError(f"loader state was saved with world_size={state['world_size']} but this run has "
                             f"world_size={self.world_size}; resume with the same number of ranks")
        super().load_state_dict({**state, "world_size": self.world_size})


def average_gradients(parameters: list[Tensor], comm: Any, extra: float = 0.0) -> float:
    """Replace every gradient by its mean over the ranks, with one all-reduce of a float32
    buffer that holds all of them (and ``extra`` at the end); returns the sum of ``extra``
    over the ranks, as a Python ``float``. Every rank must pass its parameters in the same
    order. The buffer is float32 whatever the gradients' dtype: float64 gradients stay
    float64 arrays, their values rounded to float32 (half the bytes sent; training runs in float32). A parameter
    whose ``.grad`` is ``None`` is left out of the buffer and keeps ``None`` (the same
    backward gives every rank gradients for the same parameters). MPI reads host memory:
    a gradient on a device goes into the buffer through ``backend.to_host`` and comes
    back through ``backend.from_host``, as ``DataParallel.broadcast`` does below."""
    ### BEGIN SOLUTION
    grads = [p.grad for p in parameters if p.grad is not None]
    sizes = [g.size for g in grads]
    send = np.empty(sum(sizes) + 1, dtype=np.float32)
    start = 0
    for g, size in zip(grads, sizes):
        send[start:start + size] = g._backend.to_host(g.data).ravel()
        start += size
    send[-1] = extra
    total = np.empty_like(send)
    comm.Allreduce(send, total)
    world_size = comm.Get_size()
    start = 0
    for g, size in zip(grads, sizes):
        mean = total[start:start + size].reshape(g.shape) / world_size
        g.data[...] = g._backend.from_host(mean.astype(g.dtype, copy=False))
        start += size
    return float(total[-1])
    ### END SOLUTION


class DataParallel:
    """``Trainer(..., strategy=DataParallel())``: synchronous data-parallel training.

    ``setup`` sends rank 0's parameters and buffers to every rank;
    ``before_step`` averages the gradients over the ranks and says whether every
    rank's loss was finite (so all ranks take or skip a step together; how many
    were not is kept in ``nonfinite_ranks``). Only rank
    0 is a writer (``is_writer``): the Trainer saves checkpoints there only.
    """

    name = "strategy"

    def __init__(self, comm: Any = None) -> None:
        self.comm = _communicator(comm)
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.is_writer = self.rank == 0
        self.nonfinite_ranks = 0  # at the last step: the Trainer skips (or raises) on every rank alike

    def setup(self, trainer: Any) -> None:
        self.broadcast(trainer.model)

    def broadcast(self, model: Any) -> None:
        """Give every rank rank 0's parameters and buffers (in place)."""
        tensors = list(model.parameters()) + [b for b in model.buffers() if b is not None]
        for t in tensors:
            host = np.ascontiguousarray(t._backend.to_host(t.data))
            self.comm.Bcast(host, root=0)
            t.data[...] = t._backend.from_host(host)

    def before_step(self, parameters: list[Tensor], loss: float) -> bool:
        self.nonfinite_ranks = round(average_gradients(parameters, self.comm, 0.0 if math.isfinite(loss) else 1.0))
        return self.nonfinite_ranks == 0

    def state_dict(self) -> dict:
        return {"world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        pass


# %% check=2
assert shard_indices(np.arange(8), 0, 2).tolist() == [0, 2, 4, 6]
assert shard_indices(np.arange(8), 1, 2).tolist() == [1, 3, 5, 7]
assert shard_indices(np.array([5, 3, 9, 1, 7]), 1, 2).tolist() == [3, 1, 5], "pad by wrapping around"
assert [shard_indices(np.array([4, 2]), r, 5).tolist() for r in range(5)] == [[4], [2], [4], [2], [4]], \
    "more ranks than samples: keep wrapping ([4, 2] pads to [4, 2, 4, 2, 4])"
assert sorted(np.concatenate([shard_indices(np.arange(10), r, 3) for r in range(3)]).tolist()) \
    == sorted(list(range(10)) + [0, 1])


class _TwoRanks(SingleProcess):
    """Pretends another rank sent ``other`` (gradients, then the extra value)."""

    def __init__(self, other):
        self.other = other

    def Get_size(self):
        return 2

    def Allreduce(self, send, receive, op=None):
        receive[...] = send + self.other


_p = tt.tensor([1.0, 2.0], requires_grad=True)
_p.grad = tt.tensor([2.0, 4.0])
assert average_gradients([_p], _TwoRanks(np.array([4.0, 0.0, 1.0], np.float32)), extra=1.0) == 2.0
assert _p.grad.numpy().tolist() == [3.0, 2.0], _p.grad
print("data parallel OK")

# %% [markdown]
# Two ranks on one machine, from a terminal (needs `pip install mpi4py mpich`):
#
# ```
# mpirun -n 2 python milestones/mlp.py --distributed
# ```
#
# Only rank 0 prints, and only rank 0 writes the checkpoints, log and plot. `tests/test_distributed.py` checks, under `mpirun -n 2`, that two
# ranks at batch 64 end with the same weights as one process at batch 128 on
# the same samples, and that a resumed distributed run is exact.
#
# The cell below runs a `DataParallel` Trainer in this one process (one rank:
# the average of one gradient is itself) — the same code path, minus MPI.

# %%
tt.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
data = TensorDataset(np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32),
                     np.random.default_rng(1).integers(0, 2, 64))
trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     strategy=DataParallel(SingleProcess()))
print("loss", trainer.train_epoch(DistributedDataLoader(data, batch_size=16, shuffle=True, seed=0,
                                                        comm=SingleProcess())))

# %% [markdown]
# ## 5. How PyTorch does it
#
# * **Checkpointing**: `torch.utils.checkpoint.checkpoint(fn, *args,
#   use_reentrant=False)` and `checkpoint_sequential(modules, segments, x)`.
#   The reentrant form is what we wrote (a Function whose backward re-runs the
#   segment); the newer non-reentrant form uses saved-tensor hooks instead, so
#   it also works when no input requires grad (our anchor does that job).
#   `preserve_rng_state=True` is its default, for the same dropout reason.
# * **Mixed precision**: `with torch.autocast("cuda", dtype=torch.float16):`
#   picks float16 per *operation* (matmuls and convolutions in float16,
#   softmax, losses and reductions in float32) instead of casting the weights
#   once; `scaler = torch.amp.GradScaler()` then `scaler.scale(loss).backward()`,
#   `scaler.unscale_(opt)` (before clipping), `scaler.step(opt)` (skips on
#   inf/nan) and `scaler.update()`. Its defaults: scale $2^{16}$, growth 2,
#   backoff 0.5, interval 2000 — ours. bfloat16 (8 exponent bits, like float32)
#   needs no loss scaling at all, which is why most large models train in it.
#   Lightning's `Trainer(precision="16-mixed")` is where our names come from.
# * **Data parallelism**: `torch.distributed.init_process_group("nccl")`,
#   `DistributedDataParallel(model)` and `DistributedSampler(dataset,
#   shuffle=True)` with `sampler.set_epoch(e)`; launched by `torchrun`. DDP
#   all-reduces gradients in buckets *during* backward, overlapping
#   communication with computation; we do one all-reduce after it. NCCL plays
#   MPI's part on GPUs.
#
# ## Summary
#
# * Activations dominate training memory; checkpointing keeps segment inputs
#   only and recomputes the rest — same gradients, same dropout masks, about a
#   third more compute.
# * Mixed precision computes in float16 and keeps float32 masters; a dynamic
#   loss scale keeps small gradients from underflowing and skips steps that
#   overflow.
# * Data parallelism gives each rank a shard and averages the gradients with
#   one all-reduce per step: $P$ ranks at batch $B$ = one process at $PB$.
