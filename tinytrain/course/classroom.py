"""Grading a class: every student's notebook of one module into a gradebook.

Each notebook is graded in a sandbox of its own (:mod:`tinytrain.course.sandbox`:
bubblewrap where it works, else resource limits and a scratch copy), with time,
memory, output and process limits, and its verdict is taken from outside the
student's process, so one broken or hostile submission (an endless loop, a crash,
a forged report, code that writes files or starts daemons) earns its own 0 and
cannot affect another's grade. The gradebook is written twice: a CSV with one row
per student and check (``student, check, points, earned, outcome, error,
sandbox``) and a JSON list with one entry per student, every check's message
included. Messages are cut short, and a CSV cell that a spreadsheet would read as
a formula is quoted.

Submissions are found in a folder either as ``<student>.ipynb`` or, as
nbgrader collects them, as ``<student>/.../NN_name.ipynb``.
"""
from __future__ import annotations

import csv
import io
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tinytrain.course.files import write_atomic
from tinytrain.course.sandbox import Limits, clean, expected_checks, grade_isolated, resolve_sandbox

CSV_COLUMNS = ("student", "check", "points", "earned", "outcome", "error", "sandbox")


@dataclass(frozen=True)
class Submission:
    student: str
    notebook: Path


def find_submissions(folder: Path, module: str) -> list[Submission]:
    """The students' notebooks of ``module`` in ``folder``, in the order of the students' names.

    A notebook directly in ``folder`` is named after its student (``alice.ipynb``);
    in a subfolder (nbgrader's ``submitted/alice/ps3/``), the subfolder names the
    student and the notebook is ``NN_name.ipynb``. Raises ``ValueError`` when a
    student has two notebooks, and when there are none at all.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of student notebooks")
    found: dict[str, Path] = {}
    for path in sorted(folder.glob("*.ipynb")):
        found[path.stem] = path
    for student_folder in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        notebooks = sorted(student_folder.rglob(f"{module}.ipynb"))
        notebooks = [path for path in notebooks if ".ipynb_checkpoints" not in path.parts]
        if len(notebooks) > 1:
            raise ValueError(f"student {student_folder.name} has {len(notebooks)} notebooks {module}.ipynb: "
                             + ", ".join(str(path) for path in notebooks))
        if notebooks:
            if student_folder.name in found:
                raise ValueError(f"student {student_folder.name} has two notebooks: {found[student_folder.name]} "
                                 f"and {notebooks[0]}")
            found[student_folder.name] = notebooks[0]
    if not found:
        raise ValueError(f"no student notebooks in {folder} (neither <student>.ipynb nor <student>/.../{module}.ipynb)")
    return [Submission(student, path) for student, path in sorted(found.items())]


def grade_submission(root: Path, module: str, submission: Submission, sandbox: str = "auto",
                     limits: Limits = Limits(), expected: dict[str, dict] | None = None) -> dict:
    """One student's grade, from a grading in ``sandbox`` (see :func:`tinytrain.course.sandbox.grade_isolated`)."""
    report = grade_isolated(root, module, submission.notebook, sandbox, limits, expected)
    return {"student": submission.student, "notebook": str(submission.notebook), "earned": report.earned,
            "possible": report.possible, "checks": [check.as_dict() for check in report.checks],
            "errors": report.errors, "sandbox": report.sandbox}


def grade_class(root: Path, module: str, folder: Path, jobs: int = 2, sandbox: str = "auto",
                limits: Limits = Limits()) -> list[dict]:
    """Every submission's grade, each graded alone in ``sandbox`` within ``limits``."""
    submissions = find_submissions(folder, module)
    sandbox = resolve_sandbox(sandbox)  # once for the class, and before any grading starts
    expected = expected_checks(root, module)  # here: pytest collects in the main thread only
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(lambda s: grade_submission(root, module, s, sandbox, limits, expected), submissions))


def csv_text(grades: list[dict]) -> str:
    """The gradebook as CSV: a row per student and check, and a row per error (check ``(notebook)``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for grade in grades:
        rows = [(grade["student"], "(notebook)", "", "", "error", error) for error in grade["errors"]]
        rows += [(grade["student"], check["name"], check["points"], check["earned"], check["outcome"],
                  check["message"] if check["outcome"] != "passed" else "") for check in grade["checks"]]
        writer.writerows([(*map(_cell, row), _cell(grade["sandbox"])) for row in rows])
    return out.getvalue()


def _cell(value: object) -> object:
    """``value`` for a CSV cell: text cut short, and quoted with ``'`` where a spreadsheet would
    read it as a formula (it starts with = + - @, a tab or a carriage return)."""
    if not isinstance(value, str):
        return value
    text = clean(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_gradebook(grades: list[dict], prefix: Path) -> tuple[Path, Path]:
    """``prefix.csv`` and ``prefix.json``, each written atomically."""
    prefix = Path(prefix)
    csv_path, json_path = prefix.with_name(prefix.name + ".csv"), prefix.with_name(prefix.name + ".json")
    write_atomic(csv_path, csv_text(grades))
    write_atomic(json_path, json.dumps(grades, indent=2) + "\n")
    return csv_path, json_path
