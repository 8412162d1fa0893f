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


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_a_saved_training_cell_holds_text_bars_not_widget_views(tmp_path: Path) -> None:
    """Notebook 09's training cell, run and saved: its progress bars are text, so the reopened notebook shows them
    (a widget view of a bar refers to a widget that died with the kernel: "Error displaying widget"), and the file
    stays small. JupyterLab folds a stream's carriage returns into the line they redraw as it saves; nbclient
    does the same with ``coalesce_streams``."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("tqdm")
    notebook = build.reference_notebook(ROOT / "modules" / "09_training" / "09_training.py")
    [training] = [number for number, cell in enumerate(notebook.cells) if "digits_trainer.fit(" in cell.source]
    notebook.cells = notebook.cells[: training + 1]
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", coalesce_streams=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    saved = tmp_path / "09_training.ipynb"
    nbformat.write(notebook, saved)
    outputs = nbformat.read(saved, as_version=4).cells[training].outputs
    assert [output for output in outputs if WIDGET_VIEW in output.get("data", {})] == []
    text = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    bars = [line for line in text.splitlines() if "|" in line]
    assert len(bars) == 1 and bars[0].startswith("training: 100%") and "20/20" in bars[0], text
    assert "\x1b" not in text, text  # no cursor-moving escape codes: a notebook prints them as lines of their own
    assert any("image/png" in output.get("data", {}) for output in outputs)  # the plot of the history
    cell_bytes = len(nbformat.writes(nbformat.v4.new_notebook(cells=[notebook.cells[training]])))
    assert cell_bytes < 120_000, cell_bytes  # the plot's PNG and a few lines of text
