# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 20 — Fine-tuning and compression: LoRA and QLoRA, distillation, pruning
#
# *One sitting, about 2.5 hours: the lesson, 10 functions to write (two of them
# methods of `LoRALinear`), and the measurements.*
#
# A trained model is rarely the model you ship. You adapt it to *your* text, and
# you make it smaller. Practitioners with one GPU do three things:
#
# * **freeze** the big model, quantize it to 4 bits (Module 19) and train a few
#   small **low-rank adapters** beside its layers: LoRA, and on a 4-bit base QLoRA;
# * **distil** it into a smaller model that learns from the big one's
#   probabilities instead of from the labels alone;
# * **prune** the weights that matter least, and keep them at zero while training.
#
# **You will**
# 1. write `LoRALinear`: a frozen layer plus $\frac{\alpha}{r} B A x$, with $A$
#    random, $B$ zero, only $A$ and $B$ trained; `inject` it into a GPT, `merge`
#    it back into the weights, and save the adapters on their own;
# 2. train the same adapters on an NF4 base: QLoRA;
# 3. write Hinton's **distillation loss**: the KL divergence of softened
#    probabilities, scaled by $T^2$, mixed with the hard-label cross-entropy;
# 4. write **pruning** with PyTorch's names and semantics: a mask beside the
#    original weight, applied in every forward pass, so that pruned weights get
#    no gradient and stay zero through training and checkpoints;
# 5. measure on a GPT trained on Shakespeare: the share of trainable parameters,
#    the bytes of the adapters and of the 4-bit base, the loss before and after
#    fine-tuning on plays the base never read, a distilled model against the same
#    model trained from scratch, and the loss against sparsity.
#
# LoRA is Hu et al. (2021), *LoRA: Low-Rank Adaptation of Large Language Models*;
# QLoRA is Dettmers et al. (2023); distillation is Hinton, Vinyals and Dean (2015),
# *Distilling the Knowledge in a Neural Network*; magnitude pruning is Han et al.
# (2015), *Learning both Weights and Connections for Efficient Neural Networks*.

# %%
import math
import os
import tempfile
import time

import numpy as np

import tinytrain as tt
from tinytrain import Tensor

# %% [markdown]
# ## 1. Low-rank adapters
#
# Fine-tuning every weight of a model needs, per weight, the weight, its gradient
# and two Adam moments: 16 bytes in float32. For a 7 B model that is 112 GB. Yet
# the *change* that fine-tuning makes to a weight matrix has a low intrinsic
# rank (Aghajanyan et al., 2020; Hu et al., 2021). LoRA trains that change
# directly, as a product of two thin matrices, and freezes the rest:
#
# $$y = W_0 x + b + \frac{\alpha}{r}\, B A x, \qquad
#   W_0 \in \mathbb{R}^{d_\text{out} \times d_\text{in}} \text{ frozen},\quad
#   A \in \mathbb{R}^{r \times d_\text{in}},\quad B \in \mathbb{R}^{d_\text{out} \times r}.$$
#
# ```
#            x (…, d_in)
#        ┌─────┴──────────────┐
#   W0 (frozen, d_out×d_in)   A (r×d_in, random)      r ≪ d_in, d_out
#        │                    │  h = x Aᵀ   (…, r)
#        │                    B (d_out×r, zeros)
#        │                    │  h Bᵀ · α/r
#        └───────── + ────────┘
#                   y (…, d_out)
# ```
#
# * $A$ starts random (PyTorch's and peft's `Linear` initialisation,
#   $U(-1/\sqrt{d_\text{in}}, 1/\sqrt{d_\text{in}})$) and $B$ **zero**: at the start
#   $BA = 0$, the adapted model is exactly the base model, and training moves away
#   from it smoothly. (With both random, the model would start damaged.)
# * $\frac{\alpha}{r}$ (`scaling`) keeps the size of the update steady when you
#   change $r$: Hu et al. set $\alpha$ once and then try ranks without retuning
#   the learning rate.
# * Dropout, when asked for, acts on the adapter's input only: $B A\,
#   \mathrm{dropout}(x)$; the frozen path sees $x$ itself.
# * The trainable parameters per layer are $r(d_\text{in} + d_\text{out})$ instead
#   of $d_\text{in} d_\text{out}$: for the GPT milestone's attention input layer
#   ($128 \to 384$) with $r = 8$, $4{,}096$ instead of $49{,}152$, 8%.
#
# **Worked example.** $d_\text{in} = 2$, $d_\text{out} = 1$, $r = 1$, $\alpha = 2$
# (scaling 2), $W_0 = [1, 1]$, no bias, $A = [[1, 0]]$, $B = [[0.5]]$, $x = (3, 4)$:
# $W_0 x = 7$, $A x = 3$, $B A x = 1.5$, $y = 7 + 2 \cdot 1.5 = 10$. The same as
# one layer with the weight $W_0 + \frac{\alpha}{r} BA = [1 + 1, 1] = [2, 1]$:
# $2 \cdot 3 + 4 = 10$. That second form is **merging**: after training, fold the
# adapter into the weight, and inference costs nothing extra.
#
# Write `delta_weight` ($\frac{\alpha}{r} B A$, the change the adapter makes to the
# weight) and `forward`. Compute the adapter path as two thin products
# (`linear(x, A)`, then `linear(h, B)`): never form the big $BA$ in `forward`.

# %% export="nn/lora"
"""LoRA: low-rank adapters beside frozen Linear layers, and QLoRA on 4-bit ones.

``LoRALinear(base, r, alpha)`` adds ``(alpha / r) * B @ A`` to a frozen layer's weight without
forming it: ``y = base(x) + (alpha / r) * dropout(x) @ A.T @ B.T``, ``A`` ``(r, in)`` random, ``B``
``(out, r)`` zero, only they trained. ``inject`` wraps a model's chosen layers and freezes the rest,
``merge`` folds the adapters into the weights, ``adapter_state_dict`` / ``save_adapters`` /
``load_adapters`` keep the adapters apart from the base model. A base that Module 19 quantized to NF4
(``NF4Linear``) takes the same adapters: QLoRA.

LoRA is Hu et al. (2021), *LoRA: Low-Rank Adaptation of Large Language Models*; QLoRA is Dettmers
et al. (2023), *QLoRA: Efficient Finetuning of Quantized LLMs*.
"""
import math
import os
from typing import Any, Iterable

import numpy as np

from tinytrain.arguments import check_int, check_number, check_type
from tinytrain.autograd import no_grad
from tinytrain.nn.dropout import Dropout
from tinytrain.nn.layers import Linear, _uniform_parameter, linear
from tinytrain.nn.module import Module, Parameter
from tinytrain.quantization import FrozenQuantizedLayer, replace_module
from tinytrain.serialization import read_checkpoint, write_checkpoint
from tinytrain.tensor import Tensor

ADAPTERS_KIND = "tinytrain LoRA adapters"  # the mark of an adapters file, so that a model checkpoint is told apart
ADAPTED_KINDS = (Linear, FrozenQuantizedLayer)  # the layers an adapter sits beside: float, int8 or NF4


class LoRALinear(Module):
    """A frozen layer with a trained low-rank update: ``y = base(x) + scaling * dropout(x) @ A.T @ B.T``.

    ``base``: a ``Linear`` or a frozen quantized layer (``QuantizedLinear``, ``NF4Linear``); its
    parameters stop requiring grad. ``lora_A``: ``(r, in)``, drawn like a Linear weight,
    ``U(-1/sqrt(in), 1/sqrt(in))``; ``lora_B``: ``(out, r)`` zeros, so that the adapted layer starts
    equal to ``base``. ``scaling = alpha / r``. ``dropout`` acts on the adapter's input only.
    """

    def __init__(self, base: Module, r: int = 8, alpha: float = 16, dropout: float = 0.0) -> None:
        super().__init__()
        check_type("base", base, ADAPTED_KINDS, "a Linear layer or a quantized one (QuantizedLinear, NF4Linear)")
        self.r = check_int("r", r, minimum=1)
        self.alpha = check_number("alpha", alpha, above=0)
        self.scaling = self.alpha / self.r
        self.in_features, self.out_features = base.in_features, base.out_features
        for parameter in base.parameters():
            parameter.requires_grad = False
        self.base = base
        device = base.parameters()[0]._backend  # the base's device: the adapter lives beside it
        self.lora_A = Parameter(_uniform_parameter((self.r, self.in_features), 1 / math.sqrt(self.in_features)).data,
                                device=device)
        self.lora_B = Parameter(np.zeros((self.out_features, self.r), np.float32), device=device)
        self.dropout = Dropout(dropout)

    def delta_weight(self) -> Tensor:
        """``scaling * B @ A``: the ``(out, in)`` change the adapter makes to the base's weight."""
        ### BEGIN SOLUTION
        return (self.lora_B @ self.lora_A) * self.scaling
        ### END SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        """``base(x) + scaling * dropout(x) @ A.T @ B.T`` for ``x`` of shape ``(..., in)``, the adapter path as two
        thin products (``(..., r)`` in between): ``B @ A`` is never formed."""
        ### BEGIN SOLUTION
        hidden = linear(self.dropout(x), self.lora_A)
        return self.base(x) + linear(hidden, self.lora_B) * self.scaling
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}"


# %% check=2
base = tt.nn.Linear(2, 1, bias=False)
base.weight.data[...] = [[1.0, 1.0]]
layer = LoRALinear(base, r=1, alpha=2)
assert layer.scaling == 2 and layer.lora_A.shape == (1, 2) and layer.lora_B.shape == (1, 1), \
    f"scaling alpha / r = 2, A (r, in) = (1, 2), B (out, r) = (1, 1); got {layer.scaling}, {layer.lora_A.shape}, " \
    f"{layer.lora_B.shape}"
assert not base.weight.requires_grad and layer.lora_A.requires_grad and layer.lora_B.requires_grad, \
    "the base is frozen, A and B require grad"
x = tt.tensor([[3.0, 4.0]])
assert np.allclose(layer(x).numpy(), [[7.0]]), "B starts at zero: the adapted layer equals its base"
layer.lora_A.data[...] = [[1.0, 0.0]]
layer.lora_B.data[...] = [[0.5]]
assert np.allclose(layer.delta_weight().numpy(), [[1.0, 0.0]]), layer.delta_weight()
assert np.allclose(layer(x).numpy(), [[10.0]]), f"the worked example: expected 10, got {layer(x).numpy()}"
tt.manual_seed(0)
layer = LoRALinear(tt.nn.Linear(6, 5), r=3, alpha=6).to(dtype="float64")
layer.lora_B.data[...] = np.random.default_rng(0).standard_normal((5, 3))
x = tt.randn(2, 4, 6, dtype="float64", requires_grad=True)
want = x.numpy() @ (layer.base.weight.numpy() + layer.delta_weight().numpy()).T + layer.base.bias.numpy()
assert np.allclose(layer(x).numpy(), want), "forward equals one Linear with the merged weight"
assert tt.gradcheck(lambda x, a, b: layer(x), [x, layer.lora_A, layer.lora_B]), "gradients of x, A and B"
print("LoRALinear OK")

# %% [markdown]
# ## 2. Into a model, and back out
#
# A GPT has four Linear layers per block: attention's `c_attn` (the queries, keys
# and values) and `c_proj`, the MLP's `c_fc` and `c_proj`. Hu et al. adapt the
# attention projections only; peft's default for GPT-2 is `c_attn`. We take
# `("c_attn", "c_proj")` — the last part of a layer's dotted name, so `c_proj`
# matches both attention's and the MLP's. A target matches that last part
# exactly: `name.rsplit(".", 1)[-1] in targets`. Not a suffix of the string
# (`"c_proj"` does not match a layer named `xc_proj`), and a target with a dot
# (`"attn.c_proj"`) matches no layer.
#
# `inject(model, targets, r, alpha)` **freezes every parameter** of the model
# (embeddings, LayerNorms, the layers it does not adapt), then puts a
# `LoRALinear` around each `Linear` (or quantized layer) whose name ends in one
# of `targets`, in place (`replace_module` from Module 19 does the swapping).
# The optimizer then gets only what still requires grad: the adapters. Only
# layers inside the model are wrapped: the model itself (its name in
# `named_modules` is `""`) cannot replace itself in place, so wrap a lone
# `Linear` with `LoRALinear(layer)` directly. When `inject` raises — no layer matches, the
# model has adapters already, or a bad `r`, `alpha` or `dropout` (checked in the
# given code before anything changes) — the model stays as it was: find the
# layers first, then freeze and wrap.
#
# `merge(model)` does the opposite for inference: each adapted `Linear` gets
# $W \leftarrow W + \frac{\alpha}{r}BA$ and takes its wrapper's place, so the
# model is a plain GPT again, with the same outputs (to float32 rounding). A
# 4-bit base cannot take the update (its codes would have to be rounded again),
# so merging an NF4 layer raises `TypeError`; QLoRA keeps its adapters apart.

# %% export="nn/lora"
def adapted_layers(model: Module) -> list[tuple[str, LoRALinear]]:
    """``(dotted name, layer)`` of every ``LoRALinear`` in ``model``, in ``named_modules`` order."""
    check_type("model", model, Module, "a tinytrain Module")
    return [(name, module) for name, module in model.named_modules() if isinstance(module, LoRALinear)]


def inject(model: Module, targets: Iterable[str] = ("c_attn", "c_proj"), r: int = 8, alpha: float = 16,
           dropout: float = 0.0) -> Module:
    """Freeze every parameter of ``model`` and wrap, in place, each ``Linear`` (or quantized layer) whose dotted
    name ends in one of ``targets`` (``"c_proj"`` matches ``"h.0.attn.c_proj"``) in ``LoRALinear(layer, r, alpha,
    dropout)``; returns ``model``. Only the adapters then require grad.

    A layer matches when the last part of its dotted name equals a target (``name.rsplit(".", 1)[-1] in
    targets``): not a string suffix (``"c_proj"`` does not match ``"xc_proj"``), and a target with a dot
    matches nothing. Only layers inside ``model`` are wrapped: the model itself (name ``""``) cannot be
    replaced in place.

    Raises ``ValueError`` when no layer matches (naming ``targets``) or when ``model`` already has adapters,
    and ``TypeError`` / ``ValueError`` naming a bad ``r`` (a whole number >= 1), ``alpha`` (> 0) or ``dropout``
    (in ``[0, 1)``); nothing changes then.
    """
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    # the arguments LoRALinear would refuse, checked before any parameter is frozen or any layer wrapped
    check_int("r", r, minimum=1)
    check_number("alpha", alpha, above=0)
    check_number("dropout", dropout, minimum=0, below=1)
    if adapted_layers(model):
        raise ValueError(f"inject: {type(model).__name__} already has LoRA adapters; merge them first or use a new "
                         "model")
    ### BEGIN SOLUTION
    chosen = [layer for name, layer in model.named_modules()
              if name.rsplit(".", 1)[-1] in targets and isinstance(layer, ADAPTED_KINDS)]
    if not chosen:
        raise ValueError(f"inject: no Linear layer of {type(model).__name__} is named {targets}")
    for parameter in model.parameters():
        parameter.requires_grad = False
    for layer in chosen:
        replace_module(model, layer, LoRALinear(layer, r, alpha, dropout))
    ### END SOLUTION
    return model


def merge(model: Module) -> Module:
    """Fold every adapter into its base weight (``W += scaling * B @ A``, in place, the weight still frozen) and
    put the base ``Linear`` back in its wrapper's place; returns the model (the base layer itself when ``model``
    is a ``LoRALinear``). The outputs stay the same to float32 rounding. Raises ``ValueError`` when there is no
    adapter, ``TypeError`` naming the layer when a base is quantized (its codes cannot take the update); nothing
    changes then.
    """
    layers = [(model_name or "the model", layer) for model_name, layer in adapted_layers(model)]
    if not layers:
        raise ValueError(f"merge: {type(model).__name__} has no LoRA adapter to merge")
    quantized = [f"{name} ({type(layer.base).__name__})" for name, layer in layers if not isinstance(layer.base, Linear)]
    if quantized:
        raise TypeError(f"merge: a quantized base cannot take the update without rounding it again: "
                        f"{', '.join(quantized)}; keep the adapters apart (save_adapters) or merge into a float base")
    ### BEGIN SOLUTION
    for _, layer in layers:
        with no_grad():
            merged = layer.base.weight + layer.delta_weight()
        layer.base.weight.data[...] = merged.data
        replace_module(model, layer, layer.base)
    ### END SOLUTION
    return layers[0][1].base if isinstance(model, LoRALinear) else model


# %% check=2
def tiny_gpt() -> tt.nn.GPT:
    tt.manual_seed(0)
    return tt.nn.GPT(tt.nn.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))


model = tiny_gpt()
ids = tt.tensor(np.random.default_rng(0).integers(0, 11, (3, 8)))
before = model(ids).numpy()
inject(model, ("c_attn", "c_proj"), r=4, alpha=8)
wrapped = [name for name, module in model.named_modules() if isinstance(module, LoRALinear)]
assert wrapped == ["h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_proj", "h.1.attn.c_attn", "h.1.attn.c_proj",
                   "h.1.mlp.c_proj"], wrapped
trainable = [name for name, p in model.named_parameters() if p.requires_grad]
assert all(name.endswith(("lora_A", "lora_B")) for name in trainable) and len(trainable) == 12, trainable
assert np.allclose(model(ids).numpy(), before), "fresh adapters change nothing"
for _, layer in adapted_layers(model):
    layer.lora_B.data[...] = np.random.default_rng(1).standard_normal(layer.lora_B.shape) * 0.1
adapted = model(ids).numpy()
assert not np.allclose(adapted, before), "a nonzero B changes the outputs"
merge(model)
assert not adapted_layers(model) and isinstance(model.h[0].attn.c_attn, tt.nn.Linear), \
    f"merge puts the base Linear back in each wrapper's place, got {type(model.h[0].attn.c_attn).__name__}"
assert np.allclose(model(ids).numpy(), adapted, atol=1e-5), "merged logits equal the adapted ones"
print("inject and merge OK")

# %% [markdown]
# ### Adapters on their own
#
# The point of adapters is that they are small: one base model, many adapters
# (one per task, per customer), each a few hundred kilobytes. So they are saved
# **apart** from the base: `adapter_state_dict(model)` is the part of
# `model.state_dict()` that holds adapters — every `...lora_A` and `...lora_B`,
# under the names `state_dict` gives them — and nothing else. A layer's name and
# the parameter's join with a dot (`h.0.attn.c_attn.lora_A`); when the model is
# itself a `LoRALinear`, its name is `""` and the keys are plain `lora_A` and
# `lora_B`, with no leading dot.
# `save_adapters(model, path)` writes it (with each layer's $\alpha$) as a
# Module 10 checkpoint; `load_adapters(model, path)` loads it into a model that
# has the base weights already and the same adapters injected, and refuses a file
# whose adapters do not match the model's, naming the difference.

# %% export="nn/lora"
def adapter_state_dict(model: Module) -> dict[str, Tensor]:
    """The adapters of ``model``: the entries of ``model.state_dict()`` (copies, under the same names) that are
    the ``lora_A`` and ``lora_B`` of its ``LoRALinear`` layers, and none of the base's: ``"h.0.attn.c_attn.lora_A"``,
    or plain ``"lora_A"`` when ``model`` is itself a ``LoRALinear`` (its name is ``""``)."""
    ### BEGIN SOLUTION
    names = {f"{name}.{part}" if name else part for name, _ in adapted_layers(model) for part in ("lora_A", "lora_B")}
    return {name: value for name, value in model.state_dict().items() if name in names}
    ### END SOLUTION


def save_adapters(model: Module, path: str | os.PathLike) -> None:
    """Write ``model``'s adapters (``adapter_state_dict``) and each layer's ``alpha`` to ``path``, atomically, as a
    checkpoint file; raises ``ValueError`` when the model has no adapter."""
    adapters = adapter_state_dict(model)
    if not adapters:
        raise ValueError(f"save_adapters: {type(model).__name__} has no LoRA adapter (inject them first)")
    write_checkpoint(path, {"kind": ADAPTERS_KIND, "adapters": {name: value.numpy() for name, value in adapters.items()},
                            "alpha": {name: layer.alpha for name, layer in adapted_layers(model)}})


def load_adapters(model: Module, path: str | os.PathLike) -> Module:
    """Load the adapters saved in ``path`` into ``model`` (a base with the same adapters injected); returns it.

    Raises ``ValueError`` for a file that holds no adapters, ``KeyError`` naming the adapters missing from the
    file or not in the model, ``ValueError`` naming a layer whose ``alpha`` differs, and ``ValueError`` for a
    shape that differs (another rank); the model is unchanged then."""
    state = read_checkpoint(path)
    if state.get("kind") != ADAPTERS_KIND:
        raise ValueError(f"load_adapters: {path} holds no LoRA adapters (a model checkpoint? load that with "
                         "load_state_dict)")
    saved, own = state["adapters"], adapter_state_dict(model)
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise KeyError(f"load_adapters: the adapters in {path} do not match the model's: missing from the file "
                       f"{missing}, not in the model {unexpected}")
    alphas = {name: layer.alpha for name, layer in adapted_layers(model)}
    different = {name: (alpha, alphas[name]) for name, alpha in state["alpha"].items() if alpha != alphas.get(name)}
    if different:
        raise ValueError(f"load_adapters: alpha (file, model) differs at {different}")
    shapes = {name: (tuple(saved[name].shape), own[name].shape) for name in own
              if tuple(saved[name].shape) != own[name].shape}
    if shapes:
        raise ValueError(f"load_adapters: adapter shapes (file, model) differ at {shapes}: another rank r?")
    model.load_state_dict(saved, strict=False)
    return model


# %% check=2
model = inject(tiny_gpt(), "c_attn", r=2, alpha=4)
state = adapter_state_dict(model)
assert sorted(state) == ["h.0.attn.c_attn.lora_A", "h.0.attn.c_attn.lora_B", "h.1.attn.c_attn.lora_A",
                         "h.1.attn.c_attn.lora_B"], sorted(state)
for name, layer in adapted_layers(model):
    layer.lora_B.data[...] = 0.25
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "adapters.pkl")
    save_adapters(model, path)
    again = load_adapters(inject(tiny_gpt(), "c_attn", r=2, alpha=4), path)
assert np.allclose(again(ids).numpy(), model(ids).numpy()), "the same model after a round trip"
print(f"adapters OK: {sum(v.size for v in state.values())} numbers")

# %% [markdown]
# ### QLoRA: adapters on a 4-bit base
#
# QLoRA's recipe is what we have now: quantize the frozen base to NF4
# (`quantize_model(model, "nf4")`), then `inject` adapters around the `NF4Linear`
# layers. Forward dequantizes each 4-bit weight to the compute dtype; backward
# sends the gradient through the frozen layer to its input (Module 19's
# `FrozenQuantizedLinear`) and into the adapters. The base costs half a byte
# per weight, the trained part is a few percent of the parameters, and Adam's
# two moments exist for those only.

# %% check=2
model = tt.quantization.quantize_model(tiny_gpt(), "nf4")
inject(model, ("c_attn", "c_proj"), r=4, alpha=8)
assert isinstance(model.h[0].attn.c_attn.base, tt.quantization.NF4Linear), \
    f"inject wraps the NF4 layer itself, got a base of {type(model.h[0].attn.c_attn.base).__name__}"
optimizer = tt.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
targets = tt.tensor(np.random.default_rng(2).integers(0, 11, (3, 8)))
first = None
for _ in range(5):
    optimizer.zero_grad()
    _, loss = model(ids, targets=targets)
    loss.backward()
    optimizer.step()
    first = loss.item() if first is None else first
assert loss.item() < first, (first, loss.item())
print(f"QLoRA OK: loss {first:.3f} -> {loss.item():.3f} with only the adapters trained")

# %% [markdown]
# ## 3. Distillation
#
# A small model trained on labels learns from one bit of news per example: the
# right class. A trained big model knows more: for "The quick brown f", it puts
# most probability on "o" but some on "a" and "i", and almost none on "z". Hinton
# et al. train the small **student** to match the big **teacher**'s
# probabilities, softened by a **temperature** $T$:
#
# $$p^T_i = \frac{\exp(z_i / T)}{\sum_j \exp(z_j / T)}.$$
#
# $T > 1$ flattens the distribution, so the small probabilities — the "dark
# knowledge" of which wrong answers are nearly right — weigh in. The soft loss is
# the KL divergence from the teacher's softened distribution to the student's,
#
# $$\mathrm{KL}\big(p^T_\text{teacher} \,\|\, p^T_\text{student}\big) =
#   \sum_i p^T_{\text{teacher},i}\,\big(\log p^T_{\text{teacher},i} - \log p^T_{\text{student},i}\big),$$
#
# averaged over the samples (PyTorch's `reduction="batchmean"`). Its gradient in
# the student's logits is $\frac{1}{T}(p^T_\text{student} - p^T_\text{teacher})$,
# which shrinks like $1/T^2$ once the logits are small against $T$; Hinton et al.
# multiply the soft loss by $T^2$ so that its weight does not change with $T$.
# The loss mixes it with the usual cross-entropy on the hard labels $y$, with a
# weight $\alpha$ **on the soft term**:
#
# $$L = \alpha\, T^2\, \mathrm{KL}\big(p^T_\text{teacher} \,\|\, p^T_\text{student}\big)
#     + (1 - \alpha)\, \mathrm{CE}(z_\text{student}, y).$$
#
# $\alpha = 1$ learns from the teacher alone, $\alpha = 0$ is plain training.
# The teacher's logits are constants: no gradient flows into the teacher.
#
# **Worked example**, one sample, two classes, $T = 2$, $\alpha = 0.5$: teacher
# logits $(2, 0)$, student $(0, 0)$, label 0. $p^T_\text{teacher} =
# \mathrm{softmax}(1, 0) = (0.7311, 0.2689)$, $p^T_\text{student} = (0.5, 0.5)$.
# KL $= 0.7311 \ln(0.7311/0.5) + 0.2689 \ln(0.2689/0.5) = 0.2779 - 0.1668 =
# 0.1109$; CE $= \ln 2 = 0.6931$; $L = 0.5 \cdot 4 \cdot 0.1109 + 0.5 \cdot
# 0.6931 = 0.5684$.
#
# Logits may have any leading axes (a GPT's $(B, T, V)$ with targets $(B, T)$):
# the given code flattens them to $(N, C)$ and $(N,)$. Use `log_softmax` (stable
# for any logits) for both distributions.

# %% export="nn/distillation"
"""Knowledge distillation: Hinton, Vinyals and Dean (2015), *Distilling the Knowledge in a Neural Network*."""
from typing import Any

from tinytrain.arguments import check_number, check_type
from tinytrain.nn.losses import cross_entropy
from tinytrain.tensor import Tensor


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, targets: Any, temperature: float = 2.0,
                      alpha: float = 0.5) -> Tensor:
    """Hinton's loss: ``alpha * T**2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * CE(s, targets)``.

    ``student_logits`` ``s`` and ``teacher_logits`` ``t``: ``(..., C)`` of one shape; ``targets``: the class
    indices, ``(...)``. The KL divergence is summed over the classes and averaged over the samples (PyTorch's
    ``kl_div(..., reduction="batchmean")``), the cross-entropy averaged too; ``alpha`` weights the soft
    (teacher) term, ``1 - alpha`` the hard-label one. The teacher's logits are constants (detached): only the
    student gets a gradient. ``temperature > 0`` and ``0 <= alpha <= 1``, else ``ValueError`` naming the value;
    logits of different shapes raise ``ValueError`` naming both.
    """
    check_type("student_logits", student_logits, Tensor, "a Tensor of logits")
    check_type("teacher_logits", teacher_logits, Tensor, "a Tensor of logits")
    if student_logits.shape != teacher_logits.shape or student_logits.ndim < 2:
        raise ValueError(f"distillation_loss: student and teacher logits must have one shape (..., C), got "
                         f"{student_logits.shape} and {teacher_logits.shape}")
    temperature = check_number("temperature", temperature, above=0)
    alpha = check_number("alpha", alpha, minimum=0, maximum=1)
    classes = student_logits.shape[-1]
    student, teacher = student_logits.reshape(-1, classes), teacher_logits.detach().reshape(-1, classes)
    targets = targets if isinstance(targets, Tensor) else Tensor(targets, device=student._backend)
    targets = targets.reshape(-1)
    ### BEGIN SOLUTION
    log_student = (student / temperature).log_softmax(axis=-1)
    log_teacher = (teacher / temperature).log_softmax(axis=-1)
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum(axis=-1).mean()
    hard = cross_entropy(student, targets)
    return kl * (alpha * temperature ** 2) + hard * (1 - alpha)
    ### END SOLUTION


# %% check=2
loss = distillation_loss(tt.tensor([[0.0, 0.0]]), tt.tensor([[2.0, 0.0]]), tt.tensor([0]), temperature=2.0,
                         alpha=0.5)
assert abs(loss.item() - 0.5684) < 1e-4, f"the worked example: expected 0.5684, got {loss.item():.4f}"
rng = np.random.default_rng(3)
student = tt.tensor(rng.standard_normal((2, 3, 5)), dtype="float64", requires_grad=True)
teacher = tt.tensor(rng.standard_normal((2, 3, 5)), dtype="float64", requires_grad=True)
labels = tt.tensor(rng.integers(0, 5, (2, 3)))
same = distillation_loss(teacher.detach(), teacher.detach(), labels, alpha=1.0).item()
assert abs(same) < 1e-12, f"a student equal to its teacher has no soft loss, got {same}"
plain = distillation_loss(student, teacher, labels, alpha=0.0).item()
hard = tt.nn.functional.cross_entropy(student.reshape(6, 5), labels.reshape(6)).item()
assert abs(plain - hard) < 1e-12, f"alpha=0: the hard-label cross-entropy alone, expected {hard}, got {plain}"
assert tt.gradcheck(lambda s: distillation_loss(s, teacher, labels, temperature=3.0, alpha=0.7), [student]), \
    "the student's gradient"
distillation_loss(student, teacher, labels).backward()
assert teacher.grad is None and student.grad is not None, "the teacher gets no gradient"
print("distillation_loss OK")

# %% [markdown]
# ## 4. Pruning
#
# Many weights of a trained network are close to zero; setting them *exactly*
# to zero changes little and makes the matrix **sparse**. Two kinds:
#
# * **unstructured**: any single weight. `l1_unstructured(module, "weight",
#   amount)` zeroes the `amount` (a fraction in $[0, 1]$, or a count) of the
#   entries with the smallest $|w|$. The matrix keeps its shape: the saving needs
#   sparse storage and kernels (or sparse tensor cores' 2:4 pattern) to become
#   speed.
# * **structured**: whole slices. `ln_structured(module, "weight", amount, n,
#   dim)` zeroes the slices along `dim` with the smallest $L_n$ norm (the norm of
#   everything in the slice): `dim=0` removes output rows — whole neurons, whole
#   heads' rows — which a smaller dense matrix can then drop.
#
# The number pruned is `round(amount * size)` (Python's `round`, half to even,
# as PyTorch), of the entries (or slices) **not pruned yet**: pruning twice by
# 0.5 leaves a quarter.
#
# **The mask stays.** Training must not bring pruned weights back. PyTorch (and
# we) keep the original values as a parameter `weight_orig`, the mask of 1s and
# 0s as a buffer `weight_mask`, and before every forward pass compute
#
# $$W = W_\text{orig} \odot M.$$
#
# The gradient of $W_\text{orig}$ is then $\frac{\partial L}{\partial W} \odot M$:
# zero where pruned, so the optimizer's steps keep pruned weights out of the
# model (their `weight_orig` entries may still move under weight decay, but the
# mask keeps them out). Both tensors are in `state_dict()`, so the mask survives
# checkpoints. `remove(module, "weight")` makes it permanent: `weight` becomes a
# plain parameter again, holding $W_\text{orig} \odot M$.
#
# First the masks. `importance` is the tensor whose magnitudes decide (the
# original weight), `mask` the mask already applied (None: nothing pruned yet);
# the result is the new mask, a float tensor of 1s and 0s in `importance`'s
# dtype and device, equal to `mask` times the new cut. Among equal magnitudes the
# one first in row-major order goes first (a stable sort: `xp.argsort(values,
# kind="stable")`; CuPy accepts only `kind="stable"` or None, not NumPy's
# `"mergesort"`). The norm of a slice along `dim` is taken over every other axis;
# for a 1-D tensor there is none, and each slice is one entry, its norm $|x|$.
#
# Work on the arrays (`xp = importance._backend.xp`) and wrap the result with
# `Tensor._make(array, importance._backend)`, so that the mask stays on the
# tensor's device (as in Module 19). A count taken on the device — `kept.sum()`
# is a 0-d device array on CuPy — goes through `int(...)` before
# `pruned_count`, which wants a Python number.

# %% export="prune"
"""Pruning with PyTorch's names and semantics (``torch.nn.utils.prune``).

Pruning ``module.weight`` replaces the parameter by ``weight_orig`` (the same Parameter, renamed) and a
buffer ``weight_mask`` of 1s and 0s, and makes ``weight = weight_orig * weight_mask`` before every forward
pass: pruned weights stay zero, get no gradient, and the mask travels in ``state_dict()``.
``l1_unstructured`` prunes the entries of smallest magnitude, ``ln_structured`` the slices along a
dimension of smallest L_n norm, ``custom_from_mask`` applies a given mask, ``remove`` makes the pruning
permanent. Pruning again prunes among what is left, and the masks multiply.
"""
import math
import numbers
from typing import Any

from tinytrain.arguments import check_number, check_type
from tinytrain.autograd import no_grad
from tinytrain.nn.module import Module
from tinytrain.tensor import Tensor


def pruned_count(amount: Any, total: int, what: str) -> int:
    """How many of ``total`` ``what`` (entries, slices) to prune: a float ``amount`` in [0, 1] is a fraction,
    ``round(amount * total)`` (half to even, as PyTorch); an int is a count, at most ``total``. Raises
    ``TypeError`` for anything else (a bool too), ``ValueError`` naming an amount out of range."""
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(f"amount must be a fraction in [0, 1] or a count of {what}, got {amount!r} "
                        f"({type(amount).__name__})")
    if isinstance(amount, numbers.Integral):
        if not 0 <= amount <= total:
            raise ValueError(f"amount={amount} {what} to prune, but there are {total} left to prune")
        return int(amount)
    if not 0.0 <= amount <= 1.0:
        raise ValueError(f"amount must be a fraction in [0, 1] (or a count of {what}), got amount={amount}")
    return round(amount * total)


def ones_like(importance: Tensor, mask: Tensor | None) -> Any:
    """``mask``'s array in ``importance``'s dtype, or an array of ones (nothing pruned yet)."""
    xp = importance._backend.xp
    if mask is None:
        return xp.ones(importance.shape, dtype=importance.dtype)
    if mask.shape != importance.shape:
        raise ValueError(f"the mask's shape {mask.shape} differs from the tensor's {importance.shape}")
    return mask.data.astype(importance.dtype)


def l1_unstructured_mask(importance: Tensor, amount: Any, mask: Tensor | None = None) -> Tensor:
    """``mask`` (ones when None) with ``pruned_count(amount, kept)`` more entries set to 0: of the ``kept`` entries
    ``mask`` still keeps, those of smallest ``|importance|`` (ties: first in row-major order). A float tensor of
    1s and 0s of ``importance``'s shape, dtype and device."""
    xp = importance._backend.xp
    kept = ones_like(importance, mask).reshape(-1)
    ### BEGIN SOLUTION
    candidates = xp.flatnonzero(kept)
    count = pruned_count(amount, int(candidates.size), "entries")
    order = candidates[xp.argsort(xp.abs(importance.data).ravel()[candidates], kind="stable")]
    kept[order[:count]] = 0
    return Tensor._make(kept.reshape(importance.shape), importance._backend)
    ### END SOLUTION


def ln_structured_mask(importance: Tensor, amount: Any, n: float, dim: int, mask: Tensor | None = None) -> Tensor:
    """``mask`` (ones when None) with ``pruned_count(amount, kept)`` more slices along ``dim`` set to 0: of the
    ``kept`` slices ``mask`` has not zeroed entirely, those whose ``importance`` has the smallest L_n norm
    (``(sum |x|**n) ** (1/n)`` over the slice, ``n = inf``: the largest ``|x|``; ties: the first index; a 1-D
    tensor's slices are single entries, of norm ``|x|``). A float tensor of 1s and 0s of ``importance``'s shape,
    dtype and device. ``n > 0``; ``dim`` may be negative."""
    n = check_number("n", n, above=0, finite=False)
    if not -importance.ndim <= dim < importance.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor of shape {importance.shape}")
    xp = importance._backend.xp
    kept = ones_like(importance, mask)
    ### BEGIN SOLUTION
    dim %= importance.ndim
    others = tuple(axis for axis in range(importance.ndim) if axis != dim)
    magnitude = xp.abs(importance.data)
    norms = magnitude.max(axis=others) if math.isinf(n) else (magnitude ** n).sum(axis=others) ** (1 / n)
    candidates = xp.flatnonzero(kept.sum(axis=others) != 0)
    count = pruned_count(amount, int(candidates.size), "slices")
    order = candidates[xp.argsort(norms[candidates], kind="stable")]
    keep = xp.ones(importance.shape[dim], dtype=kept.dtype)
    keep[order[:count]] = 0
    shape = [1] * importance.ndim
    shape[dim] = importance.shape[dim]
    return Tensor._make(kept * keep.reshape(shape), importance._backend)
    ### END SOLUTION


# %% check=2
weight = tt.tensor([[0.5, -0.1, 2.0], [-3.0, 0.2, 0.05]])
mask = l1_unstructured_mask(weight, 0.5)
assert np.array_equal(mask.numpy(), [[1, 0, 1], [1, 0, 0]]), mask
again = l1_unstructured_mask(weight, 1, mask)
assert np.array_equal(again.numpy(), [[0, 0, 1], [1, 0, 0]]), f"one more among the kept: {again}"
rows = ln_structured_mask(weight, 0.5, 2, 0)
assert np.array_equal(rows.numpy(), [[0, 0, 0], [1, 1, 1]]), rows
columns = ln_structured_mask(weight, 1, 1, -1)
assert np.array_equal(columns.numpy(), [[1, 0, 1], [1, 0, 1]]), columns
by_max = ln_structured_mask(weight, 1, float("inf"), 1, columns).numpy()
assert np.array_equal(by_max, [[1, 0, 0], [1, 0, 0]]), f"n=inf: the largest |x|, one more column of the kept: {by_max}"
print("pruning masks OK")

# %% [markdown]
# Now the reparametrisation. `custom_from_mask(module, name, mask)` (PyTorch's
# name for "prune by this mask") does, the first time a tensor is pruned:
#
# 1. take the parameter `module.<name>` out of the parameters (`delattr`) and
#    register **the same Parameter object** as `<name>_orig` (an optimizer that
#    holds it keeps training it);
# 2. register `mask` as the buffer `<name>_mask`;
#
# and when it is pruned already, multiply `<name>_mask` by `mask`. Then it adds
# `name` to `pruned_forward(module).names` (given: the module's forward, which
# first sets `module.<name> = <name>_orig * <name>_mask`, a plain attribute with
# its graph, for each of its names) and applies the mask once at once
# (`apply_mask`, given), so that `module.<name>` reads pruned right away.
#
# `remove(module, name)` undoes the bookkeeping and keeps the zeros:
# `<name>_orig`'s values become $W_\text{orig} \odot M$ (in place: still the same
# Parameter), the plain attribute (set by `apply_mask`, it lives in
# `module.__dict__`), `<name>_orig` and `<name>_mask` are deleted, the Parameter
# is registered as `<name>` again, and `name` leaves the forward's names. When
# that list is empty, delete the `PrunedForward` too (`del
# module.__dict__["forward"]`), so that the module's own `forward` runs again.

# %% export="prune"
class PrunedForward:
    """A pruned module's ``forward``: sets ``module.<name> = <name>_orig * <name>_mask`` for each of ``names``, then
    runs the module's own ``forward`` (PyTorch does the same in a forward pre-hook)."""

    def __init__(self, module: Module) -> None:
        self.module, self.names = module, []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for name in self.names:
            apply_mask(self.module, name)
        return type(self.module).forward(self.module, *args, **kwargs)


def pruned_forward(module: Module) -> PrunedForward:
    """``module``'s ``PrunedForward``, put in place of its ``forward`` the first time."""
    forward = module.__dict__.get("forward")
    if not isinstance(forward, PrunedForward):
        forward = PrunedForward(module)
        object.__setattr__(module, "forward", forward)
    return forward


def apply_mask(module: Module, name: str) -> None:
    """``module.<name> = <name>_orig * <name>_mask``: a plain attribute (not a parameter), with its graph."""
    setattr(module, name, getattr(module, name + "_orig") * getattr(module, name + "_mask"))


def is_pruned(module: Module, name: str = "weight") -> bool:
    """Whether ``module.<name>`` is pruned (it has ``<name>_orig`` and ``<name>_mask``)."""
    check_type("module", module, Module, "a tinytrain Module")
    return name + "_orig" in module._parameters and name + "_mask" in module._buffers


def pruned_tensor(module: Module, name: str) -> tuple[Tensor, Tensor | None]:
    """``(original values, mask or None)`` of ``module.<name>``; ``AttributeError`` naming it when the module has no
    such parameter."""
    if is_pruned(module, name):
        return getattr(module, name + "_orig"), getattr(module, name + "_mask")
    if not isinstance(module._parameters.get(name), Tensor):
        raise AttributeError(f"{type(module).__name__} has no parameter {name!r} to prune (its parameters: "
                             f"{sorted(module._parameters)})")
    return module._parameters[name], None


def custom_from_mask(module: Module, name: str, mask: Tensor) -> Module:
    """Prune ``module.<name>`` by ``mask`` (1 keep, 0 prune, of its shape and device); returns ``module``.

    The first time: the Parameter moves to ``<name>_orig`` (the same object), ``mask`` becomes the buffer
    ``<name>_mask``; when already pruned, the stored mask is multiplied by ``mask``. From then on every forward
    pass computes ``module.<name> = <name>_orig * <name>_mask``, and ``module.<name>`` holds that already.
    Raises ``ValueError`` naming both shapes when the mask's shape differs.
    """
    original, _ = pruned_tensor(module, name)
    check_type("mask", mask, Tensor, "a Tensor of 1s and 0s")
    if mask.shape != original.shape:
        raise ValueError(f"custom_from_mask: the mask's shape {mask.shape} differs from {name}'s {original.shape}")
    mask = Tensor._make(mask.data.astype(original.dtype), original._backend)
    ### BEGIN SOLUTION
    if is_pruned(module, name):
        setattr(module, name + "_mask", getattr(module, name + "_mask") * mask)
    else:
        delattr(module, name)
        setattr(module, name + "_orig", original)
        module.register_buffer(name + "_mask", mask)
        pruned_forward(module).names.append(name)
    apply_mask(module, name)
    ### END SOLUTION
    return module


def l1_unstructured(module: Module, name: str, amount: Any) -> Module:
    """Prune ``amount`` (a fraction of what is left, or a count) of the entries of ``module.<name>`` with the
    smallest magnitude (of the original values); returns ``module``. PyTorch's ``prune.l1_unstructured``."""
    original, mask = pruned_tensor(module, name)
    return custom_from_mask(module, name, l1_unstructured_mask(original, amount, mask))


def ln_structured(module: Module, name: str, amount: Any, n: float, dim: int) -> Module:
    """Prune ``amount`` (a fraction of what is left, or a count) of the slices of ``module.<name>`` along ``dim``
    with the smallest L_n norm (of the original values): ``dim=0`` of a Linear weight removes output rows;
    returns ``module``. PyTorch's ``prune.ln_structured``."""
    original, mask = pruned_tensor(module, name)
    return custom_from_mask(module, name, ln_structured_mask(original, amount, n, dim, mask))


def remove(module: Module, name: str) -> Module:
    """Make the pruning of ``module.<name>`` permanent: the Parameter ``<name>_orig``, its values multiplied by the
    mask in place, is ``module.<name>`` again, and ``<name>_orig``, ``<name>_mask`` and the per-forward masking are
    gone: the plain attribute ``module.__dict__[name]``, and the ``PrunedForward`` in ``module.__dict__["forward"]``
    once no other tensor of the module is pruned. Raises ``ValueError`` naming the tensor when it is not pruned."""
    if not is_pruned(module, name):
        raise ValueError(f"remove: {name!r} of {type(module).__name__} is not pruned")
    ### BEGIN SOLUTION
    original, mask = getattr(module, name + "_orig"), getattr(module, name + "_mask")
    original.data[...] = original.data * mask.data
    for attribute in (name, name + "_orig", name + "_mask"):
        delattr(module, attribute)
    setattr(module, name, original)
    forward = pruned_forward(module)
    forward.names.remove(name)
    if not forward.names:
        del module.__dict__["forward"]
    ### END SOLUTION
    return module


def sparsity(tensor: Tensor) -> float:
    """The fraction of ``tensor``'s entries that are exactly zero."""
    check_type("tensor", tensor, Tensor, "a Tensor")
    return float((tensor.data == 0).sum()) / max(tensor.size, 1)


# %% check=2
tt.manual_seed(0)
layer = tt.nn.Linear(8, 6)
parameter = layer.weight
l1_unstructured(layer, "weight", amount=0.5)
assert set(dict(layer.named_parameters())) == {"weight_orig", "bias"} and layer.weight_orig is parameter, \
    f"the same Parameter as weight_orig, got parameters {sorted(dict(layer.named_parameters()))}"
assert "weight_mask" in layer.state_dict() and sparsity(layer.weight) == 0.5, sparsity(layer.weight)
optimizer = tt.optim.SGD(layer.parameters(), lr=0.5)
for _ in range(3):
    optimizer.zero_grad()
    layer(tt.randn(4, 8)).sum().backward()
    assert (parameter.grad.numpy()[layer.weight_mask.numpy() == 0] == 0).all(), "pruned weights get no gradient"
    optimizer.step()
assert sparsity(layer.weight) == 0.5, f"still half zero after training, got {sparsity(layer.weight)}"
ln_structured(layer, "weight", 0.5, 2, 0)
zero_rows = int((layer.weight.numpy() == 0).all(axis=1).sum())
assert zero_rows == 3, f"half of the 6 rows pruned on top of the entries: {zero_rows} rows all zero"
pruned = layer.weight.numpy()
remove(layer, "weight")
assert layer.weight is parameter and set(layer.state_dict()) == {"weight", "bias"}, \
    f"remove: the same Parameter is weight again, got state_dict keys {sorted(layer.state_dict())}"
assert np.array_equal(layer.weight.numpy(), pruned), "remove keeps the zeros in the Parameter"
assert "forward" not in layer.__dict__, "remove deletes the PrunedForward once its list of names is empty"
print("pruning OK")

# %% [markdown]
# ## 5. Systems
#
# Train a small GPT on the first 90% of Tiny Shakespeare (two blocks of 64
# channels, 300 steps: about half a minute). Its **target** text is the last 10%,
# which it never trained on: *The Taming of the Shrew* and *The Tempest*, two
# comedies whose people (Petruchio, Katharina, Baptista, Prospero) never speak in
# the first 90%. The first 90% of the target adapts, its last 10% measures.
# (`tinytrain milestone finetune` does the same to the GPT milestone's model.)

# %%
text = tt.datasets.shakespeare()
tokenizer = tt.text.CharTokenizer().train(text)
cut = int(len(text) * 0.9)
target = text[cut:]
target_cut = int(len(target) * 0.9)
base_ids = np.array(tokenizer.encode(text[:cut]))
adapt_ids, target_val_ids = np.array(tokenizer.encode(target[:target_cut])), np.array(tokenizer.encode(target[target_cut:]))
CONTEXT = 64


def windows(ids: np.ndarray, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` random windows of CONTEXT ids and their next ids."""
    starts = rng.integers(0, len(ids) - CONTEXT - 1, count)
    both = np.stack([ids[start:start + CONTEXT + 1] for start in starts])
    return both[:, :-1], both[:, 1:]


def train(model: tt.nn.Module, ids: np.ndarray, steps: int, lr: float, seed: int, loss_of=None) -> tt.nn.Module:
    """AdamW on what requires grad, batches of 16 windows of `ids`, a warm-up and a cosine to lr / 10;
    `loss_of(model, inputs, targets)` gives the loss (default: the model's own cross-entropy)."""
    optimizer = tt.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.99),
                               weight_decay=0.0)
    rng = np.random.default_rng(seed)
    model.train()
    for step in range(steps):
        optimizer.lr = lr * min(1, (step + 1) / 30) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        inputs, targets = (tt.tensor(a) for a in windows(ids, 16, rng))
        optimizer.zero_grad()
        loss = model(inputs, targets=targets)[1] if loss_of is None else loss_of(model, inputs, targets)
        loss.backward()
        optimizer.step()
    return model


def validation_loss(model: tt.nn.Module, ids: np.ndarray) -> float:
    """The mean loss on 8 fixed batches of 32 windows of `ids`, in evaluation mode, without gradients."""
    model.eval()
    with tt.no_grad():
        losses = []
        for seed in range(8):
            inputs, targets = windows(ids, 32, np.random.default_rng(seed))
            losses.append(model(tt.tensor(inputs), targets=tt.tensor(targets))[1].item())
    return float(np.mean(losses))


config = tt.nn.GPTConfig(tokenizer.vocab_size, CONTEXT, n_layer=2, n_head=4, n_embd=64)
tt.manual_seed(0)
start = time.perf_counter()
base_state = train(tt.nn.GPT(config), base_ids, steps=300, lr=4e-3, seed=0).state_dict()
print(f"base trained in {time.perf_counter() - start:.0f} s")


def base_model(state: dict = base_state, cfg: tt.nn.GPTConfig = config) -> tt.nn.GPT:
    model = tt.nn.GPT(cfg)
    model.load_state_dict(state)
    return model


# %% [markdown]
# ### LoRA and QLoRA on the new plays
#
# Three ways to spend 100 steps on the target: every weight (full
# fine-tuning), LoRA adapters ($r = 8$, $\alpha = 16$) on the float base, and the
# same adapters on the NF4 base (QLoRA). For each: the target loss after, the
# share of parameters trained, and the bytes of what must be kept per task (the
# adapters) and of the frozen base.

# %%
def parameter_count(model: tt.nn.Module, trainable: bool = False) -> int:
    return sum(p.size for p in model.parameters() if p.requires_grad or not trainable)


before = validation_loss(base_model(), target_val_ids)
runs = {}
for name in ("full fine-tuning", "LoRA r=8", "QLoRA r=8 (NF4 base)"):
    tt.manual_seed(1)
    model = base_model()
    if name.startswith("QLoRA"):
        tt.quantization.quantize_model(model, "nf4")
    if "LoRA" in name:
        inject(model, ("c_attn", "c_proj"), r=8, alpha=16)
    share = parameter_count(model, trainable=True) / parameter_count(base_model())
    frozen_bytes = sum(p.data.nbytes for p in model.parameters() + model.buffers() if not p.requires_grad)
    start = time.perf_counter()
    train(model, adapt_ids, steps=100, lr=1e-3 if name.startswith("full") else 4e-3, seed=1)
    seconds = time.perf_counter() - start
    after = validation_loss(model, target_val_ids)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "saved.pkl")
        if "LoRA" in name:
            save_adapters(model, path)
        else:
            tt.serialization.write_checkpoint(path, {"model": model.state_dict()})
        saved = os.path.getsize(path)
    runs[name] = (after, share, saved, frozen_bytes, seconds)
base_file = runs["full fine-tuning"][2]
print(f"target loss of the base: {before:.4f}")
print(f"{'':24s} {'target loss':>11s} {'trained':>8s} {'file per task':>14s} {'frozen bytes':>13s} {'time':>6s}")
for name, (after, share, saved, frozen_bytes, seconds) in runs.items():
    print(f"{name:24s} {after:11.4f} {share:8.2%} {saved:10,d} B {frozen_bytes:13,d} {seconds:5.1f}s")
assert runs["LoRA r=8"][0] < before and runs["QLoRA r=8 (NF4 base)"][0] < before

# %% [markdown]
# Read the table against the base's loss. The adapters change what the model
# does with a small share of its parameters; QLoRA starts from a base rounded to
# 4 bits (the fine-tuning milestone measures what that costs on the same text:
# about 0.02 on a model of this size, before any training), and its adapters
# learn to make up for it too. The frozen NF4 base holds about a fifth of the
# float base's bytes here, not an eighth: the token and position embeddings,
# the LayerNorms and the tied output layer stay float32, and at 64 channels
# they are a large part of the model. On a 7 B model, whose Linear layers are
# nearly everything, NF4 is close to an eighth.
#
# On a big model the trainable share is much smaller: the adapters grow with
# $r(d_\text{in} + d_\text{out})$, the base with $d_\text{in} d_\text{out}$.
# LLaMA-7B with $r = 8$ on its attention projections trains 0.06% of its
# parameters, and QLoRA fine-tunes a 65 B model on one 48 GB GPU (Dettmers et
# al.). The memory that full fine-tuning spends on gradients and Adam's moments
# (12 of its 16 bytes per weight) is spent on the adapters only.
#
# ### Distillation: half the layers
#
# Distil the two-block base into a one-block student (same width) on the
# training text, and train the same student from scratch for the same steps
# with the same seed: the difference is the teacher alone.

# %%
student_config = tt.nn.GPTConfig(tokenizer.vocab_size, CONTEXT, n_layer=1, n_head=4, n_embd=64)
teacher = base_model().eval()


def distilled(model: tt.nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    with tt.no_grad():
        teacher_logits = teacher(inputs)
    return distillation_loss(model(inputs), teacher_logits, targets, temperature=2.0, alpha=0.5)


held_out_ids = np.array(tokenizer.encode(target))  # text none of the models trained on
results = {}
for name, loss_of in (("from scratch", None), ("distilled (T=2, alpha=0.5)", distilled)):
    tt.manual_seed(2)
    student = train(tt.nn.GPT(student_config), base_ids, steps=150, lr=4e-3, seed=2, loss_of=loss_of)
    results[name] = validation_loss(student, held_out_ids)
results["teacher (2 blocks)"] = validation_loss(teacher, held_out_ids)
for name, loss in results.items():
    print(f"{name:28s} loss on held-out text {loss:.4f}")

# %% [markdown]
# The two students differ only in their loss. Distillation helps most when labels
# are scarce or the student trains briefly; a character-level model sees 1,024
# labels a step (16 windows of 64), so expect a small gap here, and compare it
# with the teacher's own loss: the student has one block where the teacher has
# two, about half the parameters in the blocks and half the time per token.
#
# ### Loss against sparsity
#
# Prune every Linear weight of the blocks by magnitude (the tied output layer
# is the token embedding: left alone), from 0 to 90%, and measure the base's
# loss on the held-out plays; then the same with whole rows (`ln_structured`,
# $n = 2$, `dim=0`).

# %%
curve = {}
for fraction in (0.0, 0.3, 0.5, 0.7, 0.9):
    losses = []
    for prune in (lambda layer: l1_unstructured(layer, "weight", fraction),
                  lambda layer: ln_structured(layer, "weight", fraction, 2, 0)):
        model = base_model()
        layers = [module for name, module in model.named_modules()
                  if isinstance(module, tt.nn.Linear) and name.startswith("h.")]
        for layer in layers:
            prune(layer)
        zeros = sum((layer.weight.numpy() == 0).sum() for layer in layers) / sum(layer.weight.size for layer in layers)
        losses.append((zeros, validation_loss(model, held_out_ids)))
    curve[fraction] = losses
print(f"{'pruned':>7s} {'unstructured':>13s} {'rows':>8s}")
for fraction, ((zeros, unstructured), (_, rows)) in curve.items():
    print(f"{zeros:7.0%} {unstructured:13.4f} {rows:8.4f}")

# %%
try:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.2))
    axes.plot([f * 100 for f in curve], [u for (_, u), _ in curve.values()], "o-", label="unstructured (L1)")
    axes.plot([f * 100 for f in curve], [r for _, (_, r) in curve.values()], "s-", label="rows (L2)")
    axes.set_xlabel("weights of the blocks pruned (%)")
    axes.set_ylabel("validation loss")
    axes.legend()
    plt.show()
except ImportError:
    print("matplotlib is not installed: the table above is the curve")

# %% [markdown]
# Han et al. (2015) found that trained networks lose little until a large share of
# their smallest weights is gone, and that whole rows cost much more at the same
# sparsity: a row carries a whole output channel. Read both off the curve.
# Unstructured sparsity needs sparse kernels to save time (NumPy has none;
# NVIDIA's sparse tensor cores need exactly 2 of every 4 zero); structured
# pruning makes a smaller dense matrix — which is why practitioners prune
# structurally and then **fine-tune** to win the loss back,
# with the mask held in place exactly as `weight_orig * weight_mask` does.
#
# ## How PyTorch does it
#
# * **LoRA**: Hugging Face `peft`: `LoraConfig(r=8, lora_alpha=16,
#   target_modules=["c_attn"], lora_dropout=0.05)`, `get_peft_model(model,
#   config)` (our `inject`), `model.merge_and_unload()` (our `merge`),
#   `model.save_pretrained(path)` writes the adapters alone. Its `lora_A` is
#   initialised like ours, `lora_B` zero, the scaling `lora_alpha / r`.
# * **QLoRA**: `bitsandbytes`' `BitsAndBytesConfig(load_in_4bit=True,
#   bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)` when loading the
#   model, then `peft.prepare_model_for_kbit_training(model)` and the same LoRA.
# * **Distillation** has no single function: `F.kl_div(F.log_softmax(s / T, -1),
#   F.log_softmax(t / T, -1), reduction="batchmean", log_target=True) * T**2`
#   mixed with `F.cross_entropy` is the usual code.
# * **Pruning**: `torch.nn.utils.prune.l1_unstructured(module, "weight",
#   amount=0.5)`, `ln_structured(module, "weight", amount, n=2, dim=0)`,
#   `custom_from_mask`, `remove` — our names and semantics (`weight_orig`,
#   `weight_mask`, the mask applied by a forward pre-hook). For speed,
#   `torch.sparse` and `to_sparse_semi_structured` (2:4) turn the zeros into
#   faster kernels.
#
# ## Summary
#
# * LoRA trains $\frac{\alpha}{r}BA$ beside a frozen weight; $B = 0$ at the start
#   makes the adapted model equal the base; merging folds it in for free
#   inference; the adapters are a few percent of the parameters and are saved
#   apart.
# * QLoRA puts the same adapters on a 4-bit NF4 base: the gradient flows through
#   the frozen, dequantized weights into the adapters.
# * Distillation trains a student on $\alpha T^2\, \mathrm{KL}(p^T_\text{teacher}
#   \| p^T_\text{student}) + (1-\alpha)\,\mathrm{CE}$: the teacher's softened
#   probabilities carry what the labels do not.
# * Pruning keeps `weight_orig` and `weight_mask` and multiplies them before
#   every forward pass: pruned weights stay zero, get no gradient and survive
#   checkpoints; `remove` makes it permanent. Unstructured pruning is nearly free
#   up to half the weights; structured pruning costs more but gives smaller
#   dense matrices.
