"""Mixed precision (Module 13): ``GradScaler`` and ``Trainer(precision="16-mixed")``.

An overflow skips the step (weights untouched) and halves the scale; clean steps
grow it; the masters and the optimizer state stay float32 while the forward and
backward run in float16; the scale travels in checkpoints (exact resume); and
16-mixed training on Digits ends within one point of float32.
"""
import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn
from tinytrain.amp import GradScaler, MixedPrecision
from tinytrain.serialization import read_checkpoint
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.datasets import Digits

RNG = np.random.default_rng(0)
X = RNG.standard_normal((96, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 96)


def toy(precision="16-mixed", **options):
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    optimizer = tt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return tt.Trainer(model, optimizer, nn.CrossEntropyLoss(), precision=precision, **options)


def loader(data=(X, Y), batch_size=16):
    return DataLoader(TensorDataset(*data), batch_size=batch_size, shuffle=True, seed=1)


def test_scaler_backs_off_on_overflow_and_grows_after_clean_steps():
    scaler = GradScaler(init_scale=1024.0, growth_interval=2)
    scaler.update(found_inf=True)
    assert (scaler.scale, scaler.clean_steps, scaler.skipped_steps) == (512.0, 0, 1)
    scaler.update(found_inf=False)
    assert scaler.scale == 512.0
    scaler.update(found_inf=False)
    assert (scaler.scale, scaler.clean_steps) == (1024.0, 0)
    restored = GradScaler()
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale, restored.clean_steps, restored.skipped_steps) == (1024.0, 0, 1)


def test_a_loaded_scaler_keeps_the_saved_settings_and_refuses_bad_states():
    """A count of clean steps saved under growth_interval=2 once met a fresh scaler's 2000: it never grew again."""
    saved = GradScaler(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)
    saved.update(found_inf=False)
    restored = GradScaler()
    restored.load_state_dict(saved.state_dict())
    assert restored.state_dict() == saved.state_dict()
    restored.update(found_inf=False)
    assert (restored.scale, restored.clean_steps) == (32.0, 0)

    for bad, match in (({"clean_steps": 2}, r"clean_steps must lie in \[0, growth_interval=2\).*got 2"),
                       ({"growth_interval": 0}, "growth_interval >= 1"), ({"scale": -1.0}, "init_scale > 0")):
        with pytest.raises(ValueError, match=match):
            restored.load_state_dict({**saved.state_dict(), **bad})
        assert restored.state_dict() == {**saved.state_dict(), "scale": 32.0, "clean_steps": 0}  # unchanged


def test_scaler_rejects_bad_settings_and_precision_names():
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=2.0)
    with pytest.raises(ValueError, match="'32-true', '16-mixed'.*'bf16'"):
        toy(precision="bf16")


def test_unscale_finds_inf_and_nan_and_divides_in_float32():
    p = tt.tensor([1.0, 2.0], requires_grad=True)
    scaler = GradScaler(init_scale=4.0)
    p.grad = tt.tensor([4.0, 8.0], dtype="float16")
    assert scaler.unscale_([p]) is False
    assert p.grad.dtype == np.float32 and p.grad.numpy().tolist() == [1.0, 2.0]
    for bad in (np.inf, np.nan):
        p.grad = tt.tensor([bad, 1.0], dtype="float16")
        assert scaler.unscale_([p]) is True


def test_unscale_reads_one_flag_back_per_device(monkeypatch):
    backend = tt.get_backend("strict")
    reads = []
    to_host = backend.to_host
    monkeypatch.setattr(backend, "to_host", lambda array: reads.append(array) or to_host(array))
    params = [tt.tensor([1.0, 2.0], device="strict", requires_grad=True) for _ in range(5)]
    for p in params:
        p.grad = tt.tensor([4.0, 8.0], dtype="float16", device="strict")
    scaler = GradScaler(init_scale=4.0)
    assert scaler.unscale_(params) is False and len(reads) == 1
    params[3].grad = tt.tensor([np.inf, 1.0], dtype="float16", device="strict")
    reads.clear()
    assert scaler.unscale_(params) is True and len(reads) == 1


def test_overflow_skips_the_step_and_halves_the_scale():
    trainer = toy()
    before = [p.numpy() for p in trainer.model.parameters()]
    huge = (np.full((16, 6), 6e4, np.float32), np.zeros(16, np.int64))
    with np.errstate(all="ignore"):
        trainer.train_epoch(loader(huge))
    assert trainer._amp.scaler.scale == 2.0**15 and trainer.skipped_steps == 1 and trainer.step == 0
    assert trainer.history["skipped_steps"] == [1]
    for b, p in zip(before, trainer.model.parameters()):
        np.testing.assert_array_equal(b, p.numpy())


def test_float16_compute_float32_masters_gradients_and_optimizer_state():
    trainer = toy()
    seen = []
    inner_forward = trainer.model.forward
    trainer.model.forward = lambda x: (seen.append((x.dtype, trainer.model[0].weight.dtype)), inner_forward(x))[1]
    trainer.train_epoch(loader())
    assert set(seen) == {(np.dtype("float16"), np.dtype("float16"))}, "the forward runs on float16 inputs and weight copies"
    assert all(p.dtype == np.float32 and p.grad.dtype == np.float32 for p in trainer.model.parameters())
    state = trainer.optimizer.state_dict()
    buffers = [v for v in _arrays(state)]
    assert buffers and all(b.dtype == np.float32 for b in buffers)
    assert trainer.step == len(loader()) and trainer._amp.scaler.scale == 2.0**16


def _arrays(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _arrays(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _arrays(item)
    elif hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0:
        yield np.asarray(value)


def test_the_scale_grows_after_growth_interval_clean_steps_in_the_trainer():
    trainer = toy()
    trainer._amp.scaler.growth_interval = 3
    trainer.train_epoch(loader())  # 6 clean steps: two growths
    assert trainer._amp.scaler.scale == 2.0**18 and trainer.skipped_steps == 0


@pytest.mark.filterwarnings("ignore:overflow encountered")  # the grown scale overflows now and then: by design
def test_the_scale_is_saved_in_checkpoints_and_resume_is_exact(tmp_path):
    straight = toy()
    straight._amp.scaler.growth_interval = 4
    straight.fit(loader(), epochs=4, progress=False)

    first = toy()
    first._amp.scaler.growth_interval = 4
    first.fit(loader(), epochs=2, progress=False)
    first.save_checkpoint(tmp_path / "amp.ckpt")
    assert read_checkpoint(tmp_path / "amp.ckpt")["plugins"]["precision"]["scaler"]["scale"] == first._amp.scaler.scale
    resumed = toy()
    resumed._amp.scaler.growth_interval = 4
    resumed.load_checkpoint(tmp_path / "amp.ckpt")
    assert resumed._amp.scaler.scale == first._amp.scaler.scale != 2.0**16
    resumed.fit(loader(), epochs=4, progress=False)
    assert resumed._amp.scaler.state_dict() == straight._amp.scaler.state_dict()
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_mixed_precision_with_clipping_and_accumulation_trains():
    trainer = toy(grad_clip_norm=1.0)
    trainer.fit(loader(), epochs=3, accumulation_steps=2, progress=False)
    assert np.isfinite(trainer.history["train_loss"]).all() and trainer.history["grad_norm"][-1] > 0


def test_mixed_precision_plugin_casts_only_float_inputs():
    plugin = MixedPrecision()
    model = nn.Sequential(nn.Linear(2, 2))
    loss = plugin.forward_loss(model, nn.MSELoss(), tt.ones(3, 2), tt.zeros(3, 2))
    assert loss.dtype == np.float32 and model[0].weight.dtype == np.float16
    plugin.before_step(model.parameters(), loss.item())
    assert model[0].weight.dtype == np.float32


def digits_accuracy(precision: str) -> float:
    tt.manual_seed(0)
    train, test = Digits(train=True), Digits(train=False)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), nn.CrossEntropyLoss(),
                         precision=precision)
    trainer.fit(DataLoader(TensorDataset(train.images, train.labels), batch_size=64, shuffle=True, seed=0),
                epochs=15, progress=False)
    return trainer.evaluate(DataLoader(TensorDataset(test.images, test.labels), batch_size=512))[1]


def test_16_mixed_on_digits_ends_within_one_point_of_float32():
    full, mixed = digits_accuracy("32-true"), digits_accuracy("16-mixed")
    assert full > 0.93 and abs(full - mixed) <= 0.01, (full, mixed)


def test_a_trainer_whose_losses_bypass_batch_loss_refuses_16_mixed():
    """A student's ``_accumulate`` that calls the model itself would train in float32 unnoticed."""

    class OwnLosses(tt.Trainer):
        def _accumulate(self, window, parameters):
            for p in parameters:
                p.grad = None
            total = 0.0
            n = sum(len(inputs) for inputs, _ in window)
            for inputs, targets in window:
                loss = self.loss_fn(self.model(inputs), targets)
                (loss * (len(inputs) / n)).backward()
                total += loss.item() * len(inputs)
            return total

    trainer = toy()
    trainer.__class__ = OwnLosses
    with pytest.raises(RuntimeError, match=r"16-mixed.*self\._batch_loss\(inputs, targets\)"):
        trainer.train_epoch(loader())
    assert trainer.step == 0


class NanOnBatch:
    """Cross-entropy whose ``bad``-th call returns nan."""

    def __init__(self, bad: int) -> None:
        self.calls, self.bad, self.inner = 0, bad, nn.CrossEntropyLoss()

    def __call__(self, out, y):
        self.calls += 1
        loss = self.inner(out, y)
        return loss * float("nan") if self.calls == self.bad else loss


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
def test_16_mixed_raises_on_a_nan_loss_when_configured():
    trainer = toy(on_nonfinite="raise")
    trainer.loss_fn = NanOnBatch(2)
    with pytest.raises(FloatingPointError, match="the loss is nan in epoch 0 after 1 optimizer steps"):
        trainer.train_epoch(loader())


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
def test_16_mixed_skips_a_nan_loss_once_and_backs_off_the_scale():
    trainer = toy()
    trainer.loss_fn = NanOnBatch(2)
    trainer.train_epoch(loader())
    assert trainer.skipped_steps == 1 and trainer.step == 5 and trainer._amp.scaler.scale == 2.0**15


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
def test_a_loss_scale_that_keeps_falling_stops_with_floating_point_error_not_zero_division():
    """Gradients that are inf at any scale: after 40 halvings from 2**16 the scale is below float16's
    smallest step (2**-24), and the run stops with a clear error (before, 1 / 0.0 after ~1,100 steps)."""
    trainer = toy()
    trainer.loss_fn = lambda out, y: (out * 0.0).sum().sqrt() + nn.CrossEntropyLoss()(out, y)  # nan gradient
    batches = (np.repeat(X[:1], 64, axis=0), np.repeat(Y[:1], 64))
    with pytest.raises(FloatingPointError, match=r"loss scale fell to 2.98023e-08 after 41 skipped steps"):
        for _ in range(2):
            trainer.train_epoch(loader(batches, batch_size=1))
