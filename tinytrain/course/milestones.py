"""The milestones: train a real model end to end with the library.

``python milestones/mlp.py`` (or ``tinytrain milestone mlp``) trains a
multi-layer perceptron; ``python milestones/cnn.py`` (``tinytrain milestone cnn``)
a convolutional network (Module 11); ``python milestones/gpt.py`` (``tinytrain
milestone gpt``) a character-level GPT on Tiny Shakespeare (Module 15).
Every run uses ``Trainer.fit`` with a cosine schedule, gradient clipping,
checkpoints (the last one and the best by validation accuracy, or loss for the
GPT), a CSV log and a PNG of the curves, all in ``--out``. The image milestones
train by epochs and print the test accuracy; the GPT trains by optimizer steps,
evaluates every ``eval_every`` steps and prints its validation loss and a
sample. A run exits with status 1 when it misses the milestone's pass mark.

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
from tinytrain.course.diagnose import blame, exported_note, exported_stubs, reset_advice
from tinytrain.data import DataLoader, TensorDataset, TokenWindows
from tinytrain.nn.functional import cross_entropy
from tinytrain.serialization import atomic_write
from tinytrain.text import CharTokenizer

SETTINGS_FILE = "settings.toml"
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class Settings:
    """Everything that defines an image milestone run."""

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
class GPTSettings:
    """Everything that defines a GPT milestone run: nanoGPT's CPU recipe for Shakespeare by default."""

    dataset: str = "shakespeare"
    steps: int = 2000
    batch_size: int = 12
    context: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    checkpointing: bool = False
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    accumulation_steps: int = 1
    clip_norm: float = 1.0
    validation_fraction: float = 0.1
    eval_every: int = 250
    eval_batches: int = 20
    sample_length: int = 300
    temperature: float = 0.8
    top_k: int = 40
    device: str = "cpu"
    precision: str = "32-true"
    seed: int = 0
    out: str = ""


@dataclass(frozen=True)
class Milestone:
    name: str
    description: str
    datasets: tuple[str, ...]
    pass_marks: dict[str, float]  # per dataset: the test accuracy needed (the GPT: the validation loss allowed)
    defaults: Any  # Settings, or GPTSettings
    # (milestone, settings, resume, stop_after, distributed) -> the result summary
    train: Callable[..., dict]
    # (image shape (C, H, W), number of classes, dataset name) -> a fresh model on the CPU
    build_model: Callable[[tuple[int, ...], int, str], Any] | None = None
    eval_batch_size: int = 512  # validation and test batches (no gradients: larger than training's)
    unit: str = "epoch"  # what --stop-after, warmup and the checkpoints count: "epoch" or "step"


HIDDEN_SIZES = {"digits": (128, 64), "mnist": (256, 128), "fashion-mnist": (256, 128)}


# -- settings ------------------------------------------------------------------------
def _parser(milestone: Milestone) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"tinytrain milestone {milestone.name}",
        description=f"Train {milestone.description} and check it against the pass mark.",
    )
    unit = milestone.unit
    kinds = {field.name: field.type for field in fields(milestone.defaults)}
    helps = {
        "dataset": f"one of {', '.join(milestone.datasets)} (digits and shakespeare ship with tinytrain; "
                   "the others download)",
        "epochs": "epochs to train in all (a resumed run continues to this number)",
        "steps": "optimizer steps to train in all (a resumed run continues to this number)",
        "context": "tokens per training window (the GPT's block_size)",
        "checkpointing": "recompute each transformer block in the backward pass (less memory, more time)",
        "eval_every": "evaluate, log and save a checkpoint every this many steps",
        "eval_batches": "validation batches per periodic evaluation (the final one reads all of it)",
        "sample_length": "characters of the sample generated at the end",
        "temperature": "sampling temperature of that sample (0: greedy)",
        "top_k": "sample among the top_k most likely characters only",
        "lr": "peak learning rate of the cosine schedule",
        "min_lr": "learning rate at the end of the cosine schedule",
        "warmup": f"{unit}s of linear warm-up",
        "clip_norm": "clip the global gradient norm to this (0: no clipping)",
        "validation_fraction": "share of the training set held out to pick the best checkpoint",
        "device": "cpu, cuda, cuda:1, ...",
        "precision": "32-true, or 16-mixed: float16 compute, float32 master weights, dynamic loss scaling",
        "out": "folder for checkpoints, log, plot and settings (default runs/<milestone>-<dataset>)",
        "data_root": "folder that already holds the dataset's standard files (no download)",
    }
    for name, kind in kinds.items():
        option = f"--{name.replace('_', '-')}"
        if kind == "bool":
            parser.add_argument(option, action="store_const", const=True, default=None, help=helps.get(name))
        else:
            caster = {"int": int, "float": float, "str": str}[kind]
            parser.add_argument(option, type=caster, default=None, help=helps.get(name))
    parser.add_argument("--config", type=Path, help="read settings from this TOML file (options given here win)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("--distributed", action="store_true",
                        help=f"data-parallel over MPI, launched as `mpirun -n P python milestones/{milestone.name}.py "
                             "--distributed` (--batch-size is per rank; needs mpi4py)")
    parser.add_argument("--stop-after", type=int, default=None, metavar="N",
                        help=f"train at most N {unit}s in this invocation (then --resume goes on)")
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


def _checked(milestone: Milestone, values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with an error for any key that is not a setting of ``milestone``."""
    known = {field.name for field in fields(milestone.defaults)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SystemExit(f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return values


def resolve_settings(milestone: Milestone, args: argparse.Namespace) -> Settings:
    """Defaults < the resumed run's saved settings < --config < command line."""
    command_line = {name: value for name, value in vars(args).items()
                    if name in {field.name for field in fields(milestone.defaults)} and value is not None}
    config = _checked(milestone, _read_toml(args.config), str(args.config)) if args.config else {}
    settings = milestone.defaults
    out = command_line.get("out") or config.get("out")
    if args.resume:
        if not out:
            raise SystemExit("--resume needs --out (or out in --config): the folder of the run to continue")
        saved = Path(out) / SETTINGS_FILE
        if not saved.exists():
            raise SystemExit(f"--resume: {saved} does not exist; nothing to resume in {out}")
        settings = replace(settings, **_checked(milestone, _read_toml(saved), str(saved)))
    settings = replace(settings, **{**config, **command_line})
    if not settings.out:
        settings = replace(settings, out=f"runs/{milestone.name}-{settings.dataset}")
    _validate(milestone, settings)
    return settings


_POSITIVE = ("epochs", "steps", "batch_size", "accumulation_steps", "context", "n_layer", "n_head", "n_embd",
             "eval_every", "eval_batches", "top_k")


def _validate(milestone: Milestone, settings: Any) -> None:
    problems = []
    if settings.dataset not in milestone.datasets:
        problems.append(f"dataset {settings.dataset!r} is not one of {', '.join(milestone.datasets)}")
    for name in _POSITIVE:
        if getattr(settings, name, 1) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(settings, name)}")
    if not 0 < settings.min_lr <= settings.lr:
        problems.append(f"need 0 < min_lr <= lr, got min_lr={settings.min_lr}, lr={settings.lr}")
    length = f"{milestone.unit}s"
    if not 0 <= settings.warmup < getattr(settings, length):
        problems.append(f"warmup must be in [0, {length}), got {settings.warmup}")
    if isinstance(settings, GPTSettings):
        if settings.n_embd % settings.n_head:
            problems.append(f"n_embd must be a multiple of n_head, got n_embd={settings.n_embd}, n_head={settings.n_head}")
        if not 0 <= settings.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {settings.dropout}")
        if settings.sample_length < 0 or settings.temperature < 0:
            problems.append(f"sample_length and temperature must be >= 0, got {settings.sample_length} and "
                            f"{settings.temperature}")
    if settings.precision not in ("32-true", "16-mixed"):
        problems.append(f"precision must be 32-true or 16-mixed, got {settings.precision!r}")
    if settings.clip_norm < 0:
        problems.append(f"clip_norm must be >= 0 (0 turns clipping off), got {settings.clip_norm}")
    if not 0 < settings.validation_fraction < 1:
        problems.append(f"validation_fraction must be in (0, 1), got {settings.validation_fraction}")
    if problems:
        raise SystemExit("bad settings: " + "; ".join(problems))


def settings_toml(settings: Any) -> str:
    """``settings`` as TOML (flat keys, strings quoted and booleans spelt as JSON does)."""
    lines = []
    for name, value in asdict(settings).items():
        lines.append(f"{name} = {json.dumps(value) if isinstance(value, (str, bool)) else repr(value)}")
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


def language_model_loss(logits: tt.Tensor, targets: tt.Tensor) -> tt.Tensor:
    """Mean cross-entropy of (B, T, V) next-token logits against (B, T) token ids."""
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class PrintRow(Callback):
    """One line per history row (an epoch, or an evaluation in a step run) on standard output."""

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        accuracy = logs["eval_accuracy"]
        shown = "" if accuracy is None or np.isnan(accuracy) else f"  val acc {accuracy:.4f}"
        print(f"{self.unit} {logs[self.unit]:{5 if self.unit == 'step' else 3}d}  lr {logs['lr']:.4g}  "
              f"train loss {logs['train_loss']:.4f}  val loss {logs['eval_loss']:.4f}{shown}  {logs['seconds']:.2f}s",
              flush=True)


# -- the run -------------------------------------------------------------------------------
@dataclass
class _Run:
    """What the image and GPT milestones share: the MPI rank, the outputs, the checkpoints, resuming."""

    milestone: Milestone
    settings: Any
    comm: Any
    out: Path
    checkpoints: ModelCheckpoint

    @property
    def writer(self) -> bool:
        """Whether this process writes files: rank 0, or the only process."""
        return self.comm is None or self.comm.Get_rank() == 0

    @classmethod
    def start(cls, milestone: Milestone, settings: Any, distributed: bool, monitor: str) -> _Run:
        """Write ``settings.toml`` and seed every generator."""
        comm = tt.distributed.world() if distributed else None
        out = Path(settings.out)
        run = cls(milestone, settings, comm, out, ModelCheckpoint(out / CHECKPOINTS, keep_last=1, monitor=monitor,
                                                                  unit=milestone.unit))
        out.mkdir(parents=True, exist_ok=True)
        if run.writer:
            atomic_write(out / SETTINGS_FILE, lambda file: file.write(settings_toml(settings).encode()))
            if settings.precision == "16-mixed" and tt.get_backend(settings.device).xp is np:
                # measured on 2 cores: MLP 9.5 s against 0.3 s, CNN 381 s against 5.5 s
                print(f"note: on {settings.device!r} NumPy multiplies float16 matrices without BLAS, so 16-mixed "
                      f"runs 30-70x slower than 32-true here; it pays off on a GPU (--device cuda)")
        tt.manual_seed(settings.seed)
        return run

    def train_loader(self, dataset: Any) -> Any:
        """A shuffling, seeded loader of ``dataset``: this rank's share of it in a distributed run."""
        settings = self.settings
        if self.comm is None:
            return DataLoader(dataset, batch_size=settings.batch_size, shuffle=True, seed=settings.seed,
                              device=settings.device)
        return tt.distributed.DistributedDataLoader(dataset, batch_size=settings.batch_size, shuffle=True,
                                                    seed=settings.seed, device=settings.device, comm=self.comm)

    def strategy(self) -> Any:
        return None if self.comm is None else tt.distributed.DataParallel(self.comm)

    def fit(self, trainer: tt.Trainer, resume: bool, stop_after: int | None, train: Any, val: Any,
            **options: Any) -> float:
        """Resume ``trainer`` from its last checkpoint (with ``resume``), train it to the milestone's length (at most
        ``stop_after`` more epochs or steps), plot its history; the seconds spent training."""
        unit, total = self.milestone.unit, getattr(self.settings, f"{self.milestone.unit}s")
        if resume:
            files = self.checkpoints.epoch_files() if self.checkpoints.directory.is_dir() else {}
            if not files:
                raise SystemExit(f"--resume: no checkpoint in {self.checkpoints.directory}")
            last = files[max(files)]
            trainer.load_checkpoint(last)
            print(f"resumed from {last} ({unit} {getattr(trainer, unit)} of {total})")
        done = getattr(trainer, unit)
        target = total if stop_after is None else min(total, done + stop_after)
        callbacks = [PrintRow(unit), CSVLogger(self.out / "log.csv"), self.checkpoints] if self.writer else []
        start = time.perf_counter()
        trainer.fit(train, val, callbacks=callbacks, accumulation_steps=self.settings.accumulation_steps,
                    **{"epochs" if unit == "epoch" else "max_steps": target}, **options)
        seconds = time.perf_counter() - start
        if self.writer:
            self._plot(trainer.history)
        return seconds

    def _plot(self, history: dict[str, list]) -> None:
        if importlib.util.find_spec("matplotlib") is None:
            print("no history.png: plotting needs matplotlib (pip install 'tinytrain[milestones]')")
            return
        import matplotlib.pyplot as plt

        figure = tt.plot_history(history)
        if self.milestone.unit == "step":  # plot_history numbers the rows; a step run's rows end at these steps
            for axes in figure.axes:
                for line in axes.get_lines():
                    line.set_xdata(history["step"][:len(line.get_xdata())])
                axes.relim()
                axes.autoscale_view()
                axes.set_xlabel("step")
        figure.savefig(self.out / "history.png", dpi=120)
        plt.close(figure)

    def finish(self, result: dict) -> dict:
        """Write ``result.json`` (rank 0); ``result``."""
        if self.writer:
            atomic_write(self.out / "result.json",
                         lambda file: file.write((json.dumps(result, indent=2) + "\n").encode()))
        return result


def run(milestone: Milestone, settings: Settings, resume: bool = False, stop_after: int | None = None,
        distributed: bool = False) -> dict:
    """Train an image classifier, evaluate it on the test set, write the outputs; returns the result summary.

    ``distributed``: this process is one MPI rank of a data-parallel run; only
    rank 0 writes files."""
    job = _Run.start(milestone, settings, distributed, monitor="eval_accuracy")
    full_train = load_dataset(settings.dataset, True, settings.data_root)
    test = load_dataset(settings.dataset, False, settings.data_root)
    train, validation = split_train_validation(full_train, settings.validation_fraction, settings.seed)
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
                         strategy=job.strategy())
    seconds = job.fit(trainer, resume, stop_after, job.train_loader(train), val_loader)
    test_loss, test_accuracy = trainer.evaluate(test_loader)
    return job.finish({
        "milestone": milestone.name,
        "dataset": settings.dataset,
        "epochs_done": trainer.epoch,
        "epochs": settings.epochs,
        "test_loss": test_loss,
        "test_accuracy": test_accuracy,
        "pass_mark": milestone.pass_marks[settings.dataset],
        "passed": test_accuracy >= milestone.pass_marks[settings.dataset],
        "train_seconds_this_run": seconds,
    })


def split_text(text: str, validation_fraction: float) -> tuple[str, str]:
    """The first ``1 - validation_fraction`` of ``text`` for training, the rest for validation."""
    cut = int(len(text) * (1 - validation_fraction))
    return text[:cut], text[cut:]


def run_gpt(milestone: Milestone, settings: GPTSettings, resume: bool = False, stop_after: int | None = None,
            distributed: bool = False) -> dict:
    """Train a character-level GPT on Tiny Shakespeare by optimizer steps; report its loss on all of the held-out
    end of the text and a sample; write the outputs; returns the result summary."""
    job = _Run.start(milestone, settings, distributed, monitor="eval_loss")
    text = tt.datasets.shakespeare()
    tokenizer = CharTokenizer().train(text)  # every character of the text (the held-out end has no new ones)
    train_text, val_text = split_text(text, settings.validation_fraction)
    train = TokenWindows(np.array(tokenizer.encode(train_text)), settings.context)
    validation = TokenWindows(np.array(tokenizer.encode(val_text)), settings.context, stride=settings.context)
    # periodic evaluations read eval_batches batches at a time, round the held-out windows; the final one all of them
    val_loader = DataLoader(validation, batch_size=milestone.eval_batch_size, device=settings.device)
    final_loader = DataLoader(validation, batch_size=milestone.eval_batch_size, device=settings.device)

    config = tt.nn.GPTConfig(tokenizer.vocab_size, settings.context, settings.n_layer, settings.n_head,
                             settings.n_embd, dropout=settings.dropout, checkpointing=settings.checkpointing)
    model = tt.nn.GPT(config).to(settings.device)
    optimizer = tt.optim.AdamW(tt.optim.weight_decay_groups(model.parameters(), settings.weight_decay),
                               lr=settings.lr, betas=(0.9, 0.99))
    schedule = tt.CosineSchedule(max_lr=settings.lr, min_lr=settings.min_lr, total_epochs=settings.steps,
                                 warmup_epochs=settings.warmup)
    trainer = tt.Trainer(model, optimizer, language_model_loss, scheduler=schedule, scheduler_interval="step",
                         grad_clip_norm=settings.clip_norm or None, precision=settings.precision,
                         strategy=job.strategy())
    seconds = job.fit(trainer, resume, stop_after, job.train_loader(train), val_loader,
                      eval_every=settings.eval_every, eval_batches=settings.eval_batches)
    val_loss, _ = trainer.evaluate(final_loader)
    tt.manual_seed(settings.seed)  # the same sample from the same weights, resumed or not
    prompt = tt.tensor(np.array([tokenizer.encode("\n")]), device=settings.device)
    tokens = model.generate(prompt, settings.sample_length, temperature=settings.temperature, top_k=settings.top_k)
    return job.finish({
        "milestone": milestone.name,
        "dataset": settings.dataset,
        "steps_done": trainer.step,
        "steps": settings.steps,
        "val_loss": val_loss,
        "pass_mark": milestone.pass_marks[settings.dataset],
        "passed": val_loss <= milestone.pass_marks[settings.dataset],
        "sample": tokenizer.decode(tokens.numpy()[0, 1:]),
        "train_seconds_this_run": seconds,
    })


MILESTONES = {
    "mlp": Milestone(
        name="mlp",
        description="a multi-layer perceptron (Modules 01-09)",
        datasets=("digits", "mnist", "fashion-mnist"),
        pass_marks={"digits": 0.97, "mnist": 0.98, "fashion-mnist": 0.88},
        defaults=Settings(),
        train=run,
        build_model=_mlp_for,
    ),
    "cnn": Milestone(
        name="cnn",
        description="a convolutional network (Modules 01-11)",
        datasets=("digits", "mnist", "fashion-mnist", "cifar10"),
        pass_marks={"digits": 0.98, "mnist": 0.99, "fashion-mnist": 0.90, "cifar10": 0.70},
        defaults=Settings(epochs=20, lr=0.05, min_lr=0.0005),
        train=run,
        build_model=build_cnn,
        eval_batch_size=128,
    ),
    "gpt": Milestone(
        name="gpt",
        description="a character-level GPT (Modules 01-15)",
        datasets=("shakespeare",),
        pass_marks={"shakespeare": 1.95},  # validation loss per character, at most
        defaults=GPTSettings(),
        train=run_gpt,
        eval_batch_size=64,
        unit="step",
    ),
}


def main(name: str, argv: Sequence[str] | None = None) -> int:
    """Run milestone ``name`` with command-line ``argv``; the process exit status."""
    milestone = MILESTONES[name]
    args = _parser(milestone).parse_args(argv)
    if args.stop_after is not None and args.stop_after < 1:
        raise SystemExit(f"--stop-after must be >= 1, got {args.stop_after}")
    settings = resolve_settings(milestone, args)
    if args.distributed and tt.distributed.world().Get_rank() != 0:
        sys.stdout = open(os.devnull, "w")  # one rank prints: they all compute the same numbers
    unit = milestone.unit
    total = getattr(settings, f"{unit}s")
    print(f"tinytrain milestone {name}: {milestone.description} on {settings.dataset}, "
          f"{total} {unit}s, outputs in {settings.out}")
    for module, stubs in exported_stubs().items():
        print(f"warning: your exported module {module} still has stubs ({', '.join(stubs)}); the run fails if it "
              f"calls them. {reset_advice(module)}", file=sys.stderr)
    try:
        result = milestone.train(milestone, settings, resume=args.resume, stop_after=args.stop_after,
                                 distributed=args.distributed)
    except Exception as error:
        culprit = blame(error)
        if culprit is None:
            note = exported_note("the error")
            if note:
                print(f"note: {note}", file=sys.stderr)
            raise
        raise SystemExit(f"the milestone failed in {culprit}: {type(error).__name__}: {error}\n"
                         f"{reset_advice(culprit.module)}") from None
    if result[f"{unit}s_done"] < total:
        print(f"stopped after {unit} {result[f'{unit}s_done']} of {total}; "
              f"continue with --resume --out {settings.out}")
        return 0
    verdict = "PASS" if result["passed"] else "FAIL"
    if unit == "step":
        print(f"sample (temperature {settings.temperature}, top_k {settings.top_k}):\n{result['sample']}\n")
        print(f"validation loss {result['val_loss']:.4f} on the last {settings.validation_fraction:.0%} of the text "
              f"(pass mark <= {result['pass_mark']:.2f}): {verdict}; trained in {result['train_seconds_this_run']:.1f}s")
    else:
        print(f"test accuracy {result['test_accuracy']:.4f} (pass mark {result['pass_mark']:.2f}): {verdict}; "
              f"trained in {result['train_seconds_this_run']:.1f}s")
    note = None if result["passed"] else exported_note("missing the pass mark")
    if note:
        print(f"note: {note}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "mlp", sys.argv[2:]))
