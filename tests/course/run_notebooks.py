"""Run notebooks top to bottom in headless kernels, a few at a time.

    python tests/course/run_notebooks.py [--jobs N] NOTEBOOK...

Each notebook runs in a folder of its own beside it (``NN_name.ipynb`` in
``NN_name-run/``), so the files a lesson writes stay apart. The kernels inherit
this process's environment (``PYTHONPATH`` picks the tinytrain they import).
Prints one line per notebook and the end of each failure; exit status 1 when
any notebook fails.
"""
import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbclient
import nbformat


def run(path: Path) -> tuple[float, str | None]:
    """(seconds, None) when the notebook runs to the end, else (seconds, the error's last lines)."""
    folder = path.with_name(f"{path.stem}-run")
    folder.mkdir(exist_ok=True)
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    try:
        nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(folder)}}).execute()
    except nbclient.exceptions.CellExecutionError as error:
        return time.perf_counter() - start, str(error)[-3000:]
    return time.perf_counter() - start, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--jobs", type=int, default=2, help="notebooks at a time (default 2)")
    args = parser.parse_args(argv)
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(run, args.notebooks))
    for path, (seconds, error) in zip(args.notebooks, outcomes):
        print(f"{'ran   ' if error is None else 'FAILED'} {path.name} ({seconds:.1f} s)")
        if error is not None:
            print(error)
    return 0 if all(error is None for _, error in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
