# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 01 — Tensors and the array backend
#
# *One sitting, about 1.5 hours: the lesson, 8 functions to write, and the measurements.*
#
# A deep-learning library is, at its heart, a box of numbers with a shape.
# In this module you build that box — the `Tensor` — and the thin layer under it
# that decides *where* the numbers live (CPU memory or a GPU) and *which* array
# library does the arithmetic.
#
# **You will**
# 1. build a small *backend registry* that maps a device name such as `"cpu"` or
#    `"cuda:0"` to an object that knows how to do array math on that device;
# 2. decide how Python data becomes an array (which dtype? which device?);
# 3. write the `Tensor` class: construction, shape/dtype/device, moving between
#    devices, a readable `repr`, and factories such as `zeros` and `randn`;
# 4. measure what a dtype costs in memory and what a copy between devices costs.
#
# Every operator on a tensor (`+`, `@`, `sum`, `exp`, …) is an *operation* with a
# forward and a backward rule; you write those in Module 02. Here the operators
# already work, because the package ships the reference operations.

# %%
import time

import numpy as np

import tinytrain as tt

# %% [markdown]
# ## 1. Backends: one object per device
#
# NumPy computes on the CPU. CuPy has (almost) the same functions, but its arrays
# live in GPU memory. If every piece of tinytrain called `numpy.exp` directly,
# moving a model to the GPU would mean rewriting it. Instead, all array math goes
# through a **backend**: an object with
#
# * `xp` — the array namespace (`numpy` or `cupy`), so `backend.xp.exp(a)` works on
#   either device;
# * the few primitives the array namespaces spell differently or lack: host
#   transfer (`to_host` / `from_host`), scatter-add, padding, and random numbers.
#
# A **registry** maps device names to backends. A device name is `kind` or
# `kind:index`: `"cpu"`, `"cuda"` (same as `"cuda:0"`), `"cuda:1"`. Adding a new
# device is one class plus one `register_backend` call — the tests use this to
# plug in a *strict* device that refuses, like a real GPU, any silent conversion
# to NumPy.

# %% export="backend"
"""Array backends: one object per device that does the array math for tensors.

A backend bundles an array namespace ``xp`` (NumPy, CuPy, ...) with the few
primitives those namespaces spell differently: host transfer, scatter-add,
padding and random numbers. Tensors never import an array library themselves;
they ask their backend. ``register_backend`` makes a new device kind available.
"""
import importlib
import math
import random
from typing import Any, Callable

import ml_dtypes
import numpy as np

DEFAULT_FLOAT = np.dtype("float32")
# bfloat16 (Module 17): float32's sign and 8-bit exponent with 7 bits of mantissa, in 2 bytes. NumPy has
# no such type; ml_dtypes adds it (importing ml_dtypes also makes np.dtype("bfloat16") work).
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_floating(dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds floating-point numbers: NumPy's own (kind ``"f"``) or bfloat16,
    which ml_dtypes registers with NumPy as a kind of its own (``"V"``, like raw bytes)."""
    return dtype.kind == "f" or dtype == BFLOAT16


def sum_dtype(dtype: np.dtype) -> np.dtype | None:
    """The ``dtype=`` to add up numbers of ``dtype`` in (``a.sum(dtype=...)``, ``a.mean(dtype=...)``):
    float32 for bfloat16, whose own additions (ml_dtypes') round after every step -- 4,096 ones
    sum to 256 -- and ``None`` (NumPy's choice) for every other dtype."""
    return DEFAULT_FLOAT if dtype == BFLOAT16 else None


def bfloat16_operands(a: Any, b: Any) -> tuple[Any, Any, np.dtype | None]:
    """``(a, b, rounding)`` for a matrix product of the arrays ``a`` and ``b``.

    NumPy has no bfloat16 matrix product: it widens bfloat16 operands to float32 and
    returns float32. So when either operand is bfloat16, both come back rounded to
    bfloat16 and ``rounding`` is bfloat16, the dtype to round the product to (a product
    with a bfloat16 operand runs in bfloat16, as under PyTorch's autocast); otherwise
    ``(a, b, None)``, unchanged.
    """
    if a.dtype == BFLOAT16 or b.dtype == BFLOAT16:
        return a.astype(BFLOAT16, copy=False), b.astype(BFLOAT16, copy=False), BFLOAT16
    return a, b, None


def _is_basic(part: Any) -> bool:
    """Whether one part of an index is basic indexing: an int, a slice, ``None`` or ``...`` (no array, no bool)."""
    return isinstance(part, (int, np.integer, slice, type(None), type(Ellipsis))) and not isinstance(part, bool)


def _whole_rows(target: Any, index: Any, values: Any) -> bool:
    """Whether ``target[index] += values`` adds whole rows of a row-major NumPy ``target`` picked by one
    integer array, ``values`` shaped ``index.shape + target.shape[1:]``: an embedding's backward."""
    return (isinstance(target, np.ndarray) and target.ndim >= 2 and target.flags.c_contiguous
            and isinstance(index, np.ndarray) and index.dtype.kind in "iu"
            and np.shape(values) == index.shape + target.shape[1:])


def _add_rows_elementwise(target: Any, rows: Any, values: Any) -> None:
    """``np.add.at(target, rows, values)`` for whole rows, 5-6x faster and bit for bit the same.

    ``np.add.at`` with a row index takes a slow general loop; on the flat array, with the index of
    every element (row * width + column), it takes NumPy's one-dimensional fast loop, and still adds
    each element's values one at a time in the order they come, so the sums round identically.
    A negative row ``r`` becomes a negative flat index ``r * width + column``, which counts from the end
    exactly as the row does; a row outside ``[-rows, rows)`` lands outside the flat array: IndexError.
    """
    width = math.prod(target.shape[1:])
    elements = rows.astype(np.intp).reshape(-1, 1) * width + np.arange(width)
    np.add.at(target.reshape(-1), elements.reshape(-1), np.asarray(values).reshape(-1))


class Backend:
    """Array math for one device. Subclasses set ``xp`` and override what differs.

    The reference implementation below is written for NumPy; CuPy and the strict
    test device reuse it, since their namespaces mirror NumPy's.
    """

    kind = "cpu"

    def __init__(self, device: str, xp: Any) -> None:
        self.device = device
        self.xp = xp
        self.seed(_seed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r})"

    def __reduce__(self) -> tuple:
        # Pickling a tensor (or deep-copying a model) refers to its device by name.
        return get_backend, (self.device,)

    # -- arrays --------------------------------------------------------------
    def is_array(self, obj: Any) -> bool:
        """True when ``obj`` is an array that lives on this backend's device."""
        return isinstance(obj, np.ndarray)

    def asarray(self, data: Any, dtype: Any = None) -> Any:
        """An array on this device from host data (lists, scalars, NumPy arrays)."""
        return self.xp.asarray(data, dtype=dtype)

    def from_host(self, array: np.ndarray) -> Any:
        """A NumPy array on this device: a copy on a GPU, the array itself here."""
        return self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        """An array of this device as a NumPy array: a copy from a GPU, the array itself here."""
        return np.asarray(array)

    def scatter_add(self, target: Any, index: Any, values: Any) -> None:
        """``target[index] += values`` in place, adding up repeated indices.

        Only an integer array in ``index`` can name a position twice, and only then
        is ``np.add.at`` (which adds element by element) needed. Any other index
        (ints, slices, ``None``, ``...``) picks a view of distinct positions, where
        one vectorised add is exact and 20-100x faster. Both cast as ``np.add.at``
        does (unsafely: float values added to an int target are truncated). Whole
        rows picked by one integer array (an embedding's backward) go to ``np.add.at``
        element by element on the flat array, its fast loop (:func:`_add_rows_elementwise`).
        """
        parts = index if isinstance(index, tuple) else (index,)
        if all(_is_basic(part) for part in parts):
            view = target[parts if Ellipsis in parts else parts + (Ellipsis,)]  # `...` keeps even one element a view
            np.add(view, values, out=view, casting="unsafe")
        elif _whole_rows(target, index, values):
            _add_rows_elementwise(target, index, values)
        else:
            np.add.at(target, index, values)

    def pad(self, array: Any, pad_width: Any, value: float = 0.0) -> Any:
        """Pad with a constant; ``pad_width`` as in ``numpy.pad``."""
        return self.xp.pad(array, pad_width, mode="constant", constant_values=value)

    # -- random numbers ------------------------------------------------------
    def supports_dtype(self, dtype: Any) -> bool:
        """Whether arrays of this device can hold ``dtype``. NumPy holds every dtype a tensor
        can have; a GPU library may lack one (bfloat16), and a backend says so here."""
        return True

    def seed(self, seed: int | None) -> None:
        """Restart this device's random generator from ``seed``."""
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def _float_dtype(dtype: Any) -> np.dtype:
        """``dtype``, which a generator can draw in: float32 or float64 (TypeError naming it otherwise)."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"random numbers come as float32 or float64, not {dtype}; draw one of those and cast "
                            "with .astype(...)")
        return dtype

    def random_normal(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> Any:
        """Samples of N(0, 1)."""
        return self.rng.standard_normal(shape, dtype=self._float_dtype(dtype))

    def random_uniform(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> Any:
        """Samples of U[0, 1)."""
        return self.rng.random(shape, dtype=self._float_dtype(dtype))

    def permutation(self, n: int) -> Any:
        """A random permutation of ``range(n)`` as an int64 array."""
        return self.rng.permutation(n)

    def rng_state(self) -> dict:
        """The generator's state as plain data (numbers, strings, dicts)."""
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


_seed: int | None = None  # the last manual_seed, so backends created later start from it too


def manual_seed(seed: int) -> None:
    """Seed Python's, NumPy's and every tinytrain backend's random generators."""
    global _seed
    _seed = seed
    random.seed(seed)
    np.random.seed(seed)
    for backend in loaded_backends():
        backend.seed(seed)


class NumpyBackend(Backend):
    """The CPU: NumPy arrays in host memory."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(device, np)


# %% [markdown]
# ### Device names and the registry
#
# `parse_device("cuda:1")` returns `("cuda", 1)`; a name without an index has
# index `None`: `parse_device("cuda")` is `("cuda", None)`, `parse_device("cpu")`
# is `("cpu", None)`. `get_backend(device)` normalises the name (`"cuda"` and
# `"cuda:0"` are both `"cuda:0"`; there is one CPU, `"cpu"`), creates the backend
# the first time it is asked for, and returns the **same object** every later
# time, for every spelling of the device (`"strict"`, `"strict:0"` and
# `"strict:00"` are one device) — so two tensors are on the same device exactly when
# `a._backend is b._backend`, a check that costs nothing.
#
# An unknown device must fail loudly and say what *is* available.

# %% export="backend"
_FACTORIES: dict[str, Callable[[str], Backend]] = {}
_BACKENDS: dict[str, Backend] = {}


def register_backend(kind: str, factory: Callable[[str], Backend] | str) -> None:
    """Make devices ``kind`` / ``kind:N`` available; ``factory(device)`` builds one.

    ``factory`` may also name a class as ``"package.module:Class"``; it is imported
    the first time such a device is asked for. So the registry knows every device
    by name without importing its backend: CuPy loads only when a GPU is used, and
    backend modules (which import this one for ``Backend``) are never imported back.
    """
    _FACTORIES[kind] = _import_when_called(factory) if isinstance(factory, str) else factory


def _import_when_called(path: str) -> Callable[[str], Backend]:
    """A factory that imports the class ``"package.module:Class"`` when first called."""
    module, _, name = path.partition(":")

    def factory(device: str) -> Backend:
        return getattr(importlib.import_module(module), name)(device)

    return factory


def parse_device(device: str) -> tuple[str, int | None]:
    """Split ``"cuda:1"`` into ``("cuda", 1)``; ``"cpu"`` into ``("cpu", None)``.

    Raises ``TypeError`` when ``device`` is not a string, and ``ValueError`` for a
    malformed name or an unknown kind of device (naming the known kinds); every
    message names the ``device`` it was given. The index after ``:`` is ASCII digits
    only (``"cuda:0"``, ``"strict:00"``): ``"cuda:-1"``, ``"cuda:+1"``, ``"cuda: 1"``,
    ``"cuda:1_0"`` and ``"cuda:"`` are malformed, although ``int()`` takes some of them.
    """
    ### BEGIN SOLUTION
    if not isinstance(device, str):
        raise TypeError(f"a device is a string such as 'cpu' or 'cuda:0', got {device!r}")
    kind, colon, index = device.partition(":")
    if kind not in _FACTORIES:
        raise ValueError(f"unknown device {device!r}; known device kinds: {', '.join(sorted(_FACTORIES))}")
    if not colon:
        return kind, None
    if not (index.isascii() and index.isdigit()):  # isdigit alone takes '²', which int() refuses
        raise ValueError(f"malformed device {device!r}: the index after ':' must be a non-negative integer")
    return kind, int(index)
    ### END SOLUTION


def get_backend(device: str | Backend | None = None) -> Backend:
    """The (cached) backend for ``device``; ``None`` means ``"cpu"``.

    Every spelling of one device gives the same object: ``"cpu"`` and ``"cpu:0"``
    (there is one CPU: any index names it, as in PyTorch), ``"strict"``, ``"strict:0"``
    and ``"strict:00"``. Anything but a name, a ``Backend`` or ``None`` raises
    ``parse_device``'s ``TypeError``.
    """
    if isinstance(device, Backend) or (not isinstance(device, str) and device in _BACKENDS.values()):
        return device  # the second test: a backend whose class comes from another copy of Backend (a notebook's)
    if device is None:
        device = "cpu"
    backend = _BACKENDS.get(device) if isinstance(device, str) else None  # parse_device names anything else
    if backend is None:
        ### BEGIN SOLUTION
        kind, index = parse_device(device)
        name = kind if kind == "cpu" else f"{kind}:{index or 0}"
        backend = _BACKENDS.get(name)
        if backend is None:
            backend = _FACTORIES[kind](name)
            _BACKENDS[name] = backend
        _BACKENDS[device] = backend
        ### END SOLUTION
    return backend


def loaded_backends() -> list[Backend]:
    """Every backend created so far (for seeding and saving random states)."""
    return list(dict.fromkeys(_BACKENDS.values()))


def backend_of_array(array: Any) -> Backend | None:
    """The loaded backend whose device holds ``array``, if any."""
    for backend in loaded_backends():
        if backend.is_array(array):
            return backend
    return None


def memory_order(array: Any) -> str:
    """``"F"`` for an array stored column-major only (a transposed matrix, say), otherwise ``"C"``.

    An elementwise operation on two arrays of one shape but different orders
    walks one of them against its memory order, a cache miss per element: an
    in-place ``a += b`` on a 256x784 float32 matrix took 944 µs instead of 24 µs
    (4x for a new array). So a gradient, and every optimizer buffer, takes the
    memory order of its parameter.
    """
    flags = array.flags
    return "F" if flags.f_contiguous and not flags.c_contiguous else "C"


register_backend("cpu", NumpyBackend)
register_backend("cuda", "tinytrain.cuda:CupyBackend")  # Module 12
register_backend("strict", "tinytrain.testing.strict:StrictBackend")  # the test device

# %% check=1
assert parse_device("cpu") == ("cpu", None)
assert parse_device("cuda:1") == ("cuda", 1)
assert get_backend("cpu") is get_backend() is get_backend(None)
assert get_backend("cpu").xp is np
try:
    parse_device("tpu")
except ValueError as error:
    assert "tpu" in str(error) and "cpu" in str(error), error
else:
    raise AssertionError("an unknown device must raise ValueError")
print("registry OK")

# %% [markdown]
# ### Bad arguments fail where they come in
#
# `parse_device(3.25)` does not fail somewhere deep inside, with a message about
# string methods that names nothing you wrote: it fails at once and says what it
# got. The whole library does the same for every public argument. An error names
# **the argument, the value it got and what was expected** —
# `batch_size must be a whole number >= 1, got batch_size=0` — and is raised where
# the argument comes in, before anything has changed. A bad value that travels
# on fails far from its cause (a `DataLoader(5)` would fail only at its first
# batch), or, worse, never fails: `int(2.5)` is 2, so a shape `(2.5, 3)` would
# quietly become `(2, 3)`.
#
# The checks are given helpers in `tinytrain.arguments`, used from here on
# (`parse_device`, above, comes first and checks its argument itself):
# `check_int`, `check_number` (with bounds), `check_type`, `check_callable` and
# `check_methods` (for "anything with a `step()` method"). Each returns the
# value, so a check is one line: `self.p = check_number("p", p, minimum=0, below=1)`.
# A wrong type raises `TypeError`, a value out of range `ValueError`.

# %% export="arguments"
"""Checks of the arguments of the public API: every error names the argument, the value and what was expected.

Each check returns the value (``check_int`` an ``int``, ``check_number`` a
``float``) and raises ``TypeError`` for a wrong type, ``ValueError`` for a value
out of range.
"""
import math
from typing import Any

import numpy as np


def _got(name: str, value: Any, with_type: bool = False) -> str:
    """``"got name=value"`` (a long repr shortened), and the value's type for a type error."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"got {name}={shown}" + (f" of type {type(value).__name__}" if with_type else "")


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an ``int``: a Python or NumPy integer (a bool is not one), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a whole number, {_got(name, value, with_type=True)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, {_got(name, value)}")
    return int(value)


def check_number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
                 above: float | None = None, below: float | None = None, finite: bool = True) -> float:
    """``value`` as a ``float``: a real number (not a bool, never NaN), finite unless ``finite=False``,
    ``>= minimum``, ``<= maximum``, ``> above`` and ``< below`` for the bounds given."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, {_got(name, value, with_type=True)}")
    value = float(value)
    inside = ((minimum is None or value >= minimum) and (maximum is None or value <= maximum)
              and (above is None or value > above) and (below is None or value < below))
    if not inside or math.isnan(value) or (finite and math.isinf(value)):
        lower = f"[{minimum}" if minimum is not None else f"({above}" if above is not None else ""
        upper = f"{maximum}]" if maximum is not None else f"{below})" if below is not None else ""
        if lower and upper:
            bounds = f" in {lower}, {upper}"
        elif lower:
            bounds = f" {'>=' if lower[0] == '[' else '>'} {lower[1:]}"
        elif upper:
            bounds = f" {'<=' if upper[-1] == ']' else '<'} {upper[:-1]}"
        else:
            bounds = ""
        raise ValueError(f"{name} must be a {'finite ' if finite else ''}number{bounds}, {_got(name, value)}")
    return value


def check_type(name: str, value: Any, expected: type | tuple[type, ...], what: str) -> Any:
    """``value`` itself when it is an instance of ``expected``; ``what`` says what was expected ("a dict")."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be {what}, {_got(name, value, with_type=True)}")
    return value


def check_callable(name: str, value: Any, what: str) -> Any:
    """``value`` itself when it can be called."""
    if not callable(value):
        raise TypeError(f"{name} must be {what}, {_got(name, value, with_type=True)}")
    return value


def check_methods(name: str, value: Any, methods: tuple[str, ...], what: str) -> Any:
    """``value`` itself when it has every one of ``methods``: what the caller will call on it."""
    missing = [method for method in methods if not callable(getattr(value, method, None))]
    if missing:
        raise TypeError(f"{name} must be {what}, {_got(name, value, with_type=True)}, which has no "
                        + ", ".join(missing))
    return value


# %%
for bad in (lambda: check_int("shape[0]", 2.5),
            lambda: check_number("p", 1.5, minimum=0, below=1),
            lambda: check_methods("optimizer", "sgd", ("step",), "an optimizer such as SGD(params, lr=0.1)")):
    try:
        bad()
    except (TypeError, ValueError) as error:
        print(f"{type(error).__name__}: {error}")

# %% [markdown]
# ## 2. From Python data to an array: the dtype rules
#
# A tensor stores its numbers in one array of one **dtype**. Deep learning runs
# on 32-bit floats: half the memory and roughly twice the speed of float64, with
# more precision than gradient descent can use. Python floats and NumPy's default
# float64 therefore become **float32**. Integers stay integers — as **int64** —
# because class labels and indices must not silently turn into floats. Booleans
# stay booleans. An explicit `dtype=` always wins, if it is one of these kinds:
# the given `tensor_dtype` refuses any other (`complex64`, strings) with a `TypeError`.
# One floating-point dtype is not NumPy's own: **bfloat16** (`tt.bfloat16`,
# `dtype="bfloat16"`: 2 bytes, float32's range with less precision; Module 17),
# which the `ml_dtypes` package adds to NumPy. Ask for it with `dtype=` (from
# float data or a tensor). NumPy files it under a kind of its own (`"V"`), so
# the given code asks `is_floating(dtype)` where it means "a float".
#
# | input                         | dtype     |
# |-------------------------------|-----------|
# | `1.5`, `[0.1, 0.2]`, float64 array | float32 |
# | float16 / float32 array       | unchanged |
# | `3`, `[1, 2]`, int8/uint8/int32 array | int64 |
# | `True`, bool array            | bool      |

# %% export="tensor"
"""The Tensor: an n-dimensional array on a device, plus what autograd needs.

A ``Tensor`` wraps one array of its device's backend (``t.data``). Arithmetic
operators and methods build :mod:`tinytrain.ops` operations, which record the
computation graph that :mod:`tinytrain.autograd` differentiates.
"""
from typing import Any, Sequence

import numpy as np

from tinytrain import autograd, ops
from tinytrain.arguments import check_int
from tinytrain.backend import BFLOAT16, DEFAULT_FLOAT, Backend, backend_of_array, get_backend, is_floating

bfloat16 = BFLOAT16
float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
bool_ = np.dtype("bool")


def tensor_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype, if a tensor can hold it (bool, integer or floating point,
    bfloat16 included: ``"bfloat16"`` and ``tt.bfloat16`` name it).

    Every ``dtype=`` a user passes goes through here, so ``zeros(2, dtype="complex64")``
    raises ``TypeError`` naming the dtype, as ``Tensor`` of complex data does.
    """
    dtype = np.dtype(dtype)
    if dtype.kind not in "biu" and not is_floating(dtype):
        raise TypeError(f"a tensor holds bool, integer or floating-point numbers, not dtype={dtype}")
    return dtype


def default_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a tensor gets for data of ``dtype`` when none is asked for.

    float64 becomes the default float (float32); every integer dtype, signed or
    unsigned, becomes int64 (a uint64 value above ``2**63 - 1`` wraps around in
    the cast, as NumPy's ``astype`` does); every other dtype (bool, float16,
    float32, longdouble) stays as it is.
    """
    ### BEGIN SOLUTION
    if dtype == float64:
        return DEFAULT_FLOAT
    if dtype.kind in "iu":
        return int64
    return dtype
    ### END SOLUTION


# %% check=1
assert default_dtype(np.dtype("float64")) == np.float32
assert default_dtype(np.dtype("float16")) == np.float16
assert default_dtype(np.dtype("uint8")) == np.int64
assert default_dtype(np.dtype("bool")) == np.bool_
print("dtype rules OK")

# %% [markdown]
# ## 3. The `Tensor` class
#
# A tensor holds
#
# * `data` — the array, owned by the tensor's backend;
# * `requires_grad` — whether gradients should flow into it;
# * `grad` — its gradient (a `Tensor`) after `backward()`, else `None`;
# * `_ctx` — the operation that produced it (Module 02), `None` for a *leaf*;
# * `_backend` — the backend of its device.
#
# `__slots__` keeps tensors small and attribute access fast: a training step
# creates thousands of them.
#
# `Tensor(data, dtype=, device=)` stores what `to_array` (below — you write it)
# returns.
# Operations create their results with the cheap `Tensor._make`, which wraps an
# array that is already right and skips all checks.
#
# Operators are one-liners: each hands the arrays to an *operation* from
# `tinytrain.ops` (written in Module 02). A Python number on the other side of an
# operator becomes a 0-d array of the tensor's dtype, so `x * 2` stays float32.
# Where an operation mixes kinds of dtype (bool < integer < float), the result
# has the higher kind's dtype, as in PyTorch: an int64 mask times a float32
# activation is float32, and `exp`, `mean` or `/` of integers give float32.
# NumPy alone would make those float64, and every layer after them with it.

# %% export="tensor"
Shape = tuple[int, ...]


def _shape_arg(shape: tuple, name: str = "shape", minimum: int | None = 0) -> Shape:
    """Accept both ``f(2, 3)`` and ``f((2, 3))``; every entry a whole number >= ``minimum``
    (``int(2.5)`` would make a shape of 2.5 a shape of 2 without a word)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if all(type(n) is int for n in shape) and (minimum is None or min(shape, default=minimum) >= minimum):
        return tuple(shape)  # plain ints, as almost every call passes: no per-entry check and message to build
    return tuple(check_int(f"{name}[{i}]", n, minimum) for i, n in enumerate(shape))


def _axes_arg(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...] | None:
    """Normalise an axis argument to a tuple of non-negative axes (or ``None``).

    A 0-d tensor takes axis 0 or -1, as in PyTorch, and reduces over nothing (``()``).
    """
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for ax in axes:
        if not -max(ndim, 1) <= ax < max(ndim, 1):
            raise ValueError(f"axis {ax} is out of range for a tensor with {ndim} dimensions")
    return tuple(ax % ndim for ax in axes) if ndim else ()


def _axis_arg(axis: int, ndim: int) -> int:
    """One axis (softmax's), as a non-negative int; a tuple raises ``TypeError`` instead of using its first."""
    if not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be one int, got axis={axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a tensor with {ndim} dimensions")
    return int(axis) % ndim


# Kinds of dtype, lowest first: an operation mixing kinds computes in the highest one. "V" is
# bfloat16's kind (a float: ``tensor_dtype`` admits no other dtype of kind "V").
_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2}


def _promoted(tensors: Sequence["Tensor"], true_division: bool = False) -> list["Tensor"]:
    """``tensors`` cast so that an operation on them gets PyTorch's result dtype, not NumPy's.

    Kinds rank bool < integer < float. Tensors of a lower kind than the highest
    present are cast to the dtype NumPy gives those of the highest kind: an int64
    mask times a float32 activation is float32 (NumPy makes it float64, and so
    every layer after it), a bool tensor times an int64 one is int64. Tensors of
    one kind are left to NumPy (float32 with float64 gives float64). With
    ``true_division``, integers and booleans divide as ``DEFAULT_FLOAT``: ``1 / 2`` is 0.5.
    """
    ranks = [_KIND_RANK[t.dtype.kind] for t in tensors]
    top = max(ranks)
    if true_division and top < _KIND_RANK["f"]:
        return [t.astype(DEFAULT_FLOAT) for t in tensors]
    if min(ranks) == top:
        return list(tensors)
    target = np.result_type(*[t.dtype for t, rank in zip(tensors, ranks) if rank == top])
    return [t if rank == top else t.astype(target) for t, rank in zip(tensors, ranks)]


_constants: dict = {}


def _constant(value: Any, dtype: np.dtype, backend: Backend) -> "Tensor":
    """A shared, read-only 0-d tensor for a Python number.

    ``x * 0.5`` in a training loop would otherwise build the same tiny array on
    every step; caching it is a large share of a small operation's cost.
    """
    key = (value, dtype, backend)
    constant = _constants.get(key)
    if constant is None:
        if len(_constants) > 1024:  # e.g. a learning rate that changes every step
            _constants.clear()
        constant = Tensor._make(backend.asarray(value, dtype=dtype), backend)
        _constants[key] = constant
    return constant


class Tensor:
    """An n-dimensional array on a device, with an optional gradient."""

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_backend")
    __array_ufunc__ = None  # `ndarray + Tensor` defers to Tensor.__radd__
    __hash__ = object.__hash__  # `==` builds a tensor, so hash by identity

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None, device: Any = None) -> None:
        self.data, self._backend = to_array(data, None if dtype is None else tensor_dtype(dtype), device)
        self.grad: Tensor | None = None
        self._ctx = None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_()

    @staticmethod
    def _make(data: Any, backend: Backend, requires_grad: bool = False) -> "Tensor":
        """Wrap an array that already has the right device and dtype (no copy)."""
        tensor = object.__new__(Tensor)
        tensor.data = data
        tensor._backend = backend
        tensor.requires_grad = requires_grad
        tensor.grad = None
        tensor._ctx = None
        return tensor

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Switch gradient tracking on (or off) for this leaf; returns ``self``."""
        if requires_grad and not is_floating(self.dtype):
            raise TypeError(f"only floating-point tensors can require gradients, got dtype {self.dtype}")
        self.requires_grad = requires_grad
        return self

    # -- what it is ------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def device(self) -> str:
        return self._backend.device

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        values = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        extras = [f"dtype={self.dtype}"]
        if self.device != "cpu":
            extras.append(f"device={self.device!r}")
        if self._ctx is not None:
            extras.append(f"grad_fn=<{type(self._ctx).__name__}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return f"tensor({values}, {', '.join(extras)})"

    # -- moving data out and around ----------------------------------------------
    def numpy(self) -> np.ndarray:
        """A NumPy copy of the values (copied from the device if needed)."""
        return np.array(self._backend.to_host(self.data), copy=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(t)``: a CPU tensor's array itself, as in PyTorch (a copy where
        ``dtype`` or ``copy=True`` asks for one). A tensor on another device refuses, as
        a CuPy array does: the copy to the host is ``t.numpy()``, never implicit."""
        if self.device != "cpu":
            raise TypeError(f"a tensor on {self.device!r} is not converted to NumPy implicitly; "
                            "use t.numpy() (a copy on the host)")
        return np.array(self.data, dtype=dtype, copy=copy)

    def item(self) -> int | float | bool:
        """The single value of a one-element tensor as a Python number."""
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with exactly one element, got shape {self.shape}")
        return self.data.item()

    def to(self, device: Any) -> "Tensor":
        """This tensor on ``device`` (itself if already there); gradients flow back."""
        target = get_backend(device)
        if target is self._backend:
            return self
        return ops.To.apply(self, source=self._backend, target=target)

    def detach(self) -> "Tensor":
        """The same values, sharing memory, cut off from the graph."""
        return Tensor._make(self.data, self._backend)

    def astype(self, dtype: Any) -> "Tensor":
        """A copy cast to ``dtype`` (differentiable between float dtypes)."""
        dtype = tensor_dtype(dtype)
        if dtype == self.dtype:
            return self
        return ops.Cast.apply(self, dtype=dtype)

    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (Module 02).

        An array or a list ``grad`` becomes a tensor of this tensor's dtype straight away
        (through the default float32 it would round a float64 gradient)."""
        if grad is not None and not isinstance(grad, Tensor):
            grad = Tensor(grad, dtype=self.dtype, device=self._backend)
        autograd.backward(self, grad, retain_graph=retain_graph)

    # -- operators -----------------------------------------------------------------
    def _operand(self, other: Any) -> "Tensor":
        """``other`` as a tensor on this device.

        A number takes this tensor's dtype where its kind fits in it, as in PyTorch:
        ``x * 2`` stays float32 and ``x * np.float64(2)`` too. A float with an integer
        or bool tensor is ``DEFAULT_FLOAT`` (``ids * 0.5`` must not truncate 0.5 to 0),
        an int with a bool tensor int64 (``mask * 3`` is 3, not True).
        """
        if isinstance(other, Tensor):
            if other._backend is not self._backend:
                raise RuntimeError(
                    f"expected tensors on the same device, got {self.device} and {other.device}; "
                    "move one with .to(device)"
                )
            return other
        if isinstance(other, (bool, np.bool_)):
            return _constant(other, self.dtype, self._backend)
        if isinstance(other, (int, np.integer)):
            return _constant(other, self.dtype if self.dtype.kind != "b" else int64, self._backend)
        if isinstance(other, (float, np.floating)):
            return _constant(other, self.dtype if is_floating(self.dtype) else DEFAULT_FLOAT, self._backend)
        return Tensor(other, device=self._backend)

    def _operands(self, other: Any, true_division: bool = False) -> Sequence["Tensor"]:
        """``(self, other)`` for an arithmetic operator: ``other`` made an operand and
        both cast by ``_promoted`` where their kinds differ."""
        dtype = self.data.dtype
        if dtype.kind == "f":  # the common cases first: every operator pays for this test
            if type(other) is float:
                return self, _constant(other, dtype, self._backend)
            other = self._operand(other)
            if other.data.dtype.kind == "f":
                return self, other
        else:
            other = self._operand(other)
        return _promoted([self, other], true_division)

    def __add__(self, other: Any) -> "Tensor":
        return ops.Add.apply(*self._operands(other))

    def __radd__(self, other: Any) -> "Tensor":
        return ops.Add.apply(*reversed(self._operands(other)))

    def __sub__(self, other: Any) -> "Tensor":
        return ops.Sub.apply(*self._operands(other))

    def __rsub__(self, other: Any) -> "Tensor":
        return ops.Sub.apply(*reversed(self._operands(other)))

    def __mul__(self, other: Any) -> "Tensor":
        return ops.Mul.apply(*self._operands(other))

    def __rmul__(self, other: Any) -> "Tensor":
        return ops.Mul.apply(*reversed(self._operands(other)))

    def __truediv__(self, other: Any) -> "Tensor":
        return ops.Div.apply(*self._operands(other, true_division=True))

    def __rtruediv__(self, other: Any) -> "Tensor":
        return ops.Div.apply(*reversed(self._operands(other, true_division=True)))

    def __pow__(self, exponent: Any) -> "Tensor":
        return ops.Pow.apply(*self._operands(exponent))

    def __rpow__(self, base: Any) -> "Tensor":
        return ops.Pow.apply(*reversed(self._operands(base)))

    def __matmul__(self, other: Any) -> "Tensor":
        return ops.MatMul.apply(*self._operands(other))

    def __rmatmul__(self, other: Any) -> "Tensor":
        return ops.MatMul.apply(*reversed(self._operands(other)))

    def __neg__(self) -> "Tensor":
        return ops.Neg.apply(self)

    # Comparisons give boolean tensors and are not differentiable. ``t == None`` is
    # False, as in PyTorch (NotImplemented lets Python compare by identity).
    def _compare(self, other: Any, compare: Any) -> "Tensor":
        if other is None:
            return NotImplemented
        return Tensor._make(compare(self.data, self._operand(other).data), self._backend)

    def __lt__(self, other: Any) -> "Tensor":
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other: Any) -> "Tensor":
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other: Any) -> "Tensor":
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other: Any) -> "Tensor":
        return self._compare(other, lambda a, b: a >= b)

    def __eq__(self, other: Any) -> "Tensor":  # type: ignore[override]
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other: Any) -> "Tensor":  # type: ignore[override]
        return self._compare(other, lambda a, b: a != b)

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    # -- indexing --------------------------------------------------------------------
    def _index(self, index: Any) -> Any:
        """An index with tensors and lists replaced by arrays of this device."""
        if isinstance(index, tuple):
            return tuple(self._index(part) for part in index)
        if isinstance(index, Tensor):
            return index.data
        if isinstance(index, list):  # [] would be a float64 array, which NumPy refuses as an index
            return self._backend.asarray(index) if index else self._backend.asarray(index, dtype=int64)
        if isinstance(index, np.ndarray):  # a host index array is copied to the device, as CuPy does
            return self._backend.from_host(index)
        return index

    def __getitem__(self, index: Any) -> "Tensor":
        return ops.GetItem.apply(self, index=self._index(index))

    def __setitem__(self, index: Any, value: Any) -> None:
        if self.requires_grad and autograd.is_grad_enabled():
            raise RuntimeError("in-place assignment to a tensor that requires grad; use `with tt.no_grad():`")
        self.data[self._index(index)] = self._operand(value).data

    # -- shape -------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> "Tensor":
        return ops.Reshape.apply(self, shape=_shape_arg(shape, minimum=-1))  # -1: the size that fits

    def transpose(self, *axes: Any) -> "Tensor":
        """Permute axes like ``numpy.transpose``; no arguments reverses them."""
        axes = _shape_arg(axes, "axes", minimum=None) if axes else tuple(reversed(range(self.ndim)))
        return ops.Transpose.apply(self, axes=axes)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    # -- reductions ------------------------------------------------------------------------
    def sum(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        return ops.Sum.apply(self, axis=_axes_arg(axis, self.ndim), keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        return ops.Mean.apply(self._floating(), axis=_axes_arg(axis, self.ndim), keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        """Largest values; tied maxima share the gradient equally."""
        return ops.Max.apply(self, axis=_axes_arg(axis, self.ndim), keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        return -((-self).max(axis, keepdims))

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> "Tensor":
        """Index of the largest value (an int64 tensor, not differentiable)."""
        return Tensor._make(self._backend.xp.argmax(self.data, axis=axis, keepdims=keepdims), self._backend)

    # -- elementwise functions -----------------------------------------------------------
    def _floating(self) -> "Tensor":
        """Itself, or a ``DEFAULT_FLOAT`` copy of an integer or bool tensor: ``exp``, ``mean``
        and the like of integers are float32, as in PyTorch (NumPy makes them float64)."""
        return self if is_floating(self.data.dtype) else self.astype(DEFAULT_FLOAT)

    def exp(self) -> "Tensor":
        return ops.Exp.apply(self._floating())

    def log(self) -> "Tensor":
        return ops.Log.apply(self._floating())

    def sqrt(self) -> "Tensor":
        return ops.Sqrt.apply(self._floating())

    def tanh(self) -> "Tensor":
        return ops.Tanh.apply(self._floating())

    def sigmoid(self) -> "Tensor":
        return ops.Sigmoid.apply(self._floating())

    def relu(self) -> "Tensor":
        return ops.ReLU.apply(self)

    def abs(self) -> "Tensor":
        return ops.Abs.apply(self)

    def clip(self, min: float | None = None, max: float | None = None) -> "Tensor":
        return ops.Clip.apply(self, low=min, high=max)

    def softmax(self, axis: int = -1) -> "Tensor":
        return ops.Softmax.apply(self._floating(), axis=_axis_arg(axis, self.ndim))

    def log_softmax(self, axis: int = -1) -> "Tensor":
        return ops.LogSoftmax.apply(self._floating(), axis=_axis_arg(axis, self.ndim))


# %% [markdown]
# Now the conversion itself. `to_array(data, dtype, device)` returns the array a
# new tensor will hold and the backend of its device, in three steps:
#
# 1. **Where is the data now?** A `Tensor` knows its backend; an array of some
#    loaded backend (a NumPy array is on the CPU, a CuPy array on a GPU) is found
#    by `backend_of_array`; anything else (a list, a number) is host data:
#    `np.asarray` it and treat it as CPU data (a Python number too: `3.5` is
#    float64 data, so it becomes float32). Whatever the source (a NumPy array,
#    a device array or host data), only numbers (bool, int, float kinds) can
#    become tensors: anything else (complex, strings) raises `TypeError` naming
#    the dtype as NumPy prints it (`<U1` for strings).
# 2. **Move it** if `device` names another backend (not the one it is on):
#    `target.from_host(source.to_host(array))`.
# 3. **Cast it** to `dtype` when one is given, whatever the data (a tensor
#    too). With no `dtype`, a tensor keeps its own dtype and anything else gets
#    `default_dtype(...)` of its array's dtype. Either way the result is
#    row-major: `astype(..., order="C")`. A transposed array (`x.T`) is stored
#    column-major, and arithmetic that mixes the two orders is several times
#    slower (see `memory_order` above), so every new tensor starts row-major.
#
# The result must never share memory with the caller's data: if no step made a
# copy, copy it — otherwise changing your NumPy array later would change the
# tensor behind your back. Copy *only* then: a move to another device or a cast
# already made a new array, and a second copy would double the memory and time
# that converting a large tensor costs. Careful with step 1: `np.asarray` builds
# a new array only from Python lists, tuples and numbers. Of anything else it
# may hand back the caller's memory: a *view* of a `memoryview`, or the very
# array an object returns from its `__array__` method (a pandas column, say —
# `array.base` is `None` then, yet the object still holds that array). So only
# an array built from a list, a tuple or a number counts as a copy.

# %% export="tensor"
def to_array(data: Any, dtype: Any = None, device: Any = None) -> tuple[Any, Backend]:
    """A fresh array holding ``data`` on ``device`` and its backend.

    ``device`` is a name (``"cuda:1"``) or a ``Backend`` object, as ``get_backend`` takes;
    ``None`` (the default) keeps the data where it is -- unlike ``get_backend(None)``,
    which means the CPU: a tensor or an array of another device stays on that device.
    """
    ### BEGIN SOLUTION
    fresh = False  # whether `array` is a new array that no one else holds
    if isinstance(data, Tensor):
        array, source, natural = data.data, data._backend, data.dtype
    else:
        source = backend_of_array(data)
        if source is None:
            array, source = np.asarray(data), get_backend("cpu")
            fresh = isinstance(data, (list, tuple, int, float))  # built by asarray; anything else may be the caller's
        else:
            array = data
        if array.dtype.kind not in "biuf":
            raise TypeError(f"cannot make a tensor from {type(data).__name__} data of dtype {array.dtype}")
        natural = default_dtype(array.dtype)
    target = source if device is None else get_backend(device)
    if target is not source:
        array, fresh = target.from_host(source.to_host(array)), True
    converted = array.astype(natural if dtype is None else np.dtype(dtype), order="C", copy=False)
    if converted is array and not fresh:
        converted = converted.copy()
    return converted, target
    ### END SOLUTION


# %% check=1
array, backend = to_array([[1.0, 2.0]])
assert array.dtype == np.float32 and array.shape == (1, 2) and backend is get_backend("cpu")
assert to_array(np.arange(3, dtype=np.uint8))[0].dtype == np.int64
assert to_array([1, 2], dtype="float64")[0].dtype == np.float64
source = np.zeros(2, dtype=np.float32)
assert to_array(source)[0] is not source, "the array must be a copy"
strict_array, strict = to_array([1.0, 2.0], device="strict")
assert strict.device == "strict:0" and strict.is_array(strict_array)
try:
    to_array(["a", "b"])
except TypeError as error:
    assert "<U1" in str(error), error
else:
    raise AssertionError("strings cannot become a tensor")
print("to_array OK")


# %% [markdown]
# Try it. A tensor prints its values, dtype and — when not on the CPU — device:

# %%
x = Tensor([[1.0, 2.0], [3.0, 4.0]])
labels = Tensor([3, 1, 4])
print(x)
print(labels)
print(x.shape, x.dtype, x.device, labels.dtype)

# %% check=1
x = Tensor([[1.0, 2.0], [3.0, 4.0]])
assert x.shape == (2, 2) and x.dtype == np.float32 and x.device == "cpu"
assert Tensor(np.arange(3)).dtype == np.int64
assert Tensor(np.zeros(2, dtype=np.float16)).dtype == np.float16
assert Tensor([1, 2], dtype="float64").dtype == np.float64
source = np.ones(3)
copy = Tensor(source)
source[0] = 5.0
assert copy.numpy()[0] == 1.0, "a tensor must not share memory with the data it was built from"
assert Tensor(7).item() == 7 and isinstance(Tensor(2.5).item(), float)
try:
    Tensor([1.0, 2.0]).item()
except ValueError as error:
    assert "(2,)" in str(error), error
else:
    raise AssertionError("item() of a 2-element tensor must raise ValueError")
print("Tensor construction OK")

# %% [markdown]
# The operators work because the package ships the operations. Broadcasting
# follows NumPy: shapes are aligned from the right, and a dimension of size 1
# stretches to match.

# %%
a = Tensor([[1.0], [2.0], [3.0]])  # (3, 1)
b = Tensor([10.0, 20.0])  # (2,)
print((a + b).shape)  # (3, 2)
print((a * 2 - 1).numpy().ravel())
print(x @ x, x.sum(axis=0), x.T, sep="\n")

# %% [markdown]
# ## 4. Factories
#
# `zeros`, `ones`, `randn` (standard normal) and `rand` (uniform on [0, 1)) take
# a shape either as separate numbers or as one tuple, plus `dtype`, `device` and
# `requires_grad`. Their given first line turns the shape into a tuple of whole
# numbers >= 0 (or raises, naming the bad entry), so `shape` is `(2, 3)` for both
# `zeros(2, 3)` and `zeros((2, 3))`, and `()` for `zeros()` (a 0-d tensor: one
# number); the given `_filled` does the rest of the bookkeeping. Random numbers
# come from the device's backend (`random_normal(shape, dtype)`), drawn in the
# dtype asked for: float32 or float64, the backend refuses others. A float64
# tensor drawn as float32 and cast would have only float32's precision. The
# generator makes them reproducible: `tt.manual_seed(0)` repeats them.

# %% export="tensor"
def tensor(data: Any, requires_grad: bool = False, dtype: Any = None, device: Any = None) -> Tensor:
    """A new tensor holding a copy of ``data`` (same as ``Tensor(...)``)."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype, device=device)


def _filled(fill: Any, shape: Shape, dtype: Any, device: Any, requires_grad: bool) -> Tensor:
    """A tensor of ``shape`` (a tuple, from ``_shape_arg``) whose array ``fill(backend, shape, dtype)`` makes."""
    backend = get_backend(device)
    dtype = DEFAULT_FLOAT if dtype is None else tensor_dtype(dtype)
    array = fill(backend, shape, dtype)
    return Tensor._make(array, backend).requires_grad_(requires_grad)


def zeros(*shape: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape = _shape_arg(shape)
    ### BEGIN SOLUTION
    return _filled(lambda b, s, d: b.xp.zeros(s, dtype=d), shape, dtype, device, requires_grad)
    ### END SOLUTION


def ones(*shape: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape = _shape_arg(shape)
    ### BEGIN SOLUTION
    return _filled(lambda b, s, d: b.xp.ones(s, dtype=d), shape, dtype, device, requires_grad)
    ### END SOLUTION


def randn(*shape: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape = _shape_arg(shape)
    ### BEGIN SOLUTION
    return _filled(lambda b, s, d: b.random_normal(s, d), shape, dtype, device, requires_grad)
    ### END SOLUTION


def rand(*shape: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape = _shape_arg(shape)
    ### BEGIN SOLUTION
    return _filled(lambda b, s, d: b.random_uniform(s, d), shape, dtype, device, requires_grad)
    ### END SOLUTION


def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = None, device: Any = None) -> Tensor:
    """Evenly spaced values in [start, stop), like ``numpy.arange`` (ints stay int64).

    With one bound, ``arange(stop, step=...)`` counts from 0. A zero ``step`` raises ``ValueError``.
    """
    if step == 0:
        raise ValueError(f"arange: step must not be 0, got start={start!r}, stop={stop!r}, step={step!r}")
    return Tensor(get_backend(device).xp.arange(start, stop, step), dtype=dtype)  # stop=None: start is the stop


def _some_operands(function: str, tensors: Sequence[Tensor]) -> list[Tensor]:
    """``tensors``, which must not be empty, as operands on the first one's device, cast by ``_promoted``."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{function} needs at least one tensor, got tensors={tensors!r}")
    first, *rest = tensors
    return _promoted([first, *(first._operand(t) for t in rest)])


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join same-shaped tensors along a new axis."""
    return ops.Stack.apply(*_some_operands("stack", tensors), axis=axis)


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an existing axis."""
    return ops.Concatenate.apply(*_some_operands("concatenate", tensors), axis=axis)


def where(condition: Any, a: Any, b: Any) -> Tensor:
    """Elementwise ``a if condition else b``; gradients flow to ``a`` and ``b``."""
    anchor = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else Tensor(a)
    condition = anchor._operand(condition).data.astype(bool, copy=False)
    a, b = _promoted([anchor._operand(a), anchor._operand(b)])
    try:
        return ops.Where.apply(a, b, condition=condition)
    except ValueError as error:  # Where's own message names a and b only: the condition is a parameter
        raise ValueError(f"where: condition of shape {condition.shape}, a of shape {a.shape} and b of shape "
                         f"{b.shape} do not broadcast together") from error


# %% check=1
assert zeros(2, 3).shape == zeros((2, 3)).shape == (2, 3)
assert ones(4, dtype="float64").dtype == np.float64 and ones(4).numpy().sum() == 4
manual_seed(0)
first = randn(3, 4)
manual_seed(0)
assert np.array_equal(first.numpy(), randn(3, 4).numpy()), "manual_seed must make randn reproducible"
u = rand(1000)
assert u.dtype == np.float32 and 0.0 <= u.numpy().min() and u.numpy().max() < 1.0
assert zeros(2, requires_grad=True).requires_grad
print("factories OK")

# %% [markdown]
# ## 5. Systems: what a dtype and a device cost
#
# Memory is `elements × bytes per element`. A 784×256 weight matrix — the first
# layer of this course's MLP — takes:

# %%
for dtype in ("float16", "float32", "float64"):
    w = zeros(784, 256, dtype=dtype)
    print(f"{dtype:8s} {w.data.nbytes / 1024:8.0f} KiB")

# %% [markdown]
# Moving data between devices is a copy. The `strict` device used by the tests
# lives in host memory, so the copy is cheap here; to and from a real GPU it
# crosses the PCIe bus (roughly 10–25 GB/s, against hundreds of GB/s inside GPU
# memory) — which is why a training loop keeps the model and each batch on one
# device. Time a round trip:

# %%
big = randn(1024, 1024)
start = time.perf_counter()
for _ in range(10):
    big.to("strict").to("cpu")
elapsed = (time.perf_counter() - start) / 10
print(f"round trip of {big.data.nbytes / 2**20:.0f} MiB: {elapsed * 1e3:.2f} ms")

# %% [markdown]
# ## How PyTorch does it
#
# `torch.tensor(data)` copies like our `Tensor(data)`; `torch.from_numpy` shares
# memory instead. PyTorch's default dtype is also float32 and integer data becomes
# int64. Devices are `torch.device("cuda:0")`; `x.to("cuda")` moves a tensor;
# mixing devices in one operation raises, as ours does. Where we have a registry of
# Python backends, PyTorch has a *dispatcher* that picks a compiled kernel by
# device and dtype for every operation.
#
# ## Summary
#
# * A backend bundles an array namespace with host transfer, scatter-add, padding
#   and random numbers; a registry maps device names to cached backends.
# * Floats become float32, integers int64; an explicit dtype wins; constructing a
#   tensor copies.
# * Operators delegate to operations — how those compute gradients is Module 02.
