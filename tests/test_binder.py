"""The Binder setup (``binder/``) and the README badge that opens it.

The full check — a fresh virtual environment with only ``binder/requirements.txt``
installed and ``postBuild`` run imports tinytrain, executes notebook 01 and grades
it — needs PyPI and 1-3 minutes: it is ``binder/check.sh``, which CI runs; here it
runs only with ``TINYTRAIN_BINDER_CHECK=1``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
BADGE = "https://mybinder.org/v2/gh/tinytrain-org/tinytrain/HEAD?urlpath=lab/tree/notebooks"


def _requirement_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_requirements_cover_the_notebooks_extra() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("reading pyproject.toml needs tomllib")
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    required = _requirement_names(extras["notebooks"]) | {"numpy", "ml-dtypes", "pytest", "ipywidgets"}
    listed = _requirement_names((BINDER / "requirements.txt").read_text().splitlines())
    assert required <= listed, f"binder/requirements.txt lacks {sorted(required - listed)}"


def test_runtime_and_post_build() -> None:
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK), "postBuild must be executable"
    text = post_build.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    assert re.search(r"pip install .*-e \.", text), "postBuild installs tinytrain from the checkout"
    assert os.access(BINDER / "check.sh", os.X_OK)


def test_readme_badge_opens_the_notebooks_in_jupyterlab() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"]({BADGE})" in readme and "https://mybinder.org/badge_logo.svg" in readme


@pytest.mark.skipif(os.environ.get("TINYTRAIN_BINDER_CHECK") != "1",
                    reason="needs PyPI and minutes: set TINYTRAIN_BINDER_CHECK=1 (CI runs binder/check.sh)")
def test_fresh_environment_runs_notebook_01() -> None:
    result = subprocess.run(["bash", str(BINDER / "check.sh")], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "binder check OK" in result.stdout
