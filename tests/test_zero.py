"""ZeRO, sharded data parallelism (Module 18): ``tinytrain.sharding``.

Multi-rank tests run the ranks as forked processes (``tinytrain.testing.ranks``), so
they need no MPI. ``test_under_mpirun`` launches this file's ``mpi_*`` tests under
``mpirun -n 2`` and ``-n 4`` (they skip in a normal run), and is skipped, with the
reason, where mpi4py or mpirun is missing.
"""
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain import nn
from tinytrain.callbacks import ModelCheckpoint
from tinytrain.data import DataLoader, TensorDataset, TokenWindows
from tinytrain.distributed import DataParallel, DistributedDataLoader, SingleProcess, strategy_from_name
from tinytrain.serialization import read_checkpoint
from tinytrain.sharding import (Bucket, CommCounter, ShardedOptimizer, ZeRO, all_gather, memory_per_rank,
                                reduce_scatter, sharded_layers, zero_memory)
from tinytrain.testing.ranks import find_mpirun, run_ranks

ROOT = Path(__file__).resolve().parents[1]
UNDER_MPI = os.environ.get("TINYTRAIN_TEST_UNDER_MPI") == "1"
CONFIG = tt.nn.GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)
TOKENS = np.random.default_rng(0).integers(0, 13, 400)
RNG = np.random.default_rng(1)
X = RNG.standard_normal((48, 5)).astype(np.float32)
Y = RNG.integers(0, 3, 48)


def language_model_loss(logits, targets):
    return tt.nn.functional.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), targets.reshape(-1))


def gpt_trainer(comm, name, precision="32-true", device="cpu", clip=1.0, **options):
    """A tiny GPT with AdamW (decayed matrices, undecayed vectors) under strategy ``name`` on ``comm``."""
    tt.manual_seed(0)
    model = tt.nn.GPT(CONFIG).to(device)
    optimizer = tt.optim.AdamW(tt.optim.weight_decay_groups(model.parameters(), 0.1), lr=3e-3)
    trainer = tt.Trainer(model, optimizer, language_model_loss, strategy=strategy_from_name(name, comm),
                         grad_clip_norm=clip, precision=precision, **options)
    loader = DistributedDataLoader(TokenWindows(TOKENS, 8), batch_size=4, shuffle=True, seed=1, comm=comm,
                                   device=device)
    return trainer, loader


def optimizer_state_bytes(trainer):
    """The bytes of the optimizer's state arrays (Adam's moments), without ZeRO's master shards."""
    optimizer = trainer.optimizer.inner if isinstance(trainer.optimizer, ShardedOptimizer) else trainer.optimizer
    return sum(value.nbytes for state in optimizer.state_dict()["state"] for value in state.values()
               if isinstance(value, np.ndarray))


def train_gpt(comm, name, steps=20, **options):
    """Losses and gradient norms per step, the optimizer's state bytes, the largest bucket's share of them."""
    trainer, loader = gpt_trainer(comm, name, **options)
    with np.errstate(over="ignore", invalid="ignore"):
        trainer.fit(loader, max_steps=steps, eval_every=1, progress=False,
                    accumulation_steps=options.get("accumulation_steps", 1))
    strategy = trainer.strategy
    bucket = max((b.shard_size for b in getattr(strategy, "buckets", [])), default=0) * 4 * 2  # two moments
    scale = trainer._amp.scaler.scale if trainer._amp is not None else None
    return (trainer.history["train_loss"], trainer.history["grad_norm"], optimizer_state_bytes(trainer), bucket,
            scale, trainer.skipped_steps)


# -- what each rank holds -------------------------------------------------------------------------

def test_zero_memory_is_the_papers_accounting_in_float32():
    """Ψ(2 + 2 + 12)/P in the paper is float16 weights and gradients and Adam's float32 master, m and v;
    in float32 the masters are a shard next to 4-byte weights and gradients."""
    psi = 1_000_000
    assert zero_memory(psi, 8, 0) == {"parameters": 4e6, "gradients": 4e6, "optimizer_state": 8e6, "total": 16e6}
    assert zero_memory(psi, 8, 1)["optimizer_state"] == 3 * 4e6 / 8 and zero_memory(psi, 8, 1)["gradients"] == 4.5e6
    assert zero_memory(psi, 8, 2) == {"parameters": 4e6, "gradients": 0.5e6, "optimizer_state": 1.5e6, "total": 6e6}
    assert zero_memory(psi, 8, 3)["total"] == 16e6 / 8
    assert zero_memory(psi, 4, 3, state_arrays=1)["optimizer_state"] == 2 * 4e6 / 4  # SGD with momentum


@given(st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3), min_size=1, max_size=4), st.integers(1, 5))
def test_a_bucket_is_cut_into_equal_shards_that_cover_it(shapes, world_size):
    params = [tt.zeros(tuple(shape), requires_grad=True) for shape in shapes]
    buckets = [Bucket(params, world_size, rank) for rank in range(world_size)]
    numel = sum(p.size for p in params)
    assert buckets[0].padded % world_size == 0 and 0 <= buckets[0].padded - numel < world_size
    assert [b.start for b in buckets] == [rank * buckets[0].shard_size for rank in range(world_size)]
    arrays = [RNG.standard_normal(p.shape) for p in params]
    vector = buckets[0].flatten(arrays)
    assert vector.dtype == np.float32 and not vector[numel:].any()
    for array, back in zip(arrays, buckets[0].unflatten(vector)):
        np.testing.assert_array_equal(back, array.astype(np.float32))


def test_reduce_scatter_and_all_gather_on_three_ranks():
    def exchange(comm):
        rank = comm.Get_rank()
        a, b = tt.zeros((2, 2), requires_grad=True), tt.zeros(3, requires_grad=True)
        a.grad = tt.tensor(np.full((2, 2), rank, np.float32))
        b.grad = None if rank == 1 else tt.tensor(np.arange(3.0) * (rank + 1), dtype="float16")
        bucket = Bucket([a, b], comm.Get_size(), rank)
        shard = reduce_scatter(bucket, comm)
        return shard, all_gather(bucket, (shard * 10).astype(np.float16), comm)

    results = run_ranks(3, exchange)
    mean = np.concatenate([np.full(4, (0 + 1 + 2) / 3), np.arange(3.0) * (1 + 3) / 3, [0.0, 0.0]])  # 7 numbers, padded to 9
    for rank, (shard, full) in enumerate(results):
        np.testing.assert_allclose(shard, mean[rank * 3:(rank + 1) * 3], rtol=1e-6)
        assert shard.dtype == np.float32 and full.dtype == np.float16
        np.testing.assert_allclose(full, (mean * 10).astype(np.float16), rtol=1e-3)


# -- one rank: the same training as without ZeRO ------------------------------------------------------

OPTIMIZERS = {
    "sgd": lambda params: tt.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda params: tt.optim.Adam(params, lr=0.01, weight_decay=0.01),
    "adamw": lambda params: tt.optim.AdamW(tt.optim.weight_decay_groups(params, 0.1), lr=0.01),
}


def mlp_trainer(strategy, optimizer="adamw", device="cpu", clip=0.5, precision="32-true"):
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)
    return tt.Trainer(model, OPTIMIZERS[optimizer](model.parameters()), nn.CrossEntropyLoss(), strategy=strategy,
                      grad_clip_norm=clip, precision=precision)


def weights(trainer):
    """The model's weights on the host: for ZeRO gathered from the masters (as a checkpoint holds them)."""
    if isinstance(trainer.strategy, ZeRO):
        gathered = trainer.strategy.gather_state()  # a collective: every rank calls it, the writer gets it
        return None if gathered is None else list(gathered[0].values())
    return [p.numpy() for p in trainer.model.parameters()]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_one_rank_trains_as_without_zero(device, optimizer, stage):
    results = []
    for strategy in (None, ZeRO(stage, comm=SingleProcess())):
        trainer = mlp_trainer(strategy, optimizer, device)
        loader = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True, seed=2, device=device)
        trainer.fit(loader, epochs=2, accumulation_steps=2, progress=False)
        results.append((weights(trainer), trainer.history["grad_norm"], trainer.history["train_loss"]))
    (plain, plain_norms, plain_losses), (zero, zero_norms, zero_losses) = results
    for a, b in zip(plain, zero):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(zero_norms, plain_norms, rtol=1e-5)
    np.testing.assert_allclose(zero_losses, plain_losses, rtol=1e-5)


# -- several ranks: the same losses as DataParallel ---------------------------------------------------

@pytest.mark.parametrize("world_size", [2, 4])
def test_gpt_under_every_stage_trains_as_data_parallel_with_a_1_over_p_share_of_the_state(world_size):
    """20 AdamW steps of a tiny GPT, clipped: the losses and gradient norms of stages 1-3 are DataParallel's,
    and each rank's optimizer state is 1/P of DataParallel's, plus at most the padding of its buckets."""
    reference = run_ranks(world_size, train_gpt, "ddp")
    for name in ("zero1", "zero2", "zero3", "zero2_offload"):
        for rank, (got, expected) in enumerate(zip(run_ranks(world_size, train_gpt, name), reference)):
            np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6, err_msg=f"{name}, rank {rank}")
            np.testing.assert_allclose(got[1], expected[1], rtol=1e-4, err_msg=f"{name}, rank {rank}")
            state, dp_state, bucket = got[2], expected[2], got[3]
            assert dp_state / world_size <= state <= dp_state / world_size + bucket, (name, state, dp_state)


def test_mixed_precision_and_accumulation_under_zero_train_as_data_parallel():
    """16-mixed with a loss scale that grows every other step (so some steps overflow and are skipped on
    every rank alike), and windows of two micro-batches (stage 3 reduces each layer once per micro-batch)."""
    def run(comm, name):
        trainer, loader = gpt_trainer(comm, name, precision="16-mixed")
        trainer._amp.scaler.scale = 2.0 ** 30  # float16 overflows: steps are skipped until it has backed off
        trainer._amp.scaler.growth_interval = 2
        with np.errstate(over="ignore", invalid="ignore"):
            trainer.fit(loader, max_steps=8, eval_every=1, accumulation_steps=2, progress=False)
        return trainer.history["train_loss"], trainer._amp.scaler.scale, trainer.skipped_steps, trainer.model.wte.weight.dtype

    reference = run_ranks(2, run, "ddp")
    assert reference[0][2] > 0, "the scale must overflow at some step for this test to check the skips"
    for name in ("zero1", "zero2", "zero3_offload"):
        for got, expected in zip(run_ranks(2, run, name), reference):
            np.testing.assert_allclose(got[0], expected[0], rtol=2e-3)
            assert got[1:3] == expected[1:3] and got[3] == np.float16, (name, got[1:], expected[1:])


def test_a_nonfinite_loss_on_one_rank_skips_the_step_on_every_rank():
    def run(comm, on_nonfinite):
        tt.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 3))

        calls = []

        def loss(outputs, targets):  # rank 1's second loss is nan
            calls.append(len(calls))
            value = nn.functional.cross_entropy(outputs, targets)
            return value * float("nan") if comm.Get_rank() == 1 and len(calls) == 2 else value

        trainer = tt.Trainer(model, tt.optim.Adam(model.parameters(), lr=0.1), loss, strategy=ZeRO(2, comm=comm),
                             on_nonfinite=on_nonfinite)
        data = DistributedDataLoader(TensorDataset(X, Y), batch_size=8, comm=comm)
        try:
            trainer.fit(data, max_steps=3, progress=False)
        except FloatingPointError as error:
            return str(error)
        return trainer.skipped_steps, trainer.step

    assert run_ranks(2, run, "skip") == [(1, 3), (1, 3)]
    raised = run_ranks(2, run, "raise")
    assert all("the loss is not finite on 1 of 2 ranks" in message for message in raised), raised


# -- stage 3 -------------------------------------------------------------------------------------

def test_stage_3_gathers_layers_for_training_evaluation_and_generation():
    def run(comm, name):
        trainer, loader = gpt_trainer(comm, name)
        model = trainer.model
        layers = sharded_layers(model) if name == "zero3" else None
        trainer.fit(loader, max_steps=4, progress=False)
        held = [p.data.size for p in model.parameters()]
        evaluation = trainer.evaluate(DataLoader(TokenWindows(TOKENS[:60], 8), batch_size=8))
        tt.manual_seed(3)
        sample = model.generate(tt.tensor([[1, 2]]), 6).numpy()
        return layers and [type(layer).__name__ for layer in layers], held, evaluation, sample

    plain, zero3 = run_ranks(2, run, "ddp")[0], run_ranks(2, run, "zero3")[0]
    assert zero3[0] == ["Block", "Block"], "the blocks are the layers; the tied wte/lm_head weight stays outside"
    assert zero3[1] == [0] * len(zero3[1]), "between steps the model holds no parameters"
    np.testing.assert_allclose(zero3[2], plain[2], rtol=1e-5)
    np.testing.assert_array_equal(zero3[3], plain[3])


def test_sharded_layers_are_the_outermost_containers_items_that_own_their_parameters():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(shared, nn.Tanh()), shared)
    assert sharded_layers(model) == [model[0]], "the inner Sequential shares `shared` with the last item"
    gpt = tt.nn.GPT(CONFIG)
    assert sharded_layers(gpt) == list(gpt.h)


def test_gradcheck_through_a_stage_3_model():
    """A sharded layer's recomputed backward gives the input the gradient of the plain model (float64)."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)).to(dtype="float64")
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(),
                         strategy=ZeRO(3, comm=SingleProcess()))
    x = tt.tensor(RNG.standard_normal((3, 4)), dtype="float64", requires_grad=True)
    assert tt.gradcheck(lambda t: (trainer.model(t) ** 2).sum(), [x])
    masters = [bucket.master for bucket in trainer.strategy.buckets]
    assert all(master.dtype == np.float64 for master in masters)


def test_zero_2_on_two_ranks_steps_as_pytorch_adamw_on_the_whole_batch():
    torch = pytest.importorskip("torch")
    tt.manual_seed(0)
    reference = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    initial = [p.numpy() for p in reference.parameters()]

    def run(comm):
        tt.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
        trainer = tt.Trainer(model, tt.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1),
                             nn.CrossEntropyLoss(), strategy=ZeRO(2, comm=comm))
        trainer.fit(DistributedDataLoader(TensorDataset(X, Y), batch_size=12, comm=comm), epochs=3, progress=False)
        return weights(trainer)  # gathered on every rank (a collective), returned by rank 0

    ours = run_ranks(2, run)[0]
    layers = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    with torch.no_grad():
        for p, value in zip(layers.parameters(), initial):
            p.copy_(torch.from_numpy(value))
    optimizer = torch.optim.AdamW(layers.parameters(), lr=0.02, weight_decay=0.1)
    order = np.arange(48)  # no shuffle: ranks take every other sample, together the batch of 24
    for _ in range(3):
        for start in range(0, 48, 24):
            batch = order[start:start + 24]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(layers(torch.from_numpy(X[batch])), torch.from_numpy(Y[batch]))
            loss.backward()
            optimizer.step()
    for a, b in zip(ours, [p.detach().numpy() for p in layers.parameters()]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# -- checkpoints -------------------------------------------------------------------------------------

def fit_and_state(comm, name, steps, load=None, save=None, **options):
    """Train ``name`` to ``steps`` (after loading ``load``); save to ``save``; the gathered state on rank 0."""
    trainer, loader = gpt_trainer(comm, name, **options)
    if load is not None:
        trainer.load_checkpoint(load)
    trainer.fit(loader, max_steps=steps, progress=False)
    if save is not None:
        trainer.save_checkpoint(save)
    if isinstance(trainer.strategy, ZeRO):
        return trainer.strategy.gather_state(), trainer.history["train_loss"]
    state = trainer.model.state_dict(), trainer.optimizer.state_dict()
    return ({k: v.numpy() for k, v in state[0].items()}, state[1]), trainer.history["train_loss"]


def assert_same_state(a, b, exact=True):
    (model_a, optimizer_a), (model_b, optimizer_b) = a, b
    assert model_a.keys() == model_b.keys()
    compare = np.testing.assert_array_equal if exact else (lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6))
    for key in model_a:
        compare(model_a[key], model_b[key])
    assert optimizer_a["param_groups"] == optimizer_b["param_groups"] and optimizer_a["lr"] == optimizer_b["lr"]
    for state_a, state_b in zip(optimizer_a["state"], optimizer_b["state"]):
        assert state_a.keys() == state_b.keys()
        for key in state_a:
            compare(state_a[key], state_b[key])


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3"])
def test_a_resume_on_as_many_ranks_is_bit_identical(tmp_path, name):
    straight = run_ranks(2, fit_and_state, name, 10)[0]
    run_ranks(2, fit_and_state, name, 5, save=tmp_path / "half.ckpt")
    resumed = run_ranks(2, fit_and_state, name, 10, load=tmp_path / "half.ckpt")[0]
    assert_same_state(straight[0], resumed[0])


def test_a_two_rank_zero_2_checkpoint_resumes_on_one_and_four_ranks(tmp_path):
    """The file is one process's checkpoint: right after loading, every number of ranks holds exactly its state,
    and training goes on (the loaders share out the rest of the epoch)."""
    path = tmp_path / "zero2.ckpt"
    saved_state, _ = run_ranks(2, fit_and_state, "zero2", 5, save=path)[0]
    saved = read_checkpoint(path)
    gpt = tt.nn.GPT(CONFIG)
    assert saved["model"].keys() == gpt.state_dict().keys()  # one process's checkpoint
    assert saved["optimizer"]["optimizer"] == "AdamW" and len(saved["optimizer"]["state"]) == len(gpt.parameters())
    assert_same_state(saved_state, (saved["model"], saved["optimizer"]))
    for world_size, name in ((1, "zero2"), (4, "zero2"), (4, "zero3"), (1, "ddp"), (2, "zero1_offload")):
        loaded = run_ranks(world_size, fit_and_state, name, 5, load=path)[0]  # no step: at step 5 already
        assert_same_state(loaded[0], saved_state)
        _, losses = run_ranks(world_size, fit_and_state, name, 9, load=path)[0]
        assert len(losses) == 2 and math.isfinite(losses[1]), (world_size, name, losses)  # the saved row, a new one


def test_plain_and_data_parallel_checkpoints_load_into_zero(tmp_path):
    plain = run_ranks(1, fit_and_state, "ddp", 4, save=tmp_path / "plain.ckpt")[0]
    for world_size in (1, 3):
        loaded = run_ranks(world_size, fit_and_state, "zero3", 4, load=tmp_path / "plain.ckpt")[0]
        assert_same_state(loaded[0], (plain[0][0], plain[0][1]), exact=True)


@pytest.mark.parametrize("name", ["zero2", "zero3"])  # whole working weights, and placeholders
def test_a_checkpoint_that_does_not_fit_changes_nothing(tmp_path, name):
    def run(comm):
        trainer, loader = gpt_trainer(comm, name)
        trainer.fit(loader, max_steps=2, progress=False)
        trainer.save_checkpoint(tmp_path / "own.ckpt")
        trainer.load_checkpoint(tmp_path / "own.ckpt")  # the weights are now arrays of their own, no bucket's views
        before = trainer.strategy.gather_state()
        other_config = tt.nn.GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16)
        tt.manual_seed(1)
        other = tt.nn.GPT(other_config)
        other_trainer = tt.Trainer(other, tt.optim.AdamW(other.parameters()), language_model_loss)
        path = tmp_path / "other.ckpt"
        other_trainer.save_checkpoint(path)
        with pytest.raises(RuntimeError, match=r"missing h\.1\.ln_1\.weight"):
            trainer.load_checkpoint(path)
        same = tt.nn.GPT(CONFIG)
        tt.Trainer(same, tt.optim.Adam(same.parameters()), language_model_loss).save_checkpoint(tmp_path / "adam.ckpt")
        with pytest.raises(ValueError, match="cannot load the state of a Adam optimizer into a AdamW"):
            trainer.load_checkpoint(tmp_path / "adam.ckpt")
        assert_same_state(trainer.strategy.gather_state(), before)
        trainer.fit(loader, max_steps=3, progress=False)  # and it trains on
        return trainer.step

    assert run_ranks(1, run) == [3]


def test_model_checkpoint_on_every_rank_writes_once(tmp_path):
    def run(comm):
        trainer, loader = gpt_trainer(comm, "zero2")
        saver = ModelCheckpoint(tmp_path, keep_last=1, unit="step")
        trainer.fit(loader, max_steps=4, eval_every=2, callbacks=[saver], progress=False)
        return trainer.strategy.gather_state()

    state = run_ranks(2, run)[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000004.pkl"]
    saved = read_checkpoint(tmp_path / "step-0000004.pkl")
    assert_same_state(state, (saved["model"], saved["optimizer"]))


SAVE_LOOP = """
import sys
import numpy as np
import tinytrain as tt
from tinytrain.data import TensorDataset
from tinytrain.distributed import DistributedDataLoader, ZeRO
from tinytrain.testing.ranks import run_ranks

def run(comm):
    tt.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(5, 64), tt.nn.Tanh(), tt.nn.Linear(64, 3))
    trainer = tt.Trainer(model, tt.optim.AdamW(model.parameters()), tt.nn.CrossEntropyLoss(), strategy=ZeRO(2, comm=comm))
    data = TensorDataset(np.ones((16, 5), np.float32), np.zeros(16, np.int64))
    for steps in (1, 2):
        trainer.fit(DistributedDataLoader(data, batch_size=8, comm=comm), max_steps=steps, progress=False)
        trainer.save_checkpoint(sys.argv[1])

run_ranks(2, run, timeout=5)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint_whole(tmp_path):
    """Two ranks save twice; the writer is SIGKILLed before its first, second, ... file-system step (see
    tests/test_faults.py) until a run gets through. Whatever the step, the file is absent (before the first
    rename), the whole first checkpoint, or the whole second: never a part of one."""
    path = tmp_path / "zero.ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "faults"), os.environ.get("PYTHONPATH", "")]),
           "OPENBLAS_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # only the saves write files
    outcomes = []
    for kill_at in range(1, 20):
        path.unlink(missing_ok=True)
        result = subprocess.run([sys.executable, "-c", SAVE_LOOP, str(path)],
                                env={**env, "TINYTRAIN_KILL_AT": str(kill_at)}, capture_output=True, text=True,
                                timeout=120)
        outcomes.append(read_checkpoint(path)["step"] if path.exists() else None)
        if result.returncode == 0:
            break
        assert "rank 0 of 2 ended without a result (killed by signal 9)" in result.stderr, result.stderr[-2000:]
    first, second = outcomes.count(None), outcomes.count(1)
    assert outcomes == [None] * first + [1] * second + [2] * (len(outcomes) - first - second), outcomes
    assert first >= 2 and second >= 4, outcomes  # kills inside each save: its open, fsync, rename and more


# -- offloading ------------------------------------------------------------------------------------

def device_bytes(trainer, device):
    """The bytes of every array the trainer's model and optimizer hold on ``device`` (not the host)."""
    backend = tt.get_backend(device)
    arrays = [p.data for p in trainer.model.parameters()] + [p.grad.data for p in trainer.model.parameters()
                                                              if p.grad is not None]
    if isinstance(trainer.strategy, ZeRO):
        arrays += [b.master.data for b in trainer.strategy.buckets]
        arrays += [b.master.grad.data for b in trainer.strategy.buckets if b.master.grad is not None]
        arrays += [v for state in trainer.optimizer.inner.state for v in state.values() if backend.is_array(v)]
    return sum(a.nbytes for a in arrays if backend.is_array(a) and type(a) is not np.ndarray)


@pytest.mark.parametrize("device", ["strict", "fakecuda:0"])
def test_offload_keeps_the_optimizer_in_host_memory_and_trains_alike(device):
    if device.startswith("fakecuda"):
        from tinytrain.cuda import CupyBackend
        from tinytrain.testing.fake_cupy import register_fake_gpu
        register_fake_gpu(CupyBackend)
    results = {}
    for offload in (None, "cpu"):
        trainer = mlp_trainer(ZeRO(2, offload=offload, comm=SingleProcess()), device=device)
        trainer.fit(DataLoader(TensorDataset(X, Y), batch_size=8, device=device), epochs=2, progress=False)
        masters = [b.master for b in trainer.strategy.buckets]
        state = [v for s in trainer.optimizer.inner.state for v in s.values() if hasattr(v, "nbytes")]
        where = {m.device for m in masters} | {type(v).__module__.split(".")[0] for v in state}
        results[offload] = (weights(trainer), device_bytes(trainer, device), where,
                            sum(m.data.nbytes + m.grad.data.nbytes for m in masters) + sum(v.nbytes for v in state))
    (plain, plain_bytes, plain_where, held), (offloaded, offloaded_bytes, offloaded_where, _) = results.values()
    for a, b in zip(plain, offloaded):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    assert offloaded_where == {"cpu", "numpy"} and "cpu" not in plain_where
    assert plain_bytes - offloaded_bytes == held > 0  # the masters, their gradients and the moments left the device


# -- communication ---------------------------------------------------------------------------------

def test_stages_1_and_2_send_what_data_parallel_sends_and_stage_3_half_as_much_again():
    """Per step, in the ring algorithms' bytes: DataParallel's all-reduce sends 2(P-1)/P of the gradients;
    stages 1 and 2 a reduce-scatter and an all-gather, (P-1)/P each (plus padding); stage 3 gathers each
    layer twice (forward and backward), the rest of the model once."""
    def sent(comm, name):
        counter = CommCounter(comm)
        trainer, loader = gpt_trainer(counter, name, clip=None)
        trainer.fit(loader, max_steps=1, progress=False)
        counter.reset()
        trainer.fit(loader, max_steps=2, progress=False)
        buckets = [(b.padded, b.layer is not None) for b in getattr(trainer.strategy, "buckets", [])]
        return dict(counter.bytes), dict(counter.calls), buckets

    world_size, psi = 4, tt.nn.GPT(CONFIG).num_parameters()
    dp, dp_calls, _ = run_ranks(world_size, sent, "ddp")[0]
    assert dp_calls == {"Allreduce": 1} and dp["Allreduce"] == pytest.approx(2 * 3 / 4 * 4 * (psi + 1))
    share = 3 / 4 * 4  # (P - 1)/P of a float32 vector's bytes
    for name in ("zero1", "zero2", "zero3"):
        counted, calls, buckets = run_ranks(world_size, sent, name)[0]
        padded = sum(size for size, _ in buckets)
        layered = sum(size for size, in_layer in buckets if in_layer)
        assert counted["Reduce_scatter_block"] == pytest.approx(share * padded)
        expected_gather = share * (padded + layered) if name == "zero3" else share * padded
        assert counted["Allgather"] == pytest.approx(expected_gather), name
        assert calls["Allreduce"] == 1 and counted["Allreduce"] == pytest.approx(2 * 3 / 4 * 8 * 3)  # norm, 2 flags
        assert padded - psi < world_size * len(buckets)


def test_memory_per_rank_falls_with_the_stage_as_predicted():
    def held(comm, name):
        trainer, loader = gpt_trainer(comm, name)
        trainer.fit(loader, max_steps=2, progress=False)
        return memory_per_rank(trainer)

    psi, world_size = tt.nn.GPT(CONFIG).num_parameters(), 2
    for stage, name in enumerate(("ddp", "zero1", "zero2", "zero3")):
        measured = run_ranks(world_size, held, name)[0]
        predicted = zero_memory(psi, world_size, stage)
        for key in ("parameters", "gradients", "optimizer_state"):
            slack = 4 * 3 * world_size * 12  # padding: < P numbers per bucket, 3 arrays of them, at most 12 buckets
            assert predicted[key] <= measured[key] <= predicted[key] + slack, (name, key, measured, predicted)


# -- errors --------------------------------------------------------------------------------------

def test_bad_settings_are_named():
    for stage in (0, 4, True, "2"):
        with pytest.raises(ValueError, match=f"ZeRO stage must be 1, 2 or 3, got stage={stage!r}"):
            ZeRO(stage, comm=SingleProcess())
    with pytest.raises(ValueError, match="offload must be None or 'cpu' .*, got offload='disk'"):
        ZeRO(2, offload="disk", comm=SingleProcess())
    with pytest.raises(ValueError, match="unknown strategy 'zero4'; choose one of ddp, zero1, zero2, zero3"):
        strategy_from_name("zero4", SingleProcess())
    assert isinstance(strategy_from_name("ddp", SingleProcess()), DataParallel)
    zero = strategy_from_name("zero3_offload", SingleProcess())
    assert (zero.stage, zero.offload) == (3, "cpu") and tt.distributed.ZeRO is ZeRO


def test_what_zero_cannot_shard_is_named():
    model = nn.Sequential(nn.Linear(5, 3))

    class Custom:
        def step(self):
            pass

    with pytest.raises(TypeError, match="ZeRO shards a tinytrain optimizer .*, got a Custom"):
        tt.Trainer(model, Custom(), nn.CrossEntropyLoss(), strategy=ZeRO(1, comm=SingleProcess()))
    stray = tt.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"optimizer parameter 2 \(shape \(3,\)\) is not a parameter of the model"):
        tt.Trainer(model, tt.optim.SGD(model.parameters() + [stray], lr=0.1), nn.CrossEntropyLoss(),
                   strategy=ZeRO(1, comm=SingleProcess()))
    strategy = ZeRO(1, comm=SingleProcess())
    tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), strategy=strategy)
    with pytest.raises(RuntimeError, match="already runs a Trainer; give each Trainer a ZeRO of its own"):
        tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), strategy=strategy)


@pytest.mark.parametrize("change, message", [
    (lambda model: model.append(nn.Linear(3, 3)), r"1\.weight is new"),
    (lambda model: setattr(model[0], "bias", nn.Parameter(np.zeros(3))), r"0\.bias is new"),
    (lambda model: model.to("strict"), r"0\.weight moved to strict:0"),
])
def test_a_model_whose_parameters_changed_after_the_strategy_attached_is_refused(change, message):
    model = nn.Sequential(nn.Linear(5, 3))
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                         strategy=ZeRO(2, comm=SingleProcess()))
    change(model)
    loader = DataLoader(TensorDataset(X, Y), batch_size=8, device=model[0].weight.device)
    with pytest.raises(RuntimeError, match=rf"ZeRO: the model's parameters changed after the strategy attached "
                                           rf"\({message}\); build and place the model completely"):
        trainer.train_epoch(loader)


def test_a_stage_3_layer_takes_tensors_while_recording_and_shards_load_only_their_own_state():
    tt.manual_seed(0)
    model = tt.nn.GPT(CONFIG)
    trainer = tt.Trainer(model, tt.optim.AdamW(model.parameters()), language_model_loss,
                         strategy=ZeRO(3, comm=SingleProcess()))
    x = tt.randn(1, 4, 16)
    with pytest.raises(TypeError, match=r"ZeRO stage 3: Block was called with \['Tensor', 'LayerCache'\] while "
                                        r"recording gradients; .* takes tensors only"):
        model.h[0](x, tt.nn.transformer.LayerCache())
    with tt.no_grad():
        assert model.h[0](x, tt.nn.transformer.LayerCache()).shape == (1, 4, 16)
    plain = tt.optim.AdamW(tt.nn.GPT(CONFIG).parameters()).state_dict()
    with pytest.raises(ValueError, match="a ShardedOptimizer loads its own shards .*, got the state of 'AdamW'; a "
                                         "checkpoint's complete state loads with trainer.load_checkpoint"):
        trainer.optimizer.load_state_dict(plain)


# -- under mpirun ------------------------------------------------------------------------------------

@pytest.mark.skipif(find_mpirun() is None, reason="needs mpi4py and mpirun (pip install mpi4py mpich)")
@pytest.mark.parametrize("world_size", [2, 4])
def test_under_mpirun(world_size, tmp_path):
    """Runs the mpi_* tests below in ``world_size`` MPI ranks."""
    env = {**os.environ, "TINYTRAIN_TEST_UNDER_MPI": "1", "TINYTRAIN_TEST_FOLDER": str(tmp_path),
           "OPENBLAS_NUM_THREADS": "1"}
    command = [find_mpirun(), "-n", str(world_size), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
               "-o", "addopts=", str(Path(__file__)), "-k", "mpi_"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("2 passed") == world_size, result.stdout[-2000:]


mpi_only = pytest.mark.skipif(not UNDER_MPI, reason="runs in MPI ranks, launched by test_under_mpirun")


@mpi_only
def test_mpi_gpt_under_every_stage_trains_as_data_parallel():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    reference = train_gpt(world, "ddp")
    for name in ("zero1", "zero2", "zero3"):
        got = train_gpt(world, name)
        np.testing.assert_allclose(got[0], reference[0], rtol=1e-5, atol=1e-6, err_msg=name)
        assert reference[2] / world.Get_size() <= got[2] <= reference[2] / world.Get_size() + got[3]


@mpi_only
def test_mpi_a_zero_2_checkpoint_resumes_exactly_and_on_one_rank():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    path = Path(os.environ["TINYTRAIN_TEST_FOLDER"]) / "mpi.ckpt"
    straight = fit_and_state(world, "zero2", 6)[0]
    fit_and_state(world, "zero2", 3, save=path)
    world.Barrier()
    resumed = fit_and_state(world, "zero2", 6, load=path)[0]
    if world.Get_rank() == 0:
        assert_same_state(straight, resumed)
        single = fit_and_state(SingleProcess(), "zero2", 3, load=path)[0]
        assert_same_state(single, (read_checkpoint(path)["model"], read_checkpoint(path)["optimizer"]))
