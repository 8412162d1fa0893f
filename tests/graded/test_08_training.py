"""Graded checks for Module 08 (training), run against the student's own code.

Schedules, clipping, checkpoint files, the Trainer, callbacks and the memory
report come from the ``student`` fixture; models, losses, optimizers and data
loaders come from the package (modules 04-07). The checks pin down what simple
textbook versions get wrong: accumulation weighting (also for a short last
window), the rate of each epoch set at its start, per-sample loss means with a
short last batch, eval mode reaching nested layers, and exact resume.
"""
import math
import os
import pickle
import random
import warnings
from types import SimpleNamespace

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


# -- checkpoint files -----------------------------------------------------------------------

@check(points=1, hint="to_plain: keep None/bool/int/float/str (exact types), NumPy scalars -> .item(), tensors and "
                      "device arrays -> host NumPy arrays, tuples -> lists, recurse into dicts (str/int keys) and "
                      "lists; anything else raises CheckpointError naming the path, e.g. ['model']['layer']")
def test_to_plain(student):
    plain = student.to_plain({"w": tt.ones(2, 2), "step": np.int64(3), "betas": (0.9, 0.999), "ok": True,
                              "nested": {0: [np.float32(0.5), None, "text"]}, "strict": tt.ones(3, device="strict"),
                              "array": np.arange(3)})
    assert isinstance(plain["w"], np.ndarray) and plain["w"].shape == (2, 2)
    assert plain["step"] == 3 and type(plain["step"]) is int and plain["betas"] == [0.9, 0.999]
    assert plain["nested"] == {0: [0.5, None, "text"]} and type(plain["nested"][0][0]) is float
    assert type(plain["strict"]) is np.ndarray and plain["strict"].tolist() == [1.0, 1.0, 1.0], \
        "device arrays come to the host"
    assert plain["ok"] is True and np.array_equal(plain["array"], np.arange(3))
    pickle.loads(pickle.dumps(plain))  # plain data pickles without naming any class of ours
    for bad, where in (({"model": {"layer": object()}}, "['model']['layer']"),
                       ({"a": [1, {2, 3}]}, "['a'][1]"),
                       ({"a": np.array([object()], dtype=object)}, "['a']")):
        with pytest.raises(student.CheckpointError) as error:
            student.to_plain(bad)
        assert where in str(error.value), error.value


@check(points=1, hint="atomic_write: write into the temporary file, flush and os.fsync it, then os.replace it over "
                      "the target; on any exception (even KeyboardInterrupt) delete the temporary file and re-raise")
def test_atomic_write(student, tmp_path):
    target = tmp_path / "state.bin"
    student.atomic_write(target, lambda f: f.write(b"old"))
    assert target.read_bytes() == b"old"

    def crash_halfway(file):
        file.write(b"new, but only ha")
        raise KeyboardInterrupt("the machine went away")

    with pytest.raises(KeyboardInterrupt):
        student.atomic_write(target, crash_halfway)
    assert target.read_bytes() == b"old", "an interrupted write must leave the old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"], "and no temporary file behind"
    student.atomic_write(target, lambda f: f.write(b"new"))
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]
    student.atomic_write(tmp_path / "other.bin", lambda f: f.write(b"x"))
    assert (tmp_path / "other.bin").read_bytes() == b"x"


class Payload:
    def __init__(self, folder):
        self.folder = folder

    def __reduce__(self):  # what a malicious file does: "call os.mkdir(...)" while loading
        return (os.mkdir, (str(self.folder / "pwned"),))


@check(points=2, hint="SafeUnpickler.find_class: return only what self.allowed maps (module, name) to, and raise "
                      "CheckpointError naming module.name for anything else, before anything runs")
def test_safe_unpickler(student, tmp_path):
    evil = pickle.dumps({"model": Payload(tmp_path)})
    with pytest.raises(student.CheckpointError) as error:
        student.SafeUnpickler(__import__("io").BytesIO(evil)).load()
    assert "mkdir" in str(error.value), error.value
    assert not (tmp_path / "pwned").exists(), "nothing from the file may run"
    (tmp_path / "evil.ckpt").write_bytes(evil)
    with pytest.raises(student.CheckpointError):
        student.read_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "pwned").exists()
    for name in (b"cbuiltins\neval\n", b"cos\nsystem\n"):
        with pytest.raises(student.CheckpointError):
            student.SafeUnpickler(__import__("io").BytesIO(b"\x80\x02" + name + b".")).load()
    data = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(3), "b": np.array([True, False]),
            "n": [1, 2.5, "x", None, {"k": (1, 2)}]}
    for protocol in (4, 5):
        loaded = student.SafeUnpickler(__import__("io").BytesIO(pickle.dumps(data, protocol=protocol))).load()
        assert all(np.array_equal(loaded[k], data[k]) and loaded[k].dtype == data[k].dtype for k in ("w", "i", "b"))
        assert loaded["n"] == [1, 2.5, "x", None, {"k": (1, 2)}], protocol


@check(points=1, hint="capture_rng_state must save Python's random, NumPy's global generator and every loaded "
                      "backend's rng_state(); restore_rng_state sets them all back (the file turns Python's "
                      "state tuples into lists: convert them back)")
def test_rng_state_round_trip(student, tmp_path):
    tt.manual_seed(1)
    tt.randn(3, device="strict")  # the strict backend is loaded, so its generator counts too
    student.write_checkpoint(tmp_path / "rng.ckpt", {"rng": student.capture_rng_state()})
    expected = (random.random(), np.random.rand(), tt.randn(4).numpy(), tt.randn(4, device="strict").numpy())
    tt.manual_seed(123)  # scramble everything
    random.random(), np.random.rand()
    student.restore_rng_state(student.read_checkpoint(tmp_path / "rng.ckpt")["rng"])
    again = (random.random(), np.random.rand(), tt.randn(4).numpy(), tt.randn(4, device="strict").numpy())
    assert expected[:2] == again[:2], "Python's and NumPy's generators"
    assert np.array_equal(expected[2], again[2]) and np.array_equal(expected[3], again[3]), "tinytrain's generators"


@check(points=1, hint="capture_rng_state leaves out (with a RuntimeWarning) a backend whose rng_state() raises "
                      "NotImplementedError; restore_rng_state skips (with a RuntimeWarning) a device get_backend "
                      "cannot create here, and restores the rest")
def test_rng_states_of_devices_that_cannot_take_part(student):
    import tinytrain.backend as registry

    class NoState(registry.NumpyBackend):
        kind = "nostate"

        def rng_state(self):
            raise NotImplementedError("this device cannot report its generator's state")

    tt.register_backend("nostate", NoState)
    try:
        tt.get_backend("nostate")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = student.capture_rng_state()
        assert "nostate:0" not in state["backends"] and "cpu" in state["backends"], sorted(state["backends"])
        assert any(issubclass(w.category, RuntimeWarning) for w in caught), "capture_rng_state: no RuntimeWarning"
    finally:
        for name in [name for name in registry._BACKENDS if name.startswith("nostate")]:
            del registry._BACKENDS[name]
        del registry._FACTORIES["nostate"]
    tt.manual_seed(5)
    state = student.capture_rng_state()
    expected = tt.randn(3).numpy()
    state["backends"]["tpu:0"] = {"saved": "on a machine with a TPU"}
    tt.manual_seed(6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        student.restore_rng_state(state)
    assert any(issubclass(w.category, RuntimeWarning) for w in caught), "restore_rng_state: no RuntimeWarning for tpu:0"
    np.testing.assert_array_equal(tt.randn(3).numpy(), expected, err_msg="the CPU's generator is restored all the same")


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
                      "calling the model and the loss itself: Module 11's mixed precision plugs in there")
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


def resumable_run(student):
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    trainer = student.Trainer(model, optim.Adam(model.parameters(), lr=0.01), nn.CrossEntropyLoss(),
                              scheduler=student.CosineSchedule(0.01, 0.001, total_epochs=4), grad_clip_norm=5.0)
    return trainer, DataLoader(TOY, batch_size=16, shuffle=True)


@check(points=3, hint="exact resume needs the checkpoint to hold everything: to_plain must keep every value, and "
                      "capture/restore_rng_state every generator (Python, NumPy, each tinytrain backend) so dropout "
                      "masks and shuffles continue exactly")
def test_exact_resume(student, tmp_path):
    tt.manual_seed(0)
    straight, loader = resumable_run(student)
    straight.fit(loader, epochs=4, progress=False)

    tt.manual_seed(0)
    first_half, loader = resumable_run(student)
    first_half.fit(loader, epochs=2, progress=False)
    first_half.save_checkpoint(tmp_path / "half.ckpt")
    del first_half, loader

    tt.manual_seed(999)  # a different start: everything must come from the file
    random.seed(999), np.random.seed(999)
    resumed, loader = resumable_run(student)
    resumed.load_checkpoint(tmp_path / "half.ckpt")
    assert resumed.epoch == 2
    resumed.fit(loader, epochs=4, progress=False)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert np.array_equal(a.numpy(), b.numpy()), "resumed weights must be bit-identical to the straight run"
    for key in ("train_loss", "learning_rates", "grad_norm"):
        assert resumed.history[key] == straight.history[key], key
    assert resumed.step == straight.step and resumed.epoch == 4


# -- callbacks and memory ------------------------------------------------------------------------

@check(points=1, hint="ModelCheckpoint keeps the keep_last newest epoch files (up to the current epoch) plus every "
                      "epoch divisible by `every` (when every is set); it deletes only the others")
def test_model_checkpoint_keeps_the_right_files(student, tmp_path):
    def fake_trainer(epoch):
        return SimpleNamespace(epoch=epoch, save_checkpoint=lambda path: open(path, "wb").close())

    for keep_last, every, expected in ((2, 3, [3, 6, 7]), (1, None, [7]), (3, 2, [2, 4, 5, 6, 7]), (10, None,
                                                                                                  [1, 2, 3, 4, 5, 6, 7])):
        directory = tmp_path / f"run-{keep_last}-{every}"
        callback = student.ModelCheckpoint(directory, keep_last=keep_last, every=every)
        callback.on_fit_begin(None)
        (directory / "epoch-0009.pkl").write_bytes(b"")  # a later epoch from an interrupted run: not touched
        for epoch in range(1, 8):
            callback.on_checkpoint(fake_trainer(epoch), {})
        assert sorted(callback.epoch_files()) == expected + [9], (keep_last, every, sorted(callback.epoch_files()))


@check(points=1, hint="EarlyStopping: on an improvement store best/best_epoch and reset wait to 0; otherwise "
                      "wait += 1 and once wait >= patience set trainer.stop_training = True and stopped_epoch")
def test_early_stopping(student):
    def run(callback, values, monitor="eval_loss"):
        trainer = SimpleNamespace(epoch=0, stop_training=False, model=nn.Linear(2, 1))
        for value in values:
            trainer.epoch += 1
            callback.on_epoch_end(trainer, {monitor: value})
            if trainer.stop_training:
                break
        return trainer

    patient = student.EarlyStopping(patience=3)
    trainer = run(patient, [1.0, 0.8, 0.85, 0.9, 0.7, 0.75, 0.76, 0.77, 0.1])
    assert trainer.epoch == 8 and patient.stopped_epoch == 8, "reset the count on an improvement (epoch 5)"
    assert patient.best == 0.7 and patient.best_epoch == 5
    accuracy = student.EarlyStopping(monitor="eval_accuracy", patience=1)  # mode "auto": higher is better
    assert run(accuracy, [0.5, 0.6, 0.7, 0.8], "eval_accuracy").epoch == 4 and accuracy.stopped_epoch is None
    demanding = student.EarlyStopping(patience=2, min_delta=0.15)  # only drops of more than 0.15 count
    assert run(demanding, [1.0, 0.8, 0.7, 0.66]).epoch == 4 and demanding.best == 0.8


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
