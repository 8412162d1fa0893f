#!/usr/bin/env bash
# Does the Binder setup work? In a fresh virtual environment: install only
# binder/requirements.txt, run binder/postBuild, then import tinytrain, execute the
# reference notebook of Module 01 headless (nbclient) and grade the student notebook
# of Module 01 (the unfilled one must earn 0 points). Needs network access to PyPI;
# takes 1-3 minutes. Usage: bash binder/check.sh   (PYTHON=python3.11 to choose)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/tinytrain-binder.XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"  # postBuild runs `python` from PATH, as on Binder
python -m pip install --quiet --disable-pip-version-check --upgrade pip
python -m pip install --quiet --disable-pip-version-check -r "$repo/binder/requirements.txt"
bash "$repo/binder/postBuild"
# The kernel must be this environment's Python, whatever kernels the machine has.
python -m ipykernel install --sys-prefix --name python3 > /dev/null
export JUPYTER_PATH="$work/venv/share/jupyter"
unset TINYTRAIN_STUDENT_NOTEBOOK PYTHONPATH

cd "$work"  # not the checkout: tinytrain must come from the installation
python - "$repo" <<'PY'
import json
import subprocess
import sys
from pathlib import Path

import nbclient

import tinytrain
from tinytrain.course import build

repo = Path(sys.argv[1])
assert Path(tinytrain.__file__).resolve().parent == repo / "tinytrain", tinytrain.__file__
print("imported", tinytrain.__file__, "- a tensor:", tinytrain.tensor([1.0, 2.0]))

notebook = build.reference_notebook(repo / "modules/01_tensor/01_tensor.py")
nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                        resources={"metadata": {"path": str(repo / "notebooks")}}).execute()
checks = sum("check" in cell.metadata for cell in notebook.cells)
print(f"executed the reference notebook of Module 01 ({len(notebook.cells)} cells, {checks} inline checks)")

result = subprocess.run(["tinytrain", "grade", "01", "--json"], cwd=repo / "notebooks",
                        capture_output=True, text=True)
report = json.loads(result.stdout)
assert result.returncode == 1 and report["earned"] == 0 and report["possible"] > 0, result
print(f"tinytrain grade 01 on the unfilled notebook: {report['earned']}/{report['possible']} points")
PY
echo "binder check OK"
