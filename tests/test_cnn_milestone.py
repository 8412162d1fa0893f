"""The CNN milestone (``milestones/cnn.py``): a quick end-to-end run on Digits, and the model for every dataset.

The full run (20 epochs, >= 98% test accuracy) is documented in the README; here
three epochs check that the script trains, writes its outputs and reaches a sane
accuracy, in a few seconds, and the recipe trains an epoch of every dataset's
model on a few random images of that dataset's shape.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.course import milestones
from tinytrain.serialization import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "milestones" / "cnn.py"


def test_cnn_milestone_quick_run_on_digits(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, str(CNN), "--epochs", "3", "--warmup", "1", "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: below the pass mark after 3 epochs
    summary = json.loads((out / "result.json").read_text())
    assert summary["milestone"] == "cnn" and summary["dataset"] == "digits" and summary["epochs_done"] == 3
    assert summary["test_accuracy"] > 0.85, summary
    assert summary["pass_mark"] == 0.98
    for name in ("settings.toml", "log.csv", "history.png", "checkpoints/best.pkl", "checkpoints/epoch-0003.pkl"):
        assert (out / name).is_file(), name
    assert len((out / "log.csv").read_text().splitlines()) == 4
    assert "test accuracy" in result.stdout


def _random_images(image_shape: tuple[int, ...]):
    """A ``load_dataset`` that serves a few random images of ``image_shape`` with labels 0-9."""
    from tinytrain.datasets.images import ImageDataset

    def load_dataset(name: str, train: bool, root: str) -> ImageDataset:
        rng = np.random.default_rng(0 if train else 1)
        size = 30 if train else 10
        images = ImageDataset(rng.integers(0, 256, (size, *image_shape), dtype=np.uint8), rng.integers(0, 10, size),
                              255)
        images.classes = tuple("0123456789")
        return images

    return load_dataset


# dataset: (image shape, the convolutions' output channels, the features the classifier reads, the pass mark)
DATASETS = {"digits": ((1, 8, 8), [32, 32, 64], 64 * 2 * 2, 0.98),
            "mnist": ((1, 28, 28), [32, 32, 64, 64], 64 * 7 * 7, 0.99),
            "fashion-mnist": ((1, 28, 28), [32, 32, 64, 64], 64 * 7 * 7, 0.90),
            "cifar10": ((3, 32, 32), [32, 32, 64, 64, 128, 128], 128 * 4 * 4, 0.70)}


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_the_recipe_builds_its_model_for_every_dataset_and_trains_it(monkeypatch, tmp_path: Path,
                                                                       dataset: str) -> None:
    """Each dataset gets its stages of convolutions and its pass mark (random images: no download)."""
    image_shape, channels, features, pass_mark = DATASETS[dataset]
    monkeypatch.setattr(milestones, "load_dataset", _random_images(image_shape))
    out = tmp_path / "run"
    assert milestones.main("cnn", ["--dataset", dataset, "--epochs", "1", "--warmup", "0", "--out", str(out)]) in (0, 1)
    summary = json.loads((out / "result.json").read_text())
    assert (summary["dataset"], summary["epochs_done"], summary["pass_mark"]) == (dataset, 1, pass_mark)
    weights = read_checkpoint(out / "checkpoints" / "epoch-0001.pkl")["model"]
    convolutions = [array.shape for array in weights.values() if array.ndim == 4]
    assert convolutions == [(out_channels, in_channels, 3, 3)
                            for in_channels, out_channels in zip([image_shape[0], *channels], channels)]
    assert [array.shape for array in weights.values() if array.ndim == 2] == [(10, features)]
