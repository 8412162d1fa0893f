"""``tinytrain.kernels.parts``: a batch cut into parts that fit the processor's caches."""
from __future__ import annotations

import math

import numpy as np

import tinytrain as tt
from tinytrain.kernels.parts import CACHE_BYTES, cache_sized_parts


def test_parts_cover_the_batch_once_in_order_and_fit_the_cache() -> None:
    for shape in [(64, 288, 784), (128, 72, 196), (5, 3, 4), (1, 9, 9), (3, 1024, 1024)]:
        parts = cache_sized_parts(np, np.empty(shape, np.float32))
        covered = [index for part in parts for index in range(shape[0])[part]]
        assert covered == list(range(shape[0])), shape
        per_image = 4 * math.prod(shape[1:])
        sizes = [len(range(shape[0])[part]) for part in parts]
        if per_image <= CACHE_BYTES:
            assert all(size * per_image <= CACHE_BYTES for size in sizes), shape
        else:  # an image larger than the cache: one at a time
            assert sizes == [1] * shape[0], shape
    assert len(cache_sized_parts(np, np.empty((128, 72, 196), np.float32))) == 4  # 56 kB an image: 37 per part


def test_an_empty_batch_gets_one_empty_part() -> None:
    assert cache_sized_parts(np, np.empty((0, 4, 4), np.float32)) == [slice(0, 0)]


def test_other_devices_get_one_part_of_everything() -> None:
    """A GPU wants one large operation; the strict device stands in for it."""
    strict = tt.get_backend("strict").xp
    array = strict.zeros((64, 288, 784), dtype=np.float32)
    assert cache_sized_parts(strict, array) == [slice(0, 64)]
