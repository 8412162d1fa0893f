"""Grading a class: every student's notebook of one module into a gradebook.

Each notebook is graded by ``tinytrain grade NN --notebook ... --json`` in a
process of its own, with a time limit, so one broken submission (an endless
loop, a crash of the interpreter, code that changes global state) cannot
affect another's grade. The gradebook is written twice: a CSV with one row per
student and check (``student, check, points, earned, outcome, error``) and a
JSON list with one entry per student, every check's message included.

Submissions are found in a folder either as ``<student>.ipynb`` or, as
nbgrader collects them, as ``<student>/.../NN_name.ipynb``.
"""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tinytrain.course.files import write_atomic

CSV_COLUMNS = ("student", "check", "points", "earned", "outcome", "error")


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


def grade_submission(root: Path, module: str, submission: Submission, timeout: float) -> dict:
    """One student's grade, from a ``tinytrain grade`` run in a process of its own."""
    command = [sys.executable, "-m", "tinytrain", "grade", module[:2], "--notebook", str(submission.notebook),
               "--json", "--root", str(root)]
    entry = {"student": submission.student, "notebook": str(submission.notebook)}
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        return {**entry, "earned": 0, "possible": None, "checks": [],
                "errors": [f"grading stopped after {timeout:g} s (an endless loop at import?)"]}
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        tail = (result.stderr or result.stdout).strip()[-1500:]
        return {**entry, "earned": 0, "possible": None, "checks": [],
                "errors": [f"the grader stopped with exit status {result.returncode}: {tail}"]}
    return {**entry, "earned": report["earned"], "possible": report["possible"], "checks": report["checks"],
            "errors": report["errors"]}


def grade_class(root: Path, module: str, folder: Path, jobs: int = 2, timeout: float = 600) -> list[dict]:
    """Every submission's grade; a submission whose grader failed gets 0 of the class's possible points."""
    submissions = find_submissions(folder, module)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        grades = list(pool.map(lambda s: grade_submission(root, module, s, timeout), submissions))
    possible = next((grade["possible"] for grade in grades if grade["possible"]), None)
    for grade in grades:
        if grade["possible"] is None:
            grade["possible"] = possible
    return grades


def csv_text(grades: list[dict]) -> str:
    """The gradebook as CSV: a row per student and check, and a row per error (check ``(notebook)``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for grade in grades:
        for error in grade["errors"]:
            writer.writerow((grade["student"], "(notebook)", "", "", "error", error))
        for check in grade["checks"]:
            writer.writerow((grade["student"], check["name"], check["points"], check["earned"], check["outcome"],
                             check["message"] if check["outcome"] != "passed" else ""))
    return out.getvalue()


def write_gradebook(grades: list[dict], prefix: Path) -> tuple[Path, Path]:
    """``prefix.csv`` and ``prefix.json``, each written atomically."""
    prefix = Path(prefix)
    csv_path, json_path = prefix.with_name(prefix.name + ".csv"), prefix.with_name(prefix.name + ".json")
    write_atomic(csv_path, csv_text(grades))
    write_atomic(json_path, json.dumps(grades, indent=2) + "\n")
    return csv_path, json_path
