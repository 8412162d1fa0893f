"""Checkpoint files: plain data, atomic writes, a restricted unpickler, random states,
and exact resumption of a Trainer in a new process."""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import zlib
import random
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain import nn, serialization as checkpoint
from tinytrain.backend import get_backend
from tinytrain.serialization import (
    CheckpointError,
    atomic_write,
    capture_rng_state,
    read_checkpoint,
    restore_rng_state,
    to_plain,
    write_checkpoint,
)

REPO = Path(__file__).resolve().parents[1]

STATE = {
    "epoch": 3,
    "name": "run",
    "lr": 0.125,
    "flags": [True, None, float("inf")],
    "big": 2**100,  # a PCG64 state holds 128-bit integers
    "arrays": {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.arange(5), "b": np.array([True, False])},
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    7: {"nested": [np.float16(1.5)]},
    "numpy scalars": [np.float64(0.25), np.bool_(True), np.int32(-3)],  # np.float64 subclasses float
}


def assert_same(a, b) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b and type(a) is type(to_plain(b)), (a, b)


# -- plain data -------------------------------------------------------------------------------


def test_round_trip_of_plain_data(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "c.ckpt", STATE)
    loaded = read_checkpoint(tmp_path / "c.ckpt")
    assert_same(to_plain(STATE), loaded)
    assert loaded[7]["nested"] == [1.5] and type(loaded[7]["nested"][0]) is float
    assert loaded["numpy scalars"] == [0.25, True, -3]
    assert [type(v) for v in loaded["numpy scalars"]] == [float, bool, int]
    assert loaded["arrays"]["w"].flags.writeable


def test_to_plain_copies_tensors_and_device_arrays_to_the_host(device: str) -> None:
    t = tt.arange(6, device=device).reshape(2, 3).astype("float32")
    plain = to_plain({"t": t, "raw": t.data, "pair": (t, 1)})
    for array in (plain["t"], plain["raw"], plain["pair"][0]):
        assert type(array) is np.ndarray and array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert plain["pair"][1] == 1


@pytest.mark.parametrize(
    "value, where",
    [
        ({"model": {"layer": object()}}, "['model']['layer']"),
        ({"a": [1, {2.5}]}, "['a'][1]"),
        ({"x": np.array([object()], dtype=object)}, "dtype object"),
        ({(1, 2): 3}, "keys"),
        ({"f": lambda: None}, "['f']"),
        ({"c": 1 + 2j}, "complex"),
        ({"c": np.complex64(1j)}, "['c']"),  # its .item() is a complex: saved, it could not be read back
        ({"t": np.datetime64("2026-01-01")}, "['t']"),
        ({"key": {np.int64(1): 2}}, "keys"),
    ],
)
def test_to_plain_refuses_anything_else_naming_where(value, where: str) -> None:
    with pytest.raises(CheckpointError) as error:
        to_plain(value)
    assert where in str(error.value)


def test_write_refuses_before_writing_a_byte(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    write_checkpoint(path, {"epoch": 1})
    with pytest.raises(CheckpointError):
        write_checkpoint(path, {"epoch": 2, "model": object()})
    assert read_checkpoint(path) == {"epoch": 1}
    assert os.listdir(tmp_path) == ["c.ckpt"]
    with pytest.raises(CheckpointError, match="reserved"):
        write_checkpoint(path, {"format": "mine"})


def test_the_file_names_only_numpy_globals(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "c.ckpt", STATE)
    named = set()

    class Recorder(pickle.Unpickler):  # an ordinary unpickler that notes every global it looks up
        def find_class(self, module: str, name: str):
            named.add((module, name))
            return super().find_class(module, name)

    with open(tmp_path / "c.ckpt", "rb") as file:
        envelope = Recorder(file).load()  # an ordinary pickle, then the arrays' raw bytes
        arrays = [file.read(size) for size in envelope["sizes"]]
        assert file.read() == b""
    assert named == set() and sorted(envelope) == ["crc32", "format", "header", "sizes", "version"]
    assert envelope["crc32"] == [zlib.crc32(envelope["header"])] + [zlib.crc32(array) for array in arrays]
    assert Recorder(io.BytesIO(envelope["header"]), buffers=arrays).load()["epoch"] == 3
    assert named <= {("numpy._core.numeric", "_frombuffer"), ("numpy", "dtype")}, named


def test_the_arrays_are_written_raw_after_the_header_and_come_back_exactly(tmp_path: Path) -> None:
    """Arrays leave the pickle (protocol 5's out-of-band buffers): their bytes follow it, in their own memory order,
    and are read back in pieces (a 9 MiB array crosses two piece boundaries)."""
    rng = np.random.default_rng(0)
    state = {"big": rng.standard_normal(9 << 18).astype(np.float32), "column_major": np.asfortranarray(np.ones((3, 5))),
             "strided": np.arange(10.0)[::2], "empty": np.zeros((0, 4), np.float16), "ints": np.arange(7, dtype=np.int8),
             "flags": np.array([True, False])}
    write_checkpoint(tmp_path / "c.ckpt", state)
    data = (tmp_path / "c.ckpt").read_bytes()
    assert data.endswith(state["ints"].tobytes() + state["flags"].tobytes())
    assert state["column_major"].tobytes(order="F") in data
    loaded = read_checkpoint(tmp_path / "c.ckpt")
    for key, array in state.items():
        assert loaded[key].dtype == array.dtype and np.array_equal(loaded[key], array), key
        assert loaded[key].flags.writeable, key
    assert loaded["column_major"].flags.f_contiguous
    assert len(data) < state["big"].nbytes + 4096  # one copy of the weights and a small header


def _with_envelope(path: Path, **changes) -> None:
    """Rewrite checkpoint ``path`` with some of its envelope's entries changed, keeping the arrays after it."""
    with open(path, "rb") as file:
        envelope = pickle.load(file)
        rest = file.read()
    path.write_bytes(pickle.dumps({**envelope, **changes}, protocol=5) + rest)


def test_sizes_that_do_not_add_up_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    write_checkpoint(path, STATE)
    with open(path, "rb") as file:
        sizes = pickle.load(file)["sizes"]
    _with_envelope(path, sizes=[2**60, *sizes[1:]])  # were it allocated, this would be an exabyte
    with pytest.raises(CheckpointError, match=r"c.ckpt is truncated or corrupt: its arrays take \d+ bytes, and \d+ "
                                              "follow its header"):
        read_checkpoint(path)
    for malformed in ([-1, *sizes[1:]], [float(size) for size in sizes], "12", sizes[:-1]):
        write_checkpoint(path, STATE)
        _with_envelope(path, sizes=malformed)
        with pytest.raises(CheckpointError, match="c.ckpt is (corrupt|truncated)"):
            read_checkpoint(path)


def test_a_header_that_leaves_an_array_unused_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    write_checkpoint(path, {"a": np.ones(3), "b": np.zeros(2)})
    with open(path, "rb") as file:
        envelope = pickle.load(file)
        rest = file.read()
    header = pickle.dumps({"a": np.ones(3)}, protocol=5, buffer_callback=lambda buffer: False)  # one array, in-band
    sums = [zlib.crc32(header)] + envelope["crc32"][1:]
    path.write_bytes(pickle.dumps({**envelope, "header": header, "crc32": sums}, protocol=5) + rest)
    with pytest.raises(CheckpointError, match="does not account for everything after it"):
        read_checkpoint(path)


def test_a_header_that_asks_for_more_arrays_than_the_file_has_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    buffers = []
    header = pickle.dumps({"a": np.ones(3), "b": np.zeros(2)}, protocol=5, buffer_callback=buffers.append)
    first = buffers[0].raw().tobytes()
    envelope = {"format": "tinytrain-checkpoint", "version": 3, "header": header, "sizes": [len(first)],
                "crc32": [zlib.crc32(header), zlib.crc32(first)]}
    path.write_bytes(pickle.dumps(envelope, protocol=5) + first)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_checkpoint(path)


def test_a_file_of_version_2_with_its_sha256_still_loads(tmp_path: Path) -> None:
    (tmp_path / "old.ckpt").write_bytes(checkpoint_bytes(to_plain(STATE), 2))
    assert_same(to_plain(STATE), read_checkpoint(tmp_path / "old.ckpt"))
    damaged = bytearray(checkpoint_bytes(to_plain(STATE), 2))
    damaged[-40] ^= 1
    (tmp_path / "old.ckpt").write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="old.ckpt is corrupt"):
        read_checkpoint(tmp_path / "old.ckpt")


# -- what a loader must refuse -----------------------------------------------------------------


class MakesAFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


class RunsPython:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({str(self.path)!r}, 'w').close()",))


@pytest.mark.parametrize("payload", [MakesAFile, RunsPython])
@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_pickle_that_would_run_code_is_refused_and_does_nothing(tmp_path: Path, payload, protocol: int) -> None:
    target = tmp_path / "pwned"
    evil = {"format": "tinytrain-checkpoint", "version": 1, "model": {"w": [0.5, 1.5], "x": payload(target)}}
    (tmp_path / "evil.ckpt").write_bytes(pickle.dumps(evil, protocol=protocol))
    with pytest.raises(CheckpointError) as error:
        read_checkpoint(tmp_path / "evil.ckpt")
    if protocol < 2:  # a checkpoint is a pickle of protocol 5: this one is refused before it is unpickled
        assert "evil.ckpt is not a tinytrain checkpoint" in str(error.value)
    else:
        assert re.search(r"evil.ckpt: refusing to load \S+\.(open|exec):.*nothing from it was run", str(error.value))
    assert not target.exists()


def test_object_arrays_and_other_numpy_globals_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "objects.ckpt"
    path.write_bytes(pickle.dumps({"format": "tinytrain-checkpoint", "version": 1, "a": np.array([1, "x"], dtype=object)}))
    with pytest.raises(CheckpointError, match="object"):
        read_checkpoint(path)
    path.write_bytes(pickle.dumps(np.load))
    with pytest.raises(CheckpointError, match="numpy.load"):
        read_checkpoint(path)


def test_truncated_files_get_a_clear_error(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "c.ckpt", STATE)
    data = (tmp_path / "c.ckpt").read_bytes()
    for cut in sorted({0, 1, 2, 10, len(data) // 3, len(data) // 2, len(data) - 1}):
        (tmp_path / "cut.ckpt").write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="truncated or corrupt"):
            read_checkpoint(tmp_path / "cut.ckpt")


def test_trailing_garbage_is_corruption(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "c.ckpt", {"epoch": 1})
    with open(tmp_path / "c.ckpt", "ab") as file:
        file.write(b"\x00junk")
    with pytest.raises(CheckpointError, match="after the end"):
        read_checkpoint(tmp_path / "c.ckpt")


@pytest.mark.parametrize(
    "content, match",
    [
        (pickle.dumps([1, 2, 3]), "not a tinytrain checkpoint.*list"),
        (pickle.dumps({"epoch": 1}), "not a tinytrain checkpoint"),
        (pickle.dumps({"format": "tinytrain-checkpoint", "version": 99}), "version 99"),
        (b"epoch,lr\n1,0.1\n", "not a tinytrain checkpoint.*starts with b'epoch,lr'"),
        (b"\x93NUMPY\x01\x00", "not a tinytrain checkpoint.*npy file"),
        (b"", "truncated or corrupt"),
    ],
)
def test_foreign_files_get_a_clear_error(tmp_path: Path, content: bytes, match: str) -> None:
    (tmp_path / "f.ckpt").write_bytes(content)
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint(tmp_path / "f.ckpt")


@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4))
def test_damaged_files_load_or_raise_checkpoint_error_only(tmp_path_factory, flips) -> None:
    folder = tmp_path_factory.mktemp("damage")
    write_checkpoint(folder / "c.ckpt", STATE)
    data = bytearray((folder / "c.ckpt").read_bytes())
    for position, xor in flips:
        data[position % len(data)] ^= xor
    (folder / "c.ckpt").write_bytes(bytes(data))
    try:
        state = read_checkpoint(folder / "c.ckpt")
    except CheckpointError:
        return
    assert_same(to_plain(STATE), state)  # a flip of the pickle protocol or frame size changes nothing


def test_a_flipped_byte_is_detected_by_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    write_checkpoint(path, STATE)
    data = path.read_bytes()
    weights = data.index(STATE["arrays"]["w"].tobytes())
    for position in [*range(0, len(data), 7), weights + 5]:
        path.write_bytes(data[:position] + bytes([data[position] ^ 0x10]) + data[position + 1:])
        try:
            state = read_checkpoint(path)
        except CheckpointError as error:
            assert str(path) in str(error), error
        else:  # only a flip that changes no value may load: of the pickle protocol, or of the frame size
            assert position in (1, *range(3, 11)), position
            assert_same(to_plain(STATE), state)
    path.write_bytes(data[:weights + 5] + bytes([data[weights + 5] ^ 0x10]) + data[weights + 6:])
    with pytest.raises(CheckpointError, match="c.ckpt is corrupt: the checksum"):
        read_checkpoint(path)


def test_a_file_of_version_1_without_a_checksum_still_loads(tmp_path: Path) -> None:
    old = to_plain({"format": "tinytrain-checkpoint", "version": 1, **STATE})  # as write_checkpoint wrote it
    (tmp_path / "old.ckpt").write_bytes(pickle.dumps(old, protocol=5))
    assert_same(to_plain(STATE), read_checkpoint(tmp_path / "old.ckpt"))


def test_torch_save_and_npz_files_are_named_as_zip_archives(tmp_path: Path) -> None:
    np.savez(tmp_path / "weights.npz", w=np.ones(3))
    files = [tmp_path / "weights.npz"]
    try:
        import torch
    except ImportError:
        pass
    else:
        torch.save({"w": torch.ones(3)}, tmp_path / "model.pt")
        files.append(tmp_path / "model.pt")
    for path in files:
        with pytest.raises(CheckpointError, match=r"not a tinytrain checkpoint.*zip archive, as torch.save and np.savez"):
            read_checkpoint(path)


class ObjectArray:
    """Pickles as ``_reconstruct(ndarray, shape, "O")`` or ``ndarray(shape, "O")``: only the globals a
    checkpoint may name, building an array of Python objects (None), which a model loads as NaN."""

    def __init__(self, build: str) -> None:
        self.build = build

    def __reduce__(self):
        from numpy._core import multiarray

        if self.build == "_reconstruct":
            return (multiarray._reconstruct, (np.ndarray, (2,), "O"))
        return (np.ndarray, ((2,), "O"))


def checkpoint_bytes(state: dict, version: int) -> bytes:
    """A checkpoint file of ``state`` pickled as it is, bypassing write_checkpoint's to_plain."""
    if version == 1:
        return pickle.dumps({"format": "tinytrain-checkpoint", "version": 1, **state}, protocol=5)
    if version == 2:
        payload = pickle.dumps(state, protocol=5)
        return pickle.dumps({"format": "tinytrain-checkpoint", "version": 2,
                             "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}, protocol=5)
    buffers = []
    header = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    arrays = [buffer.raw().tobytes() for buffer in buffers]
    return pickle.dumps({"format": "tinytrain-checkpoint", "version": 3, "header": header,
                         "sizes": [len(array) for array in arrays],
                         "crc32": [zlib.crc32(header)] + [zlib.crc32(array) for array in arrays]},
                        protocol=5) + b"".join(arrays)


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("build", ["_reconstruct", "ndarray"])
def test_an_object_array_built_from_the_allowed_globals_is_refused(tmp_path: Path, build: str, version: int) -> None:
    path = tmp_path / "objects.ckpt"
    path.write_bytes(checkpoint_bytes({"model": {"weight": ObjectArray(build)}}, version))
    with pytest.raises(CheckpointError, match=r"objects.ckpt: refusing .*object"):
        read_checkpoint(path)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("subclass", [
    lambda path: np.memmap(path, np.float32, "w+", shape=(2, 3)),
    lambda path: np.ma.masked_array(np.zeros((2, 3), np.float32), mask=False),
    lambda path: np.asmatrix(np.zeros((2, 3), np.float32)),
], ids=["memmap", "masked", "matrix"])
def test_ndarray_subclasses_become_plain_arrays(tmp_path: Path, subclass) -> None:
    array = subclass(tmp_path / "mapped.bin")
    array[...] = np.arange(6).reshape(2, 3)
    plain = to_plain({"w": array})["w"]
    assert type(plain) is np.ndarray and plain.tolist() == [[0, 1, 2], [3, 4, 5]]
    write_checkpoint(tmp_path / "c.ckpt", {"w": array})
    assert read_checkpoint(tmp_path / "c.ckpt")["w"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_checkpoint(tmp_path / "nope.ckpt")


# -- atomic writes -----------------------------------------------------------------------------


def test_an_exception_while_writing_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    write_checkpoint(path, {"epoch": 1})

    def half_then_fail(file) -> None:
        file.write(b"\x80\x05partial")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(path, half_then_fail)
    assert read_checkpoint(path) == {"epoch": 1}
    assert os.listdir(tmp_path) == ["c.ckpt"]


def test_a_failing_fsync_during_save_checkpoint_keeps_the_previous_one(tmp_path: Path, monkeypatch) -> None:
    model = nn.Linear(3, 2)
    trainer = tt.Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.MSELoss())
    path = tmp_path / "c.ckpt"
    trainer.save_checkpoint(path)
    trainer.epoch = 5

    def broken_fsync(fd: int) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(checkpoint.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="I/O error"):
        trainer.save_checkpoint(path)
    monkeypatch.undo()
    assert read_checkpoint(path)["epoch"] == 0
    assert os.listdir(tmp_path) == ["c.ckpt"]


def test_a_process_killed_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    write_checkpoint(path, {"epoch": 1, "w": np.arange(10.0)})
    before = path.read_bytes()
    script = textwrap.dedent(
        f"""
        import os
        import numpy as np
        from tinytrain import serialization as checkpoint

        real_open = open

        class DiesMidway:  # the machine goes away after the first 100 bytes hit the file
            def __init__(self, file):
                self.file = file
            def write(self, data):
                self.file.write(bytes(data)[:100])
                self.file.flush()
                os._exit(9)

        def dying_dump(obj, file, protocol):
            checkpoint.pickle.Pickler(DiesMidway(file), protocol=protocol).dump(obj)

        checkpoint.pickle.dump = dying_dump
        checkpoint.write_checkpoint({str(path)!r}, {{"epoch": 2, "w": np.zeros(100_000)}})
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr
    assert path.read_bytes() == before
    assert read_checkpoint(path)["epoch"] == 1
    leftovers = [p for p in tmp_path.iterdir() if p.name != "c.ckpt"]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".c.ckpt.") and leftovers[0].stat().st_size == 100


def test_the_next_save_removes_the_temporary_files_of_killed_ones(tmp_path: Path) -> None:
    for name in (".c.ckpt.0123456789ab.tmp", ".c.ckpt.ba9876543210.tmp", ".d.ckpt.0123456789ab.tmp", ".c.ckpt.tmp"):
        (tmp_path / name).write_bytes(b"\x80\x05partial")
    write_checkpoint(tmp_path / "c.ckpt", {"epoch": 1})
    assert sorted(os.listdir(tmp_path)) == [".c.ckpt.tmp", ".d.ckpt.0123456789ab.tmp", "c.ckpt"]


def test_a_save_into_a_missing_folder_names_the_path_given(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cannot write .*nowhere/c.ckpt: the folder .*nowhere does not exist"):
        write_checkpoint(tmp_path / "nowhere" / "c.ckpt", {"epoch": 1})
    assert os.listdir(tmp_path) == []


# -- random states -----------------------------------------------------------------------------


def draw() -> tuple:
    return (random.random(), np.random.rand(), tt.randn(3).numpy().tolist(), tt.rand(2, device="strict").numpy().tolist())


def test_random_states_round_trip_through_a_file(tmp_path: Path) -> None:
    tt.manual_seed(5)
    draw()
    write_checkpoint(tmp_path / "rng.ckpt", {"rng": capture_rng_state()})
    expected = draw()
    tt.manual_seed(6)
    restore_rng_state(read_checkpoint(tmp_path / "rng.ckpt")["rng"])
    assert draw() == expected


def test_a_backend_that_cannot_save_its_state_is_skipped_with_a_warning(monkeypatch) -> None:
    class NoState:
        device = "gpu:0"

        def rng_state(self):
            raise NotImplementedError("not supported yet")

    monkeypatch.setattr(checkpoint, "loaded_backends", lambda: [get_backend("cpu"), NoState()])
    with pytest.warns(RuntimeWarning, match="gpu:0.*not supported yet"):
        state = capture_rng_state()
    assert list(state["backends"]) == ["cpu"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore_rng_state(state)


def test_restoring_the_state_of_an_unknown_device_warns() -> None:
    state = capture_rng_state()
    state["backends"]["tpu:0"] = {"whatever": 1}
    with pytest.warns(RuntimeWarning, match="tpu:0"):
        restore_rng_state(state)


# -- exact resume of a Trainer in a new process ---------------------------------------------------

RUN = textwrap.dedent(
    """
    import numpy as np
    import tinytrain as tt
    from tinytrain import nn
    from tinytrain.data import DataLoader, TensorDataset
    from tinytrain.datasets import Digits

    def make_run():
        digits = Digits(train=True)
        images, labels = digits[np.arange(192)]
        data = TensorDataset(images.reshape(192, 64), labels)
        model = nn.Sequential(
            nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(),
            nn.Sequential(nn.Dropout(0.3), nn.Linear(32, 10)),
        )
        trainer = tt.Trainer(
            model,
            tt.Adam(model.parameters(), lr=0.01),
            nn.CrossEntropyLoss(),
            scheduler=tt.CosineSchedule(max_lr=0.01, min_lr=0.001, total_epochs=4, warmup_epochs=1),
            grad_clip_norm=2.0,
        )
        train = DataLoader(data, batch_size=24, shuffle=True)  # its seed comes from tt.manual_seed
        val = DataLoader(data, batch_size=64)
        return trainer, train, val
    """
)


def test_resume_in_a_new_process_is_bit_identical(tmp_path: Path) -> None:
    namespace: dict = {}
    exec(RUN, namespace)
    make_run = namespace["make_run"]

    tt.manual_seed(0)
    straight, train, val = make_run()
    straight.fit(train, val, epochs=4, accumulation_steps=2, progress=False)

    tt.manual_seed(0)
    first, train, val = make_run()
    first.fit(train, val, epochs=2, accumulation_steps=2, progress=False)
    first.save_checkpoint(tmp_path / "half.ckpt")

    script = RUN + textwrap.dedent(
        f"""
        tt.manual_seed(12345)  # a different start: everything must come from the checkpoint
        trainer, train, val = make_run()
        trainer.load_checkpoint({str(tmp_path / "half.ckpt")!r})
        trainer.fit(train, val, epochs=4, accumulation_steps=2, progress=False)
        state = {{name: t.numpy() for name, t in trainer.model.state_dict().items()}}
        np.savez({str(tmp_path / "resumed.npz")!r}, **state)
        tt.serialization.write_checkpoint({str(tmp_path / "history.ckpt")!r}, {{"history": trainer.history,
                                       "counters": [trainer.epoch, trainer.step]}})
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr

    resumed = np.load(tmp_path / "resumed.npz")
    expected = {name: t.numpy() for name, t in straight.model.state_dict().items()}
    assert sorted(resumed.files) == sorted(expected)
    assert any("running" in name for name in expected), "BatchNorm's running statistics are part of the check"
    for name, array in expected.items():
        assert np.array_equal(resumed[name], array), f"{name} differs after resuming"
    saved = read_checkpoint(tmp_path / "history.ckpt")
    assert saved["counters"] == [straight.epoch, straight.step] == [4, 16]
    for key in ("train_loss", "eval_loss", "eval_accuracy", "learning_rates", "grad_norm", "skipped_steps"):
        assert saved["history"][key] == straight.history[key], key


def test_load_checkpoint_restores_counters_modes_and_history(tmp_path: Path) -> None:
    namespace: dict = {}
    exec(RUN, namespace)
    tt.manual_seed(0)
    trainer, train, val = namespace["make_run"]()
    trainer.fit(train, val, epochs=1, progress=False)
    trainer.model[3].eval()
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    modes = [m.training for m in trainer.model.modules()]

    other, _, _ = namespace["make_run"]()
    other.load_checkpoint(tmp_path / "c.ckpt")
    assert [m.training for m in other.model.modules()] == modes
    assert (other.epoch, other.step) == (trainer.epoch, trainer.step) == (1, 8)
    assert other.history["train_loss"] == trainer.history["train_loss"]
    assert other.optimizer.state_dict()["state"][0]["step"] == trainer.optimizer.state_dict()["state"][0]["step"]


def test_load_checkpoint_refuses_a_checkpoint_that_is_not_a_trainer_s(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    trainer = tt.Trainer(model, tt.SGD(model.parameters(), lr=0.1), nn.MSELoss())
    write_checkpoint(tmp_path / "rng.ckpt", {"rng": capture_rng_state()})
    with pytest.raises(CheckpointError, match="lacks epoch, step, model"):
        trainer.load_checkpoint(tmp_path / "rng.ckpt")
    bigger = nn.Linear(4, 2)
    tt.Trainer(bigger, tt.SGD(bigger.parameters(), lr=0.1), nn.MSELoss()).save_checkpoint(tmp_path / "big.ckpt")
    with pytest.raises(RuntimeError, match="shape"):
        trainer.load_checkpoint(tmp_path / "big.ckpt")


def small_trainer(optimizer: str = "adam", schedule: str = "cosine", seed: int = 0) -> tt.Trainer:
    tt.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    make = {"adam": lambda: tt.Adam(model.parameters(), lr=0.01), "sgd": lambda: tt.SGD(model.parameters(), lr=0.1)}
    schedules = {"cosine": tt.CosineSchedule(0.01, 0.001, total_epochs=4), "none": None,
                 "step": tt.schedules.StepSchedule(0.01, step_size=2)}
    trainer = tt.Trainer(model, make[optimizer](), nn.MSELoss(), scheduler=schedules[schedule])
    data = [(tt.randn(8, 3), tt.randn(8, 2)) for _ in range(2)]
    trainer.fit(data, epochs=1 + seed, progress=False)
    return trainer


RUN_BY_STEPS = textwrap.dedent(
    """
    import numpy as np
    import tinytrain as tt
    from tinytrain import nn
    from tinytrain.data import DataLoader, TokenWindows

    VOCAB, CONTEXT = 11, 8
    TOKENS = np.random.default_rng(0).integers(0, VOCAB, 400)
    FIT = dict(max_steps=30, eval_every=10, eval_batches=3, accumulation_steps=2, progress=False)

    class CharModel(nn.Module):
        \"\"\"Next-character scores from one-hot characters.\"\"\"

        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(VOCAB, 24), nn.LayerNorm(24), nn.GELU(), nn.Dropout(0.2),
                                     nn.Linear(24, VOCAB))

        def forward(self, ids):
            return self.net(tt.tensor(np.eye(VOCAB, dtype=np.float32)[ids.numpy()])).reshape(-1, VOCAB)

    class NextToken:
        reduction = "mean"

        def __call__(self, scores, targets):
            return nn.CrossEntropyLoss()(scores, targets.reshape(-1))

    def make_run():
        model = CharModel()
        optimizer = tt.AdamW(tt.optim.weight_decay_groups(model.parameters(), 0.1), lr=1e-2, betas=(0.9, 0.99))
        schedule = tt.CosineSchedule(max_lr=1e-2, min_lr=1e-3, total_epochs=30, warmup_epochs=5)
        trainer = tt.Trainer(model, optimizer, NextToken(), scheduler=schedule, scheduler_interval="step",
                             grad_clip_norm=1.0)
        cut = int(0.9 * len(TOKENS))  # held-out text: the last 10%
        train = DataLoader(TokenWindows(TOKENS[:cut], CONTEXT), batch_size=16, shuffle=True)  # 22 batches an epoch
        val = DataLoader(TokenWindows(TOKENS[cut:], CONTEXT, stride=CONTEXT), batch_size=1, shuffle=True)
        return trainer, train, val
    """
)


class Killed(Exception):
    """The process dies here."""


class KillAfterSavingAt(tt.callbacks.Callback):
    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_checkpoint(self, trainer, logs) -> None:
        if logs["step"] == self.step:
            trainer.save_checkpoint(self.path)
            raise Killed


def test_a_run_by_steps_killed_mid_run_resumes_bit_identically_in_a_new_process(tmp_path: Path) -> None:
    namespace: dict = {}
    exec(RUN_BY_STEPS, namespace)
    make_run, fit = namespace["make_run"], namespace["FIT"]

    tt.manual_seed(0)
    straight, train, val = make_run()
    straight.fit(train, val, **fit)

    tt.manual_seed(0)
    first, train, val = make_run()
    with pytest.raises(Killed):
        first.fit(train, val, callbacks=[KillAfterSavingAt(20, tmp_path / "step-20.ckpt")], **fit)
    assert train.state_dict()["position"] not in (0, len(train)), "the checkpoint is taken mid-epoch"

    script = RUN_BY_STEPS + textwrap.dedent(
        f"""
        tt.manual_seed(12345)  # a different start: everything must come from the checkpoint
        trainer, train, val = make_run()
        trainer.load_checkpoint({str(tmp_path / "step-20.ckpt")!r})
        trainer.fit(train, val, **FIT)
        tt.serialization.write_checkpoint({str(tmp_path / "resumed.ckpt")!r}, {{
            "model": {{name: t.numpy() for name, t in trainer.model.state_dict().items()}},
            "history": trainer.history, "counters": [trainer.epoch, trainer.step]}})
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr

    resumed = read_checkpoint(tmp_path / "resumed.ckpt")
    assert resumed["counters"] == [straight.epoch, straight.step] == [0, 30]
    for name, tensor in straight.model.state_dict().items():
        assert np.array_equal(resumed["model"][name], tensor.numpy()), f"{name} differs after resuming"
    assert straight.history["step"] == [10, 20, 30]
    for key in ("train_loss", "eval_loss", "learning_rates", "grad_norm", "skipped_steps", "step"):
        assert resumed["history"][key] == straight.history[key], key


def everything_of(trainer: tt.Trainer) -> dict:
    """What a failed load must leave as it was (the next random draws included, taken on a copy of the state)."""
    state = capture_rng_state()
    draws = (random.random(), np.random.rand(), tt.randn(2).numpy().tolist())
    restore_rng_state(state)
    return {"model": {name: t.numpy().tolist() for name, t in trainer.model.state_dict().items()},
            "optimizer": repr(trainer.optimizer.state_dict()),
            "scheduler": trainer.scheduler and repr(trainer.scheduler.state_dict()),
            "counters": (trainer.epoch, trainer.step, trainer.skipped_steps), "history": repr(trainer.history),
            "modes": [m.training for m in trainer.model.modules()], "pending": repr(trainer._pending), "draws": draws}


@pytest.mark.parametrize("optimizer, schedule, error", [
    ("sgd", "cosine", "SGD optimizer into a Adam"),
    ("adam", "step", "StepSchedule.* into a CosineSchedule"),
])
def test_a_checkpoint_of_another_optimizer_or_schedule_changes_nothing(tmp_path: Path, optimizer: str, schedule: str,
                                                                       error: str) -> None:
    small_trainer(optimizer, schedule, seed=2).save_checkpoint(tmp_path / "other.ckpt")
    trainer = small_trainer()
    trainer.model.eval()
    before = everything_of(trainer)
    with pytest.raises(ValueError, match=error):
        trainer.load_checkpoint(tmp_path / "other.ckpt")
    assert everything_of(trainer) == before


def test_a_checkpoint_with_a_schedule_is_refused_by_a_trainer_without_one(tmp_path: Path) -> None:
    """Dropping the schedule would keep the optimizer at the saved rate for good: not a complete load."""
    small_trainer(seed=2).save_checkpoint(tmp_path / "c.ckpt")
    trainer = small_trainer(schedule="none")
    before = everything_of(trainer)
    with pytest.raises(ValueError, match=re.escape("c.ckpt holds the state of a CosineSchedule, but this trainer has "
                                                   "no scheduler; pass one as Trainer(..., scheduler=...)")):
        trainer.load_checkpoint(tmp_path / "c.ckpt")
    assert everything_of(trainer) == before
    small_trainer(schedule="none", seed=2).save_checkpoint(tmp_path / "plain.ckpt")
    small_trainer().load_checkpoint(tmp_path / "plain.ckpt")  # a schedule added on resuming is the trainer's choice


@pytest.mark.parametrize("field, value, shown", [
    ("model", [1.0, 2.0], "'model' must be a dict of arrays by name, got [1.0, 2.0]"),
    ("epoch", "three", "'epoch' must be a whole number >= 0, got 'three'"),
    ("step", -1, "'step' must be a whole number >= 0, got -1"),
    ("skipped_steps", 1.5, "'skipped_steps' must be a whole number >= 0, got 1.5"),
    ("epoch", True, "'epoch' must be a whole number >= 0, got True"),
    ("optimizer", None, "'optimizer' must be a dict, got None"),
    ("scheduler", "cosine", "'scheduler' must be None or a dict, got 'cosine'"),
    ("history", {"train_loss": 0.5}, "'history' must be a dict of lists, got {'train_loss': 0.5}"),
    ("modes", "train", "'modes' must be a list of booleans, got 'train'"),
    ("callbacks", [], "'callbacks' must be a dict, got []"),
])
def test_a_malformed_field_is_refused_naming_it_and_changes_nothing(tmp_path: Path, field: str, value,
                                                                     shown: str) -> None:
    small_trainer(seed=2).save_checkpoint(tmp_path / "c.ckpt")
    state = read_checkpoint(tmp_path / "c.ckpt")
    write_checkpoint(tmp_path / "c.ckpt", {**state, field: value})
    trainer = small_trainer()
    before = everything_of(trainer)
    with pytest.raises(CheckpointError, match=re.escape(f"c.ckpt: {shown}")):
        trainer.load_checkpoint(tmp_path / "c.ckpt")
    assert everything_of(trainer) == before


def test_a_load_that_fails_at_the_random_states_is_undone(tmp_path: Path) -> None:
    small_trainer(seed=2).save_checkpoint(tmp_path / "c.ckpt")
    state = read_checkpoint(tmp_path / "c.ckpt")
    state["rng"]["numpy"] = {"bit_generator": "PCG64", "state": "broken"}  # Python's is restored first, then this
    write_checkpoint(tmp_path / "c.ckpt", state)
    trainer = small_trainer()
    before = everything_of(trainer)
    with pytest.raises(ValueError, match="MT19937"):
        trainer.load_checkpoint(tmp_path / "c.ckpt")
    assert everything_of(trainer) == before
