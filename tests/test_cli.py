"""The ``tinytrain`` command: grade, export, reset, status, milestone, doctor.

Commands that change the package (export, reset) run in a subprocess on a copy of
the package in a temporary folder (first on ``PYTHONPATH``), never on this checkout.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tinytrain.course import build, grading, inventory
from tinytrain.course.cli import main

ROOT = Path(__file__).resolve().parents[1]
SOURCE_03 = ROOT / "modules/03_activations/03_activations.py"


def _notebook(path: Path, reference: bool = True, edit: tuple[str, str] | None = None) -> Path:
    notebook = (build.reference_notebook if reference else build.student_notebook)(SOURCE_03)
    if edit is not None:
        cell = next(cell for cell in notebook.cells if cell.metadata.get("export") and edit[0] in cell.source)
        cell.source = cell.source.replace(edit[0], edit[1], 1)
    nbformat.write(notebook, path)
    return path


# -- in-process ------------------------------------------------------------------------------------
def test_help_lists_the_subcommands(capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for command in ("build", "grade", "export", "reset", "status", "milestone", "doctor"):
        assert command in out


def test_grade_prints_each_check_with_points_hint_and_total(capsys) -> None:
    assert main(["grade", "03", "--root", str(ROOT)]) == 1
    out = capsys.readouterr().out
    assert "Module 03_activations: graded checks on" in out
    assert "FAIL  relu" in out and "NotImplementedError: relu: your code here" in out and "hint: relu(x)" in out
    assert out.rstrip().endswith("Total: 0/12 points")


def test_grade_reference_notebook_passes(tmp_path: Path, capsys) -> None:
    notebook = _notebook(tmp_path / "mine.ipynb")
    assert main(["grade", "activations", "--notebook", str(notebook), "--root", str(ROOT), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["earned"] == result["possible"] == 12 and result["module"] == "03_activations"
    assert all(check["outcome"] == "passed" for check in result["checks"])


def test_grade_a_folder_of_notebooks(tmp_path: Path, capsys) -> None:
    _notebook(tmp_path / "03_activations.ipynb")
    assert main(["grade", "3", "--notebook", str(tmp_path), "--root", str(ROOT)]) == 0
    assert "Total: 12/12 points" in capsys.readouterr().out


def test_grade_installed_code(capsys) -> None:
    assert main(["grade", "03", "--installed", "--root", str(ROOT)]) == 0
    assert "graded checks on the installed package" in capsys.readouterr().out


def test_grade_reports_a_syntax_error_with_cell_and_line(tmp_path: Path, capsys) -> None:
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("def relu(x: Tensor) -> Tensor:", "def relu(x"))
    assert main(["grade", "03", "--notebook", str(notebook), "--root", str(ROOT)]) == 1
    out = capsys.readouterr().out
    assert "error: " in out and "SyntaxError" in out and "cell " in out and ", line " in out
    assert "Total: 0/12 points" in out
    assert "hint:" not in out and "FAIL" not in out, "a notebook that does not load gets one message, not every hint"


def test_a_print_at_the_top_of_a_cell_leaves_the_json_clean(tmp_path: Path, capsys) -> None:
    """Catches a notebook run once more after the checks, uncaptured: stdout begins with the print, not the JSON."""
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("def relu(x: Tensor) -> Tensor:",
                                                                  "print('debugging')\n\n\ndef relu(x: Tensor) -> Tensor:"))
    assert main(["grade", "03", "--notebook", str(notebook), "--root", str(ROOT), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["earned"] == 12


def test_a_notebook_that_does_not_load_runs_once_and_says_so_once(tmp_path: Path, monkeypatch, capsys) -> None:
    """The first failure is reused: running the failing cells again for every check (an endless loop would cost
    each the time limit) and once more for the report would repeat the message."""
    from tinytrain.course import overlay

    runs = []
    real = overlay.overlay

    def counted(*args, **kwargs):
        runs.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(overlay, "overlay", counted)
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("def relu(x: Tensor) -> Tensor:",
                                                                  "raise ValueError('half-written')\n\n\n"
                                                                  "def relu(x: Tensor) -> Tensor:"))
    assert main(["grade", "03", "--notebook", str(notebook), "--root", str(ROOT), "--sandbox", "none"]) == 1
    out = capsys.readouterr().out
    assert len(runs) == 1
    assert out.count("running the cell raised ValueError: half-written") == 1 and "Total: 0/12 points" in out


def test_an_endless_loop_at_the_top_of_a_cell_fails_within_the_time_limit(tmp_path: Path) -> None:
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("def relu(x: Tensor) -> Tensor:",
                                                                  "while True:\n    pass\n\n\n"
                                                                  "def relu(x: Tensor) -> Tensor:"))
    env = dict(os.environ, TINYTRAIN_CHECK_TIMEOUT="1")
    env.pop(grading.NOTEBOOK_ENV, None)
    graded = subprocess.run([sys.executable, "-m", "tinytrain", "grade", "03", "--notebook", str(notebook),
                             "--root", str(ROOT)], capture_output=True, text=True, env=env, timeout=120)
    assert graded.returncode == 1, graded.stderr
    assert re.search(r"cell \d+ \(id 03_activations-\d+\), line \d+: running the cell raised TimeoutError: "
                     r"the check took longer than 1 s \(an endless loop\?\)", graded.stdout), graded.stdout
    assert "Total: 0/12 points" in graded.stdout


def test_a_breakpoint_left_in_the_code_fails_its_check_at_once(tmp_path: Path, capsys) -> None:
    """The debugger's prompt, captured and unseen, waited for input until the check's time limit."""
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("return x.relu()", "breakpoint()\n    return x.relu()"))
    assert main(["grade", "03", "--notebook", str(notebook), "--root", str(ROOT)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  relu" in out and "RuntimeError: breakpoint() in the graded code: remove it" in out


def test_a_name_from_a_cell_that_is_not_exported_is_named_with_its_cell(tmp_path: Path, capsys) -> None:
    """It works in Jupyter (one namespace); graded, the report names the cell, not a bare NameError or 'was it
    deleted or renamed?'."""
    notebook = build.reference_notebook(SOURCE_03)
    relu = next(cell for cell in notebook.cells if cell.metadata.get("export") and "return x.relu()" in cell.source)
    relu.source = relu.source.replace("return x.relu()", "return positive_part(x)")
    helper = nbformat.v4.new_code_cell("def positive_part(x):\n    return x.relu()")
    notebook.cells.insert(notebook.cells.index(relu), helper)
    softmax = next(cell for cell in notebook.cells if cell.metadata.get("export") and "def softmax(" in cell.source)
    del softmax.metadata["export"]
    path = tmp_path / "03_activations.ipynb"
    nbformat.write(notebook, path)
    assert main(["grade", "03", "--notebook", str(path), "--root", str(ROOT)]) == 1
    out = capsys.readouterr().out
    helper_cell = f"cell {notebook.cells.index(helper) + 1} (id {helper.id})"
    assert (f"hint: 'positive_part' is defined in {helper_cell}, which is not an export cell: the grader and your "
            "library run only export cells; import or define it in an export cell") in out
    softmax_cell = f"cell {notebook.cells.index(softmax) + 1} (id {softmax.id})"
    assert f"{softmax_cell} of {path} defines 'softmax', but it is not an export cell" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["grade", "99"], "unknown module '99'; the modules are: 01_tensor"),
        (["grade", "03", "--notebook", "/no/such.ipynb"], "notebook /no/such.ipynb does not exist"),
        (["export", "3", "--notebook", "/no/such.ipynb"], "does not exist"),
        (["reset", "banana"], "unknown module 'banana'"),
        (["grade", "03", "--notebook", str(ROOT / "notebooks/04_layers.ipynb")], "is the notebook of module 04_layers, not 03"),
        (["grade", "03", "--notebook", str(ROOT / "pyproject.toml")], "is not a Jupyter notebook"),
        (["milestone", "rnn"], "no milestone 'rnn'"),
    ],
)
def test_clear_errors(argv: list[str], message: str, capsys) -> None:
    assert main([*argv, "--root", str(ROOT)] if argv[0] != "milestone" else argv) == 2
    assert message in capsys.readouterr().err


def test_a_missing_notebook_says_how_to_get_it_back(tmp_path: Path) -> None:
    import argparse

    from tinytrain.course import cli

    with pytest.raises(cli.UsageError, match=re.escape("get a fresh copy with `git checkout -- "
                                                       "notebooks/05_normalization.ipynb` in the project folder")):
        cli._notebook(argparse.Namespace(notebook=None), tmp_path, "05_normalization")


def test_grade_without_a_project(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(inventory, "PACKAGE_DIR", tmp_path / "tinytrain")  # not an editable checkout
    assert main(["grade", "03"]) == 2
    assert "needs the tinytrain project" in capsys.readouterr().err


def test_milestone_delegates(monkeypatch, capsys) -> None:
    from tinytrain.course import milestones

    calls = []
    monkeypatch.setattr(milestones, "main", lambda name, argv: calls.append((name, argv)) or 0)
    assert main(["milestone", "mlp", "--epochs", "2", "--dataset", "digits"]) == 0
    assert calls == [("mlp", ["--epochs", "2", "--dataset", "digits"])]


def test_status_reports_installed_code_and_checks(capsys) -> None:
    assert main(["status", "--root", str(ROOT), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    rows = {row["module"]: row for row in status["modules"]}
    assert status["advice"] == []
    assert set(inventory.graded_test_files(ROOT)) <= set(rows)
    for module in inventory.graded_test_files(ROOT):
        assert rows[module]["code"] == "reference" and rows[module]["checks"].endswith("all pass"), rows[module]


def test_doctor(capsys) -> None:
    status = main(["doctor"])
    out = capsys.readouterr().out
    assert "[ ok ] Python 3." in out and "NumPy" in out and "CuPy" in out and "Jupyter kernel" in out
    assert "dataset cache" in out and "tinytrain package at" in out and "grading sandbox: " in out
    assert status == (1 if "[FAIL]" in out else 0)


def test_doctor_gives_a_fix_for_each_problem(tmp_path: Path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TINYTRAIN_DATA", str(blocker / "cache"))  # cannot be created: its parent is a file
    assert main(["doctor"]) == 1
    lines = capsys.readouterr().out.splitlines()
    failure = next(index for index, line in enumerate(lines) if line.startswith("[FAIL] dataset cache"))
    assert lines[failure + 1].strip().startswith("fix: export TINYTRAIN_DATA=")


def test_doctor_names_a_missing_numba_and_what_runs_without_it(monkeypatch) -> None:
    from tinytrain.course import doctor

    found = importlib.util.find_spec
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None if name == "numba" else found(name))
    [finding] = doctor._check_tools(None)
    assert finding.level == "WARN" and "numba (LayerNorm's compiled loops" in finding.what, finding
    assert "tinytrain[notebooks]" in finding.fix


# -- export, reset and a broken package, on a copy ------------------------------------------------------
@pytest.fixture
def copy(tmp_path: Path):
    """Run ``python -m tinytrain ...`` (or ``python -c code``, ``python script ...``) against a copy of the package;
    returns (run, package folder)."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "tinytrain", site / "tinytrain",
                    ignore=shutil.ignore_patterns("__pycache__", inventory.BACKUP_DIR))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop(grading.NOTEBOOK_ENV, None)

    def run(*args: str, root: bool = True, code: str | None = None,
            script: Path | None = None) -> subprocess.CompletedProcess:
        if code:
            command = [sys.executable, "-c", code]
        elif script:
            command = [sys.executable, str(script), *args]
        else:
            command = [sys.executable, "-m", "tinytrain", *args, *(["--root", str(ROOT)] if root else [])]
        return subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)

    return run, site / "tinytrain"


def test_export_then_reset(copy, tmp_path: Path) -> None:
    run, package = copy
    original = (package / "nn/activations.py").read_text()
    notebook = _notebook(tmp_path / "03_activations.ipynb")
    result = run("export", "03", "--notebook", str(notebook))
    assert result.returncode == 0, result.stderr
    assert "exported module 03_activations" in result.stdout
    exported = (package / "nn/activations.py").read_text()
    assert exported.startswith("# Exported by `tinytrain export` from ") and "(module 03_activations)" in exported
    assert exported.split("\n", 1)[1] == original.split("\n", 1)[1]
    assert exported.count("# student: Module 03\n") == 8  # as in the reference: six functions, two methods
    assert (package / inventory.BACKUP_DIR / "03_activations/reference/nn.activations.py.orig").read_text() == original

    status = run("status", "--json")
    rows = {row["module"]: row for row in json.loads(status.stdout)["modules"]}
    assert rows["03_activations"]["code"].startswith("student: ") and rows["03_activations"]["checks"].endswith("all pass")
    assert rows["01_tensor"]["code"] == "reference"
    graded = run("grade", "03", "--installed", "--json")
    assert json.loads(graded.stdout)["earned"] == 12, graded.stderr

    result = run("reset", "3")
    assert result.returncode == 0, result.stderr
    assert (package / "nn/activations.py").read_text() == original
    assert "already holds the reference" in run("reset", "3").stdout


def test_export_of_stubs_is_refused_unless_forced(copy) -> None:
    run, package = copy
    before = (package / "nn/activations.py").read_text()
    refused = run("export", "03", "--notebook", str(ROOT / "notebooks/03_activations.ipynb"))
    assert refused.returncode == 2 and "still has stubs" in refused.stderr and "relu" in refused.stderr
    assert "--force" in refused.stderr and refused.stderr.count("not exported") == 1
    assert (package / "nn/activations.py").read_text() == before
    forced = run("export", "03", "--notebook", str(ROOT / "notebooks/03_activations.ipynb"), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "still stubs" in forced.stdout and "relu" in forced.stdout


def test_stubs_left_in_an_export_are_named_by_status_doctor_and_the_milestones(copy, tmp_path: Path) -> None:
    """Module 02 exported unfilled: what breaks later names module 02 and how to reset it."""
    run, package = copy
    assert run("export", "02", "--notebook", str(ROOT / "notebooks/02_autograd.ipynb"), "--force").returncode == 0
    status = json.loads(run("status", "--json").stdout)
    rows = {row["module"]: row for row in status["modules"]}
    assert rows["02_autograd"]["checks"].startswith("0/") and "fail" in rows["04_layers"]["checks"]
    stubs, knock_on = status["advice"]
    assert stubs.startswith("module 02_autograd holds your exported code with stubs left: apply, sum_to_shape, ")
    assert "04_layers" in knock_on and "fail in your exported code of module 02_autograd" in knock_on
    assert "tinytrain reset 02" in stubs and "tinytrain reset 02" in knock_on
    graded = run("grade", "04", "--installed")
    assert "cause: your exported code of module 02_autograd (autograd.py, line " in graded.stdout

    doctor = run("doctor")
    assert doctor.returncode == 1 and "tinytrain is ready" not in doctor.stdout
    assert "[FAIL] module 02_autograd holds your exported code with stubs left" in doctor.stdout
    assert "[FAIL] a small training run fails in your exported code of module 02_autograd" in doctor.stdout

    options = ("--epochs", "1", "--warmup", "0", "--out", str(tmp_path / "run"))
    for milestone in (run("milestone", "mlp", *options, root=False), run(*options, script=ROOT / "milestones/mlp.py")):
        assert milestone.returncode == 1 and "Traceback" not in milestone.stderr, milestone.stderr
        assert "the milestone failed in your exported code of module 02_autograd" in milestone.stderr
        assert "NotImplementedError: apply: your code here" in milestone.stderr
        assert "tinytrain reset 02" in milestone.stderr

    reset = run("reset", "--all")
    assert reset.returncode == 0 and "reset " in reset.stdout, reset.stderr
    assert json.loads(run("status", "--json").stdout)["advice"] == []
    assert "already holds the reference code of every module" in run("reset", "--all").stdout
    assert run("reset").returncode == 2


def test_a_wrong_value_from_an_exported_module_keeps_the_hint_and_names_the_exported_modules(copy, tmp_path) -> None:
    """With a student's module 02 exported, a wrong bias gradient in module 04 fails gradcheck: the failure gives
    04's hint, and is not blamed on 02's gradcheck ('tinytrain reset 02', on correct code)."""
    from tinytrain.course import solutions

    run, _ = copy
    autograd = solutions.fill(build.student_notebook(ROOT / "modules/02_autograd/02_autograd.py"),
                              solutions.solution_bodies(ROOT / "tests/course/solutions/02_autograd.py"))
    nbformat.write(autograd, tmp_path / "02_autograd.ipynb")
    assert run("export", "02", "--notebook", str(tmp_path / "02_autograd.ipynb")).returncode == 0
    layers = build.reference_notebook(ROOT / "modules/04_layers/04_layers.py")
    bias = "self.xp.ones(len(rows), dtype=rows.dtype) @ rows"
    cell = next(cell for cell in layers.cells if cell.metadata.get("export") and bias in cell.source)
    cell.source = cell.source.replace(bias, f"2 * ({bias})")
    nbformat.write(layers, tmp_path / "04_layers.ipynb")
    graded = run("grade", "04", "--notebook", str(tmp_path / "04_layers.ipynb"))
    assert "FAIL  linear_backward" in graded.stdout and "hint: LinearFunction.backward" in graded.stdout
    assert "cause:" not in graded.stdout, graded.stdout
    assert ("note: the package holds your exported code of 02_autograd: a failure here may come from a wrong "
            "result there; `tinytrain status` runs each module's graded checks on it") in graded.stdout


def test_status_counts_no_points_for_checks_that_did_not_run(copy) -> None:
    """An exported file that does not compile stops pytest at collection: no check may keep 'passed'."""
    run, package = copy
    assert run("export", "03", "--notebook", str(_notebook(package.parent / "03_activations.ipynb"))).returncode == 0
    with (package / "nn/activations.py").open("a") as file:
        file.write("def broken(:\n")
    status = json.loads(run("status", "--json").stdout)
    rows = {row["module"]: row for row in status["modules"]}
    assert rows["03_activations"]["checks"].startswith("0/12 points"), rows["03_activations"]
    assert rows["04_layers"]["checks"].startswith("0/15 points")
    assert any("fail in your exported code of module 03_activations (activations.py, line " in line
               and "in <module>" in line and "tinytrain reset 03" in line for line in status["advice"])


def test_export_refuses_a_syntax_error(copy, tmp_path: Path) -> None:
    run, package = copy
    before = (package / "nn/activations.py").read_text()
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("def relu(x: Tensor) -> Tensor:", "def relu(x"))
    result = run("export", "03", "--notebook", str(notebook))
    assert result.returncode == 2 and "not exported" in result.stderr and "SyntaxError" in result.stderr
    assert "cell " in result.stderr and ", line " in result.stderr
    assert (package / "nn/activations.py").read_text() == before


def test_export_refuses_code_that_does_not_import(copy, tmp_path: Path) -> None:
    run, package = copy
    before = (package / "nn/activations.py").read_text()
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("import math", "import math\nimport no_such_module"))
    result = run("export", "03", "--notebook", str(notebook))
    assert result.returncode == 2 and "does not import" in result.stderr and "no_such_module" in result.stderr
    assert result.stderr.count("not exported") == 1
    assert (package / "nn/activations.py").read_text() == before


def test_an_import_error_on_export_names_the_notebook_cell_and_line(copy, tmp_path: Path) -> None:
    """The line in the notebook, not in the exported file, which has the student markers above relu and sigmoid."""
    run, _ = copy
    notebook = _notebook(tmp_path / "03_activations.ipynb", edit=("def sigmoid(x: Tensor) -> Tensor:",
                                                                  "SCALE = undefined_name\n\n\ndef sigmoid(x: Tensor) -> Tensor:"))
    cells = nbformat.read(notebook, as_version=4).cells
    number = next(i for i, cell in enumerate(cells, 1) if "undefined_name" in cell.source)
    line = next(i for i, text in enumerate(cells[number - 1].source.split("\n"), 1) if "undefined_name" in text)
    result = run("export", "03", "--notebook", str(notebook))
    assert result.returncode == 2 and "NameError" in result.stderr
    assert f"raised in {notebook.name} cell {number} (id " in result.stderr or f"cell {number} (id" in result.stderr
    assert f"cell {number} (id {cells[number - 1].id}), line {line}:" in result.stderr, result.stderr


def test_a_broken_export_does_not_break_the_command(copy) -> None:
    """Student code that fails to import: status, doctor and reset still work, and say what to do."""
    run, package = copy
    original = (package / "nn/activations.py").read_text()
    header = inventory.EXPORT_HEADER.format(notebook="notebooks/03_activations.ipynb", module="03_activations", number="03")
    (package / "nn/activations.py").write_text(f"{header}\n\nraise RuntimeError('my bug')\n")

    use = run(code="import tinytrain as tt; tt.nn")
    assert use.returncode != 0 and "tinytrain reset 03" in use.stderr and "my bug" in use.stderr
    status = run("status")
    assert status.returncode == 0, status.stderr
    assert "student: notebooks/03_activations.ipynb" in status.stdout and "03_activations" in status.stdout
    doctor = run("doctor")
    assert doctor.returncode == 1 and "[FAIL]" in doctor.stdout and "tinytrain reset 03" in doctor.stdout
    reset = run("reset", "03")  # no backup: regenerated from the module source
    assert reset.returncode == 0, reset.stderr
    assert (package / "nn/activations.py").read_text() == original
    assert run(code="import tinytrain as tt; tt.nn.ReLU").returncode == 0


def test_doctor_names_a_broken_export_of_a_file_imported_on_demand(copy) -> None:
    """tinytrain.cuda loads only when a GPU is asked for; doctor imports it anyway, and still reports on the GPU."""
    run, package = copy
    header = inventory.EXPORT_HEADER.format(notebook="12_accelerators.ipynb", module="12_accelerators", number="12")
    (package / "cuda.py").write_text(f"{header}\n\nraise RuntimeError('my bug')\n")
    doctor = run("doctor")
    assert doctor.returncode == 1 and "[FAIL] tinytrain.cuda does not import: RuntimeError: my bug" in doctor.stdout
    assert "tinytrain reset 12" in doctor.stdout and "GPU: " in doctor.stdout, doctor.stdout


def test_reset_from_the_backup_without_sources(copy, tmp_path: Path) -> None:
    run, package = copy
    original = (package / "nn/activations.py").read_text()
    notebook = _notebook(tmp_path / "03_activations.ipynb")
    assert run("export", "03", "--notebook", str(notebook)).returncode == 0
    result = run("reset", "03", root=False)  # no project here: only the backup can help
    assert result.returncode == 0, result.stderr
    assert "restored from" in result.stdout
    assert (package / "nn/activations.py").read_text() == original


# -- quantize --------------------------------------------------------------------------------------------
# A GPT milestone run in seconds: one block of 32 channels, 20 steps, 2% of the text held out (1,394 windows).
TINY_GPT = ("--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--context", "16", "--batch-size", "4",
            "--warmup", "2", "--steps", "20", "--eval-every", "10", "--eval-batches", "2", "--sample-length", "5",
            "--validation-fraction", "0.02")


def _quantize_rows(out: str) -> dict[str, list[float]]:
    """The table of `tinytrain quantize`: name -> [model bytes, quantized layers' bytes, their share, loss, change]."""
    rows = {}
    for line in out.splitlines():
        for name in ("float32", "int8 dynamic", "int8 static", "NF4"):
            if line.startswith(name + " "):
                rows[name] = [float(value.replace(",", "").rstrip("%")) for value in line[len(name):].split()]
    return rows


def test_quantize_prints_the_bytes_and_losses_of_a_trained_gpt_run(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    trained = subprocess.run([sys.executable, str(ROOT / "milestones" / "gpt.py"), *TINY_GPT, "--out", str(out)],
                             capture_output=True, text=True, timeout=600)
    assert trained.returncode in (0, 1) and "Traceback" not in trained.stderr, trained.stderr[-3000:]
    assert main(["quantize", str(out), "--calibration-batches", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"{out}: the best checkpoint (step 20), 1 blocks of 32 channels" in printed  # the loss fell: 20 is best
    assert "validation loss over 1,394 windows of 16 characters" in printed and "2 batches of 64" in printed
    rows = _quantize_rows(printed)
    assert list(rows) == ["float32", "int8 dynamic", "int8 static", "NF4"], printed
    milestone_loss = json.loads((out / "result.json").read_text())["val_loss"]
    assert rows["float32"][3] == pytest.approx(milestone_loss, abs=1e-4)  # what the milestone itself measured
    assert rows["float32"][0] > rows["int8 dynamic"][0] > rows["NF4"][0]
    assert rows["int8 dynamic"][2] < 32 and rows["NF4"][2] < 20  # percent of the float32 layers' bytes
    for name in ("int8 dynamic", "int8 static", "NF4"):
        assert abs(rows[name][4]) < 2, printed  # percent change of the validation loss


def test_quantize_names_what_is_wrong_with_the_run(tmp_path: Path, capsys) -> None:
    assert main(["quantize", str(tmp_path)]) == 2
    assert f"{tmp_path / 'settings.toml'} does not exist: RUN_DIR is the --out folder" in capsys.readouterr().err
    (tmp_path / "settings.toml").write_text('dataset = "mnist"\ncontext = 8\n')
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best.pkl").write_bytes(b"")
    assert main(["quantize", str(tmp_path)]) == 2
    assert "lacks n_layer, n_head, n_embd, validation_fraction" in capsys.readouterr().err
    assert main(["quantize", str(tmp_path), "--calibration-batches", "0"]) == 2
    assert "--calibration-batches must be at least 1, got 0" in capsys.readouterr().err


def test_the_notebooks_route_to_grade_works_in_a_shell_without_the_tinytrain_command() -> None:
    """A JupyterLab terminal is a login shell without the kernel's virtual environment: no `tinytrain` on PATH.
    The kernel's Python by its path (what every notebook's last cell says to run) grades from the notebooks' folder."""
    hint = nbformat.read(ROOT / "notebooks" / "03_activations.ipynb", as_version=4).cells[-1].source
    assert "!{sys.executable} -m tinytrain grade 03" in hint and "python -m tinytrain grade 03" in hint
    bare = dict(os.environ, PATH=os.pathsep.join(folder for folder in ("/usr/bin", "/bin") if Path(folder).is_dir()))
    bare.pop(grading.NOTEBOOK_ENV, None)
    graded = subprocess.run([sys.executable, "-m", "tinytrain", "grade", "03"], cwd=ROOT / "notebooks",
                            capture_output=True, text=True, env=bare, timeout=300)
    assert graded.returncode == 1, graded.stdout + graded.stderr  # the committed notebook holds stubs: 0 points
    assert "03_activations.ipynb" in graded.stdout and "Total: 0/12 points" in graded.stdout, graded.stdout
