"""Reading a student notebook: its ``export`` cells, compiled under names that tracebacks show.

A syntax error or a cell that cannot be used raises :class:`NotebookError` naming
the notebook, the cell (numbered as Jupyter shows it) and the line.
"""
from __future__ import annotations

import json
import linecache
import os
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tinytrain.course.imports import bound_names
from tinytrain.course.inventory import PACKAGE_DIR, installed_modules

# The stub the build puts in place of a solution region.
STUB = re.compile(r'raise NotImplementedError\("(\w+): your code here"\)')

class NotebookError(Exception):
    """A notebook the grader cannot use: missing, malformed, a syntax error in a cell, ..."""


@dataclass(frozen=True)
class ExportCell:
    """One ``export`` code cell of a notebook."""

    target: str
    source: str
    number: int  # 1-based position among all the notebook's cells
    cell_id: str

    @property
    def label(self) -> str:
        return _label(self.number, self.cell_id)


def _label(number: int, cell_id: str) -> str:
    return f"cell {number} (id {cell_id})" if cell_id else f"cell {number}"


def read_export_cells(notebook: str | os.PathLike) -> list[ExportCell]:
    """The ``export`` cells of a notebook file, in order; :class:`NotebookError` when unusable."""
    path = Path(notebook)
    found = []
    for number, cell, source in _code_cells(path):
        target = (cell.get("metadata") or {}).get("export")
        if not target:
            continue
        if not isinstance(target, str) or not all(part.isidentifier() for part in target.split("/")):
            raise NotebookError(f"{path}: cell {number} has a malformed export target {target!r}")
        found.append(ExportCell(target, source, number, str(cell.get("id", ""))))
    return found


def defined_outside_export_cells(notebook: str | os.PathLike, name: str) -> str | None:
    """The first code cell that is not an export cell and binds ``name`` (defines, assigns or
    imports it), as ``cell N (id ...)``; None if there is none.

    The student ran that cell in Jupyter, so ``name`` works there; the grader and the library
    see only export cells, where it is undefined.
    """
    for number, cell, source in _code_cells(Path(notebook)):
        if (cell.get("metadata") or {}).get("export"):
            continue
        try:
            if name in bound_names(source):
                return _label(number, str(cell.get("id", "")))
        except SyntaxError:  # IPython's %magics and !commands are not Python
            continue
    return None


def _code_cells(path: Path) -> list[tuple[int, dict, str]]:
    """``(number, cell, source)`` of every code cell, numbered among all cells from 1."""
    if path.is_dir():
        raise NotebookError(f"{path} is a folder; name the notebook file (e.g. {path / '01_tensor.ipynb'})")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotebookError(f"notebook {path} does not exist") from None
    except OSError as error:
        raise NotebookError(f"cannot read notebook {path}: {error}") from None
    try:
        data = json.loads(text)
        cells = data["cells"]
        if not isinstance(cells, list):
            raise TypeError("'cells' is not a list")
    except (ValueError, KeyError, TypeError) as error:
        raise NotebookError(f"{path} is not a Jupyter notebook (.ipynb JSON): {error}") from None
    found = []
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        found.append((number, cell, "".join(source) if isinstance(source, list) else source))
    return found


def compiled_name(notebook: Path, cell: ExportCell) -> str:
    """The name a cell's code is compiled under (shown in tracebacks)."""
    return f"<{notebook.name} {cell.label}>"


def compile_cells(notebook: Path, cells: Sequence[ExportCell]) -> list[types.CodeType]:
    """Compile each export cell; a syntax error names the notebook, the cell and the line."""
    codes = []
    for cell in cells:
        filename = compiled_name(notebook, cell)
        try:
            code = compile(cell.source, filename, "exec", dont_inherit=True)
        except SyntaxError as error:
            raise NotebookError(_syntax_message(notebook, cell, error)) from None
        # Tracebacks through the student's code show its lines.
        lines = cell.source.splitlines(keepends=True)
        linecache.cache[filename] = (len(cell.source), None, lines, filename)
        codes.append(code)
    return codes


def _syntax_message(notebook: Path, cell: ExportCell, error: SyntaxError) -> str:
    line = error.lineno or 1
    text = cell.source.splitlines()[line - 1] if 0 < line <= len(cell.source.splitlines()) else ""
    message = f"{notebook}: {cell.label}, line {line}: {type(error).__name__}: {error.msg}"
    if text.strip():
        message += f"\n    {text.strip()}"
    if text.lstrip().startswith(("%", "!")):
        message += "\n    (IPython magics and shell commands cannot be in a cell that exports library code)"
    return message


def notebook_module(notebook: Path, cells: Sequence[ExportCell], package: Path = PACKAGE_DIR) -> str | None:
    """The module a notebook belongs to: from its export targets, else its cell ids or file name."""
    owners = {target: name for name, info in installed_modules(package).items() for target in info.targets}
    found = {owners[cell.target] for cell in cells if cell.target in owners}
    if len(found) == 1:
        return found.pop()
    if len(found) > 1:
        raise NotebookError(f"{notebook} exports targets of several modules ({', '.join(sorted(found))})")
    for cell in cells:
        match = re.match(r"^(\d\d_\w+?)-\d+$", cell.cell_id)
        if match:
            return match[1]
    match = re.match(r"^(\d\d_\w+)$", notebook.stem)
    return match[1] if match else None


def find_notebook(path: str | os.PathLike, module: str) -> Path:
    """``path`` itself, or, for a folder, the module's notebook ``NN_name.ipynb`` in it."""
    path = Path(path)
    if path.is_dir():
        candidate = path / f"{module}.ipynb"
        if not candidate.is_file():
            raise NotebookError(f"no notebook {candidate.name} in {path}")
        return candidate
    return path


def stubs_in(code: str) -> list[str]:
    """The functions whose unfilled stub (``raise NotImplementedError("f: your code here")``) ``code`` holds."""
    return list(dict.fromkeys(STUB.findall(code)))


def stubbed_functions(notebook: Path) -> list[str]:
    """Functions whose export cells still hold the unfilled stub."""
    return stubs_in("\n".join(cell.source for cell in read_export_cells(notebook)))
