"""Keep freed array memory in the process instead of handing it back to the OS.

A training step allocates the same large temporaries every time (activations,
gradients, ``lr * momentum``) and frees them again. With its default settings
glibc's ``malloc`` gives big freed blocks back to the operating system as soon
as enough free memory collects at the top of its heap, and the next step pays a
page fault for every 4 KiB it takes back: we measured 360 faults and +80% time
per MLP step, depending only on the order in which the arrays happened to be
freed. ``keep_freed_memory`` sets two ``mallopt`` thresholds so that blocks
below 32 MiB always come from the heap and up to 1 GiB of free heap is kept for
reuse. A process then keeps about its peak memory until it exits, as PyTorch's
caching allocators do.

It is applied when ``tinytrain`` is imported; set ``TINYTRAIN_KEEP_FREED_MEMORY=0``
to leave the C library's defaults alone. Other C libraries (macOS, musl) are left
as they are. ``in_effect()`` says whether the settings hold; where they do not,
the convolution kernels keep their large arrays themselves (``tinytrain.runtime.buffers``).
``return_freed_memory()`` puts glibc's default thresholds back, for comparisons.
"""
import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # from glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's own ceiling for its adaptive threshold
TRIM_THRESHOLD = 2**30
DEFAULT_THRESHOLD = 128 * 2**10  # glibc's starting value of both
DISABLE_VARIABLE = "TINYTRAIN_KEEP_FREED_MEMORY"

_in_effect = False


def in_effect() -> bool:
    """Whether this process keeps freed memory (``keep_freed_memory`` succeeded and was not undone)."""
    return _in_effect


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module docstring); whether it did."""
    global _in_effect
    if os.environ.get(DISABLE_VARIABLE, "1") == "0" or not _set_thresholds(MMAP_THRESHOLD, TRIM_THRESHOLD):
        return False
    _in_effect = True
    return True


def return_freed_memory() -> bool:
    """Put glibc's default thresholds (128 KiB) back; whether it did.

    glibc starts from these values and raises the mmap threshold as large blocks
    come and go; after this call it no longer does, so the defaults are the
    pessimistic end of what an untouched process sees.
    """
    global _in_effect
    if not _set_thresholds(DEFAULT_THRESHOLD, DEFAULT_THRESHOLD):
        return False
    _in_effect = False
    return True


def _set_thresholds(mmap_threshold: int, trim_threshold: int) -> bool:
    """``mallopt`` both thresholds on glibc; False elsewhere (macOS, musl) or when it refuses."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
