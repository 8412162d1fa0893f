"""Graded checks of Module 13 (scale): gradient checkpointing, dynamic loss scaling and
data parallelism.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 13``). Checkpointed gradients are compared with plain ones in
float64 (bit for bit, dropout included); the loss scaler is driven directly and
through ``MixedPrecision``; the distributed pieces run in this one process with
fake communicators built on the student's ``SingleProcess`` (no MPI needed).
"""
import numpy as np

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises

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
                      "first `count` arrays (as Tensors) under no_grad, and return the output's array; a function "
                      "that returns anything but one Tensor raises TypeError naming what it returned")
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
    expect_equal(out.numpy(), expected, "checkpoint(block, x): the same values as block(x), dropout included")
    expect_equal(inside, [False], "requires_grad of the segment's output each time it ran during the forward "
                                  "(once, under no_grad: no graph, no activations kept)")
    expect_equal((out.requires_grad, type(out._ctx).__name__), (True, "Recompute"),
                 "(requires_grad, the type of the node) of checkpoint(block, x)'s output")
    data = tt.tensor(X, dtype="float64")  # no input needs a gradient, but the weights do
    expect_equal(student.checkpoint(block, data).requires_grad, True,
                 "requires_grad of checkpoint(block, data) when only the weights need a gradient")
    for result, name in (((lambda t: (t * 2.0, t)), "tuple"), ((lambda t: t.numpy()), "ndarray")):
        expect_raises(TypeError, lambda: student.checkpoint(result, x),
                      f"checkpoint of a function that returns a {name}", mentions=(name,))


@check(points=3, hint="Recompute.backward: restore the saved rng state, re-run the function with gradients on "
                      "(_enable_grad) on fresh copies of the inputs, backward(grad) through it, return each input's "
                      "gradient (None for the anchor; None for all when the recomputed output needs no "
                      "gradient); the recomputed dropout masks must be the forward's",
       after="test_checkpoint_forward")
def test_checkpoint_gradients_equal_plain(student):
    block = float64_block()
    x = tt.tensor(X, dtype="float64", requires_grad=True)
    plain = gradients(block, x, lambda b, t: b(t))
    ckpt = gradients(block, x, lambda b, t: student.checkpoint(b, t))
    names = ["input"] + [n for n, _ in block.named_parameters()]
    for name, a, b in zip(names, plain, ckpt):
        expect_equal(b, a, f"the gradient of {name} through checkpoint(block, x) (the plain one, bit for bit: "
                           f"the same dropout masks)")
    layered = gradients(block, x, lambda b, t: student.Checkpoint(b)(t))
    for name, a, b in zip(names, plain, layered):
        expect_equal(b, a, f"the gradient of {name} through Checkpoint(block)(x)")

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
    expect_close(results[1][0], results[0][0], "x.grad through checkpoint(fn, x, y), fn = tanh((x @ w) * y)",
                 rtol=1e-12, atol=0)
    for backend, anchor in student._anchors.items():
        assert anchor.grad is None, (f"the .grad of the anchor on {backend} after backward through checkpointed "
                                     f"segments: expected None (Recompute.backward returns None for the anchor), got "
                                     f"{anchor.grad!r}")
    expect_close(results[1][1], results[0][1], "w.grad (a weight fn uses, with an earlier gradient of ones) through "
                                               "checkpoint(fn, x, y)", rtol=1e-12, atol=0)
    assert results[1][2] is None, f"y.grad (y needs no gradient): expected None, got {results[1][2]!r}"

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
    expect_equal(len(grads[1]), len(grads[0]), "the number of parameters with a gradient in the checkpointed stack")
    for index, (a, b) in enumerate(zip(*grads)):
        expect_equal(b, a, f"the gradient of parameter {index} of a stack of checkpointed segments (the first fed "
                           f"by data that needs no gradient)")

    # a frozen segment fed by data: its recomputed output needs no gradient (nothing to backpropagate)
    tt.manual_seed(0)
    frozen, head = nn.Sequential(nn.Linear(5, 4), nn.Tanh()), nn.Linear(4, 2)
    for p in frozen.parameters():
        p.requires_grad = False
    head_grads = []
    for wrap in (False, True):
        head.zero_grad()
        features = student.checkpoint(frozen, tt.tensor(X)) if wrap else frozen(tt.tensor(X))
        try:
            head(features).sum().backward()
        except RuntimeError as error:
            raise AssertionError(f"head(checkpoint(frozen, data)).sum().backward() with every parameter of `frozen` "
                                 f"frozen: expected the head's gradient, got RuntimeError: {error} (when the "
                                 f"recomputed output needs no gradient, return None for every input)") from None
        head_grads.append(head.weight.grad.numpy())
    expect_close(head_grads[1], head_grads[0], "the head's weight gradient after a checkpointed frozen segment "
                 "fed by data", rtol=1e-6, atol=1e-7)

    # a residual: the segment's input is also used outside it (recompute on fresh leaves, not on the input itself)
    a = tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    h = a * 2
    try:
        (h + student.checkpoint(lambda t: t * t, h)).sum().backward()
    except RuntimeError as error:
        raise AssertionError(f"a.grad of sum(h + checkpoint(t*t, h)) with h = 2a: expected [10, 18], got "
                             f"RuntimeError: {error} (recompute on fresh leaves holding the inputs' arrays)") from None
    expect_close(a.grad, [10.0, 18.0], "a.grad of sum(h + checkpoint(t*t, h)) with h = 2a at a = [1, 2]")
    # backward under no_grad still records the recompute's graph
    a = tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    loss = student.checkpoint(lambda t: t * t, a).sum()
    with tt.no_grad():
        loss.backward()
    expect_close(a.grad, [2.0, 4.0], "a.grad of sum(checkpoint(t*t, a)) whose backward runs under no_grad "
                                     "(_enable_grad around the recompute)")
    # NumPy's global generator is one of 'every generator'
    a = tt.tensor([1.0, 1.0, 1.0], dtype="float64", requires_grad=True)
    np.random.seed(0)
    student.checkpoint(lambda t: t * tt.tensor(np.random.rand(3), dtype="float64"), a).sum().backward()
    np.random.seed(0)
    expect_close(a.grad, np.random.rand(3), "a.grad of sum(checkpoint(t * np.random.rand(3), a)) after "
                 "np.random.seed(0): the recompute draws NumPy's numbers again (capture_rng_state saves every generator)")


@check(points=1, hint="Recompute.backward: after recomputing with the SAVED rng state, put back the state that "
                      "training was at (capture it before restoring, restore it after, even on an error)",
       after="test_checkpoint_forward")
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
    expect_equal(draws[1][0], draws[0][0], "tt.randn(4) between the checkpointed forward and backward")
    expect_equal(draws[1][1], draws[0][1], "tt.randn(4) after the backward (the generators continue as if the "
                                           "segment had not been recomputed)")
    expect_equal(draws[1][2], draws[0][2], "np.random.rand() after the backward")

    runs = []

    def fails_when_recomputed(t):
        runs.append(t)
        if len(runs) == 2:
            raise MemoryError("out of memory in the recompute")
        return t * tt.randn(2, dtype="float64")  # draws: the saved state is behind where training is after it

    tt.manual_seed(3)
    out = student.checkpoint(fails_when_recomputed, tt.tensor([1.0, 2.0], dtype="float64", requires_grad=True))
    cpu = tt.get_backend("cpu")
    training_state = cpu.rng_state()
    expect_raises(MemoryError, lambda: out.sum().backward(), "backward of a segment whose recompute raises MemoryError")
    got = tt.randn(3).numpy()
    cpu.set_rng_state(training_state)
    expect_equal(got, tt.randn(3).numpy(), "tt.randn(3) after a recompute that raised MemoryError (put the state back "
                 "even on an error: try/finally)")


# -- mixed precision: the loss scaler ---------------------------------------------------------

@check(points=2, hint="GradScaler.update: on overflow multiply scale by backoff_factor, reset clean_steps, count "
                      "skipped_steps; otherwise count a clean step and, at growth_interval of them in a row, multiply "
                      "scale by growth_factor and reset the count")
def test_grad_scaler_update(student):
    scaler = student.GradScaler(init_scale=8.0, growth_interval=3)

    def state():
        return scaler.scale, scaler.clean_steps, scaler.skipped_steps

    scaler.update(found_inf=True)
    expect_equal(state(), (4.0, 0, 1), "(scale, clean_steps, skipped_steps) of GradScaler(8, growth_interval=3) "
                                       "after an overflow (halve)")
    scaler.update(False), scaler.update(False)
    expect_equal(state(), (4.0, 2, 1), "(scale, clean_steps, skipped_steps) after 2 clean steps (no growth yet)")
    scaler.update(False)
    expect_equal(state(), (8.0, 0, 1), "(scale, clean_steps, skipped_steps) after the 3rd clean step (grow)")
    scaler.update(False), scaler.update(False), scaler.update(True)
    expect_equal(state(), (4.0, 0, 2), "(scale, clean_steps, skipped_steps) after 2 clean steps and an overflow")
    scaler.update(False), scaler.update(False)
    expect_equal(state(), (4.0, 2, 2), "(scale, clean_steps, skipped_steps) after 2 more clean steps (the run "
                                       "started again at the overflow)")
    scaler.update(False)
    expect_equal(state(), (8.0, 0, 2), "(scale, clean_steps, skipped_steps) after a 3rd clean step in a row")

    tiny = student.GradScaler(init_scale=2.0**-24)
    tiny.update(found_inf=True)
    expect_equal(tiny.scale, 2.0**-25, "the scale of GradScaler(init_scale=2**-24) after an overflow (halve it even "
                 "below MIN_LOSS_SCALE: MixedPrecision then stops the run instead of skipping steps forever)")

    custom = student.GradScaler(init_scale=1.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=1)
    scales = []
    for found_inf in (False, False, True, True, False):
        custom.update(found_inf)
        scales.append(custom.scale)
    expect_equal((scales, custom.skipped_steps), ([3.0, 9.0, 2.25, 0.5625, 1.6875], 2),
                 "(scale after each update, skipped_steps) of GradScaler(1, growth_factor=3, backoff_factor=0.25, "
                 "growth_interval=1) updated with found_inf False, False, True, True, False")


@check(points=2, hint="with 16-mixed, an overflowing step must be skipped (weights unchanged) and halve the scale; "
                      "clean steps unscale the gradients into float32 and grow the scale every growth_interval steps",
       after="test_grad_scaler_update")
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
        taken = step(np.full((8, 4), 6e4, np.float32), np.zeros(8, np.int64))
    expect_equal(taken, False, "before_step after a float16 overflow (the step must be skipped)")
    expect_equal((amp.scaler.scale, amp.scaler.skipped_steps), (2.0**11, 1),
                 "(scale, skipped_steps) after an overflow from init_scale 2**12")
    for index, (b, p) in enumerate(zip(before, params)):
        expect_equal(p.numpy(), b, f"parameter {index} after a skipped step (no weight moves)")
    expect_equal([str(p.dtype) for p in params], ["float32"] * len(params), "the master weights' dtypes")

    inputs = RNG.standard_normal((16, 4)).astype(np.float32)
    targets = RNG.integers(0, 2, 16)
    scales = []
    for number in range(4):
        expect_equal(step(inputs, targets), True, f"before_step of clean step {number + 1}")
        ref_opt.zero_grad()
        loss_fn(reference(tt.tensor(inputs)), tt.tensor(targets)).backward()
        for index, (p, r) in enumerate(zip(params, reference.parameters())):
            expect_close(p.grad.numpy(), r.grad.numpy(), f"the unscaled float32 gradient of parameter {index} at "
                                                         f"clean step {number + 1} vs the float32 run's",
                         rtol=0, atol=2e-3, dtype=np.float32)
        ref_opt.step()
        scales.append(amp.scaler.scale)
    expect_equal(scales, [2.0**11, 2.0**12, 2.0**12, 2.0**13], "the scale after each of 4 clean steps "
                                                               "(growth_interval=2)")

    tt.manual_seed(0)  # the Trainer's precision="16-mixed" uses the same scaler
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    trainer = tt.Trainer(model, optim.SGD(model.parameters(), lr=0.1), loss_fn, precision="16-mixed")
    huge = TensorDataset(np.full((8, 4), 6e4, np.float32), np.zeros(8, np.int64))
    with np.errstate(over="ignore", invalid="ignore"):
        trainer.train_epoch(DataLoader(huge, batch_size=8))
    expect_equal((trainer.skipped_steps, trainer.step), (1, 0),
                 "(skipped_steps, step) of Trainer(precision='16-mixed') after one overflowing batch")


# -- data parallelism -------------------------------------------------------------------------

@check(points=2, hint="shard_indices: pad `order` to a multiple of world_size by wrapping around to its start, as "
                      "often as it takes ([4, 2] on 5 ranks pads to [4, 2, 4, 2, 4]), then take every world_size-th "
                      "entry from position rank")
def test_shard_indices(student):
    def shards(order, world_size):
        return [student.shard_indices(np.asarray(order), r, world_size).tolist() for r in range(world_size)]

    expect_equal(shards(range(8), 2), [[0, 2, 4, 6], [1, 3, 5, 7]], "shard_indices of 0..7 for ranks 0, 1 of 2")
    expect_equal(shards([5, 3, 9, 1, 7], 2), [[5, 9, 7], [3, 1, 5]],
                 "shard_indices of [5, 3, 9, 1, 7] for ranks 0, 1 of 2 (padded by wrapping around to the start)")
    expect_equal(shards([5, 3, 9, 1, 7], 1), [[5, 3, 9, 1, 7]], "shard_indices of [5, 3, 9, 1, 7] for one rank")
    expect_equal(shards(np.arange(10)[::-1], 4), [[9, 5, 1], [8, 4, 0], [7, 3, 9], [6, 2, 8]],
                 "shard_indices of 9..0 for ranks 0-3 of 4")
    expect_equal(shards([4, 2], 5), [[4], [2], [4], [2], [4]],
                 "shard_indices of [4, 2] for ranks 0-4 of 5 (more ranks than samples: keep wrapping)")


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
        if self.others is not None and np.shape(send) != self.others.shape:
            raise AssertionError(f"Allreduce: the other ranks send buffers of shape {self.others.shape}, rank "
                                 f"{self.rank} sent one of shape {np.shape(send)}: {np.asarray(send).tolist()}")
        receive[...] = send + (0 if self.others is None else self.others)

    def Bcast(self, buffer, root=0):
        self.base.Bcast(buffer, root)

    def bcast(self, value, root=0):
        return self.base.bcast(value, root)


@check(points=1, hint="DistributedDataLoader serves shard_indices of each epoch's order: every rank the same "
                      "number of batches, and together the ranks cover every sample",
       after="test_shard_indices")
def test_distributed_loader_shards(student):
    dataset = TensorDataset(np.arange(10, dtype=np.float32)[:, None], np.arange(10))
    seen, lengths = [], []
    for rank in range(3):
        loader = student.DistributedDataLoader(dataset, batch_size=2, shuffle=True, seed=4,
                                               comm=FakeRank(student, rank, 3))
        labels = [int(v) for _, y in loader for v in y.numpy()]
        expect_equal(len(labels), 4, f"the number of samples rank {rank} of 3 gets of 10 (ceil(10 / 3)); it got "
                                     f"{labels}")
        seen.append(labels)
        lengths.append(len(loader))
    expect_equal(lengths, [2, 2, 2], "len(loader) on ranks 0, 1, 2 (batches of 2)")
    expect_equal(sorted(set(v for labels in seen for v in labels)), list(range(10)),
                 f"the samples the 3 ranks see together ({seen})")
    order = DataLoader(dataset, batch_size=10, shuffle=True, seed=4)._epoch_order()
    expect_equal(seen, [student.shard_indices(order, r, 3).tolist() for r in range(3)],
                 "the labels each rank sees: shard_indices of the epoch's order")


@check(points=2, hint="average_gradients: pack every existing gradient (a parameter whose grad is None is left out "
                      "and keeps None) and `extra` last into ONE float32 buffer, one comm.Allreduce, then write each "
                      "slice / world_size back into its gradient; return the summed extra")
def test_average_gradients(student):
    a = tt.zeros((2, 3), requires_grad=True)
    b = tt.zeros(2, requires_grad=True)
    no_grad = tt.zeros(4, requires_grad=True)  # no gradient: skipped
    a.grad = tt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    b.grad = tt.tensor([10.0, -4.0])
    others = np.array([18, 17, 16, 15, 14, 13, 8, 16, 9], np.float32)  # the two other ranks' sums, extras last
    comm = FakeRank(student, rank=1, size=3, others=others)
    total = student.average_gradients([a, no_grad, b], comm, extra=1.0)
    expect_equal(len(comm.calls), 1, "the number of all-reduces for all gradients")
    sent = comm.calls[0]
    expect_close(sent, np.array([0, 1, 2, 3, 4, 5, 10, -4, 1], np.float32),
                 "the buffer sent to Allreduce: a's and b's gradients, then extra", dtype=np.float32)
    expect_close(total, 10.0, "average_gradients' return: extra summed over the ranks")
    expect_close(a.grad, np.full((2, 3), 6.0), "a.grad: the sum over the ranks / world_size", dtype=np.float32)
    expect_close(b.grad, [6.0, 4.0], "b.grad: the sum over the ranks / world_size")
    assert no_grad.grad is None, f"a parameter without a gradient: expected grad None, got {no_grad.grad!r}"
    precise = tt.zeros(2, dtype="float64", requires_grad=True)
    precise.grad = tt.tensor([0.1, 1 / 3], dtype="float64")
    comm = FakeRank(student, rank=0, size=1)
    student.average_gradients([precise], comm)
    rounded = np.array([0.1, 1 / 3], np.float32).astype(np.float64)
    expect_equal((comm.calls[0].dtype.name, precise.grad.dtype.name, precise.grad.numpy().tolist()),
                 ("float32", "float64", rounded.tolist()), "(the buffer's dtype, the gradient's dtype, its values) for "
                 "a float64 gradient [0.1, 1/3] on one rank: the buffer is float32 whatever the gradients' dtype, so "
                 "the gradient stays float64 with values rounded to float32")

    single = tt.tensor([1.0, 2.0], requires_grad=True)
    single.grad = tt.tensor([0.5, -1.5])
    summed = student.average_gradients([single], student.SingleProcess())
    expect_equal((type(summed).__name__, summed), ("float", 0.0), "(type, value) of average_gradients' return on "
                                                                  "one rank with extra=0")
    expect_equal(single.grad.numpy().tolist(), [0.5, -1.5], "the gradient averaged over one rank (itself)")
    on_device = tt.tensor([1.0, 2.0], requires_grad=True, device="strict")
    on_device.grad = tt.tensor([0.5, -1.5], device="strict")
    try:
        student.average_gradients([on_device], FakeRank(student, rank=0, size=2, others=np.array([1.5, 0.5, 0.0])))
    except TypeError as error:
        raise AssertionError(f"average_gradients of gradients on the strict device: expected no error, got "
                             f"TypeError: {error}") from None
    expect_equal((on_device.grad.device, on_device.grad.numpy().tolist()), ("strict:0", [1.0, -0.5]),
                 "(device, values) of a 'strict' gradient averaged over 2 ranks (to the host for MPI with "
                 "backend.to_host, back with backend.from_host)")


@check(points=1, hint="DataParallel's step averages the gradients with average_gradients, whose return value (the "
                      "extra summed over the ranks) tells every rank whether some rank's loss was not finite",
       after="test_average_gradients")
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
    expect_equal(len(strategy.comm.calls), 4, "the number of all-reduces in an epoch of 4 steps")
    for index, (a, b) in enumerate(zip(*runs)):
        expect_close(b, a, f"parameter {index} after an epoch with DataParallel over identical ranks vs one process",
                     rtol=0, atol=1e-6)
    strategy.comm.bad = True
    trainer = tt.Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), strategy=strategy)
    before = [p.numpy().copy() for p in model.parameters()]
    trainer.train_epoch(DataLoader(data, batch_size=8))
    expect_equal(trainer.skipped_steps, 4, "skipped_steps when another rank reports a bad loss at each of 4 steps")
    for index, (a, p) in enumerate(zip(before, model.parameters())):
        expect_equal(p.numpy(), a, f"parameter {index} after 4 skipped steps (no weight moves)")
