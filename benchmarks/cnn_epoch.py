"""The CNN milestone's epoch time on MNIST- and CIFAR-10-shaped data.

Runs the milestone itself (the recipe ``milestones/cnn.py``: its model,
SGD with Nesterov momentum, cosine schedule, clipping, ``Trainer``, the
validation pass and the checkpoints of every epoch) for its first epoch, on random
pixels of the real dataset's shape and size instead of the files (those need a
download; the arithmetic is the same): MNIST 60,000 training images of 1x28x28,
CIFAR-10 50,000 of 3x32x32, 10% of each held out for validation, batch 64, one
BLAS thread (what the milestone asks for). By default it trains on a tenth of
the images and scales the time up by ten; ``--fraction 1`` runs the whole epoch.

    python benchmarks/cnn_epoch.py [--fraction 0.1] [--only mnist|cifar10] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import _timing  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

# name: (training images, test images, image shape)
DATASETS = {"mnist": (60_000, 10_000, (1, 28, 28)), "cifar10": (50_000, 10_000, (3, 32, 32))}


def synthetic(dataset: str, fraction: float) -> Any:
    """A ``load_dataset`` that serves random uint8 images of ``dataset``'s shape, ``fraction`` of its size."""
    from tinytrain.datasets.images import ImageDataset

    train_size, test_size, shape = DATASETS[dataset]

    def load_dataset(name: str, train: bool, root: str) -> ImageDataset:
        size = max(1, round(fraction * (train_size if train else test_size)))
        rng = np.random.default_rng(0 if train else 1)
        images = ImageDataset(rng.integers(0, 256, (size, *shape), dtype=np.uint8), rng.integers(0, 10, size), 255)
        images.classes = tuple("0123456789")
        return images

    return load_dataset


def epoch_seconds(dataset: str, fraction: float) -> dict[str, Any]:
    """Seconds of one milestone epoch (training and validation), measured on ``fraction`` of the data, scaled."""
    from tinytrain.course import milestones

    real_loader = milestones.load_dataset
    milestones.load_dataset = synthetic(dataset, fraction)  # the recipe imports it when it runs, so it gets this one
    try:
        with tempfile.TemporaryDirectory() as out:
            # the first of the default 20 epochs
            status = milestones.main("cnn", ["--dataset", dataset, "--out", out, "--stop-after", "1"])
            if status != 0:
                raise RuntimeError(f"the CNN milestone on {dataset}-shaped data ended with exit status {status}")
            result = json.loads((Path(out) / milestones.RESULT_FILE).read_text())
            settings = milestones.saved_settings(Path(out))
    finally:
        milestones.load_dataset = real_loader  # a caller in the same process gets the real datasets back
    measured = result["train_seconds_this_run"]
    return {"measured_seconds": measured, "fraction": fraction, "epoch_seconds": measured / fraction,
            "batch_size": settings["batch_size"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.1, help="share of an epoch to run (1: all of it)")
    parser.add_argument("--only", choices=sorted(DATASETS), help="one of the two datasets")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction must be in (0, 1], got {args.fraction}")
    report = {}
    for dataset in [args.only] if args.only else list(DATASETS):
        found = _timing.run_isolated("cnn_epoch:epoch_seconds", dataset, args.fraction)
        train_size, _, shape = DATASETS[dataset]
        print(f"CNN milestone, {dataset}-shaped ({train_size:,} images of {'x'.join(map(str, shape))}, "
              f"batch {found['batch_size']}): {found['epoch_seconds']:.0f} s per epoch "
              f"({found['epoch_seconds'] / 60:.1f} min; measured {found['measured_seconds']:.1f} s on "
              f"{args.fraction:.0%} of the data)")
        report[dataset] = found
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
