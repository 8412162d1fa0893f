"""Every module's reference notebook runs top to bottom in a headless kernel.

The reference notebook is the student notebook with the solutions kept, built
in memory from ``modules/NN_name/NN_name.py``; its inline checks run with it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

build = pytest.importorskip("tinytrain.course.build")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "modules").glob("[0-9][0-9]_*/[0-9][0-9]_*.py"))


@pytest.mark.parametrize("source", SOURCES, ids=[path.stem for path in SOURCES])
def test_reference_notebook_executes(source: Path, tmp_path: Path) -> None:
    notebook = build.reference_notebook(source)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    assert any("check" in cell.metadata for cell in notebook.cells), f"{source.name} has no inline check cells"
