"""Graded checks of Module 13 (scale): gradient checkpointing, dynamic loss scaling and
data parallelism.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 13``). Checkpointed gradients are compared with plain ones in
float64 (bit for bit, dropout included); the loss scaler is driven directly and
through ``MixedPrecision``; the distributed pieces run in this one process with
fake communicators built on the student's ``SingleProcess`` (no MPI needed).
"""
import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.course.checks import check

RNG = np.random.default_rng(0)
X = RNG.standard_normal((6, 5))


# -- gradient checkpointing -------------------------------------------------------------------

def float64_block(seed=0):
    tt.manual_seed(seed)
    block = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Dropout(0.5), nn.Linear(7, 3))
    for p in block.parameters():
        p.data = p.data.astype(np.float64)
    return block


def gradients(block, x, run):
    """Seed, run ``run(block, x)``, backpropagate sum(out**2); the input's and parameters' gradients."""
    tt.manual_seed(5)
    block.zero_grad()
    x.grad = None
    out = run(block, x)
    (out * out).sum().backward()
    return [x.grad.numpy()] + [p.grad.numpy() for p in block.parameters()]


@check(points=1, hint="Recompute.forward: save the function and capture_rng_state(), run the function on the "
                      "first `count` arrays (as Tensors) under no_grad, and return the output's array")
def test_checkpoint_forward(student):
    block = float64_block()
    x = tt.tensor(X, dtype="float64", requires_grad=True)
    tt.manual_seed(5)
    expected = block(x).numpy()
    inside = []

    def spy(t):
        out = block(t)
        inside.append(out.requires_grad)
        return out

    tt.manual_seed(5)
    out = student.checkpoint(spy, x)
    assert np.array_equal(out.numpy(), expected), "the checkpointed forward must compute the same values"
    assert inside == [False], "the segment must run once, under no_grad (no graph, no activations kept)"
    assert out.requires_grad and type(out._ctx).__name__ == "Recompute", "the output's node is the checkpoint"
    data = tt.tensor(X, dtype="float64")  # no input needs a gradient, but the weights do
    assert student.checkpoint(block, data).requires_grad


@check(points=3, hint="Recompute.backward: restore the saved rng state, re-run the function with gradients on "
                      "(_enable_grad) on fresh copies of the inputs, backward(grad) through it, return each input's "
                      "gradient (None for the anchor); the recomputed dropout masks must be the forward's")
def test_checkpoint_gradients_equal_plain(student):
    block = float64_block()
    x = tt.tensor(X, dtype="float64", requires_grad=True)
    plain = gradients(block, x, lambda b, t: b(t))
    ckpt = gradients(block, x, lambda b, t: student.checkpoint(b, t))
    for name, a, b in zip(["input"] + [n for n, _ in block.named_parameters()], plain, ckpt):
        assert np.array_equal(a, b), f"checkpointed gradient of {name} differs from the plain one (dropout masks?)"
    layered = gradients(block, x, lambda b, t: student.Checkpoint(b)(t))
    assert all(np.array_equal(a, b) for a, b in zip(plain, layered)), "Checkpoint(module) must match too"

    # two inputs, one of which needs no gradient; the segment adds into the weights' .grad
    w = tt.tensor(RNG.standard_normal((5, 5)), dtype="float64", requires_grad=True)
    y = tt.tensor(RNG.standard_normal((6, 5)), dtype="float64")
    results = []
    for wrap in (False, True):
        x.grad, w.grad = None, tt.tensor(np.ones((5, 5)), dtype="float64")  # an earlier gradient: accumulate onto it
        fn = lambda a, b: ((a @ w) * b).tanh()  # noqa: E731
        out = student.checkpoint(fn, x, y) if wrap else fn(x, y)
        (out * 3.0).sum().backward()
        results.append((x.grad.numpy(), w.grad.numpy(), y.grad))
    assert np.allclose(results[0][0], results[1][0], rtol=1e-12, atol=0) and \
        np.allclose(results[0][1], results[1][1], rtol=1e-12, atol=0), "gradients of several inputs and weights"
    assert results[1][2] is None, "an input that needs no gradient gets none"

    # a stack of checkpointed segments, the first fed by data that needs no gradient
    tt.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Dropout(0.3)) for _ in range(4)]
    for p in nn.Sequential(*layers).parameters():
        p.data = p.data.astype(np.float64)
    grads = []
    for model in (nn.Sequential(*layers), nn.Sequential(*[student.Checkpoint(nn.Sequential(a, b))
                                                          for a, b in zip(layers[::2], layers[1::2])])):
        tt.manual_seed(9)
        model.zero_grad()
        model(tt.tensor(X, dtype="float64")).sum().backward()
        grads.append([p.grad.numpy() for p in model.parameters()])
    assert len(grads[0]) == len(grads[1]) and all(np.array_equal(a, b) for a, b in zip(*grads)), \
        "nested checkpointed segments (first one fed by plain data) must give the plain gradients"


@check(points=1, hint="Recompute.backward: after recomputing with the SAVED rng state, put back the state that "
                      "training was at (capture it before restoring, restore it after, even on an error)")
def test_checkpoint_backward_leaves_the_rng_where_it_was(student):
    draws = []
    for wrap in (False, True):
        block = float64_block()
        x = tt.tensor(X, dtype="float64", requires_grad=True)
        tt.manual_seed(5)
        out = student.checkpoint(block, x) if wrap else block(x)
        between = tt.randn(4).numpy()  # training draws more numbers before backward runs
        out.sum().backward()
        draws.append((between, tt.randn(4).numpy(), np.random.rand()))
    assert np.array_equal(draws[0][0], draws[1][0])
    assert np.array_equal(draws[0][1], draws[1][1]) and draws[0][2] == draws[1][2], \
        "after backward the generators must continue as if the segment had not been recomputed"


# -- mixed precision: the loss scaler ---------------------------------------------------------

@check(points=2, hint="GradScaler.update: on overflow multiply scale by backoff_factor, reset clean_steps, count "
                      "skipped_steps; otherwise count a clean step and, at growth_interval of them in a row, multiply "
                      "scale by growth_factor and reset the count")
def test_grad_scaler_update(student):
    scaler = student.GradScaler(init_scale=8.0, growth_interval=3)
    scaler.update(found_inf=True)
    assert scaler.scale == 4.0 and scaler.clean_steps == 0 and scaler.skipped_steps == 1, "halve on overflow"
    scaler.update(False), scaler.update(False)
    assert scaler.scale == 4.0 and scaler.clean_steps == 2, "no growth before growth_interval clean steps"
    scaler.update(False)
    assert scaler.scale == 8.0 and scaler.clean_steps == 0, "grow after exactly growth_interval clean steps"
    scaler.update(False), scaler.update(False), scaler.update(True)
    assert scaler.scale == 4.0 and scaler.clean_steps == 0 and scaler.skipped_steps == 2, "overflow restarts the run"
    scaler.update(False), scaler.update(False)
    assert scaler.scale == 4.0, "the run of clean steps starts again after an overflow"
    scaler.update(False)
    assert scaler.scale == 8.0

    custom = student.GradScaler(init_scale=1.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=1)
    scales = []
    for found_inf in (False, False, True, True, False):
        custom.update(found_inf)
        scales.append(custom.scale)
    assert scales == [3.0, 9.0, 2.25, 0.5625, 1.6875] and custom.skipped_steps == 2, scales


@check(points=2, hint="with 16-mixed, an overflowing step must be skipped (weights unchanged) and halve the scale; "
                      "clean steps unscale the gradients into float32 and grow the scale every growth_interval steps")
def test_mixed_precision_scaling(student):
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    reference = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    for a, b in zip(reference.parameters(), model.parameters()):
        a.data = b.data.copy()
    amp = student.MixedPrecision(scaler=student.GradScaler(init_scale=2.0**12, growth_interval=2))
    opt, ref_opt = optim.SGD(model.parameters(), lr=0.1), optim.SGD(reference.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    params = list(model.parameters())

    def step(inputs, targets):
        opt.zero_grad()
        loss = amp.forward_loss(model, loss_fn, tt.tensor(inputs), tt.tensor(targets))
        loss.backward()
        ok = amp.before_step(params, loss.item())
        if ok:
            opt.step()
        return ok

    before = [p.numpy().copy() for p in params]
    with np.errstate(over="ignore", invalid="ignore"):
        assert not step(np.full((8, 4), 6e4, np.float32), np.zeros(8, np.int64)), "float16 overflowed: skip"
    assert amp.scaler.scale == 2.0**11 and amp.scaler.skipped_steps == 1, amp.scaler
    assert all(np.array_equal(b, p.numpy()) for b, p in zip(before, params)), "a skipped step moves no weight"
    assert all(p.dtype == np.float32 for p in params), "master weights stay float32"

    inputs = RNG.standard_normal((16, 4)).astype(np.float32)
    targets = RNG.integers(0, 2, 16)
    scales = []
    for _ in range(4):
        assert step(inputs, targets)
        ref_opt.zero_grad()
        loss_fn(reference(tt.tensor(inputs)), tt.tensor(targets)).backward()
        for p, r in zip(params, reference.parameters()):
            assert p.grad.dtype == np.float32 and np.allclose(p.grad.numpy(), r.grad.numpy(), atol=2e-3), \
                "the unscaled gradient must match the float32 one"
        ref_opt.step()
        scales.append(amp.scaler.scale)
    assert scales == [2.0**11, 2.0**12, 2.0**12, 2.0**13], f"scale after each clean step: {scales}"

    tt.manual_seed(0)  # the Trainer's precision="16-mixed" uses the same scaler
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    trainer = tt.Trainer(model, optim.SGD(model.parameters(), lr=0.1), loss_fn, precision="16-mixed")
    huge = TensorDataset(np.full((8, 4), 6e4, np.float32), np.zeros(8, np.int64))
    with np.errstate(over="ignore", invalid="ignore"):
        trainer.train_epoch(DataLoader(huge, batch_size=8))
    assert trainer.skipped_steps == 1 and trainer.step == 0


# -- data parallelism -------------------------------------------------------------------------

@check(points=2, hint="shard_indices: pad `order` to a multiple of world_size by wrapping around to its start, "
                      "then take every world_size-th entry from position rank")
def test_shard_indices(student):
    assert student.shard_indices(np.arange(8), 0, 2).tolist() == [0, 2, 4, 6]
    assert student.shard_indices(np.arange(8), 1, 2).tolist() == [1, 3, 5, 7]
    order = np.array([5, 3, 9, 1, 7])
    assert student.shard_indices(order, 0, 2).tolist() == [5, 9, 7]
    assert student.shard_indices(order, 1, 2).tolist() == [3, 1, 5], "pad by wrapping around to the start"
    assert student.shard_indices(order, 0, 1).tolist() == order.tolist()
    shards = [student.shard_indices(np.arange(10)[::-1], r, 4).tolist() for r in range(4)]
    assert shards == [[9, 5, 1], [8, 4, 0], [7, 3, 9], [6, 2, 8]], shards
    shards = [student.shard_indices(np.array([4, 2]), r, 5).tolist() for r in range(5)]
    assert shards == [[4], [2], [4], [2], [4]], "more ranks than samples: keep wrapping"


class FakeRank:
    """A communicator of ``size`` ranks seen from rank ``rank``; the other ranks' all-reduce
    contributions are ``others`` (an array added to ours), and every call is recorded."""

    def __init__(self, student, rank=0, size=2, others=None):
        self.rank, self.size, self.others, self.calls = rank, size, others, []
        self.base = student.SingleProcess()

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Allreduce(self, send, receive, op=None):
        self.calls.append(np.array(send, copy=True))
        receive[...] = send + (0 if self.others is None else self.others)

    def Bcast(self, buffer, root=0):
        self.base.Bcast(buffer, root)

    def bcast(self, value, root=0):
        return self.base.bcast(value, root)


@check(points=1, hint="DistributedDataLoader serves shard_indices of each epoch's order: every rank the same "
                      "number of batches, and together the ranks cover every sample")
def test_distributed_loader_shards(student):
    dataset = TensorDataset(np.arange(10, dtype=np.float32)[:, None], np.arange(10))
    seen, lengths = [], []
    for rank in range(3):
        loader = student.DistributedDataLoader(dataset, batch_size=2, shuffle=True, seed=4,
                                               comm=FakeRank(student, rank, 3))
        labels = [int(v) for _, y in loader for v in y.numpy()]
        assert len(labels) == 4, f"rank {rank} got {labels}: ceil(10 / 3) = 4 samples each"
        seen.append(labels)
        lengths.append(len(loader))
    assert lengths == [2, 2, 2]
    everything = sorted(v for labels in seen for v in labels)
    assert set(everything) == set(range(10)) and len(everything) == 12, seen
    order = DataLoader(dataset, batch_size=10, shuffle=True, seed=4)._epoch_order()
    assert seen == [student.shard_indices(order, r, 3).tolist() for r in range(3)]


@check(points=2, hint="average_gradients: pack every existing gradient (and `extra` last) into ONE float32 buffer, "
                      "one comm.Allreduce, then write each slice / world_size back into its gradient; return the "
                      "summed extra")
def test_average_gradients(student):
    a = tt.zeros((2, 3), requires_grad=True)
    b = tt.zeros(2, requires_grad=True)
    no_grad = tt.zeros(4, requires_grad=True)  # no gradient: skipped
    a.grad = tt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    b.grad = tt.tensor([10.0, -4.0])
    others = np.array([18, 17, 16, 15, 14, 13, 8, 16, 9], np.float32)  # the two other ranks' sums, extras last
    comm = FakeRank(student, rank=1, size=3, others=others)
    total = student.average_gradients([a, no_grad, b], comm, extra=1.0)
    assert len(comm.calls) == 1, f"one all-reduce for all gradients, not {len(comm.calls)}"
    sent = comm.calls[0]
    assert sent.dtype == np.float32 and sent.tolist() == [0, 1, 2, 3, 4, 5, 10, -4, 1], sent
    assert total == pytest.approx(10.0), "return the extra value summed over the ranks"
    assert a.grad.shape == (2, 3) and np.allclose(a.grad.numpy(), 6.0), f"{a.grad.numpy()}: the sum / world_size"
    assert np.allclose(b.grad.numpy(), [6, 4]), f"{b.grad.numpy()}: the sum over the ranks / world_size"
    assert a.grad.dtype == np.float32 and no_grad.grad is None

    single = tt.tensor([1.0, 2.0], requires_grad=True)
    single.grad = tt.tensor([0.5, -1.5])
    summed = student.average_gradients([single], student.SingleProcess())
    assert type(summed) is float and summed == 0.0, f"return a Python float, got {summed!r}"
    assert single.grad.numpy().tolist() == [0.5, -1.5], "one rank: the average is the gradient itself"
    on_device = tt.tensor([1.0, 2.0], requires_grad=True, device="strict")
    on_device.grad = tt.tensor([0.5, -1.5], device="strict")
    try:
        student.average_gradients([on_device], FakeRank(student, rank=0, size=2, others=np.array([1.5, 0.5, 0.0])))
    except TypeError as error:
        raise AssertionError(f"average_gradients of gradients on the strict device: {error}") from None
    assert on_device.grad.device == "strict:0" and on_device.grad.numpy().tolist() == [1.0, -0.5], \
        "a gradient on a device goes to the host for MPI (backend.to_host) and back (backend.from_host)"


@check(points=1, hint="DataParallel's step averages the gradients with average_gradients, whose return value (the "
                      "extra summed over the ranks) tells every rank whether some rank's loss was not finite")
def test_data_parallel_trainer(student):
    class Mirror(FakeRank):
        """Another rank with the same gradients; it reports a bad loss when told to."""

        bad = False

        def Allreduce(self, send, receive, op=None):
            self.calls.append(np.array(send, copy=True))
            receive[...] = 2 * send
            receive[-1] += 1.0 if self.bad else 0.0

    data = TensorDataset(RNG.standard_normal((32, 4)).astype(np.float32), RNG.integers(0, 2, 32))
    runs = []
    for strategy in (None, student.DataParallel(Mirror(student))):
        tt.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        trainer = tt.Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), strategy=strategy)
        trainer.train_epoch(DataLoader(data, batch_size=8))
        runs.append([p.numpy() for p in model.parameters()])
    assert len(strategy.comm.calls) == 4, "one all-reduce per step"
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(*runs)), "identical ranks take the single-process steps"
    strategy.comm.bad = True
    trainer = tt.Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), strategy=strategy)
    before = [p.numpy().copy() for p in model.parameters()]
    trainer.train_epoch(DataLoader(data, batch_size=8))
    assert trainer.skipped_steps == 4, "a bad loss on another rank must skip the step on every rank"
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters())), "skipped: no weight moves"
