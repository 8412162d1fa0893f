# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 16 — Profiling: where the time, the FLOPs and the memory of a step go
#
# *One sitting, about 2.5 hours: the lesson, 8 functions to write, and the measurements.*
#
# Module 15 trained a GPT. How fast? "About a second a step" says nothing about
# what to change. Every technique of training at scale — fused kernels, mixed
# precision, checkpointing, sharding — starts with a measurement that answers
# three questions:
#
# | question | the measurement | the number practitioners quote |
# |---|---|---|
# | which operation takes the time? | a **profile**: every op's forward and backward, timed | self time per op, a trace |
# | how much of the machine do we use? | FLOPs by formula, divided by time and by the machine's peak | **MFU**, model FLOPs utilisation |
# | what fills memory? | bytes of parameters, gradients, optimizer state, and the activations kept for backward | the memory breakdown |
#
# PyTorch answers them with `torch.profiler.profile`, `key_averages().table()`
# and traces opened in Perfetto; nanoGPT prints MFU in its log line. Here you
# build the same tools on the library you wrote, and they find real things.
#
# **You will**
# 1. record **events** — timed intervals that nest — and compute each one's
#    **self time**;
# 2. record every `Function`'s forward and backward, every module call and
#    labelled regions, at zero cost when no profile is active;
# 3. aggregate a profile into PyTorch's `key_averages()` table, and write a
#    **trace** that Perfetto opens;
# 4. count the **FLOPs** of each op by formula, measure the machine's **peak**, and
#    compute **MFU**;
# 5. measure what the graph **keeps for backward**, and break a training step's
#    memory down into parameters, gradients, optimizer state and activations;
# 6. time code honestly: warm-up, repeats, a **median with a confidence interval**;
# 7. profile the milestone GPT's training step, find its hot spot, and reason
#    about it with a **roofline**.

# %%
import json
import math
import os
import tempfile
import threading
import time
import tracemalloc

import numpy as np

import tinytrain as tt
from tinytrain import nn

# %% [markdown]
# ## 1. Events and self time
#
# A profile is a list of **events**: named intervals of time, each with a start
# and an end. They nest: the region "step" contains the call of the model,
# which contains the calls of its layers, which contain operations such as a
# matrix product. An event's **total time** is its duration, end minus start.
# Its **self time** is the part spent in no event nested directly inside it
# (its *children*):
#
# $$\text{self}(e) = \text{total}(e) - \sum_{c \,\in\, \text{children}(e)} \text{total}(c).$$
#
# Worked example: a module call from 0 to 10 µs runs a `MatMul` from 1 to 7 µs
# and an `Add` from 8 to 9 µs. The module's total is 10 µs; its self time is
# $10 - 6 - 1 = 3$ µs — the Python between and around the two operations.
# The `MatMul`'s self time is its whole 6 µs (no children). Self times never
# count a microsecond twice: they add up to the total of the outermost events.
# That is why "self time" is the column to sort by when you look for the hot
# spot: total time puts the outermost region first, always.
#
# The **recorder** keeps the events and, per thread, a *stack* of the open ones:
# `start` opens an event whose parent is the innermost open event (the top of
# the stack) and pushes it; `stop` stamps its end, pops it, and adds its
# duration to its parent's `children_ns` — so that, when the parent stops, its
# self time is `duration_ns - children_ns`. Events must close in the reverse
# order they opened (a `with` block does that by itself). Stopping any other
# event is a bug in the caller, and `stop` says so with a `RuntimeError` before
# it changes anything: an event that is not the innermost open one (the message
# names it and the innermost), or any event when none is open — an event that
# already stopped, say (the message names it and says that none is open).
#
# Times are integers of nanoseconds from `time.perf_counter_ns()` (a float of
# seconds would lose the last digits of a long run); the recorder takes its
# `clock` as an argument, so a test can give it a fake one.

# %% export="profiler"
"""Profiling: where the time, the FLOPs and the memory of a training step go.

``with profile(profile_memory=True, record_shapes=False) as prof:`` records every
``Function``'s forward and backward, every ``Module`` call and every ``record_function``
region as nested, timed :class:`Event`s. ``prof.key_averages()`` aggregates them per name
into PyTorch's columns (``.table(sort_by=..., row_limit=...)`` prints them), and
``prof.export_chrome_trace(path)`` writes a Trace Event Format file that Perfetto and
chrome://tracing open. ``op_flops`` counts FLOPs by formula; ``peak_flops`` measures the
machine's and ``mfu`` compares the two; ``graph_saved_bytes`` measures what a graph keeps
for backward and ``training_memory`` adds it to ``memory_report``'s breakdown;
``benchmark`` times a function with warm-up, repeats and a confidence interval for its
median.

The recording wraps methods only while a profile is active (see :class:`profile`), so code
that runs without one pays nothing, and the Functions of any library -- the reference or a
student's -- are recorded alike.
"""
import contextlib
import json
import math
import statistics
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from tinytrain.arguments import check_callable, check_int, check_number, check_type
from tinytrain.backend import get_backend
from tinytrain.serialization import atomic_write
from tinytrain.tensor import Tensor
from tinytrain.training import memory_report


@dataclass(eq=False)
class Event:
    """One timed interval of a profile.

    ``name`` is what it ran (``"MatMul"``, ``"MatMul.backward"``, ``"nn.Linear"``, a region's
    label); ``category`` is ``"op"`` (a Function's forward), ``"backward"`` (its backward),
    ``"module"`` (a ``Module`` call) or ``"region"`` (``record_function``). ``start_ns`` and
    ``end_ns`` come from the recorder's clock (``end_ns`` is None while the event is open);
    ``parent`` is the event it is nested in (None at the top), ``children_ns`` the total time of
    the events nested directly inside it. ``flops``, ``nbytes`` (bytes of the arrays it created)
    and ``shapes`` (its inputs' shapes) are filled in by the recording when it knows them.
    ``owner`` is the object that runs it (a Function, a Module) while it is open, so that a
    method that calls its parent class's version is recorded once. The recorder never touches
    it: the profile's wrappers set it after ``start`` and clear it after ``stop``, so a profile
    keeps no graph alive.
    """
    name: str
    category: str
    thread: int
    start_ns: int
    parent: "Event | None" = None
    end_ns: int | None = None
    children_ns: int = 0
    flops: int = 0
    nbytes: int = 0
    shapes: list | None = None
    owner: Any = field(default=None, repr=False)

    @property
    def duration_ns(self) -> int:
        """Total time: ``end_ns - start_ns``."""
        if self.end_ns is None:
            raise RuntimeError(f"event {self.name!r} is still open: it has no duration yet")
        return self.end_ns - self.start_ns

    @property
    def self_ns(self) -> int:
        """Self time: the total minus the total time of the events nested directly inside."""
        return self.duration_ns - self.children_ns

    def trace_args(self) -> dict[str, Any]:
        """What a trace viewer shows when the event is selected: FLOPs, bytes, input shapes."""
        args: dict[str, Any] = {"flops": self.flops, "bytes": self.nbytes}
        if self.shapes is not None:
            args["input shapes"] = [list(shape) for shape in self.shapes]
        return args


class EventRecorder:
    """Keeps the ``events`` of a profile in the order they started and, per thread, the stack of
    the open ones. ``clock()`` returns integer nanoseconds (``time.perf_counter_ns`` unless given)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.clock = clock
        self.events: list[Event] = []
        self._local = threading.local()

    def open_events(self) -> list[Event]:
        """This thread's stack of open events, outermost first (each thread nests its own events)."""
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def start(self, name: str, category: str, shapes: list | None = None) -> Event:
        """Open an event: append ``Event(name, category, thread=threading.get_ident(),
        start_ns=self.clock(), parent=<this thread's innermost open event, or None>,
        shapes=shapes)`` to ``self.events``, push it on ``self.open_events()``, return it."""
        ### BEGIN SOLUTION
        stack = self.open_events()
        event = Event(name, category, thread=threading.get_ident(), start_ns=self.clock(),
                      parent=stack[-1] if stack else None, shapes=shapes)
        self.events.append(event)
        stack.append(event)
        return event
        ### END SOLUTION

    def stop(self, event: Event) -> Event:
        """Close ``event``: stamp ``end_ns = self.clock()``, pop it off this thread's stack, add
        its duration to its parent's ``children_ns`` (when it has a parent). Returns it.

        ``event`` must be this thread's innermost open event. Otherwise raise ``RuntimeError``
        before changing anything (no clock reading either), naming ``event`` and the innermost
        open event -- or, when no event is open (``event`` already stopped, say), naming
        ``event`` and saying that none is open."""
        ### BEGIN SOLUTION
        stack = self.open_events()
        if not stack or stack[-1] is not event:
            innermost = repr(stack[-1].name) if stack else "none is open in this thread"
            raise RuntimeError(f"stop({event.name!r}): it is not the innermost open event ({innermost})")
        event.end_ns = self.clock()
        stack.pop()
        if event.parent is not None:
            event.parent.children_ns += event.duration_ns
        return event
        ### END SOLUTION


# %% check=2
ticks = iter([0, 1_000, 7_000, 8_000, 9_000, 10_000, 11_000, 12_000, 13_000, 14_000, 15_000, 16_000])
recorder = EventRecorder(clock=lambda: next(ticks))
module = recorder.start("nn.Block", "module")
matmul = recorder.start("MatMul", "op")
assert matmul.parent is module and module.parent is None, "the parent is the innermost open event"
recorder.stop(matmul)
add = recorder.stop(recorder.start("Add", "op"))
recorder.stop(module)
assert [e.name for e in recorder.events] == ["nn.Block", "MatMul", "Add"], "events in the order they started"
assert (module.duration_ns, module.self_ns) == (10_000, 3_000), (module.duration_ns, module.self_ns)
assert (matmul.self_ns, add.self_ns) == (6_000, 1_000)
outer, inner = recorder.start("outer", "region"), recorder.start("inner", "op")
try:
    recorder.stop(outer)
    raise AssertionError("stopping an event that is not the innermost open one must raise")
except RuntimeError as error:
    print("refused:", error)
    assert "outer" in str(error) and "inner" in str(error), "the message names both events"
assert outer.end_ns is None and recorder.open_events() == [outer, inner], "a refused stop changes nothing"
recorder.stop(inner), recorder.stop(outer)
assert (inner.end_ns, outer.end_ns) == (13_000, 14_000), f"a refused stop reads no clock: {inner.end_ns, outer.end_ns}"
try:
    recorder.stop(outer)
    raise AssertionError("stopping an event that already stopped (no event is open) must raise")
except RuntimeError as error:
    print("refused:", error)
    assert "outer" in str(error), "the message names the event"
assert outer.end_ns == 14_000, "a refused stop changes nothing"
in_thread = {}
recorder = EventRecorder()
main = recorder.start("main", "region")
worker = threading.Thread(target=lambda: in_thread.update(event=recorder.start("worker", "op")))
worker.start(), worker.join()
assert in_thread["event"].parent is None, "each thread nests its own events: use self.open_events()"
print("EventRecorder OK: self times", module.self_ns, matmul.self_ns, add.self_ns)

# %% [markdown]
# ## 2. FLOPs by formula
#
# A **FLOP** is one floating-point addition or multiplication. The product of an
# $(m, k)$ and a $(k, n)$ matrix makes $mn$ outputs, each a sum of $k$ products:
# $k$ multiplications and $k - 1$ additions, counted as $2k$, so
#
# $$\text{FLOPs}(A B) = 2\,m\,k\,n = 2 \cdot (\text{elements of the output}) \cdot k .$$
#
# That form covers every op that *contracts* a dimension:
#
# * `MatMul` (batched too: a stack of products, $k$ = the last axis of the first
#   operand — attention's $QK^\top$ and its weighted sum of $V$ are two of them);
# * `LinearFunction`, $x W^\top$: $k$ = `in`, the last axis of $x$ (the
#   bias addition is not counted, as nanoGPT and the $6N$ rule do not);
# * `Conv2dFunction`: each output element is a sum over $C_\text{in} \cdot k_H
#   \cdot k_W$ products, so $k = $ the product of the weight's shape without
#   its first axis (weight $(C_\text{out}, C_\text{in}, k_H, k_W)$, the second input).
#
# Operations that only move data — `Reshape`, `Transpose`, `GetItem`, `Stack`,
# `Concatenate`, `Cast`, `To`, `EmbeddingFunction` (a lookup), `Recompute`
# (its ops are recorded one by one) — count **0**. Every other op counts **one
# FLOP per element of the largest array it reads or writes** (an addition: the
# output; a sum: the input). That undercounts a GELU or a softmax, which do
# several operations per element, but the products dominate any network with
# matrices wider than a few dozen, and a simple rule that everybody can check is
# worth more than a precise one.
#
# **Backward.** The backward of a product makes two products of the same size
# (the gradient of each operand), so it counts **twice** the forward — the
# reason training costs $2N + 4N = 6N$ FLOPs per token (Module 15). Any other
# op's backward counts the same as its forward.
#
# Example: `Linear(64, 128)` on a batch of 32: $2 \cdot 32 \cdot 64 \cdot 128$ =
# 524,288 FLOPs forward, 1,048,576 backward; a `Sum` of its $(32, 128)$ output
# 4,096 each way (the elements of its input, the larger array). Section 5
# profiles exactly this and prints these four numbers.

# %% export="profiler"
_PRODUCTS = ("MatMul", "LinearFunction", "Conv2dFunction")  # they contract a dimension
_MOVES = ("Reshape", "Transpose", "GetItem", "Stack", "Concatenate", "Cast", "To", "EmbeddingFunction", "Recompute")


def op_flops(name: str, input_shapes: list[tuple[int, ...]], output_shape: tuple[int, ...],
             backward: bool = False) -> int:
    """FLOPs of the op ``name`` (a Function's class name) with inputs of ``input_shapes`` and a result
    of ``output_shape``; of its backward when ``backward``. Forward: ``2 * <output elements> * k``
    for the products in ``_PRODUCTS`` (``MatMul`` and ``LinearFunction``: k = the last axis of the
    first input; ``Conv2dFunction``: k = the product of the second input's (the weight's) axes after
    the first); 0 for the data movements in ``_MOVES``; for every other op the number of elements
    of its largest input or output. Backward: twice the forward for the products, the same
    otherwise. Returns a Python int."""
    ### BEGIN SOLUTION
    elements = math.prod(output_shape)
    if name in _PRODUCTS:
        k = math.prod(input_shapes[1][1:]) if name == "Conv2dFunction" else input_shapes[0][-1]
        return 2 * elements * k * (2 if backward else 1)
    if name in _MOVES:
        return 0
    return max([elements] + [math.prod(shape) for shape in input_shapes])
    ### END SOLUTION


# %% check=2
assert op_flops("LinearFunction", [(32, 64), (128, 64), (128,)], (32, 128)) == 2 * 32 * 64 * 128
assert op_flops("LinearFunction", [(32, 64), (128, 64)], (32, 128), backward=True) == 4 * 32 * 64 * 128
assert op_flops("MatMul", [(2, 4, 5, 8), (2, 4, 8, 5)], (2, 4, 5, 5)) == 2 * 2 * 4 * 5 * 5 * 8, "batched: k = 8"
assert op_flops("Conv2dFunction", [(8, 3, 10, 10), (16, 3, 3, 3)], (8, 16, 8, 8)) == 2 * 8 * 16 * 8 * 8 * 27
assert op_flops("Add", [(4, 5), (5,)], (4, 5)) == 20 and op_flops("Sum", [(4, 5)], ()) == 20
assert op_flops("Transpose", [(4, 5)], (5, 4)) == 0 and op_flops("ReLU", [(7,)], (7,), backward=True) == 7
assert type(op_flops("MatMul", [(3, 2), (2, 5)], (3, 5))) is int, "a Python int"
print("op_flops OK")

# %% [markdown]
# ## 3. Recording every operation
#
# Every computation of the library runs through one place: a `Function`'s
# `forward`, called by `Function.apply`, and its `backward`, called by the
# backward engine. A hook written into `apply` and the engine would record
# them all — but those are *your* code from Module 02, and a hook there would
# be missing from every library whose Module 02 was written without it. So the
# profile does what a monkey-patching profiler does: on entry it **wraps** the
# methods themselves, and on exit it puts the originals back.
#
# * It walks `Function.__subclasses__()` recursively and replaces each
#   subclass's own `forward` and `backward` with a wrapper that opens an event,
#   calls the original, and closes the event (in a `finally`, so an exception
#   closes it too). Subclasses defined *while* profiling are wrapped as they are
#   created (through `Function.__init_subclass__`, set for the duration).
# * It wraps `Module.__call__` the same way: an event `nn.Linear`, `nn.Block`…
#   around each module call, so the ops nest inside the layers that ran them.
# * `record_function("name")` opens an event `name` (category "region") while a
#   profile is active, and does nothing otherwise.
#
# Why this design: **zero cost when no profile is active** (nothing in the
# library changes; a step without a profile runs exactly the code it ran
# before), and it records the same ops whoever wrote the library. The price:
# only one profile at a time (a second one inside the first is refused), and a
# wrapper's own overhead — a few microseconds per op — is counted in the times
# of the events around it, which matters only for tiny ops.
#
# The events of an op's forward are named like its class (`MatMul`), those of
# its backward `MatMul.backward`, module calls `nn.` and the module's class
# name. `profile_memory=True` records the bytes of the arrays each op creates
# (its forward's result; the new gradient arrays its backward returns — not a
# view, not the incoming gradient passed on); `record_shapes=True` records the
# shapes of its inputs. The profile uses your `EventRecorder`. On a GPU, kernels
# run asynchronously: the wrapper waits for the op's device before it stamps
# the end, so the time is the kernel's, not its launch's.

# %% export="profiler"
_active: "profile | None" = None  # the profile that is recording, if any


def _synchronize(backend: Any) -> None:
    """Wait for the device's queued kernels (CuPy runs them asynchronously); nothing on the CPU."""
    cupy = getattr(backend, "cupy", None)
    if cupy is not None:
        cupy.cuda.Device(backend.index).synchronize()


def _new_arrays(backend: Any, result: Any, passed_on: Any = None) -> int:
    """Bytes of the arrays in ``result`` (an array or a tuple) that an op allocated: not ``passed_on``
    (the incoming gradient returned as it is), not a view, each array once."""
    arrays = result if isinstance(result, tuple) else (result,)
    seen: list[Any] = []
    for array in arrays:
        if backend.is_array(array) and array is not passed_on and array.base is None \
                and not any(array is other for other in seen):
            seen.append(array)
    return sum(array.nbytes for array in seen)


def _shape(array: Any) -> tuple:
    return tuple(getattr(array, "shape", ()))


class _Wrapping:
    """The methods a profile replaces, and how to put them back (see :class:`profile`)."""

    def __init__(self, recorder: EventRecorder, profile_memory: bool, record_shapes: bool) -> None:
        self.recorder, self.profile_memory, self.record_shapes = recorder, profile_memory, record_shapes
        self.replaced: list[tuple[type, str, Any]] = []  # (class, attribute, what its __dict__ held)

    def replace(self, cls: type, name: str, wrapper: Any) -> None:
        self.replaced.append((cls, name, cls.__dict__.get(name, _MISSING)))
        setattr(cls, name, wrapper)

    def restore(self) -> None:
        for cls, name, original in reversed(self.replaced):
            if original is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self.replaced.clear()

    def running(self, owner: Any, category: str) -> bool:
        """Whether ``owner`` is already being recorded in ``category`` (a method calling its parent's)."""
        stack = self.recorder.open_events()
        return bool(stack) and stack[-1].owner is owner and stack[-1].category == category

    def wrap_function_class(self, cls: type) -> None:
        for name in ("forward", "backward"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "_profiled", False):
                self.replace(cls, name, (self._forward if name == "forward" else self._backward)(method))

    def _forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        wrapping = self

        def forward(fn: Any, *arrays: Any, **params: Any) -> Any:
            if wrapping.running(fn, "op"):
                return original(fn, *arrays, **params)
            name = type(fn).__name__
            shapes = [_shape(array) for array in arrays]
            event = wrapping.recorder.start(name, "op", shapes if wrapping.record_shapes else None)
            event.owner = fn
            try:
                out = original(fn, *arrays, **params)
                _synchronize(fn.backend)
            finally:
                wrapping.recorder.stop(event)
                event.owner = None  # the profile must not keep the op, its inputs and its saved arrays alive
            event.flops = op_flops(name, shapes, _shape(out))
            fn._profiled_backward_flops = op_flops(name, shapes, _shape(out), backward=True)
            if wrapping.profile_memory:
                event.nbytes = _new_arrays(fn.backend, out)
            return out

        forward._profiled = True
        return forward

    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        wrapping = self

        def backward(fn: Any, grad: Any) -> Any:
            if wrapping.running(fn, "backward"):
                return original(fn, grad)
            flops = vars(fn).get("_profiled_backward_flops", 0)  # the engine clears vars(fn) after backward
            event = wrapping.recorder.start(f"{type(fn).__name__}.backward", "backward",
                                            [_shape(grad)] if wrapping.record_shapes else None)
            event.owner = fn
            try:
                grads = original(fn, grad)
                _synchronize(fn.backend)
            finally:
                wrapping.recorder.stop(event)
                event.owner = None
            event.flops = flops
            if wrapping.profile_memory:
                event.nbytes = _new_arrays(fn.backend, grads, passed_on=grad)
            return grads

        backward._profiled = True
        return backward

    def wrap_module_call(self, cls: type) -> None:
        original = cls.__dict__["__call__"]
        wrapping = self

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if wrapping.running(module, "module"):
                return original(module, *args, **kwargs)
            event = wrapping.recorder.start(f"nn.{type(module).__name__}", "module")
            event.owner = module
            try:
                return original(module, *args, **kwargs)
            finally:
                wrapping.recorder.stop(event)
                event.owner = None

        self.replace(cls, "__call__", __call__)


_MISSING = object()


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls``, recursively, each once."""
    found: list[type] = []
    todo = list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        if sub not in found:
            found.append(sub)
            todo.extend(sub.__subclasses__())
    return found


class profile:
    """``with profile(profile_memory=False, record_shapes=False) as prof:`` records, while the
    block runs, every Function's forward (``"op"``) and backward (``"backward"``), every Module
    call (``"module"``) and every ``record_function`` region as nested :class:`Event`s in
    ``prof.events``, timed by an :class:`EventRecorder`.

    On entry it wraps the ``forward``/``backward`` of every ``Function`` subclass (those
    defined inside the block too) and ``__call__`` of ``Module`` and of every subclass that
    defines its own; on exit -- an exception's too -- it puts the originals back. One profile
    records at a time: entering a second raises ``RuntimeError``. A profile object is used once.
    """

    def __init__(self, profile_memory: bool = False, record_shapes: bool = False) -> None:
        self.profile_memory = check_type("profile_memory", profile_memory, bool, "True or False")
        self.record_shapes = check_type("record_shapes", record_shapes, bool, "True or False")
        self.recorder = EventRecorder()
        self._wrapping: _Wrapping | None = None
        self._used = False

    @property
    def events(self) -> list[Event]:
        return self.recorder.events

    def __enter__(self) -> "profile":
        global _active
        if _active is not None:
            raise RuntimeError("profile: another profile is already recording; profiles do not nest "
                               "(use record_function for a labelled region inside one)")
        if self._used:
            raise RuntimeError("profile: this profile has already recorded; make a new one")
        from tinytrain.autograd import Function  # the library as it is now: a student's export included
        from tinytrain.nn.module import Module

        self._used = True
        wrapping = self._wrapping = _Wrapping(self.recorder, self.profile_memory, self.record_shapes)
        try:
            for cls in _subclasses(Function):
                wrapping.wrap_function_class(cls)
            for cls in [Module, *_subclasses(Module)]:
                if "__call__" in cls.__dict__:
                    wrapping.wrap_module_call(cls)
            previous_hook = Function.__dict__.get("__init_subclass__")

            def wrap_new_subclass(cls: type, **kwargs: Any) -> None:
                if previous_hook is not None:
                    previous_hook.__get__(None, cls)(**kwargs)
                else:
                    super(Function, cls).__init_subclass__(**kwargs)
                wrapping.wrap_function_class(cls)

            wrapping.replace(Function, "__init_subclass__", classmethod(wrap_new_subclass))
        except BaseException:
            wrapping.restore()
            raise
        _active = self
        return self

    def __exit__(self, *exc_info: Any) -> None:
        global _active
        _active = None
        self._wrapping.restore()

    def key_averages(self) -> "KeyAverages":
        """The events aggregated per name (see :func:`key_averages`)."""
        return key_averages(self.events)

    def export_chrome_trace(self, path: Any) -> None:
        """Write the events to ``path`` as Trace Event Format JSON (``{"traceEvents": [...]}``, see
        :func:`trace_events`), atomically: the file is complete or not there."""
        if not self.events:
            raise RuntimeError("export_chrome_trace: the profile recorded no events")
        origin = min(event.start_ns for event in self.events)
        document = {"traceEvents": trace_events(self.events, origin, pid=0), "displayTimeUnit": "ms"}
        atomic_write(path, lambda file: file.write(json.dumps(document).encode()))


class record_function(contextlib.ContextDecorator):
    """``with record_function("name"):`` (or ``@record_function("name")``) marks a region, an event
    of category ``"region"``, in the active profile; without one it does nothing."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"record_function takes a non-empty name, got {name!r}")
        self.name = name
        self._open: list[tuple[EventRecorder, Event]] = []

    def __enter__(self) -> "record_function":
        if _active is not None:
            self._open.append((_active.recorder, _active.recorder.start(self.name, "region")))
        else:
            self._open.append((None, None))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        recorder, event = self._open.pop()
        if recorder is not None:
            recorder.stop(event)


# %% check=2
tt.manual_seed(0)
layer = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
x = tt.randn(2, 3)
with profile() as prof:
    with record_function("step"):
        layer(x).sum().backward()
names = [(e.category, e.name) for e in prof.events]
print(names)
assert names[:3] == [("region", "step"), ("module", "nn.Sequential"), ("module", "nn.Linear")], names
assert ("op", "LinearFunction") in names and ("backward", "LinearFunction.backward") in names, names
linear_op = next(e for e in prof.events if e.name == "LinearFunction")
assert linear_op.parent.name == "nn.Linear" and linear_op.parent.parent.name == "nn.Sequential"
assert linear_op.flops == 2 * 2 * 3 * 4, "op_flops of Linear(3, 4) on 2 samples"
assert all(e.parent.name == "step" for e in prof.events if e.category == "backward"), "backward runs in the region"
assert type(layer).__call__ is nn.Module.__call__ and "_profiled" not in vars(tt.ops.MatMul.forward), \
    "the originals are back after the profile"
print("recording OK:", len(prof.events), "events")

# %% [markdown]
# Nothing stays wrapped after the block: the check above found `Module.__call__`
# and `MatMul.forward` as they were. To see that "zero cost" holds, time a loop
# of small ops with no profile, inside a profile, and with no profile again:

# %%
def small_ops(x: tt.Tensor) -> None:
    for _ in range(200):
        x = (x * 1.01 + 0.1).tanh()


x = tt.randn(64)
for label in ("no profile", "inside a profile", "no profile again"):
    start = time.perf_counter()
    if label == "inside a profile":
        with profile():
            small_ops(x)
    else:
        small_ops(x)
    print(f"{label:18s}: {(time.perf_counter() - start) / 600 * 1e6:5.2f} µs per op")

# %% [markdown]
# Without a profile an op of 64 numbers costs a few microseconds (Python, not
# arithmetic); inside one, several times that — the wrappers' own work (two
# clock reads, an event, the FLOP count), which lands in the self time of the
# op's parent, not in the op's — and after it, the same few microseconds again.
#
# ## 4. Aggregating: `key_averages` and the table
#
# A training step makes thousands of events. PyTorch's `key_averages()` groups
# them by name (the *key*) into one row each, with the columns:
#
# * `count` — how many events had that name;
# * `cpu_time_total` — the sum of their durations, in **microseconds**;
# * `self_cpu_time_total` — the sum of their self times, in microseconds;
# * `flops` — the sum of their FLOPs; `cpu_memory_usage` — the sum of their
#   bytes (`nbytes`: what the op itself created; modules and regions create
#   nothing themselves, their ops have rows of their own).
#
# Add the events' integer nanoseconds, and divide each row's two sums by 1000
# once, at the end: integers add exactly, while floats round at every
# addition. Two events of 100 ns and 200 ns make 300 ns, 0.3 µs; adding their
# microseconds one by one makes `0.1 + 0.2` = 0.30000000000000004 µs.
#
# Rows come in the order their key first appeared. `KeyAverage.cpu_time` is the
# average, `cpu_time_total / count`. Every event counts, whatever its category:
# the rows `nn.Linear` and `LinearFunction` are the layer (with its Python) and
# its operation. Worked example: two `MatMul`s of 6 µs and 4 µs (self 6 and 4)
# make one row: count 2, total 10 µs, self 10 µs.
#
# `table(sort_by="self_cpu_time_total", row_limit=10)` (given) prints the rows
# sorted, largest first, with each one's share of the sum of self times —
# PyTorch's layout.

# %% export="profiler"
_SORT_KEYS = ("self_cpu_time_total", "cpu_time_total", "cpu_time", "count", "flops", "cpu_memory_usage")


@dataclass
class KeyAverage:
    """One row of ``key_averages()``: the events named ``key`` -- how many (``count``), the sum of
    their durations (``cpu_time_total``) and self times (``self_cpu_time_total``) in microseconds,
    of their ``flops`` and of the bytes they created (``cpu_memory_usage``)."""
    key: str
    count: int = 0
    cpu_time_total: float = 0.0
    self_cpu_time_total: float = 0.0
    flops: int = 0
    cpu_memory_usage: int = 0

    @property
    def cpu_time(self) -> float:
        """Average time per event, microseconds."""
        return self.cpu_time_total / self.count if self.count else 0.0


def _human(value: float, units: tuple[str, ...], step: float) -> str:
    for unit in units[:-1]:
        if abs(value) < step:
            return f"{value:.3f}{unit}"
        value /= step
    return f"{value:.3f}{units[-1]}"


def _time(microseconds: float) -> str:
    return _human(microseconds, ("us", "ms", "s"), 1000.0)


def _bytes(nbytes: float) -> str:
    return _human(nbytes, (" B", " KiB", " MiB", " GiB"), 1024.0)


class KeyAverages(list):
    """The rows of ``key_averages()`` (a list of :class:`KeyAverage`), printable with ``table``."""

    def table(self, sort_by: str = "self_cpu_time_total", row_limit: int = 100) -> str:
        """The rows as a text table like PyTorch's, sorted by ``sort_by`` (largest first; one of
        ``self_cpu_time_total``, ``cpu_time_total``, ``cpu_time``, ``count``, ``flops``,
        ``cpu_memory_usage``), at most ``row_limit`` rows (at least 1). Percentages are shares of
        the sum of all rows' self times."""
        if sort_by not in _SORT_KEYS:
            raise ValueError(f"table: sort_by={sort_by!r} is not one of {', '.join(_SORT_KEYS)}")
        row_limit = check_int("row_limit", row_limit, minimum=1)
        rows = sorted(self, key=lambda row: getattr(row, sort_by), reverse=True)[:row_limit]
        self_total = sum(row.self_cpu_time_total for row in self) or 1.0
        width = max([len("Name")] + [len(row.key) for row in rows]) + 2
        header = (f"{'Name':<{width}}{'Self CPU %':>12}{'Self CPU':>12}{'CPU total %':>13}{'CPU total':>12}"
                  f"{'CPU time avg':>14}{'FLOPs':>12}{'CPU Mem':>14}{'# of Calls':>12}")
        line = "-" * len(header)
        out = [line, header, line]
        for row in rows:
            out.append(f"{row.key:<{width}}{row.self_cpu_time_total / self_total:>12.2%}"
                       f"{_time(row.self_cpu_time_total):>12}{row.cpu_time_total / self_total:>13.2%}"
                       f"{_time(row.cpu_time_total):>12}{_time(row.cpu_time):>14}"
                       f"{_human(row.flops, ('', 'K', 'M', 'G', 'T'), 1000.0):>12}"
                       f"{_bytes(row.cpu_memory_usage):>14}{row.count:>12}")
        out += [line, f"Self CPU time total: {_time(sum(row.self_cpu_time_total for row in self))}"]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def key_averages(events: Iterable[Event]) -> KeyAverages:
    """One :class:`KeyAverage` per event name, in the order the names first appear: ``count``;
    ``cpu_time_total`` and ``self_cpu_time_total``, the sums of the events' integer ``duration_ns``
    and ``self_ns``, each sum divided by 1000 once (microseconds; integers add exactly, floats
    would round at every addition); ``flops`` and ``cpu_memory_usage``, the sums of ``flops`` and
    of ``nbytes``. Returns ``KeyAverages(rows)``."""
    ### BEGIN SOLUTION
    sums: dict[str, list[int]] = {}  # key -> [count, duration_ns, self_ns, flops, nbytes]
    for event in events:
        row = sums.setdefault(event.name, [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += event.duration_ns
        row[2] += event.self_ns
        row[3] += event.flops
        row[4] += event.nbytes
    return KeyAverages(KeyAverage(key, count, total_ns / 1000, self_ns / 1000, flops, nbytes)
                       for key, (count, total_ns, self_ns, flops, nbytes) in sums.items())
    ### END SOLUTION


# %% check=2
def closed(name, start, end, children=0, flops=0, nbytes=0, category="op"):
    return Event(name, category, thread=1, start_ns=start, end_ns=end, children_ns=children, flops=flops,
                 nbytes=nbytes)


rows = key_averages([closed("nn.Linear", 0, 12_000, children=10_000, category="module"),
                     closed("MatMul", 1_000, 7_000, flops=96, nbytes=64), closed("MatMul", 7_000, 11_000, flops=96)])
assert [row.key for row in rows] == ["nn.Linear", "MatMul"], "one row per name, in order of first appearance"
matmuls = rows[1]
assert (matmuls.count, matmuls.cpu_time_total, matmuls.self_cpu_time_total) == (2, 10.0, 10.0), matmuls
assert (matmuls.flops, matmuls.cpu_memory_usage, matmuls.cpu_time) == (192, 64, 5.0), matmuls
assert (rows[0].cpu_time_total, rows[0].self_cpu_time_total) == (12.0, 2.0), "times in microseconds"
print(rows.table(row_limit=5))

# %% [markdown]
# ## 5. A trace that Perfetto opens
#
# The table says how much; a **trace** says when, and inside what. The Trace
# Event Format (Google's, read by `chrome://tracing` and
# [ui.perfetto.dev](https://ui.perfetto.dev)) is JSON: `{"traceEvents": [...]}`,
# one object per event. A *complete event* (`"ph": "X"`) has
#
# | key | value |
# |---|---|
# | `name`, `cat` | the event's name and category |
# | `ph` | `"X"` |
# | `ts`, `dur` | start and duration in **microseconds** (floats are fine) |
# | `pid`, `tid` | process and thread ids: the viewer draws one track per thread |
# | `args` | anything to show on a click: here `event.trace_args()` |
#
# `ts` counts from the profile's first event (`origin_ns`), so a trace starts
# near 0. The viewer nests events of one thread by their times: a child's
# interval lies inside its parent's. `export_chrome_trace(path)` (given) writes
# `{"traceEvents": trace_events(...), "displayTimeUnit": "ms"}` atomically — a
# temporary file renamed over the target, so a crash never leaves half a file.

# %% export="profiler"
def trace_events(events: Iterable[Event], origin_ns: int, pid: int) -> list[dict[str, Any]]:
    """One Trace Event Format complete event per event, in order: ``{"name", "cat": category,
    "ph": "X", "ts": (start_ns - origin_ns) / 1000, "dur": duration_ns / 1000, "pid": pid,
    "tid": thread, "args": event.trace_args()}`` (times in microseconds)."""
    ### BEGIN SOLUTION
    return [{"name": event.name, "cat": event.category, "ph": "X", "ts": (event.start_ns - origin_ns) / 1000,
             "dur": event.duration_ns / 1000, "pid": pid, "tid": event.thread, "args": event.trace_args()}
            for event in events]
    ### END SOLUTION


# %% check=2
matmul = closed("MatMul", 6_000, 12_000, flops=96)
matmul.shapes = [(2, 3), (3, 4)]
traced = trace_events([closed("nn.Linear", 5_000, 17_000, category="module"), matmul], 5_000, pid=7)
assert traced[1] == {"name": "MatMul", "cat": "op", "ph": "X", "ts": 1.0, "dur": 6.0, "pid": 7, "tid": 1,
                     "args": {"flops": 96, "bytes": 0, "input shapes": [[2, 3], [3, 4]]}}, traced[1]
assert traced[0]["ts"] == 0.0 and traced[0]["dur"] == 12.0 and traced[0]["cat"] == "module", traced[0]
print("trace_events OK")

# %% [markdown]
# Export the profile of section 3 and read it back: one object per event.
# Download the file and drop it on ui.perfetto.dev to see the nesting.

# %%
trace_path = os.path.join(tempfile.mkdtemp(), "linear.json")
prof.export_chrome_trace(trace_path)
with open(trace_path) as file:
    trace = json.load(file)
print(len(trace["traceEvents"]), "events;", trace["traceEvents"][2])

# %% [markdown]
# ### FLOPs in a profile
#
# The profile counts every op's FLOPs (section 2) as it records. Section 2's example,
# one `Linear(64, 128)` on 32 samples and the `Sum` of its output, forward and backward:

# %%
tt.manual_seed(0)
linear = nn.Linear(64, 128)
with profile() as prof:
    linear(tt.randn(32, 64)).sum().backward()
for row in prof.key_averages():
    if row.flops:
        print(f"{row.key:26s} {row.flops:>10,d} FLOPs")

# %% [markdown]
# Module 15's `flops_per_token` predicts a GPT's training FLOPs as $6N + 12LCT$.
# The profile counts them op by op; its products should agree exactly with
# $6 \times$ (the weights of the matrices) $+ 12LCT$, and the whole count (which
# adds the elementwise ops and $6\times$ the biases and LayerNorms the formula
# counts in $N$) within a few percent:

# %%
from tinytrain.nn.transformer import GPT, GPTConfig, flops_per_token

config = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)
tt.manual_seed(0)
gpt = GPT(config)
batch = tt.tensor(np.random.default_rng(0).integers(0, 65, (4, 65)))
with profile() as prof:
    _, loss = gpt(batch[:, :-1], targets=batch[:, 1:])
    loss.backward()
tokens = 4 * 64
products = sum(e.flops for e in prof.events if e.name.split(".")[0] in _PRODUCTS) / tokens
matrices = sum(p.size for name, p in gpt.named_parameters() if p.ndim == 2 and name != "wpe.weight")
print(f"products {products:,.0f} FLOPs per token; 6 * matrix weights + 12 LCT = "
      f"{6 * matrices + 12 * config.n_layer * config.n_embd * config.block_size:,d}")
print(f"all ops {sum(e.flops for e in prof.events) / tokens:,.0f}; flops_per_token {flops_per_token(config):,d}")

# %% [markdown]
# ## 6. Peak FLOP/s and MFU
#
# FLOPs per step divided by seconds per step is the **achieved** FLOP rate. To
# know whether it is good, divide by what the machine can do at best, its
# **peak**. Chips have a datasheet peak (an H100's 989 TFLOP/s in bfloat16
# dense); a CPU's depends on its cores, vector width and clock, so we
# **measure** it: the best rate of a large matrix product (a GEMM), the most
# efficient kernel there is. Then
#
# $$\text{MFU} = \frac{\text{achieved FLOP/s}}{\text{peak FLOP/s}}
#   = \frac{\text{FLOPs per step} / \text{seconds per step}}{\text{peak FLOP/s}} .$$
#
# **Model FLOPs utilisation** (Chowdhery et al., 2022, *PaLM*) counts the
# FLOPs the *model* needs ($6N + 12LCT$ per token), not the ones the hardware
# happened to do — a recomputation by checkpointing does not raise MFU. nanoGPT
# logs it every step (`estimate_mfu`, against an A100's 312 TFLOP/s); large
# runs reach 40–60 %. Example: 2 GFLOPs in 0.1 s on a 100 GFLOP/s machine:
# 20 GFLOP/s achieved, MFU 0.2. `mfu` takes the FLOPs and seconds of a step (or
# of any amount of work) and the peak; anything but a positive number is a
# `ValueError` naming it (given).

# %% export="profiler"
def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``flops / seconds`` (the achieved rate) divided by ``peak_flops``
    (FLOP/s). Each argument must be a positive number (``ValueError`` naming it otherwise)."""
    for name, value in (("flops", flops), ("seconds", seconds), ("peak_flops", peak_flops)):
        check_number(name, value, above=0)
    ### BEGIN SOLUTION
    return flops / seconds / peak_flops
    ### END SOLUTION


# %% check=1
assert math.isclose(mfu(2e9, 0.1, 100e9), 0.2), mfu(2e9, 0.1, 100e9)
assert math.isclose(mfu(6e12, 2.0, 1e12), 3.0), "flops / seconds / peak"
print("mfu OK")

# %% [markdown]
# `peak_flops` (given) measures the peak with `benchmark` (section 8): the
# median rate of an $n \times n$ product on the device, in float32 by default.

# %% export="profiler"
def peak_flops(device: str = "cpu", n: int = 1024, dtype: str = "float32") -> float:
    """The machine's peak FLOP/s, measured: ``2 n^3`` FLOPs of an ``(n, n) @ (n, n)`` product on
    ``device`` in ``dtype``, divided by the median time of ``benchmark`` (after a warm-up)."""
    n = check_int("n", n, minimum=1)
    backend = get_backend(device)
    a = backend.random_normal((n, n)).astype(dtype)
    b = backend.random_normal((n, n)).astype(dtype)
    out = backend.xp.empty((n, n), dtype=dtype)
    measured = benchmark(lambda: backend.xp.matmul(a, b, out=out), warmup=2, repeats=9, device=device)
    return 2 * n**3 / measured.median


# %% [markdown]
# ## 7. Memory: what the graph keeps for backward
#
# Training holds four kinds of arrays (Module 13): parameters, their gradients,
# the optimizer's state — all independent of the batch, measured by
# `tt.memory_report(model, optimizer)` — and the **activations**: what each
# operation keeps for its backward, from the forward pass until backward
# reaches it. Those grow with the batch and the sequence, and they are what
# checkpointing (Module 13) and flash attention (Module 17) shrink.
#
# To measure them, walk the graph behind the output, as the backward engine
# does: from `output._ctx`, every Function, through the tensors it holds to
# their `_ctx`s, each Function once although many paths reach it. A Function
# keeps its arrays in its **attributes** (`vars(fn)`): saved arrays (`self.x`,
# `self.out`, …) and `inputs`, a tuple of tensors whose arrays it keeps alive.
# Follow every tensor it holds, in `inputs` or in any other attribute: a tensor
# kept anywhere keeps its graph alive. A Function whose backward has run holds
# nothing — the engine cleared its attributes, which is how backward frees the
# activations — so after `loss.backward()` the graph behind `loss` keeps 0 bytes.
# Skip a Function that has no `backend`: its backward has run (an engine may
# have put back some bookkeeping, such as its `sequence`, but no arrays).
# Count the bytes of everything the Functions hold:
#
# * an attribute that is an array, or a tensor (count its `.data`), or a tuple or
#   list of them (`inputs` is one). One level only: a tuple inside a tuple (the
#   shapes an op remembers, say) holds no activations and is not searched; nor
#   do other attributes (the backend, numbers) — `fn.backend.is_array(value)`
#   tells an array;
# * **each block of memory once**: a view (a slice, a transpose, a reshape) lives
#   in its base array's memory and keeps all of it alive, and two Functions often
#   hold the same array (a ReLU keeps its output, which the next Linear keeps as
#   its input). The given `memory_owner(array)` returns the array that owns the
#   memory and a key that names that memory (the same key for every view of it);
#   count `owner.nbytes` once per key;
# * **not the memory of leaf tensors** (`_ctx is None`): parameters and the
#   batch exist with or without the graph. Leave it out **by memory key, not
#   by tensor**: a tensor that is not a leaf can live in a leaf's memory (`w.T`
#   is made by a `Transpose`, but its array is a view of the parameter `w`),
#   and Functions hold leaves' arrays as bare arrays (`MatMul`'s `self.a` and
#   `self.b`). Whether a block is a leaf's is known only once the whole graph
#   is walked: the leaf may turn up at a Function further back (`w`, held by the
#   `Transpose`), or later in the same Function's attributes (`forward` sets
#   `self.a` before `apply` sets `inputs`). So collect first and count at the
#   end: over the whole walk, gather each block's bytes by key and the set of
#   the leaves' keys; then add up the blocks whose key is not a leaf's.
#
# Worked example: `y = relu(x @ w.T)` with a batch `x` of $(32, 64)$ and a
# weight `w` of $(128, 64)$, float32. Walking back from `y`: `ReLU` holds its
# output (`self.out`, $32 \cdot 128 \cdot 4$ = 16 KiB) and, in `inputs`, the
# product (another 16 KiB); `MatMul` holds the arrays of `x` and `w.T` (`self.a`,
# `self.b`) and, in `inputs`, the tensors `x` (a leaf) and `w.T` (not one);
# `Transpose` holds the leaf `w`. The keys of `x` and `w` are leaves', and
# `w.T`'s array has `w`'s key: the graph keeps 32 KiB. A count that decides
# "leaf or not" as it meets each array counts `x` (8 KiB, met as `self.a`
# before `inputs`) and `w` (32 KiB, met as `self.b` before the `Transpose`)
# too: 72 KiB.
#
# Memory that was *measured* — `tracemalloc` on the CPU, which NumPy reports its
# allocations to; the memory pool's counters with CuPy — checks the walk: the
# bytes held after a forward pass are what the graph keeps plus the output.

# %% export="profiler"
def memory_owner(array: Any) -> tuple[Any, int]:
    """``(owner, key)``: the array whose memory ``array`` lives in (itself unless it is a view: its
    ``.base``, followed to the end) and an int that names that memory, the same for every view of it."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "nbytes"):
        array = array.base
    return array, id(getattr(array, "_array", array))  # a strict-device array wraps the NumPy array it owns


def graph_saved_bytes(output: Tensor) -> int:
    """Bytes the graph behind ``output`` keeps for backward; 0 for a tensor with no graph.

    The walk: every Function reachable from ``output._ctx`` through the Tensors the Functions hold
    -- in ``inputs`` or in any other attribute -- to their ``_ctx``, each Function once. A Function
    whose backward has run holds nothing (the engine cleared its attributes): skip a Function that
    has no ``backend``.

    The count: every array a Function holds in an attribute -- an array, a Tensor's ``.data``, or
    one of those directly inside a tuple or list (containers inside it are not searched) -- as its
    ``memory_owner``'s ``nbytes``, once per memory key; except the memory of leaf tensors (``_ctx is
    None``: parameters and the batch), left out by key, since non-leaf tensors and bare arrays live
    in it too (``w.T``; a saved ``self.a``). Which keys are leaves' is known only after the whole
    walk: gather the blocks and the leaves' keys first, add up at the end."""
    ### BEGIN SOLUTION
    blocks: dict[int, int] = {}  # memory key -> its owner's nbytes
    leaves: set[int] = set()  # keys of leaves' memory: complete only once the whole graph is walked
    seen: set[int] = set()
    todo = [] if output._ctx is None else [output._ctx]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        backend = getattr(fn, "backend", None)
        if backend is None:  # its backward has run: the engine cleared what it held
            continue
        for value in list(vars(fn).values()):
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, Tensor):
                    if item._ctx is None:
                        leaves.add(memory_owner(item.data)[1])
                    else:
                        todo.append(item._ctx)
                    item = item.data
                if backend.is_array(item):
                    owner, key = memory_owner(item)
                    blocks[key] = owner.nbytes
    return sum(nbytes for key, nbytes in blocks.items() if key not in leaves)
    ### END SOLUTION


# %% check=2
tt.manual_seed(0)
x = tt.randn(32, 64)
w = tt.randn(128, 64, requires_grad=True)
y = tt.nn.functional.relu(x @ w.T)
saved = graph_saved_bytes(y)
assert saved == 2 * 32 * 128 * 4, (f"expected {2 * 32 * 128 * 4} bytes (the product and the ReLU's output), got "
                                   f"{saved}: x (8 KiB) and w (32 KiB, w.T's memory too) are leaves' memory, left "
                                   "out by key once the whole graph is walked")
z = y.reshape(64, 64) * 2.0  # a view of y's memory: nothing new but the product
assert graph_saved_bytes(z) == 2 * 32 * 128 * 4, "a view counts its base once"
assert graph_saved_bytes(x) == 0 and graph_saved_bytes(tt.randn(3) * 2) == 0, "no graph, no bytes"
h = x @ w.T
loss = (h * h + h).sum()
assert graph_saved_bytes(loss) == 3 * 32 * 128 * 4, "h, h * h and h * h + h, each block once"
loss.backward()
assert graph_saved_bytes(loss) == 0, "after backward every Function of the graph holds nothing"
loss._ctx.sequence = 0  # bookkeeping an engine may put back after clearing a Function: still no backend
assert graph_saved_bytes(loss) == 0, "skip a Function that has no backend: its backward has run"
print("graph_saved_bytes OK:", graph_saved_bytes(y), "bytes")

# %% [markdown]
# `training_memory` (given) adds the activations of a forward pass to
# `tt.memory_report`'s parameters, gradients and optimizer state;
# `measure_peak_memory(fn, device)` measures the peak bytes a call allocates.

# %% export="profiler"
def training_memory(model: Any, optimizer: Any, output: Tensor) -> dict[str, int | float]:
    """``memory_report(model, optimizer)`` (parameters, gradients, optimizer_state) plus
    ``activations``, the bytes the graph behind ``output`` keeps (``graph_saved_bytes``), in
    ``total`` and ``ratio`` (total / parameters) too."""
    report = memory_report(model, optimizer)
    report["activations"] = graph_saved_bytes(output)
    report["total"] += report["activations"]
    report["ratio"] = report["total"] / max(report["parameters"], 1)
    return report


def measure_peak_memory(fn: Callable[[], Any], device: str = "cpu") -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before.

    CPU and test devices: ``tracemalloc`` (NumPy reports its allocations to it; it must not be
    tracing already). CuPy: its default memory pool, emptied of cached blocks first; the pool
    then keeps every block the call allocated, so its ``total_bytes()`` growth is the peak
    (rounded up to the pool's block sizes)."""
    backend = get_backend(device)
    cupy = getattr(backend, "cupy", None)
    if cupy is not None:
        pool = cupy.get_default_memory_pool()
        _synchronize(backend)
        pool.free_all_blocks()
        before = pool.total_bytes()
        fn()
        _synchronize(backend)
        return pool.total_bytes() - before
    if tracemalloc.is_tracing():
        raise RuntimeError("measure_peak_memory: tracemalloc is already tracing; stop it first")
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# %% [markdown]
# **Predicted from shapes, measured, counted.** An MLP of `Linear` + `ReLU`
# layers keeps, per hidden layer, the Linear's output (the ReLU's input) and the
# ReLU's output: $2 B d$ numbers, as Module 13 said — and the last Linear's
# output is the result itself, kept by the caller, not by the graph. Three
# numbers that should agree:

# %%
def mlp(width: int = 256, depth: int = 6) -> nn.Module:
    layers = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


tt.manual_seed(0)
model, inputs = mlp(), tt.randn(512, 64)
predicted = 6 * 2 * 512 * 256 * 4
held = {}


def forward_and_keep() -> None:
    held["output"] = model(inputs)  # kept, so that tracemalloc sees the graph alive at the end


tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
forward_and_keep()
measured = tracemalloc.get_traced_memory()[0] - before
tracemalloc.stop()
counted = graph_saved_bytes(held["output"])
print(f"predicted {predicted / 2**20:.2f} MiB, counted {counted / 2**20:.2f} MiB, measured {measured / 2**20:.2f} "
      f"MiB (the graph and the output {(counted + held['output'].data.nbytes) / 2**20:.2f} MiB)")

# %% [markdown]
# **The breakdown.** For the three milestone models, one training step's
# memory by kind (float32; Adam keeps two arrays per parameter):

# %%
def breakdown(name: str, model: nn.Module, inputs: tt.Tensor, loss_of) -> dict:
    optimizer = tt.AdamW(model.parameters(), lr=1e-3)
    loss_of(model, inputs).backward()
    optimizer.step()  # gradients and Adam's state now exist
    report = training_memory(model, optimizer, loss_of(model, inputs))
    parts = ("parameters", "gradients", "optimizer_state", "activations")
    print(f"{name:4s}" + "".join(f"  {part} {report[part] / 2**20:6.2f} MiB" for part in parts))
    return report


tt.manual_seed(0)
digits = tt.randn(256, 64)
labels = tt.tensor(np.random.default_rng(0).integers(0, 10, 256))
cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                    nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 2 * 2, 10))
reports = {
    "MLP": breakdown("MLP", mlp(), digits, lambda m, x: tt.nn.functional.cross_entropy(m(x), labels)),
    "CNN": breakdown("CNN", cnn, digits.reshape(256, 1, 8, 8),
                     lambda m, x: tt.nn.functional.cross_entropy(m(x), labels)),
    "GPT": breakdown("GPT", GPT(config), batch, lambda m, x: m(x[:, :-1], targets=x[:, 1:])[1]),
}

# %% [markdown]
# The MLP's parameters, gradients and Adam's two moments are four copies of the
# weights; its activations at batch 256 are about as large. The CNN has few
# weights and comparatively large activations (every position of every
# channel). The GPT keeps, per block, the attention weights $(B, H, T, T)$ and a
# dozen $(B, T, C)$-sized arrays, and the logits $(B, T, V)$ at the end; at the
# sizes of a real run ($T$ = 1024, $B \cdot T$ in the hundreds of thousands)
# its activations are many times its weights. Per block:

# %%
tt.manual_seed(0)
x = tt.randn(4, 64, config.n_embd)
for i, block in enumerate(gpt.h):
    print(f"block {i}: {graph_saved_bytes(block(x)) / 2**20:.2f} MiB kept for backward, "
          f"attention weights alone {4 * config.n_head * 64 * 64 * 4 / 2**20:.2f} MiB")

# %% [markdown]
# ## 8. Timing with confidence
#
# One timing is one sample of a noisy quantity: other processes, caches, the
# clock frequency. A benchmark therefore (1) **warms up** — the first calls
# allocate memory, fill caches, compile — and throws those calls away; (2)
# **repeats** the measurement; (3) reports a robust centre, the **median**, with
# a **confidence interval** that says how well it is known.
#
# The median's interval needs no assumption about the distribution of times
# (which is skewed: slow outliers, never fast ones). Sort the $n$ samples
# $x_{(1)} \le \dots \le x_{(n)}$. Each sample falls below the true median with
# probability ½, so the number below it is Binomial$(n, ½)$, about normal with
# mean $n/2$ and standard deviation $\sqrt n / 2$. With $z$ the normal quantile of
# the confidence level ($z = 1.96$ for 95 %: `statistics.NormalDist().inv_cdf(0.5 + confidence / 2)`),
# the interval is $[x_{(j)}, x_{(k)}]$ with the ranks (1-based)
#
# $$j = \left\lfloor \frac{n - z\sqrt n}{2} \right\rfloor, \qquad
#   k = \left\lceil 1 + \frac{n + z\sqrt n}{2} \right\rceil,$$
#
# clamped to $1 \le j$ and $k \le n$ (few samples give the widest interval, from
# the smallest to the largest). Example: $n = 20$, 95 %: $z\sqrt n = 8.77$, $j =
# \lfloor 5.62 \rfloor = 5$, $k = \lceil 15.38 \rceil = 16$: the 5th and 16th
# smallest samples. The median of an even number of samples is the mean of the
# two middle ones (`statistics.median`). `median_interval` returns
# `(median, low, high)`; fewer than one sample, or a confidence outside (0, 1),
# is a `ValueError` (given).

# %% export="profiler"
def median_interval(samples: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(median, low, high)`` of ``samples``: ``statistics.median`` and the distribution-free
    confidence interval ``[x_(j), x_(k)]`` of the sorted samples, ranks (1-based)
    ``j = floor((n - z sqrt(n)) / 2)`` and ``k = ceil(1 + (n + z sqrt(n)) / 2)`` clamped to 1..n,
    ``z = NormalDist().inv_cdf(0.5 + confidence / 2)``."""
    samples = [float(sample) for sample in samples]
    if not samples:
        raise ValueError("median_interval: no samples")
    check_number("confidence", confidence, above=0, below=1)
    ### BEGIN SOLUTION
    ordered = sorted(samples)
    n = len(ordered)
    spread = statistics.NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(n)
    j = max(1, math.floor((n - spread) / 2))
    k = min(n, math.ceil(1 + (n + spread) / 2))
    return statistics.median(ordered), ordered[j - 1], ordered[k - 1]
    ### END SOLUTION


# %% check=2
assert median_interval(range(1, 21)) == (10.5, 5.0, 16.0), median_interval(range(1, 21))
assert median_interval([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0), "few samples: from the smallest to the largest"
assert median_interval(range(1, 101), confidence=0.5) == (50.5, 46.0, 55.0), median_interval(range(1, 101), 0.5)
print("median_interval OK")

# %% [markdown]
# `benchmark` (given) puts it together, as `torch.utils.benchmark.Timer` does:
# it runs `fn` `warmup` times, then times `repeats` runs of `number` calls each
# (with `number=None` it picks the smallest power of ten that makes a run last
# at least `min_run_time / repeats` — tiny functions are timed in batches so the
# clock's own cost does not count), and returns a `Measurement` of seconds per
# call. On a GPU, pass `device=`: it waits for the device after each run.

# %% export="profiler"
@dataclass(frozen=True)
class Measurement:
    """Seconds per call of a benchmark: the ``median`` of ``samples`` (one per run of ``number``
    calls) with its confidence interval [``ci_low``, ``ci_high``] at ``confidence``."""
    median: float
    ci_low: float
    ci_high: float
    confidence: float
    samples: tuple[float, ...]
    number: int

    def __str__(self) -> str:
        return (f"{_time(self.median * 1e6)} per call, {self.confidence:.0%} interval [{_time(self.ci_low * 1e6)}, "
                f"{_time(self.ci_high * 1e6)}] ({len(self.samples)} runs of {self.number})")


def benchmark(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 15, number: int | None = None,
              min_run_time: float = 0.2, confidence: float = 0.95, device: str | None = None) -> Measurement:
    """Time ``fn()``: ``warmup`` calls thrown away, then ``repeats`` runs of ``number`` calls (chosen when
    None: the smallest power of 10 whose run lasts ``min_run_time / repeats`` seconds), each run's
    seconds per call one sample; ``median_interval`` of the samples. ``device``: wait for that
    device's queued work at the end of every run (a GPU runs kernels asynchronously)."""
    fn = check_callable("fn", fn, "a function of no arguments")
    warmup = check_int("warmup", warmup, minimum=0)
    repeats = check_int("repeats", repeats, minimum=1)
    check_number("min_run_time", min_run_time, minimum=0)
    backend = None if device is None else get_backend(device)

    def run(calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if backend is not None:
            _synchronize(backend)
        return time.perf_counter() - start

    for _ in range(warmup):
        run(1)
    if number is None:
        number = 1
        while run(number) < min_run_time / repeats and number < 10**9:
            number *= 10
    else:
        number = check_int("number", number, minimum=1)
    samples = [run(number) / number for _ in range(repeats)]
    median, low, high = median_interval(samples, confidence)
    return Measurement(median, low, high, confidence, tuple(samples), number)


# %%
peak = peak_flops()
print(f"peak of this CPU (float32 GEMM, n = 1024): {peak / 1e9:.1f} GFLOP/s")
print(benchmark(lambda: np.tanh(np.ones(100_000, np.float32)), repeats=11))

# %% [markdown]
# ## 9. Systems: profiling the GPT's training step
#
# The milestone GPT on this CPU, one training step (forward, backward, AdamW
# step) of a smaller model than the milestone's so it runs in seconds. The
# regions `forward`, `backward` and `optimizer` are labelled with
# `record_function`, as you would in your own training loop:

# %%
def gpt_step(model: GPT, optimizer, idx: tt.Tensor) -> None:
    with record_function("forward"):
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
    with record_function("backward"):
        optimizer.zero_grad()
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()


config = GPTConfig(vocab_size=65, block_size=128, n_layer=4, n_head=4, n_embd=128)
tt.manual_seed(0)
gpt = GPT(config)
optimizer = tt.AdamW(gpt.parameters(), lr=1e-3)
idx = tt.tensor(np.random.default_rng(0).integers(0, 65, (8, 129)))
gpt_step(gpt, optimizer, idx)  # warm-up: first allocations
plain = benchmark(lambda: gpt_step(gpt, optimizer, idx), warmup=0, repeats=3, number=1)
with profile(profile_memory=True) as prof:
    with record_function("step"):
        gpt_step(gpt, optimizer, idx)
averages = prof.key_averages()
print(averages.table(sort_by="self_cpu_time_total", row_limit=12))

# %%
step = next(e for e in prof.events if e.name == "step")
op_self = sum(e.self_ns for e in prof.events if e.category in ("op", "backward"))
print(f"step {step.duration_ns / 1e6:.0f} ms profiled ({len(prof.events):,d} events), {plain.median * 1e3:.0f} ms "
      f"without the profile; the ops' self times add up to {op_self / step.duration_ns:.0%} of the profiled step")
for family in ("LinearFunction", "MatMul", "GELUTanh", "MaskedSoftmax"):
    rows = [row for row in averages if row.key.split(".")[0] == family]
    seconds = sum(row.self_cpu_time_total for row in rows) / 1e6
    print(f"{family:15s} (forward and backward): {seconds * 1e9 / step.duration_ns:4.0%} of the step, "
          f"{sum(row.flops for row in rows) / seconds / 1e9:6.2f} GFLOP/s")

# %% [markdown]
# **Noise first.** The two step times above are samples, not a measurement of
# what the profile costs: the profiled step is one run, the unprofiled time
# the median of three, and on a machine shared with other work one run can be
# tens of percent slower or faster than the next. The profile's own cost — the
# wrappers' microseconds per event that section 3 measured, times the events
# counted above — is often smaller than that noise, so a profiled step can even
# come out *faster* than an unprofiled one. Trust the shares (each row's part
# of the same run) more than absolute times; to compare two times, measure
# them in turns, several times each (section 8's `benchmark`).
#
# Read the table from the top: the rows with the largest self time are where
# the step goes. Three things to look for, on any machine:
#
# * **the products** (`LinearFunction`, `MatMul` and their backwards) should
#   dominate: they carry nearly all the FLOPs (the FLOPs column). Compare their
#   rate, FLOPs over self time, with the peak: the big `LinearFunction`s come
#   closest; attention's batched `MatMul`s — many small $(T, D) \times (D, T)$
#   products, one per batch element and head — run far below it, since each
#   small product pays a call's overhead and reuses little data;
# * **elementwise ops with few FLOPs and much time** — `GELUTanh` and its
#   backward, `MaskedSoftmax`: their FLOPs are a rounding error next to the
#   products', yet they take a visible share of the step. On many CPUs NumPy
#   evaluates `exp` element by element through a general-purpose routine, and GELU's
#   formula and its backward make a dozen passes over a $(B, T, 4C)$ array: the
#   time goes to reading and writing memory and to `exp`, not to arithmetic.
#   How large their share is depends on the machine — its BLAS, its cores,
#   what else runs on it: on one, GELU leads the table; on another, attention's
#   `MatMul`s and the `LinearFunction` backwards do, and GELU is a small share.
#   The shares printed above are the answer for yours, which is why you
#   profile on the machine you train on;
# * **module and region rows with a large self time**: Python between the ops
#   (the engine's bookkeeping, the optimizer's loop over parameters). The
#   first line printed under the table says how much of the step the ops' self
#   times cover; the rest is that Python.
#
# A product far below the peak has one more suspect on a CPU: **BLAS
# threads**. NumPy's BLAS splits a product over threads; on a machine whose
# cores are busy with other work, the threads wait for each other, and
# mid-sized products (attention's, a $256 \times 256$ GEMM) can run a hundred
# times slower than on one thread. Timed on the machine this was written on, while
# it was shared: attention's batched products ran at 0.04 GFLOP/s with two BLAS
# threads and 6 GFLOP/s with one (`OPENBLAS_NUM_THREADS=1`, or `threadpoolctl`).
# The profile shows *where*; a benchmark of that one op under both settings shows *why*.
#
# The hot spot decides the next move: a product far from the peak wants larger
# or fewer products (a bigger batch, fused heads); an elementwise op wants
# *fusing* — one pass over memory instead of a dozen — which is what a fused
# GELU kernel, and `torch.compile`, do.
#
# ### The step's MFU
#
# The formula's FLOPs per step (Module 15) over the measured time, against the
# measured peak — what the GPT milestone prints in its log line, as nanoGPT does:

# %%
tokens = idx.shape[0] * (idx.shape[1] - 1)
step_flops = flops_per_token(config) * tokens
print(f"{tokens / plain.median:,.0f} tokens/s, {step_flops / plain.median / 1e9:.1f} GFLOP/s achieved, "
      f"MFU {mfu(step_flops, plain.median, peak):.1%} of the measured peak {peak / 1e9:.0f} GFLOP/s")

# %% [markdown]
# ### The roofline: why the GEMM is fast and GELU is not
#
# Module 12's roofline model: an op takes at least
# $\max(\text{FLOPs} / \text{peak},\ \text{bytes} / \text{bandwidth})$. Its
# **arithmetic intensity** $I = \text{FLOPs} / \text{bytes}$ decides which term
# wins: below the *ridge point* $\text{peak} / \text{bandwidth}$ an op is
# **memory-bound** (it waits for data), above it **compute-bound**. Measure the
# bandwidth: an addition $c = a + b$ of large float32 arrays moves 12 bytes (two
# reads, one write) per element for one FLOP.

# %%
from tinytrain.cuda import matmul_cost

n = 4_000_000
a, b, c = np.ones(n, np.float32), np.ones(n, np.float32), np.empty(n, np.float32)
bandwidth = 12 * n / benchmark(lambda: np.add(a, b, out=c), repeats=9).median
print(f"bandwidth {bandwidth / 1e9:.1f} GB/s; peak {peak / 1e9:.0f} GFLOP/s; ridge point "
      f"{peak / bandwidth:.1f} FLOPs per byte")
points = {"add (1/12)": (1 / 12, 1 / 12 * bandwidth)}
for size in (64, 256, 1024):
    flops, nbytes = matmul_cost(size, size, size)
    m1, m2 = np.ones((size, size), np.float32), np.ones((size, size), np.float32)
    points[f"GEMM {size}"] = (flops / nbytes, flops / benchmark(lambda: m1 @ m2, repeats=7).median)
c_mlp = config.n_embd
gelu_in = np.ones((8 * 128, 4 * c_mlp), np.float32)
gelu_flops = op_flops("GELUTanh", [gelu_in.shape], gelu_in.shape)
gelu_seconds = benchmark(lambda: 0.5 * gelu_in * (1 + np.tanh(0.79788456 * (gelu_in + 0.044715 * gelu_in ** 3))),
                         repeats=7).median
points["GELU (1 FLOP/elem)"] = (gelu_flops / (2 * gelu_in.nbytes), gelu_flops / gelu_seconds)
for label, (intensity, rate) in points.items():
    print(f"{label:20s} intensity {intensity:7.2f} FLOPs/byte: {rate / 1e9:7.2f} GFLOP/s, "
          f"roofline {min(peak, intensity * bandwidth) / 1e9:7.2f}")

# %%
try:
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
    print("matplotlib is not installed (pip install matplotlib): no plot")
if plt is not None:
    intensities = np.logspace(-2, 3, 200)
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.loglog(intensities, np.minimum(peak, intensities * bandwidth) / 1e9, color="black", label="roofline")
    for label, (intensity, rate) in points.items():
        axes.loglog(intensity, rate / 1e9, "o", label=label)
    axes.set(xlabel="arithmetic intensity (FLOPs per byte)", ylabel="GFLOP/s", title="this CPU's roofline")
    axes.legend(fontsize=8)
    figure.tight_layout()
    plt.show()

# %% [markdown]
# The elementwise ops sit far left, on the slanted, memory-bound part of the
# roof: no amount of faster arithmetic helps them; only fewer passes over memory
# (fusing several ops into one) does. Counting GELU's dozen reads and writes of
# its array instead of one puts it lower still: it runs below even the
# bandwidth roof, because `tanh` itself costs tens of cycles per element. The
# large GEMM sits near the flat peak (its intensity grows with $n$: $2n^3$ FLOPs
# on $12n^2$ bytes); the small one falls short of it — at $n = 64$ the
# overheads of a call dominate.
#
# ## How PyTorch does it
#
# * `torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
#   record_shapes=True, profile_memory=True, with_flops=True)` records every
#   ATen operator through a hook in the dispatcher (PyTorch owns its dispatcher;
#   we do not own a student's `Function.apply`, hence the wrapping).
#   `prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)`
#   prints the table of section 4, `group_by_input_shape=True` splits rows by
#   shapes, and `prof.export_chrome_trace("trace.json")` writes the trace for
#   Perfetto. `torch.profiler.record_function("name")` labels a region;
#   `nn.Module` calls appear as `nn.Module: Linear_0` with `with_modules=True`.
#   On a GPU it reads kernel times from CUPTI instead of synchronising after
#   each op, so the profile does not slow the GPU down.
# * `with_flops=True` counts FLOPs by formula for matrix products and
#   convolutions only — the same choice as ours for what matters;
#   `torch.utils.flop_counter.FlopCounterMode` counts a whole model's.
# * `torch.utils.benchmark.Timer(stmt, globals=...).blocked_autorange(min_run_time=0.2)`
#   is `benchmark`: it picks the number of calls per run, and its `Measurement`
#   reports the median and the interquartile range.
# * `torch.cuda.max_memory_allocated()` and `torch.cuda.memory._record_memory_history()`
#   with the memory viz tool show what `measure_peak_memory` and
#   `graph_saved_bytes` show; `torch.autograd.graph.saved_tensors_hooks` lets
#   code see (and offload) every array the graph keeps.
# * nanoGPT's `estimate_mfu` is `mfu` with the A100's datasheet peak.
#
# ## Summary
#
# * An event's self time is its total minus its children's totals; self times
#   add up to the step's time without double counting — sort by them.
# * Recording every op of any library: wrap the `Function`s' methods and
#   `Module.__call__` only while a profile is active — zero cost otherwise.
# * `key_averages` groups events by name; a Trace Event Format file shows the
#   nesting in time (`ph: "X"`, microseconds, one track per thread).
# * FLOPs: $2 \cdot \text{outputs} \cdot k$ for products, twice that backward;
#   data movement 0; one per element otherwise. MFU = achieved / peak.
# * Activations are what the graph keeps: walk it, count each block of memory
#   once, and leave out the leaves' memory by key once the whole walk has found
#   them; with parameters, gradients and optimizer state, the whole memory of a
#   step.
# * Time with warm-up, repeats, the median and its distribution-free interval.
# * Profile on the machine you train on: the products carry nearly all of the
#   GPT step's FLOPs, but which row leads the self times — attention's small
#   products, the Linear backwards, GELU — depends on the machine, and the
#   printed shares say. An elementwise op like GELU takes far more time than
#   its FLOPs: the roofline says why (it is memory-bound), and that fusing, not
#   faster arithmetic, fixes it.
# * One run's times are noisy: read shares within a run, and compare times
#   measured in turns, several times each.
