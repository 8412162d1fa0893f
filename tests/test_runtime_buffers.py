"""``tinytrain.runtime.buffers``: the cache of large arrays the convolution kernels take theirs from."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tinytrain as tt
import tinytrain.nn as nn
import tinytrain.nn.functional as F
from tinytrain.runtime.buffers import MAX_BYTES, BufferCache, buffers


def test_buffer_cache_reuses_only_unreferenced_arrays() -> None:
    cache = BufferCache(max_bytes=1 << 20)
    a = cache.empty(np, (10, 10), np.float32)
    b = cache.empty(np, (10, 10), np.float32)
    assert a is not b, "a referenced array is never handed out again"
    view, first = a[2:], id(a)
    del a
    c = cache.empty(np, (10, 10), np.float32)
    assert c is not view.base, "a view keeps its base taken"
    del view
    d = cache.empty(np, (10, 10), np.float32)
    assert id(d) == first, "an array nothing refers to any more is handed out again"
    assert cache.empty(np, (10, 10), np.float64).dtype == np.float64
    del c, d
    zeros = cache.zeros(np, (10, 10), np.float32)
    assert zeros.sum() == 0 and zeros.base is None
    assert cache.nbytes == 3 * 400 + 800, "b, c, d(=a) and one float64 array"
    cache.clear()
    assert cache.nbytes == 0


def test_buffer_cache_limits_and_other_devices() -> None:
    cache = BufferCache(max_bytes=1000)
    big = cache.empty(np, (300,), np.float32)  # 1,200 bytes: never kept
    assert cache.nbytes == 0 and big.shape == (300,)
    for _ in range(5):
        cache.empty(np, (100,), np.float32)  # 400 bytes, freed at once: reused
    assert cache.nbytes == 400
    keep = [cache.empty(np, (100,), np.float32), cache.empty(np, (100,), np.float32)]
    assert cache.nbytes == 800
    cache.empty(np, (60,), np.float32)  # 240 more bytes would exceed the limit: not kept
    assert cache.nbytes == 800
    del keep
    cache.empty(np, (60,), np.float32)  # now the unused arrays make room
    assert cache.nbytes <= 1000
    strict = tt.get_backend("strict").xp
    assert type(cache.empty(strict, (4,), np.float32)).__name__ == "StrictArray"
    assert type(cache.zeros(strict, (4,), np.float32)).__name__ == "StrictArray"
    off = BufferCache(max_bytes=0)
    off.empty(np, (4,), np.float32)
    assert off.nbytes == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the allocator settings are glibc's")
@pytest.mark.parametrize("keep_freed_memory, cache_bytes", [("1", 0), ("0", MAX_BYTES)])
def test_the_buffer_cache_is_on_only_where_the_heap_does_not_keep_freed_memory(keep_freed_memory, cache_bytes):
    """With freed memory kept in the C heap the cache only slows a step down (Module 11, section 8)."""
    code = "import tinytrain; from tinytrain.runtime.buffers import buffers; print(buffers.max_bytes)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env={**os.environ, "TINYTRAIN_KEEP_FREED_MEMORY": keep_freed_memory})
    assert int(completed.stdout) == cache_bytes


def test_cached_training_equals_uncached() -> None:
    """Two runs of a few steps, with the process's cache on and off: identical weights."""
    def train() -> list[np.ndarray]:
        tt.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 4, 3),
                              nn.AvgPool2d(2, 1), nn.Flatten(), nn.Linear(4, 3))
        optimizer = tt.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        rng = np.random.default_rng(0)
        for _ in range(4):
            optimizer.zero_grad()
            x, y = tt.tensor(rng.standard_normal((6, 1, 8, 8))), tt.tensor(rng.integers(0, 3, 6))
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        return [p.numpy() for p in model.parameters()]

    limit = buffers.max_bytes
    try:
        buffers.max_bytes = MAX_BYTES
        cached = train()
        assert buffers.nbytes > 0, "the cached run must have used the cache"
        buffers.max_bytes = 0
        buffers.clear()
        uncached = train()
    finally:
        buffers.max_bytes = limit
        buffers.clear()
    for a, b in zip(cached, uncached):
        np.testing.assert_array_equal(a, b)
