"""DataLoader(num_workers=N): the batches of num_workers=0 in the same order, exact resume, seeded workers,
errors raised here naming the sample, and no worker process outliving its use."""
from __future__ import annotations

import gc
import os
import random
import time

import numpy as np
import pytest

import tinytrain as tt
from tinytrain.data import DataLoader, Dataset, TensorDataset
from tinytrain.runtime.workers import worker_seed

pytestmark = pytest.mark.skipif(os.name == "nt", reason="the workers' tests fork")


def images(n: int = 53) -> TensorDataset:
    rng = np.random.default_rng(0)
    return TensorDataset(rng.random((n, 2, 4, 4)), np.arange(n))


class OneAtATime(Dataset):
    """A dataset without ``__getitems__``: read sample by sample and collated, in the worker."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple:
        return self.dataset[index]


class FailsAt(OneAtATime):
    def __init__(self, dataset: TensorDataset, bad: int, error: BaseException) -> None:
        super().__init__(dataset)
        self.bad, self.error = bad, error

    def __getitem__(self, index: int) -> tuple:
        if index == self.bad:
            raise self.error
        return super().__getitem__(index)


class Noisy(OneAtATime):
    """Samples that draw from NumPy's and Python's global generators: what the worker seeding makes reproducible."""

    def __getitem__(self, index: int) -> tuple:
        return np.float64(np.random.random() + random.random()), index


def epochs(loader: DataLoader, count: int = 2) -> list[list[list[np.ndarray]]]:
    """``count`` epochs of ``loader``, each batch as its fields' arrays."""
    return [[[field.numpy() for field in batch] for batch in loader] for _ in range(count)]


def assert_same_batches(got: list, expected: list) -> None:
    assert [[len(batch[0]) for batch in epoch] for epoch in got] == \
           [[len(batch[0]) for batch in epoch] for epoch in expected]
    for epoch_got, epoch_expected in zip(got, expected):
        for batch_got, batch_expected in zip(epoch_got, epoch_expected):
            for field_got, field_expected in zip(batch_got, batch_expected):
                assert field_got.dtype == field_expected.dtype
                np.testing.assert_array_equal(field_got, field_expected)


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a child that exited but was not reaped counts as gone)."""
    running = []
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already: gone
            continue
        if done == 0:
            running.append(pid)
    return running


def wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


@pytest.mark.parametrize("make", [images, lambda: OneAtATime(images())], ids=["getitems", "per-sample"])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_workers_give_the_batches_of_no_workers_in_order(make, num_workers, drop_last):
    options = dict(batch_size=5, shuffle=True, seed=7, drop_last=drop_last)
    expected = epochs(DataLoader(make(), **options))
    assert_same_batches(epochs(DataLoader(make(), num_workers=num_workers, **options)), expected)
    assert_same_batches(epochs(DataLoader(make(), num_workers=num_workers, persistent_workers=True, **options)),
                        expected)


def test_workers_hand_batches_to_the_loaders_device():
    expected = epochs(DataLoader(images(), batch_size=8, device="strict"), 1)
    loader = DataLoader(images(), batch_size=8, device="strict", num_workers=2)
    batch = next(iter(loader))
    assert batch[0].device == "strict:0" and batch[0].dtype == np.float32 and batch[1].dtype == np.int64
    assert_same_batches(epochs(loader, 1), expected)


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_mid_epoch_with_workers_is_exact(persistent):
    options = dict(batch_size=4, shuffle=True, seed=3)
    straight = epochs(DataLoader(images(), **options), 3)
    first = DataLoader(images(), num_workers=2, persistent_workers=persistent, **options)
    served = epochs(first, 1)
    iterator = iter(first)
    served.append([[field.numpy() for field in next(iterator)] for _ in range(5)])
    state = first.state_dict()
    del iterator, first

    resumed = DataLoader(images(), num_workers=2, persistent_workers=persistent, **options)
    resumed.load_state_dict(state)
    served[1] += epochs(resumed, 1)[0]
    served += epochs(resumed, 1)
    assert_same_batches(served, straight)


def test_each_worker_is_seeded_from_the_loaders_seed_epoch_and_number():
    def draws(seed: int, num_workers: int) -> np.ndarray:
        loader = DataLoader(Noisy(images(12)), batch_size=3, seed=seed, num_workers=num_workers)
        return np.concatenate([batch[0].numpy() for batch in loader] + [batch[0].numpy() for batch in loader])

    run = draws(5, 2)
    np.testing.assert_array_equal(draws(5, 2), run)  # the same seed repeats the run
    assert not np.array_equal(draws(6, 2), run)
    # 4 batches per epoch, 2 workers: each worker's stream is its own, and the next epoch's is new
    per_batch = run.reshape(8, 3)
    assert len({tuple(row) for row in per_batch}) == 8
    seed = worker_seed(5, 0, 0)  # worker 0 of epoch 0 reads batch 0 first, from this seed
    random.seed(seed)
    np.random.seed(seed)
    assert run[0] == np.float32(np.random.random() + random.random())


def test_worker_init_fn_runs_in_each_worker_with_its_number(tmp_path):
    def init(worker_id: int) -> None:
        (tmp_path / f"worker-{worker_id}-{os.getpid()}").touch()

    loader = DataLoader(images(), batch_size=5, num_workers=3, worker_init_fn=init)
    epochs(loader, 1)
    started = sorted(path.name.split("-") for path in tmp_path.iterdir())
    assert [worker for _, worker, _ in started] == ["0", "1", "2"]
    assert len({pid for _, _, pid in started} | {str(os.getpid())}) == 4  # three processes, none of them this one


@pytest.mark.parametrize("num_workers", [1, 2])
def test_an_error_in_a_worker_is_raised_here_naming_the_sample(num_workers):
    dataset = FailsAt(images(), bad=17, error=KeyError("no image 17 on disk"))
    loader = DataLoader(dataset, batch_size=4, shuffle=True, seed=1, num_workers=num_workers)
    with pytest.raises(KeyError, match=r"sample 17 \(batch \d+\).*no image 17 on disk") as caught:
        epochs(loader, 1)
    assert "Traceback" in str(caught.value) and "in __getitem__" in str(caught.value)
    assert wait_gone(loader._pool.pids) == []


def test_an_error_that_takes_other_arguments_is_raised_as_runtime_error_naming_its_type():
    class Needs2(Exception):
        def __init__(self, first, second):
            super().__init__(f"{first} and {second}")

    loader = DataLoader(FailsAt(images(), bad=2, error=Needs2("a", "b")), batch_size=4, num_workers=1)
    with pytest.raises(RuntimeError, match=r"Needs2: DataLoader worker 0 failed on sample 2 .*a and b"):
        epochs(loader, 1)


def test_a_failing_worker_init_fn_is_raised_here():
    def init(worker_id: int) -> None:
        raise ValueError(f"worker {worker_id} found no GPU")

    loader = DataLoader(images(), batch_size=4, num_workers=2, worker_init_fn=init)
    with pytest.raises(ValueError, match=r"failed to start.*found no GPU"):
        epochs(loader, 1)


def test_a_worker_that_dies_is_reported_with_its_exit_code():
    class Dies(OneAtATime):
        def __getitem__(self, index: int) -> tuple:
            if index == 9:
                os._exit(3)
            return super().__getitem__(index)

    loader = DataLoader(Dies(images()), batch_size=4, num_workers=2)
    with pytest.raises(RuntimeError, match="exited unexpectedly: worker 0 with exit code 3"):
        epochs(loader, 1)
    assert wait_gone(loader._pool.pids) == []


def test_an_epochs_workers_stop_when_it_ends():
    loader = DataLoader(images(), batch_size=4, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    pids = loader._pool.pids
    assert len(alive(pids)) == 2
    for _ in iterator:
        pass
    assert wait_gone(pids) == []


def test_a_loop_left_early_stops_its_workers_at_the_next_epoch_or_when_collected():
    loader = DataLoader(images(), batch_size=4, num_workers=2)
    for _ in loader:
        break
    first = loader._pool.pids
    for _ in loader:  # a new epoch: the abandoned one's workers go
        break
    assert wait_gone(first) == []
    second = loader._pool.pids
    del loader
    gc.collect()
    assert wait_gone(second) == []


def test_persistent_workers_serve_every_epoch_and_go_with_the_loader():
    loader = DataLoader(images(), batch_size=4, shuffle=True, seed=0, num_workers=2, persistent_workers=True)
    epochs(loader, 1)
    pids = loader._pool.pids
    for _ in loader:  # a loop left early leaves its batches in flight: the next epoch drops them
        break
    assert_same_batches(epochs(loader, 1), epochs(_at_epoch(2), 1))
    assert loader._pool.pids == pids and len(alive(pids)) == 2
    del loader
    gc.collect()
    assert wait_gone(pids) == []


def _at_epoch(epoch: int) -> DataLoader:
    loader = DataLoader(images(), batch_size=4, shuffle=True, seed=0)
    for _ in range(epoch):
        epochs(loader, 1)
    return loader


def test_a_trainer_fits_on_a_loader_with_workers():
    tt.manual_seed(0)
    X = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    y = (X.sum(axis=1) > 2).astype(np.int64)

    def fit(num_workers: int) -> list[float]:
        tt.manual_seed(0)
        model = tt.nn.Sequential(tt.nn.Linear(4, 8), tt.nn.ReLU(), tt.nn.Linear(8, 2))
        trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), tt.nn.CrossEntropyLoss())
        trainer.fit(DataLoader(TensorDataset(X, y), batch_size=16, shuffle=True, seed=0, num_workers=num_workers),
                    epochs=2, progress=False)
        return trainer.history["train_loss"]

    assert fit(2) == fit(0)


@pytest.mark.parametrize("options, error, named", [
    (dict(num_workers=-1), ValueError, "-1"),
    (dict(num_workers=1.5), TypeError, "1.5"),
    (dict(persistent_workers=True), ValueError, "num_workers=0"),
    (dict(num_workers=1, worker_init_fn=3), TypeError, "3"),
])
def test_bad_worker_options_raise_at_once_naming_them(options, error, named):
    with pytest.raises(error, match=named):
        DataLoader(images(), **options)
