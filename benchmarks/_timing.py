"""Shared helpers for the benchmarks: one BLAS thread, median timings.

Import this module before NumPy (or PyTorch): it pins every BLAS and OpenMP
pool to one thread, because two-thread timings on small VMs swing by 10x.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")


def median_seconds(step: Callable[[], object], repeats: int = 30, warmup: int = 5, inner: int = 1) -> float:
    """Median wall time of ``step`` (called ``inner`` times per sample) after warm-up."""
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            step()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def torch_or_none():
    """PyTorch pinned to one thread, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch
