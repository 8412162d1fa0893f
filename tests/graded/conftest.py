"""The graded checks' fixture: ``student``, the code of the module a test file checks.

``tests/graded/test_NN_name.py`` checks module NN. Its tests are ``@check(points=, hint=)``
functions (``from tinytrain.course.checks import check``) that take the ``student`` fixture,
a :class:`tinytrain.course.overlay.StudentCode`: every top-level name of module NN's export
cells as an attribute (``student.relu``, ``student.Linear``).

* ``pytest tests/graded``: ``student`` is the installed package's code (the reference,
  or the student's code after ``tinytrain export``).
* ``pytest tests/graded --notebook notebooks/03_activations.ipynb`` (or the environment
  variable ``TINYTRAIN_STUDENT_NOTEBOOK``): ``student`` is that notebook's code, laid
  over the package for the test (see :func:`tinytrain.course.overlay.overlay`). Test files
  of other modules are skipped. A folder of notebooks grades each module's own.
``tinytrain grade NN`` runs one module's file this way and adds up the points.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import pytest

from tinytrain.course import checks, grading, inventory, notebooks, overlay

HERE = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        parser.addoption(
            "--notebook",
            metavar="PATH",
            default=None,
            help="grade this student notebook (or folder of notebooks) instead of the installed package",
        )
    except ValueError:  # already added (e.g. by a plugin of the same name)
        pass


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "graded(points, hint): a graded check (set by tinytrain.course.checks.check)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here is a graded check that uses the student's code."""
    problems = []
    for item in items:
        if HERE not in Path(str(item.path)).resolve().parents:
            continue
        if checks.check_info(item) is None:
            problems.append(f"{item.nodeid}: not a graded check; decorate it with @check(points=N, hint='...')")
        elif "student" not in getattr(item, "fixturenames", ()):
            problems.append(f"{item.nodeid}: a graded check must take the `student` fixture (and call its code)")
    if problems:
        raise pytest.UsageError("tests/graded:\n" + "\n".join(problems))


_NOT_LOADED: dict[tuple[str, str, int], str] = {}  # notebook, module, mtime -> why its export cells did not run


@pytest.fixture
def student(request: pytest.FixtureRequest):
    """The code of the module this test file checks (see the module docstring)."""
    module = inventory.module_of_test_file(request.path)
    notebook = grading.notebook_option(request.config)
    if notebook is None:
        with _time_limit():
            yield overlay.installed_code(module)
        return
    path = Path(notebook)
    if path.is_dir():
        path = notebooks.find_notebook(path, module)
    else:
        cells = notebooks.read_export_cells(path)
        belongs = notebooks.notebook_module(path, cells)
        if belongs is not None and belongs != module:
            pytest.skip(f"{path.name} is module {belongs}'s notebook; these are module {module}'s checks")
    key = (str(path.resolve()), module, path.stat().st_mtime_ns)
    if key in _NOT_LOADED:  # once per run: a cell that loops forever would cost every check the time limit
        raise notebooks.NotebookError(_NOT_LOADED[key])
    with contextlib.ExitStack() as stack:
        stack.enter_context(_time_limit())
        try:
            code = stack.enter_context(overlay.overlay(path, module))
        except notebooks.NotebookError as error:
            _NOT_LOADED[key] = str(error)
            raise
        yield code



@contextlib.contextmanager
def _time_limit():
    """Stop a check that runs longer than $TINYTRAIN_CHECK_TIMEOUT seconds (default 120):
    an endless loop in the student's code fails its check instead of hanging the grader."""
    seconds = float(os.environ.get("TINYTRAIN_CHECK_TIMEOUT", "120"))
    if seconds <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise TimeoutError(f"the check took longer than {seconds:g} s (an endless loop?)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
