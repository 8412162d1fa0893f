"""Graded checks for Module 08 (data), run against the student's own code.

``TensorDataset``, ``batch_indices``, ``collate`` and ``DataLoader`` come from
the ``student`` fixture; tensors come from the package. Shuffling is checked by
its properties (a permutation per epoch, new each epoch, reproducible from the
seed, resumable), not against one particular random sequence.
"""
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.course.checks import check

N = 10
X = np.arange(2.0 * N).reshape(N, 2)  # float64 features: batches must be float32
Y = np.arange(N) % 3  # integer labels: batches must be int64


def labels(loader):
    """The label batches of one epoch, as lists."""
    return [yb.numpy().tolist() for _, yb in loader]


class OneAtATime:
    """A dataset without __getitems__: the loader must read it sample by sample and collate."""

    def __init__(self, *arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        sample = tuple(a[i] for a in self.arrays)
        return sample if len(sample) > 1 else sample[0]


# -- TensorDataset ------------------------------------------------------------------------

@check(points=2, hint="TensorDataset keeps the arrays (tensors copied to host NumPy arrays); dataset[i] is the "
                      "tuple (a[i], b[i], ...) for an int, an index array or a slice")
def test_tensor_dataset_indexing(student):
    ds = student.TensorDataset(X, Y)
    assert len(ds) == N
    x3, y3 = ds[3]
    assert np.array_equal(x3, [6.0, 7.0]) and y3 == 0
    xb, yb = ds[np.array([9, 0, 4])]
    assert np.array_equal(xb, X[[9, 0, 4]]) and np.array_equal(yb, Y[[9, 0, 4]])
    xs, ys = ds[2:5]
    assert np.array_equal(xs, X[2:5]) and np.array_equal(ys, Y[2:5])
    (single,) = student.TensorDataset(tt.tensor([[1.0], [2.0], [3.0]]))[np.array([2, 0])]
    assert isinstance(single, np.ndarray) and single.tolist() == [[3.0], [1.0]], "tensors become host arrays"
    three = student.TensorDataset(X, Y, Y * 2)
    assert len(three[5]) == 3 and three[5][2] == 2 * Y[5]


@check(points=1, hint="TensorDataset must raise ValueError naming the lengths when the arrays' first dimensions "
                      "differ (and when it gets no array at all)")
def test_tensor_dataset_refuses_mismatched_lengths(student):
    assert len(student.TensorDataset(X[:4], Y[:4])) == 4
    with pytest.raises(ValueError) as error:
        student.TensorDataset(X, Y[:7])
    assert "10" in str(error.value) and "7" in str(error.value), error.value
    with pytest.raises(ValueError):
        student.TensorDataset()


# -- batch_indices and collate ---------------------------------------------------------------

@check(points=1, hint="batch_indices: consecutive slices order[i:i + batch_size]; the last one is short unless "
                      "drop_last, which leaves it out (so N < batch_size gives no batch at all)")
def test_batch_indices(student):
    rng = np.random.default_rng(0)
    for n in range(0, 12):
        order = rng.permutation(n)
        for batch_size in range(1, 6):
            for drop_last in (False, True):
                batches = student.batch_indices(order, batch_size, drop_last=drop_last)
                stop = n - n % batch_size if drop_last else n
                expected = [order[i:i + batch_size].tolist() for i in range(0, stop, batch_size)]
                assert [list(b) for b in batches] == expected, (n, batch_size, drop_last)


@check(points=1, hint="collate: for tuple (or list) samples, stack field k of every sample into one array "
                      "(np.stack adds the batch axis in front); other samples are stacked directly")
def test_collate(student):
    xs, ys = student.collate([(np.zeros((1, 2)), 3), (np.ones((1, 2)), 5), (np.full((1, 2), 2.0), 7)])
    assert xs.shape == (3, 1, 2) and np.array_equal(xs[2], [[2.0, 2.0]]) and ys.tolist() == [3, 5, 7]
    a, b = student.collate([[np.arange(3), 1.5], [np.arange(3) + 1, 2.5]])
    assert a.tolist() == [[0, 1, 2], [1, 2, 3]] and b.tolist() == [1.5, 2.5]
    stacked = student.collate([np.arange(4), np.arange(4) * 2])
    assert isinstance(stacked, np.ndarray) and stacked.shape == (2, 4)
    assert student.collate([tt.tensor([1.0, 2.0]), tt.tensor([3.0, 4.0])]).tolist() == [[1.0, 2.0], [3.0, 4.0]]


# -- DataLoader -------------------------------------------------------------------------------

@check(points=2, hint="len(loader) is ceil(N / batch_size), or floor with drop_last; each batch is a tuple of "
                      "tensors (one per field) on the loader's device, float features as float32, labels int64")
def test_loader_batches(student):
    ds = student.TensorDataset(X, Y)
    for batch_size, drop_last, count in ((4, False, 3), (4, True, 2), (5, False, 2), (5, True, 2), (11, False, 1),
                                         (11, True, 0), (1, False, 10)):
        assert len(student.DataLoader(ds, batch_size=batch_size, drop_last=drop_last)) == count, (batch_size, drop_last)
    loader = student.DataLoader(ds, batch_size=4)
    batches = list(loader)
    assert [(xb.shape, yb.shape) for xb, yb in batches] == [((4, 2), (4,)), ((4, 2), (4,)), ((2, 2), (2,))]
    xb, yb = batches[0]
    assert isinstance(xb, tt.Tensor) and xb.dtype == np.float32 and yb.dtype == np.int64
    assert np.array_equal(np.concatenate([xb.numpy() for xb, _ in batches]), X), "without shuffle: dataset order"
    assert labels(student.DataLoader(ds, batch_size=4, drop_last=True)) == [Y[:4].tolist(), Y[4:8].tolist()]
    xb, yb = next(iter(student.DataLoader(ds, batch_size=3, device="strict")))
    assert xb.device == "strict:0" and yb.device == "strict:0"


@check(points=1, hint="a dataset without __getitems__ is read one sample at a time (dataset[int(i)]) and "
                      "collated; a batch of single arrays is one tensor, not a tuple")
def test_loader_reads_sample_by_sample(student):
    pairs = student.DataLoader(OneAtATime(X, Y), batch_size=4)
    batches = list(pairs)
    assert len(batches) == 3 and all(isinstance(b, tuple) and len(b) == 2 for b in batches)
    assert np.array_equal(batches[1][0].numpy(), X[4:8]) and batches[1][1].dtype == np.int64
    singles = list(student.DataLoader(OneAtATime(X), batch_size=6))
    assert isinstance(singles[0], tt.Tensor) and singles[0].shape == (6, 2) and singles[1].shape == (4, 2)


@check(points=2, hint="with shuffle, every epoch draws a new permutation from the loader's own generator "
                      "(self.generator.permutation(N)): not the global np.random, and not re-seeded each epoch")
def test_loader_shuffles_each_epoch_reproducibly(student):
    ds = student.TensorDataset(np.arange(40.0)[:, None], np.arange(40))
    loader = student.DataLoader(ds, batch_size=8, shuffle=True, seed=7)
    epochs = [np.concatenate([yb.numpy() for _, yb in loader]) for _ in range(3)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(40)), "each epoch visits every sample exactly once"
    assert not np.array_equal(epochs[0], np.arange(40)), "shuffle=True must shuffle"
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2]), \
        "each epoch needs a new order"
    again = student.DataLoader(ds, batch_size=8, shuffle=True, seed=7)
    np.random.permutation(40)  # other users of the global generators must not change the loader's order
    tt.randn(3)
    assert all(np.array_equal(np.concatenate([yb.numpy() for _, yb in again]), order) for order in epochs), \
        "the same seed must give the same epochs"
    other = student.DataLoader(ds, batch_size=8, shuffle=True, seed=8)
    assert not np.array_equal(np.concatenate([yb.numpy() for _, yb in other]), epochs[0])


@check(points=1, hint="drop_last with shuffle: cut the epoch's permutation into full batches only; the samples "
                      "left out differ from epoch to epoch")
def test_loader_drop_last_with_shuffle(student):
    ds = student.TensorDataset(np.zeros((10, 1)), np.arange(10))
    loader = student.DataLoader(ds, batch_size=4, shuffle=True, drop_last=True, seed=0)
    left_out = set()
    for _ in range(8):
        batches = labels(loader)
        assert len(batches) == 2 and all(len(b) == 4 for b in batches), batches
        served = sum(batches, [])
        assert len(set(served)) == 8
        left_out |= set(range(10)) - set(served)
    assert len(left_out) > 2, "the dropped samples should change with the shuffle"


@check(points=2, hint="a resumed loader redraws the interrupted epoch's order from the saved generator state: "
                      "draw each epoch's order from self.generator only, once per epoch")
def test_loader_resumes_mid_epoch(student):
    ds = student.TensorDataset(np.arange(30.0)[:, None], np.arange(30))
    straight = student.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    expected = [labels(straight) for _ in range(3)]
    first = student.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    assert labels(first) == expected[0]
    iterator = iter(first)
    served = [next(iterator)[1].numpy().tolist() for _ in range(3)]
    assert served == expected[1][:3]
    state = first.state_dict()
    resumed = student.DataLoader(ds, batch_size=4, shuffle=True, seed=99)  # another seed: the state decides
    resumed.load_state_dict(state)
    assert labels(resumed) == expected[1][3:], "the rest of the interrupted epoch"
    assert labels(resumed) == expected[2], "then the next epoch, as in the uninterrupted run"
