"""TensorBoardLogger and MLflowLogger: the history's rows read back with each tool's own reader, and a
resumed run that continues the same run with no duplicate step. Skipped where the package is absent."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn
from tinytrain.callbacks import MLflowLogger, ModelCheckpoint, TensorBoardLogger
from tinytrain.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(1)
DATA = TensorDataset(RNG.standard_normal((64, 5)).astype(np.float32), RNG.integers(0, 3, 64))
SETTINGS = {"lr": 0.2, "batch_size": 16, "model": "mlp"}


def make_trainer() -> tt.Trainer:
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    return tt.Trainer(model, tt.SGD(model.parameters(), lr=0.2), nn.CrossEntropyLoss(), grad_clip_norm=10.0)


def fit(trainer: tt.Trainer, epochs: int, callbacks: list) -> dict:
    return trainer.fit(DataLoader(DATA, batch_size=16, shuffle=True, seed=3), DataLoader(DATA, batch_size=32),
                       epochs=epochs, callbacks=callbacks, progress=False)


def interrupted_and_resumed(tmp_path: Path, make_logger) -> dict:
    """Three epochs logged, then a run resumed from the checkpoint of epoch 2 and logged again to epoch 3
    (as after a kill just before the third epoch's checkpoint); the uninterrupted history."""
    checkpoints = ModelCheckpoint(tmp_path / "checkpoints", keep_last=3)
    history = fit(make_trainer(), 3, [make_logger(), checkpoints])
    resumed = make_trainer()
    resumed.load_checkpoint(tmp_path / "checkpoints" / "epoch-0002.pkl")
    fit(resumed, 3, [make_logger(), checkpoints])
    return history


# -- TensorBoard -----------------------------------------------------------------------------------------------------
def event_accumulator(log_dir: Path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def test_tensorboard_reads_every_row_of_the_history(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    logger = TensorBoardLogger(tmp_path / "tb", settings=SETTINGS)
    trainer = make_trainer()
    history = fit(trainer, 3, [logger])
    logger.log_text("sample", "To be, or not", step=trainer.step)
    events = event_accumulator(tmp_path / "tb")
    for tag, key in (("train_loss", "train_loss"), ("eval_loss", "eval_loss"), ("eval_accuracy", "eval_accuracy"),
                     ("lr", "learning_rates"), ("grad_norm", "grad_norm"), ("skipped_steps", "skipped_steps")):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [4, 8, 12], tag  # trainer.step after each epoch of 4 batches
        assert [s.value for s in scalars] == [np.float32(v) for v in history[key]], tag
    settings = events.Tensors("settings")[0].tensor_proto.string_val[0].decode()
    assert "| lr | 0.2 |" in settings and "| model | mlp |" in settings
    assert events.Tensors("sample")[0].tensor_proto.string_val[0].decode() == "To be, or not"


def test_tensorboard_resumed_run_has_each_step_once(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    history = interrupted_and_resumed(tmp_path, lambda: TensorBoardLogger(tmp_path / "tb"))
    scalars = event_accumulator(tmp_path / "tb").Scalars("train_loss")
    assert [s.step for s in scalars] == [4, 8, 12]
    assert [s.value for s in scalars] == [np.float32(v) for v in history["train_loss"]]


def test_tokens_per_second_from_the_steps_of_the_row(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    training_times = []

    class TrainingTimes(tt.callbacks.Callback):
        def on_epoch_end(self, trainer, logs):
            training_times.append(logs["train_seconds"])

    fit(make_trainer(), 2, [TensorBoardLogger(tmp_path / "tb", tokens_per_step=1000), TrainingTimes()])
    scalars = event_accumulator(tmp_path / "tb").Scalars("tokens_per_second")
    # 4 steps an epoch over the epoch's training time, its evaluation left out
    expected = [np.float32(4 * 1000 / seconds) for seconds in training_times]
    assert [s.value for s in scalars] == pytest.approx(expected, rel=1e-6)


def test_logger_arguments_are_checked(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    with pytest.raises(ValueError, match="tokens_per_step .* got 0"):
        TensorBoardLogger(tmp_path, tokens_per_step=0)
    with pytest.raises(TypeError, match="settings must be a dict or a dataclass, got list"):
        TensorBoardLogger(tmp_path, settings=[1])


# -- MLflow ----------------------------------------------------------------------------------------------------------
def mlflow_logger(tmp_path: Path, **options) -> MLflowLogger:
    return MLflowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="digits", **options)


def test_mlflow_run_holds_the_history_settings_and_artifacts(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    (tmp_path / "settings.toml").write_text('lr = 0.2\n')
    logger = mlflow_logger(tmp_path, settings=SETTINGS, artifacts=[tmp_path / "settings.toml", tmp_path / "absent"])
    history = fit(make_trainer(), 3, [logger])
    logger.log_text("sample", "To be, or not")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = mlflow.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.2", "batch_size": "16", "model": "mlp"}
    client = mlflow.tracking.MlflowClient()
    for name, key in (("train_loss", "train_loss"), ("eval_accuracy", "eval_accuracy"), ("lr", "learning_rates")):
        points = client.get_metric_history(logger.run_id, name)
        assert [(p.step, p.value) for p in points] == list(zip([4, 8, 12], history[key])), name
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert str(artifacts).startswith(str(tmp_path / "mlartifacts"))
    assert (artifacts / "settings.toml").read_text() == "lr = 0.2\n" and not (artifacts / "absent").exists()
    assert (artifacts / "sample.txt").read_text() == "To be, or not"


def test_mlflow_resumed_run_continues_the_same_run(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    loggers = []
    history = interrupted_and_resumed(tmp_path, lambda: loggers.append(mlflow_logger(tmp_path)) or loggers[-1])
    assert loggers[0].run_id == loggers[1].run_id
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(client.search_runs([client.get_experiment_by_name("digits").experiment_id])) == 1
    points = client.get_metric_history(loggers[0].run_id, "train_loss")
    assert [(p.step, p.value) for p in points] == list(zip([4, 8, 12], history["train_loss"]))


# -- the milestones' --logger ----------------------------------------------------------------------------------------
@pytest.mark.slow  # about a minute: two milestone processes, each creating or opening an MLflow store
def test_milestone_logs_to_both_and_a_resumed_run_continues_them(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    command = [sys.executable, str(ROOT / "milestones" / "mlp.py"), "--epochs", "4", "--out", str(out),
               "--logger", "tensorboard", "--logger", "mlflow"]
    environment = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    for extra, ending in ((["--stop-after", "2"], "stopped after epoch 2 of 4"), (["--resume"], "test accuracy")):
        done = subprocess.run(command + extra, capture_output=True, text=True, timeout=300, env=environment)
        assert ending in done.stdout, done.stderr  # 4 epochs may miss the pass mark: the exit status says so
    with open(out / "log.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    steps, losses = [int(row["step"]) for row in rows], [float(row["train_loss"]) for row in rows]
    scalars = event_accumulator(out / "tensorboard").Scalars("train_loss")
    assert [s.step for s in scalars] == steps and [s.value for s in scalars] == pytest.approx(losses, rel=1e-6)
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("mlp-digits").experiment_id])
    points = client.get_metric_history(run.info.run_id, "train_loss")
    assert [p.step for p in points] == steps and [p.value for p in points] == pytest.approx(losses, rel=1e-12)
    assert run.data.params["epochs"] == "4" and run.data.params["dataset"] == "digits"
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert {path.name for path in artifacts.iterdir()} == {"settings.toml", "best.pkl"}
