"""Data-parallel training over MPI (Module 13): ``tinytrain.distributed``.

The sharding and gradient averaging are tested in one process with stand-in
communicators. The real thing runs under ``mpirun -n 2``: the test
``test_under_mpirun`` launches this file's ``mpi_*`` tests in two ranks (they
skip in a normal run) and is skipped, with the reason, when mpi4py or mpirun is
missing (``pip install mpi4py mpich``).
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain import nn
from tinytrain.data import DataLoader, TensorDataset, TokenWindows
from tinytrain.distributed import (DataParallel, DistributedDataLoader, SingleProcess, average_gradients,
                                   shard_indices)
from tinytrain.testing.ranks import find_mpirun

ROOT = Path(__file__).resolve().parents[1]
UNDER_MPI = os.environ.get("TINYTRAIN_TEST_UNDER_MPI") == "1"
RNG = np.random.default_rng(0)
X = RNG.standard_normal((256, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 256)


class FakeRank(SingleProcess):
    """Rank ``rank`` of ``size``; Allreduce adds ``others`` (what the other ranks sent)."""

    def __init__(self, rank=0, size=2, others=None):
        self.rank, self.size, self.others = rank, size, others

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Allreduce(self, send, receive, op=None):
        receive[...] = send + (0 if self.others is None else self.others)


@given(st.integers(1, 50), st.integers(1, 5))
def test_shards_cover_the_epoch_equally(n, world_size):
    order = np.random.default_rng(n).permutation(n)
    shards = [shard_indices(order, rank, world_size) for rank in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1 and len(shards[0]) == -(-n // world_size)
    joined = np.concatenate(shards)
    assert set(joined.tolist()) == set(range(n)) and len(joined) - n < world_size


def test_ranks_batches_together_are_the_single_process_batches():
    data = TensorDataset(X, Y)
    ranks = [DistributedDataLoader(data, batch_size=64, shuffle=True, seed=3, comm=FakeRank(r)) for r in range(2)]
    single = DataLoader(data, batch_size=128, shuffle=True, seed=3)
    assert len(ranks[0]) == len(ranks[1]) == len(single) == 2
    for epoch in range(2):  # a new shuffle each epoch, the same on every rank
        for (a, _), (b, _), (whole, _) in zip(*ranks, single):
            assert sorted(np.concatenate([a.numpy(), b.numpy()]).sum(axis=1).tolist()) == \
                sorted(whole.numpy().sum(axis=1).tolist())


def test_ranks_share_the_windows_of_a_token_stream_each_epoch():
    windows = TokenWindows(np.arange(103), context=6)  # 97 windows; a window's first token is its start
    ranks = [DistributedDataLoader(windows, batch_size=7, shuffle=True, seed=1, comm=FakeRank(r)) for r in range(2)]
    for _ in range(2):
        starts = [sorted(int(s) for xb, _ in loader for s in xb.numpy()[:, 0]) for loader in ranks]
        assert len(starts[0]) == len(starts[1]) == 49  # 97 windows: one is served twice to even the shards
        assert set(starts[0]) | set(starts[1]) == set(range(97))


def _served(loaders, batches=None):
    """The sample ids (labels) the loaders serve in lockstep, ``batches`` batches each (all: the epoch)."""
    served = []
    for loader in loaders:
        iterator = iter(loader)
        for _, labels in (iterator if batches is None else (next(iterator) for _ in range(batches))):
            served += labels.numpy().tolist()
    return served


def _ranks(world_size, dataset, **options):
    return [DistributedDataLoader(dataset, comm=FakeRank(rank, world_size), **options) for rank in range(world_size)]


@pytest.mark.parametrize("saved, resumed", [(2, 1), (2, 3), (1, 4), (3, 3)])
def test_a_loader_resumed_mid_epoch_on_other_ranks_serves_the_rest_of_the_epoch(saved, resumed):
    dataset = TensorDataset(np.arange(40, dtype=np.float32)[:, None], np.arange(40))
    options = dict(batch_size=3, shuffle=True, seed=7)
    before = _ranks(saved, dataset, **options)
    served = _served(before, batches=2)
    states = [loader.state_dict() for loader in before]
    after = _ranks(resumed, dataset, **options)
    for loader in after:
        loader.load_state_dict(states[0])
    rest = _served(after)
    order = DataLoader(dataset, batch_size=40, shuffle=True, seed=7)._epoch_order()
    consumed = 2 * 3 * saved
    assert sorted(served) == sorted(order[:consumed].tolist())  # the saving ranks took the front of the order
    if saved == resumed:  # exactly where it stood: the rest of the epoch's padded order
        expected = np.resize(order, -(-40 // saved) * saved)[consumed:]
    else:  # the new ranks share out the rest of the order, padded (by wrapping it) to equal shards
        expected = np.resize(order[consumed:], -(-(40 - consumed) // resumed) * resumed)
    assert sorted(rest) == sorted(expected.tolist())
    if saved == resumed:
        assert [s["offset"] for s in states] == [0] * saved
    next_epoch = _served(after)  # then whole epochs again, sharded over the new ranks
    assert sorted(set(next_epoch)) == list(range(40)) and all(loader.epoch == 2 for loader in after)


def test_a_loader_resumed_twice_on_other_ranks_still_serves_each_sample_once():
    dataset = TensorDataset(np.arange(30, dtype=np.float32)[:, None], np.arange(30))
    options = dict(batch_size=2, shuffle=True, seed=1)
    first = _ranks(2, dataset, **options)
    served = _served(first, batches=2)  # 8 samples
    second = _ranks(3, dataset, **options)
    for loader in second:
        loader.load_state_dict(first[0].state_dict())
    served += _served(second, batches=1)  # 6 more
    assert second[0].state_dict()["offset"] == 8
    third = _ranks(1, dataset, **options)
    third[0].load_state_dict(second[1].state_dict())
    served += _served(third)
    assert sorted(served) == list(range(30))


def test_a_loader_state_with_a_bad_world_size_or_offset_changes_nothing():
    data = TensorDataset(X, Y)
    loader = DistributedDataLoader(data, batch_size=8, comm=FakeRank(0, 2))
    good = loader.state_dict()
    for bad, message in (({"world_size": 0}, "world_size must be"), ({"offset": -1}, "offset must be"),
                         ({"world_size": 4, "position": 9}, "288 samples of the epoch served by 4 ranks"),
                         ({"world_size": 4, "batch_size": 5}, "batch_size=5")):
        with pytest.raises((ValueError, TypeError), match=message):
            loader.load_state_dict({**good, **bad})
        assert loader.state_dict() == good


def test_average_gradients_is_one_allreduce_and_keeps_dtypes():
    a = tt.tensor([1.0, 2.0], requires_grad=True)
    b = tt.tensor([[1.0]], requires_grad=True)
    a.grad, b.grad = tt.tensor([2.0, 4.0]), tt.tensor([[6.0]], dtype="float16")
    total = average_gradients([a, b], FakeRank(others=np.array([0.0, 2.0, 2.0, 1.0], np.float32)), extra=0.0)
    assert total == 1.0
    assert a.grad.numpy().tolist() == [1.0, 3.0] and b.grad.dtype == np.float16 and b.grad.item() == 4.0


def test_a_nonfinite_loss_on_another_rank_skips_the_step_everywhere():
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 3))
    strategy = DataParallel(FakeRank(others=np.concatenate([np.zeros(21, np.float32), [1.0]])))
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), strategy=strategy)
    before = [p.numpy() for p in model.parameters()]
    trainer.train_epoch(DataLoader(TensorDataset(X[:8], Y[:8]), batch_size=8))
    assert trainer.skipped_steps == 1 and all(np.array_equal(b, p.numpy()) for b, p in zip(before, model.parameters()))
    assert strategy.nonfinite_ranks == 1


def test_a_nonfinite_loss_on_another_rank_raises_on_every_rank_when_configured():
    """Under on_nonfinite="raise" a rank whose own loss is finite stops too (it would wait for the others)."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 3))
    strategy = DataParallel(FakeRank(size=4, others=np.concatenate([np.zeros(21, np.float32), [2.0]])))
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), strategy=strategy,
                         on_nonfinite="raise")
    with pytest.raises(FloatingPointError, match=r"loss is not finite on 2 of 4 ranks \(this rank's: [0-9.]+\)"):
        trainer.train_epoch(DataLoader(TensorDataset(X[:8], Y[:8]), batch_size=8))


def test_only_rank_0_writes_checkpoints(tmp_path):
    model = nn.Sequential(nn.Linear(6, 3))
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                         strategy=DataParallel(FakeRank(rank=1)))
    trainer.save_checkpoint(tmp_path / "rank1.ckpt")
    assert not (tmp_path / "rank1.ckpt").exists()


def test_one_rank_data_parallel_equals_plain_training():
    results = []
    for strategy in (None, DataParallel(SingleProcess())):
        tt.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                             strategy=strategy)
        trainer.fit(DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True, seed=0), epochs=2, progress=False)
        results.append([p.numpy() for p in model.parameters()])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


# -- under mpirun -n 2 ---------------------------------------------------------------------
def test_under_mpirun():
    """Runs the mpi_* tests below in two MPI ranks."""
    mpirun = find_mpirun()
    if mpirun is None:
        pytest.skip("needs mpi4py and mpirun (pip install mpi4py mpich)")
    env = {**os.environ, "TINYTRAIN_TEST_UNDER_MPI": "1"}
    command = [mpirun, "-n", "2", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-o", "addopts=",
               str(Path(__file__)), "-k", "mpi_"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("3 passed") == 2, result.stdout[-2000:]  # each rank ran the three mpi_ tests


mpi_only = pytest.mark.skipif(not UNDER_MPI, reason="runs in two ranks, launched by test_under_mpirun")


def mpi_trainer(batch_size, world, strategy=True, precision="32-true"):
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = tt.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    trainer = tt.Trainer(model, optimizer, nn.CrossEntropyLoss(), strategy=DataParallel(world) if strategy else None,
                         precision=precision)
    if strategy:
        data = DistributedDataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=True, seed=5, comm=world)
    else:
        data = DataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=True, seed=5)
    return trainer, data


@mpi_only
def test_mpi_two_ranks_at_64_equal_one_process_at_128():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    assert world.Get_size() == 2
    trainer, data = mpi_trainer(64, world)
    trainer.fit(data, epochs=3, progress=False)
    weights = np.concatenate([p.numpy().ravel() for p in trainer.model.parameters()])
    everyone = world.allgather(weights)
    np.testing.assert_array_equal(everyone[0], everyone[1])  # the ranks never drift apart
    single, loader = mpi_trainer(128, world, strategy=False)
    single.fit(loader, epochs=3, progress=False)
    expected = np.concatenate([p.numpy().ravel() for p in single.model.parameters()])
    np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)


@mpi_only
def test_mpi_resume_is_exact_and_only_rank_0_writes(tmp_path_factory):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    folder = Path(world.bcast(str(tmp_path_factory.mktemp("mpi")) if world.Get_rank() == 0 else None))
    straight, data = mpi_trainer(32, world)
    straight.fit(data, epochs=4, progress=False)

    first, data = mpi_trainer(32, world)
    first.fit(data, epochs=2, progress=False)
    first.save_checkpoint(folder / f"rank{world.Get_rank()}.ckpt")
    world.Barrier()
    assert sorted(path.name for path in folder.iterdir()) == ["rank0.ckpt"]
    resumed, data = mpi_trainer(32, world)
    resumed.load_checkpoint(folder / "rank0.ckpt")
    resumed.fit(data, epochs=4, progress=False)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@mpi_only
def test_mpi_mixed_precision_ranks_stay_identical():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    trainer, data = mpi_trainer(32, world, precision="16-mixed")
    trainer._amp.scaler.growth_interval = 3  # grow, overflow, back off: the ranks must agree on every skip
    with np.errstate(all="ignore"):
        trainer.fit(data, epochs=3, progress=False)
    everyone = world.allgather([p.numpy() for p in trainer.model.parameters()] + [trainer._amp.scaler.scale])
    for a, b in zip(*everyone):
        np.testing.assert_array_equal(a, b)
