"""The course test, first part: the whole course runs on independent students' code.

``tests/course/solutions/NN_name.py`` holds a solution for every function each
module asks for, written from the lesson text and docstrings alone, plainly,
without the reference's optimisations. In a scratch copy of the project (first
on ``PYTHONPATH`` of every command, so this checkout is never touched), module
by module in order, like a student, each module's *stage*
(``tests/course/stages.py`` says what one does): the student's notebook runs,
earns full marks and is exported, every module's graded checks pass on the
library so far, and the next lesson's reference notebook runs on it.

This file runs the stages before ``SECOND_PART`` (Module 14);
``tests/test_course_second_part.py`` the rest, then the milestones on the
all-student library: two pytest workers run the halves side by side. A stage
runs only when the ones before it passed (a later failure would be a knock-on).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
sys.path.insert(0, str(Path(__file__).parent / "course"))
from stages import FIRST_PART_STAGES, MODULES, SOLUTIONS, SOLVED, WITHOUT_SOLUTION, Course, run_stage  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Course:
    return Course(tmp_path_factory.mktemp("course"))


def test_every_module_has_a_students_solution_or_is_listed_without_one() -> None:
    assert WITHOUT_SOLUTION <= set(MODULES), sorted(WITHOUT_SOLUTION - set(MODULES))
    assert sorted(path.stem for path in SOLUTIONS.glob("[0-9][0-9]_*.py")) == SOLVED


@pytest.mark.parametrize("module", FIRST_PART_STAGES)
def test_module_on_the_students_library(course: Course, module: str) -> None:
    run_stage(course, module)
