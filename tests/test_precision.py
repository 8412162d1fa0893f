"""bfloat16 and the five precision modes (Module 17).

``tt.bfloat16`` tensors hold 2 bytes a number (ml_dtypes) on every test device; the
rounding written in the lesson matches ml_dtypes' cast bit for bit; matrix products and
sums with bfloat16 behave as on bfloat16 hardware (products and sums added up in float32,
rounded once). ``Trainer(precision=...)`` takes Lightning's five names: the milestone MLP
trains in each; the true modes keep weights, gradients and optimizer state in the low dtype
(half the bytes) and resume exactly; ``bf16-mixed`` keeps float32 masters and never scales
the loss; a device without bfloat16 (a CuPy without it, played by the fake) is refused with
a clear error, never run in float32.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
import tinytrain.nn as nn
from tinytrain.amp import MixedPrecision, ScaleGrad
from tinytrain.cuda import CupyBackend
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.datasets import Digits
from tinytrain.precision import PRECISIONS, HalfPrecision, bfloat16_to_float32, float32_to_bfloat16, precision_plugin
from tinytrain.serialization import read_checkpoint, write_checkpoint
from tinytrain.testing.fake_cupy import forget_fake_gpu, register_fake_gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(0)


def bits_of(values) -> np.ndarray:
    """float32 numbers with the given bit patterns."""
    return np.array(values, dtype=np.uint32).view(np.float32)


def ml_dtypes_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when it casts a NaN
        return x.astype(BF16).view(np.uint16)


# -- the dtype --------------------------------------------------------------------------------------

def test_bfloat16_is_a_two_byte_floating_tensor_dtype_on_every_device(device) -> None:
    assert tt.bfloat16 == BF16 == tt.tensor([1.0], dtype="bfloat16").dtype
    for made in (tt.zeros(3, 4, dtype="bfloat16", device=device), tt.ones(2, dtype=tt.bfloat16, device=device),
                 tt.tensor([0.5, 2.0], dtype="bfloat16", device=device),
                 tt.randn(3, device=device).astype("bfloat16")):
        assert made.dtype == BF16 and made.data.nbytes == 2 * made.size
    x = tt.tensor([1.0, 3.0], dtype="bfloat16", device=device, requires_grad=True)
    (x * 2.0).sum().backward()
    assert x.grad.dtype == BF16 and x.grad.numpy().tolist() == [2.0, 2.0]
    assert (x * 0.5).dtype == BF16 and x.exp().dtype == BF16 and x.mean().dtype == BF16
    assert (x + tt.tensor([1, 2], device=device)).dtype == BF16, "an integer tensor takes the float's dtype"
    assert (x + tt.ones(2, device=device)).dtype == np.float32, "bfloat16 with float32 computes in float32"


def test_random_numbers_are_drawn_in_float32_or_float64_and_cast(device) -> None:
    with pytest.raises(TypeError, match="bfloat16"):
        tt.randn(3, dtype="bfloat16", device=device)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=50))
def test_the_lessons_rounding_matches_ml_dtypes_bit_for_bit(patterns) -> None:
    x = bits_of(patterns)
    assert np.array_equal(float32_to_bfloat16(x).view(np.uint16), ml_dtypes_bits(x))


def test_rounding_ties_to_even_keeps_nan_and_overflows_to_infinity() -> None:
    x = bits_of([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800001, 0xFFFFFFFF, 0x00000001])
    expected = [0x3F80, 0x3F82, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x0000]
    assert float32_to_bfloat16(x).view(np.uint16).tolist() == expected == ml_dtypes_bits(x).tolist()
    every_bfloat16 = np.arange(2**16, dtype=np.uint16).view(BF16)
    widened = bfloat16_to_float32(every_bfloat16)
    assert widened.dtype == np.float32 and np.array_equal(widened.view(np.uint32) >> 16, np.arange(2**16))
    assert np.array_equal(float32_to_bfloat16(widened).view(np.uint16)[~np.isnan(widened)],
                          np.arange(2**16, dtype=np.uint16)[~np.isnan(widened)]), "widening then rounding is exact"


def test_products_with_a_bfloat16_operand_are_rounded_float32_products(device) -> None:
    a = tt.tensor(RNG.standard_normal((5, 7)), dtype="bfloat16", device=device, requires_grad=True)
    b = tt.tensor(RNG.standard_normal((7, 3)), dtype="float32", device=device, requires_grad=True)
    product = a @ b
    exact = a.numpy().astype(np.float32) @ b.numpy().astype(BF16).astype(np.float32)
    assert product.dtype == BF16 and np.array_equal(product.numpy(), exact.astype(BF16))
    product.astype("float32").sum().backward()
    assert a.grad.dtype == BF16 and b.grad.dtype == np.float32
    layer = nn.Linear(7, 3).to(device=device, dtype="bfloat16")
    assert layer(a).dtype == BF16 and layer(a.astype("float32")).dtype == BF16
    conv = nn.Conv2d(2, 3, 3, padding=1).to(device=device, dtype="bfloat16")
    assert conv(tt.randn(2, 2, 5, 5, device=device)).dtype == BF16, "a float32 image through a bfloat16 conv"


def test_sums_and_means_of_bfloat16_add_up_in_float32(device) -> None:
    """ml_dtypes adds bfloat16 numbers in bfloat16: 4,096 ones would sum to 256."""
    ones = tt.ones(64, 4096, dtype="bfloat16", device=device)
    assert ones.sum().item() == 64 * 4096 and ones.sum(axis=1).numpy().tolist() == [4096] * 64
    assert ones.mean().item() == 1 and ones.sum().dtype == BF16
    logits = tt.tensor(RNG.standard_normal((4096, 10)), device=device)
    labels = tt.tensor(RNG.integers(0, 10, 4096), device=device)
    full = nn.functional.cross_entropy(logits, labels).item()
    assert abs(nn.functional.cross_entropy(logits.astype("bfloat16"), labels).item() - full) < 0.02 * full
    norm = nn.BatchNorm1d(3).to(device=device, dtype="bfloat16")
    norm(tt.tensor(RNG.standard_normal((4096, 3)) * 2 + 5, dtype="bfloat16", device=device))
    assert np.allclose(norm.running_mean.numpy().astype(np.float32), 0.5, atol=0.02), "batch statistics"


def test_modules_move_to_bfloat16_and_back_and_load_bfloat16_states(device, tmp_path) -> None:
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(device=device)
    original = model.state_dict()
    model.to(dtype="bfloat16")
    assert {str(p.dtype) for p in model.parameters()} == {"bfloat16"}
    assert model[1].num_batches_tracked.dtype == np.int64
    write_checkpoint(tmp_path / "bf16.ckpt", {"model": model.state_dict()})
    state = read_checkpoint(tmp_path / "bf16.ckpt")["model"]
    assert state["0.weight"].dtype == BF16
    model.to(dtype="float32")
    assert {str(p.dtype) for p in model.parameters()} == {"float32"}
    model.load_state_dict(state)
    assert np.array_equal(model[0].weight.numpy(), original["0.weight"].numpy().astype(BF16).astype(np.float32))
    with pytest.raises(TypeError, match="int32"):
        model.to(dtype="int32")


# -- the precision modes --------------------------------------------------------------------------

def test_trainer_names_the_five_precisions_for_an_unknown_one() -> None:
    assert list(PRECISIONS) == ["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]
    model = nn.Linear(2, 2)
    for bad in ("bf16", "fp16", 16, None):
        with pytest.raises(ValueError, match=r"'32-true', '16-mixed', 'bf16-mixed', '16-true', 'bf16-true'.*got"):
            tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), precision=bad)
    assert precision_plugin("32-true") is None
    assert type(precision_plugin("bf16-mixed")) is MixedPrecision and type(precision_plugin("16-true")) is HalfPrecision
    with pytest.raises(ValueError, match="'16-true' or 'bf16-true', got '16-mixed'"):
        HalfPrecision("16-mixed")
    with pytest.raises(ValueError, match="scales no loss"):
        MixedPrecision("bf16-mixed", scaler=tt.amp.GradScaler())


def digits_trainer(precision: str, epochs: int) -> tuple[tt.Trainer, DataLoader, DataLoader]:
    """The MLP milestone's model and recipe: 64-128-64-10, SGD with Nesterov momentum, a cosine schedule."""
    tt.manual_seed(0)
    train, test = Digits(train=True), Digits(train=False)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    optimizer = tt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    trainer = tt.Trainer(model, optimizer, nn.CrossEntropyLoss(), precision=precision, grad_clip_norm=5.0,
                         scheduler=tt.CosineSchedule(max_lr=0.1, min_lr=0.001, total_epochs=epochs))
    return (trainer, DataLoader(TensorDataset(train.images, train.labels), batch_size=64, shuffle=True, seed=0),
            DataLoader(TensorDataset(test.images, test.labels), batch_size=512))


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_every_precision_trains_the_milestone_mlp(precision) -> None:
    trainer, train, test = digits_trainer(precision, epochs=5)
    trainer.fit(train, epochs=5, progress=False)
    loss, accuracy = trainer.evaluate(test)
    assert accuracy > 0.93 and loss < 0.3 and trainer.skipped_steps == 0, (loss, accuracy)


def test_bf16_true_keeps_everything_in_bfloat16_at_half_the_bytes() -> None:
    reports = {}
    for precision in ("32-true", "bf16-true"):
        trainer, train, _ = digits_trainer(precision, epochs=1)
        trainer.fit(train, epochs=1, progress=False)
        reports[precision] = tt.memory_report(trainer.model, trainer.optimizer)
    params = trainer.model.parameters()
    assert all(p.dtype == BF16 and p.grad.dtype == BF16 for p in params)
    assert all(buffer.dtype == BF16 for state in trainer.optimizer.state for buffer in state.values())
    for key in ("parameters", "gradients", "optimizer_state", "total"):
        assert reports["bf16-true"][key] * 2 == reports["32-true"][key], key


def test_bf16_mixed_keeps_float32_masters_and_never_scales_the_loss(monkeypatch) -> None:
    scaled = []
    monkeypatch.setattr(ScaleGrad, "forward", lambda self, a, scale: scaled.append(scale) or a.copy())
    trainer, train, _ = digits_trainer("bf16-mixed", epochs=1)
    seen = []
    forward = trainer.model.forward
    monkeypatch.setattr(trainer.model, "forward",
                        lambda x: seen.append({p.dtype for p in trainer.model.parameters()}) or forward(x))
    trainer.fit(train, epochs=1, progress=False)
    assert trainer._amp.scaler is None and scaled == [], "bf16-mixed has no loss scale"
    assert seen and all(dtypes == {BF16} for dtypes in seen), "the forward runs on bfloat16 copies"
    assert all(p.dtype == np.float32 and p.grad.dtype == np.float32 for p in trainer.model.parameters())
    assert all(buffer.dtype == np.float32 for state in trainer.optimizer.state for buffer in state.values())


def test_16_true_runs_in_float16_and_resumes_exactly(tmp_path) -> None:
    trainer, train, _ = digits_trainer("16-true", epochs=2)
    assert all(p.dtype == np.float16 for p in trainer.model.parameters())
    trainer.fit(train, epochs=1, progress=False)
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    trainer.fit(train, epochs=2, progress=False)
    straight = [p.numpy() for p in trainer.model.parameters()]
    resumed, train, _ = digits_trainer("16-true", epochs=2)
    resumed.load_checkpoint(tmp_path / "half.ckpt")
    resumed.fit(train, epochs=2, progress=False)
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(straight, resumed.model.parameters()))
    assert read_checkpoint(tmp_path / "half.ckpt")["plugins"]["precision"] == {"precision": "16-true"}


def test_true_precision_casts_existing_gradients_buffers_and_optimizer_state() -> None:
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = tt.optim.Adam(model.parameters(), lr=0.01)
    model(tt.randn(5, 3)).sum().backward()
    optimizer.step()  # the state exists, in float32
    tt.Trainer(model, optimizer, nn.MSELoss(), precision="bf16-true")
    assert all(p.dtype == BF16 and p.grad.dtype == BF16 for p in model.parameters())
    assert model[1].running_mean.dtype == BF16 and model[1].num_batches_tracked.dtype == np.int64
    assert all(value.dtype == BF16 for state in optimizer.state for value in state.values() if hasattr(value, "dtype")
               and value.dtype.kind != "i")


def test_evaluation_of_a_bf16_true_model_adds_its_losses_up_in_float32() -> None:
    """The losses of an evaluation are summed over batches: in bfloat16, past 512 the sum moves
    in steps of 4, and an untrained model's losses of about 2.3 would add 4 each."""
    trainer, _, test = digits_trainer("bf16-true", epochs=1)
    loss, _ = trainer.evaluate(DataLoader(test.dataset, batch_size=1))
    reference = nn.Sequential(*[layer for layer in trainer.model]).to(dtype="float32")
    with tt.no_grad():
        expected = nn.functional.cross_entropy(reference(tt.tensor(test.dataset.arrays[0])),
                                               tt.tensor(test.dataset.arrays[1])).item()
    assert abs(loss - expected) < 0.05 * expected, (loss, expected)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_a_device_without_bfloat16_is_refused_not_run_in_float32(precision) -> None:
    register_fake_gpu(CupyBackend, devices=1)  # a CuPy without bfloat16
    try:
        model = nn.Linear(3, 2).to("fakecuda:0")
        optimizer = tt.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(RuntimeError, match=rf"precision='{precision}'.*bfloat16.*fakecuda:0"):
            tt.Trainer(model, optimizer, nn.MSELoss(), precision=precision)
        assert model.weight.dtype == np.float32, "nothing was cast"
        tt.Trainer(model, optimizer, nn.MSELoss(), precision="16-mixed")  # float16 it holds
        with pytest.raises(ValueError, match="Unsupported dtype bfloat16"):
            tt.zeros(2, dtype="bfloat16", device="fakecuda:0")
    finally:
        forget_fake_gpu()


def test_a_cupy_with_bfloat16_trains_in_it() -> None:
    register_fake_gpu(CupyBackend, devices=1, bfloat16=True)
    try:
        tt.manual_seed(0)
        model = nn.Linear(3, 2).to("fakecuda:0")
        trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), precision="bf16-true")
        data = TensorDataset(RNG.standard_normal((8, 3)).astype(np.float32), RNG.standard_normal((8, 2)).astype(np.float32))
        trainer.train_epoch(DataLoader(data, batch_size=4, device="fakecuda:0"))
        assert model.weight.dtype == BF16 and model.weight.device == "fakecuda:0" and trainer.step == 2
    finally:
        forget_fake_gpu()
