# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 10 — Checkpoints and callbacks: resuming exactly, and safely
#
# *One sitting, about 2 hours: the lesson, 7 functions to write, and the measurements.*
#
# A long run will be interrupted: a pre-empted cloud machine, a full disk, a
# kernel restart. Module 09's `Trainer` trains correctly; this module makes a run
# survive the interruption. The common shortcuts fail quietly:
#
# | the shortcut | what actually happens |
# |---|---|
# | `pickle.dump(model)` as a checkpoint | loading runs whatever code the file names, and the file breaks when the classes change |
# | save only the weights | resuming restarts Adam's moments, reshuffles the data and redraws dropout masks: the run is not the run you would have had |
# | `open(path, "wb")` and write | a crash mid-write leaves half a file where the last good checkpoint was |
#
# **You will**
# 1. turn a training state into plain data, write it atomically, and read it
#    back with an unpickler that refuses to run code;
# 2. save and restore every random generator, and prove that a resumed run is
#    bit-identical to an uninterrupted one;
# 3. write the decisions of two callbacks: which checkpoint files to keep, and
#    when to stop early;
# 4. measure what a checkpoint costs: its size, and the time an `fsync` adds.

# %%
import io
import math
import os
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.datasets import Digits
from tinytrain.schedules import CosineSchedule
from tinytrain.training import Trainer

folder = Path(tempfile.mkdtemp())  # scratch space for the files this lesson writes
rng = np.random.default_rng(0)
toy = TensorDataset(rng.standard_normal((100, 6)).astype(np.float32), rng.integers(0, 3, 100))


def toy_model():
    tt.manual_seed(0)  # the same initial weights every time
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))

# %% [markdown]
# ## 1. What a checkpoint must hold
#
# A checkpoint must let the run continue **as if nothing had happened**. List
# everything that decides what the next epoch computes:
#
# * the weights *and buffers* (BatchNorm's running statistics) — `model.state_dict()`;
# * the optimizer's state: momentum buffers, Adam's moments and step count — without
#   them Adam restarts its bias correction and takes huge first steps;
# * the schedule's settings, the epoch and step counters, the history so far;
# * which modules are in training mode;
# * **every random generator**: Python's `random`, NumPy's global one, each
#   tinytrain device's (Dropout masks, `randn`), and each DataLoader's (the shuffle
#   order of the coming epochs).
#
# Miss one and the resumed run still trains, but it is a *different* run — and
# you will never notice. Section 2 proves ours is the same run to the last bit.
#
# ### Plain data only
#
# `pickle.dump(trainer)` would be one line, and wrong twice. The file would name
# our classes, so it breaks as soon as the code changes; and **unpickling runs
# code**: a pickle is a small program, and its `REDUCE` instruction calls any
# function the file names — `os.system` included. Loading a checkpoint someone
# sent you must not be able to do that. So a checkpoint holds plain data only:
# numbers, strings, lists, dicts (with string or integer keys) and NumPy arrays.
# `to_plain` converts a state into that form, bringing device arrays and
# tensors to the host (a copy from a GPU; on the CPU the array itself, since a
# save pickles it at once), and refuses anything else with the path where it
# was found.

# %% export="serialization"
"""Checkpoint files: plain data, written atomically, read back without running code.

A checkpoint holds plain data only: ``None``, booleans, numbers, strings, lists,
dicts with string or integer keys, and NumPy arrays (tensors and device arrays are
brought to the host: a copy from a GPU, the array itself on the CPU, since a save
pickles it at once). The file starts with a pickle of ``{"format", "version",
"header", "sizes", "crc32"}``: the header is the pickled state with its arrays left
out (pickle protocol 5's out-of-band buffers), and the arrays' bytes follow the
pickle, raw, in order (``sizes``); ``crc32`` holds the CRC-32 of the header and of
each array, so a damaged copy is detected. Version 1 (the state itself) and 2 (the
pickled state with its SHA-256) files still load. :func:`write_checkpoint` writes it to a temporary file in the same
directory, fsyncs it and renames it over the target, so the target is always
either the old or the new complete file. :func:`read_checkpoint` uses an unpickler
that can build nothing but those types: a file that would call any other
function is refused before anything runs. :func:`capture_rng_state` and
:func:`restore_rng_state` cover Python's, NumPy's and every tinytrain backend's
random generators.
"""
import hashlib
import io
import os
import pickle
import random
import re
import uuid
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from tinytrain.backend import backend_of_array, get_backend, loaded_backends
from tinytrain.tensor import Tensor

try:  # zlib-ng's CRC-32 is zlib's, bit for bit, at several times the speed (it uses the CPU's vector units)
    from zlib_ng.zlib_ng import crc32
except ImportError:
    from zlib import crc32

FORMAT = "tinytrain-checkpoint"
VERSION = 3  # 1: the state itself; 2: the pickled state with its sha256; 3: a header, the arrays raw, CRC-32s
CHUNK = 4 << 20  # bytes read at a time: each piece is checksummed while it is still in the cache


class CheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt, foreign or unsafe, or a state is not plain data."""


def to_plain(value: Any, where: str = "state") -> Any:
    """``value`` as plain data: tensors and device arrays become NumPy arrays on the host,
    tuples become lists, NumPy scalars become Python values of exact types (``np.float64``
    and ``np.str_`` too, though they are subclasses of float and str: their pickle names
    a NumPy class, which the loader refuses); ``True`` stays a bool. A NumPy scalar
    whose Python value is none of those (``np.complex128``, ``np.datetime64``) is
    not plain data. Lists and dicts are new ones: ``value`` itself is left as it was.

    Raises :class:`CheckpointError` naming the path (``where``) of the first value
    that is none of: ``None``, bool, int, float, str, list, tuple, dict with str or
    int keys, NumPy array (not of dtype object), tensor or device array; for a dict
    key of another type, the error names the dict's path and the key. A path reads
    like the index expression that reaches the value: ``state['model']['layer']``
    for dict keys (their ``repr``), ``state['a'][1]`` for a list's or tuple's items.
    A NumPy array is plain data as it is; only other arrays ask ``backend_of_array``
    which device holds them.
    """
    if isinstance(value, np.ndarray) and type(value) is not np.ndarray:
        value = np.asarray(value)  # np.memmap, np.matrix, masked arrays: their class could not be loaded back
    ### BEGIN SOLUTION
    if isinstance(value, np.generic):
        value = value.item()  # a Python value: complex, bytes or a datetime is refused below
    if value is None or type(value) in (bool, int, float, str):  # exactly: np.float64 is a float subclass
        return value
    if isinstance(value, Tensor):
        return value._backend.to_host(value.data)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise CheckpointError(f"{where}: arrays of dtype object are not plain data")
        return value
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            if type(key) not in (str, int):
                raise CheckpointError(f"{where}: dict keys must be strings or integers, got {key!r}")
            plain[key] = to_plain(item, f"{where}[{key!r}]")
        return plain
    if isinstance(value, (list, tuple)):
        return [to_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    backend = backend_of_array(value)
    if backend is not None:
        return backend.to_host(value)
    raise CheckpointError(
        f"{where}: {type(value).__module__}.{type(value).__qualname__} is not plain data "
        "(a checkpoint holds None, bools, numbers, strings, lists, dicts and NumPy arrays)"
    )
    ### END SOLUTION


# %% check=1
plain = to_plain({"w": tt.ones(2, 2), "step": np.int64(3), "betas": (0.9, 0.999), "nested": {0: [np.float32(0.5)]}})
assert isinstance(plain["w"], np.ndarray) and plain["w"].shape == (2, 2)
assert plain["step"] == 3 and type(plain["step"]) is int and plain["betas"] == [0.9, 0.999]
assert plain["nested"] == {0: [0.5]} and type(plain["nested"][0][0]) is float
assert isinstance(to_plain(tt.ones(3, device="strict"))[0], np.floating), "device arrays come to the host"
try:
    to_plain({"model": {"layer": object()}})
except CheckpointError as error:
    assert "['model']['layer']" in str(error), error
else:
    raise AssertionError("an arbitrary object must be refused")
print("to_plain OK")

# %% [markdown]
# ### Writing atomically
#
# `open(path, "wb")` empties the old checkpoint *first*. If the process dies
# halfway through writing — the very event checkpoints exist for — you are left
# with half a new file and no old one. The fix is a classic of file systems:
#
# 1. write to a temporary file **in the same directory** (a rename is only atomic
#    within one file system);
# 2. `flush()` Python's buffer and `os.fsync()` the file, so the bytes are on the
#    disk and not only in the operating system's cache;
# 3. `os.replace(temporary, path)`: an atomic rename. Any reader sees the old file
#    or the new one, never a mix;
# 4. on any exception, delete the temporary file and re-raise. *Any* includes
#    Ctrl-C: `KeyboardInterrupt` is not an `Exception`, so catch `BaseException`.
#
# (Strictly, the directory entry should be fsynced too for the rename to survive
# a power cut; we do that where the OS allows it. A process killed before its
# rename cannot delete its temporary file: the next successful write of the same
# file does, which is why the temporary file's name is given.)

# %% export="serialization"
def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Create or replace the file ``path`` with what ``write(file)`` writes, atomically.

    The bytes go to the temporary file ``temporary`` (``.<name>.<12 hex digits>.tmp``
    in the same directory), which is flushed, fsynced and renamed over ``path``. If
    ``write`` (or anything else) fails, the temporary file is removed (if it still
    exists), ``path`` is untouched, and that error propagates -- not one raised
    while cleaning up. A successful write also removes the temporary files of
    ``path`` that killed processes left behind (so one writer per file at a time).
    """
    path = Path(path)
    if not path.parent.is_dir():  # said here: opening the temporary file would name that instead
        raise FileNotFoundError(f"cannot write {path}: the folder {path.parent} does not exist")
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    ### BEGIN SOLUTION
    try:
        with open(temporary, "xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    ### END SOLUTION
    _fsync_directory(path.parent)
    _remove_leftovers(path)


def _remove_leftovers(path: Path) -> None:
    """Delete the temporary files of ``path`` that writes killed before their rename left behind."""
    leftover = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{12}}\.tmp")
    with os.scandir(path.parent) as entries:
        for entry in entries:
            if leftover.fullmatch(entry.name):
                Path(entry.path).unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX); a no-op where directories cannot be opened."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


# %% check=1
atomic_write(folder / "state.bin", lambda f: f.write(b"old"))


def crash_halfway(file):
    file.write(b"new, but only ha")
    raise KeyboardInterrupt("the machine went away")


try:
    atomic_write(folder / "state.bin", crash_halfway)
except KeyboardInterrupt:
    pass
assert (folder / "state.bin").read_bytes() == b"old", "an interrupted write must leave the old file"
assert sorted(p.name for p in folder.iterdir()) == ["state.bin"], "and no temporary file behind"
atomic_write(folder / "state.bin", lambda f: f.write(b"new"))
assert (folder / "state.bin").read_bytes() == b"new"
print("atomic_write OK")

# %% [markdown]
# ### Reading without running code
#
# When the unpickler meets a global reference such as `os system` in a file, it
# calls `find_class(module, name)` to look it up — every function a pickle can
# call passes through there. Overriding it is Python's documented way to restrict
# unpickling ("Restricting Globals" in the `pickle` docs). Plain data needs no
# globals at all, except for NumPy arrays: `_frombuffer` / `_reconstruct` (how
# NumPy pickles an array), `ndarray` and `dtype`. Allow exactly those (the
# given `_numpy_globals` maps their names to versions that refuse a dtype holding
# Python objects: an array of `None`s would load as NaN weights) and refuse
# everything else with an error that names what the file tried to load.
#
# Then check what came out (given code below): a tinytrain checkpoint is a dict
# with `"format": "tinytrain-checkpoint"` and a version, and holds plain data
# only; a truncated or corrupt file makes the unpickler fail in many ways
# (`EOFError`, `UnpicklingError`, `ValueError`, ...) that we turn into one clear
# `CheckpointError`.

# %% export="serialization"
def _safe_dtype(*args: Any) -> np.dtype:
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise CheckpointError(f"refusing to load an array of dtype {dtype}: it would hold Python objects")
    return dtype


class _ArrayInFile:
    """One array's bytes in a version 3 file: where they are, how many, their CRC-32. The header's
    ``_frombuffer`` reads them, a few megabytes at a time, into a new array of the dtype and shape it
    names -- its own memory, in the memory order it was saved in -- checking the CRC-32 as it goes."""

    def __init__(self, path: Path, file: BinaryIO, offset: int, size: int, crc: int) -> None:
        self.path, self.file, self.offset, self.size, self.crc, self.used = path, file, offset, size, crc, False

    def read(self, dtype: np.dtype, shape: Any, order: Any) -> np.ndarray:
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        if self.used or not all(type(n) is int and n >= 0 for n in shape) or \
                int(np.prod(shape, dtype=object)) * dtype.itemsize != self.size:
            raise CheckpointError(f"{self.path} is corrupt: its header asks for an array of {shape} {dtype} where the "
                                  f"file holds {self.size} bytes")
        self.used = True
        array = np.empty(shape, dtype=dtype, order="F" if order == "F" else "C")
        raw = memoryview(array.ravel(order="K")).cast("B")  # the array's memory, as bytes in file order
        self.file.seek(self.offset)
        checksum = 0
        for start in range(0, self.size, CHUNK):
            piece = raw[start:start + CHUNK]
            self.file.readinto(piece)  # the sizes were checked against the file's: every piece is there
            checksum = crc32(piece, checksum)
        if checksum != self.crc:
            raise _damaged(self.path)
        return array


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The globals NumPy's array pickles name (both the NumPy 2 and NumPy 1 spellings)."""
    try:
        from numpy._core import multiarray, numeric  # NumPy 2
    except ImportError:
        from numpy.core import multiarray, numeric  # NumPy 1

    def reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:  # a file can give the dtype as "O"
        return multiarray._reconstruct(subtype, shape, _safe_dtype(dtype))

    def frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
        if isinstance(buffer, _ArrayInFile):  # an array of a version 3 file: read straight into a new array
            return buffer.read(_safe_dtype(dtype), shape, order)
        return numeric._frombuffer(buffer, _safe_dtype(dtype), shape, order)

    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): _safe_dtype}
    for package in ("numpy._core", "numpy.core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{package}.numeric", "_frombuffer")] = frombuffer
    return allowed


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that can build plain data and NumPy arrays, and nothing else."""

    allowed = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        ### BEGIN SOLUTION
        found = self.allowed.get((module, name))
        if found is None:
            raise CheckpointError(
                f"refusing to load {module}.{name}: a tinytrain checkpoint holds only plain data and NumPy "
                "arrays, and this file asks to import and call something else. It is not a tinytrain "
                "checkpoint, or it was tampered with; nothing from it was run."
            )
        return found
        ### END SOLUTION


# %% check=2
class Payload:
    def __reduce__(self):  # what a malicious file does: "call os.mkdir('pwned')"
        return (os.mkdir, (str(folder / "pwned"),))


(folder / "evil.pkl").write_bytes(pickle.dumps({"model": Payload()}))
try:
    with open(folder / "evil.pkl", "rb") as file:
        SafeUnpickler(file).load()
except CheckpointError as error:
    assert "mkdir" in str(error), error
else:
    raise AssertionError("a pickle that calls os.mkdir must be refused")
assert not (folder / "pwned").exists(), "and nothing in it may run"
arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(3)}
for protocol in (4, 5):
    loaded = SafeUnpickler(io.BytesIO(pickle.dumps(arrays, protocol=protocol))).load()
    assert all(np.array_equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in arrays.items())
print("SafeUnpickler OK")

# %% [markdown]
# The two public functions put the pieces together. `write_checkpoint` converts
# the state to plain data (an error is raised before a single byte is written)
# and pickles it. Almost all of a checkpoint's bytes are arrays, so they are
# kept out of the pickle: with protocol 5, `pickle.dumps(state,
# buffer_callback=...)` hands each array's memory to the callback instead of
# copying it into the pickle, and the small pickle that remains, the *header*,
# only says where each one goes. The arrays' raw bytes follow the header in the
# file, written straight from the arrays: no copy of the weights is made. A
# flipped bit on a disk or a copy cut short would still load into a checkpoint
# with one wrong weight, so the file also carries checksums: the CRC-32 of the
# header and of each array, a checksum that a CPU computes at about the speed it
# reads memory. The file is
#
# ```python
# {"format": "tinytrain-checkpoint", "version": 3, "header": b"\x80\x05...",
#  "sizes": [401408, 512, ...], "crc32": [2754307512, ...]}   # pickled, then the arrays' bytes
# ```
#
# written atomically. `read_checkpoint` reverses it: it checks the stamp, the
# sizes and the header's checksum, then unpickles the header, again with
# `SafeUnpickler`. Where the header asks for an array, the file's bytes are read
# straight into a new array of its dtype and shape, a few megabytes at a time,
# each piece checksummed while it is in the cache, and a wrong checksum stops
# the load. Files of version 1 (the state itself) and 2 (the pickled state and
# its SHA-256) still load.

# %% export="serialization"
def write_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Atomically write ``state`` (a dict, converted by :func:`to_plain`) as a checkpoint file."""
    if not isinstance(state, dict) or "format" in state or "version" in state:
        raise CheckpointError("a checkpoint state is a dict without the reserved keys 'format' and 'version'")
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(to_plain(state, where="checkpoint"), protocol=5, buffer_callback=buffers.append)
    arrays = [buffer.raw() for buffer in buffers]  # each array's own memory, as bytes: nothing is copied
    envelope = {"format": FORMAT, "version": VERSION, "header": header, "sizes": [raw.nbytes for raw in arrays],
                "crc32": [crc32(header)] + [crc32(raw) for raw in arrays]}

    def write(file: BinaryIO) -> None:
        pickle.dump(envelope, file, protocol=5)
        for raw in arrays:
            file.write(raw)

    atomic_write(path, write)


_FOREIGN = {b"PK": "it is a zip archive, as torch.save and np.savez write", b"\x93NUMPY": "it is a .npy file (np.save)",
            b"\x89HDF": "it is an HDF5 file (Keras, h5py)"}


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The state saved by :func:`write_checkpoint`.

    Raises ``FileNotFoundError`` for a missing file and :class:`CheckpointError`
    naming the file for a truncated or corrupt one (a checksum does not match, or
    its size is not what its header says), a foreign one (not a pickle, or a pickle
    of something else), an unsafe one (it names a function other than NumPy's, or
    holds Python objects) and one of a later version.
    """
    path = Path(path)
    with open(path, "rb") as file:
        head = file.read(8)
        if head and not head.startswith(b"\x80"):  # every pickle of protocol >= 2 starts so
            looks = next((what for magic, what in _FOREIGN.items() if head.startswith(magic)), f"it starts with {head!r}")
            raise CheckpointError(f"{path} is not a tinytrain checkpoint (a pickle, starting with b'\\x80'): {looks}")
        file.seek(0)
        envelope = _unpickle(path, file)
        if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
            found = f"a pickled {type(envelope).__name__}" if not isinstance(envelope, dict) else f"keys {sorted(map(str, envelope))[:8]}"
            raise CheckpointError(f"{path} is not a tinytrain checkpoint (it holds {found})")
        version = envelope.get("version")
        if type(version) is not int or not 1 <= version <= VERSION:
            raise CheckpointError(
                f"{path} has checkpoint format version {version!r}; this tinytrain reads versions 1 to {VERSION}"
            )
        if version == 3:  # the header's unpickling reads the arrays that follow
            state = _unpickle(path, io.BytesIO(envelope.get("header")), whole=True,
                              arrays=_arrays_in_file(path, file, envelope))
        elif file.read(1):
            raise CheckpointError(f"{path} is corrupt: there are bytes after the end of the checkpoint")
    if version == 1:  # the state itself, without a checksum
        state = {key: value for key, value in envelope.items() if key not in ("format", "version")}
    elif version == 2:
        payload, recorded = envelope.get("payload"), envelope.get("sha256")
        if not isinstance(payload, bytes) or not isinstance(recorded, str):
            raise CheckpointError(f"{path} is corrupt: it lacks its payload or checksum (keys {sorted(map(str, envelope))})")
        if hashlib.sha256(payload).hexdigest() != recorded:
            raise _damaged(path)
        state = _unpickle(path, io.BytesIO(payload), whole=True)
    _refuse_non_plain_data(path, state)
    return state


def _damaged(path: Path) -> CheckpointError:
    return CheckpointError(f"{path} is corrupt: the checksum of its contents does not match the one saved with them "
                           "(the file was damaged after it was written); load an earlier checkpoint")


def _arrays_in_file(path: Path, file: BinaryIO, envelope: dict) -> list[_ArrayInFile]:
    """The arrays that follow a version 3 envelope in ``file``, to be read by the header's unpickling;
    the sizes and the header's CRC-32 are checked first."""
    header, sizes, sums = envelope.get("header"), envelope.get("sizes"), envelope.get("crc32")
    if not (isinstance(header, bytes) and isinstance(sizes, list) and isinstance(sums, list)
            and all(type(size) is int and size >= 0 for size in sizes)
            and len(sums) == len(sizes) + 1 and all(type(value) is int for value in sums)):
        raise CheckpointError(f"{path} is corrupt: its header, array sizes or checksums are missing or malformed "
                              f"(keys {sorted(map(str, envelope))})")
    offset = file.tell()
    held = os.fstat(file.fileno()).st_size - offset
    if sum(sizes) > held:
        raise CheckpointError(f"{path} is truncated or corrupt: its arrays take {sum(sizes)} bytes, and "
                              f"{held} follow its header; load an earlier checkpoint")
    if sum(sizes) < held:
        raise CheckpointError(f"{path} is corrupt: there are bytes after the end of the checkpoint")
    if crc32(header) != sums[0]:
        raise _damaged(path)
    arrays = []
    for size, crc in zip(sizes, sums[1:]):
        arrays.append(_ArrayInFile(path, file, offset, size, crc))
        offset += size
    return arrays


def _unpickle(path: Path, file: BinaryIO, whole: bool = False, arrays: list[_ArrayInFile] = ()) -> Any:
    """What ``SafeUnpickler`` reads from ``file`` (of the checkpoint ``path``), handed ``arrays`` for the
    out-of-band buffers it names; every failure a CheckpointError. ``whole``: nothing may follow the pickle,
    and every one of ``arrays`` must be read."""
    try:
        loaded = SafeUnpickler(file, buffers=iter(arrays)).load()
    except CheckpointError as error:  # refused by SafeUnpickler: say which file
        raise CheckpointError(f"{path}: {error}") from None
    except Exception as error:  # EOFError, UnpicklingError, ValueError, ...: all mean a damaged file
        raise CheckpointError(
            f"{path} is truncated or corrupt ({path.stat().st_size} bytes; unpickling failed with "
            f"{type(error).__name__}: {error}); load an earlier checkpoint"
        ) from error
    if whole and (file.read(1) or not all(array.used for array in arrays)):
        raise CheckpointError(f"{path} is corrupt: its header does not account for everything after it")
    return loaded


def _refuse_non_plain_data(path: Path, state: dict[str, Any]) -> None:
    """Raise CheckpointError unless ``state`` is plain data. NumPy's globals alone can build an array of
    Python objects (``ndarray((2,), "O")``), whose ``None``s a model would load as NaN weights."""
    pending = [(state, "checkpoint")]
    while pending:
        value, where = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if type(key) not in (str, int):
                    raise CheckpointError(f"{path} is corrupt: {where} has the key {key!r}, not a string or integer")
                pending.append((item, f"{where}[{key!r}]"))
        elif isinstance(value, (list, tuple)):
            pending.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise CheckpointError(f"{path}: refusing the array {where} of dtype {value.dtype}: it holds Python "
                                      "objects, not numbers")
        elif value is not None and type(value) not in (bool, int, float, str):
            raise CheckpointError(f"{path} is corrupt: {where} is a {type(value).__name__}, which is not plain data")


# %% [markdown]
# ### Every random state
#
# Python's `random.getstate()` and NumPy's `np.random.get_state(legacy=False)`
# return plain data: a tuple `(version, <a tuple of 625 integers>, gauss_next)`
# (`gauss_next` is `None`, or a float after `random.gauss`), and a dict with an
# array. A file stores tuples as lists (`to_plain`), and
# `random.setstate` takes only tuples: turn them back when you restore. Each tinytrain
# backend keeps its own generator (Module 01) and reports its state with
# `rng_state()`. Save them all by device name (`backend.device`: `"cpu"`,
# `"strict:0"`); to restore, `get_backend(name)`
# (which creates a backend that this new process has not used yet) and set its
# state. A backend that cannot report its state yet (its `rng_state()` raises
# `NotImplementedError`, as CuPy's does until Module 12) is skipped with a warning
# (`warnings.warn(..., RuntimeWarning)`): that run will not resume exactly, and you
# should know. The same on restoring: a device this process cannot create (a GPU
# checkpoint resumed on a laptop: `get_backend` raises `ValueError`, `ImportError`
# or `RuntimeError`) is skipped with a warning, and the rest is restored.
# DataLoaders keep their own generators; the Trainer saves those.

# %% export="serialization"
def capture_rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's global and every loaded tinytrain backend's generator:
    ``{"python": ..., "numpy": ..., "backends": {device: state}}``. A backend whose
    ``rng_state()`` raises ``NotImplementedError`` is left out with a ``RuntimeWarning``."""
    ### BEGIN SOLUTION
    backends = {}
    for backend in loaded_backends():
        try:
            backends[backend.device] = backend.rng_state()
        except NotImplementedError as error:
            warnings.warn(f"not saving the random state of {backend.device!r}: {error}", RuntimeWarning, stacklevel=2)
    return {"python": random.getstate(), "numpy": np.random.get_state(legacy=False), "backends": backends}
    ### END SOLUTION


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` returned (also after a round trip through a file).

    A device that ``get_backend`` cannot create here (``ValueError``, ``ImportError``
    or ``RuntimeError``: a ``"cuda:0"`` state resumed on a laptop) is skipped with a
    ``RuntimeWarning``; Python's and NumPy's generators and the other devices are
    restored all the same, whatever the order of the devices.
    """
    ### BEGIN SOLUTION
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))  # the file made the tuples lists
    np.random.set_state(state["numpy"])
    for device, backend_state in state["backends"].items():
        try:
            backend = get_backend(device)
        except (ValueError, ImportError, RuntimeError) as error:
            warnings.warn(f"not restoring the random state of {device!r}: {error}", RuntimeWarning, stacklevel=2)
            continue
        backend.set_rng_state(backend_state)
    ### END SOLUTION


# %% check=2
tt.manual_seed(1)
tt.randn(3, device="strict")
saved_file = folder / "rng.ckpt"
write_checkpoint(saved_file, {"rng": capture_rng_state()})
expected = (random.random(), np.random.rand(), tt.randn(2).numpy(), tt.randn(2, device="strict").numpy())
tt.manual_seed(123)  # scramble everything
restore_rng_state(read_checkpoint(saved_file)["rng"])
again = (random.random(), np.random.rand(), tt.randn(2).numpy(), tt.randn(2, device="strict").numpy())
assert expected[:2] == again[:2] and all(np.array_equal(x, y) for x, y in zip(expected[2:], again[2:]))
full = saved_file.read_bytes()
(folder / "truncated.ckpt").write_bytes(full[: len(full) // 2])
try:
    read_checkpoint(folder / "truncated.ckpt")
except CheckpointError as error:
    assert "truncated" in str(error), error
else:
    raise AssertionError("a truncated checkpoint must raise CheckpointError")
(folder / "foreign.pkl").write_bytes(pickle.dumps([1, 2, 3]))
try:
    read_checkpoint(folder / "foreign.pkl")
except CheckpointError as error:
    assert "not a tinytrain checkpoint" in str(error), error
else:
    raise AssertionError("a pickle of something else must raise CheckpointError")
print("random states and checkpoint files OK")


# %% [markdown]
# ## 2. Resuming exactly
#
# The Trainer (Module 09) inherits its two checkpoint methods from `Resumable`,
# given here: `save_checkpoint` gathers everything section 1 listed — the model's
# parameters and buffers and each module's mode, the optimizer, the schedule,
# the counters and history, the callbacks' states, each data loader's position
# and generator, every random state — into one `write_checkpoint`;
# `load_checkpoint` puts it back. The data loaders and callbacks get their saved
# state when they are next handed to `fit`, so a resumed run goes on from the
# same batch of the same shuffle.

# %% export="resume"
"""Everything a bit-identical resume needs, saved and restored for the :class:`~tinytrain.training.Trainer`.

``Resumable`` is the Trainer's base class (Module 09's ``Trainer`` inherits it):
``save_checkpoint`` gathers the trainer's complete state into one checkpoint
file (:mod:`tinytrain.serialization`), ``load_checkpoint`` puts it back.
"""
import warnings
from typing import Any, Sequence

import numpy as np

from tinytrain.backend import memory_order
from tinytrain.nn.module import Module
from tinytrain.optim import Optimizer
from tinytrain.serialization import CheckpointError, capture_rng_state, read_checkpoint, restore_rng_state, write_checkpoint


class Resumable:
    """Checkpoints of a trainer's complete state; the :class:`~tinytrain.training.Trainer` supplies the
    attributes (``model``, ``optimizer``, ``scheduler``, counters, ``history``, loaders, callbacks, plugins)."""

    def save_checkpoint(self, path: Any) -> None:
        """Write everything a bit-identical resume needs to ``path``, atomically.

        Model (parameters and buffers), each module's mode, optimizer, schedule,
        counters, history, the state of the callbacks of the current ``fit``, the
        position and generator of the train and validation loaders, and the random
        states of Python, NumPy and every tinytrain device. With a data-parallel
        ``strategy``, only the writer rank (0) writes.
        """
        if not all(getattr(plugin, "is_writer", True) for plugin in self._plugins):
            return
        write_checkpoint(path, {
            "epoch": self.epoch,
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "model": _model_state(self.model),
            "modes": [module.training for module in self.model.modules()],
            "optimizer": _optimizer_state(self.optimizer),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "history": self.history,
            "loaders": {role: loader.state_dict() for role, loader in self._loaders.items()
                        if hasattr(loader, "state_dict")},
            "callbacks": {key: callback.state_dict()
                          for key, callback in zip(callback_keys(self._callbacks), self._callbacks)},
            "rng": capture_rng_state(),
            "plugins": {plugin.name: plugin.state_dict() for plugin in self._plugins},
        })

    def load_checkpoint(self, path: Any) -> None:
        """Restore the state saved by :meth:`save_checkpoint`, completely or not at all.

        Every field is checked before anything changes; if applying it fails
        midway (a checkpoint of another model, optimizer or schedule), the trainer
        gets its previous state back and the error propagates. A checkpoint with a
        schedule raises ``ValueError`` for a trainer without one: dropping it would
        leave the optimizer at the saved rate for good. The data loaders
        and callbacks get their saved state when they are next passed to
        :meth:`fit` (or the train loader to :meth:`train_epoch`).
        """
        state = read_checkpoint(path)
        _check_trainer_state(path, state)
        if state.get("scheduler") is not None and self.scheduler is None:
            raise ValueError(f"{path} holds the state of a {state['scheduler'].get('type', 'schedule')}, but this "
                             "trainer has no scheduler; pass one as Trainer(..., scheduler=...) to resume it")
        with warnings.catch_warnings():  # a generator that cannot be saved is as before; no need to say so twice
            warnings.simplefilter("ignore", RuntimeWarning)
            before = {
                "epoch": self.epoch, "step": self.step, "skipped_steps": self.skipped_steps,
                # what the load replaces rather than overwrites needs no copy to be put back: the arrays themselves
                "model": {name: tensor.data for name, tensor in _model_state(self.model).items()}
                if _adoptable(self.model, state["model"]) else self.model.state_dict(),
                "modes": [module.training for module in self.model.modules()],
                "optimizer": _optimizer_state(self.optimizer),
                "scheduler": None if state.get("scheduler") is None or self.scheduler is None
                else self.scheduler.state_dict(),
                "history": self.history, **self._pending, "rng": capture_rng_state(),
                "plugins": {plugin.name: plugin.state_dict() for plugin in self._plugins
                            if plugin.name in state.get("plugins", {})},
            }
        try:
            self._apply_state(state)
        except BaseException:
            self._apply_state(before)
            raise

    def _apply_state(self, state: dict[str, Any]) -> None:
        """Put a checked checkpoint state (or :meth:`load_checkpoint`'s snapshot) in place; the parts
        that can fail first, the random states last. The arrays of a state just read from a file (or of the
        snapshot) belong to nothing else: the model and a tinytrain optimizer take them as they are."""
        if _adoptable(self.model, state["model"]):
            for name, tensor in _model_state(self.model).items():
                tensor.data = state["model"][name]
        else:
            self.model.load_state_dict(state["model"])
        if isinstance(self.optimizer, Optimizer):
            self.optimizer.load_state_dict(state["optimizer"], copy=False)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        for plugin in self._plugins:
            if plugin.name in state.get("plugins", {}):
                plugin.load_state_dict(state["plugins"][plugin.name])
        modules = self.model.modules()
        if len(state.get("modes", ())) == len(modules):
            for module, training in zip(modules, state["modes"]):
                module.training = bool(training)
        self.epoch, self.step = state["epoch"], state["step"]
        self.skipped_steps = state.get("skipped_steps", 0)
        self.history = {**{key: [] for key in self.history}, **state["history"]}  # keys added since
        self._pending = {"loaders": dict(state.get("loaders", {})), "callbacks": dict(state.get("callbacks", {}))}
        restore_rng_state(state["rng"])


def _check_trainer_state(path: Any, state: dict[str, Any]) -> None:
    """Raise CheckpointError naming the field and its value unless ``state`` has the fields of a Trainer's."""
    missing = [key for key in ("epoch", "step", "model", "optimizer", "history", "rng") if key not in state]
    if missing:
        raise CheckpointError(f"{path} is not a Trainer checkpoint: it lacks {', '.join(missing)}")
    for key in ("epoch", "step", "skipped_steps"):
        value = state.get(key, 0)
        if type(value) is not int or value < 0:
            raise CheckpointError(f"{path}: {key!r} must be a whole number >= 0, got {_shown(value)}")
    expected = {"model": "a dict of arrays by name", "optimizer": "a dict", "history": "a dict of lists",
                "rng": "a dict", "loaders": "a dict", "callbacks": "a dict", "plugins": "a dict"}
    for key, what in expected.items():
        if key in state and not isinstance(state[key], dict):
            raise CheckpointError(f"{path}: {key!r} must be {what}, got {_shown(state[key])}")
    if state.get("scheduler") is not None and not isinstance(state["scheduler"], dict):
        raise CheckpointError(f"{path}: 'scheduler' must be None or a dict, got {_shown(state['scheduler'])}")
    if not all(isinstance(values, list) for values in state["history"].values()):
        raise CheckpointError(f"{path}: 'history' must be a dict of lists, got {_shown(state['history'])}")
    if not isinstance(state.get("modes", []), list):
        raise CheckpointError(f"{path}: 'modes' must be a list of booleans, got {_shown(state['modes'])}")


def _shown(value: Any) -> str:
    """``repr(value)``, or its type where that would be long."""
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"


# A checkpoint is written as soon as the state is collected, so the copies that
# state_dict() makes (a snapshot that later training cannot change) would only
# double the memory traffic of saving: the two helpers below skip them.
def _model_state(model: Any) -> dict[str, Any]:
    """What ``model.state_dict()`` holds, without copying the arrays when it is Module's own."""
    if isinstance(model, Module) and type(model).state_dict is Module.state_dict:
        return dict(model.named_parameters() + model.named_buffers())
    return model.state_dict()


def _optimizer_state(optimizer: Any) -> dict[str, Any]:
    """``optimizer.state_dict()``, without copying the buffers when it is a tinytrain optimizer (whose
    ``load_state_dict`` replaces its buffers rather than writing into them, so they also serve as the
    snapshot a failed load puts back)."""
    if isinstance(optimizer, Optimizer):
        return optimizer.state_dict(copy=False)
    return optimizer.state_dict()


def _adoptable(model: Any, saved: Any) -> bool:
    """Whether loading ``saved`` into ``model`` may hand the model the saved arrays themselves instead
    of copying them into its own: a ``Module`` with Module's own ``load_state_dict``, each of whose
    tensors is a NumPy array that owns its memory (no view into a buffer something else keeps), and a
    state of exactly its names with arrays of the same shape, dtype and memory order that own theirs.
    Then the model's old arrays are untouched by the load, so they are the snapshot a failed load puts
    back, and a load of 100 MB costs no copy of it. Anything else goes through ``load_state_dict``."""
    if not isinstance(model, Module) or type(model).load_state_dict is not Module.load_state_dict:
        return False
    own = _model_state(model)
    if not isinstance(saved, dict) or saved.keys() != own.keys():
        return False
    for name, tensor in own.items():
        old, new = tensor.data, saved[name]
        if not (type(old) is np.ndarray and type(new) is np.ndarray and old.base is None and new.base is None
                and old.shape == new.shape and old.dtype == new.dtype and memory_order(old) == memory_order(new)
                and new.flags.writeable):
            return False
    return True


def callback_keys(callbacks: Sequence[Any]) -> list[str]:
    """A name per callback for checkpoints: its class, numbered from the second of a class."""
    seen: dict[str, int] = {}
    keys = []
    for callback in callbacks:
        name = type(callback).__name__
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys


# %% [markdown]
# The package's `Trainer` inherits the package's `Resumable`. To run *your*
# checkpoint code in this notebook (before you export it), put this notebook's
# `Resumable` in front:

# %%
class Trainer(Resumable, Trainer):
    """The package's Trainer, saving and loading with this notebook's checkpoint code."""


# %% [markdown]
# Now the proof that the checkpoint holds everything. Train a small network with
# dropout on shuffled batches for 4 epochs straight. Then do it again in two
# halves: 2 epochs, save, throw everything away, build a *new* model, optimizer
# and loader (after `tt.manual_seed(999)`, to be sure nothing is inherited), load, and
# train the last 2 epochs. The weights must be identical to the last bit —
# `np.array_equal`, not `allclose`. (The graded check does the same after
# scrambling every generator; the library's own tests also resume in a separate
# Python process.)

# %%
def resumable_run():
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, nn.CrossEntropyLoss(), scheduler=CosineSchedule(0.01, 0.001, total_epochs=4))
    return trainer, DataLoader(toy, batch_size=16, shuffle=True)


tt.manual_seed(0)
straight, loader = resumable_run()
straight.fit(loader, epochs=4, progress=False)

tt.manual_seed(0)
first_half, loader = resumable_run()
first_half.fit(loader, epochs=2, progress=False)
checkpoint_path = folder / "half.ckpt"
first_half.save_checkpoint(checkpoint_path)
del first_half, loader

tt.manual_seed(999)  # a different start: everything must come from the file
resumed, loader = resumable_run()
resumed.load_checkpoint(checkpoint_path)
resumed.fit(loader, epochs=4, progress=False)
identical = all(np.array_equal(a.numpy(), b.numpy())
                for a, b in zip(straight.model.parameters(), resumed.model.parameters()))
print(f"bit-identical after resuming: {identical}; checkpoint {checkpoint_path.stat().st_size / 1024:.1f} KiB")
assert identical and all(resumed.history[key] == straight.history[key] for key in ("train_loss", "learning_rates"))

# %% [markdown]
# What if the checkpoint held only the weights — the common shortcut?

# %%
tt.manual_seed(0)
shortcut, loader = resumable_run()
shortcut.fit(loader, epochs=2, progress=False)
weights_only = shortcut.model.state_dict()
tt.manual_seed(999)
shortcut, loader = resumable_run()
shortcut.model.load_state_dict(weights_only)
shortcut.epoch = 2
shortcut.fit(loader, epochs=4, progress=False)
gap = max(np.abs(a.numpy() - b.numpy()).max()
          for a, b in zip(straight.model.parameters(), shortcut.model.parameters()))
print(f"weights-only resume: largest difference from the uninterrupted run {gap:.3g}")

# %% [markdown]
# A different run: fresh Adam moments, other shuffles, other dropout masks. It
# may train fine — but it is not reproducible, and a bug hunt that needs "the
# run from epoch 2 on" cannot have it.


# %% [markdown]
# ## 3. Callbacks: checkpoints, logs, early stopping
#
# `fit` calls each callback's hooks: `on_fit_begin`, `on_epoch_end(trainer, logs)`
# after every epoch (with `logs` = epoch, lr, train and eval loss, eval accuracy,
# mean gradient norm, seconds), then `on_checkpoint` once every callback has
# updated its state, and `on_fit_end`. A callback whose state matters for a
# resume returns it from `state_dict()`; the trainer's checkpoints carry it.
#
# * `ModelCheckpoint(directory, keep_last=N, every=K, monitor=..., upload_to=URL)`
#   saves `epoch-0007.pkl` after every epoch, keeps the newest `N` and every `K`-th,
#   and keeps the best one (by a monitored log entry) as `best.pkl`. The order
#   matters: `best.pkl` first, then the epoch file, then the deletions, so a run
#   killed at any moment and resumed from its newest epoch file redoes whatever
#   was missing. With
#   `upload_to` it copies each file to any [fsspec](https://filesystem-spec.readthedocs.io)
#   URL (`s3://bucket/run`, `gs://...`, `ssh://...`) — so losing the machine loses no work.
# * `CSVLogger(path)` writes one row per epoch (per evaluation in a step run); on resume it keeps the rows of the
#   epochs the checkpoint has and drops any written after it.
# * `EarlyStopping(monitor, patience)` stops when the metric has not improved for
#   `patience` epochs, and can restore the best weights.
#
# You write the two decisions: which epoch files `ModelCheckpoint` keeps (the
# newest `keep_last`, plus every epoch divisible by `every`), and when
# `EarlyStopping` stops (count the epochs without an improvement; reset the count
# on an improvement). With `restore_best=True`, an improvement also keeps a copy
# of the weights, `self._best_weights = trainer.model.state_dict()`, which the
# given `on_fit_end` puts back.

# %% export="callbacks"
"""Callbacks for :meth:`tinytrain.training.Trainer.fit`: checkpoints, CSV logs, early stopping.

A callback subclasses :class:`Callback` and overrides the hooks it needs. State
that must survive a resume (the best value so far, a patience counter) comes
from ``state_dict()`` as plain data; the Trainer stores it in its checkpoints
and hands it back through ``load_state_dict`` at the next ``fit``.
"""
import csv
import io
import math
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

from tinytrain.serialization import atomic_write


class Callback:
    """Hooks called by ``Trainer.fit``; each does nothing unless overridden."""

    def on_fit_begin(self, trainer: Any) -> None:
        """Before the first epoch of a ``fit`` call (also of a resumed one)."""

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        """After each epoch; may set ``trainer.stop_training = True``."""

    def on_checkpoint(self, trainer: Any, logs: dict[str, Any]) -> None:
        """After every callback's ``on_epoch_end``: the epoch's state is final (save it here)."""

    def on_fit_end(self, trainer: Any) -> None:
        """After the last epoch of a ``fit`` call."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue, as plain data."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def _resolve_mode(monitor: str, mode: str) -> str:
    """``"min"`` or ``"max"``; ``"auto"`` means ``"max"`` for accuracies, ``"min"`` for the rest."""
    if mode == "auto":
        return "max" if "acc" in monitor else "min"
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min', 'max' or 'auto', got {mode!r}")
    return mode


def _monitored(logs: dict[str, Any], monitor: str) -> float:
    """The value of ``monitor`` in ``logs``, or a clear error."""
    if monitor not in logs:
        raise KeyError(f"cannot monitor {monitor!r}: the epoch logs have {', '.join(sorted(logs))}")
    value = logs[monitor]
    if value is None:
        raise ValueError(f"cannot monitor {monitor!r}: it has no value (pass val_loader to fit() for eval metrics)")
    return float(value)


def _improves(value: float, best: float | None, mode: str, min_delta: float = 0.0) -> bool:
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value < best - min_delta if mode == "min" else value > best + min_delta


class ModelCheckpoint(Callback):
    """Save the trainer's checkpoint after every epoch as ``directory/epoch-0007.pkl``.

    Keeps the ``keep_last`` newest epoch files plus every one whose epoch is a
    multiple of ``every``; deletes the rest. With ``unit="step"`` (for
    ``fit(max_steps=...)``, whose rows end at steps, not epochs) files are named and
    counted by ``trainer.step`` instead: ``directory/step-0002000.pkl``. With ``monitor`` (a log entry such as
    ``"eval_loss"``; ``mode`` "min", "max" or "auto") it also keeps ``best.pkl``, a
    copy of the checkpoint with the best value. With ``upload_to``, an fsspec URL
    (``s3://bucket/run``, ``memory://run``; needs ``pip install tinytrain[fsspec]``),
    every file written is copied there and every file deleted is deleted there.
    An upload that fails is reported with a warning; training goes on.
    """

    _DIGITS = {"epoch": 4, "step": 7}  # zero-padded, so the file names sort in order

    def __init__(self, directory: Any, keep_last: int = 1, every: int | None = None, monitor: str | None = None,
                 mode: str = "auto", upload_to: str | None = None, unit: str = "epoch") -> None:
        if unit not in self._DIGITS:
            raise ValueError(f"unit must be 'epoch' or 'step', got {unit!r}")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be a whole number >= 1, got {keep_last!r}")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be None or a whole number >= 1, got {every!r}")
        self.directory = Path(directory)
        self.keep_last, self.every, self.unit = keep_last, every, unit
        self._file = re.compile(rf"^{unit}-(\d+)\.pkl$")
        self.monitor = monitor
        self.mode = None if monitor is None else _resolve_mode(monitor, mode)
        self.best: float | None = None
        self.best_epoch: int | None = None
        self._improved = False
        self._remote = None
        if upload_to is not None:
            try:
                import fsspec
            except ImportError:
                raise ImportError("ModelCheckpoint(upload_to=...) needs fsspec: pip install 'tinytrain[fsspec]'") from None
            filesystem, root = fsspec.core.url_to_fs(upload_to)
            self._remote = (filesystem, root.rstrip("/"))

    def on_fit_begin(self, trainer: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._remote is not None:
            filesystem, root = self._remote
            filesystem.makedirs(root, exist_ok=True)
        self._prune(getattr(trainer, self.unit))  # what a run killed after its last save had no time to delete

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        self._improved = False
        if self.monitor is not None:
            value = _monitored(logs, self.monitor)
            if _improves(value, self.best, self.mode):
                self.best, self.best_epoch, self._improved = value, getattr(trainer, self.unit), True

    def on_checkpoint(self, trainer: Any, logs: dict[str, Any]) -> None:
        # best.pkl first, then the epoch file (a copy of it), then the pruning: a run killed before the
        # epoch file is complete resumes from the previous one and redoes all three; one killed before
        # the pruning prunes when it resumes (on_fit_begin)
        path = self.directory / self._name(getattr(trainer, self.unit))
        if self._improved:
            best = self.directory / "best.pkl"
            trainer.save_checkpoint(best)
            self._upload(best)
            with open(best, "rb") as source:
                atomic_write(path, lambda target: shutil.copyfileobj(source, target))
        else:
            trainer.save_checkpoint(path)
        self._upload(path)
        self._prune(getattr(trainer, self.unit))

    def _name(self, count: int) -> str:
        return f"{self.unit}-{count:0{self._DIGITS[self.unit]}d}.pkl"

    def epoch_files(self) -> dict[int, Path]:
        """The epoch checkpoints in ``directory``, by epoch (step files by step, with ``unit="step"``)."""
        found = {}
        for path in self.directory.iterdir():
            match = self._file.match(path.name)
            if match:
                found[int(match[1])] = path
        return dict(sorted(found.items()))

    def _prune(self, current: int) -> None:
        """Delete the epoch files up to ``current`` that are neither among the newest nor every-K-th.

        ``epochs`` lists the epochs of those files, oldest first. Set ``keep``, the
        set of epochs to keep: the ``keep_last`` newest, and every multiple of
        ``every`` (when it is set); the given loop deletes the others.
        Files of later epochs (left by a run that was resumed from an earlier
        checkpoint) are not touched: this run overwrites them when it gets there.
        """
        epochs = [epoch for epoch in self.epoch_files() if epoch <= current]
        ### BEGIN SOLUTION
        keep = set(epochs[-self.keep_last:]) | {e for e in epochs if self.every and e % self.every == 0}
        ### END SOLUTION
        for epoch in epochs:
            if epoch not in keep:
                name = self._name(epoch)
                (self.directory / name).unlink(missing_ok=True)
                self._remote_call("delete", name, lambda fs, remote: fs.exists(remote) and fs.rm(remote))

    def _upload(self, path: Path) -> None:
        self._remote_call("copy", path.name, lambda fs, remote: fs.put_file(str(path), remote))

    def _remote_call(self, action: str, name: str, call: Any) -> None:
        if self._remote is None:
            return
        filesystem, root = self._remote
        remote = f"{root}/{name}"
        try:
            call(filesystem, remote)
        except Exception as error:  # a network hiccup must not end a long run
            url = filesystem.unstrip_protocol(remote)
            warnings.warn(f"ModelCheckpoint could not {action} {url}: {error}", RuntimeWarning, stacklevel=2)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]


class CSVLogger(Callback):
    """Append one row per epoch (per evaluation in ``fit(max_steps=...)``) to the CSV file
    ``path``: ``COLUMNS``, empty where unknown.

    ``epoch`` is the number of epochs completed, ``step`` of optimizer steps. A fresh
    run (no epoch or step done yet) starts a new file; a resumed one keeps the rows up
    to its epoch and step and drops later ones, which belonged to the interrupted run
    after its checkpoint.
    """

    COLUMNS = ("epoch", "step", "lr", "train_loss", "eval_loss", "eval_accuracy", "grad_norm", "seconds")

    def __init__(self, path: Any) -> None:
        self.path = Path(path)

    def on_fit_begin(self, trainer: Any) -> None:
        rows = []
        if (trainer.epoch > 0 or trainer.step > 0) and self.path.exists():
            with open(self.path, newline="") as file:
                rows = [row for row in csv.reader(file) if len(row) > 1 and row[0].isdigit() and row[1].isdigit()
                        and int(row[0]) <= trainer.epoch and int(row[1]) <= trainer.step]
        text = io.StringIO()
        csv.writer(text).writerows([self.COLUMNS, *rows])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda file: file.write(text.getvalue().encode()))

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        row = ["" if logs.get(column) is None else logs[column] for column in self.COLUMNS]
        with open(self.path, "a", newline="") as file:
            csv.writer(file).writerow(row)


class EarlyStopping(Callback):
    """Stop ``fit`` when ``monitor`` has not improved by more than ``min_delta`` for
    ``patience`` epochs in a row (``mode`` "min", "max" or "auto").

    After each epoch: when the monitored value improves on ``best`` (the given
    ``_improves``), ``best`` becomes that value, ``best_epoch`` the epoch
    (``trainer.epoch``) and ``wait`` 0 -- so with ``min_delta`` an epoch that beats
    ``best`` by less does not move it. Otherwise ``wait`` grows by one, and when it
    reaches ``patience`` or is past it (a second ``fit`` with the same callback counts
    on from where the first stopped) the callback sets ``trainer.stop_training = True``
    and ``stopped_epoch`` to the epoch. With ``restore_best=True`` every improvement also
    keeps a copy of the weights (``trainer.model.state_dict()``) in ``_best_weights``,
    and the model gets them back when ``fit`` ends.
    """

    def __init__(self, monitor: str = "eval_loss", patience: int = 5, min_delta: float = 0.0, mode: str = "auto",
                 restore_best: bool = False) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be a whole number >= 1, got {patience!r}")
        if not min_delta >= 0:
            raise ValueError(f"min_delta must be >= 0, got {min_delta!r}")
        self.monitor, self.patience, self.min_delta = monitor, patience, float(min_delta)
        self.mode = _resolve_mode(monitor, mode)
        self.restore_best = restore_best
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None
        self._best_weights: dict | None = None

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        value = _monitored(logs, self.monitor)
        ### BEGIN SOLUTION
        if _improves(value, self.best, self.mode, self.min_delta):
            self.best, self.best_epoch, self.wait = value, trainer.epoch, 0
            if self.restore_best:
                self._best_weights = trainer.model.state_dict()
            return
        self.wait += 1
        if self.wait >= self.patience:
            trainer.stop_training = True
            self.stopped_epoch = trainer.epoch
        ### END SOLUTION

    def on_fit_end(self, trainer: Any) -> None:
        if self.restore_best and self._best_weights is not None and self.best_epoch != trainer.epoch:
            trainer.model.load_state_dict(self._best_weights)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait,
                "stopped_epoch": self.stopped_epoch, "best_weights": self._best_weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.wait = state["best"], state["best_epoch"], state["wait"]
        self.stopped_epoch, self._best_weights = state["stopped_epoch"], state["best_weights"]


# %% check=1
run_dir = folder / "run"
model = toy_model()
trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss())
checkpoints = ModelCheckpoint(run_dir, keep_last=2, every=3, monitor="eval_loss")
trainer.fit(DataLoader(toy, batch_size=20, shuffle=True, seed=1), DataLoader(toy, batch_size=50), epochs=7,
            callbacks=[checkpoints, CSVLogger(run_dir / "log.csv")], progress=False)
assert sorted(p.name for p in run_dir.glob("epoch-*")) == ["epoch-0003.pkl", "epoch-0006.pkl", "epoch-0007.pkl"]
assert (run_dir / "best.pkl").exists() and checkpoints.best == min(trainer.history["eval_loss"])
rows = (run_dir / "log.csv").read_text().splitlines()
assert len(rows) == 8 and rows[0] == "epoch,step,lr,train_loss,eval_loss,eval_accuracy,grad_norm,seconds"
patient = EarlyStopping(monitor="train_loss", patience=2, min_delta=1e9)  # only the first epoch improves (on None)
trainer.fit(DataLoader(toy, batch_size=20), epochs=20, callbacks=[patient], progress=False)
assert trainer.epoch == 10 and patient.stopped_epoch == 10, trainer.epoch
print("callbacks OK")

# %% [markdown]
# ## 4. Systems: what a checkpoint costs
#
# A checkpoint is about as large as the training state: the weights, plus the
# optimizer's state (Adam: two more arrays of the weights' size), plus a few
# kilobytes of counters and random states. Writing it costs the bytes, and the
# `fsync` that makes it durable: without it, a crash right after the rename can
# leave an empty file on disk, because the operating system had not written the
# data yet. Measure both on a model of the size of the MLP milestone
# (784-256-128-10, Adam after one step), against a plain write of the same bytes:

# %%
tt.manual_seed(0)
mlp = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
adam = optim.Adam(mlp.parameters(), lr=1e-3)
trainer = Trainer(mlp, adam, nn.CrossEntropyLoss())
trainer.train_epoch([(tt.randn(64, 784), tt.tensor(np.random.default_rng(0).integers(0, 10, 64)))])
path = folder / "mlp.ckpt"
trainer.save_checkpoint(path)
payload = path.read_bytes()
weights = sum(p.data.nbytes for p in mlp.parameters())
print(f"checkpoint {len(payload) / 2**20:.2f} MiB for {weights / 2**20:.2f} MiB of weights "
      f"({len(payload) / weights:.2f}x: Adam's two moments)")


def best_of(write, runs=5):
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        write()
        best = min(best, time.perf_counter() - start)
    return best


plain = best_of(lambda: (folder / "plain.bin").write_bytes(payload))
atomic = best_of(lambda: atomic_write(folder / "atomic.bin", lambda file: file.write(payload)))
print(f"plain write {plain * 1e3:6.1f} ms, atomic write (temporary file, fsync, rename) {atomic * 1e3:6.1f} ms")

# %% [markdown]
# The ratio is the point: about 3x the weights, because Adam's moments are part
# of the state. The `fsync` costs little on a fast disk and much on a slow or
# busy one (a network file system, a laptop on battery); saving every epoch of
# a run whose epochs take seconds can then dominate. `ModelCheckpoint(every=K)`
# and `keep_last` are the two knobs.
#
# ## How PyTorch does it
#
# * `torch.save` pickles whatever you give it. Since PyTorch 2.6 `torch.load`
#   defaults to `weights_only=True`: a restricted unpickler, the same defence as
#   our `SafeUnpickler`. `torch.save` writes in place — not atomically.
# * Random states come from `torch.get_rng_state()`, `torch.cuda.get_rng_state_all()`,
#   `random.getstate()` and `np.random.get_state()`; the standard `DataLoader`
#   cannot save its position (torchdata's `StatefulDataLoader` can).
# * PyTorch Lightning's `ModelCheckpoint` (`save_top_k`, `monitor`, `every_n_epochs`),
#   `CSVLogger` and `EarlyStopping`, and Keras' callbacks, are the models for ours.
#
# ## Summary
#
# * A checkpoint is plain data — weights, buffers, optimizer, schedule, counters,
#   history, modes, the loaders' positions and every random state — written
#   atomically (temporary file, fsync, rename) with its checksum, and read by
#   an unpickler that refuses code. Then a resumed run is the same run, bit for bit.
# * Weights alone resume a *different* run.
# * Callbacks keep the newest and the best checkpoints, log every epoch, and stop
#   early; the state that decides what they do next travels in the checkpoint.
