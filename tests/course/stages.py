"""The course test's machinery: a scratch copy of the project where a student works through the modules.

The course test comes in two files that two pytest workers run side by side (9 and
11 minutes on 2 cores, where the whole took 22 in one file):

* ``tests/test_course.py``: the stages of the modules before ``SECOND_PART``;
* ``tests/test_course_second_part.py``: the students' solutions of those modules
  exported as they stand (their stages, notebooks and grades run in the first
  file), then the stages from ``SECOND_PART`` on and every milestone on the
  all-student library.

A stage (:func:`run_stage`) is the course for one module, in order, like a student:

1. fill the student notebook with the solution and run it top to bottom: its
   inline checks pass on the student's code, on top of the modules exported so far;
2. ``tinytrain grade NN --notebook``: full marks;
3. ``tinytrain export NN``; then ``tinytrain status``: every module's graded
   checks pass on the installed code -- the student's for this module and the
   earlier ones, the reference for the later ones, which so run on the student's;
4. run the next module's reference notebook on the student's library, so every
   lesson runs on the student's code of all the modules before it (with
   ``TINYTRAIN_COURSE_NOTEBOOKS=all``: every later module's, after each stage --
   eleven times the notebooks, for a thorough local run).

A module listed in ``WITHOUT_SOLUTION`` has no independent student's solution yet: it
has no stage of its own, and its reference notebook runs in the stage of the last module
before it that has one, on the students' library of all the modules before it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tinytrain.course import build
from tinytrain.course.solutions import fill, solution_bodies

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "tests" / "course" / "solutions"
SOURCES = build.module_sources(ROOT)
MODULES = [source.stem for source in SOURCES]
WITHOUT_SOLUTION = set()  # no tests/course/solutions/NN_name.py for these yet
SOLVED = [module for module in MODULES if module not in WITHOUT_SOLUTION]
# The first stage of the second file: the split that gave the two files the nearest times (minutes of stages
# 01-13 against 14-20 with the milestones, measured on 2 cores)
SECOND_PART = "14_attention"
FIRST_PART_STAGES = [module for module in SOLVED if module < SECOND_PART]
SECOND_PART_STAGES = [module for module in SOLVED if module >= SECOND_PART]


class Course:
    """A scratch copy of the project where a student works through the modules."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        for name in ("tinytrain", "modules", "notebooks", "milestones"):
            shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", ".tinytrain-backup"))
        shutil.copytree(ROOT / "tests" / "graded", folder / "tests" / "graded",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", folder)
        (folder / "students").mkdir()
        self.env = {**os.environ, "PYTHONPATH": str(folder), "OPENBLAS_NUM_THREADS": "1"}
        self.env.pop("TINYTRAIN_STUDENT_NOTEBOOK", None)
        self.passed: list[str] = []  # the stages done

    def run(self, *command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(command, cwd=self.folder, env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        return result

    def tinytrain(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "tinytrain", *args)

    def execute(self, notebooks: list[Path]) -> subprocess.CompletedProcess:
        return self.run(sys.executable, str(ROOT / "tests" / "course" / "run_notebooks.py"), *map(str, notebooks))

    def milestone(self, name: str, *options: str) -> subprocess.CompletedProcess:
        return self.run(sys.executable, f"milestones/{name}.py", *options)

    def filled_notebook(self, module: str) -> Path:
        """The student notebook of ``module`` filled with its independent solution, in ``students/``."""
        notebook = self.folder / "students" / f"{module}.ipynb"
        student = nbformat.read(ROOT / "notebooks" / f"{module}.ipynb", as_version=4)
        nbformat.write(fill(student, solution_bodies(SOLUTIONS / f"{module}.py")), notebook)
        return notebook

    def export_solutions(self, modules: list[str]) -> None:
        """Export each module's filled notebook, in order, without running or grading it (its stage does that
        in the first file): the library a student who finished those modules has. Counted as passed stages."""
        for module in modules:
            exported = self.tinytrain("export", module[:2], "--notebook", str(self.filled_notebook(module)))
            assert exported.returncode == 0, f"{module}: {exported.stderr}"
            self.passed.append(module)


def require(course: Course, stages: list[str]) -> None:
    """Skip the test unless every one of ``stages`` passed (a failure after a failed stage would be a knock-on)."""
    missing = [stage for stage in stages if stage not in course.passed]
    if missing:
        pytest.skip(f"needs the stages before it, which did not pass: {', '.join(missing)}")


def notebooks_after(module: str) -> list[Path]:
    """The sources whose reference notebooks run after ``module``'s stage: the next module's, and
    every one up to the next module with a solution (all later ones with TINYTRAIN_COURSE_NOTEBOOKS=all)."""
    following = SOURCES[MODULES.index(module) + 1:]
    if os.environ.get("TINYTRAIN_COURSE_NOTEBOOKS") == "all":
        return following
    solved = [i for i, source in enumerate(following) if source.stem in SOLVED]
    return following[: solved[0] + 1] if solved else following


def run_stage(course: Course, module: str) -> None:
    """``module``'s stage, steps 1-4 above, on the library of the stages before it."""
    require(course, SOLVED[: SOLVED.index(module)])
    notebook = course.filled_notebook(module)

    ran = course.execute([notebook])
    assert ran.returncode == 0, f"the student's notebook stops:\n{ran.stdout[-4000:]}"
    graded = course.tinytrain("grade", module[:2], "--notebook", str(notebook), "--json")
    report = json.loads(graded.stdout)
    failed = [f"{check['name']}: {check['message']}" for check in report["checks"] if check["outcome"] != "passed"]
    assert report["earned"] == report["possible"] > 0 and not report["errors"], (failed, report["errors"])
    exported = course.tinytrain("export", module[:2], "--notebook", str(notebook))
    assert exported.returncode == 0, exported.stderr

    status = json.loads(course.tinytrain("status", "--json").stdout)
    rows = {row["module"]: row for row in status["modules"]}
    assert all(rows[name]["code"].startswith("student") for name in SOLVED[: SOLVED.index(module) + 1])
    failing = {name: row["checks"] for name, row in rows.items() if not row["checks"].endswith("all pass")}
    assert failing == {} and status["advice"] == [], (failing, status["advice"])

    later = []
    for source in notebooks_after(module):
        later.append(course.folder / "students" / f"{source.stem}-reference-after-{module[:2]}.ipynb")
        nbformat.write(build.reference_notebook(source), later[-1])
    if later:
        ran = course.execute(later)
        assert ran.returncode == 0, f"a later module's reference notebook fails on the student's code:\n{ran.stdout[-4000:]}"
    course.passed.append(module)
