# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 18 — Sharding: ZeRO stages 1–3, offloading, elastic checkpoints
#
# *One sitting, about 2.5 hours: the lesson, 9 functions to write, and the measurements.*
#
# Module 13's data parallelism copies everything to every rank: the weights, the
# gradients and the optimizer state. With Adam in float32 that is 16 bytes per
# parameter on *every* rank, before a single activation — a 1.5-billion-parameter
# GPT-2 XL needs 24 GB per rank, however many ranks share the work. Rajbhandari,
# Rasley, Ruwase and He (2020, *ZeRO: Memory Optimizations Toward Training Trillion
# Parameter Models*) noticed that most of it is redundant: every rank updates the
# same weights with the same averaged gradient. The **Zero Redundancy Optimizer**
# cuts the training state into $P$ shards, one per rank, in three stages:
#
# | stage | each rank keeps a 1/P shard of | bytes per parameter per rank (Adam, float32) | traffic per step |
# |---|---|---|---|
# | DataParallel | nothing: it keeps everything | 16 | all-reduce: 2Ψ |
# | 1 | the optimizer state | 8 + 16/P | reduce-scatter + all-gather: 2Ψ |
# | 2 | … and the gradients | 4 + 16/P | 2Ψ |
# | 3 | … and the parameters | 16/P | 3Ψ: a layer is gathered for its forward and its backward |
#
# Stages 1 and 2 cost *no more communication* than data parallelism; stage 3 costs
# half as much again and makes the memory per rank fall as $1/P$. **Offloading**
# (Ren et al. 2021, *ZeRO-Offload*) goes one step further: what is not in use — the
# optimizer and its float32 master weights — waits in host memory, and the update
# runs on the CPU. PyTorch calls stage 3 *FSDP*, DeepSpeed calls it ZeRO-3, and
# Lightning offers both as `strategy="fsdp"` and `strategy="deepspeed_stage_2"`.
#
# **You will**
# 1. predict what each rank holds at each stage (`zero_memory`);
# 2. lay parameters end to end in padded, flat **buckets** cut into equal shards;
# 3. write the two collectives ZeRO is made of, reduce-scatter and all-gather;
# 4. compute the gradient norm for clipping from shards, with one all-reduce;
# 5. write the strategy's step: gather parameters, reduce gradients, take the step
#    by the Trainer's rules — and see stage 3 reuse Module 13's checkpointing;
# 6. read how a checkpoint of a sharded run becomes one process's file, which
#    resumes on any number of ranks;
# 7. measure, under `mpirun` with 1, 2 and 4 ranks, the bytes per rank and the bytes
#    sent per step, against the predictions.

# %%
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import tinytrain as tt
from tinytrain import nn
from tinytrain.data import TensorDataset
from tinytrain.distributed import DataParallel, DistributedDataLoader, SingleProcess

# %% [markdown]
# ## 1. Where the memory goes, per rank
#
# Let $\Psi$ be the number of parameters and $k$ the arrays an optimizer keeps per
# parameter (SGD with momentum 1, Adam 2). Training in float32, each rank of Module
# 13's `DataParallel` holds $4\Psi$ bytes of weights, $4\Psi$ of gradients and
# $4k\Psi$ of optimizer state: $(8 + 4k)\Psi$, 16 bytes per parameter with Adam.
#
# The paper counts mixed precision: float16 weights and gradients ($2 + 2$ bytes)
# and $K = 12$ bytes of optimizer state — Adam's $m$ and $v$ *and a float32 master
# copy of the weights*, which the update needs (Module 13) — so $(2 + 2 + K)\Psi$,
# also 16. ZeRO divides by $P$ the parts a rank does not need whole:
#
# * **stage 1** shards the optimizer state: rank $r$ keeps, and updates, the state of
#   its $1/P$ of the parameters only — $(2 + 2 + K/P)\Psi$;
# * **stage 2** shards the gradients too: rank $r$ needs only its shard of the
#   averaged gradient — $(2 + (2 + K)/P)\Psi$;
# * **stage 3** shards the weights: $(2 + 2 + K)\Psi/P$. For 7.5 billion
#   parameters on 64 ranks the paper's figure 1 gives 120 GB per rank for data
#   parallelism, 31.4 GB for stage 1, 16.6 GB for stage 2 and 1.9 GB for stage 3.
#
# We train in float32 (and `16-mixed` when asked): the optimizer then steps a
# float32 **master shard**, a copy of its $1/P$ of the weights, whose $k$ state
# arrays sit beside it — $4(k + 1)\Psi/P$ of optimizer state at every stage. The
# gradients: stage 1 keeps the full $4\Psi$ that backward made *plus* its $4\Psi/P$
# shard of the mean; stages 2 and 3 only the shard. The weights stay $4\Psi$ until
# stage 3, where the model holds none between uses — the master shards *are* the
# weights. Per parameter with Adam: $8 + 16/P$ bytes at stage 1, $4 + 16/P$ at
# stage 2 and $16/P$ at stage 3 — at $P = 4$, 16 bytes become 12, 8 and 4. Shards
# are padded to equal sizes (section 2), a few numbers that we leave out here.

# %% export="sharding"
"""ZeRO: data parallelism whose ranks share out the optimizer state, the gradients and the parameters.

Rajbhandari, Rasley, Ruwase and He (2020), *ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models*. :class:`ZeRO`, given to ``Trainer(strategy=...)``,
trains like Module 13's ``DataParallel`` -- every rank on its own data, all ranks
together taking the step of one process on all their data -- but each rank keeps
only a 1/P share of the training state, cut per :class:`Bucket`: stage 1 shards the
optimizer state (and the float32 master weights it steps), stage 2 the gradients
too, stage 3 the parameters too. ``offload="cpu"`` keeps the masters and optimizer
state in host memory. Checkpoints hold the whole model and optimizer, as one
process's, so they load at any number of ranks.
"""
import math
from typing import Any, Callable

import numpy as np

from tinytrain.autograd import is_grad_enabled
from tinytrain.backend import get_backend, memory_order
from tinytrain.nn.checkpointing import Recompute, _recompute_keeps_buffers
from tinytrain.nn.layers import ModuleList, Sequential
from tinytrain.nn.module import Module
from tinytrain.optim import Optimizer, _plain
from tinytrain.runtime.mpi import broadcast, communicator
from tinytrain.tensor import Tensor
from tinytrain.training import memory_report

STAGES = (1, 2, 3)
OFFLOADS = (None, "cpu")


def zero_memory(num_parameters: int, world_size: int, stage: int, state_arrays: int = 2) -> dict[str, float]:
    """Bytes per rank, predicted, of float32 training of ``num_parameters`` (Ψ) parameters on
    ``world_size`` (P) ranks with an optimizer that keeps ``state_arrays`` (k) arrays per
    parameter (Adam and AdamW 2, SGD with momentum 1, plain SGD 0).

    ``stage`` 0 is DataParallel: parameters 4Ψ, gradients 4Ψ, optimizer state 4kΨ.
    With ZeRO the optimizer steps a float32 master copy of this rank's shard, which counts
    as optimizer state with the shard's k arrays: 4(k + 1)Ψ/P at every stage. The
    gradients: stage 1 keeps the full 4Ψ that backward made, plus the 4Ψ/P shard of the
    mean; stages 2 and 3 only the shard. The parameters: 4Ψ, but 0 at stage 3 (between
    uses the model holds none; the masters are the parameters). Padding to equal shards
    is left out. Returns floats under ``"parameters"``, ``"gradients"``,
    ``"optimizer_state"`` and their ``"total"``.

    ``stage`` is 0, 1, 2 or 3 and ``world_size`` at least 1: a prediction for the stages
    that exist (``ZeRO`` refuses any other stage); other values are not checked here.
    """
    ### BEGIN SOLUTION
    psi, shard = 4.0 * num_parameters, 4.0 * num_parameters / world_size
    if stage == 0:
        report = {"parameters": psi, "gradients": psi, "optimizer_state": state_arrays * psi}
    else:
        report = {"parameters": 0.0 if stage == 3 else psi,
                  "gradients": shard + (psi if stage == 1 else 0.0),
                  "optimizer_state": (state_arrays + 1) * shard}
    report["total"] = report["parameters"] + report["gradients"] + report["optimizer_state"]
    return report
    ### END SOLUTION


# %% check=1
_dp, _z3 = zero_memory(1000, 4, 0), zero_memory(1000, 4, 3)
assert _dp == {"parameters": 4000.0, "gradients": 4000.0, "optimizer_state": 8000.0, "total": 16000.0}, _dp
assert _z3 == {"parameters": 0.0, "gradients": 1000.0, "optimizer_state": 3000.0, "total": 4000.0}, _z3
_totals = [zero_memory(1000, 4, s)["total"] for s in (1, 2)]
assert _totals == [12000.0, 8000.0], f"stages 1 and 2 total 12000 and 8000 bytes, got {_totals}"
assert zero_memory(1000, 4, 2, state_arrays=1)["optimizer_state"] == 2000.0, "SGD's momentum: k = 1"
print("zero_memory OK")

# %% [markdown]
# ## 2. Buckets: flat, padded, sharded
#
# A collective costs a fixed latency plus its bytes over the bandwidth, $\alpha +
# n/\beta$: tens of microseconds per call between the machines of a cluster, however
# small the buffer. A GPT has dozens of parameter tensors, many of them tiny
# (LayerNorm's gains and biases), and one call per tensor would pay the latency
# dozens of times per step. So ZeRO, like PyTorch's DDP, lays the parameters end to
# end in flat vectors — **buckets** — and makes one large call per bucket. Ours are
# one per optimizer parameter group and dtype (at stage 3, per layer too: section 5).
#
# To cut a bucket into $P$ shards, the shards must be equal: `Reduce_scatter_block`
# and `Allgather` hand every rank the same number of elements. So the vector is
# padded with zeros to a multiple of $P$. Parameters of 6 and 2 numbers on $P = 3$
# ranks: 8 numbers padded to 9, `shard_size` 3, rank $r$ owning `[3r, 3r + 3)`:
#
# ```
# vector  a a a a a a b b 0
# rank 0  ─────
# rank 1        ─────
# rank 2              ───── (its last number is padding)
# ```
#
# A shard may cut a parameter in two. That is fine because the optimizers of Module
# 07 are **elementwise**: the update of a number depends on its own gradient and
# state only (momentum, Adam's $m$ and $v$, weight decay), so stepping a flat shard
# is stepping the parameters. Padding stays zero for good: a zero with a zero
# gradient and zero state never moves. (Optimizers that look at whole tensors —
# LAMB's and LARS's per-layer trust ratio, Shampoo's matrices — need more care:
# their ZeRO implementations keep each tensor whole inside one shard.)
#
# `flatten` writes each array in C order (row by row), whatever its memory order —
# Linear keeps its weight column-major (Module 04) — so that every rank cuts the same
# numbers; `unflatten` hands back views of the vector, no copies.

# %% export="sharding"
class Bucket:
    """Parameters that travel and are stepped together: one flat vector, padded and cut into equal shards.

    ``params`` (of one dtype, ``dtype``) laid end to end in this order, each flattened in
    C order, make a vector of ``numel`` numbers. It is padded with zeros to ``padded =
    shard_size * world_size`` numbers, ``shard_size = ceil(numel / world_size)``, so that
    every rank's shard has the same size, as ``Reduce_scatter_block`` and ``Allgather``
    need. Rank ``rank`` owns ``[start, start + shard_size)``, ``start = rank * shard_size``.

    ZeRO sets ``master``, this rank's shard as the tensor its optimizer steps; ``group``
    is the optimizer's parameter group and ``layer`` the module they belong to (stage 3;
    None for the rest of the model); ``accumulating`` says whether ``master.grad``
    already holds a reduction of the step in progress.
    """

    def __init__(self, params: list[Tensor], world_size: int, rank: int, group: int = 0,
                 layer: Module | None = None) -> None:
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]
        self.sizes = [math.prod(shape) for shape in self.shapes]
        self.dtype = self.params[0].dtype
        self.numel = sum(self.sizes)
        self.shard_size = -(-self.numel // world_size)
        self.padded = self.shard_size * world_size
        self.start = rank * self.shard_size
        self.group, self.layer = group, layer
        self.master: Tensor | None = None
        self.accumulating = False

    def __repr__(self) -> str:
        return (f"Bucket({len(self.params)} parameters, {self.numel} numbers padded to {self.padded}, "
                f"shard {self.start}:{self.start + self.shard_size})")

    def flatten(self, arrays: list[Any]) -> np.ndarray:
        """``arrays`` (host arrays of the parameters' shapes, in order; ``None`` counts as zeros)
        end to end, each in C order, as one new vector of ``padded`` numbers in ``dtype``,
        zeros after the first ``numel``."""
        ### BEGIN SOLUTION
        vector = np.zeros(self.padded, dtype=self.dtype)
        start = 0
        for array, size in zip(arrays, self.sizes):
            if array is not None:
                vector[start:start + size] = np.asarray(array).reshape(-1)
            start += size
        return vector
        ### END SOLUTION

    def unflatten(self, vector: np.ndarray) -> list[np.ndarray]:
        """The parameters' arrays in ``vector`` (laid out as :meth:`flatten` lays them; at least
        ``numel`` long): views of its slices, reshaped to the parameters' shapes."""
        ### BEGIN SOLUTION
        arrays, start = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            arrays.append(vector[start:start + size].reshape(shape))
            start += size
        return arrays
        ### END SOLUTION


# %% check=2
_a, _b = tt.zeros((2, 3), requires_grad=True), tt.zeros(2, requires_grad=True)
_bucket = Bucket([_a, _b], world_size=3, rank=1)
assert (_bucket.numel, _bucket.shard_size, _bucket.padded, _bucket.start) == (8, 3, 9, 3), _bucket
_flat = _bucket.flatten([np.arange(6.0).reshape(2, 3), None])
assert _flat.tolist() == [0, 1, 2, 3, 4, 5, 0, 0, 0] and _flat.dtype == np.float32, _flat
_flat = _bucket.flatten([np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array([6.0, 7.0])])
assert _flat.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0], "C order, whatever the memory order"
_parts = _bucket.unflatten(_flat)
assert [p.shape for p in _parts] == [(2, 3), (2,)] and _parts[1].tolist() == [6.0, 7.0], \
    f"the parameters' shapes (2, 3) and (2,), the second [6, 7], got {[p.shape for p in _parts]}, {_parts[1]}"
assert all(np.shares_memory(p, _flat) for p in _parts), "views, not copies"
_whole = Bucket([tt.zeros(3, requires_grad=True, dtype="float64")], world_size=1, rank=0)
_row = np.arange(3.0)
assert _whole.flatten([_row]).dtype == np.float64 and not np.shares_memory(_whole.flatten([_row]), _row), \
    "a new vector in the bucket's dtype, even when no padding is needed"
print("Bucket OK")

# %% [markdown]
# ## 3. Two collectives: reduce-scatter and all-gather
#
# Module 13's all-reduce gives every rank the sum of every rank's buffer. It has two
# halves, which a ring all-reduce runs one after the other:
#
# ```
# before           rank 0: a0 a1 a2     rank 1: b0 b1 b2     rank 2: c0 c1 c2
# reduce-scatter   rank 0: s0           rank 1: s1           rank 2: s2        (s_i = a_i + b_i + c_i)
# all-gather       every rank: s0 s1 s2
# ```
#
# In a ring each half sends $(P - 1)/P$ of the buffer from every rank, so an
# all-reduce of $\Psi$ gradients sends about $2\Psi$ (Module 13). That is ZeRO's
# whole trick: a rank needs only *its shard* of the mean gradient, to update its
# shard of the weights — so it **reduce-scatters** the gradients, steps its shard,
# and **all-gathers** the new weights. $\Psi + \Psi$: the bytes of data parallelism,
# with $1/P$ of the optimizer on each rank.
#
# mpi4py's buffer methods take host arrays: `comm.Reduce_scatter_block(send, receive)`
# (`send` holds $P$ blocks, `receive` one; their sum, block by block) and
# `comm.Allgather(send, receive)` (`receive` holds every rank's `send`, in rank order).
# A reduction adds numbers, in a type MPI knows: reduce in the bucket's dtype,
# `bucket.dtype`, the dtype its parameters had when ZeRO cut them — which
# `bucket.flatten` gives. Under `32-true` and under mixed precision that is float32:
# ZeRO cuts the buckets before the model gets its float16 working copies, so float16
# gradients are widened to float32 by `flatten` and their sum cannot overflow. Do not
# cast the buffer yourself. A gather only moves bytes: view the arrays as unsigned
# integers of their size (`array.view("u2")` for float16) and any dtype travels —
# float16 and bfloat16, which MPI has no type for, included. A view with another
# itemsize needs a contiguous array: `np.ascontiguousarray(shard)` first. Under
# `16-mixed` the weights travel in float16, half the bytes.

# %% export="sharding"
def reduce_scatter(bucket: Bucket, comm: Any) -> np.ndarray:
    """This rank's shard of the mean over the ranks of the gradients of ``bucket``'s parameters.

    Every rank flattens its gradients (``bucket.flatten``; a parameter whose ``.grad``
    is None counts as zeros; a gradient on a device comes to the host with its
    backend's ``to_host``) into one buffer; one ``comm.Reduce_scatter_block(send,
    receive)`` sums the buffers and hands each rank its block; divided by the number of
    ranks that is the mean. Returns a new host array of ``shard_size`` numbers in
    ``bucket.dtype``, the dtype of ``bucket.flatten``'s buffer, with no cast of its own.
    Under mixed precision the buckets are float32 (cut from the float32 parameters before
    the model got its float16 copies), so float16 gradients are summed in float32 and the
    sum does not overflow.
    """
    ### BEGIN SOLUTION
    grads = [None if p.grad is None else p.grad._backend.to_host(p.grad.data) for p in bucket.params]
    send = bucket.flatten(grads)
    shard = np.empty(bucket.shard_size, dtype=send.dtype)
    comm.Reduce_scatter_block(send, shard)
    shard /= comm.Get_size()
    return shard
    ### END SOLUTION


def all_gather(bucket: Bucket, shard: np.ndarray, comm: Any) -> np.ndarray:
    """Every rank's ``shard`` of ``bucket``, end to end in rank order: the full padded vector,
    a new host array in ``shard``'s dtype, from one ``comm.Allgather(send, receive)``.

    A gather adds nothing, it only moves bytes: send and receive the arrays viewed as
    unsigned integers of the same size (``array.view(f"u{array.itemsize}")``), so that
    dtypes MPI has no type for (float16, bfloat16) travel too. Such a view needs a
    contiguous array: send ``np.ascontiguousarray(shard)``.
    """
    ### BEGIN SOLUTION
    full = np.empty(bucket.padded, dtype=shard.dtype)
    raw = f"u{shard.dtype.itemsize}"
    comm.Allgather(np.ascontiguousarray(shard).view(raw), full.view(raw))
    return full
    ### END SOLUTION


# %% check=2
class _FakeRank(SingleProcess):
    """Rank ``rank`` of ``size``; the other ranks sent ``others`` (their buffers, summed or in rank order).
    ``calls`` counts the collectives."""

    def __init__(self, rank, size, others):
        self.rank, self.size, self.others, self.calls = rank, size, others, 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Reduce_scatter_block(self, send, receive, op=None):
        self.calls += 1
        block = send.size // self.size
        receive[...] = (send + self.others)[self.rank * block:(self.rank + 1) * block]

    def Allgather(self, send, receive):
        self.calls += 1
        receive[...] = np.insert(self.others, self.rank * send.size, send)


_a.grad, _b.grad = tt.tensor(np.ones((2, 3))), None
_comm = _FakeRank(1, 3, np.full(9, 2.0, np.float32))
_shard = reduce_scatter(_bucket, _comm)
assert _shard.tolist() == [1.0, 1.0, 1.0] and _shard.dtype == np.float32, f"(1 + 2) / 3 each, got {_shard}"
assert _comm.calls == 1, f"one Reduce_scatter_block for the bucket, got {_comm.calls} calls"
_a.grad, _b.grad = tt.tensor(np.ones((2, 3)), device="strict"), tt.tensor([5.0, 8.0], dtype="float16")
_shard = reduce_scatter(_bucket, _FakeRank(2, 3, np.full(9, 1.0, np.float32)))
assert np.allclose(_shard, [2.0, 3.0, 1 / 3]) and _shard.dtype == np.float32, f"rank 2's block (6, 9, 1) / 3: {_shard}"
_mine = np.array([3, 4, 5], np.float16)  # the other ranks' shards arrive as the raw bytes of float16 numbers
_others = np.array([0, 1, 2, 6, 7, 8], np.float16).view(np.uint16)
_comm = _FakeRank(1, 3, _others)
_full = all_gather(_bucket, _mine, _comm)
assert _full.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8] and _full.dtype == np.float16, _full
assert _comm.calls == 1, f"one Allgather for the bucket, got {_comm.calls} calls"
print("reduce_scatter and all_gather OK")

# %% [markdown]
# ## 4. The step: one norm over all shards
#
# Clipping (Module 09) scales the gradient by `max_norm / norm` when its global L2
# norm is above `max_norm`. No rank holds the whole gradient any more, but squares add
# up over the shards: $\lVert g \rVert^2 = \sum_r \lVert g_r \rVert^2$ (padding adds
# zeros). So every rank sums its squares, one all-reduce adds the sums, and every
# rank gets the same norm and clips its shard by the same factor.
#
# The same all-reduce carries what the ranks must decide *together*: whether a
# rank's loss was not finite, whether its float16 gradients overflowed. A rank that
# decided alone would skip a step that the others take — its weights would drift
# from theirs, or the ranks would wait forever at the next collective for one that
# is not coming. So: one float64 buffer, `[sum of squares, flag, flag, ...]`, one call.

# %% export="sharding"
def global_norm_and_flags(gradients: list[Tensor], flags: list[float], comm: Any) -> tuple[float, list[float]]:
    """The L2 norm of the gradient that ``gradients`` (this rank's shards; the other ranks hold
    the rest) make on all ranks together, and ``flags`` summed over the ranks, from ONE
    ``comm.Allreduce`` of a float64 buffer: this rank's sum of squares, then its flags.

    ``gradients`` are Tensors, none of them None (ZeRO passes its masters' gradients,
    which every step's reduction sets). Add the squares up on each gradient's device and
    read the sum to the host once per gradient: these are one per bucket, a handful, not
    one per parameter as in Module 09, where the sums stay on the device until one read per
    device. Sum in float64, or in the gradients' dtype and again in float64 when that sum
    is ``inf`` (float32 squares overflow above about 1.8e19). Returns ``(norm, summed
    flags)``: a Python float and a list of Python floats.
    """
    ### BEGIN SOLUTION
    squares = 0.0
    for grad in gradients:
        flat, backend = grad.data.reshape(-1), grad._backend
        total = float(backend.to_host(backend.xp.vdot(flat, flat)))
        if math.isinf(total):
            wide = flat.astype(np.float64)
            total = float(backend.to_host(backend.xp.vdot(wide, wide)))
        squares += total
    send = np.array([squares, *flags], dtype=np.float64)
    summed = np.empty_like(send)
    comm.Allreduce(send, summed)
    return math.sqrt(summed[0]), [float(value) for value in summed[1:]]
    ### END SOLUTION


# %% check=1
class _Doubled(SingleProcess):
    """A second rank that sent what this one sent; ``sent`` records the buffers."""

    def __init__(self):
        self.sent = []

    def Get_size(self):
        return 2

    def Allreduce(self, send, receive, op=None):
        self.sent.append(send.copy())
        receive[...] = 2 * send


_comm = _Doubled()
_norm, _flags = global_norm_and_flags([tt.tensor([3.0, 0.0]), tt.tensor([4.0], device="strict")], [1.0, 0.0], _comm)
assert (round(_norm, 6), _flags) == (round(math.sqrt(50.0), 6), [2.0, 0.0]), (_norm, _flags)
assert len(_comm.sent) == 1 and _comm.sent[0].dtype == np.float64 and _comm.sent[0].tolist() == [25.0, 1.0, 0.0], \
    f"one Allreduce of the float64 buffer [sum of squares, flags...] = [25, 1, 0], got {_comm.sent}"
_norm, _ = global_norm_and_flags([tt.tensor([3e19, 4e19])], [], SingleProcess())
assert math.isclose(_norm, 5e19, rel_tol=1e-6), f"no overflow for finite gradients: {_norm}"
print("global_norm_and_flags OK")

# %% [markdown]
# ## 5. ZeRO, the strategy
#
# `ZeRO(stage, offload=None, comm=None)` goes where Module 13's `DataParallel` goes:
# `Trainer(..., strategy=ZeRO(2))`, with a `DistributedDataLoader` per rank. The given
# code around your three methods:
#
# * `setup` gives every rank rank 0's weights (as `DataParallel` does), cuts the
#   optimizer's parameters into buckets and gives each its **master**: this rank's
#   shard as a float32 tensor, on the model's device — or in host memory with
#   `offload="cpu"`. Then it replaces `trainer.optimizer` by a `ShardedOptimizer`,
#   whose `inner` optimizer — the class and hyperparameters you gave the Trainer —
#   steps the masters. A schedule still sets `trainer.optimizer.lr`.
# * The Trainer hands the whole step to the strategy's `take_step` (Module 09's
#   extension point): only the ranks together know the gradient norm, so the
#   strategy clips and steps, by the Trainer's own rules (`trainer._plugins_allow`,
#   `trainer._skip`).
# * Under `16-mixed` the model holds float16 working copies for good and the masters
#   stay float32 — the paper's $2 + 2 + 12$. Module 13's mixed precision lends its
#   parts: `restore_masters()` (for weights outside the optimizer), its `scaler` to
#   unscale the masters' gradients, and `update_scale(found_inf)` with the verdict of
#   all ranks. (A `bf16-mixed` plugin lends `compute_dtype = bfloat16` and no scaler.)
#
# A step, then, on every rank:
#
# 1. forward and backward on this rank's batch, as ever;
# 2. `reduce_gradients`: each bucket's gradients reduce-scattered into its master's
#    `.grad`; from stage 2 on, the full gradients are freed;
# 3. `global_norm_and_flags`: skip with every rank, or clip;
# 4. the inner optimizer steps the masters; at stages 1 and 2, `gather_parameters`
#    gives every rank's model the new weights.
#
# **Stage 3** keeps no weights in the model between uses. Each layer of
# `sharded_layers(model)` — the items of the outermost `Sequential` or `ModuleList`,
# a GPT's blocks — has its parameters gathered just before its forward and freed
# after. But its backward needs them again, and the autograd graph would keep the
# gathered arrays alive until then, which is exactly what freeing is for. Module 13
# solved this already: **gradient checkpointing** runs a segment without keeping
# anything and recomputes it in backward. So a stage-3 layer is a checkpointed
# segment whose function gathers, runs and frees (`_Gathered`), and whose backward,
# after the recomputation has backpropagated, reduce-scatters the layer's gradients
# (`GatheredRecompute`, a subclass of your `Recompute`): the full gradient never
# exists at once. The weights outside the layers (a GPT's embeddings, its last
# LayerNorm, the tied output layer) stay gathered from the model's forward to the
# step. The price: one more forward per layer, and every layer gathered twice per
# step — $3\Psi$ of traffic.
#
# **Offloading.** With `offload="cpu"` the masters, their gradients and the optimizer
# state live in host memory and the update runs on the CPU (NumPy), while the model
# runs on its device. The gradients come to the host for MPI anyway; only the new
# weights go back. The device saves the master, its gradient and the $k$ state arrays:
# $4(k + 2)\Psi/P$ bytes. DeepSpeed's ZeRO-Offload does the same with a fast
# vectorised CPU Adam.
#
# You write the three methods at the heart of it: `gather_parameters`,
# `reduce_gradients` and `take_step` (its docstring lists the rules, in order).
# Two things to know about gradients as tensors: a master's gradient is a tensor made
# with `Tensor._make(array, backend)`, as Module 13's `unscale_` makes one; and
# `unscale_` *replaces* every `master.grad` by a new tensor, so take the list of the
# masters' gradients after it — clipping a list taken before would scale arrays the
# optimizer never sees.

# %% export="sharding"
def sharded_layers(model: Module) -> list[Module]:
    """The layers that stage 3 gathers one at a time: the items of the outermost ``Sequential``
    and ``ModuleList`` containers in ``model`` (``model`` itself, if it is one) that hold
    parameters, except an item that shares a parameter or a module with anything outside it
    (a tied weight, a layer used twice). The model's other parameters belong to the model
    itself and stay gathered for a whole step."""
    owners: dict[int, set[int]] = {}  # parameter -> the modules that register it
    places: dict[int, int] = {}  # module -> how many times it is registered in the tree
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None:
                owners.setdefault(id(param), set()).add(id(module))
        for child in module._modules.values():
            if child is not None:
                places[id(child)] = places.get(id(child), 0) + 1

    def candidates(module: Module) -> list[Module]:
        if isinstance(module, (Sequential, ModuleList)):
            return [child for child in module.children() if child.parameters()]
        return [layer for child in module.children() for layer in candidates(child)]

    def own(layer: Module) -> bool:
        inside = layer.modules()
        return (all(places[id(module)] == 1 for module in inside)
                and all(owners[id(param)] <= {id(module) for module in inside} for param in layer.parameters()))

    return [layer for layer in candidates(model) if own(layer)]


class GatheredRecompute(Recompute):
    """Module 13's checkpointed segment, for one layer under stage 3: the segment gathers the layer's
    parameters, runs it and frees them again, in the forward and in the backward's recompute;
    after the backward, ``when_done()`` reduces the layer's gradients."""

    def forward(self, *arrays: Any, function: Callable[..., Tensor], count: int, when_done: Callable[[], None]) -> Any:
        self.when_done = when_done
        return super().forward(*arrays, function=function, count=count)

    def backward(self, grad: Any) -> tuple:
        grads = super().backward(grad)
        self.when_done()
        return grads


class _Gathered(Module):
    """A layer whose parameters are gathered for each call and freed after it (stage 3)."""

    def __init__(self, strategy: "ZeRO", layer: Module, buckets: list[Bucket]) -> None:
        super().__init__()
        self.layer = layer  # registered, so that the recompute finds its buffers
        self.strategy, self.buckets, self.run = strategy, buckets, layer.forward

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.strategy.gather_parameters(self.buckets)
        try:
            return self.run(*args, **kwargs)
        finally:
            self.strategy.release_parameters(self.buckets)


class _LayerCall:
    """What a stage-3 layer's ``forward`` becomes: a gathered call (no gradients: evaluation,
    generation), or a :class:`GatheredRecompute` node whose backward reduces the layer's gradients."""

    def __init__(self, strategy: "ZeRO", layer: Module, buckets: list[Bucket]) -> None:
        self.strategy, self.layer, self.buckets = strategy, layer, buckets
        self.gathered = _Gathered(strategy, layer, buckets)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_grad_enabled():
            return self.gathered(*args, **kwargs)
        if kwargs or not args or not all(isinstance(arg, Tensor) for arg in args):
            given = [type(arg).__name__ for arg in args] + [f"{key}=" for key in kwargs]
            raise TypeError(f"ZeRO stage 3: {type(self.layer).__name__} was called with {given} while recording "
                            "gradients; a sharded layer recomputes its forward, so it takes tensors only")
        return GatheredRecompute.apply(*args, self.strategy.anchor, function=_recompute_keeps_buffers(self.gathered),
                                       count=len(args), when_done=lambda: self.strategy.reduce_gradients(self.buckets))


class _ModelCall:
    """What a stage-3 model's ``forward`` becomes: the parameters outside the layers are gathered
    first, and stay so until the step (or, without gradients, until the call ends)."""

    def __init__(self, strategy: "ZeRO", model: Module) -> None:
        self.strategy, self.run = strategy, model.forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.strategy.gather_model_parameters()
        try:
            return self.run(*args, **kwargs)
        finally:
            if not is_grad_enabled():
                self.strategy.release_model_parameters()


class ZeRO:
    """``Trainer(..., strategy=ZeRO(stage))``: data parallelism whose ranks share out the training state.

    ``stage``: 1 shards the optimizer state and the float32 master weights it steps; the
    gradients are reduce-scattered (each rank gets its shard of the mean), the stepped
    shards all-gathered into every rank's model. 2 also frees the full gradients once
    reduced. 3 also keeps no parameters in the model between uses: each layer of
    :func:`sharded_layers` gathers its parameters just before its forward, and again
    before its backward (which recomputes it), frees them after, and reduces its
    gradients as soon as its backward is done. ``offload="cpu"``: the masters and the
    optimizer state live in host memory and the update runs there, while the model runs
    on its device. ``comm``: mpi4py's communicator (``COMM_WORLD`` by default).

    ``setup`` (the Trainer calls it) gives every rank rank 0's parameters and buffers,
    cuts the optimizer's parameters into buckets (one per optimizer group and dtype; at
    stage 3 per layer too) and replaces ``trainer.optimizer`` by a :class:`ShardedOptimizer`
    over this rank's shards. Under ``precision="16-mixed"`` the model holds the compute
    dtype's working copies and the masters stay float32 (a precision plugin offers
    ``compute_dtype``, ``restore_masters()``, and ``scaler`` and ``update_scale(found_inf)``
    when it scales the loss). The Trainer hands the whole step to :meth:`take_step`.
    Checkpoints hold the complete model and optimizer, as one process's
    (:meth:`gather_state`, :meth:`scatter_state`): they load at any number of ranks, and
    with DataParallel or no strategy. Only rank 0 writes them (``is_writer``).
    """

    name = "strategy"

    def __init__(self, stage: int = 2, offload: str | None = None, comm: Any = None) -> None:
        if isinstance(stage, bool) or stage not in STAGES:
            raise ValueError(f"ZeRO stage must be 1, 2 or 3, got stage={stage!r}")
        if offload not in OFFLOADS:
            raise ValueError(f"offload must be None or 'cpu' (host memory), got offload={offload!r}")
        self.stage, self.offload = stage, offload
        self.comm = communicator(comm)
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.is_writer = self.rank == 0
        self.nonfinite_ranks = 0  # at the last step: every rank skips (or raises) alike
        self.buckets: list[Bucket] = []
        self.trainer: Any = None

    def __repr__(self) -> str:
        return f"ZeRO(stage={self.stage}, offload={self.offload!r}, rank {self.rank} of {self.world_size})"

    # -- setting up ---------------------------------------------------------------------
    def setup(self, trainer: Any) -> None:
        if self.trainer is not None:
            raise RuntimeError(f"{self!r} already runs a Trainer; give each Trainer a ZeRO of its own")
        model, optimizer = trainer.model, trainer.optimizer
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"ZeRO shards a tinytrain optimizer (SGD, Adam, AdamW), got a {type(optimizer).__name__}")
        named = dict(model.named_parameters())
        names = {id(param): name for name, param in named.items()}
        for index, param in enumerate(optimizer.params):
            if id(param) not in names:
                raise ValueError(f"optimizer parameter {index} (shape {param.shape}) is not a parameter of the model")
        devices = {param._backend.device for param in named.values()}
        if len(devices) != 1:
            raise ValueError(f"ZeRO needs the model on one device; its parameters are on {sorted(devices)}")
        self.backend = next(iter(named.values()))._backend
        self.state_backend = get_backend("cpu") if self.offload == "cpu" else self.backend
        self.precision = getattr(trainer, "_amp", None)
        self.compute_dtype = None if self.precision is None else np.dtype(self.precision.compute_dtype)
        broadcast(list(named.values()) + [b for b in model.buffers() if b is not None], self.comm)
        self.names = names
        self.shapes = {name: tensor.shape for name, tensor in model.named_parameters() + model.named_buffers()}
        self.orders = {id(param): memory_order(param.data) for param in named.values()}
        self.layers = sharded_layers(model) if self.stage == 3 else []
        self.buckets = self._buckets(optimizer)
        self.anchor = Tensor._make(self.backend.xp.zeros((), dtype="float32"), self.backend, True)
        self.model_parameters = [id(param) for param in named.values()]
        self.optimizer = ShardedOptimizer(self, optimizer)
        trainer.optimizer = self.optimizer
        self.trainer = trainer
        if self.stage < 3:
            self.gather_parameters(self.buckets)  # the working copies: in the compute dtype under mixed precision
            return
        self.release_parameters(self.buckets)
        for layer in self.layers:
            layer.forward = _LayerCall(self, layer, [b for b in self.buckets if b.layer is layer])
        model.forward = _ModelCall(self, model)

    def _buckets(self, optimizer: Optimizer) -> list[Bucket]:
        """One bucket per optimizer group and dtype (at stage 3, per layer too, and the rest of the model),
        each with its ``master``: this rank's shard, on the masters' device."""
        owner = {id(param): layer for layer in self.layers for param in layer.parameters()}
        buckets = []
        for layer in [*self.layers, None]:
            for index, group in enumerate(optimizer.param_groups):
                members = [param for param in group["params"] if owner.get(id(param)) is layer]
                for dtype in dict.fromkeys(param.dtype for param in members):
                    same = [param for param in members if param.dtype == dtype]
                    buckets.append(Bucket(same, self.world_size, self.rank, group=index, layer=layer))
        for bucket in buckets:
            full = bucket.flatten([param._backend.to_host(param.data) for param in bucket.params])
            shard = full[bucket.start:bucket.start + bucket.shard_size].copy()
            bucket.master = Tensor._make(self.state_backend.from_host(shard), self.state_backend, True)
        return buckets

    # -- moving parameters and gradients ----------------------------------------------------
    def gather_parameters(self, buckets: list[Bucket]) -> None:
        """Give this rank's model every rank's shards of ``buckets``: one :func:`all_gather` per bucket
        of the masters, cast to the compute dtype first when there is one (under 16-mixed half the
        bytes travel); each parameter's ``data`` becomes its part of the gathered vector
        (``bucket.unflatten``), on the model's device (``self.backend.from_host``) and in its
        memory order (``self.orders[id(param)]``: ``"F"`` takes ``np.asfortranarray``; ``"C"``
        keeps the slice as it is, already C order). On the CPU the parameters' arrays are then
        views into the gathered vector, with no copy: that is intended, since nothing else holds
        the vector and every gather makes a new one; the masters stay apart."""
        ### BEGIN SOLUTION
        for bucket in buckets:
            shard = self.state_backend.to_host(bucket.master.data)
            if self.compute_dtype is not None:
                shard = shard.astype(self.compute_dtype)
            full = all_gather(bucket, shard, self.comm)
            for param, array in zip(bucket.params, bucket.unflatten(full)):
                if self.orders[id(param)] == "F":
                    array = np.asfortranarray(array)
                param.data = self.backend.from_host(array)
        ### END SOLUTION

    def release_parameters(self, buckets: list[Bucket]) -> None:
        """Free the model's copies of ``buckets``' parameters (stage 3): each holds an empty array,
        of the dtype it computes in, until it is gathered again."""
        for bucket in buckets:
            dtype = bucket.dtype if self.compute_dtype is None else self.compute_dtype
            for param in bucket.params:
                param.data = self.backend.xp.empty((0,), dtype=dtype)

    def gather_model_parameters(self) -> None:
        """Stage 3: gather the parameters that belong to no layer, unless they are gathered already."""
        own = [bucket for bucket in self.buckets if bucket.layer is None]
        if not all(param.data.size == size for bucket in own for param, size in zip(bucket.params, bucket.sizes)):
            self.gather_parameters(own)

    def release_model_parameters(self) -> None:
        """Stage 3: free the parameters that belong to no layer."""
        self.release_parameters([bucket for bucket in self.buckets if bucket.layer is None])

    def reduce_gradients(self, buckets: list[Bucket]) -> None:
        """Reduce-scatter ``buckets``' gradients (:func:`reduce_scatter`): this rank's shard of the mean
        goes to its master's ``.grad`` on the masters' device (``self.state_backend.from_host``).
        The step's first reduction of a bucket (not ``accumulating``) sets ``master.grad`` to a new
        tensor, ``Tensor._make(shard, self.state_backend)`` as Module 13's ``unscale_`` makes one,
        whatever ``master.grad`` held (None included); a later one (stage 3 reduces each layer
        once per micro-batch) adds the shard in place, ``master.grad.data += shard``. Mark the
        bucket ``accumulating``: it is True only after this step's first reduction has set
        ``master.grad``, so an accumulating master always has one. From stage 2 on, free the
        full gradients (``.grad = None``)."""
        ### BEGIN SOLUTION
        for bucket in buckets:
            shard = self.state_backend.from_host(reduce_scatter(bucket, self.comm))
            master = bucket.master
            if bucket.accumulating:
                master.grad.data += shard
            else:
                master.grad = Tensor._make(shard, self.state_backend)
            bucket.accumulating = True
            if self.stage >= 2:
                for param in bucket.params:
                    param.grad = None
        ### END SOLUTION

    # -- the step -------------------------------------------------------------------------
    def take_step(self, trainer: Any, parameters: list[Tensor], loss: float, norms: list[float]) -> bool:
        """The Trainer's step on sharded gradients, by the Trainer's rules; whether it was taken.

        1. ``self.check_model(parameters)``; reduce the gradients of every bucket that no
           backward has reduced in this step (not ``accumulating``).
        2. Mixed precision (``self.precision`` is not None): ``restore_masters()``; when its
           ``scaler`` is not None, ``overflow = scaler.unscale_(masters)`` (this rank's shards);
           otherwise (a ``bf16-mixed`` plugin has ``scaler = None``; read it with
           ``getattr(self.precision, "scaler", None)``) there is no overflow. ``unscale_``
           *replaces* each ``master.grad`` by a new tensor: read the masters' gradients after
           it, since a list taken before holds arrays the optimizer never sees.
        3. :func:`global_norm_and_flags` of the masters' gradients with the flags ``[loss not
           finite, overflow]`` (1.0 or 0.0): the norm and how many ranks had each.
        4. With a scaler, ``self.precision.update_scale(ranks that overflowed > 0)``; then
           ``self.nonfinite_ranks`` = the ranks whose loss was not finite, as an int
           (``round`` the summed flag), and skip unless
           ``trainer._plugins_allow(loss, self.nonfinite_ranks, no rank overflowed)``.
        5. Clipping (``trainer.grad_clip_norm`` not None), as ``_clip_and_step`` does with the
           global norm: a non-finite norm is ``trainer._skip(f"the gradient norm is {norm}")``;
           otherwise append it to ``norms`` and, above the maximum, scale the masters'
           gradients by ``max_norm / (norm + 1e-6)``.
        6. ``self.optimizer.step()``, count it in ``trainer.step``, return True.
        Whatever happens from step 1 on (``check_model`` raising included: put all of it in
        ``try``, the ending in ``finally``), end the step: every bucket stops ``accumulating``,
        and at stage 3 the model's own parameters are released (``release_model_parameters``).
        """
        ### BEGIN SOLUTION
        try:
            self.check_model(parameters)
            self.reduce_gradients([bucket for bucket in self.buckets if not bucket.accumulating])
            masters = [bucket.master for bucket in self.buckets]
            scaler = getattr(self.precision, "scaler", None)
            if self.precision is not None:
                self.precision.restore_masters()
            overflow = scaler is not None and scaler.unscale_(masters)
            norm, (bad_ranks, overflows) = global_norm_and_flags(
                [master.grad for master in masters], [float(not math.isfinite(loss)), float(overflow)], self.comm)
            if scaler is not None:
                self.precision.update_scale(overflows > 0)
            self.nonfinite_ranks = round(bad_ranks)
            if not trainer._plugins_allow(loss, self.nonfinite_ranks, overflows == 0):
                return False
            if trainer.grad_clip_norm is not None:
                if not math.isfinite(norm):
                    return trainer._skip(f"the gradient norm is {norm}")
                norms.append(norm)
                if norm > trainer.grad_clip_norm:
                    for master in masters:
                        master.grad.data *= trainer.grad_clip_norm / (norm + 1e-6)
            self.optimizer.step()
            trainer.step += 1
            return True
        finally:
            for bucket in self.buckets:
                bucket.accumulating = False
            if self.stage == 3:
                self.release_model_parameters()
        ### END SOLUTION

    def check_model(self, parameters: list[Tensor]) -> None:
        """Raise ``RuntimeError`` naming the parameter when the model's parameters are not the ones
        the strategy cut into buckets (one was added, replaced or moved to another device)."""
        current = [id(param) for param in parameters]
        moved = [param for param in parameters if param._backend is not self.backend]
        if current == self.model_parameters and not moved:
            return
        model = self.trainer.model
        name = {id(param): name for name, param in model.named_parameters()}
        new = [name.get(id(param), f"a tensor of shape {param.shape}") for param in parameters
               if id(param) not in self.names]
        gone = [self.names[i] for i in self.model_parameters if i not in set(current)]
        what = (f"{new[0]} is new" if new else f"{gone[0]} is gone" if gone else
                f"{name.get(id(moved[0]))} moved to {moved[0].device}" if moved else "their order changed")
        raise RuntimeError(f"ZeRO: the model's parameters changed after the strategy attached ({what}); build "
                           f"and place the model completely, then create the Trainer")

    # -- checkpoints (section 6) ---------------------------------------------------------------
    def gather_state(self) -> tuple[dict, dict] | None:
        """The complete model and optimizer states on the writer (None elsewhere); every rank must call it."""
        return gather_full_state(self)

    def scatter_state(self, model_state: dict, optimizer_state: dict) -> None:
        """Keep this rank's share of complete states (saved at any number of ranks), or restore its own
        snapshot (``model.state_dict()``, ``trainer.optimizer.state_dict()``)."""
        scatter_full_state(self, model_state, optimizer_state)

    def state_dict(self) -> dict:
        return {"stage": self.stage, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: a checkpoint of any stage and number of ranks resumes here."""


def _stand_in(shape: tuple[int, ...], dtype: Any) -> Tensor:
    """A tensor of ``shape`` that takes no memory: for an optimizer that only reads and writes state dicts."""
    return Tensor._make(np.broadcast_to(np.zeros((), dtype=dtype), shape), get_backend("cpu"), True)


class ShardedOptimizer:
    """The Trainer's optimizer under ZeRO: ``inner`` -- an optimizer of the class and the hyperparameters of
    ``original`` (the one the Trainer was given) over the masters of this rank's shards -- steps them, then
    (stages 1 and 2) the model gets every rank's shards.

    It stands where ``original`` stood: ``lr`` (read and set, by a schedule), ``param_groups``,
    ``step()``, ``zero_grad()``; ``state_dict()`` and ``load_state_dict()`` are this rank's own
    shards. ``template``, an optimizer like ``original`` over stand-ins of the parameters' shapes,
    reads and writes the complete state dicts of checkpoints.
    """

    def __init__(self, strategy: ZeRO, original: Optimizer) -> None:
        self.strategy, self.original = strategy, original
        settings = [{name: group[name] for name in original.hyperparameters if name != "lr"}
                    | {"lr": original.defaults["lr"] * group["lr_scale"]} for group in original.param_groups]
        self.inner = type(original)(
            [{"params": [b.master for b in strategy.buckets if b.group == index], **spec}
             for index, spec in enumerate(settings)], **original.defaults)
        self.template = type(original)(
            [{"params": [_stand_in(param.shape, param.dtype) for param in group["params"]], **spec}
             for group, spec in zip(original.param_groups, settings)], **original.defaults)
        self.inner.lr = self.template.lr = original.lr
        self.kind = f"ZeRO shard of {type(original).__name__}"  # what its own state dicts say they are
        where = {id(param): i for i, param in enumerate(self.inner.params)}  # the groups' order, not the buckets'
        self.positions = [where[id(bucket.master)] for bucket in strategy.buckets]  # of each bucket's master

    @property
    def lr(self) -> float:
        return self.inner.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.inner.lr = value
        self.original.lr = value

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def step(self) -> None:
        """Step this rank's shards; then (stages 1 and 2) every rank's model gets all the stepped shards."""
        self.inner.step()
        if self.strategy.stage < 3:
            self.strategy.gather_parameters(self.strategy.buckets)

    def zero_grad(self) -> None:
        self.inner.zero_grad()
        self.original.zero_grad()

    def state_dict(self, copy: bool = True) -> dict:
        """This rank's own shards: its masters (host copies) and ``inner``'s state dict."""
        backend = self.strategy.state_backend
        return {"optimizer": self.kind, "rank": self.strategy.rank,
                "world_size": self.strategy.world_size, "stage": self.strategy.stage,
                "masters": [np.array(backend.to_host(b.master.data), copy=True) for b in self.strategy.buckets],
                "inner": self.inner.state_dict(copy=copy)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned on this rank. A complete optimizer state (a checkpoint's)
        raises ``ValueError``: ``trainer.load_checkpoint`` gives each rank its share of it."""
        if not isinstance(state, dict) or state.get("optimizer") != self.kind:
            kind = state.get("optimizer") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"a ShardedOptimizer loads its own shards ({self.kind!r}), got the state of "
                             f"{kind!r}; a checkpoint's complete state loads with trainer.load_checkpoint")
        mine = {"rank": self.strategy.rank, "world_size": self.strategy.world_size, "stage": self.strategy.stage}
        for key in mine:
            if state[key] != mine[key]:
                raise ValueError(f"these shards were saved with {key}={state[key]!r}, this rank has {mine[key]!r}")
        backend = self.strategy.state_backend
        self.inner.load_state_dict(state["inner"])
        for bucket, array in zip(self.strategy.buckets, state["masters"]):
            bucket.master.data[...] = backend.from_host(array)


# %% check=3
_INPUTS = np.random.default_rng(0).standard_normal((24, 4)).astype(np.float32)
_LABELS = np.random.default_rng(1).integers(0, 3, 24)
_DATA = TensorDataset(_INPUTS, _LABELS)


def _tiny_run(strategy, epochs=3, precision="32-true", device="cpu", data=_DATA, scale=None):
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)
    optimizer = tt.optim.AdamW(model.parameters(), lr=0.05)
    trainer = tt.Trainer(model, optimizer, nn.CrossEntropyLoss(), strategy=strategy, precision=precision,
                         grad_clip_norm=0.5)
    if scale is not None:  # 16-mixed from this loss scale
        trainer._amp.scaler.scale = scale
    loader = DistributedDataLoader(data, batch_size=4, comm=SingleProcess(), device=device)
    trainer.fit(loader, epochs=epochs, accumulation_steps=2, progress=False)
    return trainer


# one rank: every stage trains as DataParallel does (clipped, two micro-batches per step)
_reference = _tiny_run(DataParallel(SingleProcess()))
for _stage in STAGES:
    _zero = _tiny_run(ZeRO(stage=_stage, comm=SingleProcess()))
    _full = [_p.grad is not None for _p in _zero.model.parameters()]
    assert all(_full) if _stage == 1 else not any(_full), f"stage {_stage} keeps full gradients: {_full}"
    if _stage == 3:  # between steps the model holds no weights: gather them to compare
        assert all(_p.data.size == 0 for _p in _zero.model.parameters()), \
            f"stage 3 holds no weights between steps, got sizes {[_p.data.size for _p in _zero.model.parameters()]}"
        _zero.strategy.gather_parameters(_zero.strategy.buckets)
    for _a, _b in zip(_reference.model.parameters(), _zero.model.parameters()):
        assert np.allclose(_a.numpy(), _b.numpy(), rtol=1e-5, atol=1e-6), f"stage {_stage}: {_a.numpy()} {_b.numpy()}"
        assert _a.data.flags.f_contiguous == _b.data.flags.f_contiguous, "each weight keeps its memory order"
    assert np.allclose(_reference.history["grad_norm"], _zero.history["grad_norm"], rtol=1e-5), _zero.history


class _Counting(SingleProcess):
    def __init__(self):
        self.calls = {}

    def Allgather(self, send, receive):
        self.calls["Allgather"] = self.calls.get("Allgather", 0) + 1
        receive[...] = send

    def Reduce_scatter_block(self, send, receive, op=None):
        self.calls["Reduce_scatter_block"] = self.calls.get("Reduce_scatter_block", 0) + 1
        receive[...] = send


# one collective per bucket, whatever the number of parameters in it
_zero = _tiny_run(ZeRO(stage=2, comm=_Counting()), epochs=1)
assert _zero.strategy.comm.calls == {"Allgather": 1 + 3, "Reduce_scatter_block": 3}, _zero.strategy.comm.calls


class _OtherRankFlags(SingleProcess):
    """One rank's data, but the all-reduce of the norm and flags adds another rank's ``flags``."""

    def __init__(self, flags):
        self.flags = np.array(flags, np.float64)

    def Allreduce(self, send, receive, op=None):
        receive[...] = send + self.flags


# a loss that is not finite on another rank skips the step here too; so does its float16 overflow
for _flags, _precision in (([0.0, 1.0, 0.0], "32-true"), ([0.0, 0.0, 1.0], "16-mixed")):
    _zero = _tiny_run(ZeRO(stage=2, comm=_OtherRankFlags(_flags)), epochs=1, precision=_precision)
    assert (_zero.step, _zero.skipped_steps) == (0, 3), (_flags, _zero.step, _zero.skipped_steps)
assert _zero._amp.scaler.scale == 2.0**16 / 8, "every overflow halves the loss scale"


class _OnceFlagged(SingleProcess):
    """Another rank's loss is not finite at the first step only; ``slot`` is where the flag goes in the buffer."""

    def __init__(self, slot):
        self.slot, self.calls = slot, 0

    def Allreduce(self, send, receive, op=None):
        receive[...] = send
        self.calls += 1
        receive[self.slot] += self.calls == 1


# after a skipped step the next one starts afresh: its gradients replace the skipped step's
_runs = [_tiny_run(strategy) for strategy in (DataParallel(_OnceFlagged(-1)), ZeRO(3, comm=_OnceFlagged(1)))]
assert [_run.skipped_steps for _run in _runs] == [1, 1], [_run.skipped_steps for _run in _runs]
_runs[1].strategy.gather_parameters(_runs[1].strategy.buckets)
assert all(np.allclose(_a.numpy(), _b.numpy(), rtol=1e-5, atol=1e-6)
           for _a, _b in zip(*[_run.model.parameters() for _run in _runs])), \
    "after a skipped step ZeRO's weights differ from DataParallel's: every rank must skip together"
assert np.allclose(_runs[0].history["train_loss"], _runs[1].history["train_loss"], rtol=1e-5), \
    "a skipped step's loss is not counted (take_step returns False)"


class _FirstFlags(SingleProcess):
    """Keeps the flags of the first all-reduce this rank sends, and adds ``squares`` (another rank's) to it."""

    def __init__(self, squares=0.0):
        self.squares, self.flags = squares, None

    def Allreduce(self, send, receive, op=None):
        receive[...] = send
        if self.flags is None:
            self.flags = send[1:].tolist()
            receive[0] += self.squares


# this rank's own non-finite loss and float16 overflow go into the flags, for the other ranks
_comm = _FirstFlags()
_tiny_run(ZeRO(stage=2, comm=_comm), epochs=1,
          data=TensorDataset(np.where(np.arange(24)[:, None] == 0, np.nan, _INPUTS).astype(np.float32), _LABELS))
assert _comm.flags == [1.0, 0.0], f"flags [loss not finite, overflow] sent with a nan loss: {_comm.flags}"
_comm = _FirstFlags()
_runs = [_tiny_run(strategy, precision="16-mixed", scale=2.0**24)
         for strategy in (DataParallel(SingleProcess()), ZeRO(stage=2, comm=_comm))]
assert _comm.flags == [0.0, 1.0], f"flags sent when the float16 gradients overflow: {_comm.flags}"
assert len({(_run.skipped_steps, _run._amp.scaler.scale) for _run in _runs}) == 1, "skips and backs off as DataParallel"

# a gradient norm that is not finite (here another rank's squares) skips the step
assert _tiny_run(ZeRO(stage=2, comm=_FirstFlags(squares=math.inf)), epochs=1).skipped_steps == 1, \
    "a step whose global gradient norm is not finite is skipped"


def _sgd_step(clip):
    """One SGD step (lr 100) of a bias-free Linear on inputs of about 1e-3, clipped at ``clip``:
    (the weight before, the weight after, the gradient norm)."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3, bias=False))
    before = model[0].weight.numpy().astype(np.float64)
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=100.0), nn.CrossEntropyLoss(),
                         strategy=ZeRO(stage=2, comm=SingleProcess()), grad_clip_norm=clip)
    trainer.fit(DistributedDataLoader(TensorDataset(_INPUTS * 1e-3, _LABELS), batch_size=24, comm=SingleProcess()),
                max_steps=1, progress=False)
    return before, model[0].weight.numpy().astype(np.float64), trainer.history["grad_norm"][-1]


# clipping: a norm equal to the maximum is not above it; above, the gradient is scaled by max / (norm + 1e-6)
_before, _free, _norm = _sgd_step(1e9)
assert np.array_equal(_sgd_step(_norm)[1], _free), "clipped at exactly its own norm: not scaled"
assert np.allclose(_sgd_step(_norm / 2)[1], _before - (_before - _free) * (_norm / 2) / (_norm + 1e-6),
                   rtol=1e-5, atol=0), "clipped at half its norm: scaled by max_norm / (norm + 1e-6)"

# 16-mixed: float16 working copies in the model, float32 masters; the steps and loss scale are DataParallel's
_zero = _tiny_run(ZeRO(stage=1, comm=SingleProcess()), precision="16-mixed")
_mixed = _tiny_run(DataParallel(SingleProcess()), precision="16-mixed")
assert all(_p.dtype == np.float16 for _p in _zero.model.parameters()), \
    f"16-mixed: float16 working copies, got {[_p.dtype for _p in _zero.model.parameters()]}"
assert all(_b.master.dtype == np.float32 for _b in _zero.strategy.buckets), \
    f"16-mixed: float32 masters, got {[_b.master.dtype for _b in _zero.strategy.buckets]}"
assert np.allclose(_zero.history["train_loss"], _mixed.history["train_loss"], rtol=1e-2), _zero.history
assert _zero._amp.scaler.state_dict() == _mixed._amp.scaler.state_dict(), \
    f"the loss scale as DataParallel's: {_zero._amp.scaler.state_dict()} vs {_mixed._amp.scaler.state_dict()}"
# a weight outside the optimizer gets its float32 value back before every step (restore_masters)
tt.manual_seed(0)
_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
_frozen = _model[0].weight.numpy()
_trainer = tt.Trainer(_model, tt.optim.AdamW(_model[2].parameters(), lr=0.05), nn.CrossEntropyLoss(),
                      strategy=ZeRO(stage=2, comm=SingleProcess()), precision="16-mixed")
_trainer.fit(DistributedDataLoader(_DATA, batch_size=8, comm=SingleProcess()), max_steps=2, progress=False)
assert _model[0].weight.dtype == np.float32 and np.array_equal(_model[0].weight.numpy(), _frozen), _model[0].weight

# offloading: the masters and their gradients in host memory, the model on its device (here the strict one)
_zero = _tiny_run(ZeRO(stage=2, offload="cpu", comm=SingleProcess()), device="strict")
_places = {(_b.master.device, _b.master.grad.device) for _b in _zero.strategy.buckets}
assert _places == {("cpu", "cpu")}, f"offload='cpu': masters and their gradients on the host, got {_places}"
assert {_p.device for _p in _zero.model.parameters()} == {"strict:0"}, \
    f"offload='cpu': the model stays on its device, got {({_p.device for _p in _zero.model.parameters()})}"
assert np.allclose(_zero.history["train_loss"], _reference.history["train_loss"], rtol=1e-5), \
    f"offloading changes where, not what: losses {_zero.history['train_loss']} vs {_reference.history['train_loss']}"

# a model that changed after the strategy attached is refused, naming what changed
_zero = _tiny_run(ZeRO(stage=2, comm=SingleProcess()), epochs=0)
_zero.model.append(nn.Linear(3, 3))
try:
    _zero.train_epoch(DistributedDataLoader(_DATA, batch_size=4, comm=SingleProcess()))
    raise AssertionError("a model with a new layer trained on")
except RuntimeError as error:
    assert "3.weight is new" in str(error), error
print("ZeRO OK")


# %% [markdown]
# ## 6. Checkpoints that resume at any number of ranks
#
# A sharded run could save one file per rank — DeepSpeed does, and so does FSDP's
# sharded state dict: fast, but such files fit only a run with the same number of
# ranks and the same buckets. Ours save what Module 10 saves, **one process's
# checkpoint**. `gather_full_state` (given, below) packs each rank's masters and their
# optimizer state into one buffer of bytes — the same layout on every rank — one
# `Gather` brings all of them to rank 0, which joins each array's shards in rank
# order and cuts the parameters out of the joined vector (`unflatten`). The model
# state holds every weight by name, in full precision; the optimizer state is the
# state dict of the optimizer you gave the Trainer, written by `template`: an
# optimizer of its class over stand-ins of the parameters' shapes that take no
# memory. Rank 0 writes the file atomically (Module 10), so a rank killed in the
# middle of a save leaves the previous checkpoint whole.
#
# `scatter_full_state` is the way back: every rank reads the file and keeps its share
# — its masters cut from the weights, its optimizer state cut per bucket, after the
# `template` has checked the state. The file is one process's, so it loads at **any
# number of ranks**, into `DataParallel` or a plain Trainer; a plain or
# `DataParallel` checkpoint loads into ZeRO. Resumed on as many ranks, a run is
# bit-identical to one that was never interrupted (`tests/test_zero.py` checks it
# for every stage, and a checkpoint of 2 ranks resumed on 1 and on 4).
#
# The data loader has its say too. Module 13's `DistributedDataLoader` saves where it
# stands in the epoch; resumed on another number of ranks, the ranks that saved had
# served the first `offset + position * batch_size * P` samples of the epoch's order,
# so the new ranks share out the rest of that epoch, then the next epochs as usual.
# The batch size is per rank: on $P'$ ranks a step takes `batch_size * P'` samples.
#
# Saving is a collective: every rank must call `save_checkpoint` (put the
# `ModelCheckpoint` callback on every rank; only rank 0 writes).

# %% export="sharding"
def gather_full_state(strategy: ZeRO) -> tuple[dict, dict] | None:
    """``(model state, optimizer state)`` of the whole model, as one process's, on the writer; None elsewhere.

    Each rank packs its masters and the arrays of their optimizer state into one buffer of
    bytes (the same layout on every rank), one ``Gather`` brings them all to rank 0, which
    joins each array's shards in rank order and cuts the parameters out of it
    (``bucket.unflatten``). The model state: every parameter and buffer by name (the
    bucketed parameters from the masters, in full precision); the optimizer state:
    ``original``'s state dict, written by ``template``.
    """
    sharded = strategy.optimizer
    states = sharded.inner.state_dict(copy=False)["state"]  # host arrays
    inner = [states[position] for position in sharded.positions]  # one per bucket, in order
    pieces = []  # per bucket: (its keys, its arrays: the master first), the same on every rank
    for bucket, state in zip(strategy.buckets, inner):
        keys = [key for key, value in state.items() if isinstance(value, np.ndarray)]
        pieces.append((keys, [strategy.state_backend.to_host(bucket.master.data)] + [state[key] for key in keys]))
    arrays = [np.ascontiguousarray(array) for _, bucket_arrays in pieces for array in bucket_arrays]
    send = np.concatenate([array.reshape(-1).view(np.uint8) for array in arrays])
    receive = np.empty((strategy.world_size, send.size), np.uint8) if strategy.is_writer else None
    strategy.comm.Gather(send, receive, root=0)
    if not strategy.is_writer:
        return None
    full, start = [], 0
    for array in arrays:  # every rank's shard of this array, joined in rank order
        full.append(np.ascontiguousarray(receive[:, start:start + array.nbytes]).view(array.dtype).reshape(-1))
        start += array.nbytes
    model, original = strategy.trainer.model, sharded.original
    index = {id(param): i for i, param in enumerate(original.params)}
    weights: dict[int, np.ndarray] = {}
    per_param: list[dict] = [{} for _ in original.params]
    vectors = iter(full)
    for bucket, state, (keys, _) in zip(strategy.buckets, inner, pieces):
        for param, weight in zip(bucket.params, bucket.unflatten(next(vectors))):
            weights[id(param)] = weight
        for key in keys:
            for param, value in zip(bucket.params, bucket.unflatten(next(vectors))):
                per_param[index[id(param)]][key] = value
        counts = {key: value for key, value in state.items() if key not in keys}  # Adam's step
        for param in bucket.params:
            per_param[index[id(param)]].update(counts)
    model_state = {name: weights[id(tensor)] if id(tensor) in weights else tensor._backend.to_host(tensor.data)
                   for name, tensor in model.named_parameters() + model.named_buffers()}
    template = sharded.template
    template.state = per_param
    try:
        optimizer_state = _hyperparameters_of(sharded.inner, template.state_dict(copy=False))
    finally:
        template.state = [{} for _ in template.params]
    return model_state, optimizer_state


def _hyperparameters_of(optimizer: Optimizer, state: dict) -> dict:
    """``state``, the state dict of an optimizer with the groups of ``optimizer`` (``inner`` and
    ``template`` have the original's), with ``optimizer``'s learning rate and group hyperparameters."""
    names = (*optimizer.hyperparameters, "lr_scale")
    groups = [{**saved, **{name: _plain(group[name]) for name in names}}
              for saved, group in zip(state["param_groups"], optimizer.param_groups)]
    return {**state, "lr": optimizer.lr, "param_groups": groups}


def scatter_full_state(strategy: ZeRO, model_state: dict, optimizer_state: dict) -> None:
    """Keep this rank's share of the complete states of a checkpoint (saved by any number of ranks, by
    DataParallel or by one process), or put back this rank's own snapshot (``model.state_dict()``,
    ``trainer.optimizer.state_dict()``). Everything is checked before anything changes: missing,
    unexpected or misshapen tensors raise ``RuntimeError`` naming them, an optimizer state that does
    not fit raises ``ValueError`` (the optimizer's own checks); so does a bucket whose parameters
    have optimizer states that cannot make one shard (some updated, some not; unequal step counts)."""
    sharded, model = strategy.optimizer, strategy.trainer.model
    tensors = dict(model.named_parameters() + model.named_buffers())
    if isinstance(optimizer_state, dict) and optimizer_state.get("optimizer") == sharded.kind:
        sharded.load_state_dict(optimizer_state)  # this rank's own snapshot: its shards and its model as they were
        for name, tensor in tensors.items():  # the snapshot's tensors (placeholders too, at stage 3)
            tensor.data = model_state[name].data.copy()
        return
    problems = [f"missing {name}" for name in tensors if name not in model_state]
    problems += [f"unexpected {name}" for name in model_state if name not in tensors]
    problems += [f"{name} has shape {tuple(np.shape(model_state[name]))}, the model {shape}"
                 for name, shape in strategy.shapes.items() if name in model_state
                 and tuple(np.shape(model_state[name])) != shape]
    if problems:
        raise RuntimeError(f"cannot load the model state into {type(model).__name__}: {'; '.join(problems)}")
    template = sharded.template
    template.load_state_dict(optimizer_state, copy=False)  # checks it all; raises ValueError
    try:
        index = {id(param): i for i, param in enumerate(sharded.original.params)}
        masters, states = [], []
        for bucket in strategy.buckets:
            shard = slice(bucket.start, bucket.start + bucket.shard_size)
            names = [strategy.names[id(param)] for param in bucket.params]
            masters.append(bucket.flatten([np.asarray(model_state[name]) for name in names])[shard])
            saved = [template.state[index[id(param)]] for param in bucket.params]
            states.append(_bucket_state(bucket, names, saved, shard))
        inner = _hyperparameters_of(template, sharded.inner.state_dict(copy=False))
        for position, state in zip(sharded.positions, states):
            inner["state"][position] = state
        sharded.inner.load_state_dict(inner, copy=False)
    finally:
        template.state = [{} for _ in template.params]
    for bucket, shard in zip(strategy.buckets, masters):
        bucket.master.data[...] = strategy.state_backend.from_host(shard)
    bucketed = {id(param) for bucket in strategy.buckets for param in bucket.params}
    for name, tensor in tensors.items():
        if id(tensor) not in bucketed:
            tensor.data[...] = tensor._backend.from_host(np.asarray(model_state[name], dtype=tensor.dtype))
    if strategy.stage == 3:
        strategy.release_parameters(strategy.buckets)
        return
    for bucket in strategy.buckets:  # every rank has the whole state: the working copies need no gather
        dtype = strategy.compute_dtype or bucket.dtype
        for param in bucket.params:
            value = np.asarray(model_state[strategy.names[id(param)]])
            param.data = strategy.backend.from_host(np.array(value, dtype=dtype, order=strategy.orders[id(param)]))


def _bucket_state(bucket: Bucket, names: list[str], saved: list[dict], shard: slice) -> dict:
    """This rank's shard of the optimizer state of ``bucket``'s parameters (``saved``, one state each)."""
    if not any(saved):
        return {}
    if not all(saved):
        empty = [name for name, state in zip(names, saved) if not state]
        raise ValueError(f"the optimizer state holds nothing for {', '.join(empty)} but state for the other "
                         f"parameters it shares a ZeRO bucket with; they are updated together")
    state = {}
    for key, value in saved[0].items():
        if isinstance(value, np.ndarray):
            state[key] = bucket.flatten([s[key] for s in saved])[shard]
        else:
            values = {name: s[key] for name, s in zip(names, saved)}
            if len(set(values.values())) > 1:
                raise ValueError(f"the optimizer state's {key!r} differs between parameters that share a ZeRO "
                                 f"bucket: {values}")
            state[key] = value
    return state


# %% [markdown]
# One rank is enough to see the format: a ZeRO-3 run's checkpoint loads into a plain
# Trainer, which holds the same weights.

# %%
folder = Path(tempfile.mkdtemp())
sharded = _tiny_run(ZeRO(stage=3, comm=SingleProcess()))
sharded.save_checkpoint(folder / "zero3.ckpt")
tt.manual_seed(1)
plain_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
plain = tt.Trainer(plain_model, tt.optim.AdamW(plain_model.parameters(), lr=0.05), nn.CrossEntropyLoss())
plain.load_checkpoint(folder / "zero3.ckpt")
model_state, optimizer_state = sharded.strategy.gather_state()
assert all(np.array_equal(model_state[name], p.numpy()) for name, p in plain_model.named_parameters()), \
    "the plain model loaded from the ZeRO-3 checkpoint holds the gathered weights"
print("weights:", {name: p.shape for name, p in plain_model.named_parameters()})
print("optimizer state of parameter 0:", {key: getattr(value, "shape", value)
                                          for key, value in optimizer_state["state"][0].items()})

# %% [markdown]
# ## 7. Measure it
#
# Now the real thing: $P = 1, 2$ and $4$ MPI ranks (they run on a laptop's cores
# too). The cell below writes a script and launches it with `mpirun` for each $P$;
# every rank trains a small GPT for a few steps with each strategy, and rank 0
# reports what it holds (`memory_per_rank`) and what it sent per step, counted by a
# `CommCounter` around the communicator with the ring algorithms' bytes. The script
# runs the *installed* package, not the functions defined in this notebook: until
# you save the notebook and run `tinytrain export 18` in a terminal, it measures the
# reference `tinytrain/sharding.py`, whatever you wrote above. Export first to
# measure your own code (`tinytrain reset 18` puts the reference back).
#
# Without `mpi4py` and `mpirun` (`pip install mpi4py mpich`) the cell says so and the
# rest of the section skips.

# %%
MEASURE = r"""
import json
import sys

import numpy as np

import tinytrain as tt
from tinytrain.data import TokenWindows
from tinytrain.distributed import DistributedDataLoader, strategy_from_name, world
from tinytrain.sharding import CommCounter, memory_per_rank

config = tt.nn.GPTConfig(vocab_size=32, block_size=16, n_layer=4, n_head=4, n_embd=64)
tokens = np.random.default_rng(0).integers(0, 32, 4000)


def loss(logits, targets):
    return tt.nn.functional.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))


rows = []
for name in ("ddp", "zero1", "zero2", "zero3"):
    counter = CommCounter(world())
    tt.manual_seed(0)
    model = tt.nn.GPT(config)
    trainer = tt.Trainer(model, tt.optim.AdamW(model.parameters(), lr=1e-3), loss, grad_clip_norm=1.0,
                         strategy=strategy_from_name(name, counter))
    loader = DistributedDataLoader(TokenWindows(tokens, 16), batch_size=8, shuffle=True, seed=0, comm=counter)
    trainer.fit(loader, max_steps=1, progress=False)
    counter.reset()  # count two steps, not the setup
    trainer.fit(loader, max_steps=3, progress=False)
    rows.append({"strategy": name, **memory_per_rank(trainer), "sent": sum(counter.bytes.values()) / 2,
                 "calls": sum(counter.calls.values()) / 2, "loss": trainer.history["train_loss"][-1]})
if counter.Get_rank() == 0:
    with open(sys.argv[1], "w") as file:
        json.dump({"parameters": tt.nn.gpt_num_parameters(config), "rows": rows}, file)
"""


def find_mpirun():
    beside_python = Path(sys.executable).parent / "mpirun"  # pip's mpich wheel puts it there
    return shutil.which("mpirun") or shutil.which("mpiexec") or (str(beside_python) if beside_python.exists() else None)


runs = {}
mpirun = find_mpirun()
if importlib.util.find_spec("mpi4py") is None or mpirun is None:
    print("skipping the measurements under mpirun: they need mpi4py and mpirun (pip install mpi4py mpich)")
else:
    script = folder / "measure.py"
    script.write_text(MEASURE)
    for world_size in (1, 2, 4):
        report = folder / f"ranks-{world_size}.json"
        result = subprocess.run([mpirun, "-n", str(world_size), sys.executable, str(script), str(report)],
                                capture_output=True, text=True, timeout=600,
                                env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        if result.returncode != 0:
            raise RuntimeError(f"mpirun -n {world_size} failed:\n{result.stderr[-3000:]}")
        runs[world_size] = json.loads(report.read_text())
    print(f"{'P':>2} {'strategy':<9} {'weights':>8} {'gradients':>9} {'optimizer':>9} {'total':>8} {'predicted':>9} "
          f"{'sent/step':>9} {'calls':>5} {'loss':>7}   (KiB per rank)")
    for world_size, run in runs.items():
        for stage, row in enumerate(run["rows"]):
            predicted = zero_memory(run["parameters"], world_size, stage)["total"]
            sizes = [row[key] / 2**10 for key in ("parameters", "gradients", "optimizer_state", "total")]
            print(f"{world_size:>2} {row['strategy']:<9} {sizes[0]:>8.0f} {sizes[1]:>9.0f} {sizes[2]:>9.0f} "
                  f"{sizes[3]:>8.0f} {predicted / 2**10:>9.0f} {row['sent'] / 2**10:>9.0f} {row['calls']:>5.0f} "
                  f"{row['loss']:>7.4f}")

# %% export="sharding"
def memory_per_rank(trainer: Any) -> dict[str, int]:
    """Bytes this rank holds now, as :func:`~tinytrain.training.memory_report` counts them, for any
    strategy: under ZeRO the gradients include the shards (the masters' ``.grad``) and the
    optimizer state is this rank's shards, masters included."""
    report = memory_report(trainer.model, trainer.optimizer)
    strategy = trainer.strategy
    if isinstance(strategy, ZeRO):
        shards = sum(b.master.grad.data.nbytes for b in strategy.buckets if b.master.grad is not None)
        report["gradients"] += shards
        report["total"] += shards
        report["ratio"] = report["total"] / max(report["parameters"], 1)
    return report


class CommCounter:
    """A communicator that passes every call on to ``comm`` and counts, per collective, the calls and
    the bytes this rank sends, as a bandwidth-optimal (ring) algorithm sends them: an all-reduce of
    ``n`` bytes ``2 (P - 1) / P * n``, a reduce-scatter of ``n`` bytes ``(P - 1) / P * n``, an
    all-gather of ``s`` bytes from each rank ``(P - 1) * s``. Other calls pass on uncounted."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    def _count(self, name: str, sent: float) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.bytes[name] = self.bytes.get(name, 0.0) + sent

    def Allreduce(self, send: Any, receive: Any, *op: Any) -> None:
        size = self.comm.Get_size()
        self._count("Allreduce", 2 * (size - 1) / size * send.nbytes)
        self.comm.Allreduce(send, receive, *op)

    def Reduce_scatter_block(self, send: Any, receive: Any, *op: Any) -> None:
        size = self.comm.Get_size()
        self._count("Reduce_scatter_block", (size - 1) / size * send.nbytes)
        self.comm.Reduce_scatter_block(send, receive, *op)

    def Allgather(self, send: Any, receive: Any) -> None:
        self._count("Allgather", (self.comm.Get_size() - 1) * send.nbytes)
        self.comm.Allgather(send, receive)

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()


# %% [markdown]
# Read the table down one $P$: weights, gradients and optimizer state fall stage by
# stage as `zero_memory` predicts (the measured total is the prediction plus a few
# numbers of padding per bucket), and the losses of all four strategies agree —
# they take the same steps. Read it down one strategy: data parallelism's bytes per
# rank never fall, stage 3's fall as $1/P$. The bytes sent: stages 1 and 2 send what
# data parallelism sends; stage 3 half as much again, in many more calls (two
# gathers per layer per step, and a reduce-scatter). With $P = 1$ nothing travels.
#
# The plot shows the bytes per rank of each strategy as $P$ grows.

# %%
if runs:
    import matplotlib.pyplot as plt

    fig, (memory_ax, traffic_ax) = plt.subplots(1, 2, figsize=(11, 3.6))
    sizes = sorted(runs)
    for stage, name in enumerate(("DataParallel", "ZeRO-1", "ZeRO-2", "ZeRO-3")):
        memory_ax.plot(sizes, [runs[p]["rows"][stage]["total"] / 2**20 for p in sizes], marker="o", label=name)
        traffic_ax.plot(sizes, [runs[p]["rows"][stage]["sent"] / 2**20 for p in sizes], marker="o", label=name)
    memory_ax.set(title="bytes per rank (MiB)", xlabel="ranks P", xticks=sizes)
    traffic_ax.set(title="bytes sent per rank per step (MiB)", xlabel="ranks P", xticks=sizes)
    memory_ax.legend()
    fig.tight_layout()

# %% [markdown]
# Offloading, measured on the strict device (a stand-in for a GPU whose arrays refuse
# to leave it unasked, `tinytrain/testing/strict.py`): the same ZeRO-2 run without and
# with `offload="cpu"`, and the bytes that live on the device.

# %%
def device_bytes(trainer):
    """Bytes of the arrays on the device: the model's weights and gradients, the masters, their state."""
    strict = tt.get_backend("strict")
    arrays = [p.data for p in trainer.model.parameters()]
    arrays += [b.master.data for b in trainer.strategy.buckets] + [b.master.grad.data for b in trainer.strategy.buckets]
    arrays += [value for state in trainer.optimizer.inner.state for value in state.values()]
    return sum(array.nbytes for array in arrays if strict.is_array(array))


for offload in (None, "cpu"):
    tt.manual_seed(0)
    model = tt.nn.GPT(tt.nn.GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)).to("strict")
    trainer = tt.Trainer(model, tt.optim.AdamW(model.parameters()),
                         lambda logits, targets: tt.nn.functional.cross_entropy(logits.reshape(-1, 32),
                                                                                targets.reshape(-1)),
                         strategy=ZeRO(2, offload=offload, comm=SingleProcess()))
    tokens = tt.data.TokenWindows(np.random.default_rng(0).integers(0, 32, 200), 16)
    trainer.fit(tt.data.DataLoader(tokens, batch_size=4, device="strict"), max_steps=2, progress=False)
    print(f"offload={offload!s:<5} device bytes {device_bytes(trainer) / 2**10:6.0f} KiB, "
          f"loss {trainer.history['train_loss'][-1]:.4f}")

# %% [markdown]
# Without offloading the device holds the weights ($4\Psi$) and, at $P = 1$, the
# masters, their gradients and Adam's two moments ($16\Psi$); with it only the
# weights: a fifth, for the same loss. The price is the update's speed — a CPU's
# memory bandwidth instead of a GPU's — and the traffic over PCIe; ZeRO-Offload hides
# much of it behind the next step's forward and backward.
#
# ## 8. How PyTorch and DeepSpeed do it
#
# * **PyTorch FSDP**: `FullyShardedDataParallel(model, sharding_strategy=...)` with
#   `NO_SHARD` (DDP), `SHARD_GRAD_OP` (stage 2) and `FULL_SHARD` (stage 3); the newer
#   `fully_shard(module)` (FSDP2) shards each parameter along its first dimension
#   instead of flat buckets. Its `auto_wrap_policy` picks the units to gather one at a
#   time — our `sharded_layers`, usually each transformer block. It prefetches the
#   next layer's gather while the current one computes, and reduce-scatters each
#   unit's gradients during backward (our stage 3 does both in turn, without the
#   overlap). `CPUOffload(offload_params=True)` offloads; `StateDictType.FULL_STATE_DICT`
#   is our consolidated checkpoint, and `torch.distributed.checkpoint` saves shards
#   that it *reshards* on load, for any number of ranks, without gathering to one.
#   Stage 1 alone is `torch.distributed.optim.ZeroRedundancyOptimizer`.
# * **DeepSpeed**: `"zero_optimization": {"stage": 2, "offload_optimizer": {"device":
#   "cpu"}}` in its config; stage 2 reduces gradient buckets during backward as they
#   fill (`reduce_bucket_size`), overlapping communication with computation, where
#   ours waits for the step. Checkpoints are per rank; `zero_to_fp32.py`
#   consolidates them into one file, as `gather_state` does. ZeRO-Infinity offloads to
#   NVMe too; ZeRO++ quantizes the gathers to int8.
# * **Lightning**: `Trainer(strategy="deepspeed_stage_2")`, `"deepspeed_stage_3_offload"`,
#   `"fsdp"` — the names our `strategy_from_name` follows (`"zero2"`, `"zero3_offload"`).
#
# ## Summary
#
# * Data parallelism keeps $(8 + 4k)\Psi$ bytes on every rank; ZeRO keeps a $1/P$
#   shard of the optimizer state (stage 1), of the gradients (stage 2) and of the
#   weights (stage 3), and offloading moves the optimizer to host memory.
# * Parameters travel in flat, padded buckets cut into equal shards; elementwise
#   optimizers step a shard exactly as they would step the parameters.
# * An all-reduce is a reduce-scatter and an all-gather: stages 1 and 2 cost data
#   parallelism's $2\Psi$ per step, stage 3 $3\Psi$, gathering each layer for its
#   forward and its recomputed backward.
# * The gradient norm and the skip decisions are reduced over the ranks in one call,
#   so every rank clips alike and skips together.
# * A checkpoint gathers the shards into one process's file, which resumes on any
#   number of ranks, with any strategy.
