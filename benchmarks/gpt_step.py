"""GPT training iteration and generated token: tinytrain against the same model in PyTorch.

The model is the GPT recipe's (``milestones/``): 4 layers, 4 heads, 128-dim
embeddings, vocabulary 65, no dropout, GPT-2's layout with the output layer tied
to the token embedding, GELU's tanh approximation, LayerNorm eps 1e-5.

* Training iteration: batch 12 of 64 token ids; zero the gradients, forward,
  cross-entropy over all 768 positions, backward, clip the global gradient norm
  to 1.0, AdamW (lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on the matrices
  only). PyTorch's side is nanoGPT's model: ``F.scaled_dot_product_attention``
  (its fused causal kernel), ``torch.nn.utils.clip_grad_norm_`` and
  ``torch.optim.AdamW`` with the same two parameter groups.
* Evaluation batch: 64 windows of 64 token ids, as the milestone's periodic
  evaluations take them (``Trainer.evaluate``: eval mode, no gradients, the
  cross-entropy over all 4,096 positions). The forward alone, at 5.3 times the
  training batch: the milestone's 2,000 steps run 160 of these.
* One generated token at a 256-token context (``block_size`` 256, batch 1), as
  ``GPT.generate`` takes it: the logits of the last position, ``next_token_probs``
  and ``sample``. With the KV cache the model runs on the one new token against
  a cache of the 255 positions before it (refilled from a saved copy each
  time); without it, on all 256 tokens. PyTorch's side (nanoGPT has no cache)
  runs all 256 tokens.

Both sides start from the same weights (GPT-2's initialisation, drawn here with
NumPy) and ids and compute in float32; their first three losses, the
evaluation batch's losses and the generated token's logits are checked to agree
before the timings count. One BLAS thread; each side runs in processes of its own, timed in turns (see
``_timing.lockstep_medians``).

    python benchmarks/gpt_step.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from _timing import lockstep_medians, spread_note, torch_or_none  # noqa: E402  (pins BLAS threads first)

import numpy as np  # noqa: E402

VOCAB, LAYERS, HEADS, EMBED = 65, 4, 4, 128
BATCH, CONTEXT = 12, 64  # training
EVAL_BATCH = 64  # windows per evaluation batch, the milestone's
GENERATION_CONTEXT = 256  # the generated token's context (and block_size)
LR, BETAS, WEIGHT_DECAY, CLIP = 1e-3, (0.9, 0.99), 0.1, 1.0
TARGETS = {"train_vs_torch": 1.0, "cache_speedup": 3.0}  # at most; at least


def initial_weights(block_size: int) -> dict[str, np.ndarray]:
    """GPT-2's initialisation under tinytrain's (and nanoGPT's) parameter names, PyTorch's layouts:
    weights and embeddings N(0, 0.02²), the two ``c_proj`` weights of each block N(0, (0.02 /
    sqrt(2 * layers))²), biases 0, LayerNorm gains 1. ``lm_head.weight`` is ``wte.weight``."""
    rng = np.random.default_rng(1)

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    small = 0.02 / math.sqrt(2 * LAYERS)
    weights = {"wte.weight": normal(VOCAB, EMBED), "wpe.weight": normal(block_size, EMBED)}
    for i in range(LAYERS):
        for name, shape, std in (("attn.c_attn", (3 * EMBED, EMBED), 0.02), ("attn.c_proj", (EMBED, EMBED), small),
                                 ("mlp.c_fc", (4 * EMBED, EMBED), 0.02), ("mlp.c_proj", (EMBED, 4 * EMBED), small)):
            weights[f"h.{i}.{name}.weight"] = normal(*shape, std=std)
            weights[f"h.{i}.{name}.bias"] = np.zeros(shape[0], np.float32)
        for norm in ("ln_1", "ln_2"):
            weights[f"h.{i}.{norm}.weight"] = np.ones(EMBED, np.float32)
            weights[f"h.{i}.{norm}.bias"] = np.zeros(EMBED, np.float32)
    weights["ln_f.weight"], weights["ln_f.bias"] = np.ones(EMBED, np.float32), np.zeros(EMBED, np.float32)
    return weights


def token_ids(batch: int, length: int) -> np.ndarray:
    """int64 ids, ``length + 1`` per row: inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    return np.random.default_rng(0).integers(0, VOCAB, (batch, length + 1))


# -- tinytrain ------------------------------------------------------------------------------
def tinytrain_model(block_size: int) -> Any:
    import tinytrain as tt

    model = tt.nn.GPT(tt.nn.GPTConfig(vocab_size=VOCAB, block_size=block_size, n_layer=LAYERS, n_head=HEADS,
                                      n_embd=EMBED))
    weights = initial_weights(block_size)
    with tt.no_grad():
        for name, param in model.named_parameters():
            param.data[...] = weights[name]
    return model


def tinytrain_train() -> Callable[[], float]:
    import tinytrain as tt
    from tinytrain.training import clip_grad_norm

    model = tinytrain_model(CONTEXT)
    optimizer = tt.optim.AdamW(tt.optim.weight_decay_groups(model.parameters(), WEIGHT_DECAY), lr=LR, betas=BETAS)
    ids = token_ids(BATCH, CONTEXT)
    inputs, targets = tt.tensor(ids[:, :-1]), tt.tensor(ids[:, 1:])

    def step() -> float:
        optimizer.zero_grad()
        _, loss = model(inputs, targets)
        loss.backward()
        clip_grad_norm(model.parameters(), CLIP)
        optimizer.step()
        return loss.item()

    return step


def tinytrain_eval() -> Callable[[], float]:
    """One evaluation batch: the mean cross-entropy of ``EVAL_BATCH`` windows in eval mode, without gradients."""
    import tinytrain as tt

    model = tinytrain_model(CONTEXT)
    model.eval()
    ids = token_ids(EVAL_BATCH, CONTEXT)
    inputs, targets = tt.tensor(ids[:, :-1]), tt.tensor(ids[:, 1:])

    def step() -> float:
        with tt.no_grad():
            _, loss = model(inputs, targets)
        return loss.item()

    return step


def tinytrain_token(use_cache: bool) -> Callable[[], list[float]]:
    import tinytrain as tt
    from tinytrain.nn.transformer import KVCache, next_token_probs, sample

    model = tinytrain_model(GENERATION_CONTEXT)
    model.eval()
    context = tt.tensor(token_ids(1, GENERATION_CONTEXT - 1))
    cache = KVCache(LAYERS)
    with tt.no_grad():
        model(context[:, :-1], cache=cache)
    filled = [(layer.k, layer.v) for layer in cache.layers]  # concatenate makes new arrays: these stay as they are

    def step() -> list[float]:
        with tt.no_grad():
            if use_cache:
                for layer, (k, v) in zip(cache.layers, filled):
                    layer.k, layer.v = k, v
                logits = model(context[:, -1:], cache=cache)
            else:
                logits = model(context)
            sample(next_token_probs(logits[:, -1], 1.0))
        return logits.data[0, -1].tolist()

    return step


# -- PyTorch --------------------------------------------------------------------------------
def torch_model(block_size: int) -> Any:
    """nanoGPT's GPT, with the weights of ``initial_weights``."""
    torch = torch_or_none()
    nn, F = torch.nn, torch.nn.functional

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(EMBED, 3 * EMBED), nn.Linear(EMBED, EMBED)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (part.view(b, t, HEADS, c // HEADS).transpose(1, 2) for part in self.c_attn(x).split(c, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc, self.gelu, self.c_proj = nn.Linear(EMBED, 4 * EMBED), nn.GELU("tanh"), nn.Linear(4 * EMBED, EMBED)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(EMBED), SelfAttention(), nn.LayerNorm(EMBED), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, EMBED), nn.Embedding(block_size, EMBED)
            self.h = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f, self.lm_head = nn.LayerNorm(EMBED), nn.Linear(EMBED, VOCAB, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx, targets=None):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            if targets is None:
                return logits
            return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    model = GPT()
    weights = initial_weights(block_size)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.from_numpy(weights[name]))
    return model


def torch_train() -> Callable[[], float]:
    torch = torch_or_none()
    model = torch_model(CONTEXT)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS)
    ids = torch.from_numpy(token_ids(BATCH, CONTEXT))
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step() -> float:
        optimizer.zero_grad()
        _, loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        return loss.item()

    return step


def torch_eval() -> Callable[[], float]:
    torch = torch_or_none()
    model = torch_model(CONTEXT)
    model.eval()
    ids = torch.from_numpy(token_ids(EVAL_BATCH, CONTEXT))
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step() -> float:
        with torch.no_grad():
            _, loss = model(inputs, targets)
        return loss.item()

    return step


def torch_token() -> Callable[[], list[float]]:
    """nanoGPT's ``generate`` for one token: no cache, the whole context through the model."""
    torch = torch_or_none()
    model = torch_model(GENERATION_CONTEXT)
    model.eval()
    context = torch.from_numpy(token_ids(1, GENERATION_CONTEXT - 1))

    def step() -> list[float]:
        with torch.no_grad():
            logits = model(context)
            torch.multinomial(torch.softmax(logits[:, -1], dim=-1), 1)
        return logits[0, -1].tolist()

    return step


BUILDERS = {"tinytrain": tinytrain_train, "torch": torch_train}
EVAL_BUILDERS = {"tinytrain": tinytrain_eval, "torch": torch_eval}
TOKEN_BUILDERS = {"cached": lambda: tinytrain_token(True), "uncached": lambda: tinytrain_token(False),
                  "torch": torch_token}


def build(name: str) -> Callable[[], float]:
    """Entry point of a benchmark process: the training iteration of implementation ``name``."""
    return BUILDERS[name]()


def build_eval(name: str) -> Callable[[], float]:
    """Entry point of a benchmark process: the evaluation batch of implementation ``name``."""
    return EVAL_BUILDERS[name]()


def build_token(name: str) -> Callable[[], list[float]]:
    """Entry point of a benchmark process: one generated token, ``cached``, ``uncached`` or ``torch``."""
    return TOKEN_BUILDERS[name]()


def _check_agree(results: dict[str, dict[str, Any]], reference: str, what: str) -> None:
    for name, found in results.items():
        if not np.allclose(found["first"], results[reference]["first"], rtol=1e-4, atol=1e-5):
            raise AssertionError(f"GPT {what}: {name}'s results {found['first']} differ from {reference}'s "
                                 f"{results[reference]['first']}")


def _measure_sides(entry: str, what: str, quick: bool, with_torch: bool) -> dict[str, dict[str, Any]]:
    """tinytrain's and PyTorch's step from ``gpt_step:entry``, timed in turns; AssertionError when their
    results differ."""
    names = ["tinytrain"] + (["torch"] if with_torch else [])
    results = lockstep_medians({name: (f"gpt_step:{entry}", (name,)) for name in names},
                               repeats=10 if quick else 30, warmup=3, inner=1)
    _check_agree(results, "tinytrain", what)
    return results


def measure(quick: bool = False, with_torch: bool = True) -> dict[str, dict[str, Any]]:
    """Per implementation: median ``seconds`` per training iteration, ``first`` losses, ``spread``.

    Raises AssertionError when PyTorch's first three losses differ from tinytrain's.
    """
    return _measure_sides("build", "training iteration", quick, with_torch)


def measure_eval(quick: bool = False, with_torch: bool = True) -> dict[str, dict[str, Any]]:
    """Per implementation: median ``seconds`` per evaluation batch, ``first`` losses, ``spread``.

    Raises AssertionError when PyTorch's losses differ from tinytrain's.
    """
    return _measure_sides("build_eval", "evaluation batch", quick, with_torch)


def measure_token(quick: bool = False, with_torch: bool = True) -> dict[str, dict[str, Any]]:
    """Per way of generating (``cached``, ``uncached``, ``torch``): median ``seconds`` per token.

    Raises AssertionError when the next token's logits differ between them.
    """
    names = ["cached", "uncached"] + (["torch"] if with_torch else [])
    results = lockstep_medians({name: ("gpt_step:build_token", (name,)) for name in names},
                               repeats=10 if quick else 30, warmup=5, inner=3)
    _check_agree(results, "uncached", "generated token")
    for found in results.values():
        found["first"] = found["first"][:1]  # the logits were for the check; keep the report short
    return results


def _print_times(title: str, results: dict[str, dict[str, Any]], unit: str) -> None:
    """``title``, then each implementation's median ms per ``unit`` and its processes' medians, and their spread."""
    print(title)
    for name, found in results.items():
        print(f"  {name:10s} {found['seconds'] * 1e3:8.2f} ms/{unit}  (processes: "
              + ", ".join(f"{s * 1e3:.2f}" for s in found["process_seconds"]) + ")")
    print(f"  {spread_note(results)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    with_torch = torch_or_none() is not None
    train = measure(args.quick, with_torch)
    _print_times(f"GPT training iteration: {LAYERS} layers, {HEADS} heads, {EMBED}-dim, vocab {VOCAB}, batch {BATCH} x "
                 f"{CONTEXT} tokens, AdamW + clipping; one thread", train, "iteration")
    report: dict[str, Any] = {"train": train, "targets": TARGETS}
    if with_torch:
        report["train_vs_torch"] = train["tinytrain"]["seconds"] / train["torch"]["seconds"]
        print(f"  tinytrain / PyTorch: {report['train_vs_torch']:.2f}x (target <= {TARGETS['train_vs_torch']}x)")
    else:
        print("  PyTorch not installed: no PyTorch ratio (pip install torch to compare)")
    report["eval"] = evaluation = measure_eval(args.quick, with_torch)
    _print_times(f"GPT evaluation batch: {EVAL_BATCH} x {CONTEXT} tokens, eval mode, no gradients; one thread",
                 evaluation, "batch")
    if with_torch:
        report["eval_vs_torch"] = evaluation["tinytrain"]["seconds"] / evaluation["torch"]["seconds"]
        print(f"  tinytrain / PyTorch: {report['eval_vs_torch']:.2f}x (no target of its own: the milestone's, "
              "which counts its evaluations)")
    report["token"] = token = measure_token(args.quick, with_torch)
    _print_times(f"One generated token at a {GENERATION_CONTEXT}-token context, batch 1", token, "token")
    report["cache_speedup"] = token["uncached"]["seconds"] / token["cached"]["seconds"]
    print(f"  KV cache: {report['cache_speedup']:.1f}x faster per token (target >= {TARGETS['cache_speedup']}x)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
