"""Grading a class (``tinytrain grade-class``) and nbgrader's own pipeline on our notebooks."""
from __future__ import annotations

import csv
import json
import os
import sysconfig
from pathlib import Path

import nbformat
import pytest

from tinytrain.course import build, classroom
from tinytrain.course.cli import main

ROOT = Path(__file__).resolve().parents[1]
SOURCE_03 = ROOT / "modules/03_activations/03_activations.py"


def _class_folder(folder: Path) -> Path:
    """alice: the reference; bob: the unfilled notebook; carol: code that kills its interpreter at import;
    dave: the reference, where nbgrader collects it (dave/ps3/03_activations.ipynb)."""
    folder.mkdir()
    nbformat.write(build.reference_notebook(SOURCE_03), folder / "alice.ipynb")
    nbformat.write(build.student_notebook(SOURCE_03), folder / "bob.ipynb")
    broken = build.reference_notebook(SOURCE_03)
    cell = next(cell for cell in broken.cells if cell.metadata.get("export"))
    cell.source = "import os\nos._exit(3)\n" + cell.source
    nbformat.write(broken, folder / "carol.ipynb")
    (folder / "dave" / "ps3").mkdir(parents=True)
    nbformat.write(build.reference_notebook(SOURCE_03), folder / "dave" / "ps3" / "03_activations.ipynb")
    return folder


def test_a_class_is_graded_into_a_gradebook_each_notebook_alone(tmp_path: Path, capsys) -> None:
    folder = _class_folder(tmp_path / "submitted")
    assert main(["grade-class", "03", str(folder), "--out", str(tmp_path / "book"), "--jobs", "2",
                 "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out
    grades = {grade["student"]: grade for grade in json.loads((tmp_path / "book.json").read_text())}
    assert sorted(grades) == ["alice", "bob", "carol", "dave"]
    full = grades["alice"]["possible"]
    assert full > 0 and grades["alice"]["earned"] == grades["dave"]["earned"] == full, out
    assert grades["bob"]["earned"] == 0 and grades["bob"]["possible"] == full and not grades["bob"]["errors"]
    assert grades["carol"]["earned"] == 0 and grades["carol"]["possible"] == full
    assert "exit status 3" in grades["carol"]["errors"][0], "the crash is recorded, the others are unaffected"
    with open(tmp_path / "book.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == list(classroom.CSV_COLUMNS)
    bob = [row for row in rows if row["student"] == "bob"]
    assert len(bob) == len(grades["bob"]["checks"]) and all(row["outcome"] == "failed" for row in bob)
    assert all("NotImplementedError" in row["error"] for row in bob)
    carol = [row for row in rows if row["student"] == "carol"]
    assert [(row["check"], row["outcome"]) for row in carol[:2]] == [("(notebook)", "error"), ("test_relu", "unrun")]
    assert len(carol) == 1 + len(bob) and all(row["earned"] == "0" for row in carol[1:])
    assert "alice" in out and f"{full}/{full}" in out


def test_submissions_are_found_in_both_layouts_and_duplicates_refused(tmp_path: Path) -> None:
    folder = _class_folder(tmp_path / "submitted")
    found = classroom.find_submissions(folder, "03_activations")
    assert [submission.student for submission in found] == ["alice", "bob", "carol", "dave"]
    nbformat.write(build.student_notebook(SOURCE_03), folder / "dave.ipynb")
    with pytest.raises(ValueError, match="student dave has two notebooks"):
        classroom.find_submissions(folder, "03_activations")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no student notebooks"):
        classroom.find_submissions(tmp_path / "empty", "03_activations")


@pytest.mark.filterwarnings("ignore:Object of type")  # nbgrader's own SQLAlchemy use
def test_nbgrader_releases_and_autogrades_our_notebooks(tmp_path: Path, monkeypatch) -> None:
    """nbgrader's own pipeline: generate_assignment makes the release from our source version, and
    autograde gives the reference full marks and the release (unfilled) zero."""
    pytest.importorskip("nbgrader")
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    # nbgrader runs `alembic`, installed beside this Python, by name
    monkeypatch.setenv("PATH", sysconfig.get_path("scripts") + os.pathsep + os.environ.get("PATH", ""))
    course = tmp_path / "course"
    assert main(["build", "--root", str(ROOT), "--nbgrader-source", str(course / "source")]) == 0
    assert (course / "source" / "13_scale" / "13_scale.ipynb").is_file()
    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.course_id = "tinytrain"
    config.Exchange.root = str(tmp_path / "exchange")
    api = NbGraderAPI(config=config)
    generated = api.generate_assignment("03_activations")
    assert generated["success"], generated.get("error", "") + generated.get("log", "")[-3000:]
    release = nbformat.read(course / "release" / "03_activations" / "03_activations.ipynb", as_version=4)
    assert all("### BEGIN SOLUTION" not in cell.source for cell in release.cells)
    for student, notebook in (("alice", build.reference_notebook(SOURCE_03)), ("bob", release)):
        (course / "submitted" / student / "03_activations").mkdir(parents=True)
        nbformat.write(notebook, course / "submitted" / student / "03_activations" / "03_activations.ipynb")
        graded = api.autograde("03_activations", student)
        assert graded["success"], graded.get("error", "") + graded.get("log", "")[-3000:]
    points = sum(cell.metadata["check"] for cell in build.reference_notebook(SOURCE_03).cells if "check" in cell.metadata)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        alice, bob = (gradebook.find_submission("03_activations", student) for student in ("alice", "bob"))
        assert (alice.score, alice.max_score) == (points, points) and bob.score == 0
