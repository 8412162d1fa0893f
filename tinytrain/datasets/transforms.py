"""Data augmentation: random changes to each training image, seeded so that runs reproduce.

Hand-written, not part of a lesson; reached as ``tt.data.transforms``.

A model that sees every training image in the same position, the same way round,
every epoch, can learn the images rather than the classes. Augmentation shows it a
slightly different image each time: shifted by a few pixels (:class:`RandomCrop` of
a zero-padded image), mirrored (:class:`RandomHorizontalFlip`). The ResNets on CIFAR-10
(He et al., 2016, "Deep Residual Learning", section 4.2) train with exactly these
two: padding 4, a random 32x32 crop, and horizontal flips. :class:`Normalize` is not random: it shifts and scales each channel,
``(x - mean[c]) / std[c]``, so the inputs are centred near 0 with spread near 1.

Images are NumPy arrays ``(C, H, W)``, as ``tinytrain.datasets`` gives them. A
transform is called as ``transform(image, generator)``: the random ones draw from
``generator`` (a ``numpy.random.Generator``; ``None`` uses tinytrain's CPU
generator, which ``tt.manual_seed`` fixes). :class:`Compose` chains them.

Where the random numbers come from. :class:`Transformed` wraps a dataset and
applies a transform to each sample's image with a generator of that sample's own,
``PCG64(SeedSequence([seed, epoch, index]))``. A DataLoader tells it the epoch and
its seed before every epoch (its ``set_epoch`` hook): each epoch augments afresh,
the same seed repeats the run, and the augmentation of sample ``i`` does not depend
on which process read it or what was read before -- so ``num_workers=4`` gives
exactly the batches of ``num_workers=0``.
"""
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def sample_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of sample ``index`` in ``epoch`` of a loader seeded with ``seed``: an independent stream
    for every (seed, epoch, index)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, index])))


def _generator(generator: np.random.Generator | None) -> np.random.Generator:
    if generator is not None:
        return generator
    from tinytrain.backend import get_backend  # at the call: this module loads before the library needs to

    return get_backend("cpu").rng


def _image(image: Any, name: str) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 3:
        raise ValueError(f"{name} needs an image of shape (C, H, W), got shape {image.shape}")
    return image


def _pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    height, width = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if height < 1 or width < 1:
        raise ValueError(f"{name} needs a size of at least 1, got {size!r}")
    return int(height), int(width)


class Compose:
    """``Compose([t1, t2, ...])(image, generator)`` is ``t2(t1(image, generator), generator)`` ...: in order,
    all drawing from the one generator."""

    def __init__(self, transforms: Sequence[Callable[..., np.ndarray]]) -> None:
        self.transforms = list(transforms)
        for position, transform in enumerate(self.transforms):
            if not callable(transform):
                raise TypeError(f"Compose: transform {position} is not callable, got {transform!r}")

    def __call__(self, image: Any, generator: np.random.Generator | None = None) -> np.ndarray:
        generator = _generator(generator)
        for transform in self.transforms:
            image = transform(image, generator)
        return image

    def __repr__(self) -> str:
        return f"Compose([{', '.join(map(repr, self.transforms))}])"


class RandomCrop:
    """A random ``size`` window (an int for a square, or ``(height, width)``) of the image padded with
    ``padding`` zeros on every side.

    With padding ``p`` and a crop the image's own size, the image moves by up to ``p``
    pixels in each direction, the uncovered border filled with zeros: every one of the
    ``(2p + 1)**2`` shifts is equally likely. Raises ``ValueError`` when the window is
    larger than the padded image (naming both) or ``padding`` is negative.
    """

    def __init__(self, size: int | Sequence[int], padding: int = 0) -> None:
        self.size = _pair(size, "RandomCrop")
        if padding < 0:
            raise ValueError(f"RandomCrop needs padding >= 0, got {padding}")
        self.padding = int(padding)

    def __call__(self, image: Any, generator: np.random.Generator | None = None) -> np.ndarray:
        image = _image(image, "RandomCrop")
        p = self.padding
        channels, height, width = image.shape
        padded_height, padded_width = height + 2 * p, width + 2 * p
        crop_height, crop_width = self.size
        if crop_height > padded_height or crop_width > padded_width:
            raise ValueError(f"RandomCrop of {crop_height}x{crop_width} does not fit in the image of "
                             f"{height}x{width} padded by {p} ({padded_height}x{padded_width})")
        generator = _generator(generator)
        top = generator.integers(padded_height - crop_height + 1)  # two scalar draws: 3x faster than one of shape 2
        left = generator.integers(padded_width - crop_width + 1)
        padded = np.zeros((channels, padded_height, padded_width), dtype=image.dtype)
        padded[:, p:p + height, p:p + width] = image
        return padded[:, top:top + crop_height, left:left + crop_width].copy()

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding})"


class RandomHorizontalFlip:
    """The image mirrored left to right (its last axis reversed) with probability ``p``, else unchanged.

    Raises ``ValueError`` for ``p`` outside [0, 1].
    """

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"RandomHorizontalFlip needs a probability p in [0, 1], got {p}")
        self.p = float(p)

    def __call__(self, image: Any, generator: np.random.Generator | None = None) -> np.ndarray:
        image = _image(image, "RandomHorizontalFlip")
        if _generator(generator).random() < self.p:
            return image[:, :, ::-1].copy()
        return image

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Normalize:
    """Each channel shifted and scaled: ``(image[c] - mean[c]) / std[c]``, as float32.

    ``mean`` and ``std`` hold one number per channel (or one number for all). Raises
    ``ValueError`` for a ``std`` that is not positive, or, at the call, for an image
    whose channels do not match them (naming both counts).
    """

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float]) -> None:
        self.mean = np.atleast_1d(np.asarray(mean, dtype=np.float32))
        self.std = np.atleast_1d(np.asarray(std, dtype=np.float32))
        counts = {len(self.mean), len(self.std)} - {1}  # one number stands for every channel
        if self.mean.ndim != 1 or self.std.ndim != 1 or len(counts) > 1:
            raise ValueError(f"Normalize needs one mean and one std per channel, got mean={mean!r}, std={std!r}")
        if not np.all(self.std > 0):
            raise ValueError(f"Normalize needs every std > 0, got std={std!r}")

    def __call__(self, image: Any, generator: np.random.Generator | None = None) -> np.ndarray:
        image = _image(image, "Normalize")
        channels = max(len(self.mean), len(self.std))
        if channels != 1 and channels != image.shape[0]:
            raise ValueError(f"Normalize has {channels} channels of mean and std, the image has "
                             f"{image.shape[0]} (shape {image.shape})")
        return ((image - self.mean[:, None, None]) / self.std[:, None, None]).astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


class Transformed:
    """``dataset`` with ``transform`` applied to each sample's image, a generator per sample.

    A sample that is a tuple ``(image, label, ...)`` becomes ``(transform(image), label,
    ...)``; any other sample is transformed whole. Sample ``i`` of epoch ``e`` draws from
    :func:`sample_generator` ``(seed, e, i)``: reading it twice in one epoch gives the same
    image, the next epoch another. ``seed`` and the epoch start at ``seed`` and 0 and are
    set by a DataLoader before each epoch (:meth:`set_epoch`).
    """

    def __init__(self, dataset: Any, transform: Callable[..., np.ndarray], seed: int = 0) -> None:
        if not callable(transform):
            raise TypeError(f"Transformed needs a callable transform, got {transform!r}")
        self.dataset, self.transform = dataset, transform
        self.set_epoch(0, seed)

    def set_epoch(self, epoch: int, seed: int) -> None:
        """Read the samples of ``epoch`` of a loader seeded with ``seed`` from now on."""
        self.epoch, self.seed = int(epoch), int(seed)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        count = len(self)
        if not -count <= index < count:
            raise IndexError(f"sample {index} is out of range for {count} samples")
        index = int(index) % count  # sample -1 and sample count-1 are one sample, with one generator
        sample = self.dataset[index]
        generator = sample_generator(self.seed, self.epoch, index)
        if isinstance(sample, tuple):
            return (self.transform(sample[0], generator), *sample[1:])
        return self.transform(sample, generator)

    def __repr__(self) -> str:
        return f"Transformed({self.dataset!r}, {self.transform!r})"
