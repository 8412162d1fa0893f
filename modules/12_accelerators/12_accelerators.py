# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 12 — Accelerators: tinytrain on a GPU
#
# *One sitting, about 2 hours: the lesson, 8 functions to write, and the measurements.*
#
# Everything so far ran on the CPU, through NumPy. A GPU has thousands of
# arithmetic units and memory that is ten to fifty times faster than a CPU's —
# but it sits at the far end of a bus, it runs only what it is sent, and every
# instruction it is sent costs microseconds before it starts. In this module you
# write the backend that runs tinytrain on NVIDIA GPUs through **CuPy**, and you
# learn when a GPU is worth it and when it is slower than the laptop it is
# plugged into.
#
# **You will**
# 1. see what host memory and device memory are, and measure what crossing
#    between them costs;
# 2. estimate, with a roofline model and numbers, when a layer is bound by
#    arithmetic, by memory or by launch overhead — and why small models can be
#    slower on a GPU;
# 3. write the pieces of the CUDA backend: a random stream whose state is two
#    integers (so GPU runs resume exactly), scatter-add on a GPU, and the copies
#    between host and device;
# 4. run your backend, and a whole training run, on a **fake GPU** made of the
#    strict test device — no GPU needed — and, where a GPU exists, on the real one;
# 5. learn what `cuda:1` means, how tinytrain picks a backend, and how to
#    install the CuPy wheel that matches your machine.
#
# Every check in this notebook runs without a GPU. Cells that need one say so
# and skip themselves when there is none.

# %%
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np

import tinytrain as tt
from tinytrain import nn
from tinytrain.backend import get_backend
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.datasets import Digits
from tinytrain.testing.fake_cupy import FakeCupy, register_fake_gpu


def find_gpu():
    """tinytrain's backend for cuda:0, or None and (the first clause of) the reason there is none."""
    try:
        return get_backend("cuda"), None
    except (RuntimeError, ValueError) as error:
        return None, str(error).split(": pip install")[0]


GPU, NO_GPU_REASON = find_gpu()
print("GPU:", GPU.device if GPU is not None else f"none ({NO_GPU_REASON})")

# %% [markdown]
# ## 1. Host memory and device memory
#
# A CPU and a discrete GPU do not share memory. The CPU's memory (the **host**)
# is DRAM on the motherboard; the GPU's (the **device**) is HBM or GDDR on the
# GPU's own board, wired to the GPU's cores with a very wide bus. Between the
# two sits PCI Express. Rough figures for one current data-centre machine:
#
# | link | bandwidth | source |
# |---|---|---|
# | GPU ↔ its own memory (H100 SXM, HBM3) | 3,350 GB/s | NVIDIA H100 datasheet (2022) |
# | GPU ↔ its own memory (A100 80 GB, HBM2e) | ~2,000 GB/s | NVIDIA A100 datasheet (2021) |
# | CPU ↔ DRAM, desktop DDR5-5600, two channels | ~90 GB/s | 2 × 8 bytes × 5.6 GT/s |
# | host ↔ GPU, PCIe 5.0 ×16, each direction | ~64 GB/s | PCI-SIG (H100 datasheet: 128 GB/s both ways) |
# | host ↔ GPU, PCIe 4.0 ×16, each direction | ~32 GB/s | PCI-SIG |
#
# These are peaks. A copy from ordinary (*pageable*) host memory is staged
# through a pinned buffer by the driver and typically reaches well under the
# PCIe peak; *pinned* (page-locked) memory gets closest (NVIDIA, *CUDA C++ Best
# Practices Guide*, "Pinned Memory"). Either way the bus is 50–100× slower than
# the GPU's own memory, which gives the first rule of GPU training:
#
# > **Move data across the bus once, then keep it there.** Parameters,
# > gradients and optimizer state live on the GPU for the whole run; each batch
# > crosses once; only a few numbers (the loss, the accuracy) come back.
#
# In tinytrain every tensor knows its device (`t.device`), and all of a
# tensor's arithmetic happens on that device through the device's **backend**
# (Module 01). Crossing is always explicit: `t.to("cuda")`, `model.to("cuda")`,
# `DataLoader(..., device="cuda")` — and `t.numpy()` or `t.item()` to come back.
# Mixing devices in one operation is an error, never a silent copy:

# %%
a = tt.ones(3)
b = tt.ones(3, device="strict")
try:
    a + b
except RuntimeError as error:
    print("RuntimeError:", error)
print((a.to("strict") + b).device, (a + b.to("cpu")).device)

# %% [markdown]
# ## 2. Systems: what a copy costs
#
# Where there is a GPU, the next cell times real copies from host to device and
# back (64 MiB of float32 from pageable memory) and reports GB/s. Where there is
# none, it times the strict test device's round trip instead. **That is not a
# PCIe measurement**: the strict device lives in host memory, so its "transfer"
# is a memory copy, and the number says how fast this machine copies memory —
# compare it with the table above, not with a GPU.

# %%
host = np.ones(16 * 2**20, dtype=np.float32)  # 64 MiB


def seconds(step, repeats=5):
    """Best wall time of ``step()`` over ``repeats`` runs (after one warm-up run)."""
    step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


if GPU is not None:
    import cupy

    def to_device():
        GPU.from_host(host)
        cupy.cuda.get_current_stream().synchronize()

    on_device = GPU.from_host(host)
    up, down = seconds(to_device), seconds(lambda: GPU.to_host(on_device))
    print(f"host -> {GPU.device}: {host.nbytes / up / 1e9:6.1f} GB/s   ({up * 1e3:.2f} ms for 64 MiB)")
    print(f"{GPU.device} -> host: {host.nbytes / down / 1e9:6.1f} GB/s   ({down * 1e3:.2f} ms for 64 MiB)")
else:
    strict = get_backend("strict")
    on_strict = strict.from_host(host)
    up, down = seconds(lambda: strict.from_host(host)), seconds(lambda: strict.to_host(on_strict))
    print(f"no GPU here ({NO_GPU_REASON})")
    print(f"strict device (a host memory copy, NOT PCIe): host -> strict {host.nbytes / up / 1e9:.1f} GB/s, "
          f"strict -> host {host.nbytes / down / 1e9:.1f} GB/s")
    print("typical PCIe 4.0 x16: ~32 GB/s peak per direction; PCIe 5.0 x16: ~64 GB/s (see the table above)")

# %% [markdown]
# ## 3. Why a small model can be slower on a GPU
#
# A GPU does nothing on its own: the CPU **launches kernels** — small programs
# over an array — one operation at a time. Each launch costs a few microseconds
# in the driver before the GPU starts (Gray, "Getting Started with CUDA Graphs",
# NVIDIA Technical Blog, 2019), and CuPy adds its own Python-side work on top
# (choosing and caching the kernel, allocating the output). A training step of
# our MLP launches dozens of kernels: every `+`, `@`, `relu`, `sum` and
# every optimizer update is one or more. So a step has a floor of roughly
# *kernels × launch cost* — a fraction of a millisecond — however small the
# model is.
#
# Above that floor, an operation takes as long as the slower of its two
# resources, arithmetic and memory. That is the **roofline model** (Williams,
# Waterman & Patterson, "Roofline", *Communications of the ACM*, 2009):
#
# $$ t \approx t_\text{launch} + \max\left(\frac{\text{FLOPs}}{\text{peak FLOP/s}},\;
#    \frac{\text{bytes moved}}{\text{memory bandwidth}}\right). $$
#
# The ratio FLOPs / bytes is the operation's **arithmetic intensity**. A matrix
# product `(m, k) @ (k, n)` does $2mkn$ FLOPs (a multiply and an add per term)
# and must at least read both inputs and write the output:
# $(mk + kn + mn)$ elements. An elementwise `relu` does one operation per
# element and moves 8 bytes per element: intensity 1/8, hopelessly memory bound.
# A worked example: `(2, 3) @ (3, 4)` in float32 does $2 \cdot 2 \cdot 3 \cdot 4 = 48$
# FLOPs and moves $4 \cdot (6 + 12 + 8) = 104$ bytes: an intensity of 0.46.
#
# Write both formulas. They open `tinytrain/cuda.py`: the cell below starts the
# file with its docstring and imports, then come the two functions — a few lines
# of cost arithmetic that the GPU backend's users can reach for.

# %% export="cuda"
"""The CUDA backend: CuPy arrays in GPU memory, one backend per GPU.

Imported only when a ``"cuda"`` device is asked for, so tinytrain works without
CuPy. CuPy mirrors NumPy's namespace, so a GPU backend differs from the NumPy one
in a few places only: which GPU is *current* when arrays are made, the copies
between host and device, scatter-add, and a random generator whose state is
plain data (two integers) so that GPU runs resume exactly from checkpoints.
:func:`matmul_cost` and :func:`roofline_seconds` are the back-of-envelope model
that says when a GPU is worth it.
"""
import importlib
import importlib.util
import secrets
import types
from typing import Any

import numpy as np

from tinytrain.backend import DEFAULT_FLOAT, Backend


def matmul_cost(m: int, k: int, n: int, itemsize: int = 4) -> tuple[int, int]:
    """``(FLOPs, bytes)`` of the product of an ``(m, k)`` and a ``(k, n)`` matrix.

    FLOPs: ``2*m*k*n`` (one multiply and one add per term). Bytes: the least
    memory traffic there can be -- read both inputs once, write the output once --
    ``itemsize * (m*k + k*n + m*n)``. Both are exact Python ints (a float keeps only
    53 bits: the FLOPs of a product of 10**6-sized sides lose their last digits).
    """
    ### BEGIN SOLUTION
    return 2 * m * k * n, itemsize * (m * k + k * n + m * n)
    ### END SOLUTION


def roofline_seconds(flops: float, nbytes: float, peak_flops: float, bandwidth: float,
                     launch_seconds: float = 0.0) -> float:
    """Roofline estimate of an operation's time: the launch cost plus the slower of
    computing (``flops / peak_flops``) and moving memory (``nbytes / bandwidth``)."""
    ### BEGIN SOLUTION
    return launch_seconds + max(flops / peak_flops, nbytes / bandwidth)
    ### END SOLUTION


# %% check=1
assert matmul_cost(2, 3, 4) == (48, 4 * (6 + 12 + 8))
assert matmul_cost(2, 3, 4, itemsize=2)[1] == 2 * 26
assert roofline_seconds(1e12, 1e9, peak_flops=1e12, bandwidth=1e12) == 1.0  # compute bound
assert roofline_seconds(1e9, 1e12, peak_flops=1e12, bandwidth=1e12, launch_seconds=0.5) == 1.5  # memory bound
print("cost model OK")

# %% [markdown]
# Now the numbers. The first layer of this course's MNIST MLP at batch 128 is
# `(128, 784) @ (784, 256)`. Below, the same layer at three sizes, estimated
# for an H100 (FP32 without tensor cores: 67 TFLOP/s, 3.35 TB/s — NVIDIA's
# datasheet) with a 5 µs launch, and for **this** CPU, whose matrix-product speed
# the cell measures (its memory bandwidth is taken as a nominal 20 GB/s).

# %%
probe = np.ones((512, 512), dtype=np.float32)
cpu_flops = 2 * 512**3 / seconds(lambda: probe @ probe)
H100 = dict(peak_flops=67e12, bandwidth=3.35e12, launch_seconds=5e-6)
CPU = dict(peak_flops=cpu_flops, bandwidth=20e9)
print(f"this CPU multiplies matrices at {cpu_flops / 1e9:.0f} GFLOP/s\n")
print(f"{'layer':>28} {'FLOP/byte':>9} {'H100 est.':>11} {'CPU est.':>12}  on the H100, bound by")
for m, k, n in [(8, 64, 32), (128, 784, 256), (4096, 4096, 4096)]:
    flops, nbytes = matmul_cost(m, k, n)
    gpu, cpu = roofline_seconds(flops, nbytes, **H100), roofline_seconds(flops, nbytes, **CPU)
    compute, memory = flops / H100["peak_flops"], nbytes / H100["bandwidth"]
    bound = "launch" if H100["launch_seconds"] > max(compute, memory) else "compute" if compute > memory else "memory"
    layer = f"({m}, {k}) @ ({k}, {n})"
    print(f"{layer:>28} {flops / nbytes:9.1f} {gpu * 1e6:9.1f}µs {cpu * 1e6:10.1f}µs  {bound}")

# %% [markdown]
# Read the table from the top. The Digits-sized layer, `(8, 64) @ (64, 32)`,
# needs 33 thousand FLOPs: under a microsecond on the CPU, while the GPU spends
# 5 µs just starting — **launch bound**, and the CPU wins. The MNIST layer is
# still launch bound on an H100 (its arithmetic would take under a microsecond),
# yet the CPU needs tens to hundreds of microseconds for it, so the GPU starts
# to pay off — by a factor that shrinks as Python and launch overheads pile up
# over the dozens of operations of a step. Only the large product is **compute bound**
# on the GPU, and there the GPU is hundreds of times faster than this CPU (67 TFLOP/s
# against the rate the cell measured; a laptop core is slower still). Large batches and
# wide layers raise arithmetic intensity and amortise launches; that is why GPUs
# shine on big models and why `benchmarks/gpu.py` (section 12) measures both.
#
# ## 4. How tinytrain picks a backend, and what `cuda:1` means
#
# A device name is `kind` or `kind:index` (Module 01). `get_backend(name)` finds
# the kind in a registry, calls its factory the first time a device is asked
# for, and caches the backend. The `"cuda"` factory imports `tinytrain.cuda` —
# the file you are about to write — only then, so that tinytrain never needs
# CuPy unless you ask for a GPU; without CuPy the request fails with an error
# that says what to install:

# %%
for name in ("cpu", "strict", "strict:1", "cuda"):
    try:
        backend = get_backend(name)
        print(f"{name:9s} -> {backend!r}")
    except RuntimeError as error:
        print(f"{name:9s} -> RuntimeError: {error}")

# %% [markdown]
# `cuda` is short for `cuda:0`. The index counts the GPUs **this process can
# see**, in CUDA's order: by default the fastest first (`CUDA_DEVICE_ORDER=
# FASTEST_FIRST`), which need not be the order `nvidia-smi` prints (set
# `CUDA_DEVICE_ORDER=PCI_BUS_ID` to match it). `CUDA_VISIBLE_DEVICES=2,3` hides
# the other GPUs and renumbers these two as `cuda:0` and `cuda:1`. So `cuda:1`
# is "the second visible GPU", and each GPU has its own backend object, its own
# memory and its own random stream. The strict device has indices too:
# `strict:0` and `strict:1` refuse to mix, just as two GPUs do.
#
# ## 5. CuPy, and a fake GPU to test with
#
# **CuPy** (Okuta et al., "CuPy: A NumPy-Compatible Library for NVIDIA GPU
# Calculations", LearningSys 2017) is NumPy's API on CUDA: `cupy.exp`,
# `cupy.matmul`, `a.sum(axis=0)` do what NumPy's do, on arrays in GPU memory,
# by launching CUDA kernels (cuBLAS for matrix products). Because Module 01 made
# every tensor do its arithmetic through `backend.xp`, a CuPy backend is mostly
# `xp = cupy` — the operations, layers, losses and optimizers you wrote need no
# change. What differs is exactly the list of backend primitives:
#
# * **host ↔ device copies**: `cupy.asarray(numpy_array)` copies to the GPU,
#   `cupy.asnumpy(a)` copies back; `numpy.asarray(a)` on a CuPy array *refuses*;
# * **which GPU**: CuPy makes every new array, and runs every kernel, on the
#   **current device** — a per-thread setting, changed by `cupy.cuda.Device(i)`;
# * **scatter-add**: NumPy's `np.add.at` has a CuPy counterpart that is a
#   kernel of atomic additions, with its own rules;
# * **random numbers**: CuPy's generators live on the GPU (cuRAND), and their
#   state cannot be read back as plain data — yet checkpoints need exactly that.
#
# Most of you have no NVIDIA GPU, so this notebook tests your backend on a
# **fake CuPy**: `tinytrain.testing.fake_cupy.FakeCupy` is *not* a GPU and not CuPy. It is
# a module with the parts of CuPy's API the backend uses, built on the strict
# device: its arrays refuse conversion to NumPy and refuse mixing devices like
# CuPy's, it has several "GPUs", and it makes arrays on the *current* one, as
# CuPy does. It cannot tell you anything about speed.

# %%
fake = FakeCupy(devices=2)
with fake.cuda.Device(1):
    x = fake.asarray(np.arange(3.0))  # host data is copied to the current device
print(fake, "\n", x, "on", x.device)
try:
    np.asarray(x)
except TypeError as error:
    print("TypeError:", error)

# %% [markdown]
# ## 6. Random numbers that resume exactly
#
# Module 10's checkpoints resume *bit-identically*: they store every random
# generator's state as plain data. NumPy's generator hands its state out as a
# dict. A GPU generator's state is thousands of per-thread states in GPU memory,
# which CuPy does not hand out at all. So we make the state small instead:
#
# * the stream has a **seed** (64 bits) and counts its **draws** (how many times
#   random numbers were asked for);
# * draw number $i$ gets its own 64-bit seed $s_i = \text{mix}(\text{seed}, i)$,
#   and the GPU generator is re-seeded with $s_i$ right before generating;
# * the whole state is `{"seed": seed, "draws": i}` — two integers.
#
# Restoring the two integers restores exactly the numbers that come next, however
# many values each draw produced, because draw $i$ depends on nothing but
# $(\text{seed}, i)$. The mixing function must scatter neighbouring $i$ far apart:
# we use SplitMix64's finaliser (Steele, Lea & Flood, "Fast Splittable
# Pseudorandom Number Generators", OOPSLA 2014). The GPU generator is cuRAND's
# **Philox4x32-10**, a *counter-based* generator: its whole state is a key and a
# counter (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011),
# so a new seed is just a new key. PyTorch's CUDA generator uses the same idea:
# its saved state is a seed and an offset.
#
# `draw_seed` is given. Write the three methods of `DrawCounter`:
# `next_seed()` returns the seed of the next draw and counts it; `state()` returns
# the state as plain data; `load_state(state)` restores it — and refuses, with a
# `ValueError`, anything that is not such a state (for example the state of
# NumPy's generator, a dict of another shape).

# %% export="cuda"
_MASK64 = 2**64 - 1
GENERATOR = "philox4x32-10, reseeded per draw with splitmix64(seed, draw)"


def draw_seed(seed: int, draw: int) -> int:
    """The 64-bit seed of draw number ``draw`` of the stream ``seed``: SplitMix64's
    output for position ``draw + 1`` (golden-ratio increments, then a finaliser that
    makes every output bit depend on every input bit)."""
    z = (seed + (draw + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class DrawCounter:
    """A random stream's state as two integers: its ``seed`` and how many ``draws`` it made.

    ``seed=None`` picks a fresh random seed (which ``state()`` still records).
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = secrets.randbits(64) if seed is None else int(seed) & _MASK64
        self.draws = 0

    def next_seed(self) -> int:
        """``draw_seed(seed, draws)`` for the next draw; counts the draw."""
        ### BEGIN SOLUTION
        value = draw_seed(self.seed, self.draws)
        self.draws += 1
        return value
        ### END SOLUTION

    def state(self) -> dict:
        """``{"generator": GENERATOR, "seed": seed, "draws": draws}``: plain data for a checkpoint."""
        ### BEGIN SOLUTION
        return {"generator": GENERATOR, "seed": self.seed, "draws": self.draws}
        ### END SOLUTION

    def load_state(self, state: Any) -> None:
        """Restore what :meth:`state` returned.

        A state is ``{"generator": GENERATOR, "seed": int, "draws": int}``, those three
        keys and no others, whose seed and draw count are Python ints >= 0 (a bool, a
        float or a NumPy integer is refused; a seed of 2**64 or more is kept modulo
        2**64, as ``__init__`` does). Anything
        else raises ``ValueError`` naming both what was expected (the generator's
        name) and the state given, shown with ``repr`` (``f"... got {state!r}"``).
        Check everything before setting anything: a refused state changes nothing.
        """
        ### BEGIN SOLUTION
        valid = (
            isinstance(state, dict)
            and set(state) == {"generator", "seed", "draws"}
            and state["generator"] == GENERATOR
            and all(type(state.get(key)) is int and state[key] >= 0 for key in ("seed", "draws"))
        )
        if not valid:
            raise ValueError(
                f"not the random state of a CUDA device: expected {{'generator': {GENERATOR!r}, 'seed': int, "
                f"'draws': int}}, got {state!r}"
            )
        self.seed, self.draws = state["seed"] & _MASK64, state["draws"]
        ### END SOLUTION


# %% check=2
stream = DrawCounter(seed=7)
assert stream.state() == {"generator": GENERATOR, "seed": 7, "draws": 0}
first = [stream.next_seed() for _ in range(3)]
assert first[0] == draw_seed(7, 0) and first[2] == draw_seed(7, 2) and stream.state()["draws"] == 3
assert len(set(first)) == 3 and all(0 <= s < 2**64 for s in first)
saved = pickle.loads(pickle.dumps(stream.state()))  # plain data survives a file
later = [stream.next_seed() for _ in range(2)]
stream.load_state(saved)
assert [stream.next_seed() for _ in range(2)] == later, "restoring a state must replay the same draws"
for bad in ({"bit_generator": "PCG64", "state": {}}, {"generator": GENERATOR, "seed": -1, "draws": 0}, None):
    try:
        stream.load_state(bad)
    except ValueError as error:
        assert GENERATOR in str(error), error
    else:
        raise AssertionError(f"load_state must refuse {bad!r}")
assert DrawCounter().seed != DrawCounter().seed, "seed=None picks a fresh random seed"
print("DrawCounter OK")

# %% [markdown]
# ## 7. Scatter-add on a GPU
#
# Indexing with an integer array, `x[[0, 2, 0]]`, reads element 0 twice; its
# backward must *add* both gradients into position 0. On the CPU that is
# `np.add.at`. On a GPU, thousands of threads write at once, so CuPy's
# `cupyx.scatter_add(target, index, values)` adds with **atomic** additions —
# and CUDA has atomic adds for a few types only: CuPy's kernel accepts
# float16, float32, float64, int32, uint32 and uint64 (not int64). An int64 sum
# has the same bits as the uint64 sum of the same bit patterns (two's
# complement wraps around identically), so int64 can go through as a uint64
# *view*: `target.view(np.uint64)` and `values.astype(np.int64).view(np.uint64)`.
#
# Write `scatter_add(cupyx, target, index, values)`: route int64 through uint64
# views, pass the supported dtypes straight to `cupyx.scatter_add`, and raise a
# `TypeError` naming the dtype and the supported ones (`SCATTER_ADD_DTYPES`
# and int64) for anything else (booleans, int8, ...). `values` may be an array of the target's device or a
# Python or NumPy number. The fake's
# `cupyx.scatter_add` refuses what CuPy's refuses, so the check tells you if a
# dtype slipped through unconverted.

# %% export="cuda"
SCATTER_ADD_DTYPES = tuple(np.dtype(name) for name in ("float16", "float32", "float64", "int32", "uint32", "uint64"))


def scatter_add(cupyx: Any, target: Any, index: Any, values: Any) -> None:
    """``target[index] += values`` in place on the GPU, repeated indices adding up.

    ``cupyx`` is the ``cupyx`` module (or a stand-in). int64 targets are added as
    uint64 views (same bits): the target as ``target.view(np.uint64)``, and the
    values too -- an array as ``values.astype(np.int64).view(np.uint64)`` (int32
    values too), a Python or NumPy number as ``np.uint64(int(values) & (2**64 - 1))``.
    The supported dtypes go to ``cupyx.scatter_add`` as they are. Other dtypes that CuPy's
    atomic add does not support raise ``TypeError`` naming the dtype and the
    supported ones (``SCATTER_ADD_DTYPES`` and int64), before anything reaches ``cupyx``.
    """
    ### BEGIN SOLUTION
    dtype = np.dtype(target.dtype)
    if dtype == np.int64:
        if hasattr(values, "astype"):
            values = values.astype(np.int64).view(np.uint64)
        else:
            values = np.uint64(int(values) & _MASK64)
        target = target.view(np.uint64)
    elif dtype not in SCATTER_ADD_DTYPES:
        supported = ", ".join(str(d) for d in SCATTER_ADD_DTYPES)
        raise TypeError(f"scatter_add on a GPU supports {supported} and int64, not {dtype}")
    cupyx.scatter_add(target, index, values)
    ### END SOLUTION


# %% check=1
fake = FakeCupy(devices=1)
target = fake.zeros(4, dtype=np.float32)
scatter_add(fake.cupyx, target, fake.asarray(np.array([0, 2, 0])), fake.asarray(np.array([1.0, 2.0, 3.0])))
assert fake.asnumpy(target).tolist() == [4.0, 0.0, 2.0, 0.0], "repeated indices must add up"
counts = fake.zeros(3, dtype=np.int64)
scatter_add(fake.cupyx, counts, fake.asarray(np.array([1, 1, 2])), fake.asarray(np.array([-5, 2, 7])))
assert fake.asnumpy(counts).tolist() == [0, -3, 7] and counts.dtype == np.int64
assert fake.cupyx.scatter_add_dtypes[-1] == np.uint64, "int64 goes through a uint64 view"
scatter_add(fake.cupyx, counts, fake.asarray(np.array([0])), 3)
assert fake.asnumpy(counts).tolist() == [3, -3, 7]
try:
    scatter_add(fake.cupyx, fake.zeros(2, dtype=bool), fake.asarray(np.array([0])), True)
except TypeError as error:
    assert "bool" in str(error), error
else:
    raise AssertionError("scatter_add of a bool array must raise TypeError")
print("scatter_add OK")

# %% [markdown]
# ## 8. The current device, with several GPUs
#
# CuPy makes new arrays — and runs kernels — on the **current device**. With one
# GPU that is always GPU 0 and nothing can go wrong. With two, `cupy.zeros(3)`
# for a tensor on `cuda:1` lands on GPU 0 unless GPU 1 is current at that
# moment. So the backend of `cuda:1` must make GPU 1 current before it creates
# anything. Two tools do that:
#
# * `make_current()` switches CuPy's current device to this backend's GPU (a
#   cheap check when it already is). The backend calls it before every copy to
#   the device, every random draw and every scatter-add. It leaves the device
#   current afterwards, like PyTorch's `torch.cuda.set_device`: the arithmetic
#   that follows (`a + b` on this GPU's arrays) runs on the right GPU too.
# * On a machine with more than one GPU, `backend.xp` is not CuPy itself but
#   `_OnDevice(cupy)`: the same namespace, except that each function first calls
#   `make_current()`. So `backend.xp.zeros(3)` is right on any GPU. On a
#   one-GPU machine `xp` is plain CuPy, at no cost.
#
# One case stays the programmer's job, as with CuPy itself: interleaving
# arithmetic on two GPUs without anything crossing between them. Whatever
# tinytrain last created an array on is current; work on the other GPU's
# tensors then runs there only after that GPU's backend was used again (a
# `.to(...)`, a batch from a loader, a random draw).

# %% export="cuda"
class _OnDevice(types.ModuleType):
    """CuPy's namespace for one GPU: each function first makes that GPU current.

    Attributes are looked up in the wrapped namespace once and cached: functions
    (and ufuncs, with their ``.at`` / ``.reduce``) are wrapped, submodules
    (``linalg``, ``lib.stride_tricks``) are wrapped in turn, and types and
    constants (``ndarray``, ``float32``, ``pi``) are passed through unchanged.
    """

    def __init__(self, namespace: Any, backend: "CupyBackend") -> None:
        super().__init__(getattr(namespace, "__name__", "cupy"))
        self._namespace = namespace
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        value = _on_device(getattr(self._namespace, name), self._backend)
        setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return f"<{self.__name__} on {self._backend.device}>"


class _OnDeviceCall:
    """A CuPy function that makes its backend's GPU current before it runs."""

    __slots__ = ("_function", "_backend")

    def __init__(self, function: Any, backend: "CupyBackend") -> None:
        self._function = function
        self._backend = backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._backend.make_current()
        return self._function(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return _on_device(getattr(self._function, name), self._backend)

    def __repr__(self) -> str:
        return f"<{self._function!r} on {self._backend.device}>"


def _on_device(value: Any, backend: "CupyBackend") -> Any:
    if isinstance(value, types.ModuleType):
        return _OnDevice(value, backend)
    if callable(value) and not isinstance(value, type):
        return _OnDeviceCall(value, backend)
    return value


# %% [markdown]
# ## 9. The CUDA backend
#
# Here is the backend. It is given except for the two doors between host and
# device, which you write:
#
# * `from_host(array)` copies a NumPy array to this backend's GPU: make the GPU
#   current, then `cupy.asarray(array)` (which copies host data to the current
#   device);
# * `to_host(array)` copies an array of this GPU back into a NumPy array with
#   `cupy.asnumpy(array, order="A")` (`"A"` keeps a column-major array, such as a
#   `Linear` weight, column-major; the default makes it row-major) — and, like every backend, refuses with a `TypeError` an
#   array that is not on its device (check with `self.is_array`), so that a
#   device mix-up fails loudly instead of silently copying from another GPU.
#
# Read the rest: the constructor checks the index against the GPUs that exist
# and creates the cuRAND Philox generator *on its GPU* (a generator lives on the
# device that was current when it was made); random draws re-seed it from the
# `DrawCounter`; `rng_state` / `set_rng_state` are the counter's state.
# The constructor takes the `cupy` and `cupyx` modules as arguments so that the
# checks can hand it the fake; normally it imports the real ones.

# %% export="cuda"
INSTALL_HINT = (
    "pip install 'tinytrain[cuda12]' for CUDA 12 or 'tinytrain[cuda13]' for CUDA 13 "
    "(`nvidia-smi` shows the CUDA version your driver supports; `tinytrain doctor` checks the install)"
)


def _import_cupy() -> tuple[Any, Any]:
    """``(cupy, cupyx)``, or a ``RuntimeError`` that says how to install or repair CuPy."""
    try:
        installed = importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):  # imported already, without a module spec
        installed = True
    if not installed:
        raise RuntimeError(f"device 'cuda' needs CuPy, which is not installed: {INSTALL_HINT}")
    try:
        cupy = importlib.import_module("cupy")
        cupyx = importlib.import_module("cupyx")
        available = cupy.is_available()
    except Exception as error:  # e.g. a wheel for another CUDA version, or missing CUDA libraries
        raise RuntimeError(
            f"CuPy is installed but cannot use a GPU ({type(error).__name__}: {error}); {INSTALL_HINT}"
        ) from error
    if not available:
        raise RuntimeError(
            "device 'cuda' was asked for, but CuPy finds no usable CUDA GPU on this machine "
            "(`nvidia-smi` lists the GPUs the driver sees; `tinytrain doctor` checks the install)"
        )
    return cupy, cupyx


class CupyBackend(Backend):
    """A CUDA GPU through CuPy; ``device`` is ``"cuda:N"``.

    ``cupy`` / ``cupyx``: the modules to use (default: import CuPy; tests pass a
    :class:`tinytrain.testing.fake_cupy.FakeCupy`). Raises ``RuntimeError`` when CuPy is
    missing or broken and when GPU ``N`` does not exist.
    """

    kind = "cuda"

    def __init__(self, device: str, cupy: Any = None, cupyx: Any = None) -> None:
        if cupy is None:
            cupy, cupyx = _import_cupy()
        elif cupyx is None:
            cupyx = importlib.import_module("cupyx")
        self.index = int(device.partition(":")[2] or 0)
        count = cupy.cuda.runtime.getDeviceCount()
        if self.index >= count:
            visible = ", ".join(f"cuda:{i}" for i in range(count)) or "none"
            raise RuntimeError(
                f"device {device!r} does not exist: this process sees {count} CUDA GPU(s) ({visible}); "
                "CUDA_VISIBLE_DEVICES decides which GPUs a process sees"
            )
        self._cupy, self._cupyx = cupy, cupyx
        self._runtime = cupy.cuda.runtime
        self._gpu = cupy.cuda.Device(self.index)
        with self._gpu:  # a cuRAND generator lives on the device current when it is made
            self._generator = cupy.random.RandomState(
                np.uint64(0), method=cupy.cuda.curand.CURAND_RNG_PSEUDO_PHILOX4_32_10
            )
        super().__init__(device, cupy if count == 1 else _OnDevice(cupy, self))

    @property
    def cupy(self) -> Any:
        """The CuPy module (or stand-in) that this backend uses."""
        return self._cupy

    def make_current(self) -> None:
        """Make this backend's GPU CuPy's current device (and leave it current)."""
        if self._runtime.getDevice() != self.index:
            self._gpu.use()

    # -- arrays --------------------------------------------------------------
    def is_array(self, obj: Any) -> bool:
        return isinstance(obj, self._cupy.ndarray) and getattr(obj.device, "id", None) == self.index

    def asarray(self, data: Any, dtype: Any = None) -> Any:
        self.make_current()
        return self._cupy.asarray(data, dtype=dtype)

    def from_host(self, array: np.ndarray) -> Any:
        """A copy of the NumPy ``array`` on this GPU, with its dtype: make this GPU current
        (:meth:`make_current`, which leaves it current, as every array-making method here
        does) and copy with ``self._cupy.asarray``."""
        ### BEGIN SOLUTION
        self.make_current()
        return self._cupy.asarray(array)
        ### END SOLUTION

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy of ``array`` in its own memory order (``order="A"``), which must live
        on this GPU; otherwise ``TypeError`` naming this backend's device (``'cuda:1'``) and
        where the array lives (its ``device``, or its type when it has none). Copy with
        ``self._cupy.asnumpy(array, order="A")`` (the fake CuPy has no ``ndarray.get``)."""
        ### BEGIN SOLUTION
        if not self.is_array(array):
            where = getattr(array, "device", type(array).__name__)
            raise TypeError(f"to_host of {self.device!r} takes an array of that GPU, got one of {where!r}")
        return self._cupy.asnumpy(array, order="A")  # "A": a column-major array stays column-major
        ### END SOLUTION

    def scatter_add(self, target: Any, index: Any, values: Any) -> None:
        self.make_current()
        scatter_add(self._cupyx, target, index, values)

    # -- random numbers ------------------------------------------------------
    def seed(self, seed: int | None) -> None:
        self._draws = DrawCounter(seed)

    def _rng(self) -> Any:
        """The Philox generator, seeded for the next draw, on this GPU."""
        self.make_current()
        self._generator.seed(np.uint64(self._draws.next_seed()))
        return self._generator

    def random_normal(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> Any:
        dtype = self._float_dtype(dtype)
        return self._rng().standard_normal(shape, dtype=dtype)

    def random_uniform(self, shape: tuple[int, ...], dtype: Any = DEFAULT_FLOAT) -> Any:
        dtype = self._float_dtype(dtype)
        return self._rng().random_sample(shape, dtype=dtype)

    def permutation(self, n: int) -> Any:
        return self._rng().permutation(n).astype(np.int64, copy=False)

    def rng_state(self) -> dict:
        return self._draws.state()

    def set_rng_state(self, state: dict) -> None:
        self._draws.load_state(state)


# %% check=2
fake = FakeCupy(devices=2)
gpu1 = CupyBackend("cuda:1", cupy=fake, cupyx=fake.cupyx)
fake.cuda.Device(0).use()  # another GPU is current: the backend must switch before it copies
host = np.arange(6.0).reshape(2, 3)
on_gpu = gpu1.from_host(host)
assert on_gpu.device.id == 1, f"from_host put the copy on GPU {on_gpu.device.id}, not on GPU 1"
assert gpu1.is_array(on_gpu) and fake.cuda.runtime.getDevice() == 1
back = gpu1.to_host(on_gpu)
assert isinstance(back, np.ndarray) and np.array_equal(back, host)
back[0, 0] = 99.0
assert gpu1.to_host(on_gpu)[0, 0] == 0.0, "to_host must return a copy"
host[0, 1] = 42.0
assert gpu1.to_host(on_gpu)[0, 1] == 1.0, "from_host must copy, not share, the host array"
with fake.cuda.Device(0):
    on_gpu0 = fake.zeros(2)
try:
    gpu1.to_host(on_gpu0)
except TypeError as error:
    assert "cuda:1" in str(error), error
else:
    raise AssertionError("to_host of cuda:1 must refuse an array of GPU 0")
fake.cuda.Device(0).use()
zeros = gpu1.xp.zeros(3)  # through the device-aware namespace
assert zeros.device.id == 1, "xp functions of cuda:1 must allocate on GPU 1"
try:
    CupyBackend("cuda:2", cupy=fake, cupyx=fake.cupyx)
except RuntimeError as error:
    assert "2 CUDA GPU" in str(error), error
else:
    raise AssertionError("cuda:2 does not exist on a machine with two GPUs")
print("transfers OK")

# %% [markdown]
# One more check ties the pieces together: random draws land on the backend's
# GPU, and restoring `rng_state()` replays them exactly — what a checkpoint does.

# %% check=1
gpu1.seed(3)
fake.cuda.Device(0).use()
state = gpu1.rng_state()
draws = [gpu1.random_normal((2, 2)), gpu1.random_uniform((3,)), gpu1.permutation(5)]
assert all(d.device.id == 1 for d in draws), "random numbers of cuda:1 must be made on GPU 1"
gpu1.set_rng_state(pickle.loads(pickle.dumps(state)))
again = [gpu1.random_normal((2, 2)), gpu1.random_uniform((3,)), gpu1.permutation(5)]
assert all(np.array_equal(gpu1.to_host(a), gpu1.to_host(b)) for a, b in zip(draws, again))
assert not np.array_equal(gpu1.to_host(draws[0]), gpu1.to_host(gpu1.random_normal((2, 2))))
counts = gpu1.from_host(np.zeros(3, dtype=np.int64))
gpu1.scatter_add(counts, gpu1.from_host(np.array([2, 2])), gpu1.from_host(np.array([1, 1])))
assert gpu1.to_host(counts).tolist() == [0, 0, 2]
print("CUDA backend OK")

# %% [markdown]
# ## 10. A whole training run on the (fake) GPU
#
# A backend is one class plus one registration. `register_fake_gpu(CupyBackend)`
# registers devices `"fakecuda:0"` and `"fakecuda:1"` that run **your**
# `CupyBackend` on a fresh fake CuPy. Nothing below knows it is not a GPU: the
# model is moved with `model.to(device)` (its parameters and buffers move in
# place, so an optimizer built before or after the move works), the loader
# delivers every batch on the device, and the Trainer computes the loss, the
# gradients, the clipping and the Adam update there. Only the loss of each step
# and the epoch's metrics come back to the host. The run on the CPU, from the
# same seed, gives the same numbers: the fake computes with NumPy underneath,
# and Linear layers draw their initial weights on the CPU whatever the device,
# so a model starts from the same weights on every device.

# %%
register_fake_gpu(CupyBackend, devices=2)
digits = Digits(train=True)
images, labels = digits[np.arange(512)]
dataset = TensorDataset(images.reshape(512, 64), labels)


def run(device, epochs=2, checkpoint=None):
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10)).to(device)
    trainer = tt.Trainer(model, tt.Adam(model.parameters(), lr=0.01), nn.CrossEntropyLoss(), grad_clip_norm=5.0)
    loader = DataLoader(dataset, batch_size=64, shuffle=True, seed=0, device=device)
    trainer.fit(loader, DataLoader(dataset, batch_size=256, device=device), epochs=epochs, progress=False)
    if checkpoint is not None:
        trainer.save_checkpoint(checkpoint)
    return trainer


on_fake, on_cpu = run("fakecuda:1"), run("cpu")
print("devices of the parameters:", {p.device for p in on_fake.model.parameters()})
print("train loss  fakecuda:1:", [f"{v:.4f}" for v in on_fake.history["train_loss"]])
print("train loss  cpu:       ", [f"{v:.4f}" for v in on_cpu.history["train_loss"]])
assert on_fake.history["train_loss"] == on_cpu.history["train_loss"]

# %% [markdown]
# A checkpoint holds plain data only: every device array is copied to the host
# when it is written. So a checkpoint saved on a GPU loads on a machine without
# one, and the reverse. Its random states are stored per device name; loading on
# a machine without that device skips that device's generator with a warning.

# %%
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "fake-gpu.ckpt"
    trained = run("fakecuda:1", checkpoint=path)
    print("random states saved for:", sorted(tt.serialization.read_checkpoint(path)["rng"]["backends"]))
    tt.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    cpu_trainer = tt.Trainer(model, tt.Adam(model.parameters(), lr=0.01), nn.CrossEntropyLoss())
    cpu_trainer.load_checkpoint(path)
same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(trained.model.parameters(), model.parameters()))
print("loaded on the CPU at epoch", cpu_trainer.epoch, "with identical weights:", same)

# %% [markdown]
# With a real GPU the same program runs with `device="cuda"`. The next cell does
# that where there is one (the numbers differ from the CPU's in the last digits:
# cuBLAS adds in another order).

# %%
if GPU is not None:
    on_gpu = run("cuda")
    print("train loss  cuda:", [f"{v:.4f}" for v in on_gpu.history["train_loss"]])
else:
    print(f"no GPU here ({NO_GPU_REASON}); skipped")

# %% [markdown]
# ## 11. Installing CuPy: the right wheel
#
# CuPy ships one wheel per CUDA major version: `cupy-cuda12x` for CUDA 12.x,
# `cupy-cuda13x` for CUDA 13.x (`tinytrain[cuda12]` / `tinytrain[cuda13]` install
# them). Which one you need depends on two things:
#
# 1. **the driver.** `nvidia-smi` prints "CUDA Version: 12.4" — the newest CUDA
#    the driver can run. A driver runs every older CUDA too, never a newer major:
#    a CUDA 13 wheel needs a CUDA 13 driver (R580 or newer).
# 2. **the CUDA libraries** (NVRTC, cuBLAS, ...) that the wheel loads at run
#    time. They come from a CUDA Toolkit of the wheel's major version on the
#    machine, or from PyPI (recent CuPy: `pip install "cupy-cuda12x[ctk]"`).
#    A `cupy-cuda12x` wheel on a machine whose only toolkit is CUDA 13 typically
#    imports fine and then fails when it first compiles a kernel, unable to load
#    the CUDA 12 NVRTC.
#
# Also: CUDA 13 dropped GPUs older than Turing (compute capability below 7.5),
# which need the CUDA 12 wheel; and only one CuPy package may be installed at a
# time (they overwrite each other's files).
#
# `tinytrain doctor` checks all of this and says how to fix what is wrong. It
# reads the driver's CUDA version straight from the driver library (so it works
# before CuPy is installed), the installed CuPy packages from
# `importlib.metadata`, and finally runs a tiny kernel and a cuBLAS product on
# `cuda:0`. That is tooling, not part of the library you write: read it in
# `tinytrain/course/gpu.py`. Its report on this machine:

# %%
from tinytrain.course.gpu import gpu_report

for ok, line, fix in gpu_report():
    print(("ok  " if ok else "FAIL") + "  " + line + (f"\n      fix: {fix}" if fix else ""))

# %% [markdown]
# ## 12. Systems: a training step, CPU against GPU
#
# The last measurement is the one that matters: the time of one training step
# (zero the gradients, forward, loss, backward, SGD update, read the loss) for a
# small and a large MLP, on the CPU and, where there is one, on the GPU. The
# full benchmark, with a CNN and a JSON report, is `python benchmarks/gpu.py`.
# Expect the small model to be no faster — or slower — on the GPU (section 3:
# launch bound) and the large one to be much faster.

# %%
def step_seconds(sizes, batch, device, repeats=5):
    """Best seconds per SGD step of an MLP with layer ``sizes`` on ``device``."""
    tt.manual_seed(0)
    layers = []
    for n_in, n_out in zip(sizes, sizes[1:]):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).to(device)
    optimizer = tt.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = tt.tensor(rng.standard_normal((batch, sizes[0]), dtype=np.float32), device=device)
    y = tt.tensor(rng.integers(0, sizes[-1], batch), device=device)

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()  # reading the loss waits for the GPU to finish

    return seconds(step, repeats)


models = {"Digits MLP 64-32-10, batch 64": ((64, 32, 10), 64, 20),
          "wide MLP 1024-2048-2048-10, batch 512": ((1024, 2048, 2048, 10), 512, 3)}
for name, (sizes, batch, repeats) in models.items():
    cpu = step_seconds(sizes, batch, "cpu", repeats)
    line = f"{name:40s} cpu {cpu * 1e3:8.2f} ms"
    if GPU is not None:
        gpu = step_seconds(sizes, batch, "cuda", repeats)
        line += f"   cuda {gpu * 1e3:8.2f} ms   GPU speed-up {cpu / gpu:6.1f}x"
    print(line)
if GPU is None:
    print(f"no GPU here ({NO_GPU_REASON}): CPU times only; on a GPU machine this cell prints both")

# %% [markdown]
# ## How PyTorch does it
#
# * **Devices and guards.** `torch.device("cuda:1")`, `x.to("cuda")`,
#   `model.to(device)` and `CUDA_VISIBLE_DEVICES` mean what ours do. Where we
#   make a GPU current when its backend creates something, every PyTorch CUDA
#   operation runs under a *device guard* that makes the device of its inputs
#   current for exactly that operation, so interleaving GPUs needs no care;
#   `torch.cuda.set_device` sets the default for new tensors.
# * **Asynchronous execution and streams.** PyTorch returns from a CUDA
#   operation as soon as the kernel is queued; the CPU runs ahead while the GPU
#   works, and only reading a value (`loss.item()`, `.cpu()`) waits. Each device
#   has a default *stream* (a queue of kernels); more streams let copies and
#   kernels overlap, and `pin_memory=True` in a `DataLoader` with
#   `non_blocking=True` copies batches while the previous step computes (PyTorch
#   docs, "CUDA semantics"). CuPy queues asynchronously too; our `loss.item()`
#   per step is the one synchronisation.
# * **The caching allocator.** `cudaMalloc` and `cudaFree` are slow and
#   synchronise the device, so PyTorch keeps freed blocks and reuses them
#   (`torch.cuda.memory_allocated` vs `memory_reserved`). CuPy does the same with
#   its memory pool (`cupy.get_default_memory_pool()`), which is why
#   `nvidia-smi` shows a Python process holding memory it is not using.
# * **Vendor kernels.** Matrix products go to cuBLAS (ours too, through CuPy);
#   convolutions, pooling and normalisation go to cuDNN (Chetlur et al., "cuDNN:
#   Efficient Primitives for Deep Learning", 2014), which picks among several
#   algorithms per shape (`torch.backends.cudnn.benchmark = True` times them).
#   Our convolutions stay im2col + one GEMM on every device.
# * **Fewer launches.** `torch.compile` fuses chains of elementwise operations
#   into one kernel, and CUDA Graphs replay a whole recorded step with one
#   launch — both attack the launch overhead of section 3.
# * **Random numbers.** PyTorch's CUDA generator is Philox too; its state
#   (`torch.cuda.get_rng_state()`) is a seed and an offset, the same idea as our
#   `DrawCounter`.
#
# ## Summary
#
# * Host and device memory are separate; the bus between them is 50–100× slower
#   than GPU memory. Move data once and keep it on the device; only scalars come
#   back.
# * A GPU step has a floor of *kernels × launch cost*. The roofline model —
#   launch + max(FLOPs / peak, bytes / bandwidth) — says when an operation is
#   launch, memory or compute bound; small models are launch bound and may run
#   faster on the CPU.
# * tinytrain picks a backend by device name; `cuda:N` is the N-th GPU the
#   process sees; the CUDA backend is CuPy plus a handful of primitives:
#   host ↔ device copies, the current device, atomic scatter-add, and a random
#   stream whose state is a seed and a draw count, so GPU runs resume exactly.
# * `.to(device)` moves tensors and whole models, `DataLoader(device=...)`
#   delivers batches on the device, and the Trainer keeps everything there;
#   checkpoints are plain host data and load on any device.
# * Install the CuPy wheel that matches your driver's CUDA major version;
#   `tinytrain doctor` checks it and says how to fix it.
