"""tt.nn.lora, tt.nn.functional.distillation_loss and tt.prune: LoRA layers and their gradients, inject and
merge on a GPT, adapters saved apart and loaded on top of a base checkpoint, QLoRA on an NF4 base, Hinton's
loss, and pruning with PyTorch's reparametrisation (the mask through training, checkpoints and remove). Each
case runs on the CPU, the strict device and a fake GPU (a fake CuPy); where PyTorch has the operation, the
results are compared with it (skipped without torch)."""
from __future__ import annotations

import numpy as np
import pytest

import tinytrain as tt
from tinytrain.nn.distillation import distillation_loss
from tinytrain.nn.lora import (LoRALinear, adapted_layers, adapter_state_dict, inject, load_adapters, merge,
                               save_adapters)
from tinytrain.prune import (custom_from_mask, is_pruned, l1_unstructured, l1_unstructured_mask, ln_structured,
                             ln_structured_mask, pruned_count, remove, sparsity)
from tinytrain.quantization import NF4Linear, model_bytes, quantize_model
from tinytrain.serialization import write_checkpoint
from tinytrain.testing.fake_cupy import forget_fake_gpu, register_fake_gpu

try:
    import torch
    import torch.nn.utils.prune
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")
RNG = np.random.default_rng(2020)


@pytest.fixture(scope="module", autouse=True)
def fake_gpu():
    """fakecuda:0: the package's CupyBackend on a fake CuPy, so that CuPy's rules apply to every array."""
    from tinytrain.cuda import CupyBackend

    fake = register_fake_gpu(CupyBackend, devices=1)
    yield fake
    forget_fake_gpu()


@pytest.fixture(scope="module", params=["cpu", "strict", "fakecuda:0"])
def device(request, fake_gpu) -> str:
    return request.param


def gpt(device: str = "cpu", n_layer: int = 2) -> tt.nn.GPT:
    tt.manual_seed(0)
    return tt.nn.GPT(tt.nn.GPTConfig(vocab_size=13, block_size=8, n_layer=n_layer, n_head=2, n_embd=32)).to(device)


def ids(device: str, seed: int = 0) -> tt.Tensor:
    return tt.tensor(np.random.default_rng(seed).integers(0, 13, (3, 8)), device=device)


def randomize_adapters(model: tt.nn.Module, seed: int = 1) -> None:
    """B is zero after inject; give it values so that the adapters change the outputs."""
    rng = np.random.default_rng(seed)
    for _, layer in adapted_layers(model):
        layer.lora_B.data = tt.tensor(rng.standard_normal(layer.lora_B.shape) * 0.1, device=layer.lora_B.device).data


# -- LoRALinear ------------------------------------------------------------------------------------------

def test_lora_linear_starts_equal_to_its_base_and_trains_only_the_adapter(device) -> None:
    tt.manual_seed(0)
    base = tt.nn.Linear(12, 7).to(device)
    layer = LoRALinear(base, r=4, alpha=8)
    assert (layer.lora_A.shape, layer.lora_B.shape, layer.scaling) == ((4, 12), (7, 4), 2.0)
    assert layer.lora_A.device == base.weight.device and np.abs(layer.lora_A.numpy()).max() <= 1 / np.sqrt(12)
    assert not (layer.lora_B.numpy()).any()
    x = tt.randn(5, 3, 12, device=device)
    np.testing.assert_array_equal(layer(x).numpy(), base(x).numpy())
    layer(x).sum().backward()
    assert base.weight.grad is None and base.bias.grad is None and not base.weight.requires_grad
    assert layer.lora_B.grad is not None and layer.lora_B.grad.device == base.weight.device


def test_lora_linear_gradcheck_in_input_and_both_adapters() -> None:
    tt.manual_seed(0)
    layer = LoRALinear(tt.nn.Linear(5, 4), r=2, alpha=3).to(dtype="float64")
    layer.lora_B.data[...] = RNG.standard_normal((4, 2))
    x = tt.tensor(RNG.standard_normal((3, 5)), dtype="float64", requires_grad=True)
    assert tt.gradcheck(lambda x, a, b: layer(x), [x, layer.lora_A, layer.lora_B])
    want = x.numpy() @ (layer.base.weight.numpy() + 1.5 * layer.lora_B.numpy() @ layer.lora_A.numpy()).T
    np.testing.assert_allclose(layer(x).numpy(), want + layer.base.bias.numpy(), rtol=1e-12)


def test_lora_dropout_acts_on_the_adapter_path_only() -> None:
    tt.manual_seed(0)
    layer = LoRALinear(tt.nn.Linear(16, 16), r=4, alpha=4, dropout=0.5)
    x = tt.randn(8, 16)
    np.testing.assert_array_equal(layer(x).numpy(), layer.base(x).numpy())  # B = 0: dropout changes nothing yet
    layer.lora_B.data[...] = 1.0
    layer.eval()
    evaluated = layer(x).numpy()
    layer.train()
    assert not np.allclose(layer(x).numpy(), evaluated), "training mode drops some of the adapter's input"


def test_lora_linear_refuses_what_it_cannot_adapt() -> None:
    with pytest.raises(TypeError, match="base must be a Linear layer or a quantized one"):
        LoRALinear(tt.nn.ReLU())
    with pytest.raises(ValueError, match="r must be a whole number >= 1, got r=0"):
        LoRALinear(tt.nn.Linear(3, 3), r=0)
    with pytest.raises(ValueError, match="alpha"):
        LoRALinear(tt.nn.Linear(3, 3), alpha=0)


# -- inject and merge ------------------------------------------------------------------------------------

def test_inject_wraps_the_targets_and_freezes_everything_else(device) -> None:
    model = inject(gpt(device), ("c_attn", "c_proj"), r=4, alpha=8)
    assert [name for name, _ in adapted_layers(model)] == [
        f"h.{i}.{layer}" for i in range(2) for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_proj")]
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{name}.lora_{part}" for name, _ in adapted_layers(model) for part in "AB"}
    share = sum(p.size for p in model.parameters() if p.requires_grad) / gpt().num_parameters()
    assert share < 0.15, share


def test_inject_errors_change_nothing() -> None:
    model = gpt()
    with pytest.raises(ValueError, match=r"no Linear layer of GPT is named \('q_proj',\)"):
        inject(model, "q_proj")
    assert all(p.requires_grad for p in model.parameters())
    inject(model, "c_attn")
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        inject(model, "c_fc")


@pytest.mark.parametrize("bad, error, named", [({"r": 0}, ValueError, "r"), ({"r": 2.0}, TypeError, "r"),
                                               ({"alpha": 0}, ValueError, "alpha"),
                                               ({"dropout": 1.0}, ValueError, "dropout")])
def test_inject_with_a_bad_argument_freezes_and_wraps_nothing(bad, error, named) -> None:
    # LoRALinear refuses these too, but only after inject would have frozen the model
    model = gpt()
    with pytest.raises(error, match=named):
        inject(model, "c_attn", **bad)
    assert all(p.requires_grad for p in model.parameters()) and not adapted_layers(model)


def test_inject_matches_the_last_name_part_exactly() -> None:
    # a string suffix would also take "xc_proj"-like names; a dotted target would match a whole path
    with pytest.raises(ValueError, match="no Linear layer"):
        inject(gpt(), "_proj")
    with pytest.raises(ValueError, match="no Linear layer"):
        inject(gpt(), "attn.c_proj")


def test_merge_gives_the_same_logits_as_the_adapters(device) -> None:
    model = inject(gpt(device), r=4, alpha=8)
    randomize_adapters(model)
    with tt.no_grad():
        adapted = model(ids(device)).numpy()
    merged = merge(model)
    assert merged is model and not adapted_layers(model)
    assert type(model.h[0].attn.c_attn) is tt.nn.Linear and not model.h[0].attn.c_attn.weight.requires_grad
    with tt.no_grad():
        np.testing.assert_allclose(model(ids(device)).numpy(), adapted, atol=1e-5)


def test_merge_of_a_single_layer_returns_its_base_and_refuses_quantized_bases() -> None:
    layer = LoRALinear(tt.nn.Linear(4, 3), r=2)
    layer.lora_B.data[...] = 1.0
    x = tt.randn(2, 4)
    want = layer(x).numpy()
    base = merge(layer)
    assert type(base) is tt.nn.Linear
    np.testing.assert_allclose(base(x).numpy(), want, atol=1e-6)
    model = inject(quantize_model(gpt(), "nf4"), "c_attn")
    with pytest.raises(TypeError, match=r"h\.0\.attn\.c_attn \(NF4Linear\)"):
        merge(model)
    assert len(adapted_layers(model)) == 2
    with pytest.raises(ValueError, match="no LoRA adapter to merge"):
        merge(gpt())


# -- adapters on their own -------------------------------------------------------------------------------

def test_adapters_save_apart_and_load_on_top_of_the_base_checkpoint(tmp_path, device) -> None:
    base = gpt(device)
    write_checkpoint(tmp_path / "base.pkl", {"model": base.state_dict()})
    model = inject(gpt(device), r=4, alpha=8)
    randomize_adapters(model)
    save_adapters(model, tmp_path / "adapters.pkl")
    assert set(adapter_state_dict(model)) == {f"{n}.lora_{p}" for n, _ in adapted_layers(model) for p in "AB"}
    assert (tmp_path / "adapters.pkl").stat().st_size < 0.2 * (tmp_path / "base.pkl").stat().st_size
    fresh = tt.nn.GPT(base.config).to(device)
    fresh.load_state_dict(tt.serialization.read_checkpoint(tmp_path / "base.pkl")["model"])
    load_adapters(inject(fresh, r=4, alpha=8), tmp_path / "adapters.pkl")
    with tt.no_grad():
        np.testing.assert_array_equal(fresh(ids(device)).numpy(), model(ids(device)).numpy())


def test_load_adapters_refuses_files_that_do_not_match(tmp_path) -> None:
    model = inject(gpt(), "c_attn", r=4, alpha=8)
    save_adapters(model, tmp_path / "a.pkl")
    write_checkpoint(tmp_path / "model.pkl", {"model": gpt().state_dict()})
    with pytest.raises(ValueError, match="holds no LoRA adapters"):
        load_adapters(model, tmp_path / "model.pkl")
    with pytest.raises(KeyError, match=r"missing from the file \['h\.0\.attn\.c_proj\.lora_A'"):
        load_adapters(inject(gpt(), ("c_attn", "c_proj"), r=4, alpha=8), tmp_path / "a.pkl")
    with pytest.raises(ValueError, match=r"alpha \(file, model\) differs at \{'h\.0\.attn\.c_attn': \(8\.0, 4\.0\)"):
        load_adapters(inject(gpt(), "c_attn", r=4, alpha=4), tmp_path / "a.pkl")
    other = inject(gpt(), "c_attn", r=2, alpha=8)
    before = adapter_state_dict(other)
    with pytest.raises(ValueError, match=r"shapes \(file, model\) differ at .*\(\(4, 32\), \(2, 32\)\)"):
        load_adapters(other, tmp_path / "a.pkl")
    for name, value in adapter_state_dict(other).items():
        np.testing.assert_array_equal(value.numpy(), before[name].numpy())
    with pytest.raises(ValueError, match="has no LoRA adapter"):
        save_adapters(gpt(), tmp_path / "none.pkl")


# -- QLoRA -----------------------------------------------------------------------------------------------

def test_qlora_trains_adapters_on_a_frozen_nf4_base(device) -> None:
    model = quantize_model(gpt(device), "nf4")
    float_bytes = model_bytes(gpt(device))
    inject(model, r=4, alpha=8)
    assert isinstance(model.h[1].mlp.c_proj.base, NF4Linear)
    codes = model.h[0].attn.c_attn.base.weight_codes.numpy().copy()
    optimizer = tt.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    targets = ids(device, seed=5)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = model(ids(device), targets=targets)[1]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    np.testing.assert_array_equal(model.h[0].attn.c_attn.base.weight_codes.numpy(), codes)
    assert model_bytes(model) < float_bytes


# -- distillation ----------------------------------------------------------------------------------------

def test_distillation_loss_worked_example_and_teacher_without_gradient(device) -> None:
    loss = distillation_loss(tt.tensor([[0.0, 0.0]], device=device), tt.tensor([[2.0, 0.0]], device=device),
                             tt.tensor([0], device=device), temperature=2.0, alpha=0.5)
    p = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    want = 0.5 * 4 * (p * np.log(p / 0.5)).sum() + 0.5 * np.log(2)
    assert abs(loss.item() - want) < 1e-6 and loss.device == tt.tensor(0.0, device=device).device
    student = tt.randn(2, 3, 5, device=device, requires_grad=True)
    teacher = tt.randn(2, 3, 5, device=device, requires_grad=True)
    distillation_loss(student, teacher, tt.tensor(RNG.integers(0, 5, (2, 3)), device=device)).backward()
    assert teacher.grad is None and student.grad is not None


def test_distillation_loss_gradcheck() -> None:
    student = tt.tensor(RNG.standard_normal((4, 6)), dtype="float64", requires_grad=True)
    teacher = tt.tensor(RNG.standard_normal((4, 6)), dtype="float64")
    labels = tt.tensor(RNG.integers(0, 6, 4))
    for temperature, alpha in ((1.0, 0.5), (4.0, 0.9), (0.5, 0.0), (2.0, 1.0)):
        assert tt.gradcheck(lambda s: distillation_loss(s, teacher, labels, temperature, alpha), [student])


def test_distillation_loss_errors() -> None:
    s, y = tt.randn(4, 3), tt.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"one shape \(\.\.\., C\), got \(4, 3\) and \(4, 2\)"):
        distillation_loss(s, tt.randn(4, 2), y)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got temperature=0.0"):
        distillation_loss(s, s, y, temperature=0.0)
    with pytest.raises(ValueError, match=r"alpha must be a finite number in \[0, 1\], got alpha=1.5"):
        distillation_loss(s, s, y, alpha=1.5)


@needs_torch
def test_distillation_loss_equals_pytorchs_kl_div_and_cross_entropy() -> None:
    s, t = RNG.standard_normal((2, 7, 9)), RNG.standard_normal((2, 7, 9)) * 3
    y = RNG.integers(0, 9, (2, 7))
    for temperature, alpha in ((2.0, 0.5), (5.0, 0.25)):
        got = distillation_loss(tt.tensor(s, dtype="float64"), tt.tensor(t, dtype="float64"), tt.tensor(y),
                                temperature, alpha).item()
        ts, tt_ = torch.tensor(s).reshape(-1, 9), torch.tensor(t).reshape(-1, 9)
        soft = torch.nn.functional.kl_div(torch.log_softmax(ts / temperature, -1), torch.softmax(tt_ / temperature, -1),
                                          reduction="batchmean")
        want = alpha * temperature ** 2 * soft + (1 - alpha) * torch.nn.functional.cross_entropy(
            ts, torch.tensor(y).reshape(-1))
        assert abs(got - want.item()) < 1e-10


# -- pruning ---------------------------------------------------------------------------------------------

def test_pruned_count_follows_pytorchs_rounding_and_names_bad_amounts() -> None:
    assert [pruned_count(a, 10, "entries") for a in (0.0, 0.25, 0.35, 0.5, 1.0, 3, 10)] == [0, 2, 4, 5, 10, 3, 10]
    with pytest.raises(ValueError, match="amount=11 entries to prune, but there are 10 left"):
        pruned_count(11, 10, "entries")
    with pytest.raises(ValueError, match=r"amount must be a fraction in \[0, 1\].*amount=1.5"):
        pruned_count(1.5, 10, "entries")
    with pytest.raises(TypeError, match="got True"):
        pruned_count(True, 10, "entries")


def test_l1_unstructured_half_stays_zero_through_training_and_a_checkpoint(tmp_path, device) -> None:
    tt.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(16, 32), tt.nn.ReLU(), tt.nn.Linear(32, 4)).to(device)
    parameter = model[0].weight
    l1_unstructured(model[0], "weight", amount=0.5)
    assert is_pruned(model[0]) and model[0].weight_orig is parameter and sparsity(model[0].weight) == 0.5
    kept = model[0].weight_mask.numpy().astype(bool)
    assert np.abs(parameter.numpy()[~kept]).max() <= np.abs(parameter.numpy()[kept]).min()
    trainer = tt.Trainer(model, tt.optim.AdamW(model.parameters(), lr=1e-2), tt.nn.MSELoss())
    data = tt.data.TensorDataset(RNG.standard_normal((40, 16)).astype(np.float32),
                                 RNG.standard_normal((40, 4)).astype(np.float32))
    trainer.train_epoch(tt.data.DataLoader(data, batch_size=4, device=device))
    assert trainer.step == 10
    assert not (parameter.grad.numpy()[~kept]).any(), "pruned weights get no gradient"
    assert sparsity(model[0].weight) == 0.5 and not (model[0].weight.numpy()[~kept]).any()
    trainer.save_checkpoint(tmp_path / "pruned.pkl")
    tt.manual_seed(1)
    again = tt.nn.Sequential(tt.nn.Linear(16, 32), tt.nn.ReLU(), tt.nn.Linear(32, 4)).to(device)
    l1_unstructured(again[0], "weight", amount=0.1)  # another mask: loading replaces it
    tt.Trainer(again, tt.optim.AdamW(again.parameters(), lr=1e-2), tt.nn.MSELoss()).load_checkpoint(
        tmp_path / "pruned.pkl")
    x = tt.randn(3, 16, device=device)
    np.testing.assert_array_equal(again(x).numpy(), model(x).numpy())
    assert sparsity(again[0].weight) == 0.5 and np.array_equal(again[0].weight_mask.numpy().astype(bool), kept)


def test_pruning_again_prunes_among_what_is_left_and_remove_keeps_the_zeros(device) -> None:
    tt.manual_seed(0)
    layer = tt.nn.Linear(10, 8).to(device)
    parameter = layer.weight
    l1_unstructured(layer, "weight", 0.5)
    l1_unstructured(layer, "weight", 0.5)
    assert sparsity(layer.weight) == 0.75
    ln_structured(layer, "weight", 2, 2, 0)
    assert (layer.weight.numpy() == 0).all(axis=1).sum() >= 2
    pruned = layer.weight.numpy()
    remove(layer, "weight")
    assert layer.weight is parameter and parameter.requires_grad and not is_pruned(layer)
    assert set(layer.state_dict()) == {"weight", "bias"} and "forward" not in layer.__dict__
    np.testing.assert_array_equal(layer.weight.numpy(), pruned)
    with pytest.raises(ValueError, match="'weight' of Linear is not pruned"):
        remove(layer, "weight")


def test_pruning_two_tensors_of_one_module_and_removing_one() -> None:
    layer = tt.nn.Linear(6, 6)
    l1_unstructured(layer, "weight", 0.5)
    l1_unstructured(layer, "bias", 3)
    assert sparsity(layer.bias) == 0.5 and layer.forward.names == ["weight", "bias"]
    remove(layer, "bias")
    assert layer.forward.names == ["weight"] and sparsity(layer(tt.zeros(1, 6)) - layer.bias) == 1.0


def test_prune_errors_name_the_problem() -> None:
    layer = tt.nn.Linear(4, 3)
    with pytest.raises(AttributeError, match=r"Linear has no parameter 'weights' to prune \(its parameters: "
                                             r"\['bias', 'weight'\]\)"):
        l1_unstructured(layer, "weights", 0.5)
    with pytest.raises(ValueError, match=r"the mask's shape \(4, 3\) differs from weight's \(3, 4\)"):
        custom_from_mask(layer, "weight", tt.ones(4, 3))
    with pytest.raises(ValueError, match=r"dim=2 is out of range for a tensor of shape \(3, 4\)"):
        ln_structured(layer, "weight", 0.5, 2, 2)
    with pytest.raises(ValueError, match="n must be a number > 0"):
        ln_structured(layer, "weight", 0.5, 0, 0)
    assert not is_pruned(layer) and set(layer.state_dict()) == {"weight", "bias"}


def test_masks_on_every_device(device) -> None:
    weight = tt.tensor([[0.5, -0.1, 2.0], [-3.0, 0.2, 0.05]], device=device)
    mask = l1_unstructured_mask(weight, 0.5)
    assert mask.device == weight.device and mask.dtype == np.float32
    np.testing.assert_array_equal(mask.numpy(), [[1, 0, 1], [1, 0, 0]])
    np.testing.assert_array_equal(ln_structured_mask(weight, 1, 1, 1).numpy(), [[1, 0, 1], [1, 0, 1]])
    np.testing.assert_array_equal(ln_structured_mask(weight, 1, float("inf"), 0, mask).numpy(), [[0, 0, 0], [1, 0, 0]])


@needs_torch
@pytest.mark.parametrize("amount", [0.3, 0.5, 7])
def test_pruning_equals_pytorchs(amount) -> None:
    values = ((RNG.permutation(60) + 1) * RNG.choice([-1, 1], 60)).reshape(6, 10).astype(np.float32)  # no ties
    layer, reference = tt.nn.Linear(10, 6), torch.nn.Linear(10, 6)
    layer.weight.data[...] = values
    with torch.no_grad():
        reference.weight.copy_(torch.tensor(values))
    l1_unstructured(layer, "weight", amount)
    torch.nn.utils.prune.l1_unstructured(reference, "weight", amount)
    np.testing.assert_array_equal(layer.weight_mask.numpy(), reference.weight_mask.numpy())
    l1_unstructured(layer, "weight", amount if isinstance(amount, float) else 3)
    torch.nn.utils.prune.l1_unstructured(reference, "weight", amount if isinstance(amount, float) else 3)
    np.testing.assert_array_equal(layer.weight_mask.numpy(), reference.weight_mask.numpy())
    for n, dim in ((2, 0), (1, 1), (float("inf"), -1)):
        layer, reference = tt.nn.Linear(10, 6), torch.nn.Linear(10, 6)
        layer.weight.data[...] = values
        with torch.no_grad():
            reference.weight.copy_(torch.tensor(values))
        count = amount if isinstance(amount, float) else 2
        ln_structured(layer, "weight", count, n, dim)
        torch.nn.utils.prune.ln_structured(reference, "weight", count, n, dim)
        np.testing.assert_array_equal(layer.weight_mask.numpy(), reference.weight_mask.numpy(), err_msg=f"{n} {dim}")
