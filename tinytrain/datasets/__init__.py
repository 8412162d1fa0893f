"""Datasets: the shipped 8x8 ``Digits`` and Tiny Shakespeare text (``shakespeare()``), and ``MNIST``,
``FashionMNIST``, ``CIFAR10``.

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

* ``Digits`` ships inside the package (``tinytrain/datasets/files/digits.npz``, 45 kB,
  provenance and licence in ``tinytrain/datasets/files/README.md``); its SHA-256 is
  checked on every load. No network, no Git LFS.
* ``shakespeare()`` returns the Tiny Shakespeare text (1.1 million characters), which
  ships inside the package gzip-compressed (434 kB; same README); the text's SHA-256
  is checked on every call.
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
from tinytrain.datasets.download import ChecksumError, DownloadError, data_dir, download_file, file_digest
from tinytrain.datasets.formats import parse_cifar_batch, parse_idx, read_idx
from tinytrain.datasets.images import CIFAR10, MNIST, Digits, FashionMNIST, ImageDataset, digits_split
from tinytrain.datasets.text import shakespeare

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
    "shakespeare",
]
