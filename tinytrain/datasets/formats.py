"""Parsers for the datasets' file formats: IDX (MNIST, Fashion-MNIST) and pickled CIFAR batches.

Both parse bytes that nobody vouched for (a ``root=`` folder), so they validate
every size and, for pickles, build nothing but arrays and plain containers.
"""
import gzip
import importlib
import io
import os
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

# IDX type codes (third byte of the magic number) and their big-endian dtypes.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data: bytes) -> np.ndarray:
    """An array from the bytes of an IDX file (the format of MNIST and Fashion-MNIST).

    Layout: a 4-byte magic number ``0x00 0x00 <type> <ndim>``, then ``ndim``
    big-endian uint32 sizes, then the values, big-endian, row-major. Raises
    ``ValueError`` for a bad magic number or a size that does not match the
    header.
    """
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] not in _IDX_DTYPES:
        raise ValueError(f"not an IDX file: magic number {data[:4].hex() or '(empty)'}")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"truncated IDX file: {len(data)} bytes, the header of a {ndim}-d array needs {header}")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(
            f"IDX file has {len(data)} bytes but its header announces shape {shape} of {dtype.name} ({expected} bytes)"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))  # native byte order, and a writable copy


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """:func:`parse_idx` of a file, gzip-compressed or not (told by its first bytes).

    Raises ``ValueError`` naming the file for a file that is not IDX, or not complete.
    """
    data = Path(path).read_bytes()
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return parse_idx(data)
    except (ValueError, EOFError, OSError, zlib.error) as error:  # OSError: gzip.BadGzipFile
        raise ValueError(f"{path}: {error}") from error


def _numpy_multiarray() -> Any:
    try:
        return importlib.import_module("numpy._core.multiarray")  # NumPy 2
    except ImportError:
        return importlib.import_module("numpy.core.multiarray")


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that builds dicts, lists, bytes, numbers and NumPy arrays — nothing else.

    ``pickle`` rebuilds objects by calling whatever functions the file names, so
    a plain ``pickle.load`` of a hostile file runs its code. Here the only
    callables a file may name are the ones a pickled ndarray needs, plus
    ``_codecs.encode`` (how Python 3 writes bytes in protocol 2).
    """

    _ALLOWED = {
        ("numpy", "ndarray"): lambda: np.ndarray,
        ("numpy", "dtype"): lambda: np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): lambda: _numpy_multiarray()._reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): lambda: _numpy_multiarray()._reconstruct,
        ("_codecs", "encode"): lambda: __import__("_codecs").encode,
    }

    def find_class(self, module: str, name: str) -> Any:
        allowed = self._ALLOWED.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: a CIFAR batch holds only dicts, lists, bytes and NumPy arrays"
            )
        return allowed()


def parse_cifar_batch(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels, labels)`` from the bytes of one pickled CIFAR-10 batch file.

    A batch is a pickled dict (written by Python 2, so read with
    ``encoding="bytes"``) with ``b"data"``, a uint8 array of shape (N, 3072) —
    per image 1024 red, 1024 green, then 1024 blue values, each a 32x32 image
    row by row — and ``b"labels"``, N ints in 0..9. Returns uint8 pixels of
    shape (N, 3, 32, 32) and int64 labels.

    Why a restricted unpickler rather than ``pickle.load``: a ``root=`` folder
    holds files nobody verified with a cryptographic hash (only MD5s are
    published for the extracted batches, and MD5 collisions are cheap), and
    ``pickle.load`` of a crafted file executes arbitrary code. The restricted
    unpickler lets a file build only arrays and plain containers, so a hostile
    file can at worst fail to parse. Raises ``ValueError`` (or
    ``pickle.UnpicklingError``) for anything that is not a CIFAR batch.
    """
    batch = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    if not isinstance(batch, dict):
        raise ValueError(f"not a CIFAR batch: the pickle holds a {type(batch).__name__}, not a dict")
    fields = {key.decode("latin1") if isinstance(key, bytes) else key: value for key, value in batch.items()}
    if "data" not in fields or "labels" not in fields:
        raise ValueError(f"not a CIFAR batch: keys {sorted(fields)}, expected 'data' and 'labels'")
    pixels, labels = fields["data"], np.asarray(fields["labels"])
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != 2 or pixels.shape[1] != 3072:
        shape = getattr(pixels, "shape", None)
        raise ValueError(
            f"not a CIFAR batch: 'data' should be uint8 of shape (N, 3072), got {type(pixels).__name__} {shape}"
        )
    if labels.ndim != 1 or len(labels) != len(pixels) or labels.dtype.kind not in "iu":
        raise ValueError(f"not a CIFAR batch: {len(pixels)} images but labels of shape {labels.shape} ({labels.dtype})")
    outside = np.flatnonzero((labels < 0) | (labels > 9))
    if len(outside):
        raise ValueError(f"not a CIFAR-10 batch: label {labels[outside[0]]} at index {outside[0]} "
                         f"({len(outside)} label(s) outside 0..9)")
    return pixels.reshape(-1, 3, 32, 32), labels.astype(np.int64)
