"""Callbacks: ModelCheckpoint (rotation, best, every K-th, fsspec mirror), CSVLogger, EarlyStopping,
and their state across a resume."""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn
from tinytrain.callbacks import Callback, CSVLogger, EarlyStopping, ModelCheckpoint
from tinytrain.serialization import read_checkpoint
from tinytrain.data import DataLoader, TensorDataset

RNG = np.random.default_rng(1)
DATA = TensorDataset(RNG.standard_normal((64, 5)).astype(np.float32), RNG.integers(0, 3, 64))


def make_trainer(seed: int = 0) -> tt.Trainer:
    tt.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    return tt.Trainer(model, tt.SGD(model.parameters(), lr=0.2), nn.CrossEntropyLoss())


def loaders() -> tuple[DataLoader, DataLoader]:
    return DataLoader(DATA, batch_size=16, shuffle=True, seed=3), DataLoader(DATA, batch_size=32)


class Scripted(Callback):
    """Overwrites the monitored log entry with scripted values, one per epoch."""

    def __init__(self, key: str, values: list[float]) -> None:
        self.key, self.values = key, values

    def on_epoch_end(self, trainer, logs) -> None:
        logs[self.key] = self.values[trainer.epoch - 1]


def epoch_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("epoch-*.pkl"))


def test_keeps_the_last_n_every_kth_and_the_best(tmp_path: Path) -> None:
    trainer = make_trainer()
    losses = [5.0, 3.0, 4.0, 1.0, 2.0, 6.0, 7.0]
    saver = ModelCheckpoint(tmp_path, keep_last=2, every=3, monitor="eval_loss")
    trainer.fit(*loaders(), epochs=7, callbacks=[Scripted("eval_loss", losses), saver], progress=False)
    assert epoch_files(tmp_path) == ["epoch-0003.pkl", "epoch-0006.pkl", "epoch-0007.pkl"]
    assert (saver.best, saver.best_epoch) == (1.0, 4)
    best = read_checkpoint(tmp_path / "best.pkl")
    assert best["epoch"] == 4 and best["callbacks"]["ModelCheckpoint"] == {"best": 1.0, "best_epoch": 4}
    last = read_checkpoint(tmp_path / "epoch-0007.pkl")
    assert last["epoch"] == 7 and len(last["history"]["train_loss"]) == 7
    assert list(saver.epoch_files()) == [3, 6, 7]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary files left"


def test_monitoring_accuracy_keeps_the_highest(tmp_path: Path) -> None:
    trainer = make_trainer()
    saver = ModelCheckpoint(tmp_path, monitor="eval_accuracy")
    trainer.fit(*loaders(), epochs=4, callbacks=[Scripted("eval_accuracy", [0.5, 0.9, 0.7, 0.8]), saver],
                progress=False)
    assert saver.mode == "max" and (saver.best, saver.best_epoch) == (0.9, 2)
    assert read_checkpoint(tmp_path / "best.pkl")["epoch"] == 2
    assert epoch_files(tmp_path) == ["epoch-0004.pkl"]


def test_a_resumed_run_keeps_its_best_and_later_files_of_an_abandoned_run(tmp_path: Path) -> None:
    trainer = make_trainer()
    losses = [3.0, 1.0, 2.0, 2.5, 0.5, 0.4]
    trainer.fit(*loaders(), epochs=4, progress=False,
                callbacks=[Scripted("eval_loss", losses), ModelCheckpoint(tmp_path, keep_last=3, monitor="eval_loss")])
    assert epoch_files(tmp_path) == ["epoch-0002.pkl", "epoch-0003.pkl", "epoch-0004.pkl"]

    resumed = make_trainer(seed=1)
    resumed.load_checkpoint(tmp_path / "epoch-0003.pkl")  # back to epoch 3; epoch-0004 is from the old timeline
    saver = ModelCheckpoint(tmp_path, keep_last=3, monitor="eval_loss")
    scripted = Scripted("eval_loss", [9.0, 9.0, 9.0, 1.5, 0.5, 0.4])
    resumed.fit(*loaders(), epochs=4, callbacks=[scripted, saver], progress=False)
    assert (saver.best, saver.best_epoch) == (1.0, 2), "the best so far came back from the checkpoint"
    assert read_checkpoint(tmp_path / "best.pkl")["epoch"] == 2, "a worse epoch does not replace best.pkl"
    assert read_checkpoint(tmp_path / "epoch-0004.pkl")["callbacks"]["Scripted"] == {}
    resumed.fit(*loaders(), epochs=6, callbacks=[scripted, saver], progress=False)
    assert epoch_files(tmp_path) == ["epoch-0004.pkl", "epoch-0005.pkl", "epoch-0006.pkl"]
    assert read_checkpoint(tmp_path / "best.pkl")["epoch"] == 6


class Killed(BaseException):
    """The process dies here: nothing after it runs."""


def dies_at(kill_at: int, replace):
    """``os.replace`` that raises :class:`Killed` instead of making its ``kill_at``-th rename."""
    renames = iter(range(1, 100))

    def dying_replace(*paths) -> None:
        if next(renames) == kill_at:
            raise Killed
        replace(*paths)

    return dying_replace


def resume_or_start(directory: Path, losses: list[float], epochs: int) -> None:
    """Train to ``epochs`` from the newest epoch file in ``directory`` (from scratch if there is none)."""
    trainer = make_trainer()
    if epoch_files(directory):
        trainer.load_checkpoint(directory / epoch_files(directory)[-1])
    trainer.fit(*loaders(), epochs=epochs, progress=False,
                callbacks=[Scripted("eval_loss", losses), ModelCheckpoint(directory, monitor="eval_loss")])


def test_a_run_killed_before_any_rename_resumes_to_the_same_best(tmp_path: Path, monkeypatch) -> None:
    losses = [3.0, 2.0, 1.0, 4.0]
    real_replace = os.replace
    renames = []
    monkeypatch.setattr(os, "replace", lambda *paths: (renames.append(paths), real_replace(*paths)))
    resume_or_start(tmp_path / "straight", losses, 4)
    expected = read_checkpoint(tmp_path / "straight" / "best.pkl")
    assert expected["epoch"] == 3 and len(renames) == 7, "best.pkl and the epoch file of epochs 1-3, then epoch 4"
    for kill_at in range(1, len(renames) + 1):
        directory = tmp_path / f"killed-{kill_at}"
        monkeypatch.setattr(os, "replace", dies_at(kill_at, real_replace))
        with pytest.raises(Killed):
            resume_or_start(directory, losses, 4)
        monkeypatch.setattr(os, "replace", real_replace)
        resume_or_start(directory, losses, 4)
        best = read_checkpoint(directory / "best.pkl")
        assert (best["epoch"], best["callbacks"]["ModelCheckpoint"]["best_epoch"]) == (3, 3), kill_at
        assert all(np.array_equal(best["model"][name], expected["model"][name]) for name in expected["model"])
        assert epoch_files(directory) == ["epoch-0004.pkl"], kill_at


def test_a_resumed_run_deletes_the_files_the_killed_one_had_no_time_to(tmp_path: Path) -> None:
    make_trainer().fit(*loaders(), epochs=3, callbacks=[ModelCheckpoint(tmp_path, keep_last=3)], progress=False)
    resumed = make_trainer()
    resumed.load_checkpoint(tmp_path / "epoch-0003.pkl")
    resumed.fit(*loaders(), epochs=3, callbacks=[ModelCheckpoint(tmp_path, keep_last=1)], progress=False)
    assert epoch_files(tmp_path) == ["epoch-0003.pkl"], "nothing left to train, but the old files go"


def test_uploads_every_file_and_mirrors_deletions_with_fsspec(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    remote = fsspec.filesystem("memory")
    saver = ModelCheckpoint(tmp_path, keep_last=2, monitor="train_loss", upload_to="memory://bucket/run")
    make_trainer().fit(*loaders(), epochs=4, callbacks=[saver], progress=False)
    names = sorted(Path(p).name for p in remote.ls("/bucket/run", detail=False))
    assert names == ["best.pkl", "epoch-0003.pkl", "epoch-0004.pkl"]
    for name in names:
        assert remote.cat_file(f"/bucket/run/{name}") == (tmp_path / name).read_bytes()
    remote.rm("/bucket", recursive=True)


def test_a_failing_upload_warns_and_training_goes_on(tmp_path: Path, monkeypatch) -> None:
    fsspec = pytest.importorskip("fsspec")
    saver = ModelCheckpoint(tmp_path, upload_to="memory://flaky/run")
    filesystem = saver._remote[0]

    def unreachable(*args, **kwargs):
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(filesystem, "put_file", unreachable)
    trainer = make_trainer()
    with pytest.warns(RuntimeWarning, match=r"could not copy memory://.*flaky/run/epoch-\d+.pkl: network") as caught:
        trainer.fit(*loaders(), epochs=2, callbacks=[saver], progress=False)
    assert len(caught) == 2
    assert trainer.epoch == 2 and epoch_files(tmp_path) == ["epoch-0002.pkl"]
    fsspec.filesystem("memory").rm("/flaky", recursive=True)


def test_monitoring_needs_the_metric(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="val_loader"):
        make_trainer().fit(loaders()[0], epochs=1, callbacks=[ModelCheckpoint(tmp_path, monitor="eval_loss")],
                           progress=False)
    with pytest.raises(KeyError, match="eval_los'.*eval_accuracy"):
        make_trainer().fit(*loaders(), epochs=1, callbacks=[EarlyStopping(monitor="eval_los")], progress=False)


@pytest.mark.parametrize("kwargs, match", [({"keep_last": 0}, "keep_last"), ({"every": 0}, "every"),
                                           ({"monitor": "x", "mode": "lowest"}, "mode")])
def test_bad_model_checkpoint_settings(tmp_path: Path, kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelCheckpoint(tmp_path, **kwargs)


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_csv_logger_writes_one_row_per_epoch(tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.grad_clip_norm = 10.0
    trainer.fit(*loaders(), epochs=3, callbacks=[CSVLogger(tmp_path / "logs" / "log.csv")], progress=False)
    rows = read_rows(tmp_path / "logs" / "log.csv")
    assert list(rows[0]) == list(CSVLogger.COLUMNS)
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    for row, loss, accuracy in zip(rows, trainer.history["train_loss"], trainer.history["eval_accuracy"]):
        assert float(row["train_loss"]) == loss and float(row["eval_accuracy"]) == accuracy
        assert float(row["lr"]) == 0.2 and float(row["grad_norm"]) > 0 and float(row["seconds"]) > 0


def test_csv_logger_leaves_eval_columns_empty_without_evaluation(tmp_path: Path) -> None:
    make_trainer().fit(loaders()[0], epochs=1, callbacks=[CSVLogger(tmp_path / "log.csv")], progress=False)
    row = read_rows(tmp_path / "log.csv")[0]
    assert row["eval_loss"] == row["eval_accuracy"] == "" and row["grad_norm"] == "nan"


def test_csv_logger_on_resume_keeps_the_rows_up_to_the_checkpoint(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    trainer = make_trainer()
    callbacks = [CSVLogger(log), ModelCheckpoint(tmp_path, keep_last=5)]
    trainer.fit(*loaders(), epochs=4, callbacks=callbacks, progress=False)
    original = read_rows(log)
    resumed = make_trainer()
    resumed.load_checkpoint(tmp_path / "epoch-0002.pkl")
    resumed.fit(*loaders(), epochs=5, callbacks=[CSVLogger(log)], progress=False)
    rows = read_rows(log)
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4, 5]
    assert [r["train_loss"] for r in rows[:4]] == [r["train_loss"] for r in original], "exact resume, same numbers"
    make_trainer().fit(*loaders(), epochs=1, callbacks=[CSVLogger(log)], progress=False)
    assert len(read_rows(log)) == 1, "a fresh run starts a fresh file"


def test_step_runs_name_checkpoints_by_step_and_log_once_per_evaluation(tmp_path: Path) -> None:
    # 64 samples in batches of 16: 4 steps per epoch, an evaluation every 3 steps, mostly mid-epoch
    def run(trainer: tt.Trainer, max_steps: int) -> None:
        trainer.fit(*loaders(), max_steps=max_steps, eval_every=3, progress=False,
                    callbacks=[CSVLogger(tmp_path / "log.csv"), ModelCheckpoint(tmp_path, keep_last=2, unit="step")])

    run(make_trainer(), 6)
    assert sorted(p.name for p in tmp_path.glob("*.pkl")) == ["step-0000003.pkl", "step-0000006.pkl"]
    resumed = make_trainer()
    resumed.load_checkpoint(tmp_path / "step-0000003.pkl")  # epoch 0: the run stopped mid-epoch
    run(resumed, 9)
    assert sorted(p.name for p in tmp_path.glob("*.pkl")) == ["step-0000006.pkl", "step-0000009.pkl"]
    assert [r["step"] for r in read_rows(tmp_path / "log.csv")] == ["3", "6", "9"]
    with pytest.raises(ValueError, match="unit must be 'epoch' or 'step', got 'batch'"):
        ModelCheckpoint(tmp_path, unit="batch")


def test_early_stopping_waits_patience_epochs(tmp_path: Path) -> None:
    trainer = make_trainer()
    stopper = EarlyStopping(monitor="eval_loss", patience=2, min_delta=0.1)
    losses = [1.0, 0.8, 0.75, 0.72, 0.5, 0.6, 0.6, 0.1]
    trainer.fit(*loaders(), epochs=8, callbacks=[Scripted("eval_loss", losses), stopper], progress=False)
    # 0.75 and 0.72 are not 0.1 better than 0.8: stop after epoch 4
    assert trainer.epoch == 4 and stopper.stopped_epoch == 4 and (stopper.best, stopper.best_epoch) == (0.8, 2)


def test_early_stopping_restores_the_best_weights() -> None:
    trainer = make_trainer()
    stopper = EarlyStopping(monitor="eval_accuracy", patience=1, restore_best=True)
    snapshots = []

    class Snapshot(Callback):
        def on_epoch_end(self, trainer, logs):
            snapshots.append([p.numpy() for p in trainer.model.parameters()])

    trainer.fit(*loaders(), epochs=10, progress=False,
                callbacks=[Scripted("eval_accuracy", [0.2, 0.6, 0.5]), Snapshot(), stopper])
    assert trainer.epoch == 3 and stopper.mode == "max"
    for restored, best in zip(trainer.model.parameters(), snapshots[1]):
        assert np.array_equal(restored.numpy(), best)


def test_early_stopping_state_survives_a_resume_in_the_checkpoint_of_that_epoch(tmp_path: Path) -> None:
    trainer = make_trainer()
    losses = [1.0, 2.0, 3.0, 4.0]
    callbacks = [ModelCheckpoint(tmp_path, keep_last=5), Scripted("eval_loss", losses),
                 EarlyStopping(patience=3)]  # saved *before* it in the list: its state must still be current
    trainer.fit(*loaders(), epochs=2, callbacks=callbacks, progress=False)
    assert read_checkpoint(tmp_path / "epoch-0002.pkl")["callbacks"]["EarlyStopping"]["wait"] == 1
    resumed = make_trainer()
    resumed.load_checkpoint(tmp_path / "epoch-0002.pkl")
    stopper = EarlyStopping(patience=3)
    resumed.fit(*loaders(), epochs=10, callbacks=[Scripted("eval_loss", losses), stopper], progress=False)
    assert resumed.epoch == 4 and stopper.wait == 3, "patience counts the epochs before the resume too"


@pytest.mark.parametrize("kwargs, match", [({"patience": 0}, "patience"), ({"min_delta": -1}, "min_delta"),
                                           ({"mode": "up"}, "mode")])
def test_bad_early_stopping_settings(kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EarlyStopping(**kwargs)


def test_on_a_rank_that_does_not_write_it_only_takes_part_in_saving(tmp_path: Path) -> None:
    """Every rank's ModelCheckpoint calls save_checkpoint (a collective under ZeRO); only the writer makes,
    copies and prunes files, so no rank races the writer for best.pkl."""
    from tinytrain.distributed import DataParallel, SingleProcess

    class OtherRank(SingleProcess):
        def Get_rank(self):
            return 1

    trainer = make_trainer()
    trainer.strategy = DataParallel(OtherRank())  # a rank that is not the writer, without the setup broadcast
    trainer._plugins = [trainer.strategy]
    saves = []
    trainer.save_checkpoint = lambda path: saves.append(Path(path).name)
    (tmp_path / "epoch-0001.pkl").write_bytes(b"the writer's file")  # keep_last=1: the writer would prune it
    saver = ModelCheckpoint(tmp_path, keep_last=1, monitor="eval_loss")
    trainer.fit(*loaders(), epochs=2, callbacks=[Scripted("eval_loss", [2.0, 1.0]), saver], progress=False)
    assert trainer.is_writer is False
    assert saves == ["epoch-0001.pkl", "epoch-0002.pkl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0001.pkl"]  # nothing copied, pruned or made
    assert (saver.best, saver.best_epoch) == (1.0, 2)  # it tracks the best like the writer, to agree with it
