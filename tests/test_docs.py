"""The project's documents: a README a user reads in one go, and no development history in any file.

The repository speaks of itself as it is; the history of how it got there (numbered
issues and work sessions) belongs in the git log, not in code, tests or documents.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 300
# Written as a pattern, not as an example, so that this file does not match it.
HISTORY = re.compile(r"(session|issue) [0-9]", re.IGNORECASE)


def history_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` for each line of ``text`` that names a numbered issue or session."""
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def tracked_files() -> list[Path]:
    """The files git tracks in this checkout (skips the test outside a git checkout)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout with git installed ({error})")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_history_lines_finds_numbered_issues_and_sessions_in_any_case() -> None:
    text = f"one\nas planned in Issue {21}\nthree\nleft open by SESSION {39}\nissues 4 and session-5\n"
    assert history_lines(text) == [(2, f"as planned in Issue {21}"), (4, f"left open by SESSION {39}")]


def test_no_tracked_file_names_a_numbered_issue_or_session() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():  # deleted in the working tree, or a submodule
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary: dataset archives
            continue
        found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                  for number, line in history_lines(data.decode("utf-8", errors="replace"))]
    assert not found, "development history belongs in the git log:\n" + "\n".join(found)


def test_the_readme_fits_a_user_reading_it_in_one_go() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}"


def test_ci_runs_the_readme_test_command() -> None:
    readme = README.read_text(encoding="utf-8")
    assert "pip install '.[milestones]' && python milestones/mlp.py\n" in readme
    assert "pip install -e '.[test]' && python -m pytest\n" in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "python -m pip install --quiet -e '.[test]'" in ci and "python -m pytest" in ci, ci
