"""The MLP milestone end to end (training, outputs, settings, exact resume), the fine-tuning milestone on a tiny
base (its base trained first, its outputs, exact resume), and how a recipe is found and run."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tinytrain.serialization import read_checkpoint
from tinytrain.testing.ranks import find_mpirun

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "milestones" / "mlp.py"


def run_mlp(*options: str) -> subprocess.CompletedProcess:
    """The milestone script in a new process, as a user runs it."""
    return subprocess.run([sys.executable, str(MLP), *options], capture_output=True, text=True, timeout=300)


def final_weights(out: Path) -> dict[str, np.ndarray]:
    last = sorted((out / "checkpoints").glob("epoch-*.pkl"))[-1]
    return read_checkpoint(last)["model"]


def test_mlp_milestone_on_digits_passes_and_writes_its_outputs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_mlp("--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    summary = json.loads((out / "result.json").read_text())
    assert summary["test_accuracy"] >= 0.97
    assert summary["epochs_done"] == summary["epochs"] == 30
    for name in ("settings.toml", "log.csv", "history.png", "checkpoints/best.pkl", "checkpoints/epoch-0030.pkl"):
        assert (out / name).is_file(), name
    rows = (out / "log.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,step,lr,train_loss") and len(rows) == 31


def test_16_mixed_on_the_cpu_says_it_is_slower_there(tmp_path: Path) -> None:
    """A 16-mixed CNN run takes 6 minutes where 32-true takes 6 seconds: the note says why."""
    mixed = run_mlp("--epochs", "1", "--warmup", "0", "--precision", "16-mixed", "--out", str(tmp_path / "mixed"))
    plain = run_mlp("--epochs", "1", "--warmup", "0", "--out", str(tmp_path / "plain"))
    bf16 = run_mlp("--epochs", "1", "--warmup", "0", "--precision", "bf16-true", "--out", str(tmp_path / "bf16"))
    for result in (mixed, plain, bf16):
        assert result.returncode in (0, 1), result.stdout + result.stderr
    assert "note: on 'cpu' NumPy multiplies float16 matrices without BLAS, so 16-mixed" in mixed.stdout
    assert "note: on 'cpu' NumPy has no bfloat16 arithmetic: bf16-true computes in float32" in bf16.stdout
    assert "note:" not in plain.stdout


def test_killed_run_resumed_ends_with_identical_weights_and_accuracy(tmp_path: Path) -> None:
    options = ("--epochs", "6", "--warmup", "1")
    straight = run_mlp(*options, "--out", str(tmp_path / "straight"))
    assert straight.returncode in (0, 1), straight.stderr
    interrupted = run_mlp(*options, "--out", str(tmp_path / "resumed"), "--stop-after", "2")
    assert interrupted.returncode == 0 and "continue with --resume" in interrupted.stdout, interrupted.stderr
    resumed = run_mlp("--resume", "--out", str(tmp_path / "resumed"))
    assert "resumed from" in resumed.stdout, resumed.stderr
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    accuracy = [json.loads((tmp_path / run / "result.json").read_text())["test_accuracy"]
                for run in ("straight", "resumed")]
    assert accuracy[0] == accuracy[1]


FINETUNE = ROOT / "milestones" / "finetune.py"
# A base of one block of 32 channels trained 40 steps, and 12 steps of adapters: the recipe's whole path in seconds
TINY_BASE = "--steps 40 --n-layer 1 --n-head 2 --n-embd 32 --warmup 5 --eval-every 20 --eval-batches 2 --sample-length 10"
TINY_FINETUNE = ("--steps", "12", "--warmup", "2", "--eval-every", "6", "--eval-batches", "2", "--sample-length", "10",
                 "--lora-r", "2", "--lora-alpha", "4")


def run_finetune(*options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FINETUNE), *options], capture_output=True, text=True, timeout=600)


def test_finetune_milestone_trains_its_base_first_then_only_adapters_and_resumes_exactly(tmp_path: Path) -> None:
    base = tmp_path / "base"
    straight = run_finetune(*TINY_FINETUNE, "--base", str(base), "--base-options", TINY_BASE,
                            "--out", str(tmp_path / "straight"))
    assert straight.returncode in (0, 1), straight.stdout[-3000:] + straight.stderr[-3000:]
    assert f"no base model in {base / 'checkpoints' / 'best.pkl'}: training it first" in straight.stdout
    assert (base / "checkpoints" / "best.pkl").is_file()
    out = tmp_path / "straight"
    for name in ("settings.toml", "log.csv", "result.json", "adapters.pkl", "checkpoints/best.pkl"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "result.json").read_text())
    assert summary["steps_done"] == 12 and summary["trainable_share"] <= 0.05
    assert summary["passed"] == (summary["val_loss"] <= summary["pass_mark"]
                                 and summary["adapter_file_bytes"] < 0.01 * summary["base_checkpoint_bytes"])
    assert summary["base_bytes"] < summary["float_base_bytes"]
    adapters = read_checkpoint(out / "adapters.pkl")["adapters"]
    assert sorted(adapters) == ["h.0.attn.c_attn.lora_A", "h.0.attn.c_attn.lora_B"]
    interrupted = run_finetune(*TINY_FINETUNE, "--base", str(base), "--out", str(tmp_path / "resumed"),
                               "--stop-after", "6")
    assert interrupted.returncode == 0 and "continue with --resume" in interrupted.stdout, interrupted.stderr
    resumed = run_finetune("--resume", "--out", str(tmp_path / "resumed"))
    assert "resumed from" in resumed.stdout and "no base model" not in resumed.stdout, resumed.stderr[-3000:]
    again = read_checkpoint(tmp_path / "resumed" / "adapters.pkl")["adapters"]
    for name in adapters:
        np.testing.assert_array_equal(again[name], adapters[name], err_msg=name)
    assert json.loads((tmp_path / "resumed" / "result.json").read_text())["val_loss"] == summary["val_loss"]


def test_accumulation_steps_equal_a_batch_that_many_times_larger(tmp_path: Path) -> None:
    options = ("--epochs", "2", "--warmup", "0")
    runs = {name: run_mlp(*options, *extra, "--out", str(tmp_path / name))
            for name, extra in (("accumulated", ("--batch-size", "16", "--accumulation-steps", "4")),
                                ("big", ("--batch-size", "64",)), ("small", ("--batch-size", "16",)))}
    for name, result in runs.items():
        assert result.returncode in (0, 1), f"{name}: {result.stderr}"
    accumulated, big, small = (final_weights(tmp_path / name) for name in ("accumulated", "big", "small"))
    for name in big:
        np.testing.assert_allclose(accumulated[name], big[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert any(not np.allclose(accumulated[name], small[name], rtol=1e-3) for name in big), \
        "--accumulation-steps 4 trained like plain batches of 16"


def test_config_file_is_read_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('epochs = 3\nwarmup = 0\nbatch_size = 128\nout = "%s"\n' % (tmp_path / "cfg").as_posix())
    result = run_mlp("--config", str(config), "--batch-size", "32")
    assert result.returncode in (0, 1), result.stderr
    saved = (tmp_path / "cfg" / "settings.toml").read_text()
    assert "epochs = 3" in saved and "batch_size = 32" in saved


@pytest.mark.parametrize(
    ("config_text", "message"),
    [("epoch = 3\n", "unknown setting(s) epoch"), ("epochs = [\n", "not valid TOML")],
)
def test_bad_config_files_are_named(tmp_path: Path, config_text: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(config_text)
    result = run_mlp("--config", str(config), "--out", str(tmp_path / "x"))
    assert result.returncode != 0 and message in result.stderr


def test_bad_settings_are_rejected_before_training(tmp_path: Path) -> None:
    result = run_mlp("--dataset", "imagenet", "--batch-size", "0", "--strategy", "zero4", "--out", str(tmp_path / "x"))
    assert result.returncode != 0
    assert "imagenet" in result.stderr and "batch_size must be >= 1, got 0" in result.stderr
    assert "strategy must be one of ddp, zero1, zero2, zero3, zero1_offload" in result.stderr
    assert "got 'zero4'" in result.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(find_mpirun() is None, reason="needs mpi4py and mpirun (pip install mpi4py mpich)")
def test_zero_in_two_mpi_ranks_takes_data_parallels_steps_and_resumes_on_one_process(tmp_path: Path) -> None:
    """--strategy zero2 (a distributed run without --distributed) ends with DataParallel's weights; its checkpoint
    resumes in a plain process (--strategy ddp without --distributed), which trains on; GPT runs under zero3."""
    def mpi(world_size: int, script: Path, *options: str) -> subprocess.CompletedProcess:
        return subprocess.run([find_mpirun(), "-n", str(world_size), sys.executable, str(script), *options],
                              capture_output=True, text=True, timeout=300)

    options = ("--epochs", "3", "--warmup", "1")
    ddp = mpi(2, MLP, *options, "--distributed", "--out", str(tmp_path / "ddp"))
    zero = mpi(2, MLP, *options, "--strategy", "zero2", "--out", str(tmp_path / "zero"), "--stop-after", "2")
    assert ddp.returncode in (0, 1) and zero.returncode == 0, ddp.stderr[-3000:] + zero.stderr[-3000:]
    zero = mpi(2, MLP, "--resume", "--out", str(tmp_path / "zero"))
    assert zero.returncode in (0, 1) and "resumed from" in zero.stdout, zero.stderr[-3000:]
    a, b = final_weights(tmp_path / "ddp"), final_weights(tmp_path / "zero")
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)
    plain = run_mlp("--resume", "--strategy", "ddp", "--epochs", "4", "--out", str(tmp_path / "zero"))
    assert plain.returncode in (0, 1) and "resumed from" in plain.stdout, plain.stderr[-3000:]
    assert json.loads((tmp_path / "zero" / "result.json").read_text())["epochs_done"] == 4
    gpt = mpi(2, ROOT / "milestones" / "gpt.py", "--strategy", "zero3", "--steps", "4", "--warmup", "1",
              "--eval-every", "2", "--eval-batches", "1", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
              "--context", "8", "--sample-length", "5", "--out", str(tmp_path / "gpt"))
    assert gpt.returncode in (0, 1) and "validation loss" in gpt.stdout, gpt.stderr[-3000:]
    assert json.loads((tmp_path / "gpt" / "result.json").read_text())["steps_done"] == 4


def test_an_unknown_precision_is_rejected_with_the_five_names(tmp_path: Path) -> None:
    result = run_mlp("--precision", "bf16", "--out", str(tmp_path / "x"))
    assert result.returncode != 0
    assert "precision must be one of 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, got 'bf16'" in result.stderr
    assert not (tmp_path / "x").exists()


def test_a_failed_milestone_names_the_exported_modules_a_wrong_result_may_come_from(monkeypatch, capsys,
                                                                                     tmp_path: Path) -> None:
    """A run below its pass mark raises nothing a traceback could pin on a module: the note names the exported ones."""
    from tinytrain.course import milestones

    monkeypatch.setattr(milestones, "exported_note", lambda failure: f"(your exported 07_optimizers: {failure})")
    too_small_to_learn = ("--lr", "1e-5", "--min-lr", "1e-5")
    status = milestones.main("mlp", ["--epochs", "1", "--warmup", "0", *too_small_to_learn,
                                     "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert status == 1 and re.search(r"test accuracy 0\.\d{4} \(pass mark 0\.97\): FAIL", out), out
    assert out.rstrip().endswith("note: (your exported 07_optimizers: missing the pass mark)")


# Runs `python ARGS` (a script, or -m MODULE) and prints the BLAS setting at the moment NumPy is first imported.
AT_NUMPY_IMPORT = """
import os, runpy, sys

class NumpyImport:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            print("OPENBLAS_NUM_THREADS as NumPy loads:", os.environ.get("OPENBLAS_NUM_THREADS"))
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, NumpyImport())
sys.argv = sys.argv[1:]
if sys.argv[0] == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("command", [(str(MLP), "--help"), ("-m", "tinytrain", "milestone", "mlp", "--help")],
                         ids=["script", "tinytrain milestone"])
def test_a_milestone_asks_for_one_blas_thread_before_numpy_loads(command: tuple[str, ...]) -> None:
    """BLAS reads its thread count as NumPy loads it: a setting made after that changes nothing."""
    variables = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    env = {name: value for name, value in os.environ.items() if name not in variables}
    result = subprocess.run([sys.executable, "-c", AT_NUMPY_IMPORT, *command], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "OPENBLAS_NUM_THREADS as NumPy loads: 1\n" in result.stdout, result.stdout


def test_tinytrain_milestone_runs_the_projects_recipes_else_the_copies_in_the_package(monkeypatch,
                                                                                      tmp_path: Path) -> None:
    from tinytrain.course import milestones

    assert milestones.recipe_folder() == ROOT / "milestones"  # this checkout: the scripts a student edits
    assert milestones.available() == ["cnn", "finetune", "gpt", "mlp"]
    package = tmp_path / "site-packages" / "tinytrain"
    (package / "course" / "recipes").mkdir(parents=True)
    (package / "course" / "recipes" / "mlp.py").write_text("")
    monkeypatch.setattr(milestones, "PACKAGE_DIR", package)  # installed without the project
    assert milestones.recipe_folder() == package / "course" / "recipes" and milestones.available() == ["mlp"]


def test_an_installed_wheel_runs_the_milestones_without_the_project(tmp_path: Path) -> None:
    """`pip install .` copies the package alone: `tinytrain milestone` runs the recipes shipped inside it, and a
    clone's scripts run on the installed package."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "tinytrain", source / "tinytrain",
                    ignore=shutil.ignore_patterns("__pycache__", ".tinytrain-backup"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("tinytrain-*.whl"))
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("tinytrain/course/recipes/")}
    assert shipped == {f"tinytrain/course/recipes/{name}.py" for name in ("cnn", "finetune", "gpt", "mlp")}
    site = tmp_path / "site"
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import tinytrain; print(tinytrain.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)
    options = ("--epochs", "1", "--warmup", "0", "--out")
    # `tinytrain milestone mlp`, and the README's `pip install '.[milestones]' && python milestones/mlp.py`
    for command, out in (("-m", "tinytrain", "milestone", "mlp"), "command"), ((str(MLP),), "script"):
        result = subprocess.run([sys.executable, *command, *options, out], cwd=work, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode in (0, 1) and "test accuracy" in result.stdout, result.stdout + result.stderr
        assert json.loads((work / out / "result.json").read_text())["epochs_done"] == 1


def test_the_row_line_shows_tokens_a_second_and_mfu_over_the_training_time_alone(capsys) -> None:
    from tinytrain.course.milestones import PrintRow

    class Resumed:  # a trainer resumed at step 100
        step = 100

    row = PrintRow("step", tokens_per_step=768, flops_per_token=1e6, peak_flops=1e11)
    row.on_fit_begin(Resumed())
    logs = {"step": 150, "lr": 1e-3, "train_loss": 2.0, "eval_loss": 2.1, "eval_accuracy": None, "seconds": 3.0,
            "train_seconds": 2.0}
    row.on_epoch_end(Resumed(), logs)
    # 50 steps of 768 tokens in 2 s of training: 19,200 tok/s; 1.92e10 FLOP/s of a 1e11 peak: 19.2%
    assert capsys.readouterr().out.rstrip().endswith("3.00s  19,200 tok/s  MFU 19.2%")
    row.on_epoch_end(Resumed(), {**logs, "step": 200, "train_seconds": 4.0})  # the next row counts from step 150
    assert capsys.readouterr().out.rstrip().endswith("3.00s  9,600 tok/s  MFU 9.6%")
    PrintRow("epoch").on_epoch_end(Resumed(), {**logs, "epoch": 3})  # without the figures: no speed
    assert capsys.readouterr().out.rstrip().endswith("3.00s")
