"""The milestones: train a real model end to end with the library.

``python milestones/mlp.py`` (or ``tinytrain milestone mlp``) trains a
multi-layer perceptron; ``python milestones/cnn.py`` (``tinytrain milestone cnn``)
a convolutional network (Module 11).
Every run uses ``Trainer.fit`` with a cosine schedule, gradient clipping,
per-epoch checkpoints (the last one and the best by validation accuracy), a CSV
log and a PNG of the curves, all in ``--out``. It prints the test accuracy and
exits with status 1 when that misses the milestone's pass mark.

Settings come, lowest priority first, from the milestone's defaults, the
settings saved by the run being resumed (``--resume``), a TOML file
(``--config run.toml``, same keys as the options, with ``_`` for ``-``) and the
command line. The settings actually used are saved as ``settings.toml`` beside
the outputs, so ``--config runs/x/settings.toml`` repeats a run.

Hand-written, not generated: it is glue around the library, not part of a lesson.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import tinytrain as tt
from tinytrain.callbacks import Callback, CSVLogger, ModelCheckpoint
from tinytrain.course.diagnose import blame, exported_stubs, reset_advice
from tinytrain.data import DataLoader, TensorDataset
from tinytrain.serialization import atomic_write

SETTINGS_FILE = "settings.toml"
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class Settings:
    """Everything that defines a milestone run."""

    dataset: str = "digits"
    epochs: int = 30
    batch_size: int = 64
    lr: float = 0.1
    min_lr: float = 0.001
    warmup: int = 2
    momentum: float = 0.9
    weight_decay: float = 5e-4
    accumulation_steps: int = 1
    clip_norm: float = 5.0
    validation_fraction: float = 0.1
    device: str = "cpu"
    precision: str = "32-true"
    seed: int = 0
    out: str = ""
    data_root: str = ""


@dataclass(frozen=True)
class Milestone:
    name: str
    description: str
    datasets: tuple[str, ...]
    pass_marks: dict[str, float]  # test accuracy needed, per dataset
    defaults: Settings
    # (image shape (C, H, W), number of classes, dataset name) -> a fresh model on the CPU
    build_model: Callable[[tuple[int, ...], int, str], Any]
    eval_batch_size: int = 512  # validation and test batches (no gradients: larger than training's)


HIDDEN_SIZES = {"digits": (128, 64), "mnist": (256, 128), "fashion-mnist": (256, 128)}


# -- settings ------------------------------------------------------------------------
def _parser(milestone: Milestone) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"tinytrain milestone {milestone.name}",
        description=f"Train {milestone.description} and check its test accuracy against the pass mark.",
    )
    kinds = {field.name: field.type for field in fields(Settings)}
    helps = {
        "dataset": f"one of {', '.join(milestone.datasets)} (digits ships with tinytrain; the others download)",
        "epochs": "epochs to train in all (a resumed run continues to this number)",
        "lr": "peak learning rate of the cosine schedule",
        "min_lr": "learning rate at the end of the cosine schedule",
        "warmup": "epochs of linear warm-up",
        "clip_norm": "clip the global gradient norm to this (0: no clipping)",
        "validation_fraction": "share of the training set held out to pick the best checkpoint",
        "device": "cpu, cuda, cuda:1, ...",
        "precision": "32-true, or 16-mixed: float16 compute, float32 master weights, dynamic loss scaling",
        "out": "folder for checkpoints, log, plot and settings (default runs/<milestone>-<dataset>)",
        "data_root": "folder that already holds the dataset's standard files (no download)",
    }
    for name, kind in kinds.items():
        caster = {"int": int, "float": float, "str": str}[kind]
        parser.add_argument(f"--{name.replace('_', '-')}", type=caster, default=None, help=helps.get(name))
    parser.add_argument("--config", type=Path, help="read settings from this TOML file (options given here win)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("--distributed", action="store_true",
                        help="data-parallel over MPI, launched as `mpirun -n P python milestones/mlp.py "
                             "--distributed` (--batch-size is per rank; needs mpi4py)")
    parser.add_argument("--stop-after", type=int, default=None, metavar="N",
                        help="train at most N epochs in this invocation (then --resume goes on)")
    return parser


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise SystemExit(f"reading {path} needs Python 3.11 or `pip install tomli`") from None
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise SystemExit(f"--config {path}: no such file") from None
    except tomllib.TOMLDecodeError as error:
        raise SystemExit(f"--config {path}: not valid TOML: {error}") from None


def _checked(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with an error for any key that is not a setting."""
    known = {field.name for field in fields(Settings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SystemExit(f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return values


def resolve_settings(milestone: Milestone, args: argparse.Namespace) -> Settings:
    """Defaults < the resumed run's saved settings < --config < command line."""
    command_line = {name: value for name, value in vars(args).items()
                    if name in {field.name for field in fields(Settings)} and value is not None}
    config = _checked(_read_toml(args.config), str(args.config)) if args.config else {}
    settings = milestone.defaults
    out = command_line.get("out") or config.get("out")
    if args.resume:
        if not out:
            raise SystemExit("--resume needs --out (or out in --config): the folder of the run to continue")
        saved = Path(out) / SETTINGS_FILE
        if not saved.exists():
            raise SystemExit(f"--resume: {saved} does not exist; nothing to resume in {out}")
        settings = replace(settings, **_checked(_read_toml(saved), str(saved)))
    settings = replace(settings, **{**config, **command_line})
    if not settings.out:
        settings = replace(settings, out=f"runs/{milestone.name}-{settings.dataset}")
    _validate(milestone, settings)
    return settings


def _validate(milestone: Milestone, settings: Settings) -> None:
    problems = []
    if settings.dataset not in milestone.datasets:
        problems.append(f"dataset {settings.dataset!r} is not one of {', '.join(milestone.datasets)}")
    for name in ("epochs", "batch_size", "accumulation_steps"):
        if getattr(settings, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(settings, name)}")
    if not 0 < settings.min_lr <= settings.lr:
        problems.append(f"need 0 < min_lr <= lr, got min_lr={settings.min_lr}, lr={settings.lr}")
    if not 0 <= settings.warmup < settings.epochs:
        problems.append(f"warmup must be in [0, epochs), got {settings.warmup}")
    if settings.precision not in ("32-true", "16-mixed"):
        problems.append(f"precision must be 32-true or 16-mixed, got {settings.precision!r}")
    if settings.clip_norm < 0:
        problems.append(f"clip_norm must be >= 0 (0 turns clipping off), got {settings.clip_norm}")
    if not 0 < settings.validation_fraction < 1:
        problems.append(f"validation_fraction must be in (0, 1), got {settings.validation_fraction}")
    if problems:
        raise SystemExit("bad settings: " + "; ".join(problems))


def settings_toml(settings: Settings) -> str:
    """``settings`` as TOML (flat keys, strings quoted as JSON strings are)."""
    lines = []
    for name, value in asdict(settings).items():
        lines.append(f"{name} = {json.dumps(value) if isinstance(value, str) else repr(value)}")
    return "\n".join(lines) + "\n"


# -- data and model ----------------------------------------------------------------------
def load_dataset(name: str, train: bool, root: str) -> Any:
    """The dataset ``name`` (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``)."""
    if name == "digits":
        return tt.datasets.Digits(train=train)
    classes = {"mnist": tt.datasets.MNIST, "fashion-mnist": tt.datasets.FashionMNIST,
               "cifar10": tt.datasets.CIFAR10}
    return classes[name](root=root or None, train=train)


def split_train_validation(dataset: Any, fraction: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """A seeded random hold-out of ``fraction`` of ``dataset`` for model selection."""
    images, labels = dataset.images, dataset.labels
    order = np.random.default_rng(seed).permutation(len(labels))
    held_out = max(1, int(round(fraction * len(labels))))
    train, validation = order[held_out:], order[:held_out]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[validation], labels[validation])


def build_mlp(input_size: int, hidden: Sequence[int], classes: int) -> tt.nn.Module:
    layers: list[tt.nn.Module] = [tt.nn.Flatten()]
    for width in hidden:
        layers += [tt.nn.Linear(input_size, width), tt.nn.ReLU()]
        input_size = width
    layers.append(tt.nn.Linear(input_size, classes))
    return tt.nn.Sequential(*layers)


def _mlp_for(image_shape: tuple[int, ...], classes: int, dataset: str) -> tt.nn.Module:
    return build_mlp(int(np.prod(image_shape)), HIDDEN_SIZES[dataset], classes)


# Per dataset: the output channels of each convolution stage (two convolutions per
# stage for the larger images), each stage ending in a 2x2 max pool.
CNN_STAGES = {"digits": ((32, 32), (64,)), "mnist": ((32, 32), (64, 64)), "fashion-mnist": ((32, 32), (64, 64)),
              "cifar10": ((32, 32), (64, 64), (128, 128))}


def build_cnn(image_shape: tuple[int, ...], classes: int, dataset: str) -> tt.nn.Module:
    """Stages of 3x3 convolutions (padding 1), each followed by BatchNorm2d and ReLU, each
    stage ending in a 2x2 max pool; then dropout and one Linear layer to the classes.

    Digits (1x8x8): 1->32->32, pool, ->64, pool: 64x2x2 features. MNIST (1x28x28):
    two stages of two convolutions, 64x7x7. CIFAR-10 (3x32x32): three stages, 128x4x4.
    """
    channels, height, width = image_shape
    layers: list[tt.nn.Module] = []
    for stage in CNN_STAGES[dataset]:
        for out_channels in stage:
            layers += [tt.nn.Conv2d(channels, out_channels, 3, padding=1, bias=False),
                       tt.nn.BatchNorm2d(out_channels), tt.nn.ReLU()]
            channels = out_channels
        layers.append(tt.nn.MaxPool2d(2))
        height, width = height // 2, width // 2
    layers += [tt.nn.Flatten(), tt.nn.Dropout(0.25), tt.nn.Linear(channels * height * width, classes)]
    return tt.nn.Sequential(*layers)


MILESTONES = {
    "mlp": Milestone(
        name="mlp",
        description="a multi-layer perceptron (Modules 01-09)",
        datasets=("digits", "mnist", "fashion-mnist"),
        pass_marks={"digits": 0.97, "mnist": 0.98, "fashion-mnist": 0.88},
        defaults=Settings(),
        build_model=_mlp_for,
    ),
    "cnn": Milestone(
        name="cnn",
        description="a convolutional network (Modules 01-11)",
        datasets=("digits", "mnist", "fashion-mnist", "cifar10"),
        pass_marks={"digits": 0.98, "mnist": 0.99, "fashion-mnist": 0.90, "cifar10": 0.70},
        defaults=Settings(epochs=20, lr=0.05, min_lr=0.0005),
        build_model=build_cnn,
        eval_batch_size=128,
    ),
}


class PrintEpoch(Callback):
    """One line per epoch on standard output."""

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        print(f"epoch {logs['epoch']:3d}  lr {logs['lr']:.4f}  train loss {logs['train_loss']:.4f}  "
              f"val loss {logs['eval_loss']:.4f}  val acc {logs['eval_accuracy']:.4f}  {logs['seconds']:.2f}s",
              flush=True)


def _last_checkpoint(directory: Path) -> Path | None:
    epochs = sorted(directory.glob("epoch-*.pkl"))
    return epochs[-1] if epochs else None


# -- the run -------------------------------------------------------------------------------
def run(milestone: Milestone, settings: Settings, resume: bool = False, stop_after: int | None = None,
        distributed: bool = False) -> dict:
    """Train, evaluate on the test set, write the outputs; returns the result summary.

    ``distributed``: this process is one MPI rank of a data-parallel run; only
    rank 0 writes files."""
    comm = tt.distributed.world() if distributed else None
    writer = comm is None or comm.Get_rank() == 0
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    if writer:
        atomic_write(out / SETTINGS_FILE, lambda file: file.write(settings_toml(settings).encode()))
    tt.manual_seed(settings.seed)

    full_train = load_dataset(settings.dataset, True, settings.data_root)
    test = load_dataset(settings.dataset, False, settings.data_root)
    train, validation = split_train_validation(full_train, settings.validation_fraction, settings.seed)
    train_loader = DataLoader(train, batch_size=settings.batch_size, shuffle=True, seed=settings.seed,
                              device=settings.device) if comm is None else tt.distributed.DistributedDataLoader(
        train, batch_size=settings.batch_size, shuffle=True, seed=settings.seed, device=settings.device, comm=comm)
    val_loader = DataLoader(validation, batch_size=milestone.eval_batch_size, device=settings.device)
    test_loader = DataLoader(test, batch_size=milestone.eval_batch_size, device=settings.device)

    image_shape = tuple(full_train.images.shape[1:])
    model = milestone.build_model(image_shape, len(full_train.classes), settings.dataset).to(settings.device)
    optimizer = tt.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum, nesterov=True,
                             weight_decay=settings.weight_decay)
    schedule = tt.CosineSchedule(max_lr=settings.lr, min_lr=settings.min_lr, total_epochs=settings.epochs,
                                 warmup_epochs=settings.warmup)
    trainer = tt.Trainer(model, optimizer, tt.nn.CrossEntropyLoss(), scheduler=schedule,
                         grad_clip_norm=settings.clip_norm or None, precision=settings.precision,
                         strategy=None if comm is None else tt.distributed.DataParallel(comm))
    checkpoints = out / CHECKPOINTS
    if resume:
        last = _last_checkpoint(checkpoints)
        if last is None:
            raise SystemExit(f"--resume: no checkpoint in {checkpoints}")
        trainer.load_checkpoint(last)
        print(f"resumed from {last} (epoch {trainer.epoch} of {settings.epochs})")
    callbacks = [PrintEpoch(), CSVLogger(out / "log.csv"),
                 ModelCheckpoint(checkpoints, keep_last=1, monitor="eval_accuracy")] if writer else []
    target = settings.epochs if stop_after is None else min(settings.epochs, trainer.epoch + stop_after)
    start = time.perf_counter()
    trainer.fit(train_loader, val_loader, epochs=target, callbacks=callbacks,
                accumulation_steps=settings.accumulation_steps)
    seconds = time.perf_counter() - start
    if not writer:
        pass
    elif importlib.util.find_spec("matplotlib") is None:
        print("no history.png: plotting needs matplotlib (pip install 'tinytrain[milestones]')")
    else:
        tt.plot_history(trainer.history, out / "history.png")

    test_loss, test_accuracy = trainer.evaluate(test_loader)
    result = {
        "milestone": milestone.name,
        "dataset": settings.dataset,
        "epochs_done": trainer.epoch,
        "epochs": settings.epochs,
        "test_loss": test_loss,
        "test_accuracy": test_accuracy,
        "pass_mark": milestone.pass_marks[settings.dataset],
        "train_seconds_this_run": seconds,
    }
    if writer:
        atomic_write(out / "result.json", lambda file: file.write((json.dumps(result, indent=2) + "\n").encode()))
    return result


def main(name: str, argv: Sequence[str] | None = None) -> int:
    """Run milestone ``name`` with command-line ``argv``; the process exit status."""
    milestone = MILESTONES[name]
    args = _parser(milestone).parse_args(argv)
    if args.stop_after is not None and args.stop_after < 1:
        raise SystemExit(f"--stop-after must be >= 1, got {args.stop_after}")
    settings = resolve_settings(milestone, args)
    if args.distributed and tt.distributed.world().Get_rank() != 0:
        sys.stdout = open(os.devnull, "w")  # one rank prints: they all compute the same numbers
    print(f"tinytrain milestone {name}: {milestone.description} on {settings.dataset}, "
          f"{settings.epochs} epochs, outputs in {settings.out}")
    for module, stubs in exported_stubs().items():
        print(f"warning: your exported module {module} still has stubs ({', '.join(stubs)}); the run fails if it "
              f"calls them. {reset_advice(module)}", file=sys.stderr)
    try:
        result = run(milestone, settings, resume=args.resume, stop_after=args.stop_after, distributed=args.distributed)
    except Exception as error:
        culprit = blame(error)
        if culprit is None:
            raise
        raise SystemExit(f"the milestone failed in {culprit}: {type(error).__name__}: {error}\n"
                         f"{reset_advice(culprit.module)}") from None
    if result["epochs_done"] < settings.epochs:
        print(f"stopped after epoch {result['epochs_done']} of {settings.epochs}; "
              f"continue with --resume --out {settings.out}")
        return 0
    passed = result["test_accuracy"] >= result["pass_mark"]
    verdict = "PASS" if passed else "FAIL"
    print(f"test accuracy {result['test_accuracy']:.4f} (pass mark {result['pass_mark']:.2f}): {verdict}; "
          f"trained in {result['train_seconds_this_run']:.1f}s")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "mlp", sys.argv[2:]))
