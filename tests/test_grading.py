"""The grader (``tinytrain.course.grading``): it grades the student's own code.

For every module with graded checks (``tests/graded/test_NN_*.py``): grading the
unfilled student notebook earns zero points, and grading a notebook whose solution
regions hold the reference code earns full marks. Plus the loader's contract: export
cells become fresh modules laid over the package and taken away again, errors name
the cell and line, and the checks are well-formed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

import tinytrain as tt
from tinytrain.course import build, checks, export, grading, imports, inventory, notebooks, overlay

ROOT = Path(__file__).resolve().parents[1]
GRADED = sorted((ROOT / "tests" / "graded").glob("test_[0-9][0-9]_*.py"))


def _source(test_file: Path) -> Path:
    module = test_file.stem.removeprefix("test_")
    return ROOT / "modules" / module / f"{module}.py"


def _write(notebook: nbformat.NotebookNode, path: Path) -> Path:
    nbformat.write(notebook, path)
    return path


@pytest.fixture(params=GRADED, ids=[path.stem.removeprefix("test_") for path in GRADED])
def graded_module(request) -> tuple[str, Path]:
    """(module name, its source) for each module that has graded checks."""
    source = _source(request.param)
    assert source.is_file(), f"{request.param.name} has no module source {source}"
    return source.stem, source


@pytest.mark.parametrize("source", build.module_sources(ROOT), ids=lambda path: path.stem)
def test_every_module_has_graded_checks(source: Path) -> None:
    graded = ROOT / "tests" / "graded" / f"test_{source.stem}.py"
    assert graded.is_file(), f"module {source.stem} has no graded checks: write {graded.relative_to(ROOT)}"


def test_unfilled_notebook_earns_zero(graded_module, tmp_path: Path) -> None:
    module, source = graded_module
    notebook = _write(build.student_notebook(source), tmp_path / f"{module}.ipynb")
    report = grading.grade(module, ROOT, notebook)
    assert report.possible > 0 and report.checks, f"{module}: no graded checks ran: {report.errors}"
    passing = [check.name for check in report.checks if check.outcome == "passed"]
    assert not passing, f"{module}: these checks pass without the student's code, so they grade nothing: {passing}"
    assert all(check.outcome == "failed" for check in report.checks)
    assert report.earned == 0


def test_reference_notebook_earns_full_marks(graded_module, tmp_path: Path) -> None:
    module, source = graded_module
    notebook = _write(build.reference_notebook(source), tmp_path / f"{module}.ipynb")
    report = grading.grade(module, ROOT, notebook)
    failing = {check.name: check.message for check in report.checks if check.outcome != "passed"}
    assert not failing and not report.errors, f"{module}: {failing} {report.errors}"
    assert report.possible > 0 and report.earned == report.possible


def test_committed_student_notebook_earns_zero(graded_module, capsys) -> None:
    """`tinytrain grade NN --json` on the notebook students get reports earned and possible."""
    from tinytrain.course.cli import main

    module, _ = graded_module
    status = main(["grade", module[:2], "--json", "--root", str(ROOT)])
    result = json.loads(capsys.readouterr().out)
    assert status == 1
    assert result["module"] == module and result["earned"] == 0 and result["possible"] > 0
    assert result["possible"] == sum(check["points"] for check in result["checks"])
    assert all({"name", "points", "earned", "outcome", "hint", "message"} <= set(check) for check in result["checks"])


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_student_notebooks_carry_nbgrader_metadata(notebook: Path) -> None:
    """Solution cells are nbgrader answer cells, check cells locked test cells with their points."""
    cells = nbformat.read(notebook, as_version=4).cells
    ids = [cell.metadata["nbgrader"]["grade_id"] for cell in cells if "nbgrader" in cell.metadata]
    assert len(ids) == len(set(ids)), "grade_ids must be unique"
    stubs = 0
    for cell in cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and "your code here\")" in cell.source:
            stubs += 1
            assert nbgrader.get("solution") is True and nbgrader.get("locked") is False, cell.id
        if "check" in cell.metadata:
            assert nbgrader.get("grade") is True and nbgrader.get("locked") is True, cell.id
            assert nbgrader.get("points") == cell.metadata["check"] and not nbgrader.get("solution"), cell.id
        if cell.cell_type == "markdown":
            assert nbgrader.get("locked") is True, cell.id
    assert stubs > 0, f"{notebook.name} has no cell for the student to fill in"


# -- the loader ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference_04(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ref") / "04_layers.ipynb"
    return _write(build.reference_notebook(ROOT / "modules/04_layers/04_layers.py"), path)


def test_overlay_lays_fresh_modules_over_the_package_and_restores_it(reference_04: Path) -> None:
    import tinytrain.nn
    import tinytrain.nn.layers
    import tinytrain.nn.module

    package_layers, package_module = sys.modules["tinytrain.nn.layers"], sys.modules["tinytrain.nn.module"]
    package_linear = tinytrain.nn.Linear
    with overlay.overlay(reference_04) as student:
        assert sys.modules["tinytrain.nn.layers"] is student._tt_modules["nn/layers"] is not package_layers
        assert sys.modules["tinytrain.nn.module"] is student._tt_modules["nn/module"]
        assert tinytrain.nn.layers is student._tt_modules["nn/layers"]
        # the student's layers are built on the student's own Module
        assert student.Module in student.Linear.__mro__ and package_module.Module not in student.Linear.__mro__
        from tinytrain.nn.module import Module  # imports inside the test see the student's code too

        assert Module is student.Module
        assert student.Linear is not package_linear
    assert sys.modules["tinytrain.nn.layers"] is package_layers and sys.modules["tinytrain.nn.module"] is package_module
    assert tinytrain.nn.layers is package_layers and tinytrain.nn.Linear is package_linear


def test_overlay_restores_after_an_error(reference_04: Path) -> None:
    before = dict(sys.modules)
    with pytest.raises(KeyError):
        with overlay.overlay(reference_04):
            raise KeyError("inside")
    assert {name: module for name, module in sys.modules.items() if name.startswith("tinytrain")} == {
        name: module for name, module in before.items() if name.startswith("tinytrain")
    }


def test_installed_code_is_the_package() -> None:
    import tinytrain.nn.layers

    student = overlay.installed_code("04_layers")
    assert student.Linear is tinytrain.nn.layers.Linear and student._tt_origin == "installed"
    with pytest.raises(AttributeError, match="04_layers's export cells define no 'Nothing'"):
        student.Nothing


def _broken(tmp_path: Path, replace: str, by: str) -> Path:
    notebook = build.student_notebook(ROOT / "modules/03_activations/03_activations.py")
    cells = [cell for cell in notebook.cells if cell.metadata.get("export")]
    for cell in cells:
        if replace in cell.source:
            cell.source = cell.source.replace(replace, by, 1)
            break
    else:
        raise AssertionError(f"{replace!r} not found")
    return _write(notebook, tmp_path / "03_activations.ipynb")


def test_syntax_error_names_cell_and_line(tmp_path: Path) -> None:
    notebook = _broken(tmp_path, "def relu(x: Tensor) -> Tensor:", "def relu(x: Tensor) -> Tensor")
    cells = json.loads(notebook.read_text())["cells"]
    number = next(i for i, cell in enumerate(cells, 1) if "def relu(x: Tensor) -> Tensor\n" in "".join(cell["source"]))
    line = "".join(cells[number - 1]["source"]).splitlines().index("def relu(x: Tensor) -> Tensor") + 1
    with pytest.raises(notebooks.NotebookError) as error:
        with overlay.overlay(notebook):
            pass
    message = str(error.value)
    assert f"cell {number} (id 03_activations-" in message and f"line {line}:" in message and "SyntaxError" in message
    report = grading.grade("03_activations", ROOT, notebook)
    assert report.earned == 0 and report.errors and f"cell {number}" in report.errors[0]


def test_ipython_magic_in_an_export_cell_is_explained(tmp_path: Path) -> None:
    notebook = _broken(tmp_path, "import math", "%timeit 1 + 1")
    with pytest.raises(notebooks.NotebookError, match="IPython magics"):
        with overlay.overlay(notebook):
            pass


def test_runtime_error_names_cell_and_line(tmp_path: Path) -> None:
    notebook = _broken(tmp_path, "import math", "import math\nraise RuntimeError('boom')")
    cells = json.loads(notebook.read_text())["cells"]
    number, cell = next((i, cell) for i, cell in enumerate(cells, 1) if "boom" in "".join(cell["source"]))
    line = "".join(cell["source"]).splitlines().index("raise RuntimeError('boom')") + 1
    with pytest.raises(notebooks.NotebookError, match=rf"cell {number} \(id {cell['id']}\), line {line}: .*RuntimeError: boom"):
        with overlay.overlay(notebook):
            pass


def test_missing_and_malformed_notebooks(tmp_path: Path) -> None:
    with pytest.raises(notebooks.NotebookError, match="does not exist"):
        notebooks.read_export_cells(tmp_path / "nope.ipynb")
    (tmp_path / "bad.ipynb").write_text("{not json")
    with pytest.raises(notebooks.NotebookError, match="not a Jupyter notebook"):
        notebooks.read_export_cells(tmp_path / "bad.ipynb")


def test_notebook_of_another_module_is_refused(reference_04: Path) -> None:
    with pytest.raises(notebooks.NotebookError, match="notebook of module 04_layers, not 03_activations"):
        with overlay.overlay(reference_04, "03_activations"):
            pass


def test_resolve_module() -> None:
    assert inventory.resolve_module("4", ROOT) == inventory.resolve_module("04", ROOT) == "04_layers"
    assert inventory.resolve_module("layers", ROOT) == inventory.resolve_module("04_layers", ROOT) == "04_layers"
    with pytest.raises(inventory.UnknownModule, match="unknown module '99'; the modules are: 01_tensor"):
        inventory.resolve_module("99", ROOT)


def test_module_numbers_may_have_gaps(tmp_path: Path) -> None:
    """Modules are found by their names, not counted: 01 and 03 without a 02 (as 15 and 18 while 16 and 17 are
    being written)."""
    for name in ("01_first", "03_third"):
        (tmp_path / "modules" / name).mkdir(parents=True)
        (tmp_path / "modules" / name / f"{name}.py").write_text("")
    empty_package = tmp_path / "package"
    empty_package.mkdir()
    assert inventory.known_modules(tmp_path, empty_package) == ["01_first", "03_third"]
    assert inventory.resolve_module("3", tmp_path, empty_package) == "03_third"
    with pytest.raises(inventory.UnknownModule, match="unknown module '2'; the modules are: 01_first, 03_third"):
        inventory.resolve_module("2", tmp_path, empty_package)


def test_check_decorator_validates() -> None:
    with pytest.raises(ValueError):
        checks.check(points=0, hint="x")
    with pytest.raises(ValueError):
        checks.check(points=1, hint=" ")

    @checks.check(points=3, hint="a hint")
    def test_something(student):
        pass

    assert (test_something.tinytrain_points, test_something.tinytrain_hint) == (3, "a hint")


def _graded_file(root: Path, name: str, code: str) -> Path:
    """A graded checks file ``tests/graded/<name>`` (with the real conftest) in a project at ``root``."""
    folder = root / "tests" / "graded"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "conftest.py").write_text((ROOT / "tests/graded/conftest.py").read_text())
    (folder / name).write_text(code)
    return folder / name


def test_graded_folder_refuses_ungraded_tests(tmp_path: Path) -> None:
    path = _graded_file(tmp_path, "test_03_ungraded_examples.py",
                        "from tinytrain.course.checks import check\n\n"
                        "def test_plain(student):\n    pass\n\n"
                        "@check(points=1, hint='h')\ndef test_no_student():\n    pass\n")
    collector = grading.run_checks([path], None, tmp_path)
    text = "\n".join(collector.errors)
    assert "test_plain: not a graded check" in text and "test_no_student: a graded check must take the `student`" in text


def test_a_check_that_needs_a_failing_one_names_it_instead_of_its_hint(tmp_path: Path, capsys) -> None:
    _graded_file(
        tmp_path, "test_03_activations.py",
        "import tinytrain as tt\nfrom tinytrain.course.checks import check, expect_close\n\n"
        "@check(points=2, hint='relu keeps positives')\ndef test_relu(student):\n"
        "    expect_close(student.relu(tt.tensor([-1.0])), [1.0], 'relu of [-1]')\n\n"
        "@check(points=1, hint='a hint that would mislead', after='test_relu')\ndef test_uses_relu(student):\n"
        "    assert student.relu(tt.tensor([-1.0])).item() == 1.0, 'needs relu'\n\n"
        "@check(points=1, hint='independent', after='test_relu')\ndef test_passes(student):\n    student.relu\n"
    )
    report = grading.grade("03_activations", tmp_path)
    first, second, third = report.checks
    assert first.outcome == second.outcome == "failed" and third.outcome == "passed"
    assert first.blocked_by == [] and second.blocked_by == ["test_relu"] and third.blocked_by == []
    assert first.message == ("AssertionError: relu of [-1]: 1 of 1 differ; largest difference 1 at [0] (expected 1, "
                             "got 0); expected [1.] (shape (1,), float64), got [0.] (shape (1,), float32)")
    from tinytrain.course.cli import _print_report

    _print_report(report)
    out = capsys.readouterr().out
    assert "hint: relu keeps positives" in out and "fails because relu fails: fix that first" in out
    assert "a hint that would mislead" not in out


def test_a_mismatch_in_a_stack_of_matrices_keeps_its_summary_and_both_arrays_in_the_report(tmp_path: Path) -> None:
    """A (2, 5, 16) block output: the report must not end inside the expected array, before 'got' and the summary."""
    _graded_file(
        tmp_path, "test_03_activations.py",
        "import numpy as np\nfrom tinytrain.course.checks import check, expect_close\n\n"
        "@check(points=1, hint='h')\ndef test_block(student):\n    student.relu\n"
        "    want = np.random.default_rng(0).standard_normal((2, 5, 16))\n    got = want.copy()\n"
        "    got[1, 2, 3] += 0.5\n    expect_close(got, want, 'Block(x)')\n"
    )
    message = grading.grade("03_activations", tmp_path).checks[0].message
    assert message.startswith("AssertionError: Block(x): 1 of 160 differ; largest difference 0.5 at [1, 2, 3] "
                              "(expected -0.75837, got -0.25837); expected [[[ 0.12573"), message
    assert "got [[[ 0.12573" in message and message.endswith("(shape (2, 5, 16), float64)"), message


class _BadRepr:
    """What a student's half-built object can be: its repr raises."""

    def __repr__(self) -> str:
        raise IndexError("empty")


def test_expectations_say_what_was_expected_and_what_came_out() -> None:
    from tinytrain.course.checks import expect_close, expect_equal, expect_raises

    cases = [
        (lambda: expect_close(np.zeros((2, 3)), np.zeros((3, 2)), "the gradient"),
         "the gradient: expected shape (3, 2), got shape (2, 3)"),
        (lambda: expect_close(np.zeros(2), np.zeros(2), "out", dtype="float32"), "out: expected dtype float32, got float64"),
        (lambda: expect_close([1.0, np.nan], [1.0, 2.0], "x"), "x: 1 of 2 differ; largest difference nan at [1] "
                                                                 "(expected 2, got nan)"),
        (lambda: expect_close(float("inf"), 1e21, "the norm"), "the norm: expected 1.e+21 (shape (), float64), got inf"),  # a scalar
        (lambda: expect_equal(3, 4, "the step count"), "the step count: expected 4, got 3"),
        # an object array equal element by element (a wrong collate makes one, and == alone would pass it)
        (lambda: expect_equal(np.array([[1.0], [2.0]], dtype=object), np.array([[1.0], [2.0]]), "batch"),
         "batch: expected an array of numbers [[1.]\n [2.]] (shape (2, 1), float64), got an array of Python objects"),
        (lambda: expect_raises(ValueError, lambda: 5, "Linear(2.5, 3)"), "Linear(2.5, 3): expected ValueError, but it returned 5"),
        (lambda: expect_raises(ValueError, lambda: {}["k"], "f()"), "f(): expected ValueError, got KeyError: 'k'"),
        (lambda: expect_raises(ValueError, lambda: _BadRepr(), "TensorDataset()"),
         "TensorDataset(): expected ValueError, but it returned a _BadRepr (whose repr raised IndexError: empty)"),
        (lambda: expect_raises(ValueError, lambda: int("x"), "int('x')", mentions=("'y'",)),
         "int('x'): expected the ValueError to name \"'y'\""),
    ]
    for call, message in cases:
        with pytest.raises(AssertionError) as error:
            call()
        assert message in str(error.value), str(error.value)
    expect_close([1.0, np.nan], [1.0 + 1e-9, np.nan], "nan where nan is expected passes")
    assert isinstance(expect_raises(KeyError, lambda: {}["k"], "lookup", mentions=("k",)), KeyError)


# -- export ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", build.module_sources(ROOT), ids=lambda path: path.stem)
def test_export_of_the_reference_rebuilds_the_library_files(source: Path, tmp_path: Path) -> None:
    """The own-module imports the build turned into comments come back as the same imports."""
    module = build.load_module(source)
    notebook = _write(build.reference_notebook(source), tmp_path / f"{module.name}.ipynb")
    texts, warnings = export.export_texts(notebook, module.name)
    assert not warnings
    for target, text in texts.items():
        header, body = text.split("\n", 1)
        assert header.startswith("# Exported by `tinytrain export` from ") and f"(module {module.name})" in header
        assert body == build.library_file(module, target).split("\n", 1)[1], target


def test_export_warns_about_names_from_lesson_cells(tmp_path: Path) -> None:
    notebook = _broken(tmp_path, "import math", "import math\n\n\ndef uses():\n    return helper(1)")
    _, warnings = export.export_texts(notebook, "03_activations")
    assert any("helper" in warning and "no export cell" in warning for warning in warnings)


def test_free_names() -> None:
    code = "import math\nX = 1\ndef f(a):\n    b = a\n    return g(b) + X + math.pi + len([])\nclass C(Base):\n    y = X\n"
    assert imports.free_names(code) == {"g", "Base"}


def test_an_endless_loop_fails_its_check(tmp_path: Path, monkeypatch) -> None:
    notebook = build.reference_notebook(ROOT / "modules/03_activations/03_activations.py")
    cell = next(cell for cell in notebook.cells if cell.metadata.get("export") and "return x.relu()" in cell.source)
    cell.source = cell.source.replace("return x.relu()", "while True:\n        pass")
    path = _write(notebook, tmp_path / "03_activations.ipynb")
    monkeypatch.setenv("TINYTRAIN_CHECK_TIMEOUT", "1")
    report = grading.grade("03_activations", ROOT, path)
    relu = next(check for check in report.checks if check.name == "test_relu")
    assert relu.outcome == "failed" and "TimeoutError" in relu.message
    assert report.earned == report.possible - relu.points
