"""Neural-network building blocks: modules, layers, activations, losses.

Hand-written: it gathers the names that the generated files of Modules 03-06,
11, 13-15 and 20 define, so users write ``tt.nn.Linear`` and ``tt.nn.functional.relu``.
"""
import importlib

from tinytrain.nn import functional
from tinytrain.nn.module import Module, Parameter
from tinytrain.nn.layers import GELU, Flatten, Linear, LogSoftmax, ModuleList, ReLU, Sequential, Sigmoid, Softmax, Tanh
from tinytrain.nn.dropout import Dropout
from tinytrain.nn.normalization import BatchNorm1d, LayerNorm
from tinytrain.nn.losses import BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from tinytrain.nn.conv import AvgPool2d, BatchNorm2d, Conv2d, MaxPool2d
from tinytrain.nn.checkpointing import Checkpoint, checkpoint
from tinytrain.nn.embedding import Embedding, LearnedPositionalEncoding, SinusoidalPositionalEncoding
from tinytrain.nn.attention import CausalSelfAttention
from tinytrain.nn.transformer import (GPT, Block, CachedSelfAttention, GPTConfig, KVCache, LayerCache, MLP, flops_per_token,
                                       gpt_num_parameters, next_token_probs, sample)


def __getattr__(name: str) -> object:
    """``lora`` and ``LoRALinear``, loaded on first use: LoRA wraps Module 19's quantized layers, and
    ``tinytrain.quantization`` itself imports from this package."""
    if name in ("lora", "LoRALinear"):
        lora = importlib.import_module("tinytrain.nn.lora")
        return lora if name == "lora" else lora.LoRALinear
    raise AttributeError(f"module 'tinytrain.nn' has no attribute {name!r}")
