"""A batch in parts that fit the processor's caches, for operations that pass over the same images many times.

im2col writes a column matrix that is 9 times its input for a 3x3 kernel, and the
matrix product reads it back; max pooling reads its input once per window offset.
A whole batch of such arrays is tens of megabytes, more than the caches hold, so
every pass goes out to main memory. Done a part of the batch at a time, each pass
finds what the previous one wrote still in the cache. On our machine that made
im2col and its product about 1.07x faster (Module 11, section 8, measures it) and
the first max pooling of the CIFAR-shaped step, (64, 32, 32, 32), 1.9x faster
forward and backward; smaller poolings gained nothing and lost up to 10%.
"""
from typing import Any

import numpy as np

# On our machine (1 MiB of L2 cache per core, 32 MiB of L3) parts of 2 MiB were the
# fastest of 256 KiB to 8 MiB for im2col and its product, by 5-15%.
CACHE_BYTES = 2 << 20


def cache_sized_parts(xp: Any, array: Any) -> list[slice]:
    """Slices of ``array``'s first (batch) axis, in order, covering it once: each at most
    ``CACHE_BYTES`` of ``array`` and at least one image.

    One slice of everything where ``xp`` is not NumPy: a GPU wants large operations,
    and its caches are not the CPU's. An empty batch gets one empty slice, so that
    code sizing its buffers by the first part still finds one.
    """
    n = array.shape[0]
    per_image = array.nbytes // max(n, 1)
    step = max(1, n if xp is not np else CACHE_BYTES // max(per_image, 1))  # range() needs a step of 1 or more
    return [slice(start, start + step) for start in range(0, n, step)] or [slice(0, 0)]
