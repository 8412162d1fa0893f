"""A FAKE CuPy for tests and lessons: the CUDA backend's logic, without a GPU.

This is **not CuPy and not a GPU**. It is a stand-in module built on tinytrain's
strict device (:mod:`tinytrain.testing.strict`) that offers the few parts of CuPy's API
that :class:`tinytrain.cuda.CupyBackend` uses, behaving the way CuPy documents
them, so that the backend's own logic -- which device an array lands on, device
index checks, scatter-add routing, saving and restoring random states -- can be
run and tested on any machine:

* arrays are :class:`~tinytrain.testing.strict.StrictArray` s on one of ``devices`` fake
  GPUs; like CuPy arrays they refuse implicit conversion to NumPy and refuse
  mixing with another device's arrays; ``array.device.id`` is the GPU's index;
* every function that *makes* an array (``asarray``, ``zeros``, random draws)
  makes it on the **current device**, as CuPy does; ``asarray`` copies a host
  NumPy array to it, ``asnumpy`` copies back;
* ``cuda.Device(i)`` is a context manager with ``.use()`` and ``.id``;
  ``cuda.runtime`` answers ``getDeviceCount``, ``getDevice``, ``setDevice``,
  ``runtimeGetVersion``, ``driverGetVersion`` and ``getDeviceProperties``;
* ``random.RandomState(seed, method)`` belongs to the device that was current
  when it was made (as a cuRAND generator does), refuses to draw while another
  device is current, and takes seeds as strictly as CuPy's ``seed()`` does
  under NumPy 2 (a ``numpy.uint64`` works; a plain Python ``int`` does not);
* ``cupyx.scatter_add`` accepts only the dtypes CuPy's ``atomicAdd`` kernel does;
* bfloat16 (ml_dtypes') is refused wherever an array is made, with CuPy's
  ``ValueError: Unsupported dtype bfloat16``, as by a CuPy without bfloat16
  support; ``FakeCupy(bfloat16=True)`` plays one that has it.

What it cannot show: speed, memory limits, asynchronous kernels, cuRAND's actual
numbers, and CuPy running a kernel on the *current* device (the fake's arithmetic
runs wherever its operands live). Use it as ``FakeCupy(devices=2)`` and pass it to
``CupyBackend(device, cupy=fake, cupyx=fake.cupyx)``; :func:`register_fake_gpu`
makes devices ``"fakecuda:N"`` that the whole library can use.
"""
from __future__ import annotations

import itertools
import types
import weakref
from typing import Any, Callable

import numpy as np

from tinytrain.backend import BFLOAT16
from tinytrain.testing.strict import StrictArray, StrictNamespace

# cuRAND generator types, as cupy.cuda.curand names them (the values are cuRAND's).
CURAND_RNG_PSEUDO_DEFAULT = 100
CURAND_RNG_PSEUDO_XORWOW = 101
CURAND_RNG_PSEUDO_MRG32K3A = 121
CURAND_RNG_PSEUDO_MTGP32 = 141
CURAND_RNG_PSEUDO_MT19937 = 142
CURAND_RNG_PSEUDO_PHILOX4_32_10 = 161

# The dtypes CuPy's scatter-add kernel accepts (atomicAdd); int64 is not among them.
SCATTER_ADD_DTYPES = tuple(np.dtype(name) for name in ("int32", "uint32", "uint64", "float16", "float32", "float64"))


_LIVE: "weakref.WeakValueDictionary[int, FakeCupy]" = weakref.WeakValueDictionary()  # token -> fake
_TOKENS = itertools.count()


def _device_of(token: int, index: int) -> "FakeDevice":
    """Unpickle a FakeDevice: the same device of the same (living) FakeCupy."""
    fake = _LIVE.get(token)
    if fake is None:
        raise RuntimeError("this array belonged to a FakeCupy that no longer exists (fake GPUs live in one process)")
    return FakeDevice(fake, index)


class FakeDevice:
    """``cupy.cuda.Device(i)`` of a :class:`FakeCupy`: ``.id``, ``.use()``, a context manager.

    Arrays carry one as their ``.device``; it pickles as a reference to its fake,
    so fake-GPU arrays (and tensors) pickle and deep-copy within the process.
    """

    def __init__(self, fake: "FakeCupy", index: int | None = None) -> None:
        self._fake = fake
        self.id = fake._current if index is None else int(index)
        if not 0 <= self.id < fake.device_count:
            raise RuntimeError(f"fake CUDA error: invalid device ordinal {self.id} ({fake.device_count} fake GPU(s))")
        self._saved: list[int] = []

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FakeDevice):
            return other._fake is self._fake and other.id == self.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash((id(self._fake), self.id))

    def __repr__(self) -> str:
        return f"<fake CUDA Device {self.id}>"

    def __reduce__(self) -> tuple:
        return _device_of, (self._fake._token, self.id)

    @property
    def compute_capability(self) -> str:
        major, minor = self._fake.compute_capability
        return f"{major}{minor}"

    def use(self) -> None:
        self._fake.cuda.runtime.setDevice(self.id)

    def __enter__(self) -> "FakeDevice":
        self._saved.append(self._fake._current)
        self._fake.cuda.runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._fake.cuda.runtime.setDevice(self._saved.pop())

    def synchronize(self) -> None:
        """Nothing to wait for: the fake computes eagerly."""


class FakeRuntime:
    """``cupy.cuda.runtime`` of a :class:`FakeCupy`; it counts ``setDevice`` calls."""

    def __init__(self, fake: "FakeCupy") -> None:
        self._fake = fake
        self.set_device_calls = 0

    def getDeviceCount(self) -> int:  # noqa: N802 (CuPy's names)
        return self._fake.device_count

    def getDevice(self) -> int:  # noqa: N802
        return self._fake._current

    def setDevice(self, index: int) -> None:  # noqa: N802
        if not 0 <= index < self._fake.device_count:
            raise RuntimeError(f"fake CUDA error: invalid device ordinal {index}")
        self.set_device_calls += 1
        self._fake._current = index

    def runtimeGetVersion(self) -> int:  # noqa: N802
        return self._fake.runtime_version

    def driverGetVersion(self) -> int:  # noqa: N802
        return self._fake.driver_version

    def getDeviceProperties(self, index: int) -> dict[str, Any]:  # noqa: N802
        major, minor = self._fake.compute_capability
        return {"name": f"Fake GPU {index} (strict device, not a GPU)".encode(), "major": major, "minor": minor,
                "totalGlobalMem": 16 * 2**30}


class FakeRandomState:
    """``cupy.random.RandomState``: a generator that lives on the device current at its creation."""

    def __init__(self, fake: "FakeCupy", seed: Any = None, method: int = CURAND_RNG_PSEUDO_DEFAULT) -> None:
        self._fake = fake
        self.method = method
        self.device_id = fake._current
        self.seed(seed)

    def seed(self, seed: Any = None) -> None:
        if seed is None:
            seed = int.from_bytes(np.random.default_rng().bytes(8), "little")
        else:
            # CuPy's own conversion; under NumPy 2 a plain Python int (an int64 0-d array) fails it.
            seed = int(np.asarray(seed).astype(np.uint64, casting="safe"))
        self._rng = np.random.Generator(np.random.Philox(key=seed))

    def _on(self, values: np.ndarray) -> StrictArray:
        if self._fake._current != self.device_id:
            raise RuntimeError(
                f"fake cuRAND error: the generator lives on device {self.device_id} but device "
                f"{self._fake._current} is current"
            )
        return StrictArray(values, self._fake.device())

    @staticmethod
    def _float(dtype: Any) -> np.dtype:
        dtype = np.dtype(dtype)
        if dtype.char not in "fd":
            raise TypeError("cupy.random only supports float32 and float64")
        return dtype

    def standard_normal(self, size: Any = None, dtype: Any = float) -> StrictArray:
        return self._on(self._rng.standard_normal(size, dtype=self._float(dtype)))

    def random_sample(self, size: Any = None, dtype: Any = float) -> StrictArray:
        return self._on(self._rng.random(size, dtype=self._float(dtype)))

    def permutation(self, n: int) -> StrictArray:
        return self._on(self._rng.permutation(n))


class _CurrentDeviceNamespace(types.ModuleType):
    """NumPy's namespace (``path`` below numpy) acting on the fake's current device.

    As in CuPy, the device is the one current when a function is *called*, not
    when it was looked up: functions come back as :class:`_CurrentDeviceFunction`.
    """

    def __init__(self, fake: "FakeCupy", path: tuple[str, ...]) -> None:
        super().__init__("fake_cupy." + ".".join(path) if path else "fake_cupy")
        self._fake = fake
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = self._fake._resolve(self._path + (name,))
        if isinstance(value, StrictNamespace):
            return _CurrentDeviceNamespace(self._fake, self._path + (name,))
        if callable(value) and not isinstance(value, type):
            return _CurrentDeviceFunction(self._fake, self._path + (name,))
        return value


class _CurrentDeviceFunction:
    """A NumPy function or ufunc of the fake, run on the device current at call time."""

    __slots__ = ("_fake", "_path")

    def __init__(self, fake: "FakeCupy", path: tuple[str, ...]) -> None:
        self._fake = fake
        self._path = path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fake._held(self._fake._resolve(self._path)(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # ufunc methods: add.at, maximum.reduce
        value = getattr(self._fake._resolve(self._path), name)
        return _CurrentDeviceFunction(self._fake, self._path + (name,)) if callable(value) else value

    def __repr__(self) -> str:
        return f"<fake cupy.{'.'.join(self._path)}>"


class FakeCupy(_CurrentDeviceNamespace):
    """A fake ``cupy`` module with ``devices`` fake GPUs (see the module docstring).

    ``runtime_version`` / ``driver_version`` are CUDA versions as CUDA encodes them
    (12080 is 12.8); ``compute_capability`` is ``(major, minor)``; ``bfloat16``: whether
    it holds ml_dtypes' bfloat16 arrays.
    """

    ndarray = StrictArray

    def __init__(self, devices: int = 2, version: str = "13.6.0", runtime_version: int = 12080,
                 driver_version: int = 12080, compute_capability: tuple[int, int] = (8, 0),
                 bfloat16: bool = False) -> None:
        super().__init__(self, ())
        if devices < 1:
            raise ValueError("a FakeCupy needs at least one fake GPU")
        self.__version__ = version
        self.device_count = devices
        self.runtime_version = runtime_version
        self.driver_version = driver_version
        self.compute_capability = compute_capability
        self.bfloat16 = bfloat16
        self._current = 0
        self._token = next(_TOKENS)
        _LIVE[self._token] = self
        self._namespaces = [StrictNamespace(np, FakeDevice(self, index)) for index in range(devices)]
        self.cuda = types.SimpleNamespace(
            Device=lambda index=None: FakeDevice(self, index),
            runtime=FakeRuntime(self),
            curand=types.SimpleNamespace(**{name: value for name, value in globals().items()
                                            if name.startswith("CURAND_")}),
            get_device_id=lambda: self._current,
        )
        self.random = types.SimpleNamespace(RandomState=lambda seed=None, method=CURAND_RNG_PSEUDO_DEFAULT:
                                            FakeRandomState(self, seed, method))
        self.cupyx = FakeCupyx(self)

    def __repr__(self) -> str:
        return f"<FakeCupy: {self.device_count} fake GPU(s) on the strict device -- not CuPy, not a GPU>"

    def _resolve(self, path: tuple[str, ...]) -> Any:
        """The object at ``path`` in the namespace of the current device."""
        value: Any = self._namespaces[self._current]
        for part in path:
            value = getattr(value, part)
        return value

    def _held(self, result: Any) -> Any:
        """``result``, unless it is an array of a dtype this CuPy cannot hold (CuPy's error then)."""
        if isinstance(result, StrictArray) and result.dtype == BFLOAT16 and not self.bfloat16:
            raise ValueError(f"Unsupported dtype {result.dtype}")
        return result

    def device(self, index: int | None = None) -> FakeDevice:
        """The device object that this fake's arrays carry (current device by default)."""
        return FakeDevice(self, self._current if index is None else index)

    @staticmethod
    def is_available() -> bool:
        return True

    def asarray(self, data: Any, dtype: Any = None) -> StrictArray:
        """Like ``cupy.asarray``: host data (NumPy arrays too) is copied to the current device."""
        if isinstance(data, StrictArray):
            return self._held(data if dtype is None or data.dtype == np.dtype(dtype) else data.astype(dtype))
        if isinstance(data, np.ndarray):
            return self._held(StrictArray(np.array(data, dtype=dtype, copy=True), self.device()))
        return self._held(self._namespaces[self._current].asarray(data, dtype=dtype))

    def array(self, data: Any, dtype: Any = None, copy: bool = True, order: str = "K") -> StrictArray:
        if isinstance(data, np.ndarray):
            return self._held(StrictArray(np.array(data, dtype=dtype, copy=True, order=order), self.device()))
        return self._held(self._namespaces[self._current].array(data, dtype=dtype, copy=copy, order=order))

    def asnumpy(self, array: Any, order: str = "C") -> np.ndarray:
        """Like ``cupy.asnumpy``: a host copy of a device array (host data passes through);
        ``order="A"`` keeps a column-major array column-major."""
        if isinstance(array, StrictArray):
            if not isinstance(array.device, FakeDevice) or array.device._fake is not self:
                raise TypeError(f"asnumpy of an array of another device: {array.device!r}")
            return array._array.copy(order=order)
        return np.asarray(array)


class FakeCupyx(types.ModuleType):
    """The fake ``cupyx``: ``scatter_add`` with CuPy's dtype rules; it records each call's dtype."""

    def __init__(self, fake: FakeCupy) -> None:
        super().__init__("fake_cupyx")
        self._fake = fake
        self.scatter_add_dtypes: list[np.dtype] = []

    def scatter_add(self, a: StrictArray, slices: Any, value: Any) -> None:
        dtype = a.dtype
        if dtype not in SCATTER_ADD_DTYPES:
            raise TypeError("scatter_add only supports int32, float16, float32, float64, uint32, uint64, as data type")
        self.scatter_add_dtypes.append(dtype)
        value = value.astype(dtype) if isinstance(value, StrictArray) else value
        np.add.at(a, slices, value)  # dispatches to the strict device, which refuses host arrays


def register_fake_gpu(backend_class: Callable[..., Any], devices: int = 2, kind: str = "fakecuda",
                      **settings: Any) -> FakeCupy:
    """Make devices ``"fakecuda:0"`` .. ``"fakecuda:<devices-1>"`` run ``backend_class`` on a new FakeCupy.

    ``backend_class`` is a CupyBackend (the package's, or the one written in the
    lesson); ``settings`` go to :class:`FakeCupy`. Backends of ``kind`` created
    earlier are forgotten, so re-running a notebook cell starts afresh.
    """
    from tinytrain import backend as registry

    fake = FakeCupy(devices, **settings)
    for name in [name for name in registry._BACKENDS if name.partition(":")[0] == kind]:
        del registry._BACKENDS[name]
    registry.register_backend(kind, lambda device: backend_class(device, cupy=fake, cupyx=fake.cupyx))
    return fake


def forget_fake_gpu(kind: str = "fakecuda") -> None:
    """Undo :func:`register_fake_gpu`: the device kind and its backends are gone."""
    from tinytrain import backend as registry

    for name in [name for name in registry._BACKENDS if name.partition(":")[0] == kind]:
        del registry._BACKENDS[name]
    registry._FACTORIES.pop(kind, None)
