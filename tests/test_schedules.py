"""Learning-rate schedules: values, warmup, restarts, validation and state round trips."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain.serialization import read_checkpoint, write_checkpoint
from tinytrain.schedules import (
    CosineSchedule,
    CosineWarmRestarts,
    ExponentialSchedule,
    InverseSqrtSchedule,
    StepSchedule,
)


def cosine(max_lr: float, min_lr: float, epoch: int, total: int) -> float:
    return min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * epoch / total)) / 2


def test_public_names() -> None:
    assert tt.CosineSchedule is CosineSchedule and tt.StepSchedule is StepSchedule


def test_cosine_follows_the_formula_from_max_to_min() -> None:
    schedule = CosineSchedule(max_lr=0.1, min_lr=0.01, total_epochs=10)
    assert schedule.get_lr(0) == 0.1, "epoch 0 trains at max_lr"
    for epoch in range(10):
        assert schedule.get_lr(epoch) == pytest.approx(cosine(0.1, 0.01, epoch, 10), rel=1e-12)
    assert all(schedule.get_lr(epoch) == 0.01 for epoch in (10, 11, 1000)), "every epoch >= T at min_lr"
    assert schedule(3) == schedule.get_lr(3)


def test_cosine_defaults_match_the_design() -> None:
    schedule = CosineSchedule()
    assert (schedule.max_lr, schedule.min_lr, schedule.total_epochs, schedule.warmup_epochs) == (0.1, 0.01, 100, 0)


@given(
    max_lr=st.floats(1e-5, 10.0),
    fraction=st.floats(0.0, 1.0),
    total=st.integers(1, 200),
    warmup_share=st.floats(0.0, 0.99),
)
def test_cosine_with_warmup_ramps_then_decays(max_lr: float, fraction: float, total: int, warmup_share: float) -> None:
    min_lr = max_lr * fraction
    warmup = int(warmup_share * total)
    schedule = CosineSchedule(max_lr, min_lr, total, warmup)
    rates = [schedule.get_lr(e) for e in range(total + 3)]
    ramp = rates[: warmup + 1]
    assert all(a < b for a, b in zip(ramp, ramp[1:])), "warmup rises linearly"
    assert all(r == pytest.approx(max_lr * (e + 1) / (warmup + 1)) for e, r in enumerate(ramp))
    assert rates[warmup] == pytest.approx(max_lr), "epoch W is the first at max_lr"
    decay = rates[warmup:]
    assert all(a >= b - 1e-15 for a, b in zip(decay, decay[1:])), "then it never rises"
    assert all(min_lr - 1e-12 <= r <= max_lr + 1e-12 for r in decay)
    assert rates[total] == min_lr and rates[-1] == min_lr


def test_cosine_matches_pytorch_cosine_annealing() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=12, eta_min=0.001)
    ours = CosineSchedule(max_lr=0.1, min_lr=0.001, total_epochs=12)
    for epoch in range(13):  # PyTorch: the rate of epoch e after e calls of step()
        assert ours.get_lr(epoch) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
        optimizer.step()
        reference.step()


@pytest.mark.parametrize("first_cycle, cycle_mult", [(3, 1), (2, 2), (1, 3)])
def test_warm_restarts_match_sgdr(first_cycle: int, cycle_mult: int) -> None:
    schedule = CosineWarmRestarts(max_lr=1.0, min_lr=0.1, first_cycle=first_cycle, cycle_mult=cycle_mult)
    epoch, length = 0, first_cycle
    for _ in range(4):  # four cycles, each restarting at max_lr
        for t in range(length):
            assert schedule.get_lr(epoch + t) == pytest.approx(cosine(1.0, 0.1, t, length))
        assert schedule.get_lr(epoch) == 1.0
        epoch, length = epoch + length, length * cycle_mult


def test_warm_restarts_match_pytorch() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.5)
    reference = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=3, T_mult=2, eta_min=0.01)
    ours = CosineWarmRestarts(max_lr=0.5, min_lr=0.01, first_cycle=3, cycle_mult=2)
    for epoch in range(30):
        assert ours.get_lr(epoch) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-9)
        optimizer.step()
        reference.step()


def test_step_exponential_and_inverse_sqrt() -> None:
    step = StepSchedule(lr=1.0, step_size=3, gamma=0.5)
    assert [step.get_lr(e) for e in range(7)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    exponential = ExponentialSchedule(lr=2.0, gamma=0.5)
    assert [exponential.get_lr(e) for e in range(4)] == [2.0, 1.0, 0.5, 0.25]
    inverse = InverseSqrtSchedule(max_lr=1.0, warmup_epochs=3)
    assert [inverse.get_lr(e) for e in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert inverse.get_lr(15) == pytest.approx(0.5)  # sqrt(4 / 16)
    assert InverseSqrtSchedule(max_lr=1.0).get_lr(3) == pytest.approx(0.5)


ALL = [
    CosineSchedule(max_lr=0.3, min_lr=0.02, total_epochs=20, warmup_epochs=4),
    CosineWarmRestarts(max_lr=0.2, min_lr=0.01, first_cycle=4, cycle_mult=2),
    StepSchedule(lr=0.5, step_size=5, gamma=0.2),
    ExponentialSchedule(lr=0.4, gamma=0.9),
    InverseSqrtSchedule(max_lr=0.05, warmup_epochs=2),
]


@pytest.mark.parametrize("schedule", ALL, ids=lambda s: type(s).__name__)
def test_state_dict_round_trips_through_a_checkpoint_file(schedule, tmp_path) -> None:
    write_checkpoint(tmp_path / "s.ckpt", {"scheduler": schedule.state_dict()})
    fresh = type(schedule)()
    fresh.load_state_dict(read_checkpoint(tmp_path / "s.ckpt")["scheduler"])
    assert vars(fresh) == vars(schedule)
    assert [fresh.get_lr(e) for e in range(30)] == [schedule.get_lr(e) for e in range(30)]
    assert type(schedule).__name__ in repr(schedule)


def test_load_state_dict_refuses_another_schedule_or_bad_settings() -> None:
    with pytest.raises(ValueError, match="StepSchedule"):
        CosineSchedule().load_state_dict(StepSchedule().state_dict())
    bad = CosineSchedule().state_dict() | {"warmup_epochs": 500}
    with pytest.raises(ValueError, match="warmup_epochs"):
        CosineSchedule().load_state_dict(bad)
    with pytest.raises(ValueError, match="keys"):
        CosineSchedule().load_state_dict({"type": "CosineSchedule", "max_lr": 0.1})


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: CosineSchedule(max_lr=0), "max_lr"),
        (lambda: CosineSchedule(max_lr=-0.1), "max_lr"),
        (lambda: CosineSchedule(max_lr=float("nan")), "max_lr"),
        (lambda: CosineSchedule(max_lr=0.1, min_lr=0.2), "min_lr"),
        (lambda: CosineSchedule(min_lr=-1e-3), "min_lr"),
        (lambda: CosineSchedule(total_epochs=0), "total_epochs"),
        (lambda: CosineSchedule(total_epochs=10, warmup_epochs=10), "warmup_epochs"),
        (lambda: CosineWarmRestarts(first_cycle=0), "first_cycle"),
        (lambda: CosineWarmRestarts(cycle_mult=0), "cycle_mult"),
        (lambda: StepSchedule(step_size=0), "step_size"),
        (lambda: ExponentialSchedule(gamma=0), "gamma"),
        (lambda: InverseSqrtSchedule(warmup_epochs=-1), "warmup_epochs"),
    ],
)
def test_bad_settings_raise_naming_the_setting(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: CosineSchedule(total_epochs=2.5), "total_epochs=2.5"),
        (lambda: CosineSchedule(max_lr="0.1"), "max_lr='0.1'"),
        (lambda: StepSchedule(step_size=True), "step_size=True"),
    ],
)
def test_settings_of_the_wrong_type_raise_naming_the_setting(make, match) -> None:
    with pytest.raises(TypeError, match=match):
        make()


@pytest.mark.parametrize("schedule", ALL, ids=lambda s: type(s).__name__)
def test_bad_epochs_raise_naming_the_epoch(schedule) -> None:
    with pytest.raises(ValueError, match=r"epoch must be a whole number >= 0, got epoch=-1"):
        schedule.get_lr(-1)
    with pytest.raises(TypeError, match=r"epoch must be a whole number, got epoch=1\.5"):
        schedule.get_lr(1.5)
    with pytest.raises(TypeError, match=r"epoch=True"):
        schedule(True)


def test_every_subclass_gets_a_checked_epoch() -> None:
    class Halving(tt.schedules.Schedule):  # a schedule of one's own, which checks nothing itself
        def get_lr(self, epoch):
            return 0.5**epoch

    assert Halving().get_lr(2) == 0.25 and Halving()(np.int64(1)) == 0.5
    with pytest.raises(TypeError, match=r"epoch=1\.5"):
        Halving().get_lr(1.5)


def test_cosine_over_steps_is_nanogpts_warmup_and_cosine() -> None:
    """Counted in steps (Trainer(scheduler_interval="step")), CosineSchedule is nanoGPT's get_lr."""
    learning_rate, min_lr, warmup_iters, lr_decay_iters = 1e-3, 1e-4, 100, 2000

    def nanogpt(it: int) -> float:  # nanoGPT's train.py, as published
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    schedule = CosineSchedule(max_lr=1e-3, min_lr=1e-4, total_epochs=2000, warmup_epochs=100)
    for step in range(2101):
        assert math.isclose(schedule.get_lr(step), nanogpt(step), rel_tol=1e-12, abs_tol=1e-18), step
