"""Weights in the safetensors format: the ecosystem's file for tensors, safe by construction.

A ``.safetensors`` file is an 8-byte little-endian header length, a JSON header
that maps each name to its dtype, shape and byte range, and the raw bytes of
every tensor. Reading it runs no code (unlike a pickle) and a reader can
memory-map it. ``save_safetensors(model, path)`` writes a model's
``state_dict()`` under the same names (``"1.weight"``, ``"h.0.attn.c_attn.bias"``),
so a PyTorch model built with the same layer names loads the file with
``safetensors.torch.load_file`` and ``load_state_dict``, and the reverse.

Needs the ``safetensors`` package (``pip install 'tinytrain[safetensors]'``); the
NumPy flavour does the encoding, so no deep-learning framework is involved.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.backend import get_backend
from tinytrain.serialization import atomic_write
from tinytrain.tensor import Tensor

_INSTALL = "pip install 'tinytrain[safetensors]'"


def _safetensors_numpy() -> Any:
    try:
        import safetensors.numpy
    except ImportError:
        raise ImportError(f"safetensors files need the safetensors package: {_INSTALL}") from None
    return safetensors.numpy


def _host_arrays(model_or_state: Any) -> dict[str, np.ndarray]:
    """Name -> C-ordered NumPy array of a module's ``state_dict()`` or of a dict of tensors or arrays."""
    state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    if not isinstance(state, dict):
        raise TypeError(f"save_safetensors takes a Module or a dict of name -> tensor, got {type(model_or_state).__name__}")
    arrays = {}
    for name, value in state.items():
        if not isinstance(name, str):
            raise TypeError(f"save_safetensors: every name must be a string, got {name!r} ({type(name).__name__})")
        if isinstance(value, Tensor):
            array = value._backend.to_host(value.data)
        elif isinstance(value, np.ndarray):
            array = value
        else:
            raise TypeError(f"save_safetensors: {name!r} is a {type(value).__name__}, not a tensor or NumPy array")
        # Linear keeps its weight column-major; the format stores row-major (C-order) bytes. np.require, not
        # np.ascontiguousarray, which turns a 0-d array (BatchNorm's num_batches_tracked) into shape (1,)
        arrays[name] = np.require(array, requirements="C")
    return arrays


def save_safetensors(model_or_state: Any, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Write ``model_or_state`` (a Module, whose ``state_dict()`` is taken, or a dict of name -> tensor or
    NumPy array) to the safetensors file ``path``; returns the path.

    The values are stored bit for bit in their own dtype (float32, float16,
    int64, ...), row-major, from any device. ``metadata`` (string -> string) goes
    into the header's ``__metadata__``. The file is written atomically: a failed
    save leaves ``path`` as it was. Raises ``TypeError`` naming a key or value
    that is not a string or not a tensor.
    """
    arrays = _host_arrays(model_or_state)
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError(f"save_safetensors: metadata must map strings to strings, got {metadata!r}")
    encoded = _safetensors_numpy().save(arrays, metadata=metadata)
    path = Path(path)
    atomic_write(path, lambda file: file.write(encoded))
    return path


def load_safetensors(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
    """The tensors of the safetensors file ``path``, by name, on ``device`` (default ``"cpu"``), each in the
    dtype and with the bits it was stored with: ``model.load_state_dict(load_safetensors(path))``.

    Raises ``FileNotFoundError`` naming a missing file and ``ValueError`` naming
    a file that is not a valid safetensors file (a truncated copy, another format).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_safetensors: no such file {path}")
    safetensors_numpy = _safetensors_numpy()
    try:
        arrays = safetensors_numpy.load(path.read_bytes())
    except Exception as error:  # the Rust reader raises its own SafetensorError for every malformed header
        raise ValueError(f"load_safetensors: {path} is not a valid safetensors file ({error})") from error
    backend = get_backend(device)
    return {name: Tensor._make(backend.from_host(array), backend) for name, array in arrays.items()}
