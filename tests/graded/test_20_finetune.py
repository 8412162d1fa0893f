"""Graded checks of Module 20 (fine-tuning and compression): the LoRA layer's update and forward pass,
inject, merge and the adapters' state, Hinton's distillation loss, the pruning masks (unstructured and
structured), and pruning's reparametrisation and its removal.

``student`` is the module's code: the installed package's, or a notebook's (``tinytrain grade 20``).
Every result is compared with a plain NumPy reference written here from the lesson's formulas, on the
CPU and on the strict device, where a computation that leaves the device fails as it would on a GPU.
"""
import math

import numpy as np

import tinytrain as tt
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck, expect_raises

RNG = np.random.default_rng(20)
DEVICES = ("cpu", "strict")


def expect_on(device, result, what):
    expect_equal(str(result.device), tt.get_backend(device).device, f"the device of {what} (the input's: compute "
                 "with xp = x._backend.xp on x.data and wrap with Tensor._make(array, x._backend))")


def lora_layer(student, device, in_features=6, out_features=5, r=3, alpha=7.5, dropout=0.0, bias=True):
    """A LoRALinear of the student's with random A and B (B is zero at first)."""
    tt.manual_seed(0)
    layer = student.LoRALinear(tt.nn.Linear(in_features, out_features, bias=bias).to(device), r=r, alpha=alpha,
                               dropout=dropout)
    layer.lora_A.data = tt.tensor(RNG.standard_normal((r, in_features)), device=device).data
    layer.lora_B.data = tt.tensor(RNG.standard_normal((out_features, r)), device=device).data
    return layer


def gpt(device="cpu", n_layer=2):
    tt.manual_seed(0)
    return tt.nn.GPT(tt.nn.GPTConfig(vocab_size=11, block_size=8, n_layer=n_layer, n_head=2, n_embd=16)).to(device)


def token_ids(device):
    return tt.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)), device=device)


# -- LoRA ----------------------------------------------------------------------------------------------

@check(points=2, hint="delta_weight: scaling * (B @ A), an (out, in) tensor, with scaling = alpha / r; use the layer's "
                      "lora_A (r, in) and lora_B (out, r)")
def test_delta_weight(student):
    for device in DEVICES:
        for r, alpha in ((3, 7.5), (1, 2.0), (4, 1.0)):
            layer = lora_layer(student, device, r=r, alpha=alpha)
            got = layer.delta_weight()
            what = f"delta_weight of a LoRALinear(Linear(6, 5), r={r}, alpha={alpha}) on {device}"
            expect_on(device, got, what)
            want = alpha / r * layer.lora_B.numpy().astype(np.float64) @ layer.lora_A.numpy()
            expect_close(got.numpy(), want, what, rtol=1e-5, atol=1e-6, dtype="float32")


@check(points=3, hint="forward: base(x) + scaling * linear(linear(dropout(x), A), B); the frozen path takes x itself, "
                      "the adapter path dropout(x) (self.dropout); any leading axes of x")
def test_lora_forward(student):
    for device in DEVICES:
        for bias, shape in ((True, (4, 6)), (False, (2, 3, 6))):
            layer = lora_layer(student, device, bias=bias)
            x = tt.tensor(RNG.standard_normal(shape), device=device)
            weight = layer.base.weight.numpy() + 2.5 * layer.lora_B.numpy() @ layer.lora_A.numpy()
            want = x.numpy() @ weight.T + (layer.base.bias.numpy() if bias else 0)
            what = f"a LoRALinear(Linear(6, 5, bias={bias}), r=3, alpha=7.5) of an input {shape} on {device}"
            got = layer(x)
            expect_on(device, got, what)
            expect_close(got.numpy(), want, what, rtol=1e-4, atol=1e-5, dtype="float32")
    layer = lora_layer(student, "cpu", dropout=0.5)
    x = tt.tensor(RNG.standard_normal((8, 6)))
    tt.manual_seed(3)
    got = layer(x).numpy()
    tt.manual_seed(3)
    dropped = tt.nn.functional.dropout(x, 0.5, True).numpy()
    want = (x.numpy() @ layer.base.weight.numpy().T + layer.base.bias.numpy()
            + 2.5 * dropped @ layer.lora_A.numpy().T @ layer.lora_B.numpy().T)
    expect_close(got, want, "LoRALinear(..., dropout=0.5) in training mode: dropout on the adapter's input only "
                            "(the same random draw as F.dropout(x, 0.5) right after tt.manual_seed)", rtol=1e-4,
                 atol=1e-5)
    layer = lora_layer(student, "cpu").to(dtype="float64")
    x = tt.tensor(RNG.standard_normal((3, 6)), dtype="float64", requires_grad=True)
    expect_gradcheck(lambda x, a, b: layer(x), [x, layer.lora_A, layer.lora_B],
                     "a LoRALinear in float64, in its input, lora_A and lora_B")


@check(points=2, hint="inject: every Linear (or quantized layer, ADAPTED_KINDS) whose last name part is in targets "
                      "becomes LoRALinear(layer, r, alpha, dropout); every other parameter stops requiring grad; "
                      "ValueError when nothing matches", after=("test_lora_forward",))
def test_inject(student):
    for device in DEVICES:
        model = gpt(device)
        back = student.inject(model, ("c_attn", "c_proj"), r=3, alpha=5.0, dropout=0.25)
        expect_equal(back is model, True, "inject returns the model it changed in place")
        wrapped = {name: module for name, module in model.named_modules() if isinstance(module, student.LoRALinear)}
        want = [f"h.{i}.{name}" for i in range(2) for name in ("attn.c_attn", "attn.c_proj", "mlp.c_proj")]
        expect_equal(sorted(wrapped), want, f"the layers inject(gpt, ('c_attn', 'c_proj')) wraps on {device}")
        layer = wrapped["h.1.mlp.c_proj"]
        expect_equal((layer.r, layer.alpha, layer.dropout.p), (3, 5.0, 0.25),
                     "(r, alpha, dropout) of a wrapped layer after inject(..., r=3, alpha=5.0, dropout=0.25)")
        trainable = sorted(name for name, p in model.named_parameters() if p.requires_grad)
        expect_equal(trainable, sorted(f"{name}.lora_{part}" for name in want for part in "AB"),
                     "the parameters that still require grad after inject: the adapters alone")
    model = tt.nn.Sequential(tt.nn.Linear(4, 4), tt.nn.ReLU())
    model.my_c_attn = tt.nn.Linear(4, 4)
    student.inject(model, ["0", "1"], r=2)
    expect_equal([type(model[0]).__name__, type(model[1]).__name__], ["LoRALinear", "ReLU"],
                 "inject(Sequential(Linear, ReLU), ['0', '1']): Linear layers only")
    expect_equal(type(model.my_c_attn).__name__, "Linear", "a layer named my_c_attn for targets ('0', '1')")
    nf4 = tt.quantization.quantize_model(gpt(), "nf4")
    student.inject(nf4, "c_attn")
    expect_equal(type(nf4.h[0].attn.c_attn.base).__name__, "NF4Linear", "inject on an NF4 model: QLoRA")
    model = gpt()
    expect_raises(ValueError, lambda: student.inject(model, ("wq", "wk")), "inject(gpt, ('wq', 'wk'))",
                  mentions=("wq",))
    expect_equal(all(p.requires_grad for p in model.parameters()), True,
                 "the model's parameters after an inject that raised: unchanged")


@check(points=2, hint="merge: for each LoRALinear, base.weight += delta_weight() in place (under no_grad), then "
                      "replace_module(model, layer, layer.base)", after=("test_delta_weight", "test_inject"))
def test_merge(student):
    for device in DEVICES:
        model = student.inject(gpt(device), ("c_attn", "c_proj", "c_fc"), r=2, alpha=3.0)
        rng = np.random.default_rng(4)
        for module in model.modules():
            if isinstance(module, student.LoRALinear):
                module.lora_B.data = tt.tensor(rng.standard_normal(module.lora_B.shape) * 0.2, device=device).data
        weight = model.h[0].mlp.c_fc
        want_weight = weight.base.weight.numpy() + weight.delta_weight().numpy()
        base = weight.base
        with tt.no_grad():
            want = model(token_ids(device)).numpy()
        student.merge(model)
        left = [name for name, module in model.named_modules() if isinstance(module, student.LoRALinear)]
        expect_equal(left, [], f"the LoRALinear layers left after merge on {device}")
        expect_equal(model.h[0].mlp.c_fc is base, True, "the layer in h.0.mlp.c_fc after merge: its base Linear")
        expect_close(base.weight.numpy(), want_weight, "the merged weight W + scaling * B @ A", rtol=1e-5, atol=1e-6)
        with tt.no_grad():
            got = model(token_ids(device))
        expect_on(device, got, "the merged model's logits")
        expect_close(got.numpy(), want, f"the merged model's logits on {device}", rtol=1e-4, atol=1e-5)


@check(points=2, hint="adapter_state_dict: the entries of model.state_dict() named '<layer>.lora_A' and "
                      "'<layer>.lora_B' for each LoRALinear (just 'lora_A', 'lora_B' when the model is one), nothing "
                      "else", after=("test_inject",))
def test_adapter_state_dict(student):
    for device in DEVICES:
        model = student.inject(gpt(device), "c_attn", r=2, alpha=4.0)
        state = student.adapter_state_dict(model)
        want = {f"h.{i}.attn.c_attn.lora_{part}" for i in range(2) for part in "AB"}
        expect_equal(sorted(state), sorted(want), "the names adapter_state_dict gives for inject(gpt, 'c_attn')")
        own = model.state_dict()
        for name in want:
            expect_close(state[name].numpy(), own[name].numpy(), f"adapter_state_dict(...)[{name!r}]")
    layer = lora_layer(student, "cpu")
    expect_equal(sorted(student.adapter_state_dict(layer)), ["lora_A", "lora_B"],
                 "the names adapter_state_dict gives for a LoRALinear itself")


# -- distillation ------------------------------------------------------------------------------------------

def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def ref_distillation(s, t, y, temperature, alpha):
    """The loss and its gradient in s, from the lesson's formula, in float64."""
    classes = s.shape[-1]
    s, t, y = s.reshape(-1, classes), t.reshape(-1, classes), y.reshape(-1)
    n = len(s)
    log_s, log_t = log_softmax(s / temperature), log_softmax(t / temperature)
    kl = (np.exp(log_t) * (log_t - log_s)).sum(axis=-1).mean()
    log_p = log_softmax(s)
    ce = -log_p[np.arange(n), y].mean()
    onehot = np.eye(classes)[y]
    grad = (alpha * temperature * (np.exp(log_s) - np.exp(log_t)) + (1 - alpha) * (np.exp(log_p) - onehot)) / n
    return alpha * temperature ** 2 * kl + (1 - alpha) * ce, grad


@check(points=3, hint="distillation_loss: alpha * T**2 * KL + (1 - alpha) * CE, KL = sum over classes of p_t * (log "
                      "p_t - log p_s) with p = softmax(logits / T) (log_softmax for the logs), averaged over the "
                      "samples; CE = cross_entropy(student, targets); the teacher detached")
def test_distillation_loss(student):
    for device in DEVICES:
        for shape, temperature, alpha in (((4, 7), 2.0, 0.5), ((2, 3, 5), 4.0, 0.8), ((6, 3), 0.5, 0.1),
                                          ((3, 4), 1.0, 1.0), ((3, 4), 3.0, 0.0)):
            s = RNG.standard_normal(shape) * 2
            t = RNG.standard_normal(shape) * 3
            y = RNG.integers(0, shape[-1], shape[:-1])
            student_logits = tt.tensor(s, dtype="float64", device=device, requires_grad=True)
            teacher_logits = tt.tensor(t, dtype="float64", device=device, requires_grad=True)
            loss = student.distillation_loss(student_logits, teacher_logits, tt.tensor(y, device=device),
                                             temperature=temperature, alpha=alpha)
            what = f"distillation_loss of logits {shape}, temperature={temperature}, alpha={alpha} on {device}"
            want, want_grad = ref_distillation(s, t, y, temperature, alpha)
            expect_on(device, loss, what)
            expect_close(loss.item(), want, what, rtol=1e-9, atol=1e-12)
            loss.backward()
            expect_close(student_logits.grad.numpy(), want_grad.reshape(shape), f"the student's gradient of {what}",
                         rtol=1e-8, atol=1e-12)
            expect_equal(teacher_logits.grad is None, True, f"the teacher has no gradient from {what}")


# -- pruning -----------------------------------------------------------------------------------------------

def ref_count(amount, total):
    return amount if isinstance(amount, int) else round(amount * total)


def ref_l1_mask(importance, amount, mask=None):
    kept = np.ones(importance.shape) if mask is None else mask.astype(np.float64)
    flat = kept.reshape(-1).copy()
    candidates = np.flatnonzero(flat)
    order = candidates[np.argsort(np.abs(importance.reshape(-1))[candidates], kind="stable")]
    flat[order[:ref_count(amount, candidates.size)]] = 0
    return flat.reshape(importance.shape)


def ref_ln_mask(importance, amount, n, dim, mask=None):
    kept = np.ones(importance.shape) if mask is None else mask.astype(np.float64)
    moved = np.moveaxis(np.abs(importance.astype(np.float64)), dim, 0).reshape(importance.shape[dim], -1)
    norms = moved.max(axis=1) if math.isinf(n) else (moved ** n).sum(axis=1) ** (1 / n)
    alive = np.moveaxis(kept, dim, 0).reshape(importance.shape[dim], -1).sum(axis=1) != 0
    candidates = np.flatnonzero(alive)
    order = candidates[np.argsort(norms[candidates], kind="stable")]
    keep = np.ones(importance.shape[dim])
    keep[order[:ref_count(amount, candidates.size)]] = 0
    shape = [1] * importance.ndim
    shape[dim] = -1
    return kept * keep.reshape(shape)


@check(points=2, hint="l1_unstructured_mask: among the entries the mask still keeps, set the round(amount * kept) "
                      "(an int amount: that many) of smallest |importance| to 0, a stable sort for ties; a float mask "
                      "of importance's dtype on its device")
def test_l1_unstructured_mask(student):
    for device in DEVICES:
        for dtype in ("float32", "float64"):
            values = RNG.standard_normal((6, 10)).astype(dtype)
            values.reshape(-1)[[3, 17, 40]] = 0.25  # ties: the first in row-major order goes first
            values.reshape(-1)[[5, 22]] = -0.25
            previous = (RNG.random((6, 10)) < 0.7).astype(dtype)
            for amount, mask in ((0.5, None), (0.25, None), (0.35, None), (7, None), (0, None), (1.0, None),
                                 (0.5, previous), (0.125, previous), (3, previous)):
                what = (f"l1_unstructured_mask of a {dtype} (6, 10) tensor, amount={amount}, "
                        f"{'no mask' if mask is None else 'a mask keeping ' + str(int(mask.sum())) + ' entries'}"
                        f" on {device}")
                got = student.l1_unstructured_mask(tt.tensor(values, dtype=dtype, device=device), amount,
                                                   None if mask is None else tt.tensor(mask, dtype=dtype, device=device))
                expect_on(device, got, what)
                expect_equal(got.dtype, np.dtype(dtype), f"the dtype of {what}")
                expect_equal(got.numpy(), ref_l1_mask(values, amount, mask).astype(dtype), what)


@check(points=2, hint="ln_structured_mask: the L_n norm of each slice along dim ((sum |x|**n) ** (1/n) over the other "
                      "axes, max |x| for n = inf); among the slices the mask has not zeroed entirely, zero the "
                      "round(amount * kept) of smallest norm (stable sort), multiplied into the mask")
def test_ln_structured_mask(student):
    for device in DEVICES:
        values = RNG.standard_normal((6, 4, 3, 2)).astype(np.float32)
        values[4] = values[1]  # a tie between slices 1 and 4 along dim 0
        previous = np.ones(values.shape, np.float32)
        previous[2] = 0
        previous[5, 0] = 0
        for amount, n, dim, mask in ((0.5, 2, 0, None), (2, 1, 1, None), (0.5, float("inf"), -1, None),
                                     (0.34, 3, 0, previous), (1, 1, 0, previous), (0.5, 2, 2, previous)):
            what = (f"ln_structured_mask of a (6, 4, 3, 2) tensor, amount={amount}, n={n}, dim={dim}, "
                    f"{'no mask' if mask is None else 'slice 2 of dim 0 already pruned'} on {device}")
            got = student.ln_structured_mask(tt.tensor(values, device=device), amount, n, dim,
                                             None if mask is None else tt.tensor(mask, device=device))
            expect_on(device, got, what)
            expect_equal(got.dtype, np.dtype("float32"), f"the dtype of {what}")
            expect_equal(got.numpy(), ref_ln_mask(values, amount, n, dim, mask).astype(np.float32), what)
    rows = np.repeat(RNG.standard_normal((4, 5)).astype(np.float32), 10, axis=0)  # 40 rows, in 4 groups of ties
    for device in DEVICES:
        got = student.ln_structured_mask(tt.tensor(rows, device=device), 15, 2, 0)  # the cut inside a group
        expect_equal(got.numpy(), ref_ln_mask(rows, 15, 2, 0).astype(np.float32),
                     f"ln_structured_mask of 40 rows in 4 groups of equal rows, amount=15, n=2, dim=0 on {device} "
                     "(ties: the first index goes first)")


@check(points=2, hint="custom_from_mask: the first time, delattr the parameter, set it back as <name>_orig (the same "
                      "object), register_buffer(<name>_mask, mask) and add name to pruned_forward(module).names; "
                      "pruned again: multiply the stored mask; then apply_mask(module, name)")
def test_custom_from_mask(student):
    for device in DEVICES:
        tt.manual_seed(0)
        layer = tt.nn.Linear(5, 4).to(device)
        parameter = layer.weight
        mask = (RNG.random((4, 5)) < 0.5).astype(np.float32)
        what = f"custom_from_mask(Linear(5, 4), 'weight', mask) on {device}"
        expect_equal(student.custom_from_mask(layer, "weight", tt.tensor(mask, device=device)) is layer, True,
                     f"{what} returns the module")
        expect_equal(sorted(layer.state_dict()), ["bias", "weight_mask", "weight_orig"], f"the state_dict keys after {what}")
        expect_equal(layer.weight_orig is parameter, True, f"weight_orig after {what}: the same Parameter object")
        expect_equal(layer.weight_mask.numpy(), mask, f"weight_mask after {what}")
        expect_equal(layer.weight.numpy(), parameter.numpy() * mask, f"layer.weight right after {what}")
        parameter.data = tt.tensor(RNG.standard_normal((4, 5)), device=device).data  # a step of training
        x = tt.tensor(RNG.standard_normal((3, 5)), device=device)
        out = layer(x)
        expect_on(device, out, f"the pruned layer's output on {device}")
        expect_close(out.numpy(), x.numpy() @ (parameter.numpy() * mask).T + layer.bias.numpy(),
                     "the forward pass after weight_orig changed: weight_orig * weight_mask, computed again",
                     rtol=1e-5, atol=1e-6)
        out.sum().backward()
        expect_equal(parameter.grad.numpy()[mask == 0], np.zeros(int((mask == 0).sum()), np.float32),
                     "the gradient of weight_orig where the mask is 0")
        second = (RNG.random((4, 5)) < 0.5).astype(np.float32)
        student.custom_from_mask(layer, "weight", tt.tensor(second, device=device))
        expect_equal(layer.weight_mask.numpy(), mask * second, "weight_mask after a second custom_from_mask: the "
                                                               "product of both")
        expect_equal(layer.weight.numpy(), parameter.numpy() * mask * second, "layer.weight after the second mask")
        expect_equal(student.pruned_forward(layer).names, ["weight"], "the names pruned_forward(layer) masks")


@check(points=2, hint="remove: weight_orig's values times the mask (in place: the same Parameter), delete <name>, "
                      "<name>_orig and <name>_mask, set the Parameter as <name> again, take name off the forward's "
                      "names, and delete the module's own forward when none is left", after=("test_custom_from_mask",))
def test_remove(student):
    for device in DEVICES:
        tt.manual_seed(0)
        layer = tt.nn.Linear(6, 3).to(device)
        parameter = layer.weight
        mask = (RNG.random((3, 6)) < 0.5).astype(np.float32)
        bias_mask = np.array([1, 0, 1], np.float32)
        student.custom_from_mask(layer, "weight", tt.tensor(mask, device=device))
        student.custom_from_mask(layer, "bias", tt.tensor(bias_mask, device=device))
        original = parameter.numpy()
        expect_equal(student.remove(layer, "weight") is layer, True, "remove returns the module")
        what = f"remove(layer, 'weight') with the bias pruned too, on {device}"
        expect_equal(layer.weight is parameter, True, f"layer.weight after {what}: the Parameter weight_orig was")
        expect_equal(parameter.numpy(), original * mask, f"the weight's values after {what}")
        expect_equal(sorted(layer.state_dict()), ["bias_mask", "bias_orig", "weight"], f"the state_dict keys after {what}")
        expect_equal(student.pruned_forward(layer).names, ["bias"], f"the names the forward masks after {what}")
        bias = layer.bias_orig
        student.remove(layer, "bias")
        expect_equal("forward" in layer.__dict__, False, "a forward of the module's own after its last remove")
        expect_equal(sorted(layer.state_dict()), ["bias", "weight"], "the state_dict keys after removing both")
        x = tt.tensor(RNG.standard_normal((2, 6)), device=device)
        expect_close(layer(x).numpy(), x.numpy() @ (original * mask).T + bias.numpy(), "the output after removing both",
                     rtol=1e-5, atol=1e-6)
        expect_equal(bias.numpy()[1], np.float32(0), "the pruned bias entry after remove")
