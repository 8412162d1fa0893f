"""Running a module's graded checks with pytest, in-process, and adding up the points.

:func:`grade` runs ``tests/graded/test_NN_name.py`` on a notebook (laid over the
package, see :mod:`tinytrain.course.overlay`) or on the installed package, with a
:class:`Collector` plugin that records each check's outcome, points and hint.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinytrain.course.diagnose import Blame, blame, exported_note
from tinytrain.course.inventory import PACKAGE_DIR, UnknownModule, graded_test_files, module_of_test_file
from tinytrain.course.notebooks import NotebookError, defined_outside_export_cells

NOTEBOOK_ENV = "TINYTRAIN_STUDENT_NOTEBOOK"


@dataclass
class CheckResult:
    name: str
    nodeid: str
    points: int
    outcome: str  # "passed", "failed", "skipped" or "unrun" (pytest stopped before it: no points)
    hint: str
    message: str = ""
    doc: str = ""
    cause: Blame | None = None  # another module's exported (student) code that raised the failure
    after: tuple[str, ...] = ()  # the checks this one needs (``@check(after=...)``)
    blocked_by: list[str] = field(default_factory=list)  # of those, the ones that failed too

    @property
    def earned(self) -> int:
        return self.points if self.outcome == "passed" else 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodeid": self.nodeid, "outcome": self.outcome, "points": self.points,
                "earned": self.earned, "hint": self.hint, "message": self.message, "doc": self.doc,
                "cause": None if self.cause is None else str(self.cause), "blocked_by": self.blocked_by}


@dataclass
class GradeReport:
    module: str
    notebook: str | None  # None: the installed package was graded
    checks: list[CheckResult]
    errors: list[str] = field(default_factory=list)  # collection errors, a notebook that does not load
    notes: list[str] = field(default_factory=list)  # what else may explain a failure (see grade)
    sandbox: str | None = None  # where the notebook's code ran (tinytrain.course.sandbox); None: in this process

    @property
    def earned(self) -> int:
        return sum(check.earned for check in self.checks)

    @property
    def possible(self) -> int:
        return sum(check.points for check in self.checks if check.outcome != "skipped")

    @property
    def passed(self) -> bool:
        return not self.errors and self.possible > 0 and self.earned == self.possible

    def as_dict(self) -> dict[str, Any]:
        return {"module": self.module, "notebook": self.notebook, "earned": self.earned,
                "possible": self.possible, "checks": [check.as_dict() for check in self.checks],
                "errors": self.errors, "notes": self.notes, "sandbox": self.sandbox}


class Collector:
    """pytest plugin: records each graded check's outcome, points and hint."""

    def __init__(self, notebook: str | None = None) -> None:
        self.notebook = notebook  # read by the `student` fixture (see notebook_option)
        self.results: dict[str, CheckResult] = {}
        self.errors: list[str] = []

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        # imported here: it loads NumPy, and the `tinytrain` command starts without NumPy so that
        # `tinytrain milestone` can still ask for one BLAS thread (BLAS reads that as NumPy loads it)
        from tinytrain.course.checks import check_after, check_info

        for item in items:
            info = check_info(item)
            if info is not None:
                doc = (item.function.__doc__ or "").strip().splitlines()
                self.results[item.nodeid] = CheckResult(item.name, item.nodeid, info[0], "unrun", info[1],
                                                        doc=doc[0] if doc else "", after=check_after(item))

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.errors.append(f"collecting {report.nodeid or 'the checks'} failed:\n{_text(report)}")

    def pytest_runtest_makereport(self, item: Any, call: Any) -> None:
        """Keep why the notebook does not load (once), and note when a failure was raised in
        another module's exported code (a knock-on failure)."""
        result = self.results.get(item.nodeid)
        if result is None or call.excinfo is None:
            return
        error = call.excinfo.value
        if isinstance(error, NotebookError):
            if str(error) not in self.errors:
                self.errors.insert(0, str(error))
            return
        if isinstance(error, NameError) and self.notebook and error.name:
            cell = defined_outside_export_cells(self.notebook, error.name)
            if cell is not None:  # it worked in Jupyter, where every cell shares one namespace
                result.hint = (f"{error.name!r} is defined in {cell}, which is not an export cell: the grader and "
                               "your library run only export cells; import or define it in an export cell")
        if result.cause is not None or isinstance(error, AssertionError):
            return  # an assertion (gradcheck's too) is a check's verdict on values, not another module's crash
        culprit = blame(error)
        if culprit is not None and culprit.module != module_of_test_file(item.path):
            result.cause = culprit

    def pytest_runtest_logreport(self, report: Any) -> None:
        message = _failure_message(report) if report.failed else _skip_reason(report) if report.skipped else ""
        self.record(report.nodeid, report.when, report.outcome, message)

    def record(self, nodeid: str, when: str, outcome: str, message: str) -> CheckResult | None:
        """Count one phase (``when``: setup, call or teardown) of a check: a check passes when its
        call passes and no phase fails; skipped in setup or call, it earns nothing and costs nothing."""
        result = self.results.get(nodeid)
        if result is None or result.outcome == "failed":
            return result
        if outcome == "failed":
            result.outcome, result.message = "failed", message
        elif outcome == "skipped" and when in ("setup", "call"):
            result.outcome, result.message = "skipped", message
        elif outcome == "passed" and when == "call":
            result.outcome = "passed"
        return result

    @staticmethod
    def result_from(fields: dict[str, Any]) -> CheckResult:
        """A fresh copy of a collected check's result (its fields as ``dataclasses.asdict`` gives them)."""
        return CheckResult(**{**fields, "after": tuple(fields["after"]), "blocked_by": list(fields["blocked_by"])})

    def report(self, module: str) -> GradeReport:
        failed = {result.name.partition("[")[0] for result in self.results.values() if result.outcome == "failed"}
        for result in self.results.values():
            if result.outcome == "failed":
                result.blocked_by = [name for name in result.after if name in failed]
        return GradeReport(module, self.notebook, list(self.results.values()), list(self.errors))


def _text(report: Any) -> str:
    text = getattr(report, "longreprtext", "") or str(report.longrepr or "")
    return text.strip()


def _failure_message(report: Any) -> str:
    """What a check says about its failure, on one line: the exception's message, which for an
    ``expect_*`` helper or ``assert ..., message`` names what was expected and what came out."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else (_text(report).splitlines() or ["failed"])[-1]
    if report.when != "call":
        message = f"(in {report.when}) {message}"
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return "failed"
    # pytest's assertion introspection follows the message with lines such as "assert 3 == 4": keep two
    # of them after a bare assert, none after a message that says it all.
    introspection = next((i for i, line in enumerate(lines) if line.startswith("assert ")), len(lines))
    if introspection == 0 or lines[0].removeprefix("AssertionError: ").startswith("assert "):
        kept = lines[:3]
    else:
        kept = [" ".join(lines[:introspection])]
    return " | ".join(kept)[:1000]  # expect_close's summary comes first, then both arrays: a stack of matrices fits


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def notebook_option(config: Any) -> str | None:
    """The notebook to grade: the Collector's (``tinytrain grade``), ``--notebook``, or the env var."""
    for plugin in config.pluginmanager.get_plugins():
        if isinstance(plugin, Collector) and plugin.notebook:
            return plugin.notebook
    option = config.getoption("notebook", default=None)
    return option or os.environ.get(NOTEBOOK_ENV) or None


def run_checks(test_files: Sequence[Path], notebook: str | os.PathLike | None = None,
               root: Path | None = None, stop_at_first_failure: bool = False, collect_only: bool = False,
               plugins: Sequence[Any] = (), confcutdir: Path | None = None) -> Collector:
    """Run graded test files in-process with pytest; the Collector holds the results.

    pytest's own output is swallowed (the Collector keeps what matters). Modules the run
    imports from the test folder are forgotten afterwards, so runs can repeat in a process.
    A test file that does not load is an error of the run; the other files' checks still run.
    ``stop_at_first_failure`` leaves the checks after a failing one unrun: for a caller
    that only asks whether anything fails. ``collect_only``: find the checks, run none
    (every result stays "unrun"). ``plugins`` run beside the Collector; conftest files are
    read from ``confcutdir`` down (default: the test files' folder, when they share one).
    """
    import pytest

    collector = Collector(str(notebook) if notebook else None)
    args = [str(path) for path in test_files]
    args += ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=", "--no-header",
             "--continue-on-collection-errors", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if root is not None:
        args += ["--rootdir", str(root)]
    if stop_at_first_failure:
        args.append("-x")
    if collect_only:
        args.append("--collect-only")
    # Only the graded folder's conftest: the test suite's (tests/conftest.py) needs test-only packages.
    folders = sorted({str(Path(path).resolve().parent) for path in test_files})
    if confcutdir is not None:
        args += ["--confcutdir", str(confcutdir)]
    elif len(folders) == 1:
        args += ["--confcutdir", folders[0]]
    # Test modules are imported under their file names (pytest's default import mode): set
    # aside same-named modules of an earlier or enclosing run, and put them back afterwards.
    aside = {name: sys.modules.pop(name) for name in ["conftest", *(Path(p).stem for p in test_files)]
             if name in sys.modules}
    before = set(sys.modules)
    output = io.StringIO()
    hook, sys.breakpointhook = sys.breakpointhook, _no_breakpoint
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            status = pytest.main(args, plugins=[collector, *plugins])
    finally:
        sys.breakpointhook = hook
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if name in aside or any(file.startswith(folder) for folder in folders):
                del sys.modules[name]
        sys.modules.update(aside)
    if status not in (0, 1, 5) and not collector.errors:
        # Usage errors, internal errors, interrupted: show what pytest said.
        collector.errors.append(f"pytest exited with status {int(status)}:\n{output.getvalue().strip()[-3000:]}")
    return collector


def _no_breakpoint(*args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` while grading: the debugger's prompt would wait, unseen, until the time limit."""
    raise RuntimeError("breakpoint() in the graded code: remove it (the debugger would wait for input)")


def grade(module: str, root: Path, notebook: str | os.PathLike | None = None,
          stop_at_first_failure: bool = False, package: Path = PACKAGE_DIR) -> GradeReport:
    """Run ``module``'s graded checks on ``notebook`` (None: on the installed package).

    A failing check's hint is about this module's code, but the checks run on the package,
    which may hold the student's exported code of other modules: a wrong value there (a
    gradient, say) fails checks here without naming its module. So when a check fails and
    the package holds other modules' exported code, the report's ``notes`` name them.
    """
    tests = graded_test_files(root).get(module)
    if tests is None:
        raise UnknownModule(f"module {module} has no graded checks (tests/graded/test_{module}.py under {root})")
    report = run_checks([tests], notebook, root, stop_at_first_failure).report(module)
    if any(check.outcome == "failed" and check.cause is None for check in report.checks):
        note = exported_note("a failure here", besides=module, package=package)
        report.notes += [note] if note else []
    return report
