"""What every milestone recipe shares: its options, output folder, resuming, result and failure report.

A milestone is a script in ``milestones/`` (``mlp.py``, ``cnn.py``, ``gpt.py``)
that reads top to bottom as the recipe it runs: its settings, the data, the
model, the optimizer, the schedule, the ``Trainer``, the callbacks, the
training call, the final evaluation and its pass mark. The rest is the same in
every recipe and lives here, behind two calls:

* ``run = start(name, description, Settings(), datasets)`` reads the command
  line, the ``--config`` file and the settings of a resumed run, checks them,
  makes the output folder (``--out``, default ``runs/<name>-<dataset>``) and
  saves the settings there, joins the MPI ranks with ``--distributed`` (only
  rank 0 prints and writes files), and seeds every random generator;
* ``sys.exit(run.finish(trainer, result, verdict))`` writes ``result.json`` and
  the plot of the history, prints the verdict, and gives the exit status (1
  below the pass mark).

Between them a recipe uses ``run.data_loader`` and ``run.strategy`` (plain, or
data-parallel over MPI), ``run.resume`` and ``run.until`` (``--resume`` and
``--stop-after``), ``run.out``, ``run.is_writer`` and :class:`PrintRow`. When
the run fails in a student's exported code, the error names that module and how
to put the reference back.

Settings come, lowest priority first, from the recipe's ``Settings`` dataclass
(its fields and defaults), the settings saved by the run being resumed
(``--resume``), a TOML file (``--config run.toml``, same keys as the options,
with ``_`` for ``-``) and the command line. The settings actually used are saved
as ``settings.toml`` beside the outputs, so ``--config runs/x/settings.toml``
repeats a run.

``python milestones/mlp.py`` runs a recipe; ``tinytrain milestone mlp`` runs the
same file (:func:`main`): the project's ``milestones/mlp.py`` when the package
lives in a clone, else the copy ``tinytrain build`` puts in the package.

Importing this module asks for one BLAS thread unless the environment already
chose: the matrix products of these small networks are too small to share, and
on a busy 2-core machine a second thread mostly waits (epochs measured 4-15x
slower). BLAS reads the setting when NumPy loads it, so a recipe imports this
module before anything that imports NumPy.

Hand-written, not generated: it is glue around the library, not part of a lesson.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import runpy
import sys
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before NumPy loads: see above
    os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402

import tinytrain as tt  # noqa: E402
from tinytrain.callbacks import Callback, ModelCheckpoint  # noqa: E402
from tinytrain.course.diagnose import blame, exported_note, exported_stubs, reset_advice  # noqa: E402
from tinytrain.course.inventory import PACKAGE_DIR, RECIPES  # noqa: E402
from tinytrain.data import DataLoader, TensorDataset  # noqa: E402
from tinytrain.serialization import atomic_write  # noqa: E402

SETTINGS_FILE = "settings.toml"
RESULT_FILE = "result.json"

# --help of the settings the recipes share; a setting not named here is listed without one
HELP = {
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
    "clip_norm": "clip the global gradient norm to this (0: no clipping)",
    "validation_fraction": "share of the training set held out to pick the best checkpoint",
    "device": "cpu, cuda, cuda:1, ...",
    "precision": "32-true, or 16-mixed: float16 compute, float32 master weights, dynamic loss scaling",
    "out": "folder for checkpoints, log, plot and settings (default runs/<milestone>-<dataset>)",
    "data_root": "folder that already holds the dataset's standard files (no download)",
}
# settings that count something: at least 1 wherever a recipe has them
_POSITIVE = ("epochs", "steps", "batch_size", "accumulation_steps", "context", "n_layer", "n_head", "n_embd",
             "eval_every", "eval_batches", "top_k")


# -- settings ------------------------------------------------------------------------------------------------------
def _parser(name: str, description: str, defaults: Any, datasets: Sequence[str], unit: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"tinytrain milestone {name}",
                                     description=f"Train {description} and check it against the pass mark.")
    helps = {**HELP, "warmup": f"{unit}s of linear warm-up",
             "dataset": f"one of {', '.join(datasets)} (digits and shakespeare ship with tinytrain; "
                        "the others download)"}
    for setting, kind in typing.get_type_hints(type(defaults)).items():
        option = f"--{setting.replace('_', '-')}"
        if kind is bool:
            parser.add_argument(option, action="store_const", const=True, default=None, help=helps.get(setting))
        else:
            parser.add_argument(option, type=kind, default=None, help=helps.get(setting))
    parser.add_argument("--config", type=Path, help="read settings from this TOML file (options given here win)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("--distributed", action="store_true",
                        help=f"data-parallel over MPI, launched as `mpirun -n P python milestones/{name}.py "
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


def _checked(defaults: Any, values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with an error for any key that is not a setting of the recipe."""
    known = {field.name for field in fields(defaults)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SystemExit(f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return values


def resolve_settings(name: str, defaults: Any, args: argparse.Namespace) -> Any:
    """Defaults < the resumed run's saved settings < --config < command line."""
    known = {field.name for field in fields(defaults)}
    command_line = {setting: value for setting, value in vars(args).items() if setting in known and value is not None}
    config = _checked(defaults, _read_toml(args.config), str(args.config)) if args.config else {}
    settings = defaults
    out = command_line.get("out") or config.get("out")
    if args.resume:
        if not out:
            raise SystemExit("--resume needs --out (or out in --config): the folder of the run to continue")
        if not (Path(out) / SETTINGS_FILE).exists():
            raise SystemExit(f"--resume: {Path(out) / SETTINGS_FILE} does not exist; nothing to resume in {out}")
        settings = replace(settings, **_checked(defaults, saved_settings(Path(out)), str(Path(out) / SETTINGS_FILE)))
    settings = replace(settings, **{**config, **command_line})
    if not settings.out:
        settings = replace(settings, out=f"runs/{name}-{settings.dataset}")
    return settings


def _problems(settings: Any, datasets: Sequence[str], unit: str) -> list[str]:
    """What is wrong with ``settings``; each rule applies to the recipes that have its settings."""
    values = asdict(settings)
    problems = []
    if values["dataset"] not in datasets:
        problems.append(f"dataset {values['dataset']!r} is not one of {', '.join(datasets)}")
    problems += [f"{name} must be >= 1, got {values[name]}" for name in _POSITIVE if values.get(name, 1) < 1]
    if "lr" in values and not 0 < values["min_lr"] <= values["lr"]:
        problems.append(f"need 0 < min_lr <= lr, got min_lr={values['min_lr']}, lr={values['lr']}")
    if "warmup" in values and not 0 <= values["warmup"] < values[f"{unit}s"]:
        problems.append(f"warmup must be in [0, {unit}s), got {values['warmup']}")
    if "n_head" in values and values["n_embd"] % values["n_head"]:
        problems.append(f"n_embd must be a multiple of n_head, got n_embd={values['n_embd']}, "
                        f"n_head={values['n_head']}")
    if "dropout" in values and not 0 <= values["dropout"] < 1:
        problems.append(f"dropout must be in [0, 1), got {values['dropout']}")
    if "sample_length" in values and (values["sample_length"] < 0 or values["temperature"] < 0):
        problems.append(f"sample_length and temperature must be >= 0, got {values['sample_length']} and "
                        f"{values['temperature']}")
    if "precision" in values and values["precision"] not in ("32-true", "16-mixed"):
        problems.append(f"precision must be 32-true or 16-mixed, got {values['precision']!r}")
    if "clip_norm" in values and values["clip_norm"] < 0:
        problems.append(f"clip_norm must be >= 0 (0 turns clipping off), got {values['clip_norm']}")
    if "validation_fraction" in values and not 0 < values["validation_fraction"] < 1:
        problems.append(f"validation_fraction must be in (0, 1), got {values['validation_fraction']}")
    return problems


def saved_settings(out: Path) -> dict[str, Any]:
    """The settings that the run in the folder ``out`` saved (``settings.toml``)."""
    return _read_toml(out / SETTINGS_FILE)


def settings_toml(settings: Any) -> str:
    """``settings`` as TOML (flat keys, strings quoted and booleans spelt as JSON does)."""
    lines = []
    for name, value in asdict(settings).items():
        lines.append(f"{name} = {json.dumps(value) if isinstance(value, (str, bool)) else repr(value)}")
    return "\n".join(lines) + "\n"


# -- data ----------------------------------------------------------------------------------------------------------
def load_dataset(name: str, train: bool, root: str) -> Any:
    """The dataset ``name`` (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``): its training or test split,
    from the folder ``root`` when given (no download)."""
    if name == "digits":
        return tt.datasets.Digits(train=train)
    classes = {"mnist": tt.datasets.MNIST, "fashion-mnist": tt.datasets.FashionMNIST,
               "cifar10": tt.datasets.CIFAR10}
    return classes[name](root=root or None, train=train)


def split_train_validation(dataset: Any, fraction: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """A seeded random hold-out of ``fraction`` of ``dataset`` (at least one image) for model selection:
    ``(train, validation)``."""
    images, labels = dataset.images, dataset.labels
    order = np.random.default_rng(seed).permutation(len(labels))
    held_out = max(1, int(round(fraction * len(labels))))
    train, validation = order[held_out:], order[:held_out]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[validation], labels[validation])


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


# -- the run -------------------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One invocation of a milestone recipe: its settings and the options that are not settings."""

    name: str
    settings: Any  # the recipe's Settings, as resolved
    unit: str  # what the run counts: "epoch" or "step"
    out: Path
    comm: Any  # the MPI communicator with --distributed, else None
    # the Trainer's strategy: with --distributed, DataParallel (rank 0's weights to every rank, the gradients
    # averaged over the ranks before each step), else None
    strategy: Any
    resuming: bool  # --resume
    stop_after: int | None  # --stop-after

    @property
    def is_writer(self) -> bool:
        """Whether this process prints and writes files: rank 0, or the only process."""
        return self.comm is None or self.comm.Get_rank() == 0

    @property
    def total(self) -> int:
        """The epochs or steps the run trains in all."""
        return getattr(self.settings, f"{self.unit}s")

    def data_loader(self, dataset: Any, **options: Any) -> Any:
        """``DataLoader(dataset, **options)``; with ``--distributed`` a ``DistributedDataLoader``, which gives each
        MPI rank its share of every epoch (``batch_size`` is then per rank)."""
        if self.comm is None:
            return DataLoader(dataset, **options)
        return tt.distributed.DistributedDataLoader(dataset, comm=self.comm, **options)

    def resume(self, trainer: Any, checkpoints: ModelCheckpoint) -> None:
        """With ``--resume``: load the newest checkpoint that ``checkpoints`` wrote into ``trainer``."""
        if not self.resuming:
            return
        files = checkpoints.epoch_files() if checkpoints.directory.is_dir() else {}
        if not files:
            raise SystemExit(f"--resume: no checkpoint in {checkpoints.directory}")
        last = files[max(files)]
        trainer.load_checkpoint(last)
        print(f"resumed from {last} ({self.unit} {getattr(trainer, self.unit)} of {self.total})")

    def until(self, total: int, done: int) -> int:
        """Where this invocation stops training: at ``total`` (epochs or steps), or ``--stop-after N`` after
        ``done``."""
        return total if self.stop_after is None else min(total, done + self.stop_after)

    def finish(self, trainer: Any, result: dict[str, Any], verdict: str) -> int:
        """Write ``result.json`` and ``history.png`` (the writer only) and print the outcome; the exit status.

        ``result`` holds the recipe's measures and at least ``passed`` and
        ``train_seconds_this_run``; ``result.json`` gets them after the milestone,
        the dataset and how far the run got. A run that reached its end prints
        ``verdict`` with PASS or FAIL, and returns 1 on FAIL; one stopped early
        (``--stop-after``) says how to go on, and returns 0.
        """
        done, total = getattr(trainer, self.unit), self.total
        summary = {"milestone": self.name, "dataset": self.settings.dataset, f"{self.unit}s_done": done,
                   f"{self.unit}s": total, **result}
        if self.is_writer:
            atomic_write(self.out / RESULT_FILE,
                         lambda file: file.write((json.dumps(summary, indent=2) + "\n").encode()))
            self._plot(trainer.history)
        if done < total:
            print(f"stopped after {self.unit} {done} of {total}; continue with --resume --out {self.settings.out}")
            return 0
        print(f"{verdict}: {'PASS' if result['passed'] else 'FAIL'}; "
              f"trained in {result['train_seconds_this_run']:.1f}s")
        note = None if result["passed"] else exported_note("missing the pass mark")
        if note:
            print(f"note: {note}")
        return 0 if result["passed"] else 1

    def _plot(self, history: dict[str, list]) -> None:
        if importlib.util.find_spec("matplotlib") is None:
            print("no history.png: plotting needs matplotlib (pip install 'tinytrain[milestones]')")
            return
        import matplotlib.pyplot as plt

        figure = tt.plot_history(history)
        if self.unit == "step":  # plot_history numbers the rows; a step run's rows end at these steps
            for axes in figure.axes:
                for line in axes.get_lines():
                    line.set_xdata(history["step"][:len(line.get_xdata())])
                axes.relim()
                axes.autoscale_view()
                axes.set_xlabel("step")
        figure.savefig(self.out / "history.png", dpi=120)
        plt.close(figure)


def start(name: str, description: str, defaults: Any, datasets: Sequence[str], unit: str = "epoch") -> Run:
    """Begin the milestone ``name``: read its options from the command line.

    ``defaults`` is the recipe's ``Settings()``: a dataclass whose fields are the
    settings (each also an option, ``batch_size`` as ``--batch-size``) with their
    defaults; ``datasets`` are the ones it knows (``--dataset``); ``unit`` is what
    it counts, ``"epoch"`` or ``"step"`` (its settings then hold ``epochs`` or
    ``steps``, and ``warmup`` and ``--stop-after`` count the same). Bad settings
    end the process with a message naming them, before anything is written.
    Then: this process's MPI rank (with ``--distributed``; other ranks print
    nothing), the output folder with ``settings.toml`` in it, a line saying what
    runs, warnings about stubs left in exported modules, and every random
    generator seeded with ``settings.seed``. From here on, an exception that
    ends the process is reported as the failure of the student's exported
    module it came from, when it came from one.
    """
    args = _parser(name, description, defaults, datasets, unit).parse_args()
    if args.stop_after is not None and args.stop_after < 1:
        raise SystemExit(f"--stop-after must be >= 1, got {args.stop_after}")
    settings = resolve_settings(name, defaults, args)
    problems = _problems(settings, datasets, unit)
    if problems:
        raise SystemExit("bad settings: " + "; ".join(problems))
    comm = tt.distributed.world() if args.distributed else None
    strategy = None if comm is None else tt.distributed.DataParallel(comm)
    run = Run(name, settings, unit, Path(settings.out), comm, strategy, args.resume, args.stop_after)
    if not run.is_writer:
        sys.stdout = open(os.devnull, "w")  # one rank prints: they all compute the same numbers
    sys.excepthook = functools.partial(_report_failure, sys.excepthook)
    print(f"tinytrain milestone {name}: {description} on {settings.dataset}, {run.total} {unit}s, "
          f"outputs in {settings.out}")
    for module, stubs in exported_stubs().items():
        print(f"warning: your exported module {module} still has stubs ({', '.join(stubs)}); the run fails if it "
              f"calls them. {reset_advice(module)}", file=sys.stderr)
    run.out.mkdir(parents=True, exist_ok=True)
    if run.is_writer:
        atomic_write(run.out / SETTINGS_FILE, lambda file: file.write(settings_toml(settings).encode()))
        if getattr(settings, "precision", "") == "16-mixed" and tt.get_backend(settings.device).xp is np:
            # measured on 2 cores: MLP 9.5 s against 0.3 s, CNN 381 s against 5.5 s
            print(f"note: on {settings.device!r} NumPy multiplies float16 matrices without BLAS, so 16-mixed "
                  f"runs 30-70x slower than 32-true here; it pays off on a GPU (--device cuda)")
    tt.manual_seed(settings.seed)
    return run


# -- failures ------------------------------------------------------------------------------------------------------
def _blamed(error: BaseException) -> str | None:
    """The report of ``error`` when it comes from a student's exported module, else None."""
    culprit = blame(error)
    if culprit is None:
        return None
    return f"the milestone failed in {culprit}: {type(error).__name__}: {error}\n{reset_advice(culprit.module)}"


def _note_exported_code() -> None:
    note = exported_note("the error")
    if note:
        print(f"note: {note}", file=sys.stderr)


def _report_failure(previous: Any, kind: type[BaseException], error: BaseException, traceback: Any) -> None:
    """``sys.excepthook`` of a recipe run as a script: the student's module that failed instead of a traceback;
    any other error goes on to the ``previous`` hook."""
    if isinstance(error, Exception):
        report = _blamed(error)
        if report is not None:
            print(report, file=sys.stderr)
            return
        _note_exported_code()
    previous(kind, error, traceback)


# -- running a recipe ----------------------------------------------------------------------------------------------
def recipe_folder() -> Path:
    """Where the recipes are: ``milestones/`` of the project this package belongs to (a clone, an editable
    install), else the copies that ``tinytrain build`` puts in the package (an installed one)."""
    project = PACKAGE_DIR.parent
    if (project / "pyproject.toml").is_file() and (project / "milestones").is_dir():
        return project / "milestones"
    return PACKAGE_DIR / RECIPES


def available() -> list[str]:
    """The names of the milestones, ``mlp``, ``cnn``, ... (those of :func:`recipe_folder`)."""
    return sorted(path.stem for path in recipe_folder().glob("*.py"))


def main(name: str, argv: Sequence[str]) -> int:
    """Run milestone ``name``, its recipe in :func:`recipe_folder`, in this process as ``python recipe *argv``
    would; the exit status.

    An exception from a student's exported module ends it with the report
    naming that module (``SystemExit``); any other passes through.
    """
    path = recipe_folder() / f"{name}.py"
    saved = sys.argv, sys.stdout, sys.excepthook
    sys.argv = [str(path), *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        raise
    except Exception as error:
        report = _blamed(error)
        if report is None:
            _note_exported_code()
            raise
        raise SystemExit(report) from None
    finally:
        sys.argv, sys.stdout, sys.excepthook = saved
    return 0
