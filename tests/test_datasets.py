"""tinytrain.datasets: the shipped Digits, the IDX and CIFAR parsers, downloads
(with the network replaced), the cache directory and ``root=`` folders.

No test touches the network: an autouse fixture makes ``urllib.request.urlopen``
and socket connections fail loudly unless a test installs its own fake server,
and points the cache (``TINYTRAIN_DATA``) at a temporary folder. MNIST- and
CIFAR-format files are written by the tests themselves, in the real formats.
"""
from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import pickle
import re
import socket
import struct
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import tinytrain as tt
from tinytrain.datasets import images
from tinytrain.datasets import text as text_module
from tinytrain.data import DataLoader
from tinytrain.datasets import (
    CIFAR10,
    MNIST,
    ChecksumError,
    Digits,
    DownloadError,
    FashionMNIST,
    data_dir,
    digits_split,
    download_file,
    parse_cifar_batch,
    parse_idx,
    read_idx,
    shakespeare,
)


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No network, and a private cache folder, for every test in this file."""

    def no_network(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("TINYTRAIN_DATA", str(tmp_path / "cache"))


def serve(monkeypatch, routes: dict):
    """Replace ``urlopen`` by a fake server: url -> bytes, or an exception to raise."""
    calls = []

    def urlopen(request, timeout=None):
        url = getattr(request, "full_url", request)
        calls.append(url)
        outcome = routes.get(url, urllib.error.URLError("[Errno -3] Temporary failure in name resolution"))
        if isinstance(outcome, BaseException):
            raise outcome
        return io.BytesIO(outcome)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return calls


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- writing files in the real formats (independently of the parsers under test) ------

_IDX_CODES = {np.dtype("uint8"): 0x08, np.dtype("int8"): 0x09, np.dtype("int16"): 0x0B,
              np.dtype("int32"): 0x0C, np.dtype("float32"): 0x0D, np.dtype("float64"): 0x0E}


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, _IDX_CODES[array.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def mnist_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def mnist_files(n_train: int = 6, n_test: int = 4) -> dict[str, bytes]:
    """gzip-compressed IDX files named like MNIST's, and the arrays they hold."""
    files = {}
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        images, labels = mnist_arrays(n, seed)
        files[f"{prefix}-images-idx3-ubyte.gz"] = gzip.compress(idx_bytes(images), mtime=0)
        files[f"{prefix}-labels-idx1-ubyte.gz"] = gzip.compress(idx_bytes(labels), mtime=0)
    return files


def cifar_batch(n: int, seed: int, protocol: int = 2) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A pickled CIFAR-10 batch: dict of bytes keys, uint8 data (n, 3072), list labels."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, n)]
    batch = {b"batch_label": b"testing batch", b"labels": labels, b"data": data,
             b"filenames": [b"img_%d.png" % i for i in range(n)]}
    return pickle.dumps(batch, protocol=protocol), data, np.array(labels)


def cifar_folder(folder: Path, sizes=(3, 2, 2, 1, 2), test_size=3) -> dict[str, tuple]:
    folder.mkdir(parents=True, exist_ok=True)
    contents = {}
    for name, n in [*((f"data_batch_{i + 1}", s) for i, s in enumerate(sizes)), ("test_batch", test_size)]:
        raw, data, labels = cifar_batch(n, seed=len(contents))
        (folder / name).write_bytes(raw)
        contents[name] = (raw, data, labels)
    return contents


def tar_gz(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    return buffer.getvalue()


# -- Digits ---------------------------------------------------------------------------------


def test_digits_shapes_counts_and_values():
    train, test = Digits(train=True), Digits(train=False)
    assert (len(train), len(test)) == (1437, 360)
    assert train.images.shape == (1437, 1, 8, 8) and test.images.shape == (360, 1, 8, 8)
    for ds in (train, test):
        assert ds.images.dtype == np.float32 and ds.labels.dtype == np.int64
        assert ds.images.min() == 0.0 and ds.images.max() == 1.0
        assert ds.pixels.dtype == np.uint8 and ds.pixels.max() == 16
        np.testing.assert_array_equal(ds.images * 16, ds.pixels)  # exact: k/16 is a float32
        assert ds.targets is ds.labels
    assert train.classes == tuple("0123456789")
    image, label = train[0]
    assert image.shape == (1, 8, 8) and image.dtype == np.float32 and 0 <= label <= 9


def test_digits_label_balance():
    train, test = Digits(train=True), Digits(train=False)
    np.testing.assert_array_equal(np.bincount(test.labels), [36] * 10)
    total = np.bincount(train.labels) + np.bincount(test.labels)
    np.testing.assert_array_equal(total, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])  # the UCI counts


def test_digits_split_is_deterministic_stratified_and_disjoint():
    pixels, labels = images._digits_arrays()
    train, test = digits_split(labels)
    again_train, again_test = digits_split(labels)
    np.testing.assert_array_equal(train, again_train)
    np.testing.assert_array_equal(test, again_test)
    assert len(np.intersect1d(train, test)) == 0
    np.testing.assert_array_equal(np.union1d(train, test), np.arange(1797))
    # Pinned: the split must never change between versions of NumPy or tinytrain.
    assert hashlib.sha256(test.astype("<i8").tobytes()).hexdigest() == (
        "45bbd4272839e7eaf5b68f6ceffd91a76382cb3aaec6f16437b3b31302c32aa6"
    )
    np.testing.assert_array_equal(Digits(train=False).pixels[:, 0], pixels[test])
    np.testing.assert_array_equal(Digits(train=True).labels, labels[train])


def test_digits_file_checksum_is_verified(monkeypatch):
    from importlib.resources import files

    shipped = (files("tinytrain.datasets") / "files" / "digits.npz").read_bytes()
    assert sha256(shipped) == images.DIGITS_SHA256
    assert len(shipped) < 100_000
    monkeypatch.setattr(images, "DIGITS_SHA256", "0" * 64)
    with pytest.raises(ChecksumError) as error:
        Digits()
    assert "0" * 64 in str(error.value) and sha256(shipped) in str(error.value)


def test_shakespeare_ships_compressed_and_is_checked_on_every_call(monkeypatch):
    from importlib.resources import files

    text = shakespeare()
    assert len(text) == 1_115_394 and text.count("\n") == 40_000 and len(set(text)) == 65
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")
    assert sha256(text.encode("utf-8")) == text_module.SHAKESPEARE_SHA256
    assert len((files("tinytrain.datasets") / "files" / "tinyshakespeare.txt.gz").read_bytes()) < 450_000
    monkeypatch.setattr(text_module, "SHAKESPEARE_SHA256", "0" * 64)
    with pytest.raises(ChecksumError) as error:
        shakespeare()
    assert "0" * 64 in str(error.value) and sha256(text.encode("utf-8")) in str(error.value)


def test_digits_works_with_the_loaders_fast_path(device, canonical_device):
    loader = DataLoader(Digits(), batch_size=64, shuffle=True, seed=0, device=device)
    assert len(loader) == 23
    xb, yb = next(iter(loader))
    assert xb.shape == (64, 1, 8, 8) and xb.dtype == np.float32 and yb.dtype == np.int64
    assert xb.device == canonical_device
    assert sorted(np.concatenate([y.numpy() for _, y in loader]).tolist()) == sorted(Digits().labels.tolist())


# -- IDX parser -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
def test_idx_round_trip_for_every_type_code(dtype):
    array = (np.arange(24) - 7).reshape(2, 3, 4).astype(dtype)
    if dtype == "uint8":
        array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    parsed = parse_idx(idx_bytes(array))
    assert parsed.shape == (2, 3, 4) and parsed.dtype == np.dtype(dtype)
    assert parsed.dtype.isnative and parsed.flags.writeable
    np.testing.assert_array_equal(parsed, array)


def test_idx_is_big_endian():
    data = bytes([0, 0, 0x0B, 1]) + struct.pack(">I", 2) + b"\x01\x02\xff\xfe"
    np.testing.assert_array_equal(parse_idx(data), [0x0102, -2])


def test_idx_header_of_mnist_images():
    images, _ = mnist_arrays(3, seed=0)
    data = idx_bytes(images)
    assert data[:16] == bytes.fromhex("00000803") + struct.pack(">3I", 3, 28, 28)  # magic 2051
    np.testing.assert_array_equal(parse_idx(data), images)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "magic number"),
        (b"\x00\x01\x08\x01", "magic number 00010801"),
        (b"\x00\x00\x07\x01", "magic number"),
        (b"\x00\x00\x08\x02\x00\x00", "truncated"),
        (bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + b"abc", r"11 bytes.*shape \(5,\).*13 bytes"),
        (bytes([0, 0, 8, 1]) + struct.pack(">I", 2) + b"abc", r"shape \(2,\)"),
    ],
    ids=["empty", "bad-zeros", "bad-type", "truncated-header", "short", "long"],
)
def test_idx_errors_name_the_problem(data, message):
    with pytest.raises(ValueError, match=message):
        parse_idx(data)


def test_read_idx_errors_name_the_file(tmp_path):
    (tmp_path / "bad-header").write_bytes(b"\x00\x01\x08\x01" + bytes(4))
    with pytest.raises(ValueError, match=r"bad-header: not an IDX file: magic number 00010801"):
        read_idx(tmp_path / "bad-header")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(8, dtype=np.uint8)))[:-6])
    with pytest.raises(ValueError, match=r"cut\.gz: "):
        read_idx(tmp_path / "cut.gz")


def test_read_idx_reads_gzip_and_raw_files(tmp_path):
    images, _ = mnist_arrays(2, seed=3)
    (tmp_path / "raw").write_bytes(idx_bytes(images))
    (tmp_path / "compressed").write_bytes(gzip.compress(idx_bytes(images)))
    np.testing.assert_array_equal(read_idx(tmp_path / "raw"), images)
    np.testing.assert_array_equal(read_idx(tmp_path / "compressed"), images)


# -- CIFAR parser ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 4])
def test_cifar_batch_layout(protocol):
    raw, data, labels = cifar_batch(4, seed=0, protocol=protocol)
    pixels, parsed_labels = parse_cifar_batch(raw)
    assert pixels.shape == (4, 3, 32, 32) and pixels.dtype == np.uint8
    assert parsed_labels.dtype == np.int64
    np.testing.assert_array_equal(parsed_labels, labels)
    # per image: 1024 red values, then 1024 green, then 1024 blue, each row by row
    np.testing.assert_array_equal(pixels[2, 0], data[2, :1024].reshape(32, 32))
    np.testing.assert_array_equal(pixels[2, 1, 5], data[2, 1024 + 5 * 32 : 1024 + 6 * 32])
    np.testing.assert_array_equal(pixels[3, 2, 31, 31], data[3, 3071])


def py2_cifar_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch as Python 2 with NumPy 1.x pickled the real ones, opcode by opcode.

    Python 2 ``str`` values are (SHORT_)BINSTRINGs, which ``encoding="bytes"``
    reads as bytes; the array is ``numpy.core.multiarray._reconstruct`` + BUILD
    with the raw pixel bytes; the dtype is ``dtype('u1', 0, 1)`` + BUILD.
    """

    def string(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def integer(n: int) -> bytes:
        if n < 256:
            return b"K" + bytes([n])
        return b"M" + struct.pack("<H", n) if n < 65536 else b"J" + struct.pack("<i", n)

    rows, cols = data.shape
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + integer(0) + b"\x85" + string(b"b") + b"\x87R"
        + b"(" + integer(1) + integer(rows) + integer(cols) + b"\x86"
        + b"cnumpy\ndtype\n" + string(b"u1") + integer(0) + integer(1) + b"\x87R"
        + b"(" + integer(3) + string(b"|") + b"NNN" + b"J\xff\xff\xff\xff" * 2 + integer(0) + b"tb"
        + b"\x89" + string(data.tobytes()) + b"tb"
    )
    labels_list = b"](" + b"".join(integer(v) for v in labels) + b"e"
    return b"\x80\x02}(" + string(b"data") + array + string(b"labels") + labels_list + b"u."


def test_cifar_batch_pickled_by_python2_and_numpy1_is_read():
    data = np.random.default_rng(0).integers(0, 256, (3, 3072), dtype=np.uint8)
    raw = py2_cifar_pickle(data, [3, 7, 0])
    assert pickle.loads(raw, encoding="latin1")["labels"] == [3, 7, 0]  # a valid pickle by the standard
    pixels, labels = parse_cifar_batch(raw)
    np.testing.assert_array_equal(pixels.reshape(3, -1), data)
    np.testing.assert_array_equal(labels, [3, 7, 0])


def test_cifar_batch_naming_numpy_core_is_read():
    """Batches pickled by NumPy 1.x name ``numpy.core``; NumPy 2 names ``numpy._core``."""
    raw, data, labels = cifar_batch(2, seed=1)
    legacy = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    pixels, _ = parse_cifar_batch(legacy)
    np.testing.assert_array_equal(pixels.reshape(2, -1), data)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_cifar_parser_refuses_code_in_a_pickle():
    payload = pickle.dumps({b"data": _Evil(), b"labels": []}, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        parse_cifar_batch(payload)


@pytest.mark.parametrize(
    "obj, message",
    [
        ([1, 2], "list"),
        ({b"labels": [1]}, "keys"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [1, 2]}, "uint8"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1]}, "2 images"),
        ({b"data": np.zeros((3, 3072), np.uint8), b"labels": [3, 10, -1]},
         re.escape("label 10 at index 1 (2 label(s) outside 0..9)")),
    ],
    ids=["not-a-dict", "no-data", "float-data", "label-count", "label-range"],
)
def test_cifar_parser_rejects_other_pickles(obj, message):
    with pytest.raises(ValueError, match=message):
        parse_cifar_batch(pickle.dumps(obj, protocol=2))


# -- downloads (network replaced) ---------------------------------------------------------


def test_download_success_writes_the_file_atomically(monkeypatch, tmp_path):
    payload = b"hello, dataset" * 1000
    calls = serve(monkeypatch, {"https://a.example/f.gz": payload})
    target = tmp_path / "cache" / "f.gz"
    assert download_file(["https://a.example/f.gz"], target, sha256(payload)) == target
    assert target.read_bytes() == payload
    assert sorted(os.listdir(target.parent)) == ["f.gz"]  # no temporary file left
    assert calls == ["https://a.example/f.gz"]


def test_checksum_mismatch_leaves_no_file_and_names_both_digests(monkeypatch, tmp_path):
    served = b"not the published file"
    serve(monkeypatch, {"https://a.example/f.gz": served, "https://mirror.example/f.gz": served})
    expected = sha256(b"the published file")
    folder = tmp_path / "cache"
    with pytest.raises(ChecksumError) as error:
        download_file(["https://a.example/f.gz", "https://mirror.example/f.gz"], folder / "f.gz", expected)
    message = str(error.value)
    assert expected in message and sha256(served) in message and "SHA256" in message
    assert os.listdir(folder) == []


def test_offline_error_names_every_url_and_root(monkeypatch, tmp_path):
    serve(monkeypatch, {})
    urls = ["http://primary.example/f.gz", "https://mirror.example/f.gz"]
    with pytest.raises(DownloadError) as error:
        download_file(urls, tmp_path / "cache" / "f.gz", "0" * 64)
    message = str(error.value)
    assert all(url in message for url in urls)
    assert "root=" in message and "name resolution" in message
    assert isinstance(error.value, OSError)
    assert os.listdir(tmp_path / "cache") == []


def test_fallback_mirror_is_used_when_the_first_url_fails(monkeypatch, tmp_path):
    payload = b"mnist bytes"
    calls = serve(monkeypatch, {
        "http://primary.example/f.gz": urllib.error.HTTPError(
            "http://primary.example/f.gz", 403, "Forbidden", {}, None
        ),
        "https://mirror.example/f.gz": payload,
    })
    target = download_file(["http://primary.example/f.gz", "https://mirror.example/f.gz"],
                           tmp_path / "cache" / "f.gz", sha256(payload))
    assert target.read_bytes() == payload
    assert calls == ["http://primary.example/f.gz", "https://mirror.example/f.gz"]


def test_a_mirror_serving_wrong_bytes_is_skipped(monkeypatch, tmp_path):
    payload = b"right"
    serve(monkeypatch, {"https://a.example/f": b"wrong", "https://b.example/f": payload})
    target = download_file(["https://a.example/f", "https://b.example/f"], tmp_path / "f", sha256(payload))
    assert target.read_bytes() == payload


def test_a_download_cut_off_midway_leaves_nothing(monkeypatch, tmp_path):
    class Broken(io.BytesIO):
        def read(self, size=-1):
            if self.tell() > 0:
                raise ConnectionResetError("connection reset by peer")
            return super().read(4)

    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout=None: Broken(b"0123456789"))
    with pytest.raises(DownloadError, match="connection reset"):
        download_file(["https://a.example/f"], tmp_path / "cache" / "f", "0" * 64)
    assert os.listdir(tmp_path / "cache") == []


def test_a_cache_that_cannot_be_written_is_not_called_offline_and_tries_no_mirror(monkeypatch, tmp_path):
    """A read-only or full disk is reported as such, not as 'Are you offline?' after trying every mirror."""
    payload = b"mnist bytes"
    calls = serve(monkeypatch, {"https://a.example/f.gz": payload, "https://mirror.example/f.gz": payload})

    def full_disk(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)  # the file is written, then flushing it to disk fails
    with pytest.raises(OSError) as error:
        download_file(["https://a.example/f.gz", "https://mirror.example/f.gz"], tmp_path / "f.gz", sha256(payload))
    assert not isinstance(error.value, DownloadError) and error.value.errno == errno.ENOSPC
    assert f"cannot save {tmp_path / 'f.gz'}: No space left on device; set TINYTRAIN_DATA" in str(error.value)
    assert "offline" not in str(error.value)
    assert calls == ["https://a.example/f.gz"]  # no mirror tried: it would fail the same way
    assert os.listdir(tmp_path) == []  # nothing half-written


# -- MNIST and Fashion-MNIST ------------------------------------------------------------------


def test_mnist_downloads_into_the_cache_then_works_offline(monkeypatch, tmp_path):
    files = mnist_files()
    monkeypatch.setattr(MNIST, "sha256", {name: sha256(data) for name, data in files.items()})
    calls = serve(monkeypatch, {MNIST.mirrors[0] + name: data for name, data in files.items()})
    train = MNIST(train=True)
    assert len(train) == 6 and train.images.shape == (6, 1, 28, 28)
    images, labels = mnist_arrays(6, seed=1)
    np.testing.assert_allclose(train.images[:, 0], images / np.float32(255))
    np.testing.assert_array_equal(train.labels, labels)
    assert train.labels.dtype == np.int64 and train.images.max() <= 1.0
    cached = sorted(os.listdir(tmp_path / "cache" / "mnist"))
    assert cached == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
    assert len(calls) == 2
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("cached files must not be fetched"))
    assert len(MNIST(train=True)) == 6
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte"):
        MNIST(train=False, download=False)


def test_mnist_uses_the_fallback_mirror(monkeypatch):
    files = mnist_files()
    monkeypatch.setattr(MNIST, "sha256", {name: sha256(data) for name, data in files.items()})
    calls = serve(monkeypatch, {MNIST.mirrors[1] + name: data for name, data in files.items()})
    assert len(MNIST(train=False)) == 4
    assert calls[:2] == [MNIST.mirrors[0] + "t10k-images-idx3-ubyte.gz", MNIST.mirrors[1] + "t10k-images-idx3-ubyte.gz"]


def test_mnist_offline_error_is_clear(monkeypatch, tmp_path):
    serve(monkeypatch, {})
    with pytest.raises(DownloadError) as error:
        MNIST()
    message = str(error.value)
    assert all(mirror + "train-images-idx3-ubyte.gz" in message for mirror in MNIST.mirrors)
    assert "root=" in message
    assert os.listdir(tmp_path / "cache" / "mnist") == []


def test_mnist_published_checksums_are_checked(monkeypatch, tmp_path):
    files = mnist_files()
    serve(monkeypatch, {MNIST.mirrors[0] + name: data for name, data in files.items()})
    with pytest.raises(ChecksumError) as error:
        MNIST()
    assert MNIST.sha256["train-images-idx3-ubyte.gz"] in str(error.value)
    assert sha256(files["train-images-idx3-ubyte.gz"]) in str(error.value)
    assert os.listdir(tmp_path / "cache" / "mnist") == []


@pytest.mark.parametrize("layout", ["", "raw", "MNIST/raw"])
def test_mnist_root_with_gz_files_needs_no_network(monkeypatch, tmp_path, layout):
    files = mnist_files()
    folder = tmp_path / "mnist" / layout
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    monkeypatch.setattr(MNIST, "sha256", {name: sha256(data) for name, data in files.items()})
    train = MNIST(root=tmp_path / "mnist", train=True)
    test = MNIST(root=str(tmp_path / "mnist"), train=False)
    assert (len(train), len(test)) == (6, 4)
    assert not (tmp_path / "cache").exists()


def test_mnist_root_with_uncompressed_files(tmp_path):
    for prefix, n, seed in (("train", 5, 7), ("t10k", 3, 8)):
        images, labels = mnist_arrays(n, seed)
        (tmp_path / f"{prefix}-images-idx3-ubyte").write_bytes(idx_bytes(images))
        (tmp_path / f"{prefix}-labels.idx1-ubyte").write_bytes(idx_bytes(labels))  # some copies use a dot
    train = MNIST(root=tmp_path, download=False)
    np.testing.assert_array_equal(train.pixels[:, 0], mnist_arrays(5, 7)[0])
    assert len(MNIST(root=tmp_path, train=False, download=False)) == 3


def test_mnist_root_with_a_corrupt_gz_file_raises(tmp_path):
    files = mnist_files()
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(ChecksumError, match="train-images-idx3-ubyte.gz"):
        MNIST(root=tmp_path)


def test_mnist_rejects_inconsistent_files(tmp_path):
    images, labels = mnist_arrays(4, seed=0)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(idx_bytes(images))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(labels[:3]))
    with pytest.raises(ValueError, match=r"\(4, 28, 28\).*\(3,\)"):
        MNIST(root=tmp_path, download=False)


def test_mnist_labels_out_of_range_are_named(tmp_path):
    images, labels = mnist_arrays(4, seed=0)
    labels[2] = 12
    (tmp_path / "train-images-idx3-ubyte").write_bytes(idx_bytes(images))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte holds label 12 at index 2 .*0\.\.9"):
        MNIST(root=tmp_path, download=False)


def test_fashion_mnist_has_its_own_cache_mirrors_and_classes(monkeypatch, tmp_path):
    files = mnist_files()
    monkeypatch.setattr(FashionMNIST, "sha256", {name: sha256(data) for name, data in files.items()})
    serve(monkeypatch, {FashionMNIST.mirrors[-1] + name: data for name, data in files.items()})
    test = FashionMNIST(train=False)
    assert len(test) == 4 and test.classes[9] == "Ankle boot" and len(test.classes) == 10
    assert (tmp_path / "cache" / "fashion-mnist" / "t10k-images-idx3-ubyte.gz").is_file()
    assert "fashion-mnist" in FashionMNIST.mirrors[0]
    assert FashionMNIST.sha256 is not MNIST.sha256


def test_mnist_batches_through_the_loader(monkeypatch, tmp_path):
    files = mnist_files(n_train=10)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.setattr(MNIST, "sha256", {name: sha256(data) for name, data in files.items()})
    xb, yb = next(iter(DataLoader(MNIST(root=tmp_path), batch_size=4, shuffle=True, seed=0)))
    assert xb.shape == (4, 1, 28, 28) and xb.dtype == np.float32 and yb.dtype == np.int64


# -- CIFAR-10 ---------------------------------------------------------------------------------


def _patch_cifar_md5(monkeypatch, contents):
    digests = {name: hashlib.md5(raw).hexdigest() for name, (raw, _, _) in contents.items()}
    monkeypatch.setattr(CIFAR10, "batch_md5", digests)


@pytest.mark.parametrize("inside", [True, False], ids=["batches-folder", "parent-folder"])
def test_cifar_root_with_extracted_batches(monkeypatch, tmp_path, inside):
    contents = cifar_folder(tmp_path / "cifar-10-batches-py")
    _patch_cifar_md5(monkeypatch, contents)
    root = tmp_path / "cifar-10-batches-py" if inside else tmp_path
    train, test = CIFAR10(root=root, download=False), CIFAR10(root=root, train=False, download=False)
    assert len(train) == 10 and len(test) == 3
    assert train.images.shape == (10, 3, 32, 32) and train.images.dtype == np.float32
    expected = np.concatenate([contents[f"data_batch_{i}"][1] for i in range(1, 6)])
    np.testing.assert_array_equal(train.pixels.reshape(10, -1), expected)
    np.testing.assert_array_equal(test.labels, contents["test_batch"][2])
    assert train.classes[0] == "airplane" and len(train.classes) == 10


def test_cifar_extracted_batches_are_checked_with_md5(tmp_path):
    cifar_folder(tmp_path)
    with pytest.raises(ChecksumError, match="MD5.*data_batch_1"):
        CIFAR10(root=tmp_path, download=False)


def test_cifar_root_with_the_archive(monkeypatch, tmp_path):
    contents = cifar_folder(tmp_path / "build" / "cifar-10-batches-py")
    archive = tar_gz(tmp_path / "build" / "cifar-10-batches-py")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "cifar-10-python.tar.gz").write_bytes(archive)
    monkeypatch.setattr(CIFAR10, "sha256", sha256(archive))
    test = CIFAR10(root=tmp_path / "root", train=False)
    np.testing.assert_array_equal(test.pixels.reshape(3, -1), contents["test_batch"][1])
    assert os.listdir(tmp_path / "root") == ["cifar-10-python.tar.gz"]  # nothing extracted to disk
    monkeypatch.setattr(CIFAR10, "sha256", "0" * 64)
    with pytest.raises(ChecksumError, match="0" * 64):
        CIFAR10(root=tmp_path / "root", train=False)


def test_cifar_downloads_the_archive(monkeypatch, tmp_path):
    cifar_folder(tmp_path / "build" / "cifar-10-batches-py")
    archive = tar_gz(tmp_path / "build" / "cifar-10-batches-py")
    monkeypatch.setattr(CIFAR10, "sha256", sha256(archive))
    calls = serve(monkeypatch, {CIFAR10.urls[0]: archive})
    assert len(CIFAR10(train=True)) == 10
    assert (tmp_path / "cache" / "cifar-10" / "cifar-10-python.tar.gz").read_bytes() == archive
    assert len(CIFAR10(train=False)) == 3 and len(calls) == 1


def test_cifar_offline_and_missing_errors(monkeypatch, tmp_path):
    serve(monkeypatch, {})
    with pytest.raises(DownloadError, match="cs.toronto.edu.*\n.*root="):
        CIFAR10()
    with pytest.raises(FileNotFoundError, match="cifar-10-python.tar.gz"):
        CIFAR10(root=tmp_path, download=False)


# -- cache directory --------------------------------------------------------------------------


def test_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYTRAIN_DATA", str(tmp_path / "mine"))
    assert data_dir() == tmp_path / "mine"
    monkeypatch.delenv("TINYTRAIN_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "tinytrain"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home" / ".cache" / "tinytrain"


def test_package_exports():
    assert tt.datasets.Digits is Digits and tt.data.DataLoader is DataLoader
