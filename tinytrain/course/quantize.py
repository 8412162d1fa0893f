"""``tinytrain quantize RUN_DIR``: a trained GPT milestone run in float32, int8 and NF4, side by side.

Reads the run's ``settings.toml`` and its best checkpoint (``checkpoints/best.pkl``), rebuilds the
model and the held-out text the GPT milestone evaluates on (the last ``validation_fraction`` of Tiny
Shakespeare, cut into windows of ``context`` characters side by side), and evaluates the same
weights four ways: float32, int8 with dynamic activations, int8 with static activations (calibrated
on windows spread over the training text), and NF4 (``tinytrain.quantization.quantize_model``).
Each row gives the bytes the model holds, the bytes of the layers that are quantized (the Linear
layers of the blocks; the tied output layer stays float), and the validation loss.

Importing this module asks for one BLAS thread, as the milestones do (it imports
``tinytrain.course.milestones`` before NumPy); the ``tinytrain`` command imports it only to run
``tinytrain quantize``. Hand-written tooling, not part of a lesson.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinytrain.course.milestones import SETTINGS_FILE  # first: one BLAS thread before NumPy loads

import numpy as np  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

BEST_CHECKPOINT = Path("checkpoints") / "best.pkl"
BATCH_SIZE = 64  # windows per batch, as the milestone evaluates
OBSERVERS = ("minmax", "percentile")


class RunError(Exception):
    """A run folder that cannot be evaluated; the message names the file and the problem."""


@dataclass(frozen=True)
class Row:
    """One way to hold the weights: its bytes (all of them, and those of the quantized layers) and validation loss."""

    name: str
    model_bytes: int
    layer_bytes: int
    val_loss: float


@dataclass(frozen=True)
class Report:
    run: Path
    step: int
    settings: dict[str, Any]
    windows: int
    calibration: str
    rows: list[Row]

    def lines(self) -> list[str]:
        settings, base = self.settings, self.rows[0]
        header = (f"{'':15s} {'model bytes':>12s} {'quantized layers':>17s} {'of float32':>10s} {'val loss':>9s} "
                  f"{'vs float32':>10s}")
        lines = [f"{self.run}: the best checkpoint (step {self.step}), {settings['n_layer']} blocks of "
                 f"{settings['n_embd']} channels",
                 f"validation loss over {self.windows:,} windows of {settings['context']} characters, the last "
                 f"{settings['validation_fraction']:.0%} of the text; int8 static calibrated on {self.calibration}",
                 "", header]
        for row in self.rows:
            lines.append(f"{row.name:15s} {row.model_bytes:12,d} {row.layer_bytes:17,d} "
                         f"{row.layer_bytes / base.layer_bytes:10.1%} {row.val_loss:9.4f} "
                         f"{row.val_loss / base.val_loss - 1:+10.2%}")
        return lines


def read_run(run: Path) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The settings of a GPT milestone run, and the model state and step of its best checkpoint."""
    from tinytrain.serialization import CheckpointError, read_checkpoint

    settings_path, checkpoint_path = run / SETTINGS_FILE, run / BEST_CHECKPOINT
    for path in (settings_path, checkpoint_path):
        if not path.is_file():
            raise RunError(f"{path} does not exist: RUN_DIR is the --out folder of a finished `python "
                           "milestones/gpt.py` run")
    try:
        with open(settings_path, "rb") as file:
            settings = tomllib.load(file)
    except tomllib.TOMLDecodeError as error:
        raise RunError(f"{settings_path} is not valid TOML: {error}") from None
    needed = ("dataset", "context", "n_layer", "n_head", "n_embd", "validation_fraction")
    missing = [key for key in needed if key not in settings]
    if missing:
        raise RunError(f"{settings_path} lacks {', '.join(missing)}: not the settings of a GPT milestone run")
    if settings["dataset"] != "shakespeare":
        raise RunError(f"{settings_path}: dataset {settings['dataset']!r}; tinytrain quantize evaluates GPT runs on "
                       "shakespeare")
    try:
        checkpoint = read_checkpoint(checkpoint_path)
    except CheckpointError as error:
        raise RunError(str(error)) from None
    return settings, checkpoint["model"], int(checkpoint["step"])


def quantize_run(run: Path, calibration_batches: int = 8, observer: str = "minmax",
                 percentile: float = 99.99) -> Report:
    """Evaluate the run's best weights in float32, int8 (dynamic, static) and NF4."""
    import tinytrain as tt
    from tinytrain.quantization import Observer, linear_layers, model_bytes, quantize_model

    if calibration_batches < 1:
        raise RunError(f"--calibration-batches must be at least 1, got {calibration_batches}")
    if observer not in OBSERVERS:
        raise RunError(f"--observer must be one of {', '.join(OBSERVERS)}, got {observer!r}")
    settings, state, step = read_run(Path(run))
    text = tt.datasets.shakespeare()
    tokenizer = tt.text.CharTokenizer().train(text)  # as the milestone: every character of the whole text
    cut = int(len(text) * (1 - settings["validation_fraction"]))
    train_ids, val_ids = np.array(tokenizer.encode(text[:cut])), np.array(tokenizer.encode(text[cut:]))
    context = settings["context"]
    validation = tt.data.TokenWindows(val_ids, context, stride=context)
    # calibration: windows at evenly spaced starts over the training text
    starts = np.linspace(0, len(train_ids) - context - 1, calibration_batches * BATCH_SIZE).astype(np.int64)
    calibration = np.stack([train_ids[start:start + context] for start in starts]).reshape(
        calibration_batches, BATCH_SIZE, context)
    config = tt.nn.GPTConfig(tokenizer.vocab_size, context, settings["n_layer"], settings["n_head"],
                             settings["n_embd"], dropout=settings.get("dropout", 0.0))

    def float_model() -> Any:
        model = tt.nn.GPT(config)
        try:
            model.load_state_dict(state)
        except (RuntimeError, TypeError) as error:
            raise RunError(f"{run / BEST_CHECKPOINT} does not fit the model of {run / SETTINGS_FILE}: {error}") \
                from None
        return model.eval()

    def make_observer() -> Observer:
        return Observer(observer, percentile)

    names = [name for name, _ in linear_layers(float_model())]
    variants = {
        "float32": float_model,
        "int8 dynamic": lambda: quantize_model(float_model(), "int8"),
        "int8 static": lambda: quantize_model(float_model(), "int8", calibration=list(calibration),
                                              observer=make_observer),
        "NF4": lambda: quantize_model(float_model(), "nf4"),
    }
    rows = []
    for name, make in variants.items():
        model = make()
        modules = dict(model.named_modules())
        rows.append(Row(name, model_bytes(model), sum(model_bytes(modules[layer]) for layer in names),
                        validation_loss(model, validation)))
    how = "min/max" if observer == "minmax" else f"the {percentile:g}th percentiles"
    return Report(Path(run), step, settings, len(validation),
                  f"{calibration_batches} batches of {BATCH_SIZE} training windows ({how})", rows)


def validation_loss(model: Any, windows: Any) -> float:
    """The mean cross-entropy of every next-character prediction over ``windows``, as the milestone reports it."""
    import tinytrain as tt

    total = 0.0
    with tt.no_grad():
        for inputs, targets in tt.data.DataLoader(windows, batch_size=BATCH_SIZE):
            _, loss = model(inputs, targets=targets)
            total += loss.item() * len(inputs)
    return total / len(windows)
