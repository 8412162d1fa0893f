"""A strict stand-in device for tests: NumPy arrays that refuse what CuPy refuses.

CI has no GPU, yet most bugs a GPU exposes are about *where data lives*: code
that quietly runs ``np.asarray`` on a device array, mixes a host array into device
arithmetic, or combines arrays of two GPUs. CuPy turns each of those into a
``TypeError``; plain NumPy accepts them all. ``StrictArray`` wraps a NumPy array
and refuses the same things, so running the test suite on device ``"strict"``
makes such a leak fail loudly on any machine.

What is allowed mirrors CuPy: Python and NumPy scalars (and 0-d NumPy arrays) mix
freely; NumPy functions and ufuncs dispatch to the device through the
``__array_function__`` / ``__array_ufunc__`` protocols; ``float()``, ``int()``,
``item()`` and ``tolist()`` read values out explicitly. Like CuPy, results that
NumPy gives as scalars (``a.sum()``, ``a[i, j]``) stay 0-d device arrays, so they
too must be read out explicitly. :func:`host_reads` counts those reads: on a GPU
each one waits for the device, so tests can hold a hot path to the reads it promises.
:func:`float64_promotions` counts the arithmetic that quietly turned float32 (or
float16) arrays into a float64 one, twice the memory traffic on every device.
"""
from __future__ import annotations

import operator
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from tinytrain.backend import DEFAULT_FLOAT, Backend

# Values that may meet strict arrays anywhere, as CuPy allows (bool is an int).
_SCALAR_TYPES = (int, float, complex, np.generic)

_reads = 0  # values read out of strict arrays to the host so far (see host_reads)
_promotions = 0  # ufunc results promoted to float64 from narrower floats (see float64_promotions)


def host_reads() -> int:
    """How many times values have been read from strict arrays to the host so far:
    ``bool()``, ``float()``, ``int()``, ``item()``, ``tolist()``, formatting, printing
    and ``backend.to_host``. Take the difference around the code under test."""
    return _reads


def float64_promotions() -> int:
    """How many ufunc calls (operators, ``xp.sqrt``, ``out=`` too) on strict arrays computed
    in float64 although no array operand was float64 and one was float16 or float32: NumPy's
    promotion by a NumPy float64 scalar (``np.float64(0.1)``, ``np.sqrt(2.0)``) or an
    integer array. With ``out=`` a float32 array the result is cast back, but the loop still
    ran in float64 (``x *= np.float64(0.9)``: other bits, and several times slower). Explicit
    casts (``astype``) are not counted. Take the difference around the code under test."""
    return _promotions


def _count_promotion(operands: list[Any], result: Any) -> None:
    """Count a ufunc call whose floating result is float64, or was computed in float64 (the
    dtype its inputs promote to), while the array operands were narrower floats."""
    global _promotions
    first = result[0] if isinstance(result, tuple) else result
    if getattr(first, "dtype", None) is None or first.dtype.kind != "f":
        return
    arrays = [x for x in operands if isinstance(x, StrictArray)]
    if any(x.dtype == np.float64 for x in arrays) or not any(x.dtype.kind == "f" for x in arrays):
        return
    computed = np.result_type(*[x.dtype if isinstance(x, (StrictArray, np.ndarray)) else x for x in operands])
    if first.dtype == np.float64 or computed == np.float64:
        _promotions += 1


# ndarray attributes that hand out host memory (or write it out), so a strict
# array cannot offer them without defeating its purpose.
_HOST_ONLY = frozenset({"data", "ctypes", "flat", "tobytes", "tofile", "dump", "dumps"})


def _host_array_error(array: np.ndarray) -> TypeError:
    return TypeError(
        f"cannot mix a host numpy.ndarray (shape {array.shape}) with StrictArray "
        "(strict-device) arrays; copy it to the device with backend.from_host(...)"
    )


def _device_mix_error(first: str, second: str) -> TypeError:
    return TypeError(
        f"cannot mix arrays of devices {first!r} and {second!r}; move one to the other's device first"
    )


class _Crossing:
    """One trip from strict arrays into NumPy and back.

    ``unwrap`` swaps each StrictArray in the arguments (also inside lists and
    tuples, as in ``np.concatenate([a, b])`` or ``out=(a,)``) for its NumPy array,
    and refuses what CuPy refuses: a host ``np.ndarray`` with ndim > 0, or an
    array of another device. ``wrap`` turns NumPy results back into StrictArrays
    of that device. A result that *is* one of the unwrapped arrays (``out=``,
    ``asarray(a)``, an in-place operator) maps back to its original wrapper, so
    ``a += 1`` keeps ``a`` the same object, as it does in NumPy and CuPy.
    """

    def __init__(self, device: str | None) -> None:
        self.device = device  # None: the first StrictArray seen decides
        self._originals: dict[int, StrictArray] = {}

    def unwrap(self, obj: Any) -> Any:
        if isinstance(obj, StrictArray):
            if self.device is None:
                self.device = obj.device
            elif obj.device != self.device:
                raise _device_mix_error(self.device, obj.device)
            self._originals[id(obj._array)] = obj
            return obj._array
        if isinstance(obj, np.ndarray) and obj.ndim > 0:
            raise _host_array_error(obj)
        if isinstance(obj, tuple):
            return tuple(self.unwrap(item) for item in obj)
        if isinstance(obj, list):
            return [self.unwrap(item) for item in obj]
        return obj

    def wrap(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            original = self._originals.get(id(obj))
            return original if original is not None else StrictArray(obj, self.device)
        if isinstance(obj, np.generic):
            return StrictArray(np.asarray(obj), self.device)
        if isinstance(obj, (tuple, list)):
            items = [self.wrap(item) for item in obj]
            return obj._make(items) if hasattr(obj, "_make") else type(obj)(items)  # keep namedtuples
        return obj

    def call(self, func: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """``func`` computed by NumPy on the unwrapped arguments, its results wrapped."""
        args = self.unwrap(args)
        kwargs = {name: self.unwrap(value) for name, value in kwargs.items()}
        return self.wrap(func(*args, **kwargs))


class StrictArray(NDArrayOperatorsMixin):
    """A NumPy array living on a strict device: usable like a CuPy array, no more.

    ``array`` is used as is, not copied; ``backend.from_host`` is the copying
    door in. The operators come from ``NDArrayOperatorsMixin`` and so, like every
    NumPy function called on a StrictArray, go through ``__array_ufunc__`` /
    ``__array_function__``, which is where host arrays and other devices are
    refused. The rest of ndarray's methods (``reshape``, ``sum``, ``astype``,
    ``fill``, ...) are delegated by ``__getattr__`` under the same rules.
    """

    __slots__ = ("_array", "_device")

    def __init__(self, array: np.ndarray, device: str) -> None:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"StrictArray wraps a numpy.ndarray, got {type(array).__name__}")
        self._array = array
        self._device = device

    # -- what never leaves the device implicitly ------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        raise TypeError(
            f"implicit conversion of a strict-device array ({self._device!r}) to NumPy; "
            "use backend.to_host(...)"
        )

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        operands = list(inputs) + list(kwargs.get("out", ()))
        if method == "at":
            del operands[1]  # the index of ufunc.at(target, index, values) may be a tuple
        # Like CuPy, operands are arrays or scalars, never lists; an unknown type
        # gets NotImplemented (NEP 13) so that it may handle the operation itself.
        if not all(isinstance(x, (StrictArray, np.ndarray, *_SCALAR_TYPES)) for x in operands):
            return NotImplemented
        result = _Crossing(None).call(getattr(ufunc, method), inputs, kwargs)
        _count_promotion(list(inputs), result)
        return result

    def __array_function__(
        self, func: Callable[..., Any], types: tuple[type, ...], args: tuple, kwargs: dict[str, Any]
    ) -> Any:
        # np.ndarray is listed too when one is among the arguments; the crossing
        # then refuses it with a clearer message than NumPy's "no implementation".
        if not all(issubclass(t, (StrictArray, np.ndarray)) for t in types):
            return NotImplemented
        return _Crossing(None).call(func, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails. Private and special names are not
        # delegated: NumPy probes for __array_interface__ / __array_struct__, and
        # copy/pickle look for hooks before _array exists.
        if name.startswith("_") or name in _HOST_ONLY:
            raise AttributeError(f"'StrictArray' object has no attribute {name!r} (strict device)")
        value = getattr(self._array, name)
        if not callable(value):
            return StrictArray(value, self._device) if isinstance(value, np.ndarray) else value

        def method(*args: Any, **kwargs: Any) -> Any:
            crossing = _Crossing(self._device)
            crossing.unwrap(self)  # so a method returning its own array returns self
            return crossing.call(value, args, kwargs)

        method.__name__ = name
        return method

    # -- attributes read on every operation, kept off the slower __getattr__ --
    @property
    def device(self) -> str:
        return self._device

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def ndim(self) -> int:
        return self._array.ndim

    @property
    def size(self) -> int:
        return self._array.size

    @property
    def T(self) -> StrictArray:
        return StrictArray(self._array.T, self._device)

    # -- indexing --------------------------------------------------------------
    def __getitem__(self, key: Any) -> StrictArray:
        crossing = _Crossing(self._device)
        return crossing.wrap(self._array[crossing.unwrap(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, (StrictArray, np.ndarray, *_SCALAR_TYPES)):
            raise TypeError(
                f"assign a StrictArray or a scalar to a strict-device array, not {type(value).__name__}"
            )
        crossing = _Crossing(self._device)
        self._array[crossing.unwrap(key)] = crossing.unwrap(value)

    def __len__(self) -> int:
        return len(self._array)

    def __iter__(self) -> Iterator[StrictArray]:
        if self._array.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._array)))

    # -- explicit reads: NumPy's rules (size-1 for bool, 0-d for float/int) ----
    def _read(self) -> np.ndarray:
        """The NumPy array, for a read to the host: counted by :func:`host_reads`."""
        global _reads
        _reads += 1
        return self._array

    def __bool__(self) -> bool:
        return bool(self._read())

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def __complex__(self) -> complex:
        return complex(self._read())

    def __index__(self) -> int:
        return operator.index(self._read())

    def __format__(self, spec: str) -> str:
        return format(self._read(), spec)

    def item(self, *args: Any) -> Any:
        return self._read().item(*args)

    def tolist(self) -> Any:
        return self._read().tolist()

    # -- copies and printing ---------------------------------------------------
    def __copy__(self) -> StrictArray:
        # The default copy would share _array; NumPy and CuPy copy the data.
        return StrictArray(self._array.copy(), self._device)

    def __deepcopy__(self, memo: dict) -> StrictArray:
        return self.__copy__()

    def __repr__(self) -> str:
        prefix = "strict_array("
        body = np.array2string(self._read(), separator=", ", prefix=prefix)
        return f"{prefix}{body}, dtype={self._array.dtype}, device={self._device!r})"

    def __str__(self) -> str:
        return str(self._read())


class _StrictFunction:
    """A NumPy function or ufunc called through a StrictNamespace."""

    __slots__ = ("_func", "_device")

    def __init__(self, func: Callable[..., Any], device: str) -> None:
        self._func = func
        self._device = device

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = _Crossing(self._device).call(self._func, args, kwargs)
        if isinstance(self._func, np.ufunc):  # xp.multiply(a, np.float64(2.0)) promotes as a * np.float64(2.0)
            _count_promotion(list(args), result)
        return result

    def __getattr__(self, name: str) -> Any:
        # ufunc methods and attributes: xp.add.at, xp.maximum.reduce, xp.add.nin
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._func, name)
        return _StrictFunction(value, self._device) if callable(value) else value

    def __repr__(self) -> str:
        return f"<{self._func!r} on strict device {self._device!r}>"


# CuPy's functions that call a method of their first argument (``cupy.clip(a, lo, hi)`` is ``a.clip(lo, hi)``):
# a number there fails on a GPU, where NumPy would convert it
_ARRAY_FIRST = frozenset({"clip"})


class _ArrayFirstFunction(_StrictFunction):
    """A function whose first argument must be an array of the device, as CuPy's method-backed ones need."""

    __slots__ = ("_name",)

    def __init__(self, func: Callable[..., Any], device: str, name: str) -> None:
        super().__init__(func, device)
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and not isinstance(args[0], StrictArray):
            raise TypeError(f"xp.{self._name}'s first argument must be an array on a GPU (CuPy's {self._name} calls "
                            f"a.{self._name}(...)), got {type(args[0]).__name__} {args[0]!r}")
        return super().__call__(*args, **kwargs)


class StrictNamespace:
    """NumPy's namespace as seen from one strict device: the backend's ``xp``.

    Functions take StrictArrays of this device, scalars and Python data, and
    return StrictArrays of this device, so creation functions (``zeros``,
    ``arange``, ``asarray([...])``) make arrays there. Host arrays are refused:
    ``backend.from_host`` is the one door in. ``random`` is not offered, because
    random numbers come from the backend, whose generator the library seeds and
    saves. Types (dtypes, ``finfo``) and constants pass through, ``ndarray`` is
    ``StrictArray`` (for ``isinstance`` checks) and submodules (``linalg``,
    ``lib.stride_tricks``) are wrapped the same way.
    """

    def __init__(self, module: ModuleType, device: str) -> None:
        self._module = module
        self._device = device

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "random":
            raise AttributeError(
                "the strict device offers no xp.random: random numbers come from the backend "
                "(backend.random_normal, random_uniform, permutation)"
            )
        value = getattr(self._module, name)
        if value is np.ndarray:
            value = StrictArray
        elif isinstance(value, ModuleType):
            value = StrictNamespace(value, self._device)
        elif name in _ARRAY_FIRST:
            value = _ArrayFirstFunction(value, self._device, name)
        elif callable(value) and not isinstance(value, type):
            value = _StrictFunction(value, self._device)
        setattr(self, name, value)  # cached: the next lookup skips __getattr__
        return value

    def __repr__(self) -> str:
        return f"<{self._module.__name__} on strict device {self._device!r}>"


class StrictBackend(Backend):
    """Device kind ``"strict"``: StrictArrays, computed by NumPy on the host.

    Each device name (``"strict:0"``, ``"strict:1"``) is a separate device whose
    arrays refuse to mix with the other's, so device-mixing bugs show up too.
    ``asarray`` and ``pad`` are inherited: they go through ``xp``, which already
    enforces the rules. Random numbers come from the inherited NumPy generator,
    so a seed gives the same numbers as on the CPU.
    """

    kind = "strict"

    def __init__(self, device: str = "strict:0") -> None:
        super().__init__(device, StrictNamespace(np, device))

    def is_array(self, obj: Any) -> bool:
        return isinstance(obj, StrictArray) and obj.device == self.device

    def from_host(self, array: np.ndarray) -> StrictArray:
        if not isinstance(array, np.ndarray):
            raise TypeError(
                f"from_host copies a numpy.ndarray onto {self.device!r}, got {type(array).__name__}; "
                "use backend.asarray(...) for Python data"
            )
        return StrictArray(np.array(array, copy=True), self.device)

    def to_host(self, array: StrictArray) -> np.ndarray:
        if not self.is_array(array):
            if isinstance(array, StrictArray):
                got = f"an array of {array.device!r}"
            else:
                got = type(array).__name__
            raise TypeError(f"to_host of {self.device!r} takes a StrictArray of that device, got {got}")
        return array._read().copy(order="A")  # like CuPy's asnumpy(order="A"): column-major stays so

    def scatter_add(self, target: StrictArray, index: Any, values: Any) -> None:
        self.xp.add.at(target, index, values)

    def random_normal(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> StrictArray:
        return StrictArray(super().random_normal(shape, dtype), self.device)

    def random_uniform(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> StrictArray:
        return StrictArray(super().random_uniform(shape, dtype), self.device)

    def permutation(self, n: int) -> StrictArray:
        return StrictArray(super().permutation(n), self.device)
