"""tinytrain: a small, fast, readable deep-learning training library.

Students build it module by module in notebooks (``modules/``); the package
ships the reference solutions, so it also works as a library on its own.

The names below load on first use (PEP 562), so ``import tinytrain`` itself never
runs library code: a student's exported module that fails to import cannot take
the ``tinytrain`` command (``reset``, ``status``, ``doctor``) down with it, and the
error names the module to reset.
"""
import importlib
import re
import sys
import types
from pathlib import Path

from tinytrain.runtime.allocator import keep_freed_memory

__version__ = "0.1.0"

keep_freed_memory()  # before any array exists: steady training steps without page faults

# public name -> (submodule, attribute); a submodule's own name maps to (submodule, None)
_NAMES = {
    **{name: ("autograd", name) for name in ("Function", "GradcheckError", "gradcheck", "is_grad_enabled", "no_grad")},
    **{name: ("backend", name) for name in ("Backend", "get_backend", "manual_seed", "register_backend")},
    **{
        name: ("tensor", name)
        for name in (
            "Tensor", "arange", "bfloat16", "bool_", "concatenate", "float16", "float32", "float64", "int32", "int64",
            "ones", "rand", "randn", "stack", "tensor", "where", "zeros",
        )
    },
    "bool": ("tensor", "bool_"),  # PyTorch spells it tt.bool
    **{name: ("nn", name) for name in ("BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "MSELoss")},
    **{name: ("optim", name) for name in ("SGD", "Adam", "AdamW")},
    **{
        name: ("schedules", name)
        for name in ("CosineSchedule", "CosineWarmRestarts", "ExponentialSchedule", "InverseSqrtSchedule", "StepSchedule")
    },
    **{name: ("training", name) for name in ("Trainer", "clip_grad_norm", "memory_report", "plot_history")},
    **{name: ("amp", name) for name in ("GradScaler", "MixedPrecision")},
    "checkpoint": ("nn.checkpointing", "checkpoint"),  # gradient checkpointing; checkpoint files: tt.serialization
    **{name: ("interop.safetensors", name) for name in ("load_safetensors", "save_safetensors")},
    "onnx": ("interop.onnx", None),
    "huggingface": ("interop.huggingface", None),
}
_SUBMODULES = (
    "backend", "autograd", "ops", "nn", "optim", "data", "datasets", "callbacks", "serialization", "schedules", "training",
    "amp", "distributed", "text", "profiler", "precision", "quantization", "sharding", "prune",
)
_NAMES.update({name: (name, None) for name in _SUBMODULES if name not in _NAMES})

__all__ = sorted(set(_NAMES) - {"bool"})  # a star import must not shadow the builtin
# Every library module, for tools that load them all up front (the grader, doctor, export's import check).
__all_modules__ = tuple(f"{__name__}.{name}" for name in _SUBMODULES) + (f"{__name__}.tensor",)


def _load(name: str) -> object:
    submodule, attribute = _NAMES[name]
    try:
        module = importlib.import_module(f"{__name__}.{submodule}")
    except Exception as error:
        raise _explained(submodule, error) from error
    return module if attribute is None else getattr(module, attribute)


# The first line of a library file that holds a student's code: ``tinytrain export`` writes it, and
# the tooling's inventory reads it the same way.
_EXPORTED_HEADER = re.compile(r"^# Exported by `tinytrain export` from .+ \(module (\d\d_\w+)\)")


def _exported_modules() -> list[str]:
    """The teaching modules (``03_activations``) whose files in the package hold a student's exported
    code, read from each file's first line (the header ``tinytrain export`` writes)."""
    found = set()
    for path in Path(__file__).parent.rglob("*.py"):
        try:
            with path.open(encoding="utf-8", errors="replace") as file:
                match = _EXPORTED_HEADER.match(file.readline())
        except OSError:
            continue
        if match:
            found.add(match[1])
    return sorted(found)


def _explained(submodule: str, error: Exception) -> Exception:
    """``error``, with a pointer to ``tinytrain reset`` when student code is installed."""
    exported = _exported_modules()
    if not exported:
        return error
    names = ", ".join(exported)
    numbers = " / ".join(name[:2] for name in exported)
    return ImportError(
        f"tinytrain.{submodule} failed to import ({type(error).__name__}: {error}). The package holds code "
        f"exported from your notebook(s) for module(s) {names}; `tinytrain reset {numbers}` puts the "
        "reference back (then fix the notebook and export again)."
    )


def __getattr__(name: str) -> object:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _load(name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_NAMES))


class _Package(types.ModuleType):
    """Keeps ``tinytrain.tensor`` the factory function, as ``from tinytrain.tensor import tensor``
    in the eager package did: importing the submodule ``tinytrain.tensor`` would otherwise
    bind the module object under that name."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "tensor" and isinstance(value, types.ModuleType) and hasattr(value, "tensor"):
            value = value.tensor
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
