"""Graded checks for Module 09 (training), run against the student's own code.

Schedules, clipping, the Trainer and the memory report come from the ``student``
fixture; models, losses, optimizers and data loaders come from the package
(modules 04-08). The checks pin down what simple textbook versions get wrong:
accumulation weighting (also for a short last window), the rate of each epoch
set at its start, per-sample loss means with a short last batch, eval mode
reaching nested layers, non-finite steps kept away from the weights. The
Trainer's given extension points (``_batch_loss``, ``_take_step``, mixed
precision, plugins) are not graded here; only the methods the student writes.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.testing.strict import host_reads
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises

RNG = np.random.default_rng(0)
X = RNG.standard_normal((256, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 256)
TOY = TensorDataset(X[:100], Y[:100])  # 100 samples: batches of 32 leave a short last one of 4


def toy_model():
    tt.manual_seed(0)  # the same initial weights every time
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def weights(model):
    return [p.numpy().copy() for p in model.parameters()]


def expect_same_weights(got, expected, what, atol=1e-6):
    for index, (a, b) in enumerate(zip(got, expected)):
        expect_close(a, b, f"{what} (parameter {index})", rtol=0, atol=atol)


def np_cross_entropy(logits, labels):
    """Per-sample cross-entropy in float64."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(labels)), labels]


def grad_norm(arrays):
    return math.sqrt(sum(float((np.asarray(a, np.float64) ** 2).sum()) for a in arrays))


class RecordedLoss:
    """Cross-entropy that remembers each batch's mean loss and size."""

    reduction = "mean"

    def __init__(self):
        self.inner, self.batches = nn.CrossEntropyLoss(), []

    def __call__(self, outputs, targets):
        loss = self.inner(outputs, targets)
        self.batches.append((loss.item(), len(targets)))
        return loss


# -- schedules --------------------------------------------------------------------------

@check(points=2, hint="CosineSchedule.get_lr(e) = min_lr + (max_lr - min_lr) * (1 + cos(pi * e / T)) / 2, so "
                      "epoch 0 gives max_lr, and every epoch >= total_epochs gives min_lr")
def test_cosine_schedule(student):
    schedule = student.CosineSchedule(max_lr=0.1, min_lr=0.01, total_epochs=4)
    expected = [0.01 + 0.09 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(5)] + [0.01] * 3
    expect_close([schedule.get_lr(e) for e in range(8)], expected,
                 "CosineSchedule(0.1, 0.01, total_epochs=4).get_lr(e) for e = 0..7", rtol=1e-12, atol=0)
    expect_close(schedule.get_lr(1000), 0.01, "get_lr(1000), long after total_epochs", rtol=1e-12, atol=0)
    one = student.CosineSchedule(max_lr=1.0, min_lr=0.0, total_epochs=1)
    expect_close([one.get_lr(e) for e in range(3)], [1.0, 0.0, 0.0],
                 "CosineSchedule(1.0, 0.0, total_epochs=1).get_lr(e) for e = 0, 1, 2", atol=1e-12)


@check(points=1, hint="warmup: epoch e < W trains at max_lr * (e + 1) / (W + 1); from epoch W the cosine runs "
                      "over the remaining T - W epochs, with e - W in place of e",
       after="test_cosine_schedule")
def test_cosine_schedule_warmup(student):
    schedule = student.CosineSchedule(max_lr=1.0, min_lr=0.1, total_epochs=10, warmup_epochs=3)
    expected = [0.25, 0.5, 0.75] + [0.1 + 0.9 * (1 + math.cos(math.pi * (e - 3) / 7)) / 2 for e in range(3, 10)]
    expect_close([schedule.get_lr(e) for e in range(12)], expected + [0.1, 0.1],
                 "CosineSchedule(1.0, 0.1, total_epochs=10, warmup_epochs=3).get_lr(e) for e = 0..11",
                 rtol=1e-12, atol=0)


@check(points=1, hint="CosineWarmRestarts: find the cycle that contains the epoch (cycle i lasts "
                      "first_cycle * cycle_mult**i epochs), then apply the cosine to the epochs since it began")
def test_cosine_warm_restarts(student):
    sgdr = student.CosineWarmRestarts(max_lr=1.0, min_lr=0.0, first_cycle=2, cycle_mult=2)
    # cycles: epochs 0-1 (length 2), 2-5 (length 4), 6-13 (length 8), 14-29 (length 16)
    starts, lengths = [0, 2, 6, 14], [2, 4, 8, 16]
    expected = []
    for e in range(30):
        cycle = max(i for i, s in enumerate(starts) if s <= e)
        expected.append((1 + math.cos(math.pi * (e - starts[cycle]) / lengths[cycle])) / 2)
    expect_close([sgdr.get_lr(e) for e in range(30)], expected,
                 "CosineWarmRestarts(1.0, 0.0, first_cycle=2, cycle_mult=2).get_lr(e) for e = 0..29", atol=1e-9)
    fixed = student.CosineWarmRestarts(max_lr=0.5, min_lr=0.1, first_cycle=3)
    expect_close([fixed.get_lr(e) for e in (0, 1, 3, 4, 7, 9)],
                 [0.5, 0.1 + 0.4 * 0.75, 0.5, 0.1 + 0.4 * 0.75, 0.1 + 0.4 * 0.75, 0.5],
                 "CosineWarmRestarts(0.5, 0.1, first_cycle=3).get_lr(e) for e = 0, 1, 3, 4, 7, 9", atol=1e-9)


# -- clipping -----------------------------------------------------------------------------

@check(points=2, hint="clip_grad_norm: one global L2 norm over every gradient (skip parameters whose grad is "
                      "None), its squares added up in float64 (float32 overflows above 1.8e19); only if it "
                      "exceeds max_norm (strictly), scale all gradients in place by max_norm / (norm + 1e-6) "
                      "(those in grads: parameters may be a generator, which runs only once), each keeping its "
                      "dtype (float64 is for the squares only); return the norm before clipping")
def test_clip_grad_norm(student):
    weights_ = tt.zeros(3, requires_grad=True)
    weights_.grad = tt.tensor([100.0, 200.0, 50.0])
    no_grad = tt.zeros(2, requires_grad=True)  # no gradient: skipped
    norm = student.clip_grad_norm([weights_, no_grad], max_norm=1.0)
    expect_close(norm, math.sqrt(52500), "clip_grad_norm of a gradient (100, 200, 50): the norm before clipping",
                 rtol=1e-6)
    expect_close(weights_.grad, np.array([100.0, 200.0, 50.0]) / (math.sqrt(52500) + 1e-6),
                 "(100, 200, 50) clipped to max_norm=1: the same direction, norm 1 (a float32 gradient stays "
                 "float32: float64 is for the sum of squares only)", rtol=1e-6, dtype=np.float32)
    assert no_grad.grad is None, f"a parameter without a gradient must keep grad None, got {no_grad.grad!r}"

    a, b = tt.zeros((2, 2), requires_grad=True), tt.zeros(1, requires_grad=True)
    a.grad, b.grad = tt.tensor([[3.0, 0.0], [0.0, 0.0]]), tt.tensor([4.0])
    expect_close(student.clip_grad_norm([a, b], max_norm=10.0), 5.0,
                 "the norm over all parameters, gradients [[3, 0], [0, 0]] and [4]")
    expect_equal(a.grad, np.array([[3.0, 0.0], [0.0, 0.0]], np.float32), "below max_norm nothing changes (a.grad)")
    expect_equal(b.grad, np.array([4.0], np.float32), "below max_norm nothing changes (b.grad)")
    expect_close(student.clip_grad_norm([a, b], max_norm=5.0), 5.0, "the norm 5 with max_norm=5")
    expect_equal(a.grad, np.array([[3.0, 0.0], [0.0, 0.0]], np.float32),
                 "a norm exactly equal to max_norm does not exceed it: nothing changes (a.grad)")
    expect_equal(b.grad, np.array([4.0], np.float32),
                 "a norm exactly equal to max_norm does not exceed it: nothing changes (b.grad)")
    expect_close(student.clip_grad_norm([a, b], max_norm=1.0), 5.0, "the norm before clipping to max_norm=1")
    expect_close(a.grad, np.array([[3.0, 0.0], [0.0, 0.0]]) / (5.0 + 1e-6),
                 "[[3, 0], [0, 0]] and [4] clipped to max_norm=1 (a.grad)", rtol=1e-6)
    expect_close(b.grad, np.array([4.0]) / (5.0 + 1e-6), "[[3, 0], [0, 0]] and [4] clipped to max_norm=1 (b.grad)",
                 rtol=1e-6)

    # a small norm shows the 1e-6 of max_norm / (norm + 1e-6)
    c = tt.zeros(2, requires_grad=True)
    c.grad = tt.tensor([6e-4, 8e-4])
    values = c.grad.numpy().astype(np.float64)
    small = float(np.linalg.norm(values))
    expect_close(student.clip_grad_norm([c], max_norm=1e-4), small, "the norm of (6e-4, 8e-4)", rtol=1e-5)
    expect_close(c.grad, values * 1e-4 / (small + 1e-6),
                 "(6e-4, 8e-4) clipped to max_norm=1e-4: each gradient times max_norm / (norm + 1e-6)",
                 rtol=1e-5, atol=0)

    # large but finite: the float32 sum of squares (1e42) would overflow to inf
    d = tt.zeros(100, requires_grad=True)
    d.grad = tt.tensor(np.full(100, 1e20, np.float32))
    expect_close(student.clip_grad_norm([d], max_norm=1.0), 1e21,
                 "the norm of 100 float32 gradients of 1e20 (finite gradients have a finite norm: add the "
                 "squares in float64)", rtol=1e-5)
    expect_close(d.grad, np.full(100, 0.1), "100 float32 gradients of 1e20 clipped to max_norm=1", rtol=1e-5,
                 dtype=np.float32)

    # model.parameters() is a list, but any iterable will do: a generator can be iterated only once
    e, f = tt.zeros(2, requires_grad=True), tt.zeros(1, requires_grad=True)
    e.grad, f.grad = tt.tensor([3.0, 0.0]), tt.tensor([4.0])
    expect_close(student.clip_grad_norm((p for p in (e, f)), max_norm=1.0), 5.0,
                 "clip_grad_norm of a generator of parameters, gradients [3, 0] and [4]")
    expect_close([*e.grad.numpy(), *f.grad.numpy()], np.array([3.0, 0.0, 4.0]) / (5.0 + 1e-6),
                 "the gradients [3, 0] and [4] after clip_grad_norm(a generator, max_norm=1)", rtol=1e-6)


@check(points=1, hint="a non-finite global norm (inf or nan) must leave every gradient untouched and be returned "
                      "(or, with error_if_nonfinite=True, raise FloatingPointError whose message gives the norm)")
def test_clip_grad_norm_nonfinite(student):
    a, b = tt.zeros(2, requires_grad=True), tt.zeros(1, requires_grad=True)
    a.grad, b.grad = tt.tensor([np.inf, 1.0]), tt.tensor([2.0])
    norm = student.clip_grad_norm([a, b], max_norm=1.0)
    assert math.isinf(norm), f"clip_grad_norm of gradients [inf, 1] and [2]: expected the norm inf, got {norm!r}"
    expect_equal(a.grad, np.array([np.inf, 1.0], np.float32), "a non-finite norm leaves the gradients alone (a.grad)")
    expect_equal(b.grad, np.array([2.0], np.float32), "a non-finite norm leaves the gradients alone (b.grad)")
    b.grad = tt.tensor([np.nan])
    norm = student.clip_grad_norm([a, b], max_norm=1.0)
    assert math.isnan(norm), f"clip_grad_norm of gradients [inf, 1] and [nan]: expected the norm nan, got {norm!r}"
    expect_equal(a.grad.numpy()[1], np.float32(1.0), "a nan norm leaves the gradients alone (a.grad[1])")
    expect_raises(FloatingPointError, lambda: student.clip_grad_norm([a, b], max_norm=1.0, error_if_nonfinite=True),
                  "clip_grad_norm(error_if_nonfinite=True) of a nan norm", mentions=("nan",))
    b.grad = tt.tensor([2.0])
    expect_raises(FloatingPointError, lambda: student.clip_grad_norm([a, b], max_norm=1.0, error_if_nonfinite=True),
                  "clip_grad_norm(error_if_nonfinite=True) of an inf norm", mentions=("inf",))
    expect_equal(b.grad, np.array([2.0], np.float32), "error_if_nonfinite=True leaves the gradients alone too")
    c = tt.zeros(2, requires_grad=True)
    c.grad = tt.tensor([3.0, 4.0])
    expect_close(student.clip_grad_norm([c], max_norm=1.0, error_if_nonfinite=True), 5.0,
                 "error_if_nonfinite=True with a finite norm: clip as usual and return the norm")


# -- the Trainer --------------------------------------------------------------------------------

def one_epoch(student, dataset, batch_size, accumulation_steps, loss_fn=None):
    model = toy_model()
    loss_fn = RecordedLoss() if loss_fn is None else loss_fn
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), loss_fn)
    loss = trainer.train_epoch(DataLoader(dataset, batch_size=batch_size), accumulation_steps)
    return loss, weights(model), trainer, loss_fn


@check(points=3, hint="_accumulate: before backward(), multiply each micro-batch's mean loss by "
                      "n_batch / n_window (its share of ALL samples in the window), not by 1/k and not by 1; "
                      "clear the gradients once per window, at its start")
def test_accumulation_equals_one_big_batch(student):
    full = TensorDataset(X, Y)  # 256 samples
    big_loss, big, big_trainer, _ = one_epoch(student, full, 128, 1)
    model = toy_model()  # the same two steps written out: fresh gradients for each
    for start in (0, 128):
        model.zero_grad()
        nn.CrossEntropyLoss()(model(tt.tensor(X[start:start + 128])), tt.tensor(Y[start:start + 128])).backward()
        optim.SGD(model.parameters(), lr=0.5).step()
    expect_same_weights(big, weights(model), "weights after 2 steps on batches of 128 vs the same steps by hand "
                                             "(each step on its own batch's gradient: clear them first)")
    loss, small, trainer, _ = one_epoch(student, full, 32, 4)
    expect_equal((trainer.step, big_trainer.step), (2, 2), "optimizer steps of (32 x 4 accumulated, 128 x 1)")
    expect_same_weights(small, big, "weights after batches of 32 with accumulation_steps=4 vs batches of 128")
    expect_close(loss, big_loss, "epoch loss of 32 x 4 accumulated vs 128 x 1", rtol=0, atol=1e-6)
    # 100 samples, batches of 32 with k=3: windows of 32+32+32 and of 4 -- the same steps as batches of 96 and 4
    big_loss, big, big_trainer, _ = one_epoch(student, TOY, 96, 1)
    loss, small, trainer, _ = one_epoch(student, TOY, 32, 3)
    expect_equal((trainer.step, big_trainer.step), (2, 2), "optimizer steps of (32 x 3 accumulated, 96 x 1)")
    expect_same_weights(small, big, "100 samples, batches of 32 with k=3 vs batches of 96: the short last window "
                                    "(4 samples) must be weighted by its own size, not 1/k")
    expect_close(loss, big_loss, "epoch loss of 32 x 3 accumulated vs 96 x 1", rtol=0, atol=1e-6)
    # k=2: windows of 32+32 and of 32+4 -- a window of unequal batches, the same steps as batches of 64 and 36
    big_loss, big, big_trainer, _ = one_epoch(student, TOY, 64, 1)
    loss, small, trainer, _ = one_epoch(student, TOY, 32, 2)
    expect_equal((trainer.step, big_trainer.step), (2, 2), "optimizer steps of (32 x 2 accumulated, 64 x 1)")
    expect_same_weights(small, big, "100 samples, batches of 32 with k=2 vs batches of 64: the window of a batch "
                                    "of 32 and one of 4 weights each by its share of the window's 36 samples "
                                    "(32/36 and 4/36), not 1/2")
    expect_close(loss, big_loss, "epoch loss of 32 x 2 accumulated vs 64 x 1", rtol=0, atol=1e-6)


@check(points=1, hint="_accumulate: a loss for which self._batch_loss says is_mean=False (reduction='sum' or "
                      "'none') is already a sum over the batch: weight it by 1 / n_window, not by n_batch / n_window",
       after="test_accumulation_equals_one_big_batch")
def test_accumulation_with_summed_losses(student):
    _, expected, _, _ = one_epoch(student, TOY, 96, 1)
    mean_loss, _, _, _ = one_epoch(student, TOY, 32, 3)
    for reduction in ("sum", "none"):
        loss, got, trainer, _ = one_epoch(student, TOY, 32, 3, nn.CrossEntropyLoss(reduction=reduction))
        expect_same_weights(got, expected, f"weights after an epoch with CrossEntropyLoss(reduction={reduction!r}), "
                                           "k=3, vs the mean loss on batches of 96")
        expect_close(loss, mean_loss, f"epoch loss with reduction={reduction!r} vs with reduction='mean'",
                     rtol=0, atol=1e-5)


@check(points=2, hint="_accumulate returns the window's SUMMED per-sample loss: each batch's mean loss times its "
                      "size, added up (train_epoch divides the epoch's total by the number of samples)")
def test_epoch_loss_is_a_per_sample_mean(student):
    for accumulation_steps in (1, 2):
        loss, _, trainer, recorded = one_epoch(student, TOY, 32, accumulation_steps)
        sizes = [n for _, n in recorded.batches]
        expect_equal(sizes, [32, 32, 32, 4], "the sizes of the batches the loss saw (100 samples, batches of 32)")
        per_sample = sum(mean * n for mean, n in recorded.batches) / 100
        expect_close(loss, per_sample, f"train_epoch's loss with accumulation_steps={accumulation_steps}: the mean "
                                       f"per sample (not the mean of the batch means, "
                                       f"{np.mean([m for m, _ in recorded.batches]):.6f})", rtol=0, atol=1e-6)
        expect_equal((trainer.epoch, trainer.step), (1, 4 // accumulation_steps),
                     f"(epoch, step) after one epoch with accumulation_steps={accumulation_steps}")
        expect_equal(trainer.history["train_loss"], [loss], "history['train_loss']")


@check(points=1, hint="_accumulate must get every batch's loss from self._batch_loss(inputs, targets), not by "
                      "calling the model and the loss itself: Module 13's mixed precision plugs in there")
def test_accumulate_gets_every_loss_from_batch_loss(student):
    model = toy_model()
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss())
    seen = []
    given = trainer._batch_loss

    def recorded(inputs, targets):
        seen.append(len(inputs))
        return given(inputs, targets)

    trainer._batch_loss = recorded
    trainer.train_epoch(DataLoader(TOY, batch_size=32), accumulation_steps=2)
    expect_equal(seen, [32, 32, 32, 4], "the sizes of the batches that went through self._batch_loss")


class RecordingSGD(optim.SGD):
    """SGD that records the learning rate of every step it takes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def step(self):
        self.seen.append(self.lr)
        super().step()


@check(points=2, hint="every step of epoch e must use scheduler.get_lr(e): the rate is set at the START of the "
                      "epoch (epoch 0 trains at max_lr), recorded in history['learning_rates']",
       after=("test_cosine_schedule", "test_accumulation_equals_one_big_batch"))
def test_schedule_applied_at_the_start_of_each_epoch(student):
    model = toy_model()
    schedule = student.CosineSchedule(max_lr=0.4, min_lr=0.1, total_epochs=3)
    optimizer = RecordingSGD(model.parameters(), lr=1.0)
    trainer = student.Trainer(model, optimizer, nn.CrossEntropyLoss(), scheduler=schedule)
    trainer.fit(DataLoader(TOY, batch_size=50, shuffle=True, seed=0), epochs=4, progress=False)
    expected = [0.4, 0.1 + 0.3 * 0.75, 0.1 + 0.3 * 0.25, 0.1]
    expect_close(optimizer.seen, [lr for lr in expected for _ in range(2)],
                 "the rate of each of the 8 steps (2 per epoch) of CosineSchedule(0.4, 0.1, total_epochs=3)")
    expect_close(trainer.history["learning_rates"], expected, "history['learning_rates']")
    expect_equal((trainer.epoch, trainer.step), (4, 8), "(epoch, step) after fit(epochs=4)")


@check(points=2, hint="fit(max_steps=...) (given) runs on your methods: _clip_and_step counts every step taken in "
                      "self.step (a per-step schedule gives step t the rate get_lr(t), and max_steps and eval_every "
                      "count self.step); _accumulate returns the window's summed per-sample loss; CosineSchedule's "
                      "warmup and cosine hold for any whole number, steps as well as epochs",
       after=("test_cosine_schedule_warmup", "test_epoch_loss_is_a_per_sample_mean"))
def test_training_by_steps_with_a_schedule_over_steps(student):
    model = toy_model()
    schedule = student.CosineSchedule(max_lr=0.4, min_lr=0.1, total_epochs=6, warmup_epochs=2)
    optimizer, loss_fn = RecordingSGD(model.parameters(), lr=1.0), RecordedLoss()
    trainer = student.Trainer(model, optimizer, loss_fn, scheduler=schedule, scheduler_interval="step")
    val = DataLoader(TensorDataset(X[100:160], Y[100:160]), batch_size=40)
    history = trainer.fit(DataLoader(TOY, batch_size=25, shuffle=True, seed=0), val, max_steps=7, eval_every=3,
                          progress=False)
    cosine = [0.1 + 0.3 * (1 + math.cos(math.pi * (t - 2) / 4)) / 2 for t in range(2, 7)]
    expect_close(optimizer.seen, [0.4 / 3, 0.8 / 3] + cosine, "the rate of each of 7 steps of "
                 "CosineSchedule(0.4, 0.1, total_epochs=6, warmup_epochs=2) with scheduler_interval='step'")
    expect_equal(history["step"], [3, 6, 7], "history['step'] of fit(max_steps=7, eval_every=3)")
    seen = loss_fn.batches  # per row: its training batches of 25, then the evaluation's of 40 and 20
    batches = [seen[0:3], seen[5:8], seen[10:11]]
    expect_close(history["train_loss"], [sum(m * n for m, n in b) / sum(n for _, n in b) for b in batches],
                 "history['train_loss']: the mean loss per sample of each row's steps", rtol=1e-5)
    expect_close(history["eval_loss"][-1], trainer.evaluate(val)[0], "the last row's eval_loss (an evaluation of "
                 "the final model)", rtol=1e-6)


@check(points=2, hint="evaluate: run every batch under no_grad in eval mode (model.eval() reaches nested Dropout), "
                      "return (summed per-sample loss / samples, correct / samples), and leave every module in the "
                      "mode it had")
def test_evaluate_modes_and_per_sample_means(student):
    class GradSpy:
        """Cross-entropy that records whether its input carries a graph."""

        reduction = "mean"

        def __init__(self):
            self.tracked = []

        def __call__(self, outputs, targets):
            self.tracked.append(outputs.requires_grad)
            return nn.CrossEntropyLoss()(outputs, targets)

    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 3)))
    spy = GradSpy()
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.1), spy)
    loader = DataLoader(TOY, batch_size=32)  # 32, 32, 32, 4
    model.train()
    result = trainer.evaluate(loader)
    loss, accuracy = result
    expect_equal((type(loss).__name__, type(accuracy).__name__), ("float", "float"),
                 "the types evaluate returns (Python floats: logs write them as JSON)")
    expect_equal(trainer.evaluate(loader), result, "a second evaluate (a nested Dropout must be off in evaluate)")
    expect_equal([m.training for m in model.modules()], [True] * 5, "every module's mode after evaluate (training)")
    assert spy.tracked and not any(spy.tracked), \
        f"evaluate must run under no_grad: expected outputs without a graph, got requires_grad {spy.tracked}"
    model.eval()
    with tt.no_grad():
        outputs = model(tt.tensor(X[:100])).numpy()
    model.train()
    expect_close(loss, np_cross_entropy(outputs, Y[:100]).mean(), "evaluate's loss: the mean per sample",
                 rtol=1e-5)
    expect_close(accuracy, np.mean(outputs.argmax(axis=1) == Y[:100]), "evaluate's accuracy, in [0, 1]")
    model[1].eval()  # a mixed state is restored as it was, too
    trainer.evaluate(loader)
    expect_equal([m.training for m in model.modules()], [True, True, False, False, False],
                 "every module's mode after evaluate of a model in a mixed state")


@check(points=1, hint="evaluate: one-sample batches count; a loss reduced by sum or not at all counts as it is "
                      "(self._reduce gives (loss, is_mean): only a mean is multiplied by the batch size); one-hot "
                      "targets count a hit where the argmax of the output row is that of the target row (_correct "
                      "does both kinds of target); outputs that are not (N, C) class scores give accuracy nan "
                      "(stop counting hits once _correct returns None); a loader without batches raises ValueError "
                      "saying it yielded no batches",
       after="test_evaluate_modes_and_per_sample_means")
def test_evaluate_edge_cases(student):
    model = toy_model()
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with tt.no_grad():
        outputs = model(tt.tensor(X[:1])).numpy()
    loss, accuracy = trainer.evaluate([(tt.tensor(X[:1]), tt.tensor(Y[:1]))])
    expect_close(loss, np_cross_entropy(outputs, Y[:1])[0], "evaluate's loss over one batch of one sample",
                 rtol=1e-5)
    expect_close(accuracy, float(outputs.argmax(axis=1)[0] == Y[0]), "evaluate's accuracy over one sample")
    expect_raises(ValueError, lambda: trainer.evaluate([]), "evaluate of a loader that yields no batches",
                  mentions=("no batches",))
    with tt.no_grad():
        outputs = model(tt.tensor(X[:100])).numpy()
    for reduction in ("sum", "none"):
        trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(reduction=reduction))
        loss, _ = trainer.evaluate(DataLoader(TOY, batch_size=32))
        expect_close(loss, np_cross_entropy(outputs, Y[:100]).mean(), f"evaluate's loss with "
                     f"CrossEntropyLoss(reduction={reduction!r}), batches of 32, 32, 32, 4: the mean per sample",
                     rtol=1e-5)
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.MSELoss())
    one_hot = np.eye(3, dtype=np.float32)[Y[:100]]
    _, accuracy = trainer.evaluate(DataLoader(TensorDataset(X[:100], one_hot), batch_size=32))
    expect_close(accuracy, np.mean(outputs.argmax(axis=1) == Y[:100]), "evaluate's accuracy with one-hot targets "
                 "(MSELoss, outputs (100, 3), target rows np.eye(3)[labels]): the same as with the labels")

    tt.manual_seed(0)
    regression = nn.Linear(6, 1)
    trainer = student.Trainer(regression, optim.SGD(regression.parameters(), lr=0.1), nn.MSELoss())
    targets = X[:10, :1] * 2.0
    with tt.no_grad():
        predicted = regression(tt.tensor(X[:10])).numpy().astype(np.float64)
    loss, accuracy = trainer.evaluate(DataLoader(TensorDataset(X[:10], targets), batch_size=4))
    expect_close(loss, ((predicted - targets) ** 2).mean(), "evaluate's loss of a regression (MSELoss, outputs "
                                                             "(N, 1)), batches of 4, 4, 2", rtol=1e-5)
    assert math.isnan(accuracy), f"evaluate's accuracy when the outputs are not class scores: expected nan, " \
                                 f"got {accuracy!r}"


@check(points=2, hint="_clip_and_step: if the window's loss is not finite (inf as well as nan: math.isfinite), "
                      "skip the step (self._skip) before clipping; when clipping, skip it too if clip_grad_norm "
                      "returns a non-finite norm, and append only finite norms; otherwise step and count "
                      "self.step. _accumulate clears the gradients at the start of every window, so a skipped "
                      "window's gradients never reach the next step",
       after="test_accumulation_equals_one_big_batch")
def test_nonfinite_loss_skips_the_step(student):
    class NanOnce:
        reduction = "mean"

        def __init__(self, bad=float("nan")):
            self.calls, self.bad = 0, bad

        def __call__(self, outputs, targets):
            self.calls += 1
            loss = nn.CrossEntropyLoss()(outputs, targets)
            return loss * self.bad if self.calls == 2 else loss

    def all_finite(model):
        return all(np.isfinite(p.numpy()).all() for p in model.parameters())

    for bad in (float("nan"), float("inf")):
        for clip in (None, 1.0):
            model = toy_model()
            trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanOnce(bad), grad_clip_norm=clip)
            with np.errstate(all="ignore"):
                trainer.train_epoch(DataLoader(TOY, batch_size=25))
            what = f"4 batches, the 2nd with a loss of {bad}, grad_clip_norm={clip}"
            expect_equal((trainer.skipped_steps, trainer.step, trainer.history["skipped_steps"]), (1, 3, [1]),
                         f"(skipped_steps, step, history['skipped_steps']) after {what}")
            assert all_finite(model), f"{what}: {bad} reached the weights (expected them finite)"
            if clip is not None:
                norm = trainer.history["grad_norm"][0]
                assert math.isfinite(norm), f"{what}: history['grad_norm'] is the mean of the steps taken, expected " \
                                            f"a finite number, got {norm} (a skipped step's norm was counted)"
    model = toy_model()
    strict = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanOnce(), on_nonfinite="raise")
    expect_raises(FloatingPointError, lambda: strict.train_epoch(DataLoader(TOY, batch_size=25)),
                  "a nan loss with on_nonfinite='raise'", mentions=("nan",))

    class InfiniteLossOnce(NanOnce):
        """An infinite loss whose gradient is finite: a constant inf added to it."""

        def __call__(self, outputs, targets):
            self.calls += 1
            loss = nn.CrossEntropyLoss()(outputs, targets)
            return loss + float("inf") if self.calls == 2 else loss

    for clip in (None, 1.0):
        model = toy_model()
        trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), InfiniteLossOnce(), grad_clip_norm=clip)
        with np.errstate(all="ignore"):
            trainer.train_epoch(DataLoader(TOY, batch_size=25))
        expect_equal((trainer.skipped_steps, trainer.step), (1, 3), f"(skipped_steps, step) after 4 batches, the 2nd "
                     f"with an inf loss whose gradient is finite, grad_clip_norm={clip} (the loss is checked first, "
                     "clipping or not)")

    class NanGradientOnce(NanOnce):
        """A finite loss whose gradient is nan once: d sqrt(u) / du is inf at u = 0, times 0."""

        def __call__(self, outputs, targets):
            self.calls += 1
            loss = nn.CrossEntropyLoss()(outputs, targets)
            return loss + (outputs * 0).sum().sqrt() if self.calls == 2 else loss

    model = toy_model()
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanGradientOnce(), grad_clip_norm=1.0)
    with np.errstate(all="ignore"):
        trainer.train_epoch(DataLoader(TOY, batch_size=25))
    expect_equal((trainer.skipped_steps, trainer.step), (1, 3),
                 "(skipped_steps, step) when the 2nd of 4 windows has a finite loss but a nan gradient norm")
    assert all_finite(model), "a nan gradient reached the weights (expected them finite)"
    norm = trainer.history["grad_norm"][0]
    assert math.isfinite(norm), f"history['grad_norm'] after a step skipped for its nan gradient norm: expected the " \
                                f"mean of the 3 steps taken, a finite number, got {norm} (append only finite norms)"
    model = toy_model()
    strict = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanGradientOnce(), grad_clip_norm=1.0,
                             on_nonfinite="raise")
    with np.errstate(all="ignore"):
        expect_raises(FloatingPointError, lambda: strict.train_epoch(DataLoader(TOY, batch_size=25)),
                      "a nan gradient norm with on_nonfinite='raise' (skipped through self._skip, which says where)",
                      mentions=("nan", "epoch 0 after 1 optimizer steps"))


@check(points=1, hint="with grad_clip_norm, clip the accumulated gradient once per step with clip_grad_norm, and "
                      "append the pre-clip norm it returns to the norms list (history['grad_norm'] is their mean)",
       after=("test_clip_grad_norm", "test_accumulation_equals_one_big_batch"))
def test_trainer_clips_the_accumulated_gradient(student):
    model = toy_model()
    before = weights(model)
    inputs, targets = tt.tensor(X[:64]), tt.tensor(Y[:64])
    nn.CrossEntropyLoss()(model(inputs), targets).backward()
    norm = grad_norm(p.grad.numpy() for p in model.parameters())
    model = toy_model()
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=1.0), nn.CrossEntropyLoss(),
                              grad_clip_norm=1e-3)
    trainer.train_epoch([(inputs[:32], targets[:32]), (inputs[32:], targets[32:])], accumulation_steps=2)
    expect_equal(trainer.step, 1, "optimizer steps for one window of 2 batches")
    expect_close(trainer.history["grad_norm"], [norm], "history['grad_norm']: the pre-clip norm of the window's "
                                                       "gradient (of the mean loss over its 64 samples)", rtol=1e-4)
    moved = grad_norm(a - b for a, b in zip(weights(model), before))
    expect_close(moved, 1e-3, "the length of the step, lr=1 with grad_clip_norm=1e-3", rtol=1e-3)


# -- memory and devices ------------------------------------------------------------------------


@check(points=1, hint="memory_report: sum p.data.nbytes over the parameters, p.grad.data.nbytes over the gradients "
                      "that exist, and every array in optimizer.state_dict() (use _array_bytes)")
def test_memory_report(student):
    for name, make, state_factor in (("SGD", lambda p: optim.SGD(p, lr=0.1), 0),
                                     ("SGD with momentum", lambda p: optim.SGD(p, lr=0.1, momentum=0.9), 1),
                                     ("Adam", lambda p: optim.Adam(p), 2)):
        model = toy_model()
        optimizer = make(model.parameters())
        size = sum(p.size for p in model.parameters()) * 4  # float32
        report = student.memory_report(model, optimizer)
        expect_equal({key: report[key] for key in ("parameters", "gradients", "optimizer_state")},
                     {"parameters": size, "gradients": 0, "optimizer_state": 0},
                     f"memory_report with {name} before any step (bytes)")
        nn.CrossEntropyLoss()(model(tt.tensor(X[:8])), tt.tensor(Y[:8])).backward()
        optimizer.step()
        report = student.memory_report(model, optimizer)
        expect_equal({key: report[key] for key in ("parameters", "gradients", "optimizer_state")},
                     {"parameters": size, "gradients": size, "optimizer_state": state_factor * size},
                     f"memory_report with {name} after one step (bytes)")
        expect_close(report["ratio"], 2 + state_factor, f"memory_report's ratio with {name} after one step")


@check(points=1, hint="compute on the tensors' device: clip_grad_norm with each gradient's backend (one host read per "
                      "device), the Trainer's methods through tensors and their backends, never np on device arrays",
       after=("test_clip_grad_norm", "test_accumulation_equals_one_big_batch", "test_evaluate_modes_and_per_sample_means"))
def test_training_runs_on_another_device(student):
    results = {}
    for device in ("cpu", "strict"):
        tt.manual_seed(0)
        model = toy_model().to(device)
        trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss(), grad_clip_norm=0.5)
        loader = DataLoader(TOY, batch_size=32, device=device)
        try:
            loss = trainer.train_epoch(loader, accumulation_steps=2)
            evaluation = trainer.evaluate(loader)
            for p in model.parameters():
                p.grad = p * 3.0
            before = host_reads()
            norm = student.clip_grad_norm(model.parameters(), 0.1)
            if device == "strict":
                expect_equal(host_reads() - before, 1, "host reads in clip_grad_norm of 4 gradients on one device "
                                                       "(add the squares up on the device, read the sum once)")
        except TypeError as error:
            raise AssertionError(f"training on the {device!r} device: expected no error, got TypeError: {error}") \
                from None
        results[device] = (loss, *evaluation, norm, weights(model), [p.grad.numpy() for p in model.parameters()])
    cpu, strict = results["cpu"], results["strict"]
    expect_close(strict[:4], cpu[:4], "(train loss, eval loss, accuracy, clip_grad_norm) on 'strict' vs on 'cpu'",
                 rtol=1e-5)
    expect_same_weights(strict[4], cpu[4], "weights trained on 'strict' vs on 'cpu'")
    expect_same_weights(strict[5], cpu[5], "gradients clipped on 'strict' vs on 'cpu'")


@check(points=1, hint="keep host reads out of the loops (on a GPU each one waits for the device): _accumulate "
                      "adds the losses up on the device and reads their sum once, after the loop (no .item() per "
                      "micro-batch); evaluate adds its loss and hit count up on the device and reads them at the end",
       after=("test_accumulation_equals_one_big_batch", "test_evaluate_modes_and_per_sample_means",
              "test_training_runs_on_another_device"))
def test_host_reads_stay_out_of_the_loops(student):
    model = toy_model().to("strict")
    # MSE on one-hot targets: a loss that reads nothing itself, so every read counted is the student's
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.1), nn.MSELoss())
    one_hot = np.eye(3, dtype=np.float32)[Y[:60]]
    batches = list(DataLoader(TensorDataset(X[:60], one_hot), batch_size=10, device="strict"))
    for size in (1, 4):
        before = host_reads()
        trainer._accumulate(batches[:size], model.parameters())
        expect_equal(host_reads() - before, 1, f"host reads in _accumulate over a window of {size} batches")
    reads = {}
    for size in (2, 6):
        before = host_reads()
        trainer.evaluate(batches[:size])
        reads[size] = host_reads() - before
    assert reads[2] == reads[6] <= 2, \
        f"evaluate must read its sums once, at the end: expected at most 2 host reads for 2 and for 6 batches, " \
        f"got {reads[2]} and {reads[6]}"
