# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 15 — Transformers: a GPT
#
# *One sitting, about 2.5 hours: the lesson, 6 functions to write, and the measurements.*
#
# Module 14 built the parts: token ids, embeddings, positions, causal
# self-attention. This module stacks them into **GPT**, the decoder-only
# transformer of Radford et al. (2018, 2019), in the layout of GPT-2 and with
# the names of Karpathy's nanoGPT, so that a GPT-2 checkpoint's tensors map
# one to one onto ours. Then we make it *write*: sampling with a temperature
# and top-k, and a **KV cache** that makes each new token cheap.
#
# **You will**
# 1. write the pre-LayerNorm transformer block: attention and an MLP, each
#    added to a residual stream;
# 2. tie the output layer to the token embedding, and initialise the weights
#    the way GPT-2 does;
# 3. write the GPT forward pass, with a loss for training;
# 4. turn logits into next-token probabilities with a temperature and top-k;
# 5. write attention that reads and extends a key/value cache;
# 6. measure: parameters and FLOPs per token, the KV cache's speed-up, and the
#    memory gradient checkpointing saves.

# %%
import math
import time
import tracemalloc

import numpy as np

import tinytrain as tt
from tinytrain import Tensor

# %% [markdown]
# ## 1. The block
#
# A transformer is a **residual stream**: a $(B, T, C)$ tensor $x$ that flows
# from the embeddings to the output, and $L$ blocks that each *add* something to
# it. A block has two sub-layers: causal self-attention (positions exchange
# information) and an MLP (each position thinks on its own). GPT-2 normalises
# the *input* of each sub-layer — **pre-LN** (Xiong et al., 2020, *On Layer
# Normalization in the Transformer Architecture*):
#
# $$x \leftarrow x + \operatorname{attn}(\operatorname{LN}_1(x)), \qquad
#   x \leftarrow x + \operatorname{mlp}(\operatorname{LN}_2(x)).$$
#
# The original transformer normalised *after* the addition,
# $x \leftarrow \operatorname{LN}(x + \operatorname{attn}(x))$ (post-LN). Pre-LN
# leaves the stream itself un-normalised: the gradient of the loss reaches
# every block through the additions unchanged, which lets deep stacks train
# without a learning-rate warm-up dance. Two rules, then: **normalise the
# sub-layer's input, not the sum**, and **add, do not replace** — without the
# residual, a block throws away everything before it.
#
# The MLP (given) widens each position to $4C$, applies GELU, and projects
# back: `c_fc`, `gelu`, `c_proj`, then dropout. The attention is Module 14's
# `CausalSelfAttention`, extended in section 5 with a cache: `CachedSelfAttention`.
# A configuration object holds the sizes, with nanoGPT's names.

# %% export="nn/transformer"
"""GPT: a decoder-only transformer (GPT-2's layout, nanoGPT's names), with a KV cache for generation.

``GPTConfig`` holds the sizes; ``GPT(config)`` has ``wte`` (token embedding), ``wpe``
(learned positions), ``h`` (a ``ModuleList`` of pre-LayerNorm ``Block``s), ``ln_f`` and
``lm_head`` (its weight is ``wte``'s). ``GPT.forward(idx, targets=None, cache=None)``
returns the logits, or ``(logits, loss)`` with targets; ``GPT.generate`` samples with a
temperature and top-k, using a ``KVCache`` so each new token costs one position's work.
"""
import contextlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinytrain.arguments import check_int, check_number, check_type
from tinytrain.autograd import no_grad
from tinytrain.nn.attention import CausalSelfAttention, scaled_dot_product_attention, use_flash_attention
from tinytrain.nn.checkpointing import checkpoint
from tinytrain.nn.dropout import Dropout
from tinytrain.nn.embedding import Embedding, LearnedPositionalEncoding
from tinytrain.nn.layers import GELU, Linear, ModuleList
from tinytrain.nn.losses import cross_entropy
from tinytrain.nn.module import Module, Parameter
from tinytrain.nn.normalization import LayerNorm
from tinytrain.tensor import Tensor, concatenate, tensor


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a GPT (nanoGPT's names): ``vocab_size`` token ids, at most ``block_size``
    positions, ``n_layer`` blocks of ``n_head`` heads over ``n_embd`` channels (a multiple of
    ``n_head``); ``dropout`` everywhere nanoGPT has it; ``bias`` in the Linear layers;
    ``checkpointing``: recompute each block's activations in backward instead of keeping them;
    ``flash``: attention by FlashAttention (Module 17), which keeps no (T, T) weights and has no
    dropout on them, so it needs ``dropout=0``."""
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True
    checkpointing: bool = False
    flash: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            check_int(name, getattr(self, name), minimum=1)
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        check_number("dropout", self.dropout, minimum=0, below=1)
        check_type("flash", self.flash, bool, "True or False")
        if self.flash and self.dropout:
            raise ValueError(f"GPTConfig: flash=True has no dropout on the attention weights; got "
                             f"dropout={self.dropout} (use dropout=0 with flash attention)")


class MLP(Module):
    """Each position on its own: ``Linear(C, 4C)``, GELU, ``Linear(4C, C)``, dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = GELU()
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(Module):
    """A pre-LayerNorm transformer block: ``x + attn(ln_1(x))``, then ``+ mlp(ln_2(...))``.

    ``forward(x, cache=None)``: ``x`` (B, T, C) -> (B, T, C). The residual stream ``x`` is
    never normalised itself: each sub-layer gets its normalised copy, and its output is
    *added* to the stream. ``cache`` (a ``LayerCache`` or None) goes to ``attn``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd)
        self.attn = CachedSelfAttention(config.n_embd, config.n_head, bias=config.bias, dropout=config.dropout,
                                        flash=config.flash)
        self.ln_2 = LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cache: "LayerCache | None" = None) -> Tensor:
        ### BEGIN SOLUTION
        x = x + self.attn(self.ln_1(x), cache=cache)
        return x + self.mlp(self.ln_2(x))
        ### END SOLUTION


# %% [markdown]
# `CachedSelfAttention` comes in section 5; until then it is exactly Module 14's
# layer (with no cache it calls its `forward`). We define it now, with its
# cached path still to write, so the block can use it:

# %% export="nn/transformer"
class LayerCache:
    """The keys and values one attention layer computed for the positions so far:
    ``k`` and ``v`` of shape (B, H, S, D), or None before the first position."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        """S, the number of positions cached."""
        return 0 if self.k is None else self.k.shape[-2]


class KVCache:
    """One ``LayerCache`` per block (``layers[i]`` for block ``i``); ``length`` positions cached so far,
    which is also the position of the next token."""

    def __init__(self, n_layer: int) -> None:
        self.layers = [LayerCache() for _ in range(check_int("n_layer", n_layer, minimum=1))]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.layers)}, length={self.length})"


class CachedSelfAttention(CausalSelfAttention):
    """``CausalSelfAttention`` (Module 14) that can also read and extend a ``LayerCache``.

    ``forward(x, cache=None)``: without a cache, exactly Module 14's layer. With a cache of
    S positions, ``x`` (B, T, C) holds positions S .. S+T-1 (evaluation mode, no dropout):
    their queries, keys and values come from ``c_attn`` and are split into heads as in
    Module 14; the new keys and values are appended to the cache's along the position axis
    (axis 2 of (B, H, S, D)), and stored back in ``cache.k`` / ``cache.v``; the T queries
    attend all S+T keys with ``scaled_dot_product_attention(..., is_causal=True)`` (query i
    is position S+i and sees keys 0 .. S+i); the heads are merged and go through ``c_proj``.
    ``flash=True`` runs the attention without a cache through FlashAttention (Module 17):
    the layer's forward -- a checkpoint's recompute too -- is inside ``use_flash_attention()``.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, dropout: float = 0.0,
                 flash: bool = False) -> None:
        super().__init__(embed_dim, num_heads, bias=bias, dropout=dropout)
        self.flash = check_type("flash", flash, bool, "True or False")
        if flash and self.dropout:
            raise ValueError(f"{type(self).__name__}: flash=True has no dropout on the attention weights; got "
                             f"dropout={self.dropout}")

    def extra_repr(self) -> str:
        return super().extra_repr() + (", flash=True" if self.flash else "")

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        if cache is None:
            with use_flash_attention() if self.flash else contextlib.nullcontext():
                return super().forward(x)
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{type(self).__name__} expects input of shape (B, T, {self.embed_dim}), got {x.shape}")
        if cache.k is not None and cache.k.shape[0] != x.shape[0]:
            raise ValueError(f"{type(self).__name__}: the cache holds {cache.k.shape[0]} sequences, x {x.shape[0]}")
        ### BEGIN SOLUTION
        batch, length, channels = x.shape
        qkv = self.c_attn(x)
        q, k, v = (qkv[..., i * channels:(i + 1) * channels].reshape(batch, length, self.num_heads, self.head_dim)
                   .transpose(0, 2, 1, 3) for i in range(3))
        if cache.k is not None:
            k = concatenate([cache.k, k], axis=2)
            v = concatenate([cache.v, v], axis=2)
        cache.k, cache.v = k, v
        y = scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(0, 2, 1, 3).reshape(batch, length, channels))
        ### END SOLUTION


# %% check=2
tt.manual_seed(0)
config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
block = Block(config).to(dtype="float64")
x = tt.randn(2, 5, 8, dtype="float64", requires_grad=True)
ln1, ln2 = block.ln_1, block.ln_2
with tt.no_grad():
    h = x + block.attn(ln1(x))
    expected = h + block.mlp(ln2(h))
assert np.allclose(block(x).numpy(), expected.numpy()), "x + attn(ln_1(x)), then h + mlp(ln_2(h))"
assert tt.gradcheck(lambda x: block(x), [x])
print(block.__class__.__name__, "OK")

# %% [markdown]
# ## 2. GPT: embeddings, blocks, and a tied output layer
#
# The whole model, for token ids `idx` of shape $(B, T)$:
#
# $$x = \mathrm{wte}[\mathrm{idx}] + \mathrm{wpe}[0..T-1], \quad
#   x \leftarrow \mathrm{block}_\ell(x)\ (\ell = 1..L), \quad
#   \mathrm{logits} = \mathrm{lm\_head}(\mathrm{ln\_f}(x)),$$
#
# with dropout (`drop`) after the embeddings: `drop(wte[idx] + wpe[0..T-1])`.
# Mind that `wpe` (Module 14's `LearnedPositionalEncoding`) *adds* its table to
# what it is given: `self.wpe(x)` is already $x + \mathrm{wpe}[0..T-1]$, so the sum
# is `self.wpe(self.wte(idx))`. `ln_f` is needed because pre-LN
# blocks leave the stream un-normalised. `lm_head` is a `Linear(C, V)` without
# bias that maps each position's vector to a score per token.
#
# **Weight tying.** `wte.weight` is $(V, C)$: a vector per token, read on the way
# *in*. `lm_head.weight` is $(V, C)$ too: a vector per token, compared with the
# final state on the way *out*. GPT-2 (after Press & Wolf, 2017) uses **one
# matrix for both**: `self.lm_head.weight = self.wte.weight` — the same
# Parameter object, so it appears once in `parameters()`, gets the gradients
# of both uses added up, and saves $VC$ parameters (38 M of GPT-2 small's 124 M).
# Write that line at the end of `GPT.__init__`.
#
# **Initialisation** (GPT-2, as nanoGPT): every `Linear` weight and both embedding
# tables $\sim \mathcal N(0, 0.02^2)$, every `Linear` bias 0, LayerNorms at their
# ones and zeros — except the two `c_proj` weights of each block (attention's and
# the MLP's), whose outputs are added to the residual stream: $\mathcal N(0,
# (0.02/\sqrt{2L})^2)$. Why: the stream is a sum of $2L$ such outputs; if
# they were independent with equal variance, the variance of the sum would grow
# as $2L$, so each is scaled by $1/\sqrt{2L}$ to keep the stream's size
# independent of depth. `normal_(parameter, std)` (given) overwrites a
# parameter in place with samples from its device's generator.
#
# **The loss.** With `targets` (B, T) — the next token at every position —
# `forward` returns `(logits, loss)`, the loss being the mean cross-entropy over
# all $B \cdot T$ positions: reshape the logits to $(BT, V)$ and the targets to
# $(BT,)$ for `cross_entropy`. Without targets it returns the logits.
#
# **Positions with a cache.** `forward` also takes a `KVCache` (section 5): then
# `idx` continues a sequence of `cache.length` positions, so its first token is
# at position `cache.length`, not 0: pass `start=cache.length` to `wpe`, read
# *before* the blocks extend the cache. The given `run_blocks(x, cache)` runs
# the blocks (each with its layer of the cache, or checkpointed).

# %% export="nn/transformer"
def normal_(parameter: Parameter, std: float) -> Parameter:
    """Overwrite ``parameter`` in place with samples of N(0, std²) from its device's generator."""
    parameter.data[...] = parameter._backend.random_normal(parameter.shape) * std
    return parameter


class GPT(Module):
    """GPT-2's decoder-only transformer (nanoGPT's names).

    ``wte = Embedding(V, C)``, ``wpe = LearnedPositionalEncoding(block_size, C)``, ``drop``,
    ``h = ModuleList(Block × n_layer)``, ``ln_f = LayerNorm(C)``, ``lm_head = Linear(C, V,
    bias=False)`` whose weight IS ``wte.weight`` (tied: one Parameter). ``init_weights()`` runs
    in ``__init__``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = check_type("config", config, GPTConfig, "a GPTConfig")
        self.wte = Embedding(config.vocab_size, config.n_embd)
        self.wpe = LearnedPositionalEncoding(config.block_size, config.n_embd)
        self.drop = Dropout(config.dropout)
        self.h = ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.init_weights()
        # weight tying (section 2): lm_head's weight becomes wte's Parameter
        ### BEGIN SOLUTION
        self.lm_head.weight = self.wte.weight
        ### END SOLUTION

    def init_weights(self) -> None:
        """GPT-2's initialisation: every Linear weight, ``wte.weight`` and ``wpe.weight`` ~ N(0, 0.02²)
        (``normal_``), every Linear bias 0 (a model built with ``bias=False`` has ``bias`` None:
        nothing to set); but each block's ``attn.c_proj.weight`` and
        ``mlp.c_proj.weight`` ~ N(0, (0.02 / sqrt(2 * n_layer))²). LayerNorms keep ones and zeros."""
        ### BEGIN SOLUTION
        for module in self.modules():
            if isinstance(module, (Linear, Embedding, LearnedPositionalEncoding)):
                normal_(module.weight, 0.02)
            if isinstance(module, Linear) and module.bias is not None:
                module.bias.data[...] = 0
        for block in self.h:
            for layer in (block.attn.c_proj, block.mlp.c_proj):
                normal_(layer.weight, 0.02 / math.sqrt(2 * self.config.n_layer))
        ### END SOLUTION

    def run_blocks(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """``x`` through every block: block ``i`` with ``cache.layers[i]`` when there is a cache;
        otherwise each block in a gradient checkpoint when ``config.checkpointing``."""
        for i, block in enumerate(self.h):
            if cache is not None:
                x = block(x, cache.layers[i])
            elif self.config.checkpointing:
                x = checkpoint(block, x)
            else:
                x = block(x)
        return x

    def forward(self, idx: Any, targets: Any = None, cache: KVCache | None = None) -> Any:
        """``idx`` (B, T) token ids -> logits (B, T, vocab_size); with ``targets`` (B, T),
        ``(logits, loss)``, the loss the mean cross-entropy over all B*T positions.

        With a ``cache`` of S positions (evaluation mode only), ``idx`` holds positions
        S .. S+T-1: ``wpe`` starts at S (``past``, read before the blocks extend the cache), and
        ``run_blocks`` gives each block its layer of the cache."""
        idx = idx if isinstance(idx, Tensor) else tensor(idx)
        if idx.ndim != 2:
            raise ValueError(f"GPT expects token ids of shape (B, T), got {idx.shape}")
        past = 0 if cache is None else check_type("cache", cache, KVCache, "a KVCache").length
        if past + idx.shape[1] > self.config.block_size:
            raise ValueError(f"GPT: positions {past} to {past + idx.shape[1] - 1} do not fit in "
                             f"block_size={self.config.block_size}")
        if cache is not None and self.training:
            raise RuntimeError("GPT: a KV cache is for generation; call model.eval() first (dropout is off there)")
        ### BEGIN SOLUTION
        x = self.drop(self.wpe(self.wte(idx), start=past))
        logits = self.lm_head(self.ln_f(self.run_blocks(x, cache)))
        if targets is None:
            return logits
        loss = cross_entropy(logits.reshape(-1, self.config.vocab_size), targets.reshape(-1))
        return logits, loss
        ### END SOLUTION

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 use_cache: bool = True) -> Tensor:
        """``idx`` (B, T) -> (B, T + max_new_tokens): append ``max_new_tokens`` tokens, each drawn by
        ``sample(next_token_probs(last logits, temperature, top_k))`` from at most the last
        ``block_size`` tokens. Runs in evaluation mode under ``no_grad`` (the mode is restored).
        ``use_cache`` runs the model on one new token per step with a ``KVCache``, and starts a
        new cache from the last ``block_size`` tokens when it is full (the same tokens as without)."""
        idx = idx if isinstance(idx, Tensor) else tensor(idx)
        if idx.ndim != 2 or idx.shape[1] < 1:
            raise ValueError(f"generate expects a context of token ids of shape (B, T) with T >= 1, got {idx.shape}")
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
        block_size, cache, was_training = self.config.block_size, None, self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    if cache is not None and cache.length < block_size:
                        logits = self(idx[:, -1:], cache=cache)
                    else:
                        cache = KVCache(self.config.n_layer) if use_cache else None
                        logits = self(idx[:, -block_size:], cache=cache)
                    probs = next_token_probs(logits[:, -1], temperature, top_k)
                    idx = concatenate([idx, sample(probs).reshape(-1, 1)], axis=1)
        finally:
            self.train(was_training)
        return idx


# %% check=3
tt.manual_seed(0)
config = GPTConfig(vocab_size=13, block_size=8, n_layer=3, n_head=2, n_embd=16)
model = GPT(config)
assert model.lm_head.weight is model.wte.weight, "tie lm_head.weight to wte.weight: the same Parameter"
names = [name for name, _ in model.named_parameters()]
assert "lm_head.weight" not in names and names[:2] == ["wte.weight", "wpe.weight"], names
big = GPT(GPTConfig(vocab_size=500, block_size=64, n_layer=3, n_head=2, n_embd=64))
assert abs(big.wte.weight.numpy().std() - 0.02) < 0.002, "wte ~ N(0, 0.02²)"
assert abs(big.h[0].mlp.c_fc.weight.numpy().std() - 0.02) < 0.002, "Linear weights ~ N(0, 0.02²)"
assert abs(big.h[1].mlp.c_proj.weight.numpy().std() - 0.02 / math.sqrt(6)) < 0.0006, "c_proj: 0.02 / sqrt(2 L)"
assert not big.h[0].attn.c_attn.bias.numpy().any(), "Linear biases start at 0"
idx = np.random.default_rng(0).integers(0, 13, (2, 6))
logits = model(idx)
assert logits.shape == (2, 6, 13)
logits, loss = model(idx[:, :-1], targets=tt.tensor(idx[:, 1:]))
want = tt.nn.functional.cross_entropy(logits.reshape(-1, 13), tt.tensor(idx[:, 1:].reshape(-1)))
assert np.isclose(loss.item(), want.item()), "mean cross-entropy over all B*T positions"
x = model.wte(tt.tensor(idx[:, :-1])) + model.wpe.weight[:5]  # dropout is 0 here
assert np.allclose(logits.numpy(), model.lm_head(model.ln_f(model.run_blocks(x))).numpy(), atol=1e-6), \
    "logits = lm_head(ln_f(blocks(wte[idx] + wpe[0..T-1]))): wpe(x) already adds its table to x"
assert abs(loss.item() - math.log(13)) < 0.2, "at initialisation the loss is about log(V)"
print(f"GPT OK: loss at initialisation {loss.item():.3f}, log V = {math.log(13):.3f}")

# %% [markdown]
# At initialisation the logits are all near 0, so every token gets probability
# about $1/V$ and the loss is about $\log V$ — the first number to check when a
# language model starts training.
#
# ## 3. Counting parameters and FLOPs
#
# Per block: `c_attn` $3C^2 + 3C$, attention's `c_proj` $C^2 + C$, `c_fc` $4C^2
# + 4C$, the MLP's `c_proj` $4C^2 + C$, two LayerNorms $4C$: **$12C^2 + 13C$**
# ($12C^2 + 4C$ without biases). Add the tied token table $VC$, the positions
# $TC$ (T = `block_size`) and `ln_f` $2C$.
#
# **FLOPs per token** (Kaplan et al., 2020, *Scaling Laws for Neural Language
# Models*; nanoGPT's `estimate_mfu`): a matrix-vector product with a weight of
# $n$ numbers is $2n$ floating-point operations, and the backward pass costs
# twice the forward (one product for the input's gradient, one for the
# weight's). So training costs about $6N$ per token, $N$ the parameters except
# the position table (which is only added; the biases and LayerNorms that $N$
# still counts are a small share, and nanoGPT counts them too). Attention adds, per layer
# and token, $QK^\top$ and the weighted sum of values over $T$ positions:
# $2 \cdot 2TC$ forward, $12TC$ with backward:
#
# $$\text{FLOPs per token (training)} \approx 6N + 12\,L\,C\,T .$$
#
# (The causal mask means half of those scores are thrown away; like nanoGPT we
# count them, since the code computes them.) Both formulas are given:

# %% export="nn/transformer"
def gpt_num_parameters(config: GPTConfig) -> int:
    """The parameters of ``GPT(config)``: ``V*C`` (wte, shared with lm_head) + ``block_size*C``
    (wpe) + ``n_layer * (12 C² + 13 C)`` (``12 C² + 4 C`` without bias) + ``2 C`` (ln_f)."""
    c = config.n_embd
    per_block = 12 * c * c + (13 if config.bias else 4) * c
    return config.vocab_size * c + config.block_size * c + config.n_layer * per_block + 2 * c


def flops_per_token(config: GPTConfig, context: int | None = None) -> int:
    """Training FLOPs (forward and backward) per token at ``context`` positions (default
    ``block_size``): ``6 N + 12 * n_layer * n_embd * context``, N the parameters except ``wpe``."""
    context = config.block_size if context is None else check_int("context", context, minimum=1)
    weights = gpt_num_parameters(config) - config.block_size * config.n_embd
    return 6 * weights + 12 * config.n_layer * config.n_embd * context


# %%
assert gpt_num_parameters(config) == model.num_parameters()
gpt2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
print(f"GPT-2 small: {gpt_num_parameters(gpt2) / 1e6:.1f} M parameters, "
      f"{flops_per_token(gpt2) / 1e9:.2f} GFLOPs per training token at T = 1024 "
      f"(attention: {12 * 12 * 768 * 1024 / flops_per_token(gpt2):.0%})")

# %% [markdown]
# 124.4 M, as OpenAI's GPT-2 small (with its biases, tied). At $T = 1024$
# attention is only about 13% of the work: the $6N$ of the matrix products
# dominates until $T$ is several times $C$.
#
# ## 4. Writing: temperature and top-k
#
# The model gives logits $z$ for the next token. To write, turn them into
# probabilities and draw one:
#
# * **temperature** $\tau$: $p = \operatorname{softmax}(z / \tau)$. $\tau < 1$
#   sharpens the distribution (safer, more repetitive text), $\tau > 1$ flattens
#   it. As $\tau \to 0$ all the probability goes to the largest logit, so
#   **$\tau = 0$ means greedy**: probability 1 for the largest logit of each row
#   (the first, when several are equal — as `argmax`), 0 elsewhere.
# * **top-k** (Fan et al., 2018): before the softmax, keep only the $k$ largest
#   logits of each row and give the rest probability 0 (set them to $-\infty$).
#   A logit *equal* to the $k$-th largest is kept too, as in nanoGPT. `top_k=None`
#   keeps all; a `top_k` larger than $V$ keeps all.
#
# Example: $z = (2, 1, 0)$, $\tau = 1$: $p = (0.665, 0.245, 0.090)$; with
# $k = 2$: $(0.731, 0.269, 0)$; with $\tau = 0$: $(1, 0, 0)$.
#
# `next_token_probs` works on the last position's logits, $(B, V)$. It needs no
# graph: its caller (`generate`) runs it under `no_grad`, and working on the
# arrays is simplest. Take the softmax stably, as in Module 03 (subtract each
# row's maximum before `exp`). `xp = logits._backend.xp` is the array
# library (`xp.sort`, `xp.where`, `xp.argmax`…) if you want it, and
# `Tensor._make(array, logits._backend)` wraps an array back into a tensor.
# The probabilities must stay on the logits' device, with their dtype: on a
# GPU, `generate` appends the ids drawn from them to a context that lives
# there, so a table built on the host (`np.zeros`, `Tensor(array)`) breaks
# generation on every device but the CPU.
# `sample(probs)` (given) then draws one id per row: a uniform $u$ per row from
# the device's generator, and the first id whose cumulative probability passes
# $u$ — so `tt.manual_seed` makes generation reproducible.

# %% export="nn/transformer"
def next_token_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None) -> Tensor:
    """Probabilities (B, V) of the next token from its logits (B, V).

    ``temperature > 0``: ``softmax(logits / temperature)`` over the ``top_k`` largest logits of
    each row (all when ``top_k`` is None; a logit equal to the k-th largest is kept too); the
    others get probability 0. ``temperature == 0``: greedy, probability 1 for the largest logit
    of each row (the first of equal ones) and 0 elsewhere. The result is on the logits' device,
    with their dtype (``generate`` appends the ids drawn from it to the context there); the
    logits themselves stay as they were (``logits.data`` is the caller's array).
    """
    if logits.ndim != 2:
        raise ValueError(f"next_token_probs expects logits of shape (B, V), got {logits.shape}")
    temperature = check_number("temperature", temperature, minimum=0)
    if top_k is not None:
        top_k = min(check_int("top_k", top_k, minimum=1), logits.shape[-1])
    ### BEGIN SOLUTION
    xp = logits._backend.xp
    z = logits.data
    if temperature == 0:
        return Tensor._make((xp.arange(z.shape[-1]) == z.argmax(axis=-1)[:, None]).astype(z.dtype), logits._backend)
    z = z / temperature
    if top_k is not None:
        kth = xp.sort(z, axis=-1)[:, -top_k][:, None]
        z = xp.where(z < kth, -xp.inf, z)
    e = xp.exp(z - z.max(axis=-1, keepdims=True))
    return Tensor._make(e / e.sum(axis=-1, keepdims=True), logits._backend)
    ### END SOLUTION


def sample(probs: Tensor) -> Tensor:
    """One token id per row of ``probs`` (B, V), id ``i`` with probability ``probs[b, i]``: a uniform
    u per row from the device's generator, then the first id whose cumulative probability exceeds
    ``u`` times the row's sum. Returns an int64 tensor (B,)."""
    xp = probs._backend.xp
    cumulative = xp.cumsum(probs.data, axis=-1)
    u = probs._backend.random_uniform((probs.shape[0], 1)) * cumulative[:, -1:]
    ids = xp.minimum((cumulative <= u).sum(axis=-1), probs.shape[-1] - 1)  # rounding can put u at the very end
    return Tensor._make(ids.astype(np.int64), probs._backend)


# %% check=2
z = tt.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 3.0]])
assert np.allclose(next_token_probs(z).numpy()[0], [0.665241, 0.244728, 0.090031])
assert np.allclose(next_token_probs(z, top_k=2).numpy()[0], [0.731059, 0.268941, 0])
assert np.allclose(next_token_probs(z, temperature=0.5).numpy()[0], np.exp([4, 2, 0]) / np.exp([4, 2, 0]).sum())
assert np.array_equal(next_token_probs(z, temperature=0).numpy(), [[1, 0, 0], [0, 1, 0]]), "greedy: first maximum"
assert np.allclose(next_token_probs(z, top_k=1).numpy()[1], [0, 0.5, 0.5]), "ties with the k-th largest are kept"
print("next_token_probs OK")

# %% [markdown]
# ## 5. The KV cache
#
# Generating token $t+1$ runs the model on the whole context $0..t$; the next
# step runs it on $0..t+1$ — recomputing, for positions $0..t$, exactly the same
# keys and values as before (a position's key depends only on the tokens up to
# it: the mask sees to that). Only the **new** position's query, key and value
# are new. So keep every layer's keys and values, a **KV cache**, and run the
# model on the new token alone:
#
# 1. $q, k, v$ of the $T$ new positions from `c_attn`, split into heads
#    $(B, H, T, D)$ as in Module 14 (`reshape(B, T, H, D).transpose(0, 2, 1, 3)`:
#    tinytrain's `transpose` takes the whole permutation, not PyTorch's pair `(1, 2)`);
# 2. append $k$ and $v$ to the cached ones along the position axis (axis 2):
#    $(B, H, S+T, D)$, and store them back in `cache.k`, `cache.v`;
# 3. attend: the $T$ queries against all $S+T$ keys, `is_causal=True` —
#    Module 14's mask aligns the queries to the *last* $T$ of the $S+T$
#    positions, so query $i$ (position $S+i$) sees keys $0..S+i$: one new token
#    sees everything, and several new tokens at once still do not see each
#    other's future;
# 4. merge the heads and apply `c_proj`.
#
# The cached path runs in evaluation mode only (no dropout). The work per token
# drops from a forward over $T$ positions to one over a single position (with
# attention over $T$ keys): the matrix products shrink $T$-fold. The price is
# memory: $2 \cdot L \cdot B \cdot T \cdot C$ cached numbers. Off-by-one
# mistakes are the classic bug: the new token's position is `cache.length`
# **before** it is appended (section 2), and the new keys are appended before
# attending, so a token sees itself. The test: the cached logits must equal the
# uncached ones.
#
# `GPT.generate` (given) puts it together: evaluation mode, `no_grad`, one token at
# a time with the cache; when the context reaches `block_size` it starts a new
# cache from the last `block_size` tokens, as the uncached model would crop them.

# %% check=3
tt.manual_seed(0)
config = GPTConfig(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16)
model = GPT(config).eval()
idx = np.random.default_rng(0).integers(0, 13, (2, 9))
full = model(idx).numpy()
cache = KVCache(2)
steps = [model(idx[:, :4], cache=cache)] + [model(idx[:, t:t + 1], cache=cache) for t in range(4, 7)]
steps.append(model(idx[:, 7:9], cache=cache))
assert cache.length == 9 and cache.layers[1].k.shape == (2, 2, 9, 8), cache
assert np.allclose(np.concatenate([s.numpy() for s in steps], axis=1), full, atol=1e-5), \
    "cached logits must equal the uncached ones: positions (start=cache.length) and causal attention over the cache"
tt.manual_seed(1)
a = model.generate(idx[:, :3], 15, top_k=5)
tt.manual_seed(1)
b = model.generate(idx[:, :3], 15, top_k=5, use_cache=False)
assert a.shape == (2, 18) and np.array_equal(a.numpy(), b.numpy()), "generation with and without the cache"
print("KV cache OK:", a.numpy()[0].tolist())

# %% [markdown]
# ## 6. Systems
#
# ### The KV cache's speed-up
#
# Time one new token at a context of 256 tokens: without the cache, a forward
# over all 256 positions; with it, a forward over one position that attends 256
# cached keys. The target: at least 3x at 256 tokens.

# %%
def time_per_token(model: GPT, context: int, repeats: int = 5) -> tuple[float, float]:
    """(seconds without the cache, seconds with it) for the token after ``context`` tokens."""
    idx = tt.tensor(np.random.default_rng(0).integers(0, model.config.vocab_size, (1, context + 1)))
    uncached = cached = math.inf
    with tt.no_grad():
        cache = KVCache(model.config.n_layer)
        model(idx[:, :context], cache=cache)
        k_v = [(layer.k, layer.v) for layer in cache.layers]
        for _ in range(repeats):
            start = time.perf_counter()
            model(idx[:, 1:])
            uncached = min(uncached, time.perf_counter() - start)
            for layer, (k, v) in zip(cache.layers, k_v):
                layer.k, layer.v = k, v  # back to `context` positions
            start = time.perf_counter()
            model(idx[:, context:], cache=cache)
            cached = min(cached, time.perf_counter() - start)
    return uncached, cached


tt.manual_seed(0)
lm = GPT(GPTConfig(vocab_size=65, block_size=512, n_layer=4, n_head=4, n_embd=128)).eval()
for context in (32, 64, 128, 256, 511):
    uncached, cached = time_per_token(lm, context)
    print(f"context {context:3d}: {uncached * 1e3:6.2f} ms uncached, {cached * 1e3:5.2f} ms cached: "
          f"{uncached / cached:5.1f}x")

# %% [markdown]
# The uncached time grows with the context (and faster than linearly at long
# contexts: attention is $T^2$); the cached time barely moves, since it does one
# position's matrix products and one row of attention. On the machine this was
# written on, the cache was about 20x faster at 256 tokens (1.5 ms against 32 ms)
# and 50x at 511 (a busy machine gives smaller ratios: they are best-of-5 times).
# At short contexts the gain is small: the floor of the cached step is Python, a
# few hundred small operations per token, whatever the context.
#
# ### Gradient checkpointing per block
#
# Training keeps every block's activations for the backward pass: the
# attention weights $(B, H, T, T)$, the MLP's $(B, T, 4C)$, and a dozen more
# arrays per block. `GPTConfig(checkpointing=True)` wraps each block in Module
# 13's `checkpoint`: only each block's input is kept, and the block runs again
# during backward. Peak memory of one training step, measured with
# `tracemalloc`, with the same weights:

# %%
def peak_and_seconds(checkpointing: bool) -> tuple[int, float, float]:
    """(peak bytes, best seconds, loss) of one training step; timed apart from tracemalloc, which slows every allocation."""
    config = GPTConfig(vocab_size=65, block_size=128, n_layer=6, n_head=4, n_embd=128, checkpointing=checkpointing)
    tt.manual_seed(0)
    model = GPT(config)
    idx = tt.tensor(np.random.default_rng(0).integers(0, 65, (8, 129)))

    def step() -> float:
        model.zero_grad()
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        loss.backward()
        return loss.item()

    loss = step()  # a first step warms up: caches, first allocations
    seconds = math.inf
    for _ in range(2):
        start = time.perf_counter()
        step()
        seconds = min(seconds, time.perf_counter() - start)
    tracemalloc.start()
    step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, seconds, loss


plain, plain_s, plain_loss = peak_and_seconds(False)
ckpt, ckpt_s, ckpt_loss = peak_and_seconds(True)
assert plain_loss == ckpt_loss
print(f"peak memory of a training step: {plain / 2**20:.1f} MiB plain, {ckpt / 2**20:.1f} MiB checkpointed "
      f"({1 - ckpt / plain:.0%} less); time {plain_s:.2f} s vs {ckpt_s:.2f} s ({ckpt_s / plain_s:.2f}x)")

# %% [markdown]
# Here the peak fell by about two thirds (113 MiB to 37 MiB) and the step took
# longer: each block runs its forward twice. In theory the extra cost is one
# forward of three passes, a third more; on this CPU it measured about 1.45x,
# since the recompute also allocates again what the plain step kept. The peak
# that remains is the weights' gradients, the logits
# $(B, T, V)$ and one block's activations during its recompute.
#
# ### FLOPs per token, measured
#
# The formula predicts the training cost per token; the measured time gives the
# FLOP rate NumPy reaches:

# %%
config = GPTConfig(vocab_size=65, block_size=128, n_layer=6, n_head=4, n_embd=128)
tokens = 8 * 128
print(f"{flops_per_token(config) / 1e6:.1f} MFLOPs per token, {flops_per_token(config) * tokens / 1e9:.2f} GFLOPs "
      f"per step of {tokens} tokens: {flops_per_token(config) * tokens / plain_s / 1e9:.1f} GFLOP/s")

# %% [markdown]
# ## How PyTorch does it
#
# * nanoGPT's `model.py` is this module in PyTorch, name for name: `GPTConfig`,
#   `Block` (`ln_1`, `attn`, `ln_2`, `mlp`), `GPT` with `transformer.wte`,
#   `transformer.wpe`, `transformer.h`, `transformer.ln_f` and the tied
#   `lm_head`, `_init_weights` with the `c_proj` rule, `generate` with
#   temperature and top-k (`torch.topk`, `torch.multinomial`). nanoGPT has no KV
#   cache; Hugging Face's `GPT2LMHeadModel` has one (`past_key_values`,
#   `use_cache=True`), and so does every serving system: vLLM stores it in pages
#   (*PagedAttention*, Kwon et al., 2023) so that many requests share GPU memory.
# * `torch.nn.TransformerEncoderLayer(d_model, nhead, norm_first=True)` is a
#   pre-LN block (with a causal mask, a GPT block); `norm_first=False`, the
#   default, is post-LN.
# * `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` per block
#   is what Hugging Face's `gradient_checkpointing_enable()` does.
# * `torch.nn.functional.scaled_dot_product_attention` runs FlashAttention on a
#   GPU; with a cache, the decode step's single query makes attention a
#   memory-bound read of the whole cache, which is why long-context serving
#   shrinks the cache (multi-query and grouped-query attention share one key
#   and value head among several query heads).
#
# ## Summary
#
# * Pre-LN block: $x \leftarrow x + \operatorname{attn}(\operatorname{LN}_1(x))$, then
#   $x \leftarrow x + \operatorname{mlp}(\operatorname{LN}_2(x))$ on that new $x$; `ln_f` before the head.
# * GPT = token + position embeddings, $L$ blocks, `ln_f`, `lm_head` tied to `wte`.
# * Init: $\mathcal N(0, 0.02^2)$; residual projections $0.02/\sqrt{2L}$.
# * $12C^2$ parameters per block; training costs $6N + 12LCT$ FLOPs per token.
# * Sampling: softmax of logits$/\tau$ over the top $k$; $\tau = 0$ is argmax.
# * KV cache: append the new keys and values, attend with the bottom-right causal
#   mask; the first new position is `cache.length`. Same logits, a fraction of the work.
# * Checkpointing each block trades one extra forward for most of the activation memory.
