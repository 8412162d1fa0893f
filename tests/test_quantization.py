"""tt.quantization: codes and back, int8 per channel, observers, the exact int8 product, the frozen
quantized layers (their gradients, their checkpoints, their refusal to train), quantize_model on a GPT,
fake quantization and QAT, and NF4 with double quantization. Where PyTorch has the operation, the
results are compared with it (skipped without torch)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain.quantization import (
    DOUBLE_QUANT_BLOCK, EXACT_TERMS, NF4_BLOCK, NF4_LEVELS, FrozenQuantizedLinear, NF4Linear, NF4Weight, Observer,
    QATLinear, QuantizedLinear, choose_qparams, convert_qat, dequantize, double_quantize, fake_quantize, int8_linear,
    int8_matmul, integer_range, model_bytes, nf4_dequantize, nf4_quantize, prepare_qat, quantize,
    quantize_model, quantize_per_channel)
from tinytrain.serialization import read_checkpoint, write_checkpoint

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")
# torch.quantize_per_tensor and torch.quantize_per_channel warn that they will move (to torchao); they still compute
torch_quantized_tensors = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
RNG = np.random.default_rng(1919)


def mlp(device: str = "cpu", state: dict | None = None, bias: bool = True) -> tt.nn.Sequential:
    tt.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(64, 96, bias=bias), tt.nn.GELU(), tt.nn.Linear(96, 16, bias=bias))
    if state is not None:
        model.load_state_dict(state)
    return model.to(device)


def small_gpt(device: str = "cpu") -> tt.nn.GPT:
    tt.manual_seed(0)
    return tt.nn.GPT(tt.nn.GPTConfig(vocab_size=17, block_size=16, n_layer=2, n_head=2, n_embd=64)).to(device)


# -- codes and back -------------------------------------------------------------------------------------

def test_integer_range() -> None:
    assert integer_range() == (-128, 127) and integer_range(8, symmetric=True) == (-127, 127)
    assert integer_range(4) == (-8, 7) and integer_range(3, symmetric=True) == (-3, 3)
    for bits, error in ((9, ValueError), (1, ValueError), (8.0, TypeError)):
        with pytest.raises(error, match="bits"):
            integer_range(bits)


def test_choose_qparams_worked_example_and_errors() -> None:
    scale, zero_point = choose_qparams(-1.0, 3.0)
    assert np.isclose(scale.item(), 4 / 255) and zero_point.item() == -64
    assert (scale.shape, scale.dtype, zero_point.dtype) == ((), np.float32, np.int32)
    with pytest.raises(ValueError, match=r"low must not exceed high, got low=-1.0 > high=-2.0 at \(1,\)"):
        choose_qparams(tt.tensor([0.0, -1.0]), tt.tensor([1.0, -2.0]))
    with pytest.raises(ValueError, match=r"\(2,\) and \(3,\)"):
        choose_qparams(tt.zeros(2), tt.ones(3))
    with pytest.raises(RuntimeError, match="strict"):
        choose_qparams(tt.zeros(2), tt.ones(2, device="strict"))


@given(st.floats(-1e3, 1e3, width=32), st.floats(0, 1e3, width=32), st.booleans())
def test_quantize_round_trip_is_within_half_a_step_inside_the_range(low: float, width: float, symmetric: bool) -> None:
    high = low + width
    scale, zero_point = choose_qparams(low, high, symmetric=symmetric)
    qmin, qmax = integer_range(8, symmetric)
    values = tt.tensor(np.linspace(low, high, 101))
    back = dequantize(quantize(values, scale, zero_point, qmin, qmax), scale, zero_point).numpy()
    assert np.all(np.abs(back - values.numpy()) <= scale.item() / 2 * (1 + 1e-4) + 1e-6 * abs(high))
    zero = dequantize(quantize(tt.zeros(1), scale, zero_point, qmin, qmax), scale, zero_point)
    assert zero.item() == 0.0  # 0 is always exactly representable


def test_quantize_and_dequantize_on_the_device(device: str, canonical_device: str) -> None:
    x = tt.tensor([[-1.0, 0.26, 0.75], [4.0, -9.0, 0.25]], device=device)
    scale, zero_point = tt.tensor([[0.5], [0.25]], device=device), tt.tensor([[1], [-2]], dtype="int32", device=device)
    codes = quantize(x, scale, zero_point, -8, 7)
    assert codes.device == canonical_device and codes.dtype == np.int8
    assert codes.numpy().tolist() == [[-1, 2, 3], [7, -8, -1]]  # 0.75 / 0.5 = 1.5 -> 2 (even), then + 1
    back = dequantize(codes, scale, zero_point)
    assert back.device == canonical_device and back.dtype == np.float32
    np.testing.assert_allclose(back.numpy(), [[-1.0, 0.5, 1.0], [2.25, -1.5, 0.25]])


def test_quantize_refuses_bad_input() -> None:
    x = tt.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="int64"):
        quantize(tt.tensor([1, 2]), 0.5)
    with pytest.raises(ValueError, match="smallest scale of -0.5"):
        quantize(x, tt.tensor([1.0, -0.5]))
    with pytest.raises(ValueError, match=r"shape \(3,\).*\(2,\)"):
        quantize(x, tt.ones(3))
    with pytest.raises(ValueError, match="qmin=-200"):
        quantize(x, 1.0, 0, -200, 127)
    with pytest.raises(ValueError, match="qmin=5, qmax=5"):
        quantize(x, 1.0, 0, 5, 5)
    with pytest.raises(TypeError, match="float32"):
        dequantize(x, 1.0)


@needs_torch
@torch_quantized_tensors
def test_quantize_per_tensor_matches_pytorch() -> None:
    x = RNG.standard_normal(1000).astype(np.float32) * 3 + 1
    scale, zero_point = choose_qparams(float(x.min()), float(x.max()))
    ours = quantize(tt.tensor(x), scale, zero_point)
    theirs = torch.quantize_per_tensor(torch.tensor(x), scale.item(), zero_point.item(), torch.qint8)
    np.testing.assert_array_equal(ours.numpy(), theirs.int_repr().numpy())
    np.testing.assert_allclose(dequantize(ours, scale, zero_point).numpy(), theirs.dequantize().numpy(), rtol=1e-6)


# -- per channel -------------------------------------------------------------------------------------

@given(st.integers(1, 9), st.integers(1, 30), st.integers(2, 8), st.integers(0, 2**31 - 1))
def test_per_channel_round_trip_is_within_half_a_step(rows: int, columns: int, bits: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((rows, columns)) * 10.0 ** rng.uniform(-4, 2, (rows, 1))
    codes, scale = quantize_per_channel(tt.tensor(weight), bits)
    top = 2 ** (bits - 1) - 1
    assert codes.dtype == np.int8 and np.abs(codes.numpy()).max() == top  # each row's largest weight is +-qmax
    back = scale.numpy()[:, None].astype(np.float64) * codes.numpy()
    assert np.all(np.abs(back - weight.astype(np.float32)) <= scale.numpy()[:, None] / 2 * (1 + 1e-5))


def test_per_channel_on_the_device(device: str, canonical_device: str) -> None:
    weight = tt.tensor(RNG.standard_normal((5, 7)), device=device)
    codes, scale = quantize_per_channel(weight)
    assert codes.device == scale.device == canonical_device and scale.shape == (5,)
    with pytest.raises(ValueError, match=r"\(5, 7, 1\)"):
        quantize_per_channel(weight.reshape(5, 7, 1))


@needs_torch
@torch_quantized_tensors
def test_quantize_per_channel_matches_pytorch() -> None:
    weight = (RNG.standard_normal((16, 40)) * 10.0 ** RNG.uniform(-2, 1, (16, 1))).astype(np.float32)
    codes, scale = quantize_per_channel(tt.tensor(weight))
    theirs = torch.quantize_per_channel(torch.tensor(weight), torch.tensor(scale.numpy(), dtype=torch.float64),
                                        torch.zeros(16, dtype=torch.int64), 0, torch.qint8)
    np.testing.assert_array_equal(codes.numpy(), theirs.int_repr().numpy())
    np.testing.assert_allclose(dequantize(codes, scale.reshape(-1, 1)).numpy(), theirs.dequantize().numpy(), rtol=1e-6)


# -- observers --------------------------------------------------------------------------------------

def test_observer_refuses_bad_settings_and_reports_an_empty_calibration(device: str) -> None:
    with pytest.raises(ValueError, match="method='mean'"):
        Observer("mean")
    with pytest.raises(ValueError, match="percentile=120"):
        Observer("percentile", 120)
    observer = Observer()
    with pytest.raises(RuntimeError, match="no batch observed"):
        observer.qparams()
    with pytest.raises(ValueError, match=r"empty \(shape \(0, 3\)\)"):
        observer.observe(tt.zeros(0, 3, device=device))
    observer.observe(tt.tensor([[-1.0, 3.0]], device=device))
    scale, zero_point = observer.qparams()
    assert np.isclose(scale.item(), 4 / 255) and zero_point.item() == -64


# -- the integer product ------------------------------------------------------------------------------

def test_exact_terms_is_the_float32_bound() -> None:
    assert EXACT_TERMS * 128 * 128 == 2 ** 24  # every partial sum of a chunk is an integer float32 holds exactly


@pytest.mark.parametrize("k", [1, 1000, EXACT_TERMS, EXACT_TERMS + 1, 3 * EXACT_TERMS + 17])
def test_int8_matmul_is_exact_at_the_extremes(device: str, k: int) -> None:
    a = RNG.choice([-128, 127, -127, 126], (3, k)).astype(np.int8)
    b = RNG.choice([-128, 127, 125, -1], (4, k)).astype(np.int8)
    got = int8_matmul(tt.tensor(a, dtype="int8", device=device), tt.tensor(b, dtype="int8", device=device))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.numpy(), a.astype(np.int64) @ b.astype(np.int64).T)


def test_int8_matmul_refuses_bad_input() -> None:
    a = tt.tensor(np.ones((2, 3), np.int8), dtype="int8")
    with pytest.raises(TypeError, match=r"b must be a 2-D int8 tensor, got int32 of shape \(2, 3\)"):
        int8_matmul(a, a.astype("int32"))
    with pytest.raises(ValueError, match=r"\(2, 3\) and b is \(3, 2\)"):
        int8_matmul(a, tt.tensor(np.ones((3, 2), np.int8), dtype="int8"))
    with pytest.raises(RuntimeError, match="strict"):
        int8_matmul(a, a.to("strict"))


def test_int8_linear_computes_what_the_codes_stand_for(device: str) -> None:
    weight = tt.tensor(RNG.standard_normal((9, 20)) * 0.2, device=device)
    codes, scale = quantize_per_channel(weight)
    for x in (RNG.uniform(0.5, 2.0, (6, 20)), RNG.standard_normal((6, 20)) - 0.5):
        x = tt.tensor(x, device=device)
        s, z = choose_qparams(x.min(), x.max())
        stands_for = dequantize(quantize(x, s, z), s, z).numpy() @ dequantize(codes, scale.reshape(-1, 1)).numpy().T
        np.testing.assert_allclose(int8_linear(x, codes, scale).numpy(), stands_for, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(int8_linear(x, codes, scale, s, z).numpy(), stands_for, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="both input_scale and input_zero_point"):
        int8_linear(x, codes, scale, s)
    with pytest.raises(ValueError, match=r"x of shape \(6, 9\)"):
        int8_linear(x[:, :9], codes, scale)


# -- the frozen layers --------------------------------------------------------------------------------

def test_quantized_mlp_is_close_and_small(device: str) -> None:
    model = mlp(device)
    x = tt.tensor(RNG.standard_normal((32, 64)), device=device)
    with tt.no_grad():
        want = model(x).numpy()
    float_bytes = model_bytes(model)
    for dtype, calibration, error_bound, bytes_bound in (("int8", None, 0.03, 0.3), ("int8", [x], 0.03, 0.3),
                                                        ("nf4", None, 0.15, 0.2)):
        quantized = quantize_model(mlp(device, model.state_dict()), dtype, calibration=calibration)
        with tt.no_grad():
            got = quantized(x).numpy()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < error_bound, (dtype, calibration)
        assert model_bytes(quantized) < bytes_bound * float_bytes


def test_model_bytes_counts_codes_scales_and_shared_weights_once() -> None:
    layer = NF4Linear(1024, 1024, bias=False)
    assert model_bytes(layer) == 1024 * 1024 // 2 + 16384 + 64 * 4 + 4
    assert model_bytes(layer) * 8 / 1024 ** 2 == pytest.approx(4.127, abs=0.001)  # QLoRA's 4.127 bits
    gpt = small_gpt()
    assert model_bytes(gpt) == 4 * gpt.num_parameters()  # lm_head's weight is wte's: counted once
    int8 = QuantizedLinear(128, 64, static=True)
    assert model_bytes(int8) == 128 * 64 + 64 * 4 + 64 * 4 + 4 + 4


def test_the_gradient_reaches_the_input_through_the_dequantized_weight(device: str) -> None:
    """Dynamic int8 and NF4: grad @ W^. Static int8: zero where the calibrated range clipped the input."""
    model = mlp(device)
    for dtype, calibration in (("int8", None), ("nf4", None), ("int8", [tt.ones(4, 64, device=device) * 0.5])):
        layer = quantize_model(mlp(device, model.state_dict()), dtype, calibration=calibration)[0]
        x = tt.tensor(RNG.uniform(-1, 1, (5, 64)), device=device, requires_grad=True)
        grad = RNG.standard_normal((5, 96)).astype(np.float32)
        layer(x).backward(tt.tensor(grad, device=device))
        want = grad @ layer.dequantized_weight().numpy()
        if calibration is not None:  # the range [0, 0.5]: negative inputs and those above 0.5 were clipped
            s, z = layer.input_scale.item(), layer.input_zero_point.item()
            codes = np.round(x.numpy() / s) + z
            want = want * ((codes >= -128) & (codes <= 127))
            assert not ((codes >= -128) & (codes <= 127)).all()
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5, atol=1e-6)
        assert layer.weight_codes.grad is None


def test_gradcheck_where_the_frozen_layers_are_differentiable() -> None:
    nf4 = NF4Linear.from_linear(tt.nn.Linear(64, 5)).to(dtype="float64")
    x = tt.tensor(RNG.standard_normal((3, 64)), dtype="float64", requires_grad=True)
    assert tt.gradcheck(lambda x, b: nf4(x), [x, nf4.bias])  # in the input and the bias
    int8 = QuantizedLinear.from_linear(tt.nn.Linear(64, 5)).to(dtype="float64")
    assert tt.gradcheck(lambda b: int8(x.detach()), [int8.bias])  # the rounded input: only the bias is smooth


def test_a_quantized_model_refuses_to_train(device: str) -> None:
    model = quantize_model(mlp(device), "nf4")
    with pytest.raises(ValueError, match="does not require grad, so it can never be updated"):
        tt.optim.AdamW(model.parameters())
    with pytest.raises(TypeError, match="only floating-point tensors can require gradients"):
        model[0].weight_codes.requires_grad_()
    model[0].weight_codes.requires_grad = True  # past the check: backward reaches a frozen quantized weight
    x = tt.tensor(RNG.standard_normal((2, 64)), device=device)
    with pytest.raises(RuntimeError, match="NF4Linear.weight_codes requires grad, but a quantized layer is frozen"):
        model(x).sum().backward()
    static = quantize_model(mlp(device), "int8", calibration=[x])
    static[2].input_scale.requires_grad = True
    with pytest.raises(RuntimeError, match="QuantizedLinear.input_scale requires grad"):
        static(x).sum().backward()


@pytest.mark.parametrize("dtype, static", [("int8", False), ("int8", True), ("nf4", False)])
def test_a_quantized_model_saves_and_loads_through_a_checkpoint(tmp_path, device: str, dtype: str,
                                                                 static: bool) -> None:
    x = tt.tensor(RNG.standard_normal((3, 64)), device=device)
    calibration = [x] if static else None
    model = quantize_model(mlp(device), dtype, calibration=calibration)
    write_checkpoint(tmp_path / "q.pkl", {"model": model.state_dict()})
    state = read_checkpoint(tmp_path / "q.pkl")["model"]
    assert {array.dtype for array in state.values()} >= {np.dtype("float32"), np.dtype("int8" if dtype == "int8" else
                                                                                        "uint8")}
    tt.manual_seed(1)
    other = quantize_model(tt.nn.Sequential(tt.nn.Linear(64, 96), tt.nn.GELU(), tt.nn.Linear(96, 16)).to(device),
                           dtype, calibration=None if calibration is None else [x * 3])
    other.load_state_dict(state)
    with tt.no_grad():
        np.testing.assert_array_equal(other(x).numpy(), model(x).numpy())
    with pytest.raises(TypeError, match="0.weight_codes holds float64"):
        other.load_state_dict({**state, "0.weight_codes": state["0.weight_codes"].astype(np.float64)})


def test_quantized_layer_repr_and_input_checks() -> None:
    layer = QuantizedLinear.from_linear(tt.nn.Linear(4, 3))
    assert repr(layer) == "QuantizedLinear(in_features=4, out_features=3, bias=True, activations=dynamic)"
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\), got \(2, 5\)"):
        layer(tt.zeros(2, 5))
    with pytest.raises(TypeError, match="int64"):
        layer(tt.tensor([[1, 2, 3, 4]]))
    assert layer(tt.zeros(2, 7, 4)).shape == (2, 7, 3)  # leading axes kept


# -- quantize_model ----------------------------------------------------------------------------------

def test_quantize_model_leaves_the_tied_head_and_the_embeddings_alone(device: str) -> None:
    gpt = small_gpt(device)
    idx = tt.tensor(RNG.integers(0, 17, (2, 12)), device=device)
    with tt.no_grad():
        want = gpt.eval()(idx).numpy()
    assert quantize_model(gpt, "int8") is gpt
    kinds = {name: type(module).__name__ for name, module in gpt.named_modules()}
    assert kinds["lm_head"] == "Linear" and gpt.lm_head.weight is gpt.wte.weight  # still tied, still float
    assert kinds["wte"] == "Embedding"
    assert [kinds[f"h.{i}.{layer}"] for i in range(2) for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                    "mlp.c_proj")] == ["QuantizedLinear"] * 8
    with tt.no_grad():
        got = gpt(idx).numpy()
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
    tt.manual_seed(3)
    assert gpt.generate(idx[:, :3], 20).shape == (2, 23)  # the KV cache path runs the quantized layers too


def test_quantize_model_takes_the_layers_it_is_asked_for() -> None:
    gpt = quantize_model(small_gpt(), "nf4", layers=["lm_head", "h.1.mlp.c_fc"])
    assert isinstance(gpt.lm_head, NF4Linear) and isinstance(gpt.h[1].mlp.c_fc, NF4Linear)
    assert type(gpt.h[0].mlp.c_fc) is tt.nn.Linear  # the others stay float
    with pytest.raises(KeyError, match="'h.9.attn'"):
        quantize_model(small_gpt(), layers=["h.9.attn"])
    with pytest.raises(TypeError, match=r"ln_f \(LayerNorm\)"):
        quantize_model(small_gpt(), layers=["ln_f"])


def test_quantize_model_refuses_bad_requests_and_keeps_the_model_on_failure() -> None:
    model = mlp()
    with pytest.raises(ValueError, match="dtype='int4'"):
        quantize_model(model, "int4")
    with pytest.raises(ValueError, match="calibration is for int8"):
        quantize_model(model, "nf4", calibration=[tt.zeros(1, 64)])
    with pytest.raises(ValueError, match="calibration gave no batch"):
        quantize_model(model, "int8", calibration=[])
    with pytest.raises(ValueError, match=r"expected input of shape \(\.\.\., 64\)"):
        quantize_model(model, "int8", calibration=[tt.zeros(2, 5)])
    assert [type(layer).__name__ for layer in model] == ["Linear", "GELU", "Linear"] and model.training
    with pytest.raises(ValueError, match="Sequential has no Linear layer"):
        quantize_model(tt.nn.Sequential(tt.nn.ReLU()))
    with pytest.raises(TypeError, match="observer must be a function"):
        quantize_model(model, calibration=[tt.zeros(1, 64)], observer=Observer())


def test_static_calibration_observes_each_layer_and_restores_the_mode() -> None:
    model = mlp()
    batches = [tt.tensor(RNG.standard_normal((8, 64))) for _ in range(3)]
    with tt.no_grad():
        hidden = [model[1](model[0](batch)).numpy() for batch in batches]
    quantize_model(model.train(), "int8", calibration=batches)
    assert model.training and model[0].static and model[2].static
    for layer, seen in ((model[0], [b.numpy() for b in batches]), (model[2], hidden)):
        scale, zero_point = choose_qparams(min(s.min() for s in seen), max(s.max() for s in seen))
        assert np.isclose(layer.input_scale.item(), scale.item()) and layer.input_zero_point.item() == zero_point.item()


# -- fake quantization and QAT ------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("zero_point", [0, 3])
def test_fake_quantize_matches_pytorch_forward_and_backward(zero_point: int) -> None:
    x = RNG.standard_normal((6, 50)).astype(np.float32) * 2
    scale = (np.abs(x).max(axis=1) / 150).astype(np.float32)  # the largest values clip
    ours = tt.tensor(x, requires_grad=True)
    out = fake_quantize(ours, tt.tensor(scale[:, None]), zero_point, -128, 127)
    incoming = RNG.standard_normal(x.shape).astype(np.float32)
    out.backward(tt.tensor(incoming))
    theirs = torch.tensor(x, requires_grad=True)
    expected = torch.fake_quantize_per_channel_affine(theirs, torch.tensor(scale), torch.full((6,), zero_point,
                                                      dtype=torch.int32), 0, -128, 127)
    expected.backward(torch.tensor(incoming))
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())  # the same straight-through mask
    assert not (ours.grad.numpy() == incoming).all()  # some were clipped: the mask shows


def test_straight_through_gradient_is_exactly_the_mask(device: str) -> None:
    x = tt.tensor([-3.0, -1.02, 1.24, 1.26, 2.0, 0.1], device=device, requires_grad=True)
    fake_quantize(x, 0.5, 0, -2, 2).backward(tt.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], device=device))
    assert x.grad.numpy().tolist() == [0.0, 2.0, 3.0, 0.0, 0.0, 6.0]
    outside = tt.tensor([-9.0, 5.0, 7.5], dtype="float64", device=device, requires_grad=True)
    assert tt.gradcheck(lambda v: fake_quantize(v, 0.5, 1, -3, 4), [outside])  # differentiable there: 0 both ways


def test_qat_trains_the_float_weights_and_converts_to_what_it_trained(device: str) -> None:
    model = mlp(device)
    first = model[0].weight
    prepare_qat(model, weight_bits=4)
    assert isinstance(model[0], QATLinear) and model[0].weight is first  # the same Parameter
    optimizer = tt.optim.SGD(model.parameters(), lr=0.05)
    x = tt.tensor(RNG.standard_normal((32, 64)), device=device)
    targets = tt.tensor(RNG.integers(0, 16, 32), device=device)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = tt.nn.functional.cross_entropy(model(x), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    with tt.no_grad():
        trained = model.eval()(x).numpy()
    convert_qat(model)
    assert isinstance(model[0], QuantizedLinear) and model[0].static
    assert np.abs(model[0].weight_codes.numpy()).max() <= 7  # 4-bit codes
    with tt.no_grad():
        np.testing.assert_allclose(model(x).numpy(), trained, rtol=1e-5, atol=1e-5)


def test_qat_layers_gradcheck_in_the_bias_and_refuse_an_unobserved_conversion() -> None:
    layer = QATLinear(mlp()[0].to(dtype="float64"))
    x = tt.tensor(RNG.standard_normal((3, 64)), dtype="float64")
    layer(x)  # training mode: the observer records x
    assert tt.gradcheck(lambda b: layer(x), [layer.bias])
    with pytest.raises(RuntimeError, match="0, 2 never ran in training mode"):
        convert_qat(prepare_qat(mlp()))
    with pytest.raises(ValueError, match="prepare_qat"):
        convert_qat(mlp())


# -- NF4 -----------------------------------------------------------------------------------------------

def test_nf4_levels_are_qloras() -> None:
    assert len(NF4_LEVELS) == 16 and NF4_LEVELS[0] == -1.0 and NF4_LEVELS[7] == 0.0 and NF4_LEVELS[15] == 1.0
    assert list(NF4_LEVELS) == sorted(NF4_LEVELS)
    from statistics import NormalDist
    end = 1 - (1 / 32 + 1 / 30) / 2  # QLoRA's offset, 0.9677083
    positive = [NormalDist().inv_cdf(0.5 + (end - 0.5) * i / 8) for i in range(1, 9)]
    np.testing.assert_allclose(NF4_LEVELS[8:], np.array(positive) / positive[-1], atol=2e-7)


def test_nf4_round_trip_of_a_block_worked_by_hand() -> None:
    """One block of 64: absmax 2, so the values over 2 are matched to the nearest level."""
    block = np.zeros(64, np.float32)
    block[:8] = [2.0, -1.0, 0.5, 0.1, -0.3, 1.1, -2.0, 0.01]
    # value / 2:      1.0   -0.5    0.25    0.05    -0.15   0.55    -1.0    0.005
    # nearest level:  1.0   -0.5251 0.2461  0.0796  -0.1848 0.5626  -1.0    0.0
    # index:          15    2       10      8       5       13      0       7
    weight = nf4_quantize(tt.tensor(block))
    assert weight.codes.numpy()[:5].tolist() == [0xF2, 0xA8, 0x5D, 0x07, 0x77]
    assert weight.absmax_codes.numpy().tolist() == [0] and weight.absmax_mean.item() == 2.0
    back = nf4_dequantize(weight).numpy()
    np.testing.assert_allclose(back[:8], [2.0, -1.0501461, 0.4922246, 0.1591606, -0.3695469, 1.1252340, -2.0, 0.0],
                               rtol=1e-6)
    assert (back[8:] == 0).all()


def test_nf4_round_trip_error_is_bounded_by_the_widest_gap(device: str) -> None:
    weight = RNG.standard_normal((70, 50)) * 0.02  # 3,500 values: 55 blocks, the last padded
    packed = nf4_quantize(tt.tensor(weight, device=device))
    assert packed.codes.shape == (55 * NF4_BLOCK // 2,) and packed.absmax_codes.shape == (55,)
    assert packed.absmax_scale.shape == (1,) and packed.shape == (70, 50)
    back = nf4_dequantize(packed).numpy()
    flat = np.zeros(55 * 64)
    flat[:3500] = weight.reshape(-1)
    blocks = flat.reshape(55, 64)
    restored = np.zeros(55 * 64)
    restored[:3500] = back.reshape(-1)
    half_gap = np.diff(NF4_LEVELS).max() / 2
    assert (np.abs(restored.reshape(55, 64) - blocks) <= half_gap * np.abs(blocks).max(axis=1, keepdims=True) * 1.01).all()


def test_double_quantization_of_many_groups() -> None:
    absmax = tt.tensor(RNG.uniform(0.01, 0.5, 3 * DOUBLE_QUANT_BLOCK + 5))
    codes, scale, mean = double_quantize(absmax)
    assert codes.shape == (773,) and scale.shape == (4,) and mean.dtype == np.float32
    back = np.repeat(scale.numpy(), DOUBLE_QUANT_BLOCK)[:773] * codes.numpy() + mean.item()
    assert np.abs(back - absmax.numpy()).max() <= scale.numpy().max() / 2 * (1 + 1e-5)
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        double_quantize(tt.ones(2, 2))


def test_nf4_refuses_bad_input() -> None:
    with pytest.raises(TypeError, match="int64"):
        nf4_quantize(tt.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"empty \(shape \(0,\)\)"):
        nf4_quantize(tt.zeros(0))
    with pytest.raises(TypeError, match="an NF4Weight"):
        nf4_dequantize(tt.zeros(4))


def test_frozen_function_keeps_no_float_weight_between_the_passes() -> None:
    """What backward needs it dequantizes again: only the input and the codes are kept."""
    layer = NF4Linear.from_linear(tt.nn.Linear(64, 8))
    x = tt.tensor(RNG.standard_normal((2, 64)), requires_grad=True)
    out = FrozenQuantizedLinear.apply(x, *(tensor for _, tensor in layer.frozen()), layer=layer)
    arrays = [value for value in vars(out._ctx).values() if isinstance(value, np.ndarray)]
    arrays += [value for value in vars(layer).values() if isinstance(value, np.ndarray)]
    assert arrays == [] and out._ctx.mask is None
    assert all(tensor.dtype != np.float32 or tensor.size < 64 * 8 for tensor in layer.parameters() + layer.buffers())
