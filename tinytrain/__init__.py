"""tinytrain: a small, fast, readable deep-learning training library.

Students build it module by module in notebooks (``modules/``); the package
ships the reference solutions, so it also works as a library on its own.
"""
from tinytrain import autograd, ops
from tinytrain.autograd import Function, GradcheckError, gradcheck, is_grad_enabled, no_grad
from tinytrain.backend import Backend, get_backend, manual_seed, register_backend
from tinytrain.tensor import (
    Tensor,
    arange,
    bool_,
    concatenate,
    float16,
    float32,
    float64,
    int32,
    int64,
    ones,
    rand,
    randn,
    stack,
    tensor,
    where,
    zeros,
)
from tinytrain import nn, optim, data, datasets, callbacks, checkpoint, schedules, training
from tinytrain.nn import BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from tinytrain.optim import SGD, Adam, AdamW
from tinytrain.schedules import CosineSchedule, CosineWarmRestarts, ExponentialSchedule, InverseSqrtSchedule, StepSchedule
from tinytrain.training import Trainer, clip_grad_norm, memory_report, plot_history

bool = bool_  # PyTorch spells it tt.bool

__version__ = "0.1.0"
