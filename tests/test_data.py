"""Module 08: Dataset, TensorDataset, batch_indices, collate and the DataLoader
(batching, dtypes, devices, shuffling, epochs, exact resume, errors), and
TokenWindows (a language model's windows of a token stream)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain.backend import get_backend
from tinytrain.data import DataLoader, Dataset, TensorDataset, TokenWindows, batch_indices, collate


def labelled(n: int, features: int = 3) -> TensorDataset:
    """``n`` samples whose label is their index, so batches show which samples they hold."""
    return TensorDataset(np.arange(n * features, dtype=np.float64).reshape(n, features), np.arange(n))


def label_batches(loader) -> list[list[int]]:
    """One epoch of ``loader`` as lists of labels."""
    return [yb.numpy().tolist() for _, yb in loader]


class OneAtATime(Dataset):
    """A generic dataset (no ``__getitems__``) that counts how often it is indexed."""

    def __init__(self, *arrays):
        self.arrays = arrays
        self.calls = 0

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, index):
        self.calls += 1
        return tuple(a[index] for a in self.arrays)


# -- TensorDataset -----------------------------------------------------------------


def test_tensor_dataset_int_index_gives_a_tuple_sample():
    ds = labelled(5)
    assert len(ds) == 5
    sample = ds[2]
    assert isinstance(sample, tuple) and len(sample) == 2
    np.testing.assert_array_equal(sample[0], [6.0, 7.0, 8.0])
    assert sample[1] == 2


def test_tensor_dataset_index_array_gives_a_batch_tuple():
    ds = labelled(5)
    xb, yb = ds[np.array([4, 0, 4])]
    assert xb.shape == (3, 3)
    np.testing.assert_array_equal(yb, [4, 0, 4])
    xs, ys = ds[1:3]
    np.testing.assert_array_equal(ys, [1, 2])


def test_tensor_dataset_accepts_tensors_on_any_device(device):
    x = tt.tensor(np.arange(6.0).reshape(3, 2), device=device)
    y = tt.tensor([0, 1, 2], device=device)
    ds = TensorDataset(x, y, [[1], [2], [3]])
    xs, ys, zs = ds[np.array([2, 0])]
    assert type(xs) is np.ndarray and type(ys) is np.ndarray  # kept in host memory
    np.testing.assert_array_equal(xs, [[4.0, 5.0], [0.0, 1.0]])
    np.testing.assert_array_equal(zs, [[3], [1]])
    assert ds[tt.tensor([1])][1].tolist() == [1]  # a tensor index works too


def test_tensor_dataset_length_mismatch_names_the_lengths():
    with pytest.raises(ValueError, match=r"5, 4"):
        TensorDataset(np.zeros((5, 2)), np.zeros(4))


@pytest.mark.parametrize("arrays", [(), (np.float64(3.0),)], ids=["none", "0-d"])
def test_tensor_dataset_needs_arrays_with_a_first_dimension(arrays):
    with pytest.raises(ValueError, match="TensorDataset"):
        TensorDataset(*arrays)


def test_dataset_base_class_says_what_to_implement():
    with pytest.raises(NotImplementedError, match="__getitem__"):
        Dataset()[0]
    with pytest.raises(NotImplementedError, match="__len__"):
        len(Dataset())


# -- batch_indices and collate -----------------------------------------------------


@given(n=st.integers(0, 60), batch_size=st.integers(1, 17), drop_last=st.booleans())
def test_batch_indices_cut_the_order_in_sequence(n, batch_size, drop_last):
    order = np.random.default_rng(n).permutation(n)
    batches = batch_indices(order, batch_size, drop_last)
    kept = n - n % batch_size if drop_last else n
    assert len(batches) == (n // batch_size if drop_last else -(-n // batch_size))
    assert all(len(b) == batch_size for b in batches[:-1])
    if drop_last and batches:
        assert len(batches[-1]) == batch_size
    joined = np.concatenate(batches) if batches else np.array([], dtype=int)
    np.testing.assert_array_equal(joined, order[:kept])


def test_collate_stacks_fields_and_plain_samples(device):
    xs, ys = collate([(np.zeros((1, 2)), 3), (np.ones((1, 2)), 5), (np.ones((1, 2)), 7)])
    assert xs.shape == (3, 1, 2)
    np.testing.assert_array_equal(ys, [3, 5, 7])
    assert collate([np.arange(3), np.arange(3)]).shape == (2, 3)
    stacked = collate([tt.tensor([1.0, 2.0], device=device)] * 4)
    assert type(stacked) is np.ndarray and stacked.shape == (4, 2)


# -- batching, dtypes and devices --------------------------------------------------


def test_collate_names_the_sample_whose_shape_differs_and_both_shapes():
    with pytest.raises(ValueError, match=r"sample 2 .*shapes \(\(1, 3\), \(\)\).*sample 0 .*shapes \(\(1, 2\), \(\)\)"):
        collate([(np.zeros((1, 2)), 3), (np.ones((1, 2)), 5), (np.ones((1, 3)), 7)])
    with pytest.raises(ValueError, match=r"sample 1 .*shape \(4,\).*sample 0 .*shape \(3,\)"):
        collate([np.arange(3), np.arange(4)])
    with pytest.raises(ValueError, match=r"sample 1 .*shapes \(\(2,\),\).*sample 0 .*shapes \(\(2,\), \(\)\)"):
        collate([(np.zeros(2), 1), (np.zeros(2),)])  # a missing field


def test_batches_have_the_right_shapes_and_dtypes(device, canonical_device):
    ds = TensorDataset(
        np.zeros((10, 1, 4, 4)),  # float64 features -> float32
        np.arange(10, dtype=np.uint8),  # integer labels -> int64
        np.ones((10, 2), dtype=np.float16),  # an explicit float dtype is kept
        np.zeros(10, dtype=bool),
    )
    loader = DataLoader(ds, batch_size=4, device=device)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(4, 1, 4, 4), (4, 1, 4, 4), (2, 1, 4, 4)]
    for xb, yb, hb, mb in batches:
        assert isinstance(xb, tt.Tensor) and not xb.requires_grad
        assert (xb.dtype, yb.dtype, hb.dtype, mb.dtype) == (np.float32, np.int64, np.float16, np.bool_)
        assert {t.device for t in (xb, yb, hb, mb)} == {canonical_device}
    np.testing.assert_array_equal(batches[2][1].numpy(), [8, 9])


def test_loader_device_defaults_to_cpu_and_is_validated():
    assert DataLoader(labelled(3)).device == "cpu"
    with pytest.raises(ValueError, match="tpu"):
        DataLoader(labelled(3), device="tpu")


def test_len_counts_batches_with_and_without_drop_last():
    assert len(DataLoader(labelled(10), batch_size=4)) == 3
    assert len(DataLoader(labelled(10), batch_size=4, drop_last=True)) == 2
    assert len(DataLoader(labelled(8), batch_size=4, drop_last=True)) == 2
    assert len(DataLoader(labelled(10))) == 10
    assert len(DataLoader(labelled(3), batch_size=4, drop_last=True)) == 0


def test_drop_last_drops_only_the_short_batch():
    batches = label_batches(DataLoader(labelled(10), batch_size=4, drop_last=True))
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shuffled = DataLoader(labelled(10), batch_size=4, drop_last=True, shuffle=True, seed=0)
    first, second = label_batches(shuffled), label_batches(shuffled)
    assert [len(b) for b in first] == [4, 4] and len(set(sum(first, []))) == 8
    assert set(sum(first, [])) != set(sum(second, [])), "the dropped samples differ between epochs"


def test_empty_dataset_gives_no_batches_but_counts_epochs():
    loader = DataLoader(labelled(0), batch_size=3)
    assert len(loader) == 0 and list(loader) == [] and loader.epoch == 1


@given(
    n=st.integers(1, 50),
    batch_size=st.integers(1, 12),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_every_sample_exactly_once_per_epoch(n, batch_size, drop_last, shuffle, seed):
    loader = DataLoader(labelled(n), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    for _ in range(2):
        batches = label_batches(loader)
        assert len(batches) == len(loader)
        served = sum(batches, [])
        assert len(served) == len(set(served)) == (n - n % batch_size if drop_last else n)
        assert set(served) <= set(range(n))
        if not shuffle:
            assert served == list(range(len(served)))


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError),
                                        ("4", TypeError), (None, TypeError)])
def test_bad_batch_size_raises_naming_it(bad, error):
    with pytest.raises(error, match=rf"batch_size={bad!r}"):
        DataLoader(labelled(3), batch_size=bad)


def test_something_that_is_no_dataset_raises_at_once_naming_it():
    with pytest.raises(TypeError, match=r"dataset must be a dataset.*got dataset=5 of type int.*__len__"):
        DataLoader(5)  # at construction, not at the first batch


@pytest.mark.parametrize("seed, error", [("abc", TypeError), (1.5, TypeError), (-1, ValueError)])
def test_bad_seed_raises_naming_it(seed, error):
    with pytest.raises(error, match=rf"seed must be a whole number.*got seed={seed!r}"):
        DataLoader(labelled(3), shuffle=True, seed=seed)


# -- fast path and generic datasets --------------------------------------------------


def test_tensor_dataset_batches_are_gathered_in_one_call(monkeypatch):
    calls = []
    original = TensorDataset.__getitem__

    def counting(self, index):
        calls.append(np.shape(index))
        return original(self, index)

    monkeypatch.setattr(TensorDataset, "__getitem__", counting)
    loader = DataLoader(labelled(100), batch_size=10, shuffle=True, seed=0)
    assert len(label_batches(loader)) == 10
    assert calls == [(10,)] * 10, "one fancy index per batch, no per-sample loop"


def test_generic_dataset_is_read_per_sample_and_collated(device, canonical_device):
    x, y = np.arange(14.0).reshape(7, 2), np.arange(7)
    generic = OneAtATime(x, y)
    fast = DataLoader(TensorDataset(x, y), batch_size=3, shuffle=True, seed=5, device=device)
    slow = DataLoader(generic, batch_size=3, shuffle=True, seed=5, device=device)
    for (xf, yf), (xs, ys) in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(xf.numpy(), xs.numpy())
        np.testing.assert_array_equal(yf.numpy(), ys.numpy())
        assert xs.dtype == np.float32 and ys.dtype == np.int64 and xs.device == canonical_device
    assert generic.calls == 7


def test_plain_samples_give_single_tensor_batches():
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.array([i, i * i])

    batches = list(DataLoader(Squares(), batch_size=2))
    assert all(isinstance(b, tt.Tensor) for b in batches)
    np.testing.assert_array_equal(batches[2].numpy(), [[4, 16]])


# -- shuffling ---------------------------------------------------------------------------


def test_shuffle_is_reproducible_per_seed_and_new_each_epoch():
    ds = labelled(200)
    a = DataLoader(ds, batch_size=16, shuffle=True, seed=42)
    b = DataLoader(ds, batch_size=16, shuffle=True, seed=42)
    epochs_a = [label_batches(a) for _ in range(3)]
    epochs_b = [label_batches(b) for _ in range(3)]
    assert epochs_a == epochs_b
    orders = [sum(e, []) for e in epochs_a]
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert orders[0] != list(range(200))
    assert sum(label_batches(DataLoader(ds, batch_size=16, shuffle=True, seed=43)), []) != orders[0]


def test_order_comes_from_the_loaders_own_generator():
    ds = labelled(50)
    quiet = DataLoader(ds, batch_size=8, shuffle=True, seed=3)
    noisy = DataLoader(ds, batch_size=8, shuffle=True, seed=3)
    expected = [label_batches(quiet) for _ in range(2)]
    got = []
    for _ in range(2):
        tt.randn(100)  # other random draws must not change the loader's order
        np.random.random(10)
        got.append(label_batches(noisy))
    assert got == expected


def test_seed_none_draws_from_tinytrains_cpu_generator():
    ds = labelled(64)
    tt.manual_seed(11)
    first = [label_batches(DataLoader(ds, batch_size=8, shuffle=True)) for _ in range(2)]
    tt.manual_seed(11)
    again = [label_batches(DataLoader(ds, batch_size=8, shuffle=True)) for _ in range(2)]
    assert first == again
    assert first[0] != first[1], "two loaders created in a row get different seeds"
    tt.manual_seed(12)
    assert label_batches(DataLoader(ds, batch_size=8, shuffle=True)) != first[0]


def test_an_unshuffled_loader_draws_no_seed():
    tt.manual_seed(0)
    before = get_backend("cpu").rng_state()
    loader = DataLoader(labelled(5), batch_size=2)
    list(loader)
    assert get_backend("cpu").rng_state() == before
    assert loader.seed is None and loader.state_dict()["generator"] is None


# -- epochs --------------------------------------------------------------------------------


def test_epoch_counter_and_early_exit_semantics():
    loader = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=1)
    assert loader.epoch == 0
    label_batches(loader)
    assert loader.epoch == 1
    reference = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=1)
    label_batches(reference)
    label_batches(reference)
    expected_third = label_batches(reference)
    for batch in loader:  # leave epoch 1 after one batch: it counts as finished
        break
    assert loader.epoch == 1
    assert label_batches(loader) == expected_third and loader.epoch == 3


def test_epoch_advances_as_the_last_batch_is_served():
    loader = DataLoader(labelled(6), batch_size=3)
    iterator = iter(loader)
    next(iterator)
    assert (loader.epoch, loader.state_dict()["position"]) == (0, 1)
    next(iterator)
    assert (loader.epoch, loader.state_dict()["position"]) == (1, 0)
    with pytest.raises(StopIteration):
        next(iterator)


def test_a_newer_iterator_makes_the_older_one_stale():
    loader = DataLoader(labelled(10), batch_size=2)
    old = iter(loader)
    next(old)
    new = iter(loader)
    with pytest.raises(RuntimeError, match="stale"):
        next(old)
    assert next(new)[1].numpy().tolist() == [0, 1]


def test_an_iterator_never_advanced_uses_up_no_epoch():
    """tqdm calls iter() on what it wraps more than once: the epoch starts at the first next()."""
    reference = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=5)
    expected = [label_batches(reference), label_batches(reference)]
    loader = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=5)
    before = loader.state_dict()
    iter(loader)  # made and dropped, never advanced
    iter(loader)
    assert loader.state_dict() == before and loader.epoch == 0
    assert label_batches(loader) == expected[0]
    unused = iter(loader)
    assert label_batches(loader) == expected[1] and loader.epoch == 2
    with pytest.raises(RuntimeError, match="stale"):
        next(unused)


def test_an_iterator_never_advanced_keeps_a_resumed_epoch():
    straight = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=2)
    expected = label_batches(straight)[2:] + label_batches(straight)
    interrupted = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=2)
    iterator = iter(interrupted)
    next(iterator), next(iterator)
    resumed = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=9)
    resumed.load_state_dict(interrupted.state_dict())
    iter(resumed)  # dropped: the next loop still serves the rest of the interrupted epoch
    assert label_batches(resumed) + label_batches(resumed) == expected


def test_batches_from_the_fast_path_are_not_copied_again(monkeypatch):
    ds = labelled(12)
    gathered = []
    original = TensorDataset.__getitems__

    def spy(self, indices):
        batch = original(self, indices)
        gathered.append(batch)
        return batch

    monkeypatch.setattr(TensorDataset, "__getitems__", spy)
    xb, yb = next(iter(DataLoader(ds, batch_size=4)))
    features, labels = gathered[0]
    assert yb.data is labels, "new int64 labels become the tensor as they are"
    assert xb.dtype == np.float32 and features.dtype == np.float64, "float64 features are converted"
    yb.data[...] = -1
    np.testing.assert_array_equal(ds.arrays[1], np.arange(12))  # the batch is no view of the dataset


# -- exact resume --------------------------------------------------------------------------


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 9),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    epochs_before=st.integers(0, 2),
    served=st.integers(0, 10),
)
def test_resume_serves_exactly_the_remaining_and_following_batches(
    n, batch_size, drop_last, shuffle, epochs_before, served
):
    ds = labelled(n)
    straight = DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=7)
    expected = sum((label_batches(straight) for _ in range(epochs_before + 3)), [])

    interrupted = DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=7)
    got = sum((label_batches(interrupted) for _ in range(epochs_before)), [])
    served = min(served, len(interrupted))
    iterator = iter(interrupted)
    got += [next(iterator)[1].numpy().tolist() for _ in range(served)]
    state = interrupted.state_dict()
    assert _plain(state), state
    state = pickle.loads(pickle.dumps(state))

    resumed = DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=1234)
    resumed.load_state_dict(state)
    # serving an epoch's last batch ends it; an iterator never advanced has not started its epoch (not even an empty one)
    finished = 0 < served == len(interrupted)
    assert resumed.epoch == epochs_before + finished
    for _ in range(2 if finished else 3):  # the rest of the interrupted epoch, then two more
        got += label_batches(resumed)
    assert got == expected


def test_resume_mid_epoch_on_the_device(device):
    ds = TensorDataset(np.random.default_rng(0).random((30, 2)), np.arange(30))
    straight = DataLoader(ds, batch_size=4, shuffle=True, seed=0, device=device)
    expected = [(x.numpy(), y.numpy()) for x, y in straight] + [(x.numpy(), y.numpy()) for x, y in straight]
    interrupted = DataLoader(ds, batch_size=4, shuffle=True, seed=0, device=device)
    head = []
    for step, (x, y) in enumerate(interrupted):
        head.append((x.numpy(), y.numpy()))
        if step == 4:
            break
    resumed = DataLoader(ds, batch_size=4, shuffle=True, device=device)
    resumed.load_state_dict(interrupted.state_dict())
    rest = [(x.numpy(), y.numpy()) for x, y in resumed] + [(x.numpy(), y.numpy()) for x, y in resumed]
    got = head + rest
    assert len(got) == len(expected) == 16
    for (xa, ya), (xb, yb) in zip(got, expected):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_state_between_epochs_and_after_load_invalidates_iterators():
    loader = DataLoader(labelled(9), batch_size=3, shuffle=True, seed=2)
    label_batches(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    expected = label_batches(loader)
    old = iter(loader)
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match="stale"):
        next(old)
    assert label_batches(loader) == expected


@pytest.mark.parametrize(
    "other",
    [
        dict(batch_size=4),
        dict(shuffle=False),
        dict(drop_last=True),
        dict(n=11),
    ],
    ids=["batch_size", "shuffle", "drop_last", "num_samples"],
)
def test_loading_a_state_from_another_kind_of_loader_raises(other):
    state = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=0).state_dict()
    settings = dict(n=10, batch_size=3, shuffle=True, drop_last=False) | other
    n = settings.pop("n")
    loader = DataLoader(labelled(n), seed=0, **settings)
    key = next(iter(other)) if "n" not in other else "num_samples"
    with pytest.raises(ValueError, match=key):
        loader.load_state_dict(state)


def test_loading_something_else_raises():
    with pytest.raises(ValueError, match="not a DataLoader state: missing .*position"):
        DataLoader(labelled(10)).load_state_dict({"epoch": 0})


@pytest.mark.parametrize("change, error, message", [
    (dict(epoch="zero"), TypeError, "the loader state's epoch must be a whole number"),
    (dict(epoch=-1), ValueError, "the loader state's epoch must be a whole number >= 0"),
    (dict(position=1.7), TypeError, "the loader state's position must be a whole number"),
    (dict(generator={"bit_generator": "MT19937"}), ValueError, "a generator state that PCG64 refuses"),
], ids=["epoch-text", "epoch-negative", "position-fraction", "generator"])
def test_a_failed_load_changes_nothing(change, error, message):
    """Catches a generator state set before the epoch is read: a bad epoch would leave another loader's order."""
    other = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=7)
    label_batches(other)
    loader = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=0)
    before = loader.state_dict()
    with pytest.raises(error, match=message):
        loader.load_state_dict(other.state_dict() | change)
    assert loader.state_dict() == before
    assert label_batches(loader) == label_batches(DataLoader(labelled(10), batch_size=3, shuffle=True, seed=0))


def test_state_dict_is_a_copy():
    loader = DataLoader(labelled(10), batch_size=3, shuffle=True, seed=0)
    state = loader.state_dict()
    state["generator"]["state"]["state"] = 0
    assert loader.state_dict()["generator"]["state"]["state"] != 0


def test_loading_a_position_outside_the_epoch_raises():
    loader = DataLoader(labelled(10), batch_size=3)
    state = loader.state_dict() | {"position": 4}
    with pytest.raises(ValueError, match="position 4"):
        loader.load_state_dict(state)


def test_repr_names_the_settings():
    text = repr(DataLoader(labelled(10), batch_size=3, shuffle=True, seed=0))
    assert "batch_size=3" in text and "shuffle=True" in text and "10 samples" in text



# -- TokenWindows -------------------------------------------------------------------------------

@given(n=st.integers(2, 40), context=st.integers(1, 12), stride=st.integers(1, 12))
def test_token_windows_are_every_window_with_its_next_tokens(n, context, stride):
    tokens = np.random.default_rng(n).integers(0, 1000, n)
    if n < context + 1:
        with pytest.raises(ValueError, match=f"needs {context + 1} tokens.*has {n}"):
            TokenWindows(tokens, context, stride)
        return
    windows = TokenWindows(tokens, context, stride)
    starts = list(range(0, n - context, stride))  # the last target, tokens[s + context], must exist
    assert len(windows) == len(starts)
    inputs, targets = windows.__getitems__(np.arange(len(windows)))
    np.testing.assert_array_equal(inputs, [tokens[s:s + context] for s in starts])
    np.testing.assert_array_equal(targets, [tokens[s + 1:s + context + 1] for s in starts])
    x, y = windows[-1]
    np.testing.assert_array_equal(x, tokens[starts[-1]:starts[-1] + context])
    np.testing.assert_array_equal(y, tokens[starts[-1] + 1:starts[-1] + context + 1])


def test_token_windows_batches_are_int64_tensors_on_the_loaders_device(device):
    stream = tt.tensor(np.arange(50), device=device)  # a tensor stream is copied to the host
    assert type(TokenWindows(stream, context=8).tokens) is np.ndarray
    windows = TokenWindows(np.arange(50, dtype=np.uint16), context=8, stride=8)
    assert len(windows) == 6
    batches = list(DataLoader(windows, batch_size=4, device=device))
    assert [(xb.shape, yb.shape) for xb, yb in batches] == [((4, 8), (4, 8)), ((2, 8), (2, 8))]
    xb, yb = batches[1]
    assert xb.dtype == yb.dtype == np.int64 and xb.device == yb.device == get_backend(device).device
    np.testing.assert_array_equal(xb.numpy(), np.arange(32, 48).reshape(2, 8))
    np.testing.assert_array_equal(yb.numpy(), np.arange(33, 49).reshape(2, 8))


def test_token_windows_resume_mid_epoch_exactly():
    windows = TokenWindows(np.arange(200) % 37, context=5)

    def batches(loader, count=None):
        served = []
        for xb, yb in loader:
            served.append((xb.numpy().tolist(), yb.numpy().tolist()))
            if len(served) == count:
                break
        return served

    straight = DataLoader(windows, batch_size=16, shuffle=True, seed=11)
    expected = batches(straight) + batches(straight)
    interrupted = DataLoader(windows, batch_size=16, shuffle=True, seed=11)
    served = batches(interrupted) + batches(interrupted, count=4)
    state = pickle.loads(pickle.dumps(interrupted.state_dict()))
    resumed = DataLoader(windows, batch_size=16, shuffle=True, seed=0)
    resumed.load_state_dict(state)
    assert served + batches(resumed) == expected


def test_token_windows_refuse_what_is_not_a_stream():
    with pytest.raises(ValueError, match=r"1-D stream.*\(2, 5\)"):
        TokenWindows(np.zeros((2, 5), dtype=np.int64), 2)
    with pytest.raises(TypeError, match="integer token ids.*float64"):
        TokenWindows(np.zeros(10), 2)
    with pytest.raises(ValueError, match="context.*>= 1.*context=0"):
        TokenWindows(np.arange(10), 0)
    with pytest.raises(ValueError, match="stride.*>= 1.*stride=0"):
        TokenWindows(np.arange(10), 2, stride=0)
    with pytest.raises(TypeError, match="context.*whole number"):
        TokenWindows(np.arange(10), 2.0)
    with pytest.raises(ValueError, match="context=4 needs 5 tokens.*has 4"):
        TokenWindows(np.arange(4), 4)
    with pytest.raises(ValueError, match="context=4 needs 5 tokens.*has 0"):  # not 'integer ids, got float64'
        TokenWindows([], 4)
    windows = TokenWindows(np.arange(10), 4, stride=2)  # windows at 0, 2, 4
    with pytest.raises(IndexError, match="window 3 is out of range for 3 windows"):
        windows[3]
    with pytest.raises(IndexError, match="window -4"):
        windows[-4]
    assert repr(windows) == "TokenWindows(3 windows of context=4, stride=2, from 10 tokens)"
