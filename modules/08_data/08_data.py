# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 08 — Data: datasets, batches and shuffling
#
# *One sitting, about 1.5 hours: the lesson, 9 functions to write, and the measurements.*
#
# A training loop never sees "the data set". It sees a stream of small
# **batches**, a few dozen samples each, in an order that changes every epoch.
# The object that turns a data set into that stream is the **data loader**, and
# small decisions inside it — how the order is drawn, what happens to the last,
# short batch, how a batch is gathered — decide whether training converges,
# whether a run can be reproduced, and whether the GPU waits for data.
#
# **You will**
# 1. write `TensorDataset`, a data set made of arrays that share their first
#    dimension;
# 2. cut an epoch into batches and stack samples into a batch (`batch_indices`,
#    `collate`);
# 3. write the `DataLoader`'s length, shuffling and batch gathering, with a
#    random generator of its own so that every epoch's order is reproducible;
# 4. see what shuffling does to training on sorted data;
# 5. save a loader's position mid-epoch and resume with exactly the same batches;
# 6. cut a stream of tokens into the (inputs, targets) windows a language model
#    trains on;
# 7. measure the loader's throughput: one gather per batch against a Python loop
#    over samples.

# %%
import pickle
import time

import numpy as np

import tinytrain as tt
from tinytrain import Tensor
from tinytrain.datasets import Digits

# %% [markdown]
# ## 1. A dataset is `len` plus indexing
#
# For this course a **dataset** is any object with two methods:
#
# * `len(dataset)` — how many samples there are;
# * `dataset[i]` — sample `i`, usually a tuple such as `(image, label)`.
#
# That is all a loader needs: it picks indices, asks the dataset for them and
# stacks the answers. Where the samples come from — arrays in memory, files on
# disk, a generator computing them on the fly — is the dataset's business.
# (PyTorch calls this a *map-style* dataset.)
#
# The most common dataset is a handful of arrays with one row per sample:
# features `X` of shape `(N, ...)` and labels `y` of shape `(N,)`. Sample `i` is
# `(X[i], y[i])`. Because NumPy indexes with whole integer arrays as well as
# with single integers, the *same* `__getitem__` returns a batch when given an
# index array: `(X[[3, 1, 4]], y[[3, 1, 4]])` — one *fancy index* per array,
# no Python loop. That is the fast path of our loader.
#
# `TensorDataset(*arrays)` accepts NumPy arrays or tensors (tensors are copied
# to host memory: the loader moves each batch to its device). Arrays whose first
# dimensions differ cannot be rows of the same samples, so that is an error that
# names the lengths.

# %% export="data"
"""Datasets and the DataLoader: samples in, shuffled batches of tensors out.

:class:`TokenWindows` makes a language model's samples, windows of a stream of
token ids with the next tokens as targets, from which a DataLoader draws batches.

A :class:`Dataset` is anything with ``len(ds)`` and ``ds[i]``. A
:class:`DataLoader` cuts each epoch's sample order into batches, gathers every
batch (in one call when the dataset has ``__getitems__``, as
:class:`TensorDataset` does: one fancy index per array) and hands it out as
tensors on a device. Its shuffling generator, epoch counter and position within
the epoch travel in ``state_dict()``, so a resumed run sees exactly the batches
an uninterrupted one would. With ``num_workers=N`` the batches are gathered by N
worker processes (``tinytrain.runtime.workers``), the same batches in the same
order. ``tinytrain.data.transforms`` holds the augmentations a loader seeds.
"""
import copy
import importlib
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tinytrain.arguments import check_int, check_methods
from tinytrain.backend import get_backend
from tinytrain.runtime.workers import WorkerPool
from tinytrain.tensor import Tensor, default_dtype


def __getattr__(name: str) -> Any:
    # tt.data.transforms is hand-written (tinytrain/datasets/transforms.py) and loads on first use:
    # tinytrain.datasets imports this module, so importing it here, at the top, would be a circle.
    if name == "transforms":
        return importlib.import_module("tinytrain.datasets.transforms")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Dataset:
    """A collection of samples: ``len(dataset)`` and ``dataset[i]``.

    Subclasses implement both. A subclass that can gather many samples at once
    may also define ``__getitems__(indices)`` returning the finished batch (a
    tuple of arrays); the :class:`DataLoader` then uses it instead of a Python
    loop over samples. The arrays must be new (a fancy index makes new arrays):
    the loader hands them out inside tensors without copying them again.
    """

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")


def _host_array(data: Any) -> np.ndarray:
    """``data`` as a NumPy array in host memory (a tensor is copied off its device)."""
    if isinstance(data, Tensor):
        return data.numpy()
    return np.asarray(data)


class TensorDataset(Dataset):
    """Samples that are rows of arrays: ``dataset[i] == (a[i], b[i], ...)``.

    ``arrays`` are NumPy arrays, tensors (copied to host memory) or anything
    ``numpy.asarray`` accepts, all with the same first dimension ``N`` (the
    number of samples); NumPy arrays are used as they are, not copied. Indexing
    with an int gives one sample, with an integer index array (or a slice) a
    whole batch — always a tuple with one entry per array.

    Raises ``ValueError``, with a message that says what is wrong, when there is
    no array, when an array has no first dimension (naming its position in
    ``arrays``, counted from 0), or when the first dimensions differ (naming the lengths).
    Keeps the arrays, in host memory, as the tuple ``self.arrays`` (what the given
    ``__len__`` and ``__repr__`` read).
    """

    def __init__(self, *arrays: Any) -> None:
        ### BEGIN SOLUTION
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        arrays = tuple(_host_array(a) for a in arrays)
        for position, array in enumerate(arrays):
            if array.ndim == 0:
                raise ValueError(f"TensorDataset: array {position} is 0-d; every array needs a sample dimension")
        lengths = [len(a) for a in arrays]
        if len(set(lengths)) > 1:
            raise ValueError(
                "TensorDataset needs arrays with the same first dimension (one row per sample), "
                f"got lengths {', '.join(map(str, lengths))}"
            )
        self.arrays = arrays
        ### END SOLUTION

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: Any) -> tuple:
        """Row(s) ``index`` of every array: an int, an integer index array or a slice.

        The index array may also be an integer ``Tensor``, on any device: its
        values (``index.numpy()``) index the host arrays.
        """
        ### BEGIN SOLUTION
        if isinstance(index, Tensor):
            index = index.numpy()
        return tuple(array[index] for array in self.arrays)
        ### END SOLUTION

    def __getitems__(self, indices: np.ndarray) -> tuple:
        """A whole batch in one call, the DataLoader's fast path: ``self[indices]``."""
        return self[indices]

    def __repr__(self) -> str:
        fields = ", ".join(f"{a.dtype}{tuple(a.shape[1:])}" for a in self.arrays)
        return f"{type(self).__name__}({len(self)} samples of {fields})"


# %% check=2
X = np.arange(12.0).reshape(6, 2)
y = np.array([0, 1, 0, 1, 2, 2])
ds = TensorDataset(X, y)
assert len(ds) == 6
x3, y3 = ds[3]
assert np.array_equal(x3, [6.0, 7.0]) and y3 == 1
xb, yb = ds[np.array([5, 0])]
assert np.array_equal(xb, [[10.0, 11.0], [0.0, 1.0]]) and np.array_equal(yb, [2, 0])
assert len(TensorDataset(tt.tensor([[1.0], [2.0]]))) == 2, "tensors are accepted too"
try:
    TensorDataset(X, y[:4])
except ValueError as error:
    assert "6" in str(error) and "4" in str(error), error
else:
    raise AssertionError("arrays of different lengths must raise ValueError")
print("TensorDataset OK")

# %% [markdown]
# ## 2. Epochs and batches
#
# One **epoch** is one pass over the data set. The loader takes the epoch's
# sample order — `0, 1, …, N-1`, or a shuffled version of it — and cuts it into
# consecutive pieces of `B = batch_size` indices. With `N = 10` and `B = 4`:
#
# ```
# order   [0 1 2 3 | 4 5 6 7 | 8 9]
# batches  [0 1 2 3]  [4 5 6 7]  [8 9]      ← 3 batches, the last one short
# ```
#
# So an epoch has $\lceil N / B \rceil$ batches, and the last one holds
# $N - B\,(\lceil N/B \rceil - 1)$ samples. A short batch is harmless for a loss
# averaged over the batch, but it can hurt elsewhere: BatchNorm's statistics over
# two samples are noise, and a compiled kernel may be tuned to one batch shape.
# `drop_last=True` drops it, giving $\lfloor N / B \rfloor$ batches — the samples
# left out are different ones each epoch when shuffling.
#
# `batch_indices` does the cutting. Slices of a NumPy array are views, so this
# costs nothing per sample.

# %% export="data"
def batch_indices(order: np.ndarray, batch_size: int, drop_last: bool = False) -> list:
    """Cut an epoch's sample order into consecutive batches of ``batch_size`` indices.

    Returns a list of index arrays (views of ``order``). The last batch is
    shorter when ``batch_size`` does not divide ``len(order)``; with
    ``drop_last=True`` it is left out, so every batch has ``batch_size`` indices.
    """
    ### BEGIN SOLUTION
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    return [order[start : start + batch_size] for start in range(0, stop, batch_size)]
    ### END SOLUTION


# %% check=1
batches = batch_indices(np.arange(10), 4)
assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
batches = batch_indices(np.arange(10), 4, drop_last=True)
assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
assert len(batch_indices(np.arange(8), 4, drop_last=True)) == 2
assert batch_indices(np.arange(3), 4, drop_last=True) == []
print("batch_indices OK")

# %% [markdown]
# ### Collating samples
#
# A dataset that only knows `dataset[i]` gives one sample at a time, so the
# loader has to ask `B` times and **collate** the answers: for samples that are
# tuples `(x, y)`, stack all the `x`s into one array and all the `y`s into
# another. `np.stack` adds the new batch dimension in front:
# `B` arrays of shape `(1, 8, 8)` become one array of shape `(B, 1, 8, 8)`;
# `B` integer labels become an array of shape `(B,)`. A field that is a tensor
# goes to host memory first, through the given `_host_array`: `np.stack` of
# tensors would make an array of Python objects (each a 0-d tensor), not a batch.

# %% export="data"
def _shapes(sample: Any) -> Any:
    """A tuple (or list) sample's field shapes, as a list; any other sample's shape."""
    if isinstance(sample, (tuple, list)):
        return [np.shape(field) for field in sample]
    return np.shape(sample)


def _check_alike(samples: Sequence[Any]) -> None:
    """Raise ``ValueError`` naming the first sample whose fields or shapes differ from sample 0's, and both."""
    if len(samples) == 0:
        raise ValueError(f"collate needs at least one sample, got samples={samples!r}")
    first = _shapes(samples[0])
    for index, sample in enumerate(samples):
        shapes = _shapes(sample)
        if shapes != first:
            got, expected = (f"fields of shapes {tuple(s)}" if isinstance(s, list) else f"shape {s}"
                             for s in (shapes, first))
            raise ValueError(f"collate: sample {index} of the batch has {got}, sample 0 has {expected}; "
                             "the samples of one batch must have the same shapes")


def collate(samples: Sequence[Any]) -> Any:
    """Stack a list of samples into one batch of NumPy arrays.

    Samples that are tuples (or lists) of fields give a tuple with one stacked
    array per field: ``[(x0, y0), (x1, y1)] -> (stack([x0, x1]), stack([y0, y1]))``.
    Any other sample (an array, a number, a tensor) gives one stacked array.
    Every field goes through ``_host_array`` before stacking, so tensors give
    numbers in host memory (``np.stack`` of tensors gives an array of objects).
    A list of one sample gives a batch of one (the last batch of an epoch may be one).
    The given first line checks that all samples are alike (the same fields, of the
    same shapes) and raises ``ValueError`` naming the first that is not.
    """
    _check_alike(samples)
    ### BEGIN SOLUTION
    first = samples[0]
    if isinstance(first, (tuple, list)):
        return tuple(np.stack([_host_array(sample[k]) for sample in samples]) for k in range(len(first)))
    return np.stack([_host_array(sample) for sample in samples])
    ### END SOLUTION


# %% check=1
xs, ys = collate([(np.zeros((1, 2)), 3), (np.ones((1, 2)), 5)])
assert xs.shape == (2, 1, 2) and np.array_equal(ys, [3, 5])
assert collate([np.arange(3), np.arange(3)]).shape == (2, 3)
assert collate([tt.tensor([1.0]), tt.tensor([2.0])]).dtype == np.float32, "tensors go through _host_array"
print("collate OK")

# %% [markdown]
# ## 3. The `DataLoader`
#
# ### Why shuffle?
#
# Stochastic gradient descent treats each batch's gradient as a noisy but
# *unbiased* estimate of the gradient over the whole data set. That is only true
# if a batch is a fair sample of the data. Data sets are rarely stored in a fair
# order: files are grouped by class, by date, by the person who labelled them.
# In a sorted data set a batch holds one class only, its gradient says "predict
# this class, always", and the model chases the class of the moment instead of
# learning all of them (section 4 shows it). Drawing a **new random order every
# epoch** also keeps the model from fitting to one fixed sequence of updates;
# reshuffling each epoch is the standard recommendation (Bottou, *Stochastic
# Gradient Descent Tricks*, 2012).
#
# ### Whose random numbers?
#
# The order must be *reproducible*: the same seed gives the same epochs, so a
# run can be repeated and a bug can be chased. So each loader owns its **own**
# generator, `np.random.Generator(np.random.PCG64(seed))`, and nothing else draws
# from it: adding dropout to the model, or a second loader, does not change
# this loader's order. Epoch `e + 1` differs from epoch `e` because the generator
# has moved on, not because it was re-seeded. With `seed=None` the loader draws
# its seed from tinytrain's CPU generator, so `tt.manual_seed(0)` at the top of
# a script still makes everything reproducible.
#
# ### What an epoch is, exactly
#
# * Each `iter(loader)` — each `for batch in loader:` — starts a **new epoch**:
#   it draws a new order and serves its batches. An epoch left early (a `break`,
#   or `next(iter(loader))` to peek at one batch) counts as finished. The epoch
#   starts at the first batch asked for, not at `iter()` itself: progress bars
#   such as `tqdm` call `iter()` more than once, and an iterator that was never
#   used must not use up an epoch's order.
# * The exception is resuming: after `load_state_dict(state)` with a state taken
#   in the middle of an epoch, the next `iter` finishes *that* epoch — same
#   order, only the batches not yet served.
# * `loader.epoch` is the number of the epoch in progress, or of the next one;
#   it goes up when the last batch of an epoch is handed out.
#
# ### Gathering a batch, and where it goes
#
# If the dataset has `__getitems__(indices)` (TensorDataset does) the loader
# asks for the whole batch at once: one fancy index per array. Otherwise it asks
# sample by sample and collates. Either way each field becomes a `Tensor` on the
# loader's `device`, with the usual dtype rules — float64 features become
# float32, integer labels int64. Use the given `self._tensor(array)` for that:
# the batch was just gathered into new arrays, so when no conversion is needed
# it wraps them as they are, where `Tensor(array)` would copy every batch again.
#
# You write three methods: `__len__` (the number of batches), `_epoch_order`
# (this epoch's order) and `_fetch` (one batch as tensors). The bookkeeping for
# epochs and resuming is given; read it.

# %% export="data"
class DataLoader:
    """Batches of a dataset as tensors on ``device``, one epoch per ``iter(loader)``.

    ``batch_size`` samples per batch (the last one shorter unless
    ``drop_last``); ``len(loader)`` is the number of batches per epoch. With
    ``shuffle=True`` every epoch is a new permutation drawn from the loader's own
    ``numpy.random.Generator(PCG64(seed))``: the same ``seed`` gives the same
    sequence of epochs, and ``seed=None`` draws the seed from tinytrain's CPU
    generator (so ``tt.manual_seed`` fixes it). A loader that neither shuffles,
    nor has workers, nor a dataset to seed (see below) draws no seed. Batches
    are tuples of tensors when samples are tuples (one tensor per field), else
    single tensors.

    Workers: ``num_workers=N > 0`` gathers the batches in N processes (its own
    ``_fetch`` on the host, in each), which hand back exactly the batches of
    ``num_workers=0``, in the same order; worker ``w`` seeds Python's, NumPy's
    and tinytrain's generators from ``(seed, epoch, w)`` and then calls
    ``worker_init_fn(w)``. The workers of an epoch stop when it ends, or live as
    long as the loader with ``persistent_workers=True``. An error in a worker is
    raised here, with the same type, naming the sample index. A dataset with a
    ``set_epoch(epoch, seed)`` method (``tt.data.transforms.Transformed``) is
    told the epoch and the loader's seed before each epoch, in every process,
    so random augmentations are the same whatever the number of workers.

    Epochs: each ``iter(loader)`` starts a new epoch (an epoch left early counts
    as done), except that the first ``iter`` after ``load_state_dict`` of a
    state taken mid-epoch serves the rest of that epoch. A newer ``iter`` (or a
    ``load_state_dict``) makes older iterators raise ``RuntimeError``.
    ``state_dict()`` holds plain data only (numbers, strings, dicts).

    Raises ``TypeError`` for a ``dataset`` without ``len()`` and indexing, a
    ``batch_size``, ``seed`` or ``num_workers`` that is not a whole number or a
    ``worker_init_fn`` that is not callable, and ``ValueError`` for a
    ``batch_size`` below 1, a negative ``seed`` or ``num_workers``, or
    ``persistent_workers`` without workers: here, not at the first batch.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int | None = None,
        device: Any = None,
        num_workers: int = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        persistent_workers: bool = False,
    ) -> None:
        self.dataset = check_methods("dataset", dataset, ("__len__", "__getitem__"),
                                     "a dataset, with len() and [i], such as TensorDataset(X, y)")
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        if seed is not None:
            seed = check_int("seed", seed, minimum=0)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self._backend = get_backend(device)  # an unknown device fails here, not at the first batch
        self.num_workers = check_int("num_workers", num_workers, minimum=0)
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"worker_init_fn must be a function of the worker's number, got {worker_init_fn!r}")
        if persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers=True needs worker processes, got num_workers=0")
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = bool(persistent_workers)
        self._pool: WorkerPool | None = None  # the worker processes, while they run
        self._stop_workers: Any = None  # weakref.finalize that closes self._pool: once, at the latest with the loader
        needs_seed = self.shuffle or self.num_workers > 0 or hasattr(dataset, "set_epoch")
        if needs_seed and seed is None:
            seed = int(get_backend("cpu").rng.integers(2**63 - 1))
        self.seed = seed
        self.generator = np.random.Generator(np.random.PCG64(seed)) if self.shuffle else None
        self.epoch = 0  # the epoch in progress, or the next one
        self._position = 0  # batches of that epoch already served
        self._start_state = self._generator_state()  # generator state that epoch's order is drawn from
        self._resuming = False  # the next iter() continues at _position (set by load_state_dict)
        self._live: object | None = None  # token of the newest iterator

    @property
    def device(self) -> str:
        return self._backend.device

    def __len__(self) -> int:
        """The number of batches in one epoch."""
        ### BEGIN SOLUTION
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        ### END SOLUTION

    def _epoch_order(self) -> np.ndarray:
        """This epoch's order of sample indices (int64).

        With ``shuffle``, a fresh permutation of ``range(len(dataset))`` drawn
        from ``self.generator`` (which advances, so the next epoch differs);
        otherwise ``0, 1, ..., N-1``.
        """
        ### BEGIN SOLUTION
        n = len(self.dataset)
        if self.shuffle:
            return self.generator.permutation(n)
        return np.arange(n)
        ### END SOLUTION

    def _fetch(self, indices: np.ndarray) -> Any:
        """The samples ``indices`` as one batch of tensors on the loader's device.

        Fast path: a dataset with ``__getitems__`` returns the whole batch (a
        tuple of arrays) in one call. Any other dataset is read one sample at a
        time (``dataset[int(i)]``) and the samples are collated. A tuple batch
        becomes a tuple of tensors, a single array one tensor (``self._tensor``,
        given, makes them).
        """
        ### BEGIN SOLUTION
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            batch = getitems(indices)
        else:
            batch = collate([self.dataset[int(i)] for i in indices])
        if isinstance(batch, tuple):
            return tuple(self._tensor(field) for field in batch)
        return self._tensor(batch)
        ### END SOLUTION

    def _tensor(self, array: Any) -> Tensor:
        """``array``, a batch just gathered, as a tensor on the loader's device.

        A new host array (not a view) that already has its tensor dtype becomes
        the tensor's data as it is; ``Tensor(array)`` would copy every batch
        once more. Anything else goes through ``Tensor``: converted to float32 or
        int64, copied to the device.
        """
        if (self._backend.is_array(array) and getattr(array, "base", True) is None
                and array.dtype == default_dtype(array.dtype)):
            return Tensor._make(array, self._backend)
        return Tensor(array, device=self._backend)

    # -- epochs: given code --------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        token = self._live = object()
        return self._serve(token)

    def _serve(self, token: object) -> Iterator[Any]:
        # A generator's body runs at the first next(), so the epoch starts there, not
        # at iter(): code that calls iter() and drops the iterator (tqdm does) must not
        # use up an epoch's order.
        self._check_live(token)
        if self._position > 0 and not self._resuming:
            self._finish_epoch()  # the previous iteration stopped early: that epoch is over
        self._resuming = False
        self._start_state = self._generator_state()
        batches = batch_indices(self._epoch_order(), self.batch_size, self.drop_last)
        if not batches:
            self._finish_epoch()
        self._seed_dataset()
        gathered, stop_workers = self._gathered(batches)
        try:
            for number in range(self._position, len(batches)):
                self._check_live(token)
                batch = next(gathered)
                self._position = number + 1
                if self._position == len(batches):
                    self._finish_epoch()
                    stop_workers()
                yield batch
        finally:  # also when the loop is left early and this iterator is closed or collected
            stop_workers()

    # -- worker processes: given code ------------------------------------------------
    def _seed_dataset(self) -> None:
        """Tell a dataset with ``set_epoch`` the epoch about to be read and the loader's seed."""
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(self.epoch, self.seed)

    def _gathered(self, batches: list) -> tuple[Iterator[Any], Callable[[], Any]]:
        """The batches from ``self._position`` on, as tensors, and a function that stops this epoch's workers.

        Without workers each batch is fetched here when asked for. With workers,
        a pool gathers them ahead; a non-persistent pool is this epoch's alone
        (an older epoch's is stopped first), a persistent one is started once.
        """
        if self.num_workers == 0:
            return (self._fetch(indices) for indices in batches[self._position:]), lambda: None
        if not self.persistent_workers and self._stop_workers is not None:
            self._stop_workers()
        if self._stop_workers is None or not self._stop_workers.alive:
            host = copy.copy(self)  # what the workers run: this loader, gathering on the host
            host._backend, host._pool, host._stop_workers = get_backend("cpu"), None, None
            self._pool = WorkerPool(host._gather_on_host, self.num_workers, self.seed, self.epoch,
                                    self.worker_init_fn)
            self._stop_workers = weakref.finalize(self, self._pool.close)
        arrays = self._pool.batches(batches, self._position, self.epoch)
        batches_here = (tuple(map(self._tensor, batch)) if isinstance(batch, tuple) else self._tensor(batch)
                        for batch in arrays)
        return batches_here, (lambda: None) if self.persistent_workers else self._stop_workers

    def _gather_on_host(self, indices: np.ndarray, epoch: int) -> Any:
        """In a worker: the batch ``indices`` of ``epoch`` as NumPy arrays (what a queue carries)."""
        if epoch != self.epoch:  # persistent workers outlive the epoch they started in
            self.epoch = epoch
            self._seed_dataset()
        batch = self._fetch(indices)
        return tuple(field.data for field in batch) if isinstance(batch, tuple) else batch.data

    def _check_live(self, token: object) -> None:
        if self._live is not token:
            raise RuntimeError(
                "this DataLoader iterator is stale: a newer iter(loader) or load_state_dict() replaced it"
            )

    def _finish_epoch(self) -> None:
        self.epoch += 1
        self._position = 0
        self._start_state = self._generator_state()

    def _generator_state(self) -> dict | None:
        return None if self.generator is None else self.generator.bit_generator.state

    # -- exact resume: given code ----------------------------------------------------
    def state_dict(self) -> dict:
        """Where the loader stands, as plain data.

        ``epoch``: the epoch in progress (or the next); ``position``: how many of
        its batches were served; ``generator``: the generator's
        ``bit_generator.state`` at the start of that epoch (``None`` without
        shuffling), from which its order is drawn again on resume. The
        settings are recorded so that loading into a different loader fails.
        A state taken after a loop was left early records where it stopped: a
        loader loaded from it finishes that epoch (the original loader, iterated
        again, would start a new one).
        """
        return {
            "epoch": self.epoch,
            "position": self._position,
            "generator": copy.deepcopy(self._start_state),
            "num_samples": len(self.dataset),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next ``iter`` serves the rest of its epoch.

        Raises ``ValueError`` when the state comes from a loader with another
        dataset length, batch size, ``shuffle`` or ``drop_last``, or holds a
        position outside the epoch or a generator state this loader's generator
        refuses; ``TypeError`` for an epoch or position that is not a whole number.
        Everything is checked before anything changes: a failed load leaves the
        loader as it was.
        """
        mine = self.state_dict()
        missing = sorted(set(mine) - set(state))
        if missing:
            raise ValueError(f"not a DataLoader state: missing {', '.join(missing)}")
        for key in ("num_samples", "batch_size", "shuffle", "drop_last"):
            if state[key] != mine[key]:
                raise ValueError(
                    f"loader state was saved with {key}={state[key]!r} but this loader has {key}={mine[key]!r}"
                )
        epoch = check_int("the loader state's epoch", state["epoch"], minimum=0)
        position = check_int("the loader state's position", state["position"])
        if not 0 <= position < max(len(self), 1):
            raise ValueError(f"loader state has position {position}, outside an epoch of {len(self)} batches")
        if self.generator is not None:
            trial = type(self.generator.bit_generator)()  # NumPy checks the state as it is set: on a spare first
            try:
                trial.state = copy.deepcopy(state["generator"])
            except (TypeError, ValueError) as error:
                raise ValueError(f"loader state has a generator state that {type(trial).__name__} refuses: "
                                 f"{error}") from None
            self.generator.bit_generator.state = trial.state
        self.epoch = epoch
        self._position = position
        self._start_state = self._generator_state()
        self._resuming = True
        self._live = None  # iterators from before the load are stale

    def __repr__(self) -> str:
        return (
            f"DataLoader({len(self.dataset)} samples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, device={self.device!r}, epoch={self.epoch})"
        )


# %% [markdown]
# Try it on a tiny dataset: ten samples, batches of four.

# %%
X = np.arange(20.0).reshape(10, 2)
y = np.arange(10) % 3
loader = DataLoader(TensorDataset(X, y), batch_size=4)
print(loader, "->", len(loader), "batches")
for xb, yb in loader:
    print(xb.shape, xb.dtype, yb.numpy(), yb.dtype)

# %% check=2
X = np.arange(20.0).reshape(10, 2)
y = np.arange(10) % 3
loader = DataLoader(TensorDataset(X, y), batch_size=4)
assert len(loader) == 3 and len(DataLoader(TensorDataset(X, y), 4, drop_last=True)) == 2
assert len(DataLoader(TensorDataset(X, y), batch_size=5)) == 2
shapes = [(xb.shape, yb.shape) for xb, yb in loader]
assert shapes == [((4, 2), (4,)), ((4, 2), (4,)), ((2, 2), (2,))], shapes
xb, yb = next(iter(loader))
assert isinstance(xb, Tensor) and xb.dtype == np.float32 and yb.dtype == np.int64
assert np.array_equal(yb.numpy(), y[:4]), "without shuffling, batches follow the dataset's order"
xb, yb = next(iter(DataLoader(TensorDataset(X, y), batch_size=4, device="strict")))
assert xb.device == "strict:0" and yb.device == "strict:0"
for bad in (0, -3):
    try:
        DataLoader(TensorDataset(X, y), batch_size=bad)
    except ValueError as error:
        assert str(bad) in str(error), error
    else:
        raise AssertionError(f"batch_size={bad} must raise ValueError")
print("batching OK")

# %% check=2
def epoch_labels(loader):
    return np.concatenate([yb.numpy() for _, yb in loader])


ds = TensorDataset(np.zeros((100, 1)), np.arange(100))
loader = DataLoader(ds, batch_size=7, shuffle=True, seed=0)
first, second = epoch_labels(loader), epoch_labels(loader)
assert sorted(first) == list(range(100)), "every sample exactly once per epoch"
assert sorted(second) == list(range(100))
assert not np.array_equal(first, second), "each epoch must have a new order"
assert not np.array_equal(first, np.arange(100)), "shuffle=True must shuffle"
again = DataLoader(ds, batch_size=7, shuffle=True, seed=0)
assert np.array_equal(epoch_labels(again), first) and np.array_equal(epoch_labels(again), second)
assert not np.array_equal(epoch_labels(DataLoader(ds, batch_size=7, shuffle=True, seed=1)), first)
tt.manual_seed(3)
a = epoch_labels(DataLoader(ds, batch_size=7, shuffle=True))
tt.manual_seed(3)
assert np.array_equal(epoch_labels(DataLoader(ds, batch_size=7, shuffle=True)), a), "seed=None follows tt.manual_seed"
print("shuffling OK")

# %% [markdown]
# ## 4. What shuffling does: training on sorted data
#
# `tinytrain.datasets.Digits` is a real data set that ships with the package:
# 1,797 handwritten digits of 8×8 pixels (Alpaydin & Kaynak, 1998, from the UCI
# repository), split into 1,437 training and 360 test images. Images are float32
# in [0, 1] with shape `(1, 8, 8)` — one channel, so the CNN of Module 11 can
# read them; a dense model flattens them to 64 numbers.

# %%
train, test = Digits(train=True), Digits(train=False)
print(train, test, sep="\n")
image, label = train[0]
print(image.shape, image.dtype, label)

try:
    import matplotlib.pyplot as plt
except ImportError:  # plots are optional: pip install tinytrain[notebooks]
    plt = None
if plt is not None:
    fig, axes = plt.subplots(1, 10, figsize=(10, 1.3))
    for digit, ax in enumerate(axes):
        ax.imshow(train.images[np.flatnonzero(train.labels == digit)[0], 0], cmap="gray_r")
        ax.set_title(str(digit))
        ax.axis("off")
    plt.show()

# %% [markdown]
# Now sort the training set by label — as if the files had been stored one
# folder per class — and train a softmax regression (a single linear layer,
# written with the tensors and autograd of Modules 01–02) for a few epochs, once
# reading the batches in stored order and once shuffled. Everything else is
# identical: the same initial weights, learning rate and batch size.

# %%
by_label = np.argsort(train.labels, kind="stable")
sorted_train = TensorDataset(train.images[by_label], train.labels[by_label])
test_x = tt.tensor(test.images.reshape(len(test), 64))
test_y = test.labels


def softmax_regression(loader, epochs=3, lr=0.5):
    """Train logits = x @ W + b with plain SGD; return per-step losses and test accuracy."""
    tt.manual_seed(0)
    W = (tt.randn(64, 10) * 0.01).requires_grad_()
    b = tt.zeros(10, requires_grad=True)
    losses = []
    for _ in range(epochs):
        for xb, yb in loader:
            logits = xb.reshape(len(xb), 64) @ W + b
            loss = -logits.log_softmax(axis=1)[tt.arange(len(yb)), yb].mean()
            loss.backward()
            for p in (W, b):
                p.data -= lr * p.grad.data
                p.grad = None
            losses.append(loss.item())
    with tt.no_grad():
        predictions = (test_x @ W + b).argmax(axis=1).numpy()
    return np.array(losses), (predictions == test_y).mean()


runs = {
    "stored order (sorted by label)": softmax_regression(DataLoader(sorted_train, batch_size=32)),
    "shuffled every epoch": softmax_regression(DataLoader(sorted_train, batch_size=32, shuffle=True, seed=0)),
}
for name, (losses, accuracy) in runs.items():
    print(f"{name:32s} last-epoch mean loss {losses[-len(losses) // 3:].mean():.3f}   test accuracy {accuracy:.1%}")
if plt is not None:
    fig, ax = plt.subplots(figsize=(8, 3))
    for name, (losses, _) in runs.items():
        ax.plot(losses, label=name)
    ax.set_xlabel("step (batch of 32)")
    ax.set_ylabel("training loss")
    ax.legend()
    plt.show()

# %% [markdown]
# In stored order, the loss of each batch is low — the model has just learned
# to say "this class" — and jumps at every new class: a saw-tooth. The model
# ends each epoch predicting mostly the last classes it saw, and its test
# accuracy shows it. Shuffled, the loss falls steadily and the test accuracy is
# that of a decent linear classifier. Same data, same steps — only the order
# differs.
#
# ## 5. Exact resume
#
# Long runs get interrupted: a preempted cloud machine, a time limit, a crash.
# The `Trainer` (Modules 09 and 10) saves a checkpoint and later continues from
# it, and the promise is *exact* resume: the continued run computes bit for bit
# what an uninterrupted run would have. For the data that means the same remaining
# batches of the current epoch, in the same order, and the same orders for all
# later epochs. Three numbers pin that down:
#
# * `epoch` — which epoch is in progress (or comes next);
# * `position` — how many of its batches were already served;
# * `generator` — the generator's state *at the start of that epoch*
#   (`bit_generator.state`, a dict of integers). Drawing the permutation again
#   from it reproduces the epoch's order and leaves the generator exactly where
#   the uninterrupted run has it, so later epochs match too.
#
# Storing the state from the epoch's start instead of the order itself keeps a
# checkpoint small (a few integers instead of `N` indices). The state is plain
# data, so it pickles safely into a checkpoint. Resume *between* epochs is the
# same thing with `position = 0`.

# %%
ds = TensorDataset(np.arange(20.0)[:, None], np.arange(20))
loader = DataLoader(ds, batch_size=3, shuffle=True, seed=7)
for step, (xb, yb) in enumerate(loader):
    if step == 2:
        state = pickle.loads(pickle.dumps(loader.state_dict()))  # as a checkpoint would
        break
print(state)
resumed = DataLoader(ds, batch_size=3, shuffle=True, seed=12345)  # the seed is replaced by the state
resumed.load_state_dict(state)
print("resumed, rest of epoch 0:", [yb.numpy().tolist() for _, yb in resumed])

# %% check=2
def label_batches(loader):
    return [yb.numpy().tolist() for _, yb in loader]


ds = TensorDataset(np.zeros((23, 2)), np.arange(23))
straight = DataLoader(ds, batch_size=4, shuffle=True, seed=1)
expected = label_batches(straight) + label_batches(straight) + label_batches(straight)
interrupted = DataLoader(ds, batch_size=4, shuffle=True, seed=1)
served = label_batches(interrupted)
iterator = iter(interrupted)
served += [next(iterator)[1].numpy().tolist() for _ in range(2)]
state = pickle.loads(pickle.dumps(interrupted.state_dict()))
assert state["epoch"] == 1 and state["position"] == 2, state
fresh = DataLoader(ds, batch_size=4, shuffle=True, seed=99)
fresh.load_state_dict(state)
served += label_batches(fresh) + label_batches(fresh)
assert served == expected, "a resumed loader must serve exactly the batches of an uninterrupted one"
assert fresh.epoch == 3
print("exact resume OK")

# %% [markdown]
# ## 6. Windows of a token stream
#
# A language model's data set is one long stream of **token ids** — a whole
# book, turned into integers by a tokenizer — and its task is to predict each
# token from the ones before it. A training sample is a **window** of `T`
# consecutive tokens (the *context*) and, as targets, the same window shifted
# by one token: the model reads positions $0, \dots, j$ and predicts token
# $j + 1$, for every $j$ at once, so one window holds `T` predictions. For a
# window that starts at token $s$,
#
# $$x = (t_s, \dots, t_{s+T-1}), \qquad y = (t_{s+1}, \dots, t_{s+T}).$$
#
# The last target of a window is the token after it, so a window may start at
# most at $N - T - 1$ in a stream of $N$ tokens. With the starts
# $0, r, 2r, \dots$ (a **stride** $r$) there are
#
# $$\left\lfloor \frac{N - T - 1}{r} \right\rfloor + 1 \ \text{windows}.$$
#
# Worked example: the stream `10 11 12 13 14 15 16` ($N = 7$) with $T = 3$.
# Stride 1 gives 4 windows, starting at 0 to 3; the last is
# $x = (13, 14, 15)$, $y = (14, 15, 16)$. Stride 3 gives
# $\lfloor 3/3 \rfloor + 1 = 2$ windows, starting at 0 and 3.
#
# Two strides matter. **Stride 1** makes every start a sample; a shuffling
# `DataLoader` then draws windows at uniformly random starts, every start once
# per epoch, reproducibly from its seed — and its `state_dict` resumes the
# stream mid-epoch exactly, as section 5 showed. (nanoGPT draws starts
# independently, with replacement: the same distribution for each window. An
# epoch of Tiny Shakespeare's million characters is a million windows; a run of
# a few thousand steps sees a fraction of them.) **Stride `T`** puts the windows
# side by side: each token is predicted at most once, in order, and every evaluation
# reads the same windows, so evaluation losses compare across a run.
#
# `TokenWindows` is a dataset, so everything a `DataLoader` does comes for free:
# shuffling, resuming, and — in Module 13 — data parallelism, where each
# process gets its own shard of every epoch's windows. You write `__len__` (the
# formula above) and `__getitems__`: a batch of windows in **one fancy index**
# per array. For window numbers `i` the starts are `i * stride`; add
# `np.arange(T)` across the columns and the `(B, T)` array of positions indexes
# the tokens at once, no Python loop; the targets are the positions plus one.

# %% export="data"
class TokenWindows(Dataset):
    """The windows of a stream of token ids, as ``(inputs, targets)`` samples for a language model.

    ``TokenWindows(tokens, context, stride=1)``: window ``i`` starts at token
    ``s = i * stride``; its inputs are ``tokens[s : s + context]`` and its targets
    the next tokens, ``tokens[s + 1 : s + context + 1]``. There are
    ``(N - context - 1) // stride + 1`` windows in ``N`` tokens. ``stride=1`` (every
    start) is for training with a shuffling :class:`DataLoader`, ``stride=context``
    (windows side by side, each token predicted at most once) for evaluation.

    ``tokens`` is a 1-D sequence of integer ids (a NumPy array is used as it is, a
    tensor is copied to the host) with at least ``context + 1`` tokens. Raises
    ``TypeError`` for ids that are not integers or a ``context`` or ``stride`` that
    is not a whole number, ``ValueError`` for a stream that is not 1-D or too short,
    or a ``context`` or ``stride`` below 1.
    """

    def __init__(self, tokens: Any, context: int, stride: int = 1) -> None:
        tokens = _host_array(tokens)
        if tokens.size == 0:  # np.asarray([]) is float64: the stream is too short, not of the wrong kind
            tokens = tokens.astype(np.int64)
        if tokens.ndim != 1:
            raise ValueError(f"TokenWindows needs a 1-D stream of token ids, got an array of shape {tokens.shape}")
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"TokenWindows needs integer token ids, got dtype {tokens.dtype}")
        self.context = check_int("context", context, minimum=1)
        self.stride = check_int("stride", stride, minimum=1)
        if len(tokens) < self.context + 1:
            raise ValueError(f"TokenWindows: a window of context={self.context} needs {self.context + 1} tokens (its "
                             f"inputs and the token after them), the stream has {len(tokens)}")
        self.tokens = tokens

    def __len__(self) -> int:
        """The number of windows: their starts are 0, stride, 2 * stride, ... up to N - context - 1."""
        ### BEGIN SOLUTION
        return (len(self.tokens) - self.context - 1) // self.stride + 1
        ### END SOLUTION

    def __getitem__(self, index: int) -> tuple:
        """Window ``index`` (negative counts from the end): ``(inputs, targets)``, two arrays of ``context`` ids."""
        count = len(self)
        index = check_int("index", index)
        if not -count <= index < count:
            raise IndexError(f"window {index} is out of range for {count} windows")
        inputs, targets = self.__getitems__(np.array([index % count]))
        return inputs[0], targets[0]

    def __getitems__(self, indices: np.ndarray) -> tuple:
        """The windows ``indices`` (an integer array of window numbers in ``[0, len(self))``) as one batch.

        Returns ``(inputs, targets)``: two new ``(len(indices), context)`` arrays of
        the tokens' dtype, each gathered with one fancy index (no Python loop);
        ``targets`` are the inputs' positions plus one.
        """
        ### BEGIN SOLUTION
        positions = np.asarray(indices)[:, None] * self.stride + np.arange(self.context)
        return self.tokens[positions], self.tokens[positions + 1]
        ### END SOLUTION

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self)} windows of context={self.context}, stride={self.stride}, "
                f"from {len(self.tokens)} tokens)")


# %% check=2
stream = np.array([50, 12, 77, 31, 64, 8, 45])  # N = 7 tokens, in no order: a target is the next token, not id + 1
windows = TokenWindows(stream, context=3)
assert len(windows) == 4 and len(TokenWindows(stream, 3, stride=3)) == 2 and len(TokenWindows(stream, 6)) == 1
x, y = windows[3]
assert x.tolist() == [31, 64, 8] and y.tolist() == [64, 8, 45], (x, y)
xs, ys = windows.__getitems__(np.array([2, 0]))
assert xs.tolist() == [[77, 31, 64], [50, 12, 77]] and ys.tolist() == [[31, 64, 8], [12, 77, 31]], (xs, ys)
assert TokenWindows(stream, 3, stride=3)[1][0].tolist() == [31, 64, 8]
batches = list(DataLoader(windows, batch_size=2, shuffle=True, seed=0))
assert [xb.shape for xb, _ in batches] == [(2, 3), (2, 3)] and batches[0][0].dtype == np.int64
starts = sorted(int(s) for xb, _ in batches for s in xb.numpy()[:, 0])
assert starts == [12, 31, 50, 77], "a shuffled epoch serves every window once"
print("TokenWindows OK")

# %% [markdown]
# Cut a real stream: the characters of a sentence as their byte values (Module
# 14 builds proper tokenizers). A training loader draws random windows, a
# validation loader reads the windows side by side:

# %%
text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
ids = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)
train_windows, val_windows = TokenWindows(ids, context=16), TokenWindows(ids, context=16, stride=16)
print(train_windows, val_windows, sep="\n")
xb, yb = next(iter(DataLoader(train_windows, batch_size=2, shuffle=True, seed=0)))
for inputs, targets in zip(xb.numpy(), yb.numpy()):
    print(repr(bytes(inputs.tolist()).decode()), "->", repr(bytes(targets.tolist()).decode()))

# %% [markdown]
# ## 7. Systems: how fast is the loader?
#
# Every step waits for its batch, so the loader must be much faster than the
# model. Compare the two ways of building a batch: the fast path — one fancy
# index per array, done inside NumPy's C loops — against a dataset that only
# offers `dataset[i]`, so the loader calls Python once per sample and stacks the
# results. Try two sample sizes: 64 features (a flattened Digit) and 784 (a
# flattened MNIST image).

# %%
class OneAtATime(Dataset):
    """The same arrays, but only sample by sample: no ``__getitems__``."""

    def __init__(self, *arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(a[i] for a in self.arrays)


def samples_per_second(dataset, batch_size, repeats=3):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, seed=0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in loader:
            pass
        best = min(best, time.perf_counter() - start)
    return len(dataset) / best


rng = np.random.default_rng(0)
targets = rng.integers(0, 10, 20_000)
print("features  batch     fast path   per-sample loop   (samples/s)")
for n_features in (64, 784):
    features = rng.random((20_000, n_features), dtype=np.float32)
    for batch_size in (32, 256):
        fast = samples_per_second(TensorDataset(features, targets), batch_size)
        slow = samples_per_second(OneAtATime(features, targets), batch_size)
        print(f"{n_features:8d} {batch_size:6d} {fast:13,.0f} {slow:17,.0f}   {fast / slow:4.0f}x")

# %% [markdown]
# The per-sample loop pays a fixed few microseconds of Python for every sample
# (an index, a tuple, a call), and `np.stack` then copies each row once more.
# The fast path pays a fixed cost per *batch* — so bigger batches help it — and
# then copies rows at memory speed. For small samples the Python overhead is
# everything and the fast path wins by ten times or more (growing with the
# batch size); for MNIST-sized rows, copying bytes takes a real share of the
# time and the gap narrows to a few times. Either way the fast path delivers
# hundreds of thousands to millions of samples per second on one core, far more
# than a NumPy MLP consumes, so the loader will not be the bottleneck of our
# milestones. (A GPU consumes batches much faster; that is one reason PyTorch
# loads data in worker processes.)
#
# Memory is the other half of the story. The datasets in `tinytrain.datasets`
# keep their pixels as **uint8** and convert to float32 one batch at a time: a
# quarter of the memory (MNIST's 60,000 training images are 47 MB instead of
# 188 MB; CIFAR-10's 50,000 are 154 MB instead of 614 MB).

# %%
for name, shape in (("MNIST train", (60_000, 1, 28, 28)), ("CIFAR-10 train", (50_000, 3, 32, 32))):
    n = np.prod(shape)
    print(f"{name:15s} uint8 {n / 1e6:6.0f} MB   float32 {4 * n / 1e6:6.0f} MB")

# %% [markdown]
# ## Bigger datasets
#
# `tinytrain.datasets` also has `MNIST`, `FashionMNIST` and `CIFAR10`
# (3×32×32 colour images). They download once from their published locations
# (falling back to a mirror), check each file's SHA-256, and cache it under
# `$TINYTRAIN_DATA` (default `~/.cache/tinytrain`). Offline, point `root=` at a
# folder with the standard files (for example one you copied from another
# machine): `MNIST(root="data/mnist", download=False)`. All of them are
# TensorDatasets, so the loader's fast path applies. This notebook uses only
# `Digits`, which needs no network.
#
# ## How PyTorch does it
#
# * `torch.utils.data.Dataset` and `TensorDataset` are ours, almost to the
#   letter (*map-style* datasets; `IterableDataset` covers streams).
# * `DataLoader(dataset, batch_size=1, shuffle=False, drop_last=False, ...)`
#   splits our loader into parts: a **sampler** yields indices
#   (`SequentialSampler`, `RandomSampler` — our `_epoch_order`), a
#   `BatchSampler` groups them (our `batch_indices`), and `collate_fn` stacks the
#   samples (our `collate`). `DistributedSampler` gives each process of a
#   data-parallel job its own share of the indices (Module 13 needs the same).
# * Shuffling: `RandomSampler` draws a fresh seed from PyTorch's global
#   generator at every `iter()` unless you pass `generator=`. Our loader always
#   owns its generator, so its order does not depend on what else drew random
#   numbers.
# * Batch gathering: PyTorch asks `dataset[i]` per sample unless the dataset
#   defines `__getitems__(indices)` — the same hook as ours, except that PyTorch
#   still passes the result through `collate_fn`.
# * **Workers**: `num_workers=k` starts `k` processes that read and decode
#   samples in parallel (JPEG decoding and augmentation are slow), and
#   `pin_memory=True` puts batches in page-locked memory so the copy to the GPU
#   can overlap with compute. Our loader takes `num_workers`, `worker_init_fn`
#   and `persistent_workers` too, as given code (`tinytrain/runtime/workers.py`):
#   the order is still drawn here, by the loader's generator, and each worker
#   runs your `_fetch` on the indices it is sent, so the batches are exactly
#   those of `num_workers=0`. Arrays in memory take microseconds per batch to
#   gather, less than sending the batch between processes costs; workers pay off
#   when reading a sample is slow. Random augmentation
#   (`tt.data.transforms.RandomCrop`, `RandomHorizontalFlip`, applied with
#   `Transformed(dataset, transform)`) draws from a generator of each sample's
#   own, seeded from the loader's seed, the epoch and the sample's index, so it
#   too is the same whichever process reads the sample.
# * Resume: PyTorch's `DataLoader` has no `state_dict`; `torchdata`'s
#   `StatefulDataLoader` adds `state_dict()` / `load_state_dict()` for exactly
#   the mid-epoch resume of section 5.
# * Token windows: PyTorch has no `TokenWindows`; nanoGPT's `get_batch` draws
#   `torch.randint(len(data) - block_size, (batch_size,))` starts (with
#   replacement, from the global generator) and stacks `data[i:i+block_size]`
#   and `data[i+1:i+1+block_size]` — the same windows as ours.
#
# ## Summary
#
# * A dataset is `len` + `__getitem__`; `TensorDataset` holds arrays with one row
#   per sample and gathers whole batches with one fancy index per array.
# * An epoch is cut into $\lceil N/B \rceil$ batches ($\lfloor N/B \rfloor$ with
#   `drop_last`); each `iter(loader)` is one epoch.
# * Shuffle every epoch, from a generator the loader owns: batches become fair
#   samples, and runs are reproducible from one seed.
# * Exact resume needs the epoch, the position within it and the generator state
#   at the epoch's start — a few plain numbers.
# * A language model trains on windows of a token stream with targets shifted
#   by one: $\lfloor (N - T - 1)/r \rfloor + 1$ windows at stride $r$; stride 1
#   shuffled for training, stride `T` in order for evaluation.
# * Gather a batch in one vectorised operation — from a few times to tens of
#   times faster than a per-sample Python loop, more so the smaller the samples —
#   and keep pixels as uint8 until the batch is built: a quarter of the memory.
