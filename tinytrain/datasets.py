"""Image datasets: the shipped 8x8 ``Digits``, and ``MNIST``, ``FashionMNIST``, ``CIFAR10``.

Hand-written, not generated: downloading and file formats are not part of the
course. Every dataset here is a :class:`tinytrain.data.TensorDataset` of
``(image, label)`` samples: images float32 in [0, 1] with shape ``(C, H, W)``,
labels int64 class indices, ``classes`` the class names. The pixels are kept as
uint8 (``.pixels``, a quarter of the memory) and scaled to float32 only for the
samples or batch being read, so the DataLoader's fast path gathers a batch with
one fancy index and converts just that batch. ``.images`` is the whole set as
float32 (a new array on every access); ``.labels`` (alias ``.targets``) the
labels.

Where the files come from:

* ``Digits`` ships inside the package (``tinytrain/_data/digits.npz``, 45 kB,
  provenance and licence in ``tinytrain/_data/README.md``); its SHA-256 is
  checked on every load. No network, no Git LFS.
* ``MNIST``, ``FashionMNIST`` and ``CIFAR10`` are downloaded once from their
  published locations, falling back to mirrors, into the cache directory
  ``$TINYTRAIN_DATA`` (default ``$XDG_CACHE_HOME/tinytrain`` or
  ``~/.cache/tinytrain``). Each download is checked against a published
  SHA-256 and written atomically (temporary file, fsync, rename): a failed or
  mismatching download leaves nothing behind. ``root=`` names a folder that
  already holds the standard files; then no network is touched at all.

Checksums (all published by others, none computed here):

* MNIST and Fashion-MNIST ``.gz`` files: SHA-256 from TensorFlow Datasets'
  ``url_checksums/mnist.txt`` and ``fashion_mnist.txt``;
* ``cifar-10-python.tar.gz``: SHA-256 from Keras' ``keras/datasets/cifar10.py``;
* the files inside ``cifar-10-batches-py/`` (for a ``root=`` folder that holds
  the extracted batches): only MD5s are published (torchvision's
  ``datasets/cifar.py``), so those are checked with MD5 — which catches
  corruption, not tampering; see :func:`parse_cifar_batch` for why that is
  still safe to parse.
* Uncompressed IDX files in a ``root=`` folder have no published digest; they
  are parsed with full validation of the header and sizes instead.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import os
import pickle
import struct
import sys
import tarfile
from pathlib import Path
from typing import Any, BinaryIO, Sequence

import numpy as np

from tinytrain.serialization import atomic_write
from tinytrain.data import TensorDataset

__all__ = [
    "CIFAR10",
    "ChecksumError",
    "Digits",
    "DownloadError",
    "FashionMNIST",
    "ImageDataset",
    "MNIST",
    "data_dir",
    "digits_split",
    "download_file",
    "file_digest",
    "parse_cifar_batch",
    "parse_idx",
    "read_idx",
]

_CHUNK = 1 << 20


class ChecksumError(ValueError):
    """A file's digest differs from the published one."""

    def __init__(self, what: str, algorithm: str, expected: str, actual: str, hint: str = "") -> None:
        message = f"{algorithm.upper()} checksum mismatch for {what}: expected {expected}, got {actual}"
        super().__init__(message + (f"; {hint}" if hint else ""))
        self.what = what
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual


class DownloadError(OSError):
    """No URL of a file could be downloaded (offline, or every server failed)."""


def data_dir() -> Path:
    """The cache directory: ``$TINYTRAIN_DATA``, else ``<user cache dir>/tinytrain``."""
    configured = os.environ.get("TINYTRAIN_DATA")
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "tinytrain"


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """The hex digest of a file, read in chunks."""
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(path: Path, algorithm: str, expected: str) -> None:
    actual = file_digest(path, algorithm)
    if actual != expected:
        raise ChecksumError(
            str(path), algorithm, expected, actual, hint="the file is corrupt or not the published one; delete it"
        )


# -- downloading -------------------------------------------------------------------


def download_file(urls: Sequence[str], path: str | os.PathLike, sha256: str, timeout: float = 60.0) -> Path:
    """Download ``path`` from the first of ``urls`` that serves the right bytes.

    The file is streamed into a temporary file in the target folder while its
    SHA-256 is computed, fsynced, checked against ``sha256`` and only then
    renamed to ``path`` (an atomic step): an interrupted or mismatching download
    never leaves a file at ``path``. A URL that fails or serves other bytes is
    followed by the next one (the mirrors). Raises :class:`ChecksumError` (naming
    the expected and actual digests) when some URL answered but no URL served
    the right bytes, :class:`DownloadError` (naming every URL tried and what
    went wrong) when none answered.
    """
    import http.client
    import urllib.request

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    mismatches: list[ChecksumError] = []
    for url in urls:
        print(f"tinytrain: downloading {url}", file=sys.stderr)
        try:
            _fetch(urllib.request, url, path, sha256, timeout)
        except ChecksumError as error:
            mismatches.append(error)
        except (OSError, http.client.HTTPException) as error:  # URLError, HTTPError, timeouts are OSErrors
            failures.append(f"  {url}: {error}")
        else:
            return path
    if mismatches:
        actual = ", ".join(f"{error.actual} (from {error.what})" for error in mismatches)
        raise ChecksumError(
            path.name, "sha256", sha256, actual, hint="nothing was saved; the server may be serving a different file"
        )
    raise DownloadError(
        f"could not download {path.name}; tried:\n" + "\n".join(failures) + "\n"
        "Are you offline? Download the file on a machine with network access and either put it in "
        f"{path.parent} or pass root= a folder that holds the dataset's files (e.g. MNIST(root='path/to/folder'))."
    )


def _fetch(urllib_request: Any, url: str, path: Path, sha256: str, timeout: float) -> None:
    """One attempt: ``url`` into ``path``, renamed into place only if its SHA-256 matches."""

    def stream_and_verify(out: BinaryIO) -> None:
        digest = hashlib.sha256()
        request = urllib_request.Request(url, headers={"User-Agent": "tinytrain"})
        with urllib_request.urlopen(request, timeout=timeout) as response:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:  # raising here makes atomic_write discard the file
            raise ChecksumError(url, "sha256", sha256, digest.hexdigest())

    atomic_write(path, stream_and_verify)


# -- file formats ------------------------------------------------------------------

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
    """:func:`parse_idx` of a file, gzip-compressed or not (told by its first bytes)."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return parse_idx(data)


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
    return pixels.reshape(-1, 3, 32, 32), labels.astype(np.int64)


# -- datasets ----------------------------------------------------------------------


class ImageDataset(TensorDataset):
    """Images stored as uint8 pixels, served as float32 in [0, 1], with int64 labels.

    ``pixels``: uint8 array (N, C, H, W); ``labels``: int (N,); ``max_value``:
    the pixel value that maps to 1.0. ``dataset[i]`` is ``(image, label)`` with
    ``image`` float32 of shape (C, H, W); an index array gives a batch.
    """

    classes: tuple[str, ...] = ()

    def __init__(self, pixels: np.ndarray, labels: np.ndarray, max_value: int) -> None:
        super().__init__(pixels, np.asarray(labels, dtype=np.int64))
        self.max_value = max_value

    @property
    def pixels(self) -> np.ndarray:
        return self.arrays[0]

    @property
    def labels(self) -> np.ndarray:
        return self.arrays[1]

    targets = labels

    @property
    def images(self) -> np.ndarray:
        """Every image as float32 in [0, 1], shape (N, C, H, W) (a new array each time)."""
        return self._scale(self.pixels)

    def _scale(self, pixels: np.ndarray) -> np.ndarray:
        return np.divide(pixels, self.max_value, dtype=np.float32)

    def __getitem__(self, index: Any) -> tuple:
        pixels, labels = super().__getitem__(index)
        return self._scale(pixels), labels

    def __repr__(self) -> str:
        split = "train" if getattr(self, "train", True) else "test"
        shape, classes = self.pixels.shape[1:], len(self.classes)
        return f"{type(self).__name__}({split}: {len(self)} images of shape {shape}, {classes} classes)"


# Digits: the 8x8 UCI digits as scikit-learn ships them, converted once (see _data/README.md).
DIGITS_SHA256 = "b3b9c8cc11d765ce4264d8748bf3edbafa5038d91c93cf713ddbd6ae8652b410"
DIGITS_TEST_PER_CLASS = 36  # 10 classes x 36 = 360 test images, 1,437 for training
DIGITS_SPLIT_SEED = 0


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits: uint8 pixels (N, 8, 8) in 0..16 and uint8 labels, checksum verified."""
    from importlib.resources import files

    data = (files("tinytrain") / "_data" / "digits.npz").read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != DIGITS_SHA256:
        raise ChecksumError(
            "tinytrain/_data/digits.npz", "sha256", DIGITS_SHA256, actual, hint="reinstall tinytrain"
        )
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return archive["images"], archive["labels"]


def digits_split(labels: np.ndarray, per_class: int = DIGITS_TEST_PER_CLASS, seed: int = DIGITS_SPLIT_SEED):
    """The fixed, stratified train/test split of Digits: ``(train_indices, test_indices)``.

    Every sample gets a random key, the raw 64-bit output of
    ``numpy.random.PCG64(seed)`` (a bit generator's raw stream is fixed by its
    algorithm, so the keys are the same on every NumPy version and platform);
    in each class the ``per_class`` samples with the smallest keys form the
    test set. Both index arrays are sorted.
    """
    labels = np.asarray(labels)
    keys = np.random.PCG64(seed).random_raw(len(labels))
    test = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        test.append(members[np.argsort(keys[members], kind="stable")[:per_class]])
    test_indices = np.sort(np.concatenate(test))
    return np.setdiff1d(np.arange(len(labels)), test_indices), test_indices


class Digits(ImageDataset):
    """The UCI "Optical Recognition of Handwritten Digits" test set: 1,797 8x8 digits.

    Shipped with the package (no download); CC BY 4.0, Alpaydin & Kaynak (1998),
    see ``tinytrain/_data/README.md``. Each image counts, in 4x4 blocks of a
    32x32 bitmap, the pixels that were ink (0..16); here they are scaled to
    float32 in [0, 1] with shape (1, 8, 8) — one channel, so a CNN can read
    them; a dense model flattens them to 64 features. ``train=True`` gives the
    1,437 training images, ``False`` the 360 test images (36 per class) of a
    fixed stratified split (:func:`digits_split`).
    """

    classes = tuple("0123456789")

    def __init__(self, train: bool = True) -> None:
        pixels, labels = _digits_arrays()
        train_indices, test_indices = digits_split(labels)
        keep = train_indices if train else test_indices
        super().__init__(pixels[keep, None], labels[keep], max_value=16)
        self.train = train


def _torchvision_folder(name: str) -> str:
    return f"{name}/raw"  # where torchvision keeps the files, so its downloads work as root=


class MNIST(ImageDataset):
    """MNIST handwritten digits: 60,000 training and 10,000 test images, 1x28x28.

    LeCun, Cortes & Burges, http://yann.lecun.com/exdb/mnist/ (CC BY-SA 3.0
    per Keras' documentation). Files are looked up in ``root`` (default: the
    cache folder ``data_dir()/mnist``), also in its ``raw/`` and
    ``MNIST/raw/`` subfolders (torchvision's layout), as ``<name>.gz`` (SHA-256
    checked) or uncompressed ``<name>`` (validated by the parser). Missing files
    are downloaded into ``root`` when ``download`` is true; otherwise
    ``FileNotFoundError`` says which files were looked for and where.
    """

    classes = tuple("0123456789")
    folder = "mnist"
    mirrors: tuple[str, ...] = (
        "http://yann.lecun.com/exdb/mnist/",  # the published location
        "https://ossci-datasets.s3.amazonaws.com/mnist/",  # torchvision's mirror
        "https://storage.googleapis.com/cvdf-datasets/mnist/",  # TensorFlow Datasets' mirror
    )
    sha256: dict[str, str] = {
        "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    }

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = True) -> None:
        directory = Path(root).expanduser() if root is not None else data_dir() / self.folder
        prefix = "train" if train else "t10k"
        images = read_idx(self._locate(directory, f"{prefix}-images-idx3-ubyte", download))
        labels = read_idx(self._locate(directory, f"{prefix}-labels-idx1-ubyte", download))
        if images.ndim != 3 or images.dtype != np.uint8 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(
                f"{type(self).__name__}: expected uint8 images (N, H, W) and N labels, "
                f"got images {images.dtype} {images.shape} and labels {labels.dtype} {labels.shape}"
            )
        if len(labels) and not 0 <= labels.min() <= labels.max() < len(self.classes):
            raise ValueError(f"{type(self).__name__}: labels outside 0..{len(self.classes) - 1}")
        super().__init__(images[:, None], labels, max_value=255)
        self.train = train

    def _locate(self, directory: Path, name: str, download: bool) -> Path:
        folders = [directory, directory / "raw", directory / _torchvision_folder(type(self).__name__)]
        dotted = name.replace("-idx", ".idx")  # some copies are named train-images.idx3-ubyte
        for folder in folders:
            compressed = folder / f"{name}.gz"
            if compressed.is_file():
                _verify(compressed, "sha256", self.sha256[f"{name}.gz"])
                return compressed
            for candidate in (folder / name, folder / dotted):
                if candidate.is_file():
                    return candidate
        if not download:
            searched = ", ".join(str(folder) for folder in folders)
            raise FileNotFoundError(
                f"{type(self).__name__}: {name}.gz (or {name}) not found in {searched}; "
                "pass download=True to fetch it, or root= the folder that holds it"
            )
        urls = [mirror + f"{name}.gz" for mirror in self.mirrors]
        return download_file(urls, directory / f"{name}.gz", self.sha256[f"{name}.gz"])


class FashionMNIST(MNIST):
    """Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017): 28x28 images of clothing, 10 classes.

    Same files, layout and options as :class:`MNIST` (cache folder
    ``data_dir()/fashion-mnist``, torchvision layout ``FashionMNIST/raw/``).
    MIT licence, copyright Zalando SE.
    """

    classes = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
    folder = "fashion-mnist"
    mirrors = (
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",  # the published location
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",  # its repository
    )
    sha256 = {
        "train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        "t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        "t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    }


class CIFAR10(ImageDataset):
    """CIFAR-10 (Krizhevsky, 2009): 50,000 training and 10,000 test colour images, 3x32x32.

    Reads the "python version" of the data: ``root`` (default: the cache folder
    ``data_dir()/cifar-10``) may be the ``cifar-10-batches-py`` folder itself, a
    folder that contains it (also as torchvision's ``root``), or a folder with
    ``cifar-10-python.tar.gz``. The archive's SHA-256 is checked and its batches
    are read straight out of it, without extracting anything to disk;
    extracted batch files are checked with the published MD5s. Without any of
    these, the archive is downloaded into ``root`` when ``download`` is true.
    There is no official mirror: offline, copy the archive and use ``root=``.
    """

    classes = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    folder = "cifar-10"
    archive = "cifar-10-python.tar.gz"
    urls: tuple[str, ...] = ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",)
    sha256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
    batches_folder = "cifar-10-batches-py"
    batch_md5: dict[str, str] = {
        "data_batch_1": "c99cafc152244af753f735de768cd75f",
        "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
        "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
        "test_batch": "40351d587109b95175f43aff81a1287e",
    }

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = True) -> None:
        directory = Path(root).expanduser() if root is not None else data_dir() / self.folder
        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        parts = [parse_cifar_batch(data) for data in self._batches(directory, names, download)]
        super().__init__(np.concatenate([p for p, _ in parts]), np.concatenate([l for _, l in parts]), max_value=255)
        self.train = train

    def _batches(self, directory: Path, names: list[str], download: bool) -> list[bytes]:
        """The bytes of the batch files ``names``, from an extracted folder or the archive."""
        for folder in (directory, directory / self.batches_folder):
            if all((folder / name).is_file() for name in names):
                for name in names:
                    _verify(folder / name, "md5", self.batch_md5[name])
                return [(folder / name).read_bytes() for name in names]
        archive = directory / self.archive
        if archive.is_file():
            _verify(archive, "sha256", self.sha256)
        elif download:
            download_file(self.urls, archive, self.sha256)
        else:
            raise FileNotFoundError(
                f"CIFAR10: neither {self.batches_folder}/ with {', '.join(names)} nor {self.archive} found in "
                f"{directory}; pass download=True to fetch it, or root= the folder that holds it"
            )
        with tarfile.open(archive, "r:gz") as tar:
            contents = []
            for name in names:
                member_name = f"{self.batches_folder}/{name}"
                try:
                    member = tar.extractfile(member_name)
                except KeyError:
                    member = None
                if member is None:
                    raise ValueError(f"{archive} has no regular file {member_name}")
                contents.append(member.read())
        return contents
