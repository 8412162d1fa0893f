"""Graded checks of Module 18 (sharding): ZeRO's memory per rank, buckets, reduce-scatter and
all-gather, the global gradient norm, and the strategy's gather, reduce and step.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 18``). The collectives run on fake communicators that play the
other ranks; the strategy runs on one rank against DataParallel, with fakes that
bring another rank's flags, and on two ranks forked from this process
(``tinytrain.testing.ranks``: no MPI needed), against DataParallel on two ranks.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain import nn
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises
from tinytrain.data import TensorDataset, TokenWindows
from tinytrain.distributed import DataParallel, DistributedDataLoader, SingleProcess
from tinytrain.testing.ranks import run_ranks

RNG = np.random.default_rng(18)
INPUTS, LABELS = RNG.standard_normal((24, 4)).astype(np.float32), RNG.integers(0, 3, 24)
DATA = TensorDataset(INPUTS, LABELS)


class Recording(SingleProcess):
    """Rank ``rank`` of ``size``. The other ranks sent ``others``: added to this rank's buffer by
    Reduce_scatter_block (then block ``rank`` kept) and Allreduce, or put around this rank's shard, in rank
    order, by Allgather. Every call is recorded in ``calls`` with a copy of what this rank sent."""

    def __init__(self, rank=0, size=1, others=None):
        self.rank, self.size, self.others, self.calls = rank, size, others, []

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def _sum(self, send):
        return send if self.others is None else send + self.others

    def Allreduce(self, send, receive, op=None):
        self.calls.append(("Allreduce", np.array(send, copy=True)))
        receive[...] = self._sum(send)

    def Reduce_scatter_block(self, send, receive, op=None):
        self.calls.append(("Reduce_scatter_block", np.array(send, copy=True)))
        block = np.size(send) // self.size
        receive[...] = self._sum(send)[self.rank * block:(self.rank + 1) * block]

    def Allgather(self, send, receive):
        self.calls.append(("Allgather", np.array(send, copy=True)))
        others = np.zeros(np.size(send) * (self.size - 1), send.dtype) if self.others is None else self.others
        receive[...] = np.insert(others, self.rank * np.size(send), send)


def run(strategy, epochs=3, precision="32-true", device="cpu", clip=0.5, accumulation=2, data=DATA, scale=None):
    """A small MLP trained with AdamW by ``strategy`` on one rank (16-mixed: from the loss scale ``scale``, when
    given); the trainer."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)
    trainer = tt.Trainer(model, tt.optim.AdamW(model.parameters(), lr=0.05), nn.CrossEntropyLoss(),
                         strategy=strategy, precision=precision, grad_clip_norm=clip)
    if scale is not None:
        trainer._amp.scaler.scale = scale
    loader = DistributedDataLoader(data, batch_size=4, comm=SingleProcess(), device=device)
    with np.errstate(over="ignore", invalid="ignore"):
        trainer.fit(loader, epochs=epochs, accumulation_steps=accumulation, progress=False)
    return trainer


def weights(trainer, student):
    """The model's weights, gathered first at stage 3 (between steps it holds none)."""
    if isinstance(trainer.strategy, student.ZeRO) and trainer.strategy.stage == 3:
        trainer.strategy.gather_parameters(trainer.strategy.buckets)
    return [p.numpy() for p in trainer.model.parameters()]


# -- memory ------------------------------------------------------------------------------------------

@check(points=1, hint="zero_memory: stage 0 is DataParallel: 4Ψ, 4Ψ, 4kΨ; from stage 1 on the optimizer state is "
                      "4(k+1)Ψ/P (the shard of k arrays and of the float32 master); gradients: the full 4Ψ at "
                      "stages 0-1, plus 4Ψ/P at stages 1-3; parameters 4Ψ, but 0 at stage 3; and 'total'")
def test_zero_memory(student):
    psi, world = 1200, 4
    expected = {0: (4800, 4800, 9600), 1: (4800, 6000, 3600), 2: (4800, 1200, 3600), 3: (0, 1200, 3600)}
    for stage, (parameters, gradients, state) in expected.items():
        expect_equal(student.zero_memory(psi, world, stage),
                     {"parameters": parameters, "gradients": gradients, "optimizer_state": state,
                      "total": parameters + gradients + state},
                     f"zero_memory({psi}, world_size={world}, stage={stage}) with Adam (k=2)")
    expect_equal(student.zero_memory(psi, 3, 2, state_arrays=1)["optimizer_state"], 2 * 4 * psi / 3,
                 "the optimizer state at stage 2 on 3 ranks with SGD's momentum (k=1)")
    expect_equal(student.zero_memory(psi, 3, 0, state_arrays=0)["optimizer_state"], 0,
                 "DataParallel's optimizer state with plain SGD (k=0)")


# -- buckets -----------------------------------------------------------------------------------------

def bucket(student, world_size=3, rank=1, dtype="float32"):
    a = tt.zeros((2, 3), requires_grad=True, dtype=dtype)
    b = tt.zeros(2, requires_grad=True, dtype=dtype)
    return student.Bucket([a, b], world_size, rank), a, b


@check(points=1, hint="Bucket.flatten: a new zero vector of `padded` numbers in the bucket's dtype; each array "
                      "reshaped to one row in C order (whatever its memory order) goes at its offset; None stays zeros")
def test_bucket_flatten(student):
    flat_bucket, _, _ = bucket(student)
    matrix = np.arange(6.0).reshape(2, 3)
    expect_equal(flat_bucket.flatten([matrix, np.array([6.0, 7.0])]), np.array([0, 1, 2, 3, 4, 5, 6, 7, 0], np.float32),
                 "flatten of a (2, 3) matrix 0..5 and [6, 7] on 3 ranks (9 numbers, the last one padding)")
    expect_equal(flat_bucket.flatten([np.asfortranarray(matrix), None]).tolist(), [0, 1, 2, 3, 4, 5, 0, 0, 0],
                 "flatten of a column-major (2, 3) matrix and None (C order; None counts as zeros)")
    flat = flat_bucket.flatten([matrix.astype(np.float16), np.array([6, 7], np.float16)])
    expect_equal(flat.dtype, np.dtype(np.float32), "the dtype of a float32 bucket's vector from float16 arrays")
    wide, _, _ = bucket(student, dtype="float64")
    expect_equal(wide.flatten([matrix / 3, None]).dtype, np.dtype(np.float64), "the dtype of a float64 bucket's vector")
    source = np.ones(6, np.float32).reshape(2, 3)
    flat = flat_bucket.flatten([source, None])
    flat[0] = 5.0
    expect_equal(source[0, 0], 1.0, "an array that was flattened after its vector changed (a new vector, not a view)")


@check(points=1, hint="Bucket.unflatten: for each parameter in order, vector[start:start + size] reshaped to its "
                      "shape: views of the vector, no copies (it may be longer than numel: padding)")
def test_bucket_unflatten(student):
    flat_bucket, _, _ = bucket(student, world_size=4)
    vector = np.arange(12, dtype=np.float32)
    parts = flat_bucket.unflatten(vector)
    expect_equal([part.shape for part in parts], [(2, 3), (2,)], "the shapes of unflatten's arrays")
    expect_equal(parts[0], np.arange(6, dtype=np.float32).reshape(2, 3), "the first parameter's array")
    expect_equal(parts[1], np.array([6, 7], np.float32), "the second parameter's array")
    assert all(np.shares_memory(part, vector) for part in parts), "unflatten must return views of the vector, not copies"


# -- the collectives ----------------------------------------------------------------------------------

@check(points=2, hint="reduce_scatter: the bucket's gradients to the host (p.grad._backend.to_host; None counts "
                      "as zeros), bucket.flatten into one buffer, ONE comm.Reduce_scatter_block(send, receive) into "
                      "a receive array of shard_size numbers in the bucket's dtype, then divide by comm.Get_size()")
def test_reduce_scatter(student):
    flat_bucket, a, b = bucket(student, world_size=3, rank=2)
    a.grad = tt.tensor(np.arange(6.0).reshape(2, 3), device="strict")
    b.grad = tt.tensor([6.0, 8.0], dtype="float16")
    comm = Recording(rank=2, size=3, others=np.full(9, 3.0, np.float32))
    shard = student.reduce_scatter(flat_bucket, comm)
    expect_equal([name for name, _ in comm.calls], ["Reduce_scatter_block"], "the collectives of one reduce_scatter")
    expect_equal(comm.calls[0][1], np.array([0, 1, 2, 3, 4, 5, 6, 8, 0], np.float32),
                 "the buffer sent: the gradients flattened (float32), padded")
    expect_close(shard, [(6 + 3) / 3, (8 + 3) / 3, (0 + 3) / 3], "rank 2's shard of 3: (its block + the others' "
                 "block) / 3", dtype=np.float32)
    b.grad = None
    shard = student.reduce_scatter(flat_bucket, Recording(rank=0, size=3, others=np.zeros(9, np.float32)))
    expect_close(shard, [0, 1 / 3, 2 / 3], "rank 0's shard when another parameter has no gradient")


@check(points=1, hint="all_gather: a full array of `padded` numbers in the shard's dtype; ONE comm.Allgather of "
                      "the shard and the full array, both viewed as unsigned integers of the same size "
                      "(array.view(f'u{itemsize}')): a gather moves bytes, for any dtype")
def test_all_gather(student):
    flat_bucket, _, _ = bucket(student, world_size=3, rank=1)
    for dtype in (np.float16, np.float64):
        others = np.array([0, 1, 2, 6, 7, 8], dtype)
        comm = Recording(rank=1, size=3, others=others.view(f"u{others.itemsize}"))
        full = student.all_gather(flat_bucket, np.array([3, 4, 5], dtype), comm)
        expect_equal([name for name, _ in comm.calls], ["Allgather"], "the collectives of one all_gather")
        sent = comm.calls[0][1]
        expect_equal((sent.dtype.kind, sent.dtype.itemsize), ("u", np.dtype(dtype).itemsize),
                     f"(kind, itemsize) of the buffer all_gather sends for a {np.dtype(dtype)} shard: unsigned "
                     f"integers of the same size")
        expect_equal(full, np.arange(9, dtype=dtype), f"the gathered {np.dtype(dtype)} vector on rank 1 of 3, "
                                                      f"in rank order")


@check(points=2, hint="global_norm_and_flags: the sum of squares of every gradient (vdot on its device, one read "
                      "each; again in float64 if that overflows to inf), then ONE comm.Allreduce of a float64 buffer "
                      "[squares, *flags]; return (sqrt of the summed squares, the summed flags as a list of floats)")
def test_global_norm_and_flags(student):
    comm = Recording(size=2, others=np.array([11.0, 1.0, 0.0, 2.0]))
    gradients = [tt.tensor([1.0, 2.0]), tt.tensor([[0.0, 3.0]], device="strict"), tt.tensor([1.0], dtype="float16")]
    norm, flags = student.global_norm_and_flags(gradients, [0.0, 1.0, 0.0], comm)
    expect_equal([name for name, _ in comm.calls], ["Allreduce"], "the collectives of global_norm_and_flags")
    expect_equal((comm.calls[0][1].dtype.name, comm.calls[0][1].tolist()), ("float64", [15.0, 0.0, 1.0, 0.0]),
                 "(dtype, values) of the buffer all-reduced: this rank's sum of squares, then its flags")
    expect_close(norm, math.sqrt(15.0 + 11.0), "the norm: sqrt of the squares summed over the ranks")
    expect_equal((type(norm).__name__, flags, [type(f).__name__ for f in flags]),
                 ("float", [1.0, 1.0, 2.0], ["float"] * 3), "(type of the norm, the summed flags, their types)")
    norm, _ = student.global_norm_and_flags([tt.tensor([3e19, 4e19])], [], SingleProcess())
    expect_close(norm, 5e19, "the norm of a float32 gradient [3e19, 4e19], whose squares overflow float32", rtol=1e-6)
    norm, _ = student.global_norm_and_flags([tt.tensor([np.inf, 1.0])], [], SingleProcess())
    expect_equal(norm, math.inf, "the norm of a gradient holding inf")


# -- the strategy -----------------------------------------------------------------------------------

@check(points=2, hint="ZeRO.gather_parameters: per bucket, the master's data to the host (state_backend.to_host), "
                      "cast to compute_dtype when there is one, all_gather; then each parameter's data = "
                      "backend.from_host of its part (bucket.unflatten), np.asfortranarray where orders[id] is 'F'",
       after=("test_all_gather", "test_bucket_unflatten"))
def test_gather_parameters(student):
    for precision, device in (("32-true", "cpu"), ("16-mixed", "strict")):
        trainer = run(student.ZeRO(2, comm=SingleProcess()), epochs=0, precision=precision, device=device)
        strategy = trainer.strategy
        for bucket_, value in zip(strategy.buckets, (0.25, 0.5)):
            bucket_.master.data[...] = value
        strategy.comm = comm = Recording()
        strategy.gather_parameters(strategy.buckets)
        dtype = np.float16 if precision == "16-mixed" else np.float32
        expect_equal(len(comm.calls), len(strategy.buckets), "the Allgathers of gather_parameters: one per bucket")
        for name, param in trainer.model.named_parameters():
            column_major = param.data.flags.f_contiguous and not param.data.flags.c_contiguous
            expect_equal((param.device, param.dtype, column_major), (tt.get_backend(device).device, np.dtype(dtype),
                                                                     param.ndim == 2),
                         f"(device, dtype, column-major as Linear keeps its weight) of {name} gathered under "
                         f"{precision} on {device!r}")
            expect_equal(param.numpy(), np.full(param.shape, 0.25, dtype), f"{name} gathered from its master")
    comm = Recording(rank=0, size=2)  # the other rank's shards are zeros, until it sends nines
    trainer = run(student.ZeRO(1, comm=comm), epochs=0)
    strategy = trainer.strategy
    comm.others = np.full(strategy.buckets[0].shard_size, 9.0, np.float32).view("u4")
    strategy.buckets[0].master.data[...] = 1.0
    strategy.gather_parameters(strategy.buckets)
    gathered = np.concatenate([p.numpy().ravel() for p in trainer.model.parameters()])
    expect_equal(gathered[:strategy.buckets[0].shard_size].tolist(), [1.0] * strategy.buckets[0].shard_size,
                 "rank 0's own shard at the front of the gathered weights (rank 0 of 2)")
    expect_equal(set(gathered[strategy.buckets[0].shard_size:].tolist()), {9.0},
                 "the other rank's shard after it (rank 0 of 2)")


@check(points=2, hint="ZeRO.reduce_gradients: per bucket, reduce_scatter, to the masters' device "
                      "(state_backend.from_host); master.grad = it when the bucket is not accumulating, else add to "
                      "master.grad; set accumulating; from stage 2 on every parameter's .grad = None",
       after="test_reduce_scatter")
def test_reduce_gradients(student):
    for stage, offload in ((1, None), (2, "cpu"), (3, None)):
        comm = Recording(rank=0, size=2)
        trainer = run(student.ZeRO(stage, offload=offload, comm=comm), epochs=0, device="strict")
        strategy = trainer.strategy
        params = [p for b in strategy.buckets for p in b.params]
        for param, shape in zip(params, [shape for b in strategy.buckets for shape in b.shapes]):
            param.grad = tt.tensor(np.full(shape, 2.0), device="strict")
        comm.others = np.float32(4.0)  # the other rank's gradients are all 4
        strategy.reduce_gradients(strategy.buckets)
        master = strategy.buckets[0].master
        where = "cpu" if offload else "strict:0"
        expect_equal((master.grad.device, strategy.buckets[0].accumulating), (where, True),
                     f"(the device of master.grad, accumulating) after a reduction (stage {stage}, offload={offload})")
        expect_close(master.grad, np.full(master.shape, 3.0), "master.grad: this rank's 2 and the other's 4, "
                                                              "averaged over 2 ranks")
        kept = [p.grad is not None for p in params]
        expect_equal(kept, [stage == 1] * len(params), f"which parameters keep .grad after stage {stage}'s reduction")
        for param, shape in zip(params, [shape for b in strategy.buckets for shape in b.shapes]):
            param.grad = tt.tensor(np.full(shape, 2.0), device="strict")
        strategy.reduce_gradients(strategy.buckets)  # a second micro-batch of the same step adds
        expect_close(master.grad, np.full(master.shape, 6.0), "master.grad after two reductions in one step")
        strategy.buckets[0].accumulating = False  # a new step: the first reduction replaces
        strategy.reduce_gradients(strategy.buckets[:1])
        expect_close(master.grad, np.full(master.shape, 3.0 if stage == 1 else 2.0),
                     "master.grad after the first reduction of a new step (the old one is replaced)")


class OnceFlagged(SingleProcess):
    """One rank's data, but the first Allreduce of a run adds ``value`` at position ``slot``: another rank's
    flag (or, at 0, its squares)."""

    def __init__(self, slot, value=1.0):
        self.slot, self.value, self.calls = slot, value, 0

    def Allreduce(self, send, receive, op=None):
        receive[...] = send
        self.calls += 1
        if self.calls == 1:
            receive[self.slot] += self.value


def first_flags(comm):
    """The flags of the first Allreduce that ``comm`` (a Recording) recorded: what this rank sent after its squares."""
    return [call[1][1:].tolist() for call in comm.calls if call[0] == "Allreduce"][0]


def sgd_step(student, clip):
    """One SGD step (lr 100) of a bias-free Linear on inputs scaled by 1e-3 (a gradient norm near 1e-3), clipped
    at ``clip``: (the weight before, the weight after, the gradient norm)."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3, bias=False))
    before = model[0].weight.numpy().astype(np.float64)
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=100.0), nn.CrossEntropyLoss(),
                         strategy=student.ZeRO(2, comm=SingleProcess()), grad_clip_norm=clip)
    trainer.fit(DistributedDataLoader(TensorDataset(INPUTS * 1e-3, LABELS), batch_size=24, comm=SingleProcess()),
                max_steps=1, progress=False)
    return before, model[0].weight.numpy().astype(np.float64), trainer.history["grad_norm"][-1]


@check(points=3, hint="ZeRO.take_step: check_model, reduce the buckets not yet accumulating, restore_masters and "
                      "unscale the masters with the precision's scaler, global_norm_and_flags with "
                      "[loss not finite, overflow], update_scale, nonfinite_ranks, trainer._plugins_allow, clip with "
                      "the global norm (norms.append), optimizer.step(), trainer.step += 1; finally stop every "
                      "bucket's accumulating and (stage 3) release the model's own parameters",
       after=("test_global_norm_and_flags", "test_gather_parameters", "test_reduce_gradients"))
def test_take_step(student):
    reference = run(DataParallel(SingleProcess()))
    for stage in (1, 2, 3):
        zero = run(student.ZeRO(stage, comm=SingleProcess()))
        for index, (a, b) in enumerate(zip(weights(reference, student), weights(zero, student))):
            expect_close(b, a, f"parameter {index} after 3 epochs of stage {stage} on one rank (DataParallel's "
                               f"weights: two micro-batches per step, clipped)", rtol=1e-5, atol=1e-6)
        expect_close(zero.history["grad_norm"], reference.history["grad_norm"], f"the gradient norms of stage {stage}",
                     rtol=1e-5)
        expect_equal(zero.step, reference.step, f"the steps taken at stage {stage}")
    unclipped = run(student.ZeRO(2, comm=SingleProcess()), epochs=1, clip=None)
    expect_equal(math.isnan(unclipped.history["grad_norm"][0]), True, "the grad_norm logged without clipping (nan: "
                                                                      "norms are appended only when clipping)")
    zero = run(student.ZeRO(3, comm=SingleProcess()), epochs=1)
    expect_equal([p.data.size for p in zero.model.parameters()], [0] * 4, "the sizes of the model's parameters "
                                                                          "after a stage-3 step (released)")
    # another rank's bad loss skips the step here too; the next step starts afresh
    runs = [run(strategy) for strategy in (DataParallel(OnceFlagged(-1)), student.ZeRO(2, comm=OnceFlagged(1)))]
    expect_equal([r.skipped_steps for r in runs], [1, 1], "skipped_steps when another rank's loss is not finite at "
                                                          "the first step (DataParallel, ZeRO)")
    expect_equal(runs[1].strategy.nonfinite_ranks, 0, "nonfinite_ranks at the last step")
    expect_close(runs[1].history["train_loss"], runs[0].history["train_loss"], "the train losses with a skipped "
                 "first step (a skipped step's loss is not counted: take_step returns False)", rtol=1e-5)
    for index, (a, b) in enumerate(zip(weights(runs[0], student), weights(runs[1], student))):
        expect_close(b, a, f"parameter {index} after a skipped first step (the next step's gradients replace the "
                           f"skipped one's)", rtol=1e-5, atol=1e-6)
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    raising = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), on_nonfinite="raise",
                         strategy=student.ZeRO(1, comm=OnceFlagged(1)))
    expect_raises(FloatingPointError, lambda: raising.train_epoch(DistributedDataLoader(DATA, batch_size=8,
                                                                                         comm=SingleProcess())),
                  "on_nonfinite='raise' when another rank's loss is not finite", mentions=("1 of 1 ranks",))
    # this rank's own non-finite loss goes into the flags, for the other ranks
    comm = Recording()
    run(student.ZeRO(2, comm=comm), epochs=1, data=TensorDataset(np.where(np.arange(24)[:, None] == 0, np.nan,
                                                                          INPUTS).astype(np.float32), LABELS))
    expect_equal(first_flags(comm), [1.0, 0.0], "the flags this rank sends when its loss is nan (loss not finite, "
                                                "overflow)")
    # a gradient norm that is not finite (another rank's inf) skips the step, with a reason
    runs = [run(student.ZeRO(2, comm=OnceFlagged(0, math.inf)), epochs=1), run(DataParallel(SingleProcess()), epochs=1)]
    expect_equal(runs[0].skipped_steps, 1, "skipped_steps when the gradient norm over the ranks is inf")
    raising = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), on_nonfinite="raise",
                         strategy=student.ZeRO(1, comm=OnceFlagged(0, math.inf)), grad_clip_norm=1.0)
    expect_raises(FloatingPointError, lambda: raising.train_epoch(DistributedDataLoader(DATA, batch_size=8,
                                                                                         comm=SingleProcess())),
                  "on_nonfinite='raise' when the gradient norm is inf", mentions=("the gradient norm is inf",))
    # clipping: a norm equal to the maximum is left alone; above it, the gradient is scaled by max / (norm + 1e-6)
    before, free, norm = sgd_step(student, 1e9)
    _, at_maximum, _ = sgd_step(student, norm)
    expect_equal(at_maximum, free, f"the weight after a step clipped at exactly its gradient norm ({norm:.6g})")
    _, half, _ = sgd_step(student, norm / 2)
    expect_close(half, before - (before - free) * (norm / 2) / (norm + 1e-6), "the weight after an SGD step "
                 "clipped at half the gradient norm (scaled by max_norm / (norm + 1e-6))", rtol=1e-5, atol=0)
    # another rank's float16 overflow: every rank skips and backs off alike
    runs = [run(strategy, precision="16-mixed") for strategy in (DataParallel(SingleProcess()),
                                                                 student.ZeRO(1, comm=OnceFlagged(2)))]
    expect_equal((runs[1].skipped_steps, runs[1]._amp.scaler.scale), (1, 2.0 ** 15),
                 "(skipped_steps, loss scale) of a 16-mixed run whose first step overflowed on another rank")
    expect_equal(runs[0]._amp.scaler.clean_steps, runs[1]._amp.scaler.clean_steps + 1,
                 "the clean steps of the scaler: one fewer than DataParallel's without the overflow")
    # this rank's own float16 overflow (a loss scale of 2^24: gradients above 65504)
    comm = Recording()
    overflowing = [run(strategy, precision="16-mixed", scale=2.0**24) for strategy in (DataParallel(SingleProcess()),
                                                                                      student.ZeRO(2, comm=comm))]
    expect_equal(first_flags(comm), [0.0, 1.0], "the flags this rank sends when its float16 gradients overflow")
    expect_equal([(r.skipped_steps, r._amp.scaler.scale) for r in overflowing][::-1],
                 [(r.skipped_steps, r._amp.scaler.scale) for r in overflowing],
                 "(skipped_steps, loss scale) of a 16-mixed run that overflows: ZeRO's, then DataParallel's")
    # a weight outside the optimizer gets its float32 master back at every step (restore_masters)
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    frozen = model[0].weight.numpy()
    trainer = tt.Trainer(model, tt.optim.AdamW(model[2].parameters(), lr=0.05), nn.CrossEntropyLoss(),
                         strategy=student.ZeRO(2, comm=SingleProcess()), precision="16-mixed")
    trainer.fit(DistributedDataLoader(DATA, batch_size=8, comm=SingleProcess()), max_steps=2, progress=False)
    expect_equal(model[0].weight.dtype, np.dtype(np.float32), "the dtype of a weight outside the optimizer after two "
                                                              "16-mixed steps (its float32 master is restored)")
    expect_equal(model[0].weight.numpy(), frozen, "a weight outside the optimizer after two 16-mixed steps")
    scaled = run(student.ZeRO(2, comm=SingleProcess()), precision="16-mixed")
    expect_close(scaled.history["train_loss"], runs[0].history["train_loss"], "16-mixed losses of ZeRO-2 (the "
                 "masters' gradients unscaled) and of DataParallel", rtol=1e-2)
    # a model that changed after the strategy attached
    changed = run(student.ZeRO(2, comm=SingleProcess()), epochs=0)
    changed.model.append(nn.Linear(3, 3))
    expect_raises(RuntimeError, lambda: changed.train_epoch(DistributedDataLoader(DATA, batch_size=8,
                                                                                  comm=SingleProcess())),
                  "a step after a layer was added to the model", mentions=("3.weight is new",))


CONFIG = tt.nn.GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)
TOKENS = RNG.integers(0, 13, 300)


def gpt_losses(comm, zero, stage):
    tt.manual_seed(0)
    model = tt.nn.GPT(CONFIG)
    strategy = DataParallel(comm) if stage == 0 else zero(stage, comm=comm)
    trainer = tt.Trainer(model, tt.optim.AdamW(tt.optim.weight_decay_groups(model.parameters(), 0.1), lr=3e-3),
                         lambda logits, targets: tt.nn.functional.cross_entropy(logits.reshape(-1, 13),
                                                                                targets.reshape(-1)),
                         strategy=strategy, grad_clip_norm=1.0)
    loader = DistributedDataLoader(TokenWindows(TOKENS, 8), batch_size=4, shuffle=True, seed=1, comm=comm)
    trainer.fit(loader, max_steps=6, eval_every=1, progress=False)
    return trainer.history["train_loss"]


@check(points=2, hint="Two ranks (forked processes): stages 1-3 must take DataParallel's steps on a GPT. Every rank "
                      "calls the same collectives in the same order (a rank that skips one waits forever); the "
                      "shards of the mean gradient are reduce-scattered, the new weights all-gathered",
       after="test_take_step")
def test_two_ranks(student):
    reference = run_ranks(2, gpt_losses, None, 0, timeout=15)
    for stage in (1, 2, 3):
        try:
            losses = run_ranks(2, gpt_losses, student.ZeRO, stage, timeout=15)
        except RuntimeError as error:
            raise AssertionError(f"stage {stage} on two ranks stopped: {str(error)[-1500:]}") from None
        for rank in range(2):
            expect_close(losses[rank], reference[rank], f"rank {rank}'s losses over 6 steps of a GPT, stage {stage} "
                                                        f"on two ranks, against DataParallel", rtol=1e-5, atol=1e-6)
