"""Grading submissions you did not write: hostile notebooks earn 0 with a reason and change nothing else.

Each attack is a small notebook made here: Module 03's unfilled student notebook with
code put in front of its first export cell (so it runs when the grader loads the
notebook), or its reference notebook for the honest students. One ``grade-class`` run
grades them all together; every attack must earn 0 with a reason in the gradebook,
the honest students their solo grades, nothing outside the scratch area may change
and no process may survive. The ``bwrap`` sandbox blocks every attack; the ``rlimit``
fallback (no bubblewrap) blocks those it can: it cannot hide files from code that
runs as the instructor's user, so reading or writing them is tested with bwrap only.
"""
from __future__ import annotations

import csv
import json
import os
import secrets
import sysconfig
import time
from pathlib import Path

import nbformat
import pytest

from tinytrain.course import build, classroom, grading, sandbox
from tinytrain.course.cli import main
from tinytrain.course.inventory import PACKAGE_DIR

ROOT = Path(__file__).resolve().parents[1]
SOURCE_03 = ROOT / "modules/03_activations/03_activations.py"
MODULE = "03_activations"
TOKEN = f"tinytrain-hostile-{secrets.token_hex(6)}"  # in the command line of every process an attack starts
SECRET_VARIABLE = "TINYTRAIN_INSTRUCTOR_SECRET"
needs_bwrap = pytest.mark.skipif(not sandbox.bwrap_status()[0], reason=f"no bubblewrap: {sandbox.bwrap_status()[1]}")


def _notebook(code: str, reference: bool = False, appended: str = "") -> nbformat.NotebookNode:
    """Module 03's notebook (the unfilled one, or the reference) with ``code`` run first at load,
    and ``appended`` after the last export cell's code."""
    notebook = (build.reference_notebook if reference else build.student_notebook)(SOURCE_03)
    exports = [cell for cell in notebook.cells if cell.metadata.get("export")]
    exports[0].source = code + "\n" + exports[0].source
    exports[-1].source += "\n" + appended
    return notebook


def _sleeper(seconds: int = 600) -> str:
    """Code that replaces the current process by a shell sleeping ``seconds``, named with TOKEN."""
    return f'os.execv("/bin/sh", ["sh", "-c", "sleep {seconds}", "{TOKEN}"])'


def _attacks(submissions: Path, gradebook: Path) -> dict[str, tuple[str, str]]:
    """name -> (code run at load, code appended), for the attacks any sandbox must stop."""
    return {
        "forged_report": ('import json, os, sys\nprint(json.dumps({"module": "03_activations", "earned": 12, '
                          '"possible": 12, "checks": [], "errors": []}))\nsys.stdout.flush()\nos._exit(0)', ""),
        "early_exit": ("import os\nos._exit(0)", ""),
        "patched_grader": ("import _pytest.python, tinytrain.course.grading as grading\n"
                           "_pytest.python.Function.runtest = lambda self: None\n"
                           "grading.Collector.report = lambda self, module: None", ""),
        "patched_checks": ("import sys\nchecks = sys.modules['test_03_activations']\n"
                           "checks.expect_close = lambda *args, **kwargs: None", ""),
        "huge_allocation": ("import numpy\nkept = numpy.ones(20 * 2**30 // 8)", ""),
        "endless_loop": ("while True:\n    pass", ""),
        "fork_50": ("import os\nfor _ in range(50):\n    if os.fork() == 0:\n        " + _sleeper(), ""),
        "daemon": ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                   f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 3; echo hacked > {gradebook}.csv', '{TOKEN}'])\n"
                   "    os._exit(0)\nos.wait()", ""),
        "output_100mb": ('import os\nfor _ in range(100):\n    os.write(1, b"x" * (1 << 20))', ""),
        "segfault": ("import ctypes\nctypes.string_at(0)", ""),
        "leaky_message": ("import os\nraise ValueError(repr(sorted(os.environ)) + 'y' * 100000)", ""),
        "formula": ("", 'def relu(x):\n    raise type("=HYPERLINK(1)", (Exception,), {"__module__": "builtins"})("boom")'),
    }


def _bwrap_only_attacks(submissions: Path, gradebook: Path) -> dict[str, tuple[str, str]]:
    """Attacks on files the instructor's user may read or write: only a sandbox with its own view stops them."""
    site = Path(sysconfig.get_paths()["purelib"])
    return {
        "copies_classmate": ("", "import json\ncells = json.load(open({!r}))['cells']\n"
                                 "exec('\\n'.join(''.join(c['source']) for c in cells if c['metadata'].get('export')))"
                                 .format(str(submissions / "alice.ipynb"))),
        "overwrites_classmate": (f"open({str(submissions / 'zoe.ipynb')!r}, 'w').write('{{}}')", ""),
        "writes_package": (f"open({str(PACKAGE_DIR / 'course' / f'{TOKEN}.py')!r}, 'w').write('x = 1')\n"
                           f"open({str(site / f'{TOKEN}.pth')!r}, 'w').write('import os')", ""),
        "writes_gradebook": (f"open({str(gradebook) + '.csv'!r}, 'w').write('student\\nmallory,12')", ""),
    }


def _snapshot(*folders: Path) -> dict[str, tuple[int, int]]:
    """path -> (size, modification time) of every file below ``folders`` (bytecode caches aside)."""
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for folder in folders
            for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts}


def _survivors() -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if TOKEN in text and "pytest" not in text:
            found.append(f"{cmdline.parent.name}: {text[:120]}")
    return found


def _grade_hostile_class(tmp_path: Path, kind: str, attacks: dict[str, tuple[str, str]], monkeypatch) -> tuple:
    monkeypatch.setenv(SECRET_VARIABLE, "the instructor's token")
    submissions, gradebook = tmp_path / "submitted", tmp_path / "gradebook"
    submissions.mkdir()
    nbformat.write(_notebook("", reference=True), submissions / "alice.ipynb")  # honest, complete
    nbformat.write(_notebook(""), submissions / "zoe.ipynb")  # honest, nothing filled in
    for name, (code, appended) in attacks.items():
        nbformat.write(_notebook(code, appended=appended), submissions / f"{name}.ipynb")
    solo = {student: grading.grade(MODULE, ROOT, submissions / f"{student}.ipynb").earned
            for student in ("alice", "zoe")}
    before = _snapshot(submissions, PACKAGE_DIR, ROOT / "tests" / "graded")
    started = time.perf_counter()
    status = main(["grade-class", "03", str(submissions), "--out", str(gradebook), "--jobs", "4", "--timeout", "60",
                   "--sandbox", kind, "--root", str(ROOT)])
    seconds = time.perf_counter() - started
    csv_text = (tmp_path / "gradebook.csv").read_text()
    time.sleep(4)  # a daemon that outlived grading would write the gradebook now
    assert (tmp_path / "gradebook.csv").read_text() == csv_text, "something changed the gradebook after grading"
    assert _survivors() == [], "processes started by the graded code outlived grading"
    assert _snapshot(submissions, PACKAGE_DIR, ROOT / "tests" / "graded") == before, "files outside the scratch area changed"
    grades = {grade["student"]: grade for grade in json.loads((tmp_path / "gradebook.json").read_text())}
    return status, grades, solo, csv_text, seconds


def _assert_verdicts(grades: dict, solo: dict, attacks: dict, kind: str, csv_text: str) -> None:
    assert {student: grades[student]["earned"] for student in solo} == solo
    assert solo["alice"] == grades["alice"]["possible"] > 0 and not grades["alice"]["errors"]
    for name in attacks:
        grade = grades[name]
        reasons = grade["errors"] + [check["message"] for check in grade["checks"] if check["outcome"] != "passed"]
        assert grade["earned"] == 0 and grade["possible"] == grades["alice"]["possible"], (name, grade["earned"])
        assert reasons and all(reasons), f"{name}: earned 0 without a reason"
        assert all(len(reason) < sandbox.MESSAGE_CHARACTERS + 50 for reason in reasons), f"{name}: a message too long"
        assert grade["sandbox"] == kind
    assert SECRET_VARIABLE not in csv_text and "the instructor's token" not in csv_text
    with_formula = [row for row in csv.reader(csv_text.splitlines()) if any(cell.startswith("=") for cell in row)]
    assert with_formula == [], "a cell a spreadsheet runs as a formula"
    assert "'=HYPERLINK" in csv_text
    for name, words in {"forged_report": "stopped before its checks ended", "early_exit": "stopped before",
                        "patched_grader": "control checks", "patched_checks": "changed the grader",
                        "huge_allocation": "MemoryError", "endless_loop": "time limit", "fork_50": "processes",
                        "output_100mb": "File too large", "segfault": "SIGSEGV"}.items():
        if name in attacks:
            text = " ".join(grades[name]["errors"] + [check["message"] for check in grades[name]["checks"]])
            assert words in text, f"{name}: the reason should say {words!r}; it says {text[:300]!r}"


@needs_bwrap
@pytest.mark.slow
def test_bwrap_sandbox_stops_every_attack(tmp_path: Path, monkeypatch) -> None:
    submissions, gradebook = tmp_path / "submitted", tmp_path / "gradebook"
    attacks = {**_attacks(submissions, gradebook), **_bwrap_only_attacks(submissions, gradebook)}
    site = Path(sysconfig.get_paths()["purelib"])
    try:
        status, grades, solo, csv_text, seconds = _grade_hostile_class(tmp_path, "bwrap", attacks, monkeypatch)
    finally:
        planted = [path for path in (PACKAGE_DIR / "course" / f"{TOKEN}.py", site / f"{TOKEN}.pth") if path.exists()]
        for path in planted:
            path.unlink()
    assert planted == [], "the graded code wrote into the package or site-packages"
    assert status == 0
    _assert_verdicts(grades, solo, attacks, "bwrap", csv_text)
    for name in ("copies_classmate", "overwrites_classmate", "writes_package", "writes_gradebook"):
        assert "No such file" in " ".join(grades[name]["errors"]) or \
            "Read-only file system" in " ".join(grades[name]["errors"]), (name, grades[name]["errors"])
    print(f"graded {len(grades)} notebooks in {seconds:.1f} s")


@pytest.mark.slow
def test_rlimit_fallback_stops_what_it_can(tmp_path: Path, monkeypatch) -> None:
    attacks = _attacks(tmp_path / "submitted", tmp_path / "gradebook")
    status, grades, solo, csv_text, _ = _grade_hostile_class(tmp_path, "rlimit", attacks, monkeypatch)
    assert status == 0
    _assert_verdicts(grades, solo, attacks, "rlimit", csv_text)


@pytest.mark.parametrize("kind", ["bwrap", "rlimit", "none"])
def test_honest_notebooks_get_their_solo_grades_in_every_sandbox(tmp_path: Path, kind: str) -> None:
    if kind == "bwrap" and not sandbox.bwrap_status()[0]:
        pytest.skip(sandbox.bwrap_status()[1])
    reference = tmp_path / "alice.ipynb"
    nbformat.write(_notebook("", reference=True), reference)
    report = sandbox.grade_isolated(ROOT, MODULE, reference, kind)
    assert report.sandbox == kind and not report.errors
    assert report.earned == report.possible == grading.grade(MODULE, ROOT, reference).possible > 0


def test_a_forged_report_and_an_early_exit_earn_nothing(tmp_path: Path) -> None:
    attacks = _attacks(tmp_path, tmp_path / "book")
    for name in ("forged_report", "patched_grader"):
        path = tmp_path / f"{name}.ipynb"
        nbformat.write(_notebook(*attacks[name]), path)
        report = sandbox.grade_isolated(ROOT, MODULE, path, "auto")
        assert report.earned == 0 and report.errors, (name, report.earned)


def test_grade_of_someone_elses_notebook_runs_in_a_sandbox(tmp_path: Path, capsys) -> None:
    path = tmp_path / "forged.ipynb"
    nbformat.write(_notebook(*_attacks(tmp_path, tmp_path / "book")["forged_report"]), path)
    assert main(["grade", "03", "--notebook", str(path), "--json", "--root", str(ROOT)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["earned"] == 0 and report["sandbox"] in ("bwrap", "rlimit") and report["errors"]


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="Limits.memory must be > 0, got 0"):
        sandbox.Limits(memory=0)
    with pytest.raises(ValueError, match="sandbox must be one of auto, bwrap, rlimit, none, got 'docker'"):
        sandbox.resolve_sandbox("docker")


def test_clean_cuts_messages_and_drops_control_characters() -> None:
    assert sandbox.clean("a\x1b[31mb\tc\n") == "a[31mb\tc\n"
    assert sandbox.clean("x" * 600) == "x" * 475 + "... (125 more characters)"  # 500 characters, the note included
    assert classroom._cell("=1+1") == "'=1+1" and classroom._cell("@SUM(A1)") == "'@SUM(A1)"
    assert classroom._cell("plain") == "plain" and classroom._cell(3) == 3


def test_a_class_folder_given_relative_to_the_working_folder(tmp_path: Path, monkeypatch) -> None:
    """The submissions folder is read where the instructor is, not in the project root."""
    (tmp_path / "submitted").mkdir()
    nbformat.write(_notebook("", reference=True), tmp_path / "submitted" / "alice.ipynb")
    monkeypatch.chdir(tmp_path)
    assert main(["grade-class", "03", "submitted", "--out", "book", "--root", str(ROOT)]) == 0
    (grade,) = json.loads((tmp_path / "book.json").read_text())
    assert grade["earned"] == grade["possible"] > 0, grade["errors"]
