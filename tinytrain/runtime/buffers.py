"""A cache of large arrays for processes whose C library gives freed memory back to the OS.

A training step allocates the same large temporaries every time and frees them
again. Where the C library returns big freed blocks to the operating system,
the next step pays a page fault for every 4 KiB it touches again: Module 11,
section 8, counts about 8,000 faults per MNIST-shaped CNN step, and about 4,300
(the step 1.3-1.8x faster) when the convolutions take their columns, results
and gradients from this cache. Where :mod:`tinytrain.runtime.allocator` keeps freed memory in
the heap instead (glibc, on Linux: what ``import tinytrain`` does), a fresh array
reuses memory the last step just used and the step runs faster than with the
cache's own arrays, so the cache is switched off there (``buffers.max_bytes == 0``)
and serves where the C library cannot be told (macOS, musl).

``buffers`` is the process's cache; the convolution kernels of
:mod:`tinytrain.kernels.convolution` take their arrays from it.
"""
import math
import sys
from typing import Any

import numpy as np

from tinytrain.runtime import allocator

# The most the cache keeps where it is on: the arrays of a CIFAR-sized CNN step (about 25-50 MiB) with room to spare.
MAX_BYTES = 128 << 20


class BufferCache:
    """Reusable arrays for large results and temporaries.

    ``empty(xp, shape, dtype)`` is ``xp.empty(shape, dtype=dtype)`` and ``zeros`` is
    ``xp.zeros``, except that for NumPy they return an array created earlier when
    nothing outside the cache refers to it any more — Python's reference count says
    so exactly: an array held by a tensor, saved by a graph, or viewed by another
    array is never handed out twice. So an array from the cache is as safe to
    return from ``Function.backward`` as a new one. At most ``max_bytes`` are kept,
    the least recently used dropped first; larger arrays are never kept. ``clear()``
    drops them all, and ``max_bytes = 0`` turns the cache off. Other devices
    allocate directly (CuPy has a memory pool of its own), and so does a Python
    without ``sys.getrefcount`` (PyPy): without it nothing says an array is free.
    """

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._arrays: list[np.ndarray] = []  # least recently used first
        # The reference count of an array that only the cache's list refers to, measured
        # exactly the way _free() measures it (the number differs between Python versions).
        self._alone = next(map(sys.getrefcount, [np.empty(0)])) if hasattr(sys, "getrefcount") else None

    def empty(self, xp: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array of ``shape`` and ``dtype`` on ``xp``'s device."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if xp is not np or self._alone is None or nbytes > self.max_bytes:
            return xp.empty(shape, dtype=dtype)
        free = self._free()
        for index in free:
            array = self._arrays[index]
            if array.shape == shape and array.dtype == dtype:
                self._arrays.append(self._arrays.pop(index))  # now the most recently used
                return array
        kept = self.nbytes
        for index in free:  # least recently used first: drop unused arrays to make room
            if kept + nbytes <= self.max_bytes:
                break
            kept -= self._arrays[index].nbytes
            self._arrays[index] = None
        self._arrays = [array for array in self._arrays if array is not None]
        array = xp.empty(shape, dtype=dtype)
        if kept + nbytes <= self.max_bytes:
            self._arrays.append(array)
        return array

    def zeros(self, xp: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """An array of zeros of ``shape`` and ``dtype`` on ``xp``'s device."""
        if xp is not np:
            return xp.zeros(shape, dtype=dtype)
        array = self.empty(xp, shape, dtype)
        array.fill(0)
        return array

    def _free(self) -> list[int]:
        """Indices of the cached arrays that nothing else refers to."""
        return [index for index, count in enumerate(map(sys.getrefcount, self._arrays)) if count <= self._alone]

    def clear(self) -> None:
        """Drop every cached array (those in use stay alive with their users)."""
        self._arrays = []

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache, in use or not."""
        return sum(array.nbytes for array in self._arrays)


buffers = BufferCache(max_bytes=0 if allocator.in_effect() else MAX_BYTES)
