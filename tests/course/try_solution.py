"""Try one module's independent student solution the way a student would.

    python tests/course/try_solution.py 03

Fills ``notebooks/03_*.ipynb`` with ``tests/course/solutions/03_*.py``, runs the
filled notebook top to bottom in a headless kernel (its inline checks run on the
solution), then grades it with ``tinytrain grade 03 --notebook``. Changes nothing
in the project: the filled notebook and anything it writes stay in a temporary folder.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

from tinytrain.course.solutions import fill, solution_bodies

ROOT = Path(__file__).resolve().parents[2]


def main(spec: str) -> int:
    notebooks = sorted((ROOT / "notebooks").glob(f"{spec.zfill(2)[:2]}_*.ipynb"))
    if len(notebooks) != 1:
        raise SystemExit(f"no notebook for module {spec}")
    module = notebooks[0].stem
    folder = Path(tempfile.mkdtemp(prefix=f"student-{module}-"))
    notebook = fill(nbformat.read(notebooks[0], as_version=4),
                    solution_bodies(ROOT / "tests" / "course" / "solutions" / f"{module}.py"))
    path = folder / f"{module}.ipynb"
    nbformat.write(notebook, path)
    print(f"filled notebook: {path}")
    try:
        nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(folder)}}).execute()
        print("the notebook runs top to bottom: every inline check passes")
        ran = True
    except nbclient.exceptions.CellExecutionError as error:
        print(f"the notebook stops with an error:\n{str(error)[-3000:]}")
        ran = False
    graded = subprocess.run([sys.executable, "-m", "tinytrain", "grade", module[:2], "--notebook", str(path)],
                            cwd=ROOT).returncode == 0
    return 0 if ran and graded else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
