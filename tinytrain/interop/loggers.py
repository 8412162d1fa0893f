"""Training logs that TensorBoard and MLflow read: callbacks for ``Trainer.fit``.

Both loggers write one point per history row (an epoch, or an evaluation of a
``fit(max_steps=...)`` run) at ``trainer.step``, the optimizer steps so far:
``train_loss``, ``eval_loss``, ``eval_accuracy`` (for a classifier), ``lr``,
``grad_norm``, ``skipped_steps`` (of that row), ``seconds`` (that row's) and,
given ``tokens_per_step``, ``tokens_per_second`` (the row's steps times that, over its
``train_seconds``: its training, the evaluation left out, as the milestones' lines show it). ``settings`` (a dict, or a
dataclass of a run's settings) are logged once, when a run starts; ``log_text``
adds a text such as a language model's sample.

Both continue a resumed run (a trainer loaded from a checkpoint): the
TensorBoard logger marks the restart in its log (a ``SessionLog.START`` event
one step after the checkpoint's step, so TensorBoard drops the rows the
interrupted run logged after that checkpoint), and the MLflow logger keeps its
run's id in the trainer's checkpoints and logs into that run again, skipping
the rows that run already holds (a resumed run computes them bit for bit).

They are callbacks by their hooks (``on_fit_begin``, ``on_epoch_end``,
``on_checkpoint``, ``on_fit_end``, ``state_dict``, ``load_state_dict``), and
``tt.callbacks`` names them beside ``CSVLogger``. Each needs its own package:
``pip install 'tinytrain[tensorboard]'`` or ``'tinytrain[mlflow]'``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
import types
from pathlib import Path
from typing import Any

METRICS = ("train_loss", "eval_loss", "eval_accuracy", "lr", "grad_norm", "seconds")


def _settings_dict(settings: Any) -> dict[str, Any]:
    if settings is None:
        return {}
    if dataclasses.is_dataclass(settings):
        return dataclasses.asdict(settings)
    if isinstance(settings, dict):
        return dict(settings)
    raise TypeError(f"settings must be a dict or a dataclass, got {type(settings).__name__}")


def _is_resumed(trainer: Any) -> bool:
    return trainer.epoch > 0 or trainer.step > 0


class _RowLogger:
    """What both loggers share: the hooks a callback needs and the metrics of one history row."""

    def __init__(self, settings: Any = None, tokens_per_step: int | None = None) -> None:
        if tokens_per_step is not None and (isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int)
                                            or tokens_per_step < 1):
            raise ValueError(f"tokens_per_step must be None or a whole number >= 1, got {tokens_per_step!r}")
        self.settings = _settings_dict(settings)
        self.tokens_per_step = tokens_per_step
        self._row_start_step = 0

    def metrics(self, trainer: Any, logs: dict[str, Any]) -> dict[str, float]:
        """The row's values by name; those without a value (no evaluation, a regression's accuracy) left out."""
        values = {name: logs.get(name) for name in METRICS}
        values["skipped_steps"] = trainer.history["skipped_steps"][-1]
        if self.tokens_per_step is not None and logs["train_seconds"] > 0:
            values["tokens_per_second"] = ((logs["step"] - self._row_start_step) * self.tokens_per_step
                                           / logs["train_seconds"])
        self._row_start_step = logs["step"]
        return {name: float(value) for name, value in values.items() if value is not None and not math.isnan(value)}

    def on_fit_begin(self, trainer: Any) -> None:
        self._row_start_step = trainer.step

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        """Log the row (each logger says how)."""

    def on_checkpoint(self, trainer: Any, logs: dict[str, Any]) -> None:
        """Nothing to save beyond ``state_dict``."""

    def on_fit_end(self, trainer: Any) -> None:
        """Flush what is buffered."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore unless a logger says otherwise."""


class TensorBoardLogger(_RowLogger):
    """Event files in ``log_dir`` for TensorBoard (``tensorboard --logdir log_dir``): a scalar per metric
    per row (tag ``train_loss``, ``lr``, ...; step ``trainer.step``), the settings as a text (tag
    ``settings``, a Markdown table), and whatever ``log_text`` adds.

    Written with the ``tensorboard`` package's own event-file writer (no
    TensorFlow, no PyTorch); every row is flushed to disk as it is logged, so a
    killed run keeps its rows.
    """

    def __init__(self, log_dir: str | os.PathLike, settings: Any = None, tokens_per_step: int | None = None) -> None:
        super().__init__(settings, tokens_per_step)
        self.log_dir = Path(log_dir)
        self._protos = self._import()
        self._writer: Any = None

    @staticmethod
    def _import() -> Any:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise ImportError("TensorBoardLogger needs the tensorboard package: pip install 'tinytrain[tensorboard]'") \
                from None
        return types.SimpleNamespace(event=event_pb2, summary=summary_pb2, tensor=tensor_pb2, shape=tensor_shape_pb2,
                                     writer=EventFileWriter)

    def _write(self, step: int, **event: Any) -> None:
        if self._writer is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = self._protos.writer(str(self.log_dir))
        self._writer.add_event(self._protos.event.Event(wall_time=time.time(), step=step, **event))

    def on_fit_begin(self, trainer: Any) -> None:
        super().on_fit_begin(trainer)
        if _is_resumed(trainer):
            # TensorBoard drops every point logged at or after a START's step: the rows the interrupted run wrote
            # after its checkpoint, which this run writes again
            self._write(trainer.step + 1, session_log=self._protos.event.SessionLog(
                status=self._protos.event.SessionLog.START))
        elif self.settings:
            rows = "\n".join(f"| {name} | {value} |" for name, value in self.settings.items())
            self.log_text("settings", f"| setting | value |\n|---|---|\n{rows}", step=0)

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        summary = self._protos.summary
        values = [summary.Summary.Value(tag=name, simple_value=value)
                  for name, value in self.metrics(trainer, logs).items()]
        self._write(logs["step"], summary=summary.Summary(value=values))
        self._writer.flush()

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Add ``text`` (Markdown) under ``tag`` at ``step``, as TensorBoard's text plugin reads it."""
        protos = self._protos
        tensor = protos.tensor.TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                                           tensor_shape=protos.shape.TensorShapeProto())
        metadata = protos.summary.SummaryMetadata(
            plugin_data=protos.summary.SummaryMetadata.PluginData(plugin_name="text"))
        value = protos.summary.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)
        self._write(step, summary=protos.summary.Summary(value=[value]))
        self._writer.flush()

    def on_fit_end(self, trainer: Any) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Close the event file (a later row or text opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class MLflowLogger(_RowLogger):
    """An MLflow run in ``experiment`` at ``tracking_uri`` (``sqlite:///runs/mlflow.db``, an MLflow server's
    URL; default: MLflow's own, ``MLFLOW_TRACKING_URI`` or ``./mlruns``): the settings as parameters, a
    metric per row at step ``trainer.step``, and at the end of ``fit`` the files ``artifacts`` (paths:
    the settings file, the best checkpoint) that exist then.

    A new experiment stores its artifacts in ``artifact_location``; by default, for
    a ``sqlite:///folder/x.db`` store, in ``folder/mlartifacts``. ``run_id`` is the
    run's id once ``fit`` has begun; the trainer's checkpoints keep it, so a
    resumed run logs into the same run.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str = "tinytrain", run_name: str | None = None,
                 settings: Any = None, artifacts: Any = (), tokens_per_step: int | None = None,
                 artifact_location: str | None = None) -> None:
        super().__init__(settings, tokens_per_step)
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ImportError("MLflowLogger needs the mlflow package: pip install 'tinytrain[mlflow]'") from None
        self._Metric, self._Param = Metric, Param
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.artifacts = [Path(path) for path in artifacts]
        self.artifact_location = artifact_location
        if artifact_location is None and tracking_uri and tracking_uri.startswith("sqlite:///"):
            self.artifact_location = (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
        self.run_id: str | None = None
        self._logged_until = -1  # the largest step the run already holds a row of

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        return self.client.create_experiment(self.experiment, artifact_location=self.artifact_location)

    def on_fit_begin(self, trainer: Any) -> None:
        super().on_fit_begin(trainer)
        if self.run_id is not None:  # restored from a checkpoint, or a second fit with this logger
            history = self.client.get_metric_history(self.run_id, "train_loss")
            self._logged_until = max((metric.step for metric in history), default=-1)
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(self._experiment_id(), run_name=self.run_name)
        self.run_id = run.info.run_id
        params = [self._Param(name, str(value)) for name, value in self.settings.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def on_epoch_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        metrics = self.metrics(trainer, logs)
        if logs["step"] <= self._logged_until:  # the interrupted run logged this row already, with these values
            return
        timestamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._Metric(name, value, timestamp, logs["step"])
                                                    for name, value in metrics.items()])

    def log_text(self, tag: str, text: str, step: int | None = None) -> None:
        """Store ``text`` as the artifact ``<tag>.txt`` of the run (``step``, if given, goes into the name)."""
        name = tag if step is None else f"{tag}-{step}"
        self.client.log_text(self.run_id, text, f"{name}.txt")

    def on_fit_end(self, trainer: Any) -> None:
        for path in self.artifacts:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id)

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state["run_id"]
