"""Graded checks for Module 09 (training), run against the student's own code.

Schedules, clipping, the Trainer and the memory report come from the ``student``
fixture; models, losses, optimizers and data loaders come from the package
(modules 04-08). The checks pin down what simple textbook versions get wrong:
accumulation weighting (also for a short last window), the rate of each epoch
set at its start, per-sample loss means with a short last batch, eval mode
reaching nested layers, non-finite steps kept away from the weights.
"""
import math

import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.course.checks import check

RNG = np.random.default_rng(0)
X = RNG.standard_normal((256, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 256)
TOY = TensorDataset(X[:100], Y[:100])  # 100 samples: batches of 32 leave a short last one of 4


def toy_model():
    tt.manual_seed(0)  # the same initial weights every time
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def weights(model):
    return [p.numpy().copy() for p in model.parameters()]


def same_weights(a, b, atol=1e-6):
    return all(np.allclose(x, y, atol=atol, rtol=0) for x, y in zip(a, b))


def np_cross_entropy(logits, labels):
    """Per-sample cross-entropy in float64."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(labels)), labels]


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
    got = [schedule.get_lr(e) for e in range(8)]
    assert np.allclose(got, expected, rtol=1e-12), got
    assert schedule.get_lr(0) == pytest.approx(0.1) and schedule.get_lr(1000) == pytest.approx(0.01)
    one = student.CosineSchedule(max_lr=1.0, min_lr=0.0, total_epochs=1)
    assert [one.get_lr(e) for e in range(3)] == pytest.approx([1.0, 0.0, 0.0])


@check(points=1, hint="warmup: epoch e < W trains at max_lr * (e + 1) / (W + 1); from epoch W the cosine runs "
                      "over the remaining T - W epochs, with e - W in place of e")
def test_cosine_schedule_warmup(student):
    schedule = student.CosineSchedule(max_lr=1.0, min_lr=0.1, total_epochs=10, warmup_epochs=3)
    got = [schedule.get_lr(e) for e in range(12)]
    expected = [0.25, 0.5, 0.75] + [0.1 + 0.9 * (1 + math.cos(math.pi * (e - 3) / 7)) / 2 for e in range(3, 10)]
    assert np.allclose(got, expected + [0.1, 0.1], rtol=1e-12), got


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
    assert np.allclose([sgdr.get_lr(e) for e in range(30)], expected), [sgdr.get_lr(e) for e in range(30)]
    fixed = student.CosineWarmRestarts(max_lr=0.5, min_lr=0.1, first_cycle=3)
    assert np.allclose([fixed.get_lr(e) for e in (0, 1, 3, 4, 7, 9)],
                       [0.5, 0.1 + 0.4 * 0.75, 0.5, 0.1 + 0.4 * 0.75, 0.1 + 0.4 * 0.75, 0.5])


# -- clipping -----------------------------------------------------------------------------

@check(points=2, hint="clip_grad_norm: one global L2 norm over every gradient (skip parameters whose grad is "
                      "None); if it exceeds max_norm, scale all gradients in place by max_norm / (norm + 1e-6); "
                      "return the norm before clipping")
def test_clip_grad_norm(student):
    weights_ = tt.zeros(3, requires_grad=True)
    weights_.grad = tt.tensor([100.0, 200.0, 50.0])
    no_grad = tt.zeros(2, requires_grad=True)  # no gradient: skipped
    norm = student.clip_grad_norm([weights_, no_grad], max_norm=1.0)
    assert norm == pytest.approx(math.sqrt(52500), rel=1e-6), norm
    clipped = weights_.grad.numpy()
    assert np.linalg.norm(clipped) == pytest.approx(1.0, abs=1e-5) and no_grad.grad is None
    assert np.allclose(clipped, np.array([100.0, 200.0, 50.0]) / math.sqrt(52500), atol=1e-6), "keep the direction"
    a, b = tt.zeros((2, 2), requires_grad=True), tt.zeros(1, requires_grad=True)
    a.grad, b.grad = tt.tensor([[3.0, 0.0], [0.0, 0.0]]), tt.tensor([4.0])
    assert student.clip_grad_norm([a, b], max_norm=10.0) == pytest.approx(5.0), "the norm over all parameters"
    assert a.grad.numpy().tolist() == [[3.0, 0.0], [0.0, 0.0]] and b.grad.numpy().tolist() == [4.0], \
        "below max_norm nothing changes"
    assert student.clip_grad_norm([a, b], max_norm=1.0) == pytest.approx(5.0)
    assert np.allclose(a.grad.numpy(), [[0.6, 0.0], [0.0, 0.0]], atol=1e-6) and np.allclose(b.grad.numpy(), [0.8])


@check(points=1, hint="a non-finite global norm (inf or nan) must leave every gradient untouched and be returned "
                      "(or raise FloatingPointError with error_if_nonfinite=True)")
def test_clip_grad_norm_nonfinite(student):
    a, b = tt.zeros(2, requires_grad=True), tt.zeros(1, requires_grad=True)
    a.grad, b.grad = tt.tensor([np.inf, 1.0]), tt.tensor([2.0])
    assert math.isinf(student.clip_grad_norm([a, b], max_norm=1.0))
    assert a.grad.numpy()[1] == 1.0 and b.grad.numpy().tolist() == [2.0], "non-finite: leave the gradients alone"
    b.grad = tt.tensor([np.nan])
    assert math.isnan(student.clip_grad_norm([a, b], max_norm=1.0)) and a.grad.numpy()[1] == 1.0
    with pytest.raises(FloatingPointError):
        student.clip_grad_norm([a, b], max_norm=1.0, error_if_nonfinite=True)
    c = tt.zeros(2, requires_grad=True)
    c.grad = tt.tensor([3.0, 4.0])
    assert student.clip_grad_norm([c], max_norm=1.0, error_if_nonfinite=True) == pytest.approx(5.0)


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
    loss, small, trainer, _ = one_epoch(student, full, 32, 4)
    assert trainer.step == big_trainer.step == 2, (trainer.step, big_trainer.step)
    assert same_weights(small, big), "32 x 4 accumulated must equal 128 x 1"
    assert loss == pytest.approx(big_loss, abs=1e-6)
    # 100 samples, batches of 32 with k=3: windows of 32+32+32 and of 4 -- the same steps as batches of 96 and 4
    big_loss, big, big_trainer, _ = one_epoch(student, TOY, 96, 1)
    loss, small, trainer, _ = one_epoch(student, TOY, 32, 3)
    assert trainer.step == big_trainer.step == 2, (trainer.step, big_trainer.step)
    assert same_weights(small, big), "the short last window (4 samples) must be weighted by its own size, not 1/k"
    assert loss == pytest.approx(big_loss, abs=1e-6)


@check(points=1, hint="_accumulate: a loss for which self._batch_loss says is_mean=False (reduction='sum' or "
                      "'none') is already a sum over the batch: weight it by 1 / n_window, not by n_batch / n_window")
def test_accumulation_with_summed_losses(student):
    _, expected, _, _ = one_epoch(student, TOY, 96, 1)
    mean_loss, _, _, _ = one_epoch(student, TOY, 32, 3)
    for reduction in ("sum", "none"):
        loss, got, trainer, _ = one_epoch(student, TOY, 32, 3, nn.CrossEntropyLoss(reduction=reduction))
        assert same_weights(got, expected), reduction
        assert loss == pytest.approx(mean_loss, abs=1e-5), (reduction, loss, mean_loss)


@check(points=2, hint="_accumulate returns the window's SUMMED per-sample loss: each batch's mean loss times its "
                      "size, added up (train_epoch divides the epoch's total by the number of samples)")
def test_epoch_loss_is_a_per_sample_mean(student):
    for accumulation_steps in (1, 2):
        loss, _, trainer, recorded = one_epoch(student, TOY, 32, accumulation_steps)
        sizes = [n for _, n in recorded.batches]
        assert sizes == [32, 32, 32, 4], sizes
        per_sample = sum(mean * n for mean, n in recorded.batches) / 100
        assert loss == pytest.approx(per_sample, abs=1e-6), (loss, per_sample)
        assert abs(per_sample - np.mean([mean for mean, _ in recorded.batches])) > 1e-4
        assert trainer.epoch == 1 and trainer.history["train_loss"] == [loss]
        assert trainer.step == 4 // accumulation_steps


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
    assert seen == [32, 32, 32, 4], f"expected the 4 batches (32, 32, 32, 4) through _batch_loss, got {seen}"


class RecordingSGD(optim.SGD):
    """SGD that records the learning rate of every step it takes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def step(self):
        self.seen.append(self.lr)
        super().step()


@check(points=2, hint="every step of epoch e must use scheduler.get_lr(e): the rate is set at the START of the "
                      "epoch (epoch 0 trains at max_lr), recorded in history['learning_rates']")
def test_schedule_applied_at_the_start_of_each_epoch(student):
    model = toy_model()
    schedule = student.CosineSchedule(max_lr=0.4, min_lr=0.1, total_epochs=3)
    optimizer = RecordingSGD(model.parameters(), lr=1.0)
    trainer = student.Trainer(model, optimizer, nn.CrossEntropyLoss(), scheduler=schedule)
    trainer.fit(DataLoader(TOY, batch_size=50, shuffle=True, seed=0), epochs=4, progress=False)
    expected = [schedule.get_lr(e) for e in range(4)]
    assert expected[0] == pytest.approx(0.4) and expected[3] == pytest.approx(0.1)
    assert optimizer.seen == [lr for lr in expected for _ in range(2)], f"the optimizer saw {optimizer.seen}"
    assert trainer.history["learning_rates"] == pytest.approx(expected)
    assert trainer.epoch == 4 and trainer.step == 8


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
    loss, accuracy = trainer.evaluate(loader)
    assert type(loss) is float and type(accuracy) is float, \
        f"evaluate returns Python floats (logs write them as JSON), got {type(loss).__name__}, {type(accuracy).__name__}"
    assert trainer.evaluate(loader) == (loss, accuracy), "a nested Dropout must be off in evaluate"
    assert all(m.training for m in model.modules()), "evaluate must restore training mode everywhere"
    assert spy.tracked and not any(spy.tracked), "evaluate must run under no_grad (no graph, less memory)"
    model.eval()
    with tt.no_grad():
        outputs = model(tt.tensor(X[:100])).numpy()
    model.train()
    assert loss == pytest.approx(np_cross_entropy(outputs, Y[:100]).mean(), rel=1e-5), "mean loss per sample"
    assert accuracy == pytest.approx(np.mean(outputs.argmax(axis=1) == Y[:100])), "accuracy in [0, 1]"
    model[1].eval()  # a mixed state is restored as it was, too
    trainer.evaluate(loader)
    assert [m.training for m in model.modules()] == [True, True, False, False, False]


@check(points=2, hint="_clip_and_step: if the window's loss is not finite, skip the step (self._skip); when "
                      "clipping, skip it too if clip_grad_norm returns a non-finite norm; otherwise step and count "
                      "self.step")
def test_nonfinite_loss_skips_the_step(student):
    class NanOnce:
        reduction = "mean"

        def __init__(self):
            self.calls = 0

        def __call__(self, outputs, targets):
            self.calls += 1
            loss = nn.CrossEntropyLoss()(outputs, targets)
            return loss * float("nan") if self.calls == 2 else loss

    for clip in (None, 1.0):
        model = toy_model()
        trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanOnce(), grad_clip_norm=clip)
        trainer.train_epoch(DataLoader(TOY, batch_size=25))
        assert trainer.skipped_steps == 1 and trainer.step == 3 and trainer.history["skipped_steps"] == [1], clip
        assert all(np.isfinite(p.numpy()).all() for p in model.parameters()), "nan must never reach the weights"
    model = toy_model()
    strict = student.Trainer(model, optim.SGD(model.parameters(), lr=0.5), NanOnce(), on_nonfinite="raise")
    with pytest.raises(FloatingPointError):
        strict.train_epoch(DataLoader(TOY, batch_size=25))

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
    assert trainer.skipped_steps == 1 and trainer.step == 3, "a non-finite gradient norm must skip the step"
    assert all(np.isfinite(p.numpy()).all() for p in model.parameters()), "nan must never reach the weights"


@check(points=1, hint="with grad_clip_norm, clip the accumulated gradient once per step with clip_grad_norm, and "
                      "append the pre-clip norm it returns to the norms list (history['grad_norm'] is their mean)")
def test_trainer_clips_the_accumulated_gradient(student):
    model = toy_model()
    before = weights(model)
    inputs, targets = tt.tensor(X[:64]), tt.tensor(Y[:64])
    nn.CrossEntropyLoss()(model(inputs), targets).backward()
    norm = math.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in model.parameters()))
    model = toy_model()
    trainer = student.Trainer(model, optim.SGD(model.parameters(), lr=1.0), nn.CrossEntropyLoss(),
                              grad_clip_norm=1e-3)
    trainer.train_epoch([(inputs[:32], targets[:32]), (inputs[32:], targets[32:])], accumulation_steps=2)
    assert trainer.step == 1 and trainer.history["grad_norm"][0] == pytest.approx(norm, rel=1e-4)
    moved = math.sqrt(sum(((a - b).astype(np.float64) ** 2).sum() for a, b in zip(weights(model), before)))
    assert moved == pytest.approx(1e-3, rel=1e-3), "the step must have norm lr * max_norm"


# -- memory and devices ------------------------------------------------------------------------


@check(points=1, hint="memory_report: sum p.data.nbytes over the parameters, p.grad.data.nbytes over the gradients "
                      "that exist, and every array in optimizer.state_dict() (use _array_bytes)")
def test_memory_report(student):
    for make, state_factor in ((lambda p: optim.SGD(p, lr=0.1), 0), (lambda p: optim.SGD(p, lr=0.1, momentum=0.9), 1),
                               (lambda p: optim.Adam(p), 2)):
        model = toy_model()
        optimizer = make(model.parameters())
        size = sum(p.size for p in model.parameters()) * 4  # float32
        report = student.memory_report(model, optimizer)
        assert report["parameters"] == size and report["gradients"] == 0 and report["optimizer_state"] == 0
        nn.CrossEntropyLoss()(model(tt.tensor(X[:8])), tt.tensor(Y[:8])).backward()
        optimizer.step()
        report = student.memory_report(model, optimizer)
        assert report["gradients"] == size and report["optimizer_state"] == state_factor * size, report
        assert report["ratio"] == pytest.approx(2 + state_factor)


@check(points=1, hint="compute on the tensors' device: clip_grad_norm with each gradient's backend (one host read per "
                      "device), the Trainer's methods through tensors and their backends, never np on device arrays")
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
            norm = student.clip_grad_norm(model.parameters(), 0.1)
        except TypeError as error:
            raise AssertionError(f"training on the {device!r} device: {error}") from None
        results[device] = (loss, *evaluation, norm, weights(model), [p.grad.numpy() for p in model.parameters()])
    (loss, *rest), (strict_loss, *strict_rest) = results["cpu"], results["strict"]
    assert strict_loss == pytest.approx(loss, rel=1e-5) and strict_rest[:3] == pytest.approx(rest[:3], rel=1e-5)
    assert same_weights(strict_rest[3], rest[3]) and same_weights(strict_rest[4], rest[4])
