"""The Trainer: accumulation, schedules, clipping, non-finite values, modes, fit, memory, plots."""
from __future__ import annotations

import functools
import math
import time

import numpy as np

import pytest

import tinytrain as tt
from tinytrain import nn
from tinytrain.nn import functional as F
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.testing.strict import host_reads
from tinytrain.training import Trainer, clip_grad_norm, memory_report, plot_history

RNG = np.random.default_rng(0)
FEATURES = RNG.standard_normal((256, 6)).astype(np.float32)
LABELS = RNG.integers(0, 3, 256)


def dataset(n: int = 256) -> TensorDataset:
    return TensorDataset(FEATURES[:n], LABELS[:n])


def make_model(device: str = "cpu", seed: int = 0) -> nn.Module:
    tt.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)


def weights(model: nn.Module) -> list[np.ndarray]:
    return [p.numpy() for p in model.parameters()]


def one_epoch(batch_size: int, k: int, n: int = 256, device: str = "cpu", loss_fn=None, lr: float = 0.5):
    model = make_model(device)
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=lr, momentum=0.9), loss_fn or nn.CrossEntropyLoss())
    loss = trainer.train_epoch(DataLoader(dataset(n), batch_size=batch_size, device=device), accumulation_steps=k)
    return loss, weights(model), trainer


def assert_close(a: list[np.ndarray], b: list[np.ndarray], atol: float = 2e-6) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, atol=atol, rtol=1e-5)


# -- clipping ---------------------------------------------------------------------------------


def test_clip_keeps_the_direction_and_returns_the_norm_before(device: str) -> None:
    w = tt.zeros(3, requires_grad=True, device=device)
    w.grad = tt.tensor([100.0, 200.0, 50.0], device=device)
    norm = clip_grad_norm([w], max_norm=1.0)
    assert norm == pytest.approx(math.sqrt(52500), rel=1e-6)
    clipped = w.grad.numpy()
    assert np.linalg.norm(clipped) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(clipped, np.array([100, 200, 50]) / math.sqrt(52500), rtol=1e-5)


def test_clip_uses_the_global_norm_and_skips_parameters_without_gradients(device: str) -> None:
    params = [tt.zeros(2, 2, requires_grad=True, device=device) for _ in range(3)]
    params[0].grad = tt.ones(2, 2, device=device)
    params[2].grad = tt.ones(2, 2, device=device) * 2.0
    assert clip_grad_norm(params, max_norm=100.0) == pytest.approx(math.sqrt(4 + 16))
    assert params[0].grad.numpy().tolist() == [[1, 1], [1, 1]], "below max_norm nothing changes"
    norm = clip_grad_norm(params, max_norm=1.0)
    assert norm == pytest.approx(math.sqrt(20))
    total = math.sqrt(sum((p.grad.numpy() ** 2).sum() for p in params if p.grad is not None))
    assert total == pytest.approx(1.0, abs=1e-5) and params[1].grad is None
    assert clip_grad_norm([tt.zeros(2, requires_grad=True)], max_norm=1.0) == 0.0


def test_clip_matches_pytorch() -> None:
    torch = pytest.importorskip("torch")
    grads = [RNG.standard_normal(s).astype(np.float32) * 10 for s in [(4, 3), (3,), (2, 2)]]
    ours = [tt.zeros(*g.shape, requires_grad=True) for g in grads]
    theirs = [torch.zeros(g.shape, requires_grad=True) for g in grads]
    for o, t, g in zip(ours, theirs, grads):
        o.grad, t.grad = tt.tensor(g), torch.tensor(g)
    assert clip_grad_norm(ours, 2.0) == pytest.approx(float(torch.nn.utils.clip_grad_norm_(theirs, 2.0)), rel=1e-5)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_clip_leaves_non_finite_gradients_alone_or_raises(bad: float) -> None:
    a, b = tt.zeros(2, requires_grad=True), tt.zeros(1, requires_grad=True)
    a.grad, b.grad = tt.tensor([bad, 1.0]), tt.tensor([5.0])
    norm = clip_grad_norm([a, b], max_norm=1.0)
    assert not math.isfinite(norm) and b.grad.numpy().tolist() == [5.0]
    with pytest.raises(FloatingPointError, match="norm"):
        clip_grad_norm([a, b], max_norm=1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm([a, b], max_norm=0)


@pytest.mark.parametrize("max_norm, error", [(True, TypeError), ("1", TypeError), (-1.0, ValueError),
                                             (float("nan"), ValueError)])
def test_clip_refuses_a_max_norm_that_is_not_a_positive_number(max_norm, error) -> None:
    a = tt.zeros(2, requires_grad=True)
    a.grad = tt.tensor([3.0, 4.0])
    with pytest.raises(error, match="max_norm"):
        clip_grad_norm([a], max_norm=max_norm)
    assert a.grad.numpy().tolist() == [3.0, 4.0]


@pytest.mark.parametrize("max_norm", [np.float32(1.0), np.int64(1), float("inf")])
def test_clip_takes_numpy_numbers_and_inf_as_max_norm(max_norm) -> None:
    a = tt.zeros(2, requires_grad=True)
    a.grad = tt.tensor([3.0, 4.0])
    assert clip_grad_norm([a], max_norm=max_norm) == 5.0
    assert np.linalg.norm(a.grad.numpy()) == pytest.approx(min(5.0, float(max_norm)), rel=1e-5)


# -- gradient accumulation --------------------------------------------------------------------


def test_batch_32_times_4_equals_batch_128(device: str) -> None:
    big_loss, big, big_trainer = one_epoch(128, 1, device=device)
    loss, small, trainer = one_epoch(32, 4, device=device)
    assert trainer.step == big_trainer.step == 2
    assert_close(small, big)
    assert loss == pytest.approx(big_loss, abs=1e-6)


@pytest.mark.parametrize("batch, k, reference", [(32, 3, 96), (32, 4, 128), (10, 50, 100), (16, 2, 32)])
def test_a_short_last_window_is_weighted_by_its_samples(batch: int, k: int, reference: int) -> None:
    # 100 samples: the last window is shorter (and may end with a short batch), exactly as
    # the last batch of the reference loader without accumulation.
    _, expected, _ = one_epoch(reference, 1, n=100)
    _, got, _ = one_epoch(batch, k, n=100)
    assert_close(got, expected)


def test_dividing_by_k_would_be_wrong_here() -> None:
    # Guard for the test above: a naive 1/k weighting changes the result measurably.
    class DividedByK:
        reduction = "sum"  # the trainer then only divides by the window's samples...

        def __init__(self):
            self.inner = nn.CrossEntropyLoss()

        def __call__(self, out, y):  # ...so this is the textbook mean / k, k=3, for windows of 96 and 4
            return self.inner(out, y) * (96 / 3 if len(y) == 32 else 4 / 3)

    _, expected, _ = one_epoch(96, 1, n=100)
    _, naive, _ = one_epoch(32, 3, n=100, loss_fn=DividedByK())
    assert max(np.abs(a - b).max() for a, b in zip(naive, expected)) > 1e-3


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_sum_and_none_reductions_train_like_mean(reduction: str) -> None:
    _, expected, _ = one_epoch(32, 3, n=100)
    loss, got, _ = one_epoch(32, 3, n=100, loss_fn=nn.CrossEntropyLoss(reduction=reduction))
    assert_close(got, expected)
    mean_loss, _, _ = one_epoch(32, 3, n=100)
    assert loss == pytest.approx(mean_loss, rel=1e-5), "the reported loss is per sample whatever the reduction"


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_a_functional_loss_with_its_reduction_bound_by_partial_trains_like_mean(reduction: str) -> None:
    # partial(F.cross_entropy, reduction="sum") has no .reduction attribute; taken for a mean,
    # its gradient would be weighted by n_b / n on top of the sum
    _, expected, _ = one_epoch(32, 3, n=100)
    loss, got, trainer = one_epoch(32, 3, n=100, loss_fn=functools.partial(F.cross_entropy, reduction=reduction))
    assert_close(got, expected)
    mean_loss, _, _ = one_epoch(32, 3, n=100)
    assert loss == pytest.approx(mean_loss, rel=1e-5)
    assert trainer.evaluate(DataLoader(dataset(100), batch_size=32))[0] == pytest.approx(
        Trainer(trainer.model, trainer.optimizer, nn.CrossEntropyLoss()).evaluate(
            DataLoader(dataset(100), batch_size=32))[0], rel=1e-6)


def test_reported_loss_is_the_mean_per_sample_not_per_batch() -> None:
    batches = []

    class Recorded(nn.CrossEntropyLoss):
        def __call__(self, out, y):
            loss = super().__call__(out, y)
            batches.append((loss.item(), len(y)))
            return loss

    loss, _, trainer = one_epoch(96, 1, n=100, loss_fn=Recorded())
    assert [n for _, n in batches] == [96, 4]
    assert loss == pytest.approx(sum(m * n for m, n in batches) / 100, rel=1e-6)
    assert loss != pytest.approx(np.mean([m for m, _ in batches]), rel=1e-4)
    assert trainer.history["train_loss"] == [loss]


@pytest.mark.parametrize("k, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_accumulation_steps(k, error) -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(error, match=rf"accumulation_steps={k!r}"):
        trainer.train_epoch(DataLoader(dataset(10), batch_size=5), accumulation_steps=k)


def test_batches_must_be_pairs() -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match="batches of \\(inputs, targets\\), got a 1-tuple"):
        trainer.train_epoch(DataLoader(TensorDataset(FEATURES), batch_size=8))
    with pytest.raises(TypeError, match="got a 3-tuple"):
        trainer.evaluate(DataLoader(TensorDataset(FEATURES, LABELS, LABELS), batch_size=8))


def test_an_empty_loader_is_an_error() -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="no batches"):
        trainer.train_epoch([])
    with pytest.raises(ValueError, match="no batches"):
        trainer.evaluate([])
    assert trainer.epoch == 0


# -- learning rates -----------------------------------------------------------------------------


def test_the_optimizer_sees_get_lr_of_each_epoch_during_that_epoch() -> None:
    seen: list[float] = []

    class Recording(tt.SGD):
        def step(self):
            seen.append(self.lr)
            super().step()

    model = make_model()
    schedule = tt.CosineSchedule(max_lr=0.2, min_lr=0.02, total_epochs=4, warmup_epochs=1)
    trainer = Trainer(model, Recording(model.parameters(), lr=5.0), nn.CrossEntropyLoss(), scheduler=schedule)
    trainer.fit(DataLoader(dataset(), batch_size=64, shuffle=True, seed=0), epochs=6, progress=False)
    expected = [schedule.get_lr(e) for e in range(6)]
    assert seen == [lr for lr in expected for _ in range(4)]
    assert trainer.history["learning_rates"] == expected
    assert expected[0] == 0.1 and expected[1] == 0.2 and expected[-1] == 0.02


def test_without_a_schedule_the_optimizer_rate_is_recorded() -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.03), nn.CrossEntropyLoss())
    trainer.fit(DataLoader(dataset(64), batch_size=32), epochs=2, progress=False)
    assert trainer.history["learning_rates"] == [0.03, 0.03]


# -- non-finite values --------------------------------------------------------------------------


class NanOnBatch:
    """Cross-entropy whose ``bad``-th call returns nan (or whose gradient is nan, with ``grad_only``)."""

    reduction = "mean"

    def __init__(self, bad: int, grad_only: bool = False) -> None:
        self.calls, self.bad, self.grad_only = 0, bad, grad_only
        self.inner = nn.CrossEntropyLoss()

    def __call__(self, out, y):
        self.calls += 1
        loss = self.inner(out, y)
        if self.calls != self.bad:
            return loss
        if self.grad_only:  # d sqrt(x)/dx at 0 is inf, times 0: a finite loss with a nan gradient
            return loss + (out * 0.0).sum().sqrt()
        return loss * float("nan")


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
@pytest.mark.parametrize("grad_only", [False, True])
def test_a_non_finite_step_is_skipped_counted_and_never_reaches_the_weights(grad_only: bool) -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.5), NanOnBatch(2, grad_only), grad_clip_norm=1e6)
    loss = trainer.train_epoch(DataLoader(dataset(100), batch_size=25))
    assert trainer.skipped_steps == 1 and trainer.step == 3 and trainer.history["skipped_steps"] == [1]
    assert all(np.isfinite(w).all() for w in weights(model))
    assert math.isfinite(loss), "the epoch loss averages the steps taken"
    # the same as training on batches 1, 3 and 4 only
    reference = make_model()
    keep = np.r_[0:25, 50:100]
    plain = Trainer(reference, tt.SGD(reference.parameters(), lr=0.5), nn.CrossEntropyLoss())
    plain.train_epoch(DataLoader(TensorDataset(FEATURES[keep], LABELS[keep]), batch_size=25))
    assert_close(weights(model), weights(reference))


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
def test_non_finite_steps_raise_when_configured() -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.5), NanOnBatch(3), on_nonfinite="raise")
    with pytest.raises(FloatingPointError, match="loss is nan in epoch 0 after 2 optimizer steps"):
        trainer.train_epoch(DataLoader(dataset(100), batch_size=25))
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.5), NanOnBatch(1, grad_only=True),
                      grad_clip_norm=1.0, on_nonfinite="raise")
    before = weights(model)
    with pytest.raises(FloatingPointError, match="gradient norm is nan"):
        trainer.train_epoch(DataLoader(dataset(100), batch_size=25))
    assert_close(weights(model), before, atol=0)


@pytest.mark.parametrize("kwargs, match", [({"grad_clip_norm": 0}, "grad_clip_norm"),
                                           ({"grad_clip_norm": -1.0}, "grad_clip_norm"),
                                           ({"on_nonfinite": "ignore"}, "on_nonfinite")])
def test_bad_trainer_settings(kwargs, match: str) -> None:
    model = make_model()
    with pytest.raises(ValueError, match=match):
        Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), **kwargs)


@pytest.mark.parametrize("position, value, match", [
    (0, "mlp", r"model must be a model.*got model='mlp' of type str"),
    (1, "sgd", r"optimizer must be an optimizer.*got optimizer='sgd' of type str, which has no step"),
    (2, "cross_entropy", r"loss_fn must be a loss function.*got loss_fn='cross_entropy' of type str"),
    (3, "cosine", r"scheduler must be None or a schedule.*got scheduler='cosine'.*get_lr"),
])
def test_a_trainer_part_of_the_wrong_kind_raises_naming_it(position, value, match) -> None:
    model = make_model()
    parts = [model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), None]
    parts[position] = value
    with pytest.raises(TypeError, match=match):
        Trainer(*parts)


def test_clipping_logs_the_mean_pre_clip_norm(monkeypatch) -> None:
    norms = []

    def recording_clip(parameters, max_norm):
        norms.append(clip_grad_norm(parameters, max_norm))
        return norms[-1]

    monkeypatch.setattr(tt.training, "clip_grad_norm", recording_clip)
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), grad_clip_norm=0.01)
    trainer.train_epoch(DataLoader(dataset(), batch_size=64))
    assert len(norms) == 4 and all(n > 0.01 for n in norms)
    assert trainer.history["grad_norm"] == [pytest.approx(sum(norms) / 4)]
    unclipped = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    unclipped.train_epoch(DataLoader(dataset(), batch_size=64))
    assert math.isnan(unclipped.history["grad_norm"][0])


# -- modes and evaluation ------------------------------------------------------------------------


def nested_model() -> nn.Module:
    tt.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16),
        nn.Sequential(nn.BatchNorm1d(16), nn.ReLU(), nn.Sequential(nn.Dropout(0.5), nn.Linear(16, 3))),
    )


def test_train_epoch_puts_every_module_in_training_mode() -> None:
    model = nested_model().eval()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    trainer.train_epoch(DataLoader(dataset(64), batch_size=32))
    assert all(m.training for m in model.modules())


def test_evaluate_runs_nested_layers_in_eval_mode_without_a_graph_and_restores_modes(device: str) -> None:
    model = nested_model().to(device)
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    loader = DataLoader(dataset(100), batch_size=32, device=device)
    running = {k: v.numpy() for k, v in model.state_dict().items() if "running" in k}
    first, second = trainer.evaluate(loader), trainer.evaluate(loader)
    assert first == second, "Dropout two levels down must be off, BatchNorm must use running statistics"
    assert all(np.array_equal(model.state_dict()[k].numpy(), v) for k, v in running.items()), "no BN update"
    assert all(p.grad is None for p in model.parameters())
    assert all(m.training for m in model.modules())
    model[1].eval()
    model[1][2].train()
    modes = [m.training for m in model.modules()]
    trainer.evaluate(loader)
    assert [m.training for m in model.modules()] == modes, "a mixed state comes back as it was"
    with tt.no_grad():
        model.eval()
        out = model(tt.tensor(FEATURES[:100], device=device))
        model.train()
    expected = (out.numpy().argmax(axis=1) == LABELS[:100]).mean()
    assert first[1] == pytest.approx(expected) and 0 <= first[1] <= 1


def test_evaluate_restores_modes_when_the_model_fails() -> None:
    class Fails(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    model = nn.Sequential(nn.Linear(6, 3), Fails())
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(RuntimeError, match="boom"):
        trainer.evaluate(DataLoader(dataset(10), batch_size=5))
    assert all(m.training for m in model.modules())


def test_evaluate_accuracy_with_one_hot_targets_and_nan_for_regression() -> None:
    model = make_model()
    onehot = np.eye(3, dtype=np.float32)[LABELS[:50]]
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    _, by_index = trainer.evaluate(DataLoader(dataset(50), batch_size=20))
    _, by_onehot = trainer.evaluate(DataLoader(TensorDataset(FEATURES[:50], onehot), batch_size=20))
    assert by_index == by_onehot
    line = nn.Linear(6, 1)
    regression = Trainer(line, tt.SGD(line.parameters(), lr=0.1), nn.MSELoss())
    targets = np.ones((50, 1), np.float32)
    loss, accuracy = regression.evaluate(DataLoader(TensorDataset(FEATURES[:50], targets), batch_size=20))
    with tt.no_grad():
        expected = ((line(tt.tensor(FEATURES[:50])).numpy() - 1) ** 2).mean()
    assert loss == pytest.approx(expected, rel=1e-5) and math.isnan(accuracy)  # (N, 1) outputs: not class scores


# -- fit -----------------------------------------------------------------------------------------


def test_fit_trains_until_epoch_equals_epochs_and_records_history() -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    train, val = DataLoader(dataset(), batch_size=64, shuffle=True, seed=1), DataLoader(dataset(100), batch_size=50)
    history = trainer.fit(train, val, epochs=3, progress=False)
    assert history is trainer.history and trainer.epoch == 3 and trainer.step == 12
    assert all(len(history[key]) == 3 for key in tt.training.HISTORY_KEYS)
    trainer.fit(train, val, epochs=5, progress=False)
    assert trainer.epoch == 5 and len(history["eval_loss"]) == 5
    with pytest.warns(UserWarning, match=r"at epoch 5, past the target 2; nothing to train"):
        trainer.fit(train, val, epochs=2, progress=False)
    assert trainer.epoch == 5, "fit(epochs=n) trains until epoch == n, never back"
    assert history["train_loss"][-1] < history["train_loss"][0]
    with pytest.raises(ValueError, match="epochs"):
        trainer.fit(train, epochs=-1)


@pytest.mark.parametrize("arguments, match", [
    ({"train_loader": None}, r"train_loader must be a data loader.*got train_loader=None"),
    ({"val_loader": 3}, r"val_loader must be a data loader.*got val_loader=3"),
    ({"callbacks": [object()]}, r"callbacks\[0\] must be a callback.*got callbacks\[0\]=<object object.*on_fit_begin"),
    ({"callbacks": tt.callbacks.Callback()}, r"callbacks must be a list of callbacks"),
    ({"epochs": 2.0}, r"epochs must be a whole number, got epochs=2\.0"),
])
def test_fit_checks_its_arguments_before_anything_runs(arguments, match) -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    before = weights(model)
    with pytest.raises(TypeError, match=match):
        trainer.fit(**{"train_loader": DataLoader(dataset(10), batch_size=5), "progress": False, **arguments})
    assert trainer.epoch == 0 and trainer.history["train_loss"] == []
    assert_close(weights(model), before, atol=0)


def test_a_callback_can_stop_fit() -> None:
    class StopAtTwo(tt.callbacks.Callback):
        def on_epoch_end(self, trainer, logs):
            assert set(logs) == {"epoch", "step", "lr", "train_loss", "eval_loss", "eval_accuracy", "grad_norm", "seconds",
                                 "train_seconds"}
            assert logs["eval_loss"] is None and logs["epoch"] == trainer.epoch
            trainer.stop_training = trainer.epoch == 2

    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    trainer.fit(DataLoader(dataset(64), batch_size=32), epochs=10, callbacks=[StopAtTwo()], progress=False)
    assert trainer.epoch == 2 and trainer.history["eval_loss"] == []


def test_train_seconds_leave_the_evaluation_out() -> None:
    class SlowBatches:  # a validation loader whose every batch takes 50 ms to arrive
        def __iter__(self):
            for batch in DataLoader(dataset(8), batch_size=4):
                time.sleep(0.05)
                yield batch

    rows = []

    class Keep(tt.callbacks.Callback):
        def on_epoch_end(self, trainer, logs):
            rows.append(logs)

    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    trainer.fit(DataLoader(dataset(16), batch_size=4), SlowBatches(), max_steps=4, eval_every=2, eval_batches=2,
                callbacks=[Keep()], progress=False)
    assert len(rows) == 2
    for logs in rows:
        assert 0 < logs["train_seconds"] and logs["seconds"] - logs["train_seconds"] >= 0.1, logs


def test_same_seed_same_history() -> None:
    def run(seed: int = 7) -> dict:
        tt.manual_seed(seed)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
        trainer = Trainer(model, tt.Adam(model.parameters(), lr=0.01), nn.CrossEntropyLoss(),
                          scheduler=tt.CosineSchedule(0.01, 0.001, total_epochs=3))
        trainer.fit(DataLoader(dataset(), batch_size=32, shuffle=True), DataLoader(dataset(64), batch_size=64),
                    epochs=3, progress=False)
        return trainer.history | {"w": weights(model)}

    first, second = run(), run()
    assert all(np.array_equal(a, b) for a, b in zip(first["w"], second["w"], strict=True))
    for key in ("train_loss", "eval_loss", "eval_accuracy", "learning_rates"):
        assert first[key] == second[key], key
    assert run(8)["train_loss"] != first["train_loss"]


def test_progress_bars_do_not_change_the_run(capsys) -> None:
    pytest.importorskip("tqdm")

    def run(progress: bool) -> list[float]:
        tt.manual_seed(3)
        model = make_model(seed=3)
        trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
        trainer.fit(DataLoader(dataset(), batch_size=32, shuffle=True), epochs=3, progress=progress)
        return trainer.history["train_loss"]

    assert run(True) == run(False), "a bar must not draw an extra shuffle from the loader"


def test_progress_bars_only_when_asked_or_interactive(capsys) -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    loader = DataLoader(dataset(64), batch_size=32)
    trainer.fit(loader, epochs=1)  # pytest captures stdout: not a terminal
    assert capsys.readouterr().err == ""
    pytest.importorskip("tqdm")
    trainer.fit(loader, epochs=2, progress=True)
    assert "training" in capsys.readouterr().err


# -- memory and plots ---------------------------------------------------------------------------


@pytest.mark.parametrize("make, state_per_param", [
    (lambda p: tt.SGD(p, lr=0.1), 0),
    (lambda p: tt.SGD(p, lr=0.1, momentum=0.9), 1),
    (lambda p: tt.Adam(p), 2),
    (lambda p: tt.AdamW(p), 2),
])
def test_memory_report_matches_the_real_arrays(make, state_per_param: int, device: str) -> None:
    model = nested_model().to(device)
    optimizer = make(model.parameters())
    before = memory_report(model, optimizer)
    parameter_bytes = sum(p.data.nbytes for p in model.parameters())
    assert before["parameters"] == parameter_bytes == 4 * sum(p.size for p in model.parameters())
    assert before["gradients"] == 0
    Trainer(model, optimizer, nn.CrossEntropyLoss()).train_epoch(DataLoader(dataset(64), batch_size=64, device=device))
    report = memory_report(model, optimizer)
    assert report["gradients"] == parameter_bytes
    buffers = sum(v.nbytes for state in optimizer.state for v in state.values() if hasattr(v, "nbytes"))
    assert report["optimizer_state"] >= buffers >= state_per_param * parameter_bytes
    assert report["optimizer_state"] <= state_per_param * parameter_bytes + 64 * len(optimizer.params)
    assert report["total"] == sum(report[k] for k in ("parameters", "gradients", "optimizer_state"))
    assert report["ratio"] == pytest.approx(2 + state_per_param, abs=0.01)


def test_plot_history_draws_three_panels_and_saves(tmp_path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    history = {"train_loss": [1.0, 0.5, 0.3], "eval_loss": [1.1, 0.7, 0.6], "eval_accuracy": [0.5, 0.7, 0.8],
               "learning_rates": [0.1, 0.05, 0.01]}
    figure = plot_history(history, tmp_path / "history.png")
    assert len(figure.axes) == 3 and (tmp_path / "history.png").stat().st_size > 1000
    assert len(figure.axes[0].lines) == 2
    figure = plot_history({"train_loss": [1.0], "learning_rates": [0.1]})  # no evaluation: still draws
    assert len(figure.axes[1].texts) == 1
    import matplotlib.pyplot as plt

    plt.close("all")


def test_clip_returns_the_true_norm_of_large_finite_gradients() -> None:
    """100 float32 gradients of 1e20: the float32 sum of squares (1e42) overflows, the norm 1e21 does not."""
    p = tt.zeros(100, requires_grad=True)
    p.grad = tt.tensor(np.full(100, 1e20, np.float32))
    assert clip_grad_norm([p], 1.0) == pytest.approx(1e21, rel=1e-6)
    np.testing.assert_allclose(p.grad.numpy(), 0.1, rtol=1e-5)
    p.grad = tt.tensor(np.r_[np.full(99, 1e20), np.inf].astype(np.float32))
    assert clip_grad_norm([p], 1.0) == math.inf, "an inf gradient still gives inf"


def test_clip_takes_a_single_tensor() -> None:
    p = tt.zeros((2, 2), requires_grad=True)
    p.grad = tt.tensor([[3.0, 0.0], [0.0, 4.0]])
    assert clip_grad_norm(p, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(p.grad.numpy(), [[0.6, 0.0], [0.0, 0.8]], rtol=1e-5)


def batchnorm_model() -> nn.Module:
    tt.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def running_statistics(model: nn.Module) -> dict[str, np.ndarray]:
    return {key: value.numpy().copy() for key, value in model.state_dict().items() if "running" in key}


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
def test_a_skipped_step_leaves_batchnorm_running_statistics_as_they_were() -> None:
    spoiled = FEATURES[:100].copy()
    spoiled[25:50] = np.nan  # the second batch: its forward pass would put nan into the statistics
    model = batchnorm_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    trainer.train_epoch(DataLoader(TensorDataset(spoiled, LABELS[:100]), batch_size=25))
    assert trainer.skipped_steps == 1 and trainer.step == 3
    # the same statistics and weights as a run that never saw that batch
    reference = batchnorm_model()
    keep = np.r_[0:25, 50:100]
    Trainer(reference, tt.SGD(reference.parameters(), lr=0.1), nn.CrossEntropyLoss()).train_epoch(
        DataLoader(TensorDataset(FEATURES[keep], LABELS[keep]), batch_size=25))
    assert running_statistics(model).keys() == running_statistics(reference).keys() != set()
    for key, value in reference.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[key].numpy(), value.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
def test_a_step_that_raises_leaves_batchnorm_running_statistics_as_they_were() -> None:
    model = batchnorm_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), on_nonfinite="raise")
    trainer.train_epoch(DataLoader(TensorDataset(FEATURES[:25], LABELS[:25]), batch_size=25))
    before = running_statistics(model)
    spoiled = FEATURES[:25].copy()
    spoiled[3] = np.nan
    with pytest.raises(FloatingPointError, match="loss is nan"):
        trainer.train_epoch(DataLoader(TensorDataset(spoiled, LABELS[:25]), batch_size=25))
    for key, value in before.items():
        np.testing.assert_array_equal(running_statistics(model)[key], value, err_msg=key)


# -- schedules per step, and fit(max_steps=...) ---------------------------------------------------

class RecordingSGD(tt.SGD):
    """SGD that records the rate of every step it takes."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen: list[float] = []

    def step(self):
        self.seen.append(self.lr)
        super().step()


def step_trainer(schedule=None, lr: float = 0.1, **settings) -> Trainer:
    model = make_model()
    return Trainer(model, RecordingSGD(model.parameters(), lr=lr), nn.CrossEntropyLoss(), scheduler=schedule,
                   scheduler_interval="step", **settings)


def test_a_per_step_schedule_gives_step_t_the_rate_get_lr_t() -> None:
    schedule = tt.CosineSchedule(max_lr=0.2, min_lr=0.02, total_epochs=6, warmup_epochs=2)
    trainer = step_trainer(schedule)
    trainer.fit(DataLoader(dataset(128), batch_size=32, shuffle=True, seed=0), epochs=2, progress=False)
    expected = [schedule.get_lr(t) for t in range(8)]
    assert trainer.optimizer.seen == expected and expected[:3] == [0.2 / 3, 0.4 / 3, 0.2]
    assert trainer.history["learning_rates"] == [expected[3], expected[7]], "a row records the rate of its last step"
    assert trainer.history["step"] == [4, 8]


def test_a_skipped_step_does_not_advance_a_per_step_schedule() -> None:
    class NanSecond:
        reduction = "mean"

        def __init__(self):
            self.calls = 0

        def __call__(self, outputs, targets):
            self.calls += 1
            loss = nn.CrossEntropyLoss()(outputs, targets)
            return loss * float("nan") if self.calls == 2 else loss

    schedule = tt.StepSchedule(lr=1.0, step_size=1, gamma=0.5)  # step t at 2 ** -t
    model = make_model()
    trainer = Trainer(model, RecordingSGD(model.parameters(), lr=9.0), NanSecond(), scheduler=schedule,
                      scheduler_interval="step")
    trainer.train_epoch(DataLoader(dataset(128), batch_size=32))
    assert trainer.skipped_steps == 1 and trainer.optimizer.seen == [1.0, 0.5, 0.25]


def test_fit_by_steps_rows_at_every_evaluation_and_across_epochs() -> None:
    train = DataLoader(dataset(64), batch_size=16, shuffle=True, seed=3)  # 4 batches an epoch
    val = DataLoader(dataset(40), batch_size=20)
    trainer = step_trainer(lr=0.1)
    history = trainer.fit(train, val, max_steps=10, eval_every=4, progress=False)
    assert trainer.step == 10 and trainer.epoch == 0 and history["step"] == [4, 8, 10]
    assert all(len(history[key]) == 3 for key in tt.training.HISTORY_KEYS)
    assert train.epoch == 2 and train.state_dict()["position"] == 2, "10 batches: two epochs and two batches"
    again = DataLoader(dataset(64), batch_size=16, shuffle=True, seed=3)
    batches = [batch for _ in range(3) for batch in again][:10]  # the same ten batches, epoch after epoch
    reference = step_trainer(lr=0.1)
    reference.train_epoch(batches)
    assert all(np.array_equal(a, b) for a, b in zip(weights(reference.model), weights(trainer.model)))
    assert history["eval_loss"][-1] == trainer.evaluate(val)[0]


def test_each_row_reports_the_mean_loss_per_sample_of_its_own_steps() -> None:
    losses: list[tuple[float, int]] = []

    class Recorded:
        reduction = "mean"

        def __call__(self, outputs, targets):
            loss = nn.CrossEntropyLoss()(outputs, targets)
            losses.append((loss.item(), len(targets)))
            return loss

    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), Recorded())
    history = trainer.fit(DataLoader(dataset(50), batch_size=20), max_steps=5, eval_every=3, progress=False)
    rows = [losses[:3], losses[3:5]]  # batches of 20, 20, 10 | 20, 20
    expected = [sum(m * n for m, n in row) / sum(n for _, n in row) for row in rows]
    np.testing.assert_allclose(history["train_loss"], expected, rtol=1e-6)
    assert history["step"] == [3, 5] and history["eval_loss"] == []


def test_eval_batches_reads_the_val_loader_as_a_stream() -> None:
    val = DataLoader(dataset(60), batch_size=20)  # 3 batches
    trainer = step_trainer()
    evaluated: list[list] = []
    original = trainer.evaluate

    def recording_evaluate(batches):
        batches = list(batches)
        evaluated.append([yb.numpy().tolist() for _, yb in batches])
        return original(batches)

    trainer.evaluate = recording_evaluate
    trainer.fit(DataLoader(dataset(64), batch_size=32), val, max_steps=6, eval_every=2, eval_batches=2,
                progress=False)
    labels = [yb.numpy().tolist() for _, yb in val]
    assert evaluated == [labels[0:2], [labels[2], labels[0]], labels[1:3]]


def test_an_endless_loader_trains_by_steps_and_needs_eval_batches_to_evaluate() -> None:
    class Endless:
        """Random batches forever, no len()."""

        def __init__(self):
            self.rng = np.random.default_rng(0)

        def __iter__(self):
            while True:
                rows = self.rng.integers(0, 256, 16)
                yield tt.tensor(FEATURES[rows]), tt.tensor(LABELS[rows])

    trainer = step_trainer()
    trainer.fit(Endless(), Endless(), max_steps=7, eval_every=5, eval_batches=3, progress=False)
    assert trainer.step == 7 and trainer.history["step"] == [5, 7] and len(trainer.history["eval_loss"]) == 2
    with pytest.raises(ValueError, match=r"val_loader \(a Endless\) has no len\(\).*eval_batches=N"):
        trainer.fit(Endless(), Endless(), max_steps=9, progress=False)
    assert trainer.step == 7


def test_fit_by_steps_with_accumulation_counts_optimizer_steps() -> None:
    train = DataLoader(dataset(64), batch_size=16)
    trainer = step_trainer()
    trainer.fit(train, max_steps=3, accumulation_steps=2, progress=False)
    assert trainer.step == 3 and len(trainer.optimizer.seen) == 3
    assert (train.epoch, train.state_dict()["position"]) == (1, 2), "6 batches read, a window spans two epochs"


def test_fit_by_steps_continues_where_the_last_fit_stopped() -> None:
    def run(*targets: int) -> Trainer:
        tt.manual_seed(5)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 3))
        schedule = tt.CosineSchedule(max_lr=0.1, min_lr=0.01, total_epochs=12, warmup_epochs=3)
        trainer = Trainer(model, tt.AdamW(tt.optim.weight_decay_groups(model.parameters(), 0.1), lr=0.1),
                          nn.CrossEntropyLoss(), scheduler=schedule, scheduler_interval="step", grad_clip_norm=1.0)
        train = DataLoader(dataset(100), batch_size=16, shuffle=True, seed=2)  # 7 batches: epochs end mid-run
        val = DataLoader(dataset(90), batch_size=30, shuffle=True, seed=4)
        for target in targets:
            trainer.fit(train, val, max_steps=target, eval_every=4, eval_batches=2, progress=False)
        return trainer

    straight, pieces, halves = run(14), run(5, 9, 14), run(8, 14)
    assert all(np.array_equal(a, b) for a, b in zip(weights(straight.model), weights(pieces.model)))
    assert straight.history["step"] == [4, 8, 12, 14] and pieces.history["step"] == [4, 5, 8, 9, 12, 14]
    assert all(np.array_equal(a, b) for a, b in zip(weights(straight.model), weights(halves.model)))
    for key in ("train_loss", "eval_loss", "learning_rates", "grad_norm", "step"):
        assert halves.history[key] == straight.history[key], f"{key}: the val stream continues too"


def test_a_callback_sees_the_step_and_can_stop_fit_by_steps() -> None:
    class StopAtSix(tt.callbacks.Callback):
        def on_epoch_end(self, trainer, logs):
            assert logs["step"] == trainer.step and logs["epoch"] == trainer.epoch == 0
            trainer.stop_training = logs["step"] >= 6

    trainer = step_trainer()
    trainer.fit(DataLoader(dataset(64), batch_size=16), max_steps=100, eval_every=3, callbacks=[StopAtSix()],
                progress=False)
    assert trainer.step == 6 and trainer.history["step"] == [3, 6]
    with pytest.warns(UserWarning, match=r"fit\(max_steps=4\): the trainer is at step 6, past the target 4"):
        trainer.fit(DataLoader(dataset(64), batch_size=16), max_steps=4, progress=False)
    assert trainer.step == 6


@pytest.mark.parametrize("arguments, error, match", [
    ({"epochs": 2, "max_steps": 5}, ValueError, r"epochs or max_steps, not both: got epochs=2, max_steps=5"),
    ({"eval_every": 5}, ValueError, r"eval_every belongs to fit\(max_steps=...\).*got eval_every=5"),
    ({"epochs": 3, "eval_batches": 2}, ValueError, r"eval_batches belongs to fit\(max_steps=...\)"),
    ({"max_steps": -1}, ValueError, r"max_steps must be a whole number >= 0, got max_steps=-1"),
    ({"max_steps": 5, "eval_every": 0}, ValueError, r"eval_every must be a whole number >= 1, got eval_every=0"),
    ({"max_steps": 5, "eval_batches": 1.5}, TypeError, r"eval_batches must be a whole number, got eval_batches=1.5"),
    ({"max_steps": 5.0}, TypeError, r"max_steps must be a whole number"),
])
def test_fit_by_steps_checks_its_arguments_before_anything_runs(arguments, error, match) -> None:
    trainer = step_trainer()
    before = weights(trainer.model)
    with pytest.raises(error, match=match):
        trainer.fit(DataLoader(dataset(10), batch_size=5), progress=False, **arguments)
    assert trainer.step == 0 and trainer.history["train_loss"] == []
    assert_close(weights(trainer.model), before, atol=0)


def test_fit_by_steps_needs_a_schedule_over_steps() -> None:
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                      scheduler=tt.CosineSchedule(0.1, 0.01, total_epochs=10))
    with pytest.raises(ValueError, match=r"scheduler_interval='step'"):
        trainer.fit(DataLoader(dataset(10), batch_size=5), max_steps=4, progress=False)
    with pytest.raises(ValueError, match=r"scheduler_interval must be 'epoch' or 'step', got 'batch'"):
        Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), scheduler_interval="batch")


def test_fit_by_steps_on_a_loader_without_batches_is_an_error() -> None:
    trainer = step_trainer()
    with pytest.raises(ValueError, match="the train loader yielded no batches"):
        trainer.fit([], max_steps=3, progress=False)
    assert trainer.step == 0


def test_fit_by_steps_draws_one_progress_bar_of_steps(capsys) -> None:
    pytest.importorskip("tqdm")
    trainer = step_trainer()
    trainer.fit(DataLoader(dataset(64), batch_size=16), max_steps=5, eval_every=2, progress=True)
    assert "5/5" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")
def test_fit_by_steps_stops_when_every_step_is_skipped() -> None:
    """An endless stream of skipped steps never reaches max_steps: it stops with an error instead of hanging."""
    model = make_model()
    trainer = Trainer(model, tt.SGD(model.parameters(), lr=0.1), lambda out, y: nn.CrossEntropyLoss()(out, y) * np.nan)
    train = DataLoader(dataset(64), batch_size=16, shuffle=True, seed=3)
    with pytest.raises(FloatingPointError, match="100 steps in a row were skipped .* never reach step 5"):
        trainer.fit(train, max_steps=5, progress=False)
    assert trainer.step == 0 and trainer.skipped_steps == 100


@pytest.mark.parametrize("layers", [1, 6])
@pytest.mark.parametrize("clip, precision, reads_per_step", [
    (None, "32-true", 1),  # the window's loss, read once after its micro-batches
    (1.0, "32-true", 2),  # + the global gradient norm: one partial sum per device
    (None, "16-mixed", 2),  # + the loss scaler's overflow check: one read for all gradients
    (1.0, "16-mixed", 3),
])
def test_host_reads_per_step_do_not_grow_with_micro_batches_or_parameters(layers, clip, precision, reads_per_step):
    """On a GPU every read to the host waits for the device: the strict device counts them. A step
    of two micro-batches reads what it must, once each, whatever the number of parameters.
    (MSE on one-hot targets: cross-entropy's class-index check reads once per batch besides.)"""
    tt.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(layers)],
                          nn.Linear(6, 3)).to("strict")
    trainer = Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), grad_clip_norm=clip,
                      precision=precision)
    rng = np.random.default_rng(0)
    one_hot = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 60)]
    data = TensorDataset(rng.standard_normal((60, 6)).astype(np.float32), one_hot)
    before = host_reads()
    trainer.train_epoch(DataLoader(data, batch_size=10, device="strict"), accumulation_steps=2)
    assert trainer.step == 3 and trainer.skipped_steps == 0
    assert host_reads() - before == 3 * reads_per_step
