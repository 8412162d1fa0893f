"""Graded checks for Module 08 (data), run against the student's own code.

``TensorDataset``, ``batch_indices``, ``collate``, ``DataLoader`` and
``TokenWindows`` come from the ``student`` fixture; tensors come from the package. Shuffling is checked by
its properties (a permutation per epoch, new each epoch, reproducible from the
seed, resumable), not against one particular random sequence.
"""
import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check, expect_equal, expect_raises

N = 10
X = np.arange(2.0 * N).reshape(N, 2)  # float64 features: batches must be float32
Y = np.arange(N) % 3  # integer labels: batches must be int64


def labels(loader):
    """The label batches of one epoch, as lists."""
    return [yb.numpy().tolist() for _, yb in loader]


class WholeBatches:
    """A dataset of its own (not a TensorDataset) with __getitems__: the loader must take its batches from it."""

    def __init__(self, *arrays):
        self.arrays, self.calls = arrays, 0

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        raise AssertionError(f"the loader read dataset[{i!r}] of a dataset with __getitems__: expected one call "
                             f"__getitems__(indices) per batch")

    def __getitems__(self, indices):
        self.calls += 1
        self.served = tuple(a[indices] for a in self.arrays)
        return self.served


class OneAtATime:
    """A dataset without __getitems__: the loader must read it sample by sample and collate."""

    def __init__(self, *arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        # a dataset of Python lists takes only single indices: the loader must read dataset[int(i)]
        assert isinstance(i, (int, np.integer)), (f"the loader read dataset[{i!r}] of a dataset without __getitems__: "
                                                  f"expected one sample at a time, dataset[int(i)]")
        sample = tuple(a[i] for a in self.arrays)
        return sample if len(sample) > 1 else sample[0]


# -- TensorDataset ------------------------------------------------------------------------

def _expect_rows(got, expected, what):
    """A sample or batch: a tuple with one host array (or NumPy value) per dataset array."""
    assert isinstance(got, tuple) and len(got) == len(expected), \
        f"{what}: expected a tuple of {len(expected)} arrays, got {got!r}"
    for field, (value, want) in enumerate(zip(got, expected)):
        assert not isinstance(value, tt.Tensor), f"{what}, field {field}: expected a host NumPy array, got a Tensor"
        expect_equal(np.asarray(value), np.asarray(want), f"{what}, field {field}")


@check(points=2, hint="TensorDataset keeps the arrays (tensors copied to host NumPy arrays); dataset[i] is the "
                      "tuple (a[i], b[i], ...) for an int, an index array (a NumPy array or an integer tensor, on any "
                      "device) or a slice")
def test_tensor_dataset_indexing(student):
    ds = student.TensorDataset(X, Y)
    expect_equal(len(ds), N, "len(TensorDataset(X, Y))")
    small = X.astype(np.uint8)
    kept = student.TensorDataset(small, Y).arrays
    assert kept[0] is small and kept[1] is Y, (
        f"TensorDataset(uint8 X, Y).arrays: expected the NumPy arrays themselves (used as they are, not copied), "
        f"got arrays of dtypes ({kept[0].dtype}, {kept[1].dtype}), "
        f"{'the same objects' if kept[0] is small else 'new objects'}")
    _expect_rows(ds[3], (X[3], Y[3]), "TensorDataset(X, Y)[3]")
    _expect_rows(ds[np.array([9, 0, 4])], (X[[9, 0, 4]], Y[[9, 0, 4]]), "TensorDataset(X, Y)[np.array([9, 0, 4])]")
    _expect_rows(ds[2:5], (X[2:5], Y[2:5]), "TensorDataset(X, Y)[2:5]")
    for device in ("cpu", "strict"):
        index = tt.tensor([7, 1, 1], device=device)
        try:
            got = ds[index]
        except Exception as error:  # noqa: BLE001 - the message says what went wrong
            raise AssertionError(f"TensorDataset(X, Y)[tt.tensor([7, 1, 1], device={device!r})]: expected the rows "
                                 f"7, 1, 1, got {type(error).__name__}: {error}") from None
        _expect_rows(got, (X[[7, 1, 1]], Y[[7, 1, 1]]), f"TensorDataset(X, Y)[tt.tensor([7, 1, 1], device={device!r})]")
    (single,) = student.TensorDataset(tt.tensor([[1.0], [2.0], [3.0]]))[np.array([2, 0])]
    assert isinstance(single, np.ndarray), f"TensorDataset(tensor)[...]: expected a host NumPy array, got " \
                                           f"{type(single).__name__}"
    expect_equal(single, np.array([[3.0], [1.0]], dtype=np.float32), "TensorDataset(tensor [[1], [2], [3]])[[2, 0]]")
    (strict,) = student.TensorDataset(tt.tensor([[1.0], [2.0]], device="strict"))[np.array([1])]
    assert isinstance(strict, np.ndarray), f"TensorDataset(strict tensor)[...]: expected a host NumPy array, got " \
                                           f"{type(strict).__name__}"
    _expect_rows(student.TensorDataset(X, Y, Y * 2)[5], (X[5], Y[5], 2 * Y[5]), "TensorDataset(X, Y, 2 * Y)[5]")


@check(points=1, hint="TensorDataset raises ValueError naming the lengths when the arrays' first dimensions differ, "
                      "naming the position of an array that has no first dimension, and saying so when it gets no "
                      "array at all")
def test_tensor_dataset_refuses_mismatched_lengths(student):
    expect_equal(len(student.TensorDataset(X[:4], Y[:4])), 4, "len(TensorDataset(X[:4], Y[:4]))")
    expect_raises(ValueError, lambda: student.TensorDataset(X, Y[:7]), "TensorDataset(X, Y[:7]) (10 and 7 rows)",
                  mentions=("10", "7"))
    expect_raises(ValueError, lambda: student.TensorDataset(X, Y, Y, np.float64(2.5)),
                  "TensorDataset(X, Y, Y, 2.5) (array 3 has no first dimension)", mentions=("3",))
    # 4 rows, not X's 10: a message that names only the length 10 also contains "1"
    expect_raises(ValueError, lambda: student.TensorDataset(X[:4], 7), "TensorDataset(X[:4], 7) (array 1 has no "
                  "first dimension)", mentions=("1",))
    error = expect_raises(ValueError, lambda: student.TensorDataset(), "TensorDataset() (no array)")
    assert str(error).strip(), "TensorDataset() (no array): expected a ValueError that says what is wrong, got an " \
                               "empty message"


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
                expect_equal([list(b) for b in batches], expected,
                             f"batch_indices({order.tolist()}, {batch_size}, drop_last={drop_last})")
                expect_equal([np.shares_memory(b, order) for b in batches], [True] * len(batches),
                             f"whether the batches of batch_indices({order.tolist()}, {batch_size}) are views of "
                             "order (slices: no copy)")


@check(points=1, hint="collate: for tuple (or list) samples, stack field k of every sample into one array "
                      "(np.stack adds the batch axis in front); other samples are stacked directly; a single "
                      "sample is a batch of one; every field goes through the given _host_array first, since "
                      "np.stack of tensors gives an array of objects")
def test_collate(student):
    xs, ys = student.collate([(np.zeros((1, 2)), 3), (np.ones((1, 2)), 5), (np.full((1, 2), 2.0), 7)])
    expect_equal(xs, np.array([[[0.0, 0.0]], [[1.0, 1.0]], [[2.0, 2.0]]]), "collate of 3 (x, y) samples: the xs")
    expect_equal(ys, np.array([3, 5, 7]), "collate of 3 (x, y) samples: the ys")
    a, b = student.collate([[np.arange(3), 1.5], [np.arange(3) + 1, 2.5]])
    expect_equal(a, np.array([[0, 1, 2], [1, 2, 3]]), "collate of 2 [x, y] list samples: the xs")
    expect_equal(b, np.array([1.5, 2.5]), "collate of 2 [x, y] list samples: the ys")
    stacked = student.collate([np.arange(4), np.arange(4) * 2])
    assert isinstance(stacked, np.ndarray), f"collate of 2 arrays: expected one NumPy array, got " \
                                            f"{type(stacked).__name__}"
    expect_equal(stacked, np.array([np.arange(4), np.arange(4) * 2]), "collate of 2 arrays")
    expect_equal(student.collate([tt.tensor([1.0, 2.0]), tt.tensor([3.0, 4.0])]),
                 np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32), "collate of 2 tensors")
    one = student.collate([(np.array([4.0, 5.0]), 9)])
    assert isinstance(one, tuple) and len(one) == 2, f"collate of one (x, y) sample: expected a tuple of 2 arrays, " \
                                                     f"got {one!r}"
    expect_equal(one[0], np.array([[4.0, 5.0]]), "collate of one (x, y) sample: the xs")
    expect_equal(one[1], np.array([9]), "collate of one (x, y) sample: the ys")
    expect_equal(student.collate([np.arange(3)]), np.array([[0, 1, 2]]), "collate of one array")
    xs, ys = student.collate([(tt.tensor([0.5]), 0), (tt.tensor([1.5]), 1)])
    expect_equal(xs, np.array([[0.5], [1.5]], dtype=np.float32), "collate of 2 (tensor, int) samples: the xs (every "
                 "field through _host_array)")


# -- DataLoader -------------------------------------------------------------------------------

@check(points=2, hint="len(loader) is ceil(N / batch_size), or floor with drop_last; each batch is a tuple of "
                      "tensors (one per field) on the loader's device, float features as float32, labels int64; any "
                      "dataset with __getitems__ gives each batch in one call, whose arrays self._tensor wraps "
                      "without a copy")
def test_loader_batches(student):
    ds = student.TensorDataset(X, Y)
    for batch_size, drop_last, count in ((4, False, 3), (4, True, 2), (5, False, 2), (5, True, 2), (11, False, 1),
                                         (11, True, 0), (1, False, 10), (3, False, 4), (3, True, 3)):
        expect_equal(len(student.DataLoader(ds, batch_size=batch_size, drop_last=drop_last)), count,
                     f"len(DataLoader(10 samples, batch_size={batch_size}, drop_last={drop_last}))")
    loader = student.DataLoader(ds, batch_size=4)
    batches = list(loader)
    expect_equal([(xb.shape, yb.shape) for xb, yb in batches], [((4, 2), (4,)), ((4, 2), (4,)), ((2, 2), (2,))],
                 "DataLoader(10 samples, batch_size=4): the (x, y) shapes of the batches")
    xb, yb = batches[0]
    assert isinstance(xb, tt.Tensor) and isinstance(yb, tt.Tensor), \
        f"a batch: expected a tuple of Tensors, got ({type(xb).__name__}, {type(yb).__name__})"
    expect_equal((xb.dtype, yb.dtype), (np.dtype("float32"), np.dtype("int64")),
                 "the (features, labels) dtypes of a batch of float64 features and integer labels")
    expect_equal(np.concatenate([xb.numpy() for xb, _ in batches]), X.astype(np.float32),
                 "the features of one epoch without shuffle (the dataset's order)")
    expect_equal(labels(student.DataLoader(ds, batch_size=4, drop_last=True)), [Y[:4].tolist(), Y[4:8].tolist()],
                 "the label batches of DataLoader(10 samples, batch_size=4, drop_last=True)")
    xb, yb = next(iter(student.DataLoader(ds, batch_size=3, device="strict")))
    expect_equal((xb.device, yb.device), ("strict:0", "strict:0"), "a batch of DataLoader(..., device='strict'): "
                 "the devices of (x, y)")
    own = WholeBatches(X, Y)
    expect_equal(labels(student.DataLoader(own, batch_size=4)), [Y[:4].tolist(), Y[4:8].tolist(), Y[8:].tolist()],
                 "DataLoader(a dataset of its own with __getitems__, batch_size=4): the label batches")
    expect_equal(own.calls, 3, "the calls of __getitems__ in an epoch of 3 batches")
    ready = WholeBatches(X.astype(np.float32), Y.astype(np.int64))  # nothing to convert: the batch is wrapped as it is
    xb, yb = next(iter(student.DataLoader(ready, batch_size=4)))
    expect_equal([np.shares_memory(t.data, a) for t, a in zip((xb, yb), ready.served)], [True, True],
                 "whether each tensor of a batch holds the very array __getitems__ returned (float32 features, "
                 "int64 labels: self._tensor wraps them; Tensor(array) would copy every batch a second time)")


@check(points=1, hint="a dataset without __getitems__ is read one sample at a time (dataset[int(i)]) and "
                      "collated; a batch of single arrays is one tensor, not a tuple")
def test_loader_reads_sample_by_sample(student):
    batches = list(student.DataLoader(OneAtATime(X, Y), batch_size=4))
    expect_equal([type(b).__name__ for b in batches], ["tuple"] * 3,
                 "DataLoader(dataset of (x, y) samples without __getitems__, batch_size=4): the batch types")
    expect_equal([len(b) for b in batches], [2, 2, 2], "the number of fields in each (x, y) batch")
    expect_equal(batches[1][0].numpy(), X[4:8].astype(np.float32), "the features of the second batch")
    expect_equal(batches[1][1].dtype, np.dtype("int64"), "the labels' dtype of the second batch")
    singles = list(student.DataLoader(OneAtATime(X), batch_size=6))
    assert all(isinstance(b, tt.Tensor) for b in singles), \
        f"DataLoader(dataset of single arrays): expected each batch to be one Tensor, got " \
        f"{[type(b).__name__ for b in singles]}"
    expect_equal([b.shape for b in singles], [(6, 2), (4, 2)], "DataLoader(10 single arrays, batch_size=6): shapes")
    last = list(student.DataLoader(OneAtATime(X, Y), batch_size=3))[-1]  # a batch of one sample
    expect_equal(last[0].numpy(), X[9:].astype(np.float32), "the last batch of DataLoader(10 (x, y) samples, "
                 "batch_size=3): one sample's features")
    expect_equal(last[1].numpy(), Y[9:], "the last batch of DataLoader(10 (x, y) samples, batch_size=3): its label")
    xb, yb = next(iter(student.DataLoader(OneAtATime(X, Y), batch_size=3, device="strict")))
    expect_equal((xb.device, yb.device), ("strict:0", "strict:0"), "a batch of DataLoader(dataset without "
                 "__getitems__, device='strict'): the devices of (x, y)")


@check(points=2, hint="with shuffle, every epoch draws a new permutation from the loader's own generator "
                      "(self.generator.permutation(N)): not the global np.random, and not re-seeded each epoch")
def test_loader_shuffles_each_epoch_reproducibly(student):
    ds = student.TensorDataset(np.arange(40.0)[:, None], np.arange(40))
    loader = student.DataLoader(ds, batch_size=8, shuffle=True, seed=7)
    epochs = [np.concatenate([yb.numpy() for _, yb in loader]) for _ in range(3)]
    for number, order in enumerate(epochs):
        expect_equal(sorted(order.tolist()), list(range(40)),
                     f"the sorted labels of shuffled epoch {number} (every sample exactly once)")
    assert not np.array_equal(epochs[0], np.arange(40)), \
        "DataLoader(shuffle=True): expected a shuffled order, got 0, 1, ..., 39"
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2]), \
        f"DataLoader(shuffle=True): expected a new order each epoch, got {epochs[0].tolist()} more than once"
    again = student.DataLoader(ds, batch_size=8, shuffle=True, seed=7)
    np.random.permutation(40)  # other users of the global generators must not change the loader's order
    tt.randn(3)
    for number, order in enumerate(epochs):
        expect_equal(np.concatenate([yb.numpy() for _, yb in again]), order,
                     f"epoch {number} of a second loader with seed=7 (the same seed gives the same epochs)")
    other = student.DataLoader(ds, batch_size=8, shuffle=True, seed=8)
    assert not np.array_equal(np.concatenate([yb.numpy() for _, yb in other]), epochs[0]), \
        "seed=8: expected another order than seed=7, got the same"


@check(points=1, hint="drop_last with shuffle: cut the epoch's permutation into full batches only; the samples "
                      "left out differ from epoch to epoch")
def test_loader_drop_last_with_shuffle(student):
    ds = student.TensorDataset(np.zeros((10, 1)), np.arange(10))
    loader = student.DataLoader(ds, batch_size=4, shuffle=True, drop_last=True, seed=0)
    left_out = set()
    for _ in range(8):
        batches = labels(loader)
        expect_equal([len(b) for b in batches], [4, 4], "the batch sizes of an epoch of 10 samples, batch_size=4, "
                     "shuffle=True, drop_last=True")
        served = sum(batches, [])
        expect_equal(len(set(served)), 8, f"different samples served in an epoch ({served})")
        left_out |= set(range(10)) - set(served)
    assert len(left_out) > 2, f"drop_last with shuffle over 8 epochs: expected the dropped samples to change, got " \
                              f"only {sorted(left_out)} ever dropped"


@check(points=2, hint="a resumed loader redraws the interrupted epoch's order from the saved generator state: "
                      "draw each epoch's order from self.generator only, once per epoch")
def test_loader_resumes_mid_epoch(student):
    ds = student.TensorDataset(np.arange(30.0)[:, None], np.arange(30))
    straight = student.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    expected = [labels(straight) for _ in range(3)]
    first = student.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    expect_equal(labels(first), expected[0], "epoch 0 of a second loader with seed=3")
    iterator = iter(first)
    served = [next(iterator)[1].numpy().tolist() for _ in range(3)]
    expect_equal(served, expected[1][:3], "the first 3 batches of epoch 1 of a second loader with seed=3")
    state = first.state_dict()
    resumed = student.DataLoader(ds, batch_size=4, shuffle=True, seed=99)  # another seed: the state decides
    resumed.load_state_dict(state)
    expect_equal(labels(resumed), expected[1][3:], "after load_state_dict: the rest of the interrupted epoch")
    expect_equal(labels(resumed), expected[2], "after load_state_dict: the next epoch, as in the uninterrupted run")


# -- TokenWindows ---------------------------------------------------------------------------

STREAM = np.array([7, 3, 9, 1, 4, 4, 8, 0, 2, 6, 5], dtype=np.int64)  # N = 11 token ids


def reference_windows(tokens, context, stride):
    """Every window by the lesson's formula, one by one: (inputs, targets) lists."""
    starts = range(0, len(tokens) - context, stride)
    return [(tokens[s:s + context].tolist(), tokens[s + 1:s + context + 1].tolist()) for s in starts]


@check(points=1, hint="len(TokenWindows) = (N - context - 1) // stride + 1: a window may start at most at "
                      "N - context - 1, since its last target is the token after it")
def test_token_windows_count(student):
    for context, stride in ((3, 1), (3, 3), (4, 2), (10, 1), (5, 5), (2, 7), (1, 1)):
        expect_equal(len(student.TokenWindows(STREAM, context, stride)),
                     len(reference_windows(STREAM, context, stride)),
                     f"len(TokenWindows(<{len(STREAM)} tokens>, context={context}, stride={stride}))")


@check(points=2, hint="__getitems__: positions = indices[:, None] * stride + np.arange(context); inputs are "
                      "tokens[positions], targets tokens[positions + 1] (the inputs shifted by one token), both "
                      "in the tokens' own dtype (no cast)")
def test_token_windows_batches(student):
    for context, stride in ((3, 1), (4, 2), (3, 3)):
        windows = student.TokenWindows(STREAM, context, stride)
        expected = reference_windows(STREAM, context, stride)
        order = np.arange(len(expected))[::-1].copy()
        inputs, targets = windows.__getitems__(order)
        what = f"TokenWindows(<stream {STREAM.tolist()}>, context={context}, stride={stride}).__getitems__({order})"
        expect_equal(np.asarray(inputs), np.array([expected[i][0] for i in order]), f"{what}: the inputs")
        expect_equal(np.asarray(targets), np.array([expected[i][1] for i in order]), f"{what}: the targets")
        expect_equal(windows[len(expected) - 1][1].tolist(), expected[-1][1],
                     f"the targets of the last window of context={context}, stride={stride}")
    small = student.TokenWindows(STREAM.astype(np.uint16), 3)
    inputs, _ = small.__getitems__(np.array([1]))
    expect_equal(np.asarray(inputs).dtype, np.dtype(np.uint16), "__getitems__ of uint16 tokens: the inputs' dtype "
                 "(the tokens' own; the DataLoader makes int64 tensors of them)")


@check(points=1, hint="TokenWindows is a dataset: a shuffling DataLoader serves every window once per epoch, as "
                      "int64 tensor pairs of shape (batch, context), and resumes mid-epoch from its state_dict")
def test_token_windows_through_a_loader(student):
    windows = student.TokenWindows(STREAM, 4)
    loader = tt.data.DataLoader(windows, batch_size=3, shuffle=True, seed=5)
    batches = [(xb.numpy().tolist(), yb.numpy().tolist()) for xb, yb in loader]
    expect_equal([len(xb) for xb, _ in batches], [3, 3, 1], "the batch sizes of an epoch of 7 windows, batch_size=3")
    served = sorted((tuple(x), tuple(y)) for xb, yb in batches for x, y in zip(xb, yb))
    expect_equal(served, sorted((tuple(x), tuple(y)) for x, y in reference_windows(STREAM, 4, 1)),
                 "the windows of a shuffled epoch (each once)")
    xb, yb = next(iter(tt.data.DataLoader(windows, batch_size=2)))
    expect_equal((xb.dtype, yb.dtype, xb.shape), (np.dtype(np.int64), np.dtype(np.int64), (2, 4)),
                 "the first batch of DataLoader(TokenWindows(..., 4), batch_size=2): dtypes and shape")
