"""Fault injection: runs that are SIGKILLed mid-save lose nothing.

The processes under test run with ``tests/faults`` first on ``PYTHONPATH``, whose
``sitecustomize`` counts every file-system step of a save (open for writing,
fsync, rename, unlink) and SIGKILLs the process just before the N-th one. So a
kill lands at each named step of a save: before the temporary file is opened,
before its fsync, before the rename, before the directory's fsync, before a
pruned checkpoint is deleted, before ``best.pkl`` is written.

* A loop that saves checkpoints to one path, killed at every step of a save and
  at random moments: the file is always a complete checkpoint of some earlier
  state, and the next save leaves no temporary file behind.
* The MLP milestone (``ModelCheckpoint`` keeping the last epoch and the best
  one), killed at every step of the saves of an epoch and at random moments,
  then resumed with ``--resume`` until it finishes: it ends with the same files,
  bit-identical final weights and the same best checkpoint as a run that was
  never interrupted.
"""
from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tinytrain.serialization import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FAULTS = Path(__file__).resolve().parent / "faults"
MILESTONE = ("--epochs", "3", "--warmup", "0")

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")


def _run(args: list[str], kill_at: int = 0, count: Path | None = None, kill_after: float | None = None,
         cwd: Path = ROOT) -> subprocess.CompletedProcess | int:
    """Run ``python args`` with the fault hook; the exit status (negative: the signal) or the result."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]),
           "TINYTRAIN_KILL_AT": str(kill_at), "OPENBLAS_NUM_THREADS": "1"}
    if count is not None:
        env["TINYTRAIN_COUNT_STEPS"] = str(count)
    process = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        try:
            process.wait(kill_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


SAVE_LOOP = """
import sys
import numpy as np
from tinytrain.serialization import write_checkpoint
for step in range(1, 31):
    write_checkpoint(sys.argv[1], {"step": step, "weights": np.full(50_000, step, np.float32)})
"""


def test_a_save_loop_killed_anywhere_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "state.ckpt"
    count = tmp_path / "steps"
    assert _run(["-c", SAVE_LOOP, str(path)], count=count).returncode == 0
    steps = int(count.read_text())
    assert steps == 30 * 4, "a save: open, fsync the file, rename, fsync the folder"
    kills = list(range(1, 13)) + random.Random(0).sample(range(13, steps + 1), 8)  # every step of 3 saves
    for kill_at in kills:
        path.unlink(missing_ok=True)
        result = _run(["-c", SAVE_LOOP, str(path)], kill_at=kill_at)
        assert result.returncode == -signal.SIGKILL, result.stderr
        saves_done = kill_at // 4  # a save counts once its rename (its third step) is done
        if saves_done == 0:
            assert not path.exists()
        else:
            state = read_checkpoint(path)
            assert state["step"] == saves_done and (state["weights"] == saves_done).all(), kill_at
        # the next save of the same file clears what the killed one left behind
        subprocess.run([sys.executable, "-c", SAVE_LOOP.replace("range(1, 31)", "range(99, 100)"), str(path)],
                       check=True)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name != "steps") == ["state.ckpt"], kill_at
    moments = random.Random(len(kills))
    for _ in range(6):  # and at moments no step names
        path.unlink(missing_ok=True)
        _run(["-c", SAVE_LOOP, str(path)], kill_after=moments.uniform(0.3, 1.0))
        if path.exists():
            assert read_checkpoint(path)["step"] >= 1


def _milestone(out: Path, *options: str, kill_at: int = 0, count: Path | None = None,
               kill_after: float | None = None) -> subprocess.CompletedProcess:
    return _run([str(ROOT / "milestones" / "mlp.py"), *MILESTONE, "--out", str(out), *options], kill_at=kill_at,
                count=count, kill_after=kill_after)


def _finish(out: Path) -> int:
    """Resume a killed milestone run until it ends; the number of resumes."""
    for resumes in range(1, 10):
        started = (out / "checkpoints").is_dir() and any((out / "checkpoints").glob("epoch-*.pkl"))
        result = _milestone(out, *(["--resume"] if started else []))
        assert result.returncode in (0, 1), result.stderr[-3000:]
        if (out / "result.json").exists() and "test accuracy" in result.stdout:
            return resumes
    raise AssertionError(f"{out} never finished")


def _outcome(out: Path) -> dict:
    """What a finished run keeps: its files, final and best weights, the log without the timings."""
    checkpoints = out / "checkpoints"
    last = read_checkpoint(sorted(checkpoints.glob("epoch-*.pkl"))[-1])
    best = read_checkpoint(checkpoints / "best.pkl")
    with open(out / "log.csv", newline="") as file:
        log = [{key: value for key, value in row.items() if key != "seconds"} for row in csv.DictReader(file)]
    callbacks = best["callbacks"]["ModelCheckpoint"]
    return {"files": sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()),
            "last": last["model"], "best": best["model"], "best_epoch": (best["epoch"], callbacks["best_epoch"]),
            "log": log}


def test_a_milestone_killed_at_every_step_of_a_save_resumes_to_the_same_files_and_weights(tmp_path: Path) -> None:
    count = tmp_path / "steps"
    straight = _outcome_of_straight_run(tmp_path / "straight", count)
    steps = int(count.read_text())
    assert steps > 20, steps
    rng = random.Random(1)
    # every step from the start of epoch 2's saves to the end of epoch 3's, and random moments
    kills = sorted(set(range(steps // 3, steps + 1)) | set(rng.sample(range(1, steps // 3), 3)))
    lost = []
    for kill_at in kills:
        out = tmp_path / f"killed-{kill_at}"
        killed = _milestone(out, kill_at=kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr[-2000:])
        _finish(out)
        if _differences(straight, _outcome(out)):
            lost.append((kill_at, _differences(straight, _outcome(out))))
    for moment in (0.8, 1.6, 2.4):
        out = tmp_path / f"killed-after-{moment}s"
        _milestone(out, kill_after=moment)
        _finish(out)
        if _differences(straight, _outcome(out)):
            lost.append((f"{moment} s", _differences(straight, _outcome(out))))
    print(f"{len(kills) + 3} kills of the milestone, {len(lost)} with anything lost")
    assert lost == [], lost


def _outcome_of_straight_run(out: Path, count: Path) -> dict:
    result = _milestone(out, count=count)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return _outcome(out)


def _differences(expected: dict, got: dict) -> list[str]:
    problems = []
    if got["files"] != expected["files"]:
        problems.append(f"files {sorted(set(got['files']) ^ set(expected['files']))}")
    for key in ("last", "best"):
        if got[key].keys() != expected[key].keys() or any(
                not np.array_equal(got[key][name], expected[key][name]) for name in expected[key]):
            problems.append(f"{key} weights differ")
    if got["best_epoch"] != expected["best_epoch"]:
        problems.append(f"best epoch {got['best_epoch']} instead of {expected['best_epoch']}")
    if got["log"] != expected["log"]:
        problems.append("log rows differ")
    return problems


def test_the_fault_hook_counts_and_kills() -> None:
    started = time.perf_counter()
    assert _run(["-c", "open('/dev/null', 'w').close()"], kill_at=1).returncode == -signal.SIGKILL
    assert _run(["-c", "open('/dev/null', 'w').close()"], kill_at=2).returncode == 0
    assert time.perf_counter() - started < 30
