"""The image datasets: the shipped ``Digits``, and ``MNIST``, ``FashionMNIST``, ``CIFAR10``."""
import hashlib
import io
import os
import tarfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.data import TensorDataset
from tinytrain.datasets.download import ChecksumError, data_dir, download_file, verify
from tinytrain.datasets.formats import parse_cifar_batch, read_idx


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


# Digits: the 8x8 UCI digits as scikit-learn ships them, converted once (see files/README.md).
DIGITS_SHA256 = "b3b9c8cc11d765ce4264d8748bf3edbafa5038d91c93cf713ddbd6ae8652b410"
DIGITS_TEST_PER_CLASS = 36  # 10 classes x 36 = 360 test images, 1,437 for training
DIGITS_SPLIT_SEED = 0


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits: uint8 pixels (N, 8, 8) in 0..16 and uint8 labels, checksum verified."""
    data = (resources.files(__package__) / "files" / "digits.npz").read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != DIGITS_SHA256:
        raise ChecksumError(
            "tinytrain/datasets/files/digits.npz", "sha256", DIGITS_SHA256, actual, hint="reinstall tinytrain"
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
    see ``tinytrain/datasets/files/README.md``. Each image counts, in 4x4 blocks of a
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
        labels_path = self._locate(directory, f"{prefix}-labels-idx1-ubyte", download)
        labels = read_idx(labels_path)
        if images.ndim != 3 or images.dtype != np.uint8 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(
                f"{type(self).__name__}: expected uint8 images (N, H, W) and N labels, "
                f"got images {images.dtype} {images.shape} and labels {labels.dtype} {labels.shape}"
            )
        outside = np.flatnonzero((labels < 0) | (labels >= len(self.classes)))
        if len(outside):
            raise ValueError(
                f"{type(self).__name__}: {labels_path} holds label {labels[outside[0]]} at index {outside[0]} "
                f"({len(outside)} label(s) outside 0..{len(self.classes) - 1})"
            )
        super().__init__(images[:, None], labels, max_value=255)
        self.train = train

    def _locate(self, directory: Path, name: str, download: bool) -> Path:
        folders = [directory, directory / "raw", directory / _torchvision_folder(type(self).__name__)]
        dotted = name.replace("-idx", ".idx")  # some copies are named train-images.idx3-ubyte
        for folder in folders:
            compressed = folder / f"{name}.gz"
            if compressed.is_file():
                verify(compressed, "sha256", self.sha256[f"{name}.gz"])
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
                    verify(folder / name, "md5", self.batch_md5[name])
                return [(folder / name).read_bytes() for name in names]
        archive = directory / self.archive
        if archive.is_file():
            verify(archive, "sha256", self.sha256)
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
