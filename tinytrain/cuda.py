"""The CUDA backend: CuPy arrays in GPU memory.

Imported only when a ``"cuda"`` device is asked for, so tinytrain works without
CuPy. CuPy mirrors NumPy's namespace, so the only differences from the NumPy
backend are host transfer, scatter-add and the random generator.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tinytrain.backend import DEFAULT_FLOAT, Backend

INSTALL_HINT = (
    "pip install 'tinytrain[cuda12]' for CUDA 12 or 'tinytrain[cuda13]' for CUDA 13 "
    "(`nvidia-smi` shows your driver's CUDA version)"
)


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as error:
        raise RuntimeError(f"device 'cuda' needs CuPy, which is not installed: {INSTALL_HINT}") from error
    try:
        available = cupy.is_available()
    except Exception as error:  # a CuPy wheel built for another CUDA version fails here
        raise RuntimeError(f"CuPy is installed but cannot use the GPU ({error}); {INSTALL_HINT}") from error
    if not available:
        raise RuntimeError("device 'cuda' was asked for, but CuPy finds no usable CUDA GPU on this machine")
    return cupy


class CupyBackend(Backend):
    """A CUDA GPU through CuPy; ``device`` is ``"cuda:N"``."""

    kind = "cuda"

    def __init__(self, device: str) -> None:
        cupy = _import_cupy()
        index = int(device.partition(":")[2] or 0)
        if index >= cupy.cuda.runtime.getDeviceCount():
            raise RuntimeError(f"device {device!r} does not exist: this machine has "
                               f"{cupy.cuda.runtime.getDeviceCount()} CUDA device(s)")
        self._gpu = cupy.cuda.Device(index)
        super().__init__(device, cupy)

    def is_array(self, obj: Any) -> bool:
        return isinstance(obj, self.xp.ndarray) and obj.device.id == self._gpu.id

    def asarray(self, data: Any, dtype: Any = None) -> Any:
        with self._gpu:
            return self.xp.asarray(data, dtype=dtype)

    def from_host(self, array: np.ndarray) -> Any:
        with self._gpu:
            return self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        return self.xp.asnumpy(array)

    def scatter_add(self, target: Any, index: Any, values: Any) -> None:
        import cupyx

        cupyx.scatter_add(target, index, values)

    def seed(self, seed: int | None) -> None:
        with self._gpu:
            self.rng = self.xp.random.RandomState(seed)

    def random_normal(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> Any:
        with self._gpu:
            return self.rng.standard_normal(shape, dtype=np.dtype(dtype))

    def random_uniform(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> Any:
        with self._gpu:
            return self.rng.random_sample(shape, dtype=np.dtype(dtype))

    def permutation(self, n: int) -> Any:
        with self._gpu:
            return self.rng.permutation(n)

    def rng_state(self) -> dict:
        raise NotImplementedError("saving the CuPy generator's state is not supported yet (Module 10)")

    def set_rng_state(self, state: dict) -> None:
        raise NotImplementedError("restoring the CuPy generator's state is not supported yet (Module 10)")
