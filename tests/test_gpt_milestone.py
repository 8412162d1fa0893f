"""The GPT milestone (``milestones/gpt.py``) with tiny models: outputs, exact resume, the scale options."""
from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.serialization import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "milestones" / "gpt.py"
# a one-layer model on 16-character windows: a step takes a few milliseconds
TINY = ("--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--context", "16", "--batch-size", "4",
        "--warmup", "2", "--eval-every", "4", "--eval-batches", "2", "--sample-length", "20")


def run_gpt(*options: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The milestone script in a new process, as a user runs it."""
    return subprocess.run([*launcher, sys.executable, str(GPT), *TINY, *options], capture_output=True, text=True,
                          timeout=300)


def last_checkpoint(out: Path) -> dict:
    return read_checkpoint(max((out / "checkpoints").glob("step-*.pkl")))


def log_rows(out: Path) -> list[dict]:
    with open(out / "log.csv", newline="") as file:
        return list(csv.DictReader(file))


def assert_mfu_follows_throughput(speeds: list[tuple[int, float]]) -> None:
    """Each row's MFU (printed to 0.1%) is its tokens a second times one constant, FLOPs per token over the peak.

    The tiny model's first row, which includes the warm-up, can be slow enough to print 0.0%, so the
    check is the proportion, to the printed rounding, and not that every share is above zero."""
    assert all(tokens > 0 and share >= 0 for tokens, share in speeds), speeds
    fastest, fastest_share = max(speeds)
    for tokens, share in speeds:
        expected = fastest_share * tokens / fastest  # within 0.05% of its rounding and the fastest row's
        assert abs(share - expected) <= 0.05 * (1 + tokens / fastest) + 1e-9, (speeds, tokens, share, expected)


def test_mfu_check_accepts_a_slow_first_row_and_refuses_a_share_unrelated_to_the_throughput() -> None:
    assert_mfu_follows_throughput([(640, 0.0), (21_781, 1.1), (21_414, 1.1)])
    with pytest.raises(AssertionError):
        assert_mfu_follows_throughput([(1_443, 0.9), (21_781, 1.1), (21_414, 1.1)])
    with pytest.raises(AssertionError):
        assert_mfu_follows_throughput([(1_443, 0.1), (21_781, 1.1), (0, 1.1)])


def test_gpt_milestone_writes_its_outputs_and_judges_the_validation_loss(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_gpt("--steps", "10", "--out", str(out))
    assert result.returncode == 1, result.stdout + result.stderr  # 10 steps of a tiny model: far above 1.95
    assert "step     4  lr" in result.stdout and "val loss" in result.stdout
    speeds = re.findall(r"  ([\d,]+) tok/s  MFU (\d+\.\d)%", result.stdout)  # nanoGPT's figures on every line
    assert len(speeds) == 3, result.stdout
    assert_mfu_follows_throughput([(int(tokens.replace(",", "")), float(share)) for tokens, share in speeds])
    assert "validation loss" in result.stdout and "(pass mark <= 1.95): FAIL" in result.stdout
    summary = json.loads((out / "result.json").read_text())
    assert summary["steps_done"] == summary["steps"] == 10 and summary["passed"] is False
    assert 2.5 < summary["val_loss"] < 4.5 and len(summary["sample"]) == 20
    assert summary["sample"] in result.stdout
    for name in ("settings.toml", "history.png", "checkpoints/best.pkl", "checkpoints/step-0000010.pkl"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["best.pkl", "step-0000010.pkl"]
    assert [row["step"] for row in log_rows(out)] == ["4", "8", "10"]


def test_stopped_and_resumed_run_ends_bit_identical_to_a_straight_one(tmp_path: Path) -> None:
    straight = run_gpt("--steps", "12", "--out", str(tmp_path / "straight"))
    assert straight.returncode == 1, straight.stderr
    out = tmp_path / "resumed"
    stopped = run_gpt("--steps", "12", "--out", str(out), "--stop-after", "5")  # between two evaluations
    assert stopped.returncode == 0 and "stopped after step 5 of 12" in stopped.stdout, stopped.stderr
    resumed = subprocess.run([sys.executable, str(GPT), "--resume", "--out", str(out)], capture_output=True,
                             text=True, timeout=300)
    assert "resumed from" in resumed.stdout and resumed.returncode == 1, resumed.stdout + resumed.stderr
    a, b = last_checkpoint(tmp_path / "straight")["model"], last_checkpoint(out)["model"]
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    results = [json.loads((run / "result.json").read_text()) for run in (tmp_path / "straight", out)]
    assert results[0]["val_loss"] == results[1]["val_loss"] and results[0]["sample"] == results[1]["sample"]
    straight_rows, resumed_rows = log_rows(tmp_path / "straight"), log_rows(out)
    assert [row["step"] for row in resumed_rows] == ["4", "5", "8", "12"], "the stop's own row, no duplicates"
    assert resumed_rows[0] == {**straight_rows[0], "seconds": resumed_rows[0]["seconds"]}


@pytest.mark.parametrize("options", [("--precision", "16-mixed"), ("--precision", "bf16-mixed"),
                                     ("--precision", "bf16-true"), ("--checkpointing",),
                                     ("--flash",), ("--accumulation-steps", "2", "--batch-size", "2")])
def test_scale_options_train(tmp_path: Path, options: tuple[str, ...]) -> None:
    out = tmp_path / "run"
    result = run_gpt("--steps", "4", "--out", str(out), *options)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((out / "result.json").read_text())
    assert summary["steps_done"] == 4 and np.isfinite(summary["val_loss"])
    if options == ("--precision", "bf16-true"):  # the weights themselves in bfloat16
        assert {str(w.dtype) for w in last_checkpoint(out)["model"].values()} == {"bfloat16"}
    if options == ("--flash",):
        assert "flash = true" in (out / "settings.toml").read_text()
    if options == ("--checkpointing",):
        assert "checkpointing = true" in (out / "settings.toml").read_text()  # TOML's spelling, read back on resume
        resumed = subprocess.run([sys.executable, str(GPT), "--resume", "--out", str(out), "--steps", "6"],
                                 capture_output=True, text=True, timeout=300)
        assert "step     6" in resumed.stdout, resumed.stderr


def test_16_true_stops_when_adamw_divides_by_a_zero_eps(tmp_path: Path) -> None:
    """AdamW's eps=1e-8 is 0 in float16: an update divided by a second moment that underflowed is infinite."""
    result = run_gpt("--steps", "4", "--precision", "16-true", "--out", str(tmp_path / "run"))
    assert result.returncode != 0
    assert "steps in a row were skipped (non-finite loss or gradients)" in result.stderr, result.stderr


def test_bad_settings_are_named(tmp_path: Path) -> None:
    result = run_gpt("--n-embd", "10", "--n-head", "4", "--out", str(tmp_path / "run"))
    assert result.returncode != 0
    assert "n_embd must be a multiple of n_head, got n_embd=10, n_head=4" in result.stderr
    result = run_gpt("--precision", "fp8", "--flash", "--dropout", "0.1", "--out", str(tmp_path / "run"))
    assert result.returncode != 0 and not (tmp_path / "run").exists()
    assert "precision must be one of 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, got 'fp8'" in result.stderr
    assert "dropout must be 0 with flash, got 0.1" in result.stderr


def test_quantize_evaluates_the_trained_model_again_with_calibrated_int8(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_gpt("--steps", "6", "--out", str(out), "--quantize", "int8-static")
    assert result.returncode == 1, result.stdout + result.stderr  # the pass mark judges the float32 model
    summary = json.loads((out / "result.json").read_text())
    assert summary["quantize"] == "int8-static" and f"int8-static: validation loss {summary['quantized_val_loss']:.4f}" \
        in result.stdout
    assert summary["model_bytes"] < 0.6 * summary["float32_model_bytes"]  # the embeddings and norms stay float
    assert summary["quantized_val_loss"] != summary["val_loss"]  # evaluated again, on the quantized layers
    assert summary["quantized_val_loss"] == pytest.approx(summary["val_loss"], rel=0.02)


def test_an_unknown_quantization_is_rejected_before_training(tmp_path: Path) -> None:
    result = run_gpt("--quantize", "int4", "--out", str(tmp_path / "run"))
    assert result.returncode != 0
    assert "quantize must be one of none, int8, int8-static, nf4, got 'int4'" in result.stderr
    assert not (tmp_path / "run").exists()


def test_distributed_run_over_two_ranks(tmp_path: Path) -> None:
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install mpi4py mpich)")
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        pytest.skip("no mpirun/mpiexec on PATH (pip install mpich)")
    out = tmp_path / "run"
    result = run_gpt("--steps", "4", "--out", str(out), "--distributed", launcher=(mpirun, "-n", "2"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("validation loss") == 1, "only rank 0 prints"
    assert json.loads((out / "result.json").read_text())["steps_done"] == 4
