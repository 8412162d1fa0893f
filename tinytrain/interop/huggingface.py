"""Save a ``tt.nn.GPT`` as a Hugging Face GPT-2 checkpoint that ``transformers`` loads offline.

``tt.huggingface.export_gpt2(model, directory)`` writes the two files of a
``save_pretrained`` folder: ``config.json`` (``model_type`` ``gpt2``) and
``model.safetensors``. Then, with no network::

    from transformers import GPT2LMHeadModel
    hf = GPT2LMHeadModel.from_pretrained(directory)   # the same logits as model(idx)

The two models are one architecture: token and learned position embeddings
added, pre-LayerNorm blocks (eps 1e-5) of causal self-attention scaled by
``1/sqrt(head_dim)`` and an MLP of width ``4 C`` with GELU's tanh approximation
(``transformers`` calls it ``gelu_new``), a final LayerNorm, and the output
layer tied to the token embedding. The names differ by a ``transformer.``
prefix, and so does one layout: GPT-2's ``c_attn``, ``c_proj`` and ``c_fc`` are
``Conv1D`` layers whose weight is ``(in, out)`` -- the transpose of a
``Linear``'s ``(out, in)`` -- so those weights are written transposed. A model
built with ``bias=False`` gets zero biases, which compute the same. What GPT-2
cannot represent (another LayerNorm eps, an activation other than
``GELU``'s tanh form, another class than ``tt.nn.GPT``) is refused with a
``ValueError`` that names it.

Needs the ``safetensors`` package (``pip install 'tinytrain[safetensors]'``);
loading the folder needs ``transformers`` and PyTorch (``[huggingface]``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.interop.safetensors import save_safetensors
from tinytrain.nn.layers import GELU
from tinytrain.nn.transformer import GPT
from tinytrain.serialization import atomic_write

LAYER_NORM_EPS = 1e-5  # GPT-2's layer_norm_epsilon
CONV1D_LAYERS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # (in, out) weights in GPT-2


def _refusals(model: GPT) -> list[str]:
    """What in ``model`` a GPT-2 checkpoint cannot hold."""
    problems = []
    norms = {"ln_f": model.ln_f} | {f"h.{i}.{name}": getattr(block, name)
                                     for i, block in enumerate(model.h) for name in ("ln_1", "ln_2")}
    problems += [f"{name}.eps={norm.eps} (GPT-2 has {LAYER_NORM_EPS})" for name, norm in norms.items()
                 if norm.eps != LAYER_NORM_EPS]
    problems += [f"h.{i}.mlp.gelu is a {type(block.mlp.gelu).__name__} (GPT-2 has GELU's tanh approximation)"
                 for i, block in enumerate(model.h) if type(block.mlp.gelu) is not GELU]
    if model.lm_head.weight is not model.wte.weight:
        problems.append("lm_head.weight is not wte.weight (GPT-2 ties them)")
    return problems


def gpt2_state(model: GPT) -> dict[str, np.ndarray]:
    """``model``'s weights under GPT-2's names (``transformer.h.0.attn.c_attn.weight``), Conv1D weights
    transposed to ``(in, out)``, missing biases as zeros. The tied ``lm_head.weight`` is left out, as
    ``transformers`` saves it."""
    state = {}
    for name, value in model.state_dict().items():
        array = value.numpy()
        if any(name.endswith(f"{layer}.weight") for layer in CONV1D_LAYERS):
            array = array.T
        state[f"transformer.{name}"] = array
    if not model.config.bias:
        for i, block in enumerate(model.h):
            for layer in CONV1D_LAYERS:
                width = model.config.n_embd * {"attn.c_attn": 3, "mlp.c_fc": 4}.get(layer, 1)
                state[f"transformer.h.{i}.{layer}.bias"] = np.zeros(width, dtype=block.ln_1.weight.dtype)
    return state


def gpt2_config(model: GPT) -> dict[str, Any]:
    """The ``config.json`` of a ``transformers`` GPT-2 with ``model``'s sizes."""
    config = model.config
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,  # 4 * n_embd
        "activation_function": "gelu_new",  # GELU's tanh approximation
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": None,  # GPT-2's are 50256, an id a smaller vocabulary does not have
        "eos_token_id": None,
        "torch_dtype": str(np.dtype(model.wte.weight.dtype)),
    }


def export_gpt2(model: Any, directory: str | os.PathLike) -> Path:
    """Write ``model`` (a ``tt.nn.GPT``) into ``directory`` as ``config.json`` and ``model.safetensors``
    in GPT-2's names and layout; returns the directory (created if needed).

    ``transformers.GPT2LMHeadModel.from_pretrained(directory)`` loads it offline
    and computes the same logits. Raises ``TypeError`` for a model that is not a
    GPT and ``ValueError`` listing what GPT-2 cannot represent.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"export_gpt2 takes a tt.nn.GPT, got {type(model).__name__}")
    problems = _refusals(model)
    if problems:
        raise ValueError("export_gpt2: a GPT-2 checkpoint cannot represent " + "; ".join(problems))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # transformers refuses a safetensors file whose metadata does not name the framework it was saved for
    save_safetensors(gpt2_state(model), directory / "model.safetensors", metadata={"format": "pt"})
    text = json.dumps(gpt2_config(model), indent=2) + "\n"
    atomic_write(directory / "config.json", lambda file: file.write(text.encode()))
    return directory
