"""``tinytrain export`` and ``tinytrain reset``: a notebook's code into the package, and back out.

Export writes each of the module's library files from the notebook's export cells
(with the imports between them restored, and the functions that the reference marks
as the student's marked the same way), after checking in a fresh interpreter
that the package still imports with them; it keeps the replaced files as a
backup. Reset puts the reference back, from that backup or from the module source.
"""
from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tinytrain.course import markers
from tinytrain.course.files import write_atomic
from tinytrain.course.grading import NOTEBOOK_ENV
from tinytrain.course.imports import sibling_imports
from tinytrain.course.inventory import (
    BUILD_HEADER, BACKUP_DIR, EXPORT_HEADER, PACKAGE_DIR, UnknownModule, dotted, installed_modules, module_targets,
    reference_backup, target_path,
)
from tinytrain.course.notebooks import ExportCell, NotebookError, compile_cells, notebook_module, read_export_cells

# What the build leaves where an export cell imported from its own module's targets.
_OWN_IMPORT = re.compile(r"^# \(names from (tinytrain(?:\.\w+)+) are defined above in this notebook\)$")


@dataclass
class ExportResult:
    module: str
    written: list[Path]
    backups: Path
    warnings: list[str]


def export_texts(notebook: Path, module: str, package: Path = PACKAGE_DIR) -> tuple[dict[str, str], list[str]]:
    """The library file text of each of ``module``'s targets from the notebook, and warnings."""
    texts, warnings, _ = _exported_files(notebook, module, package)
    return texts, warnings


# Where each line of an exported file came from: (cell, line in the cell), or None for lines export added.
LineOrigins = list[tuple[ExportCell, int] | None]


def _exported_files(notebook: Path, module: str,
                    package: Path) -> tuple[dict[str, str], list[str], dict[str, LineOrigins]]:
    """:func:`export_texts`, plus where each line of each file came from in the notebook."""
    cells = read_export_cells(notebook)
    belongs = notebook_module(notebook, cells, package)
    if belongs is not None and belongs != module:
        raise NotebookError(f"{notebook} is the notebook of module {belongs}, not {module}")
    compile_cells(notebook, cells)
    expected = module_targets(module, package)
    by_target: dict[str, list[ExportCell]] = {}
    for cell in cells:
        by_target.setdefault(cell.target, []).append(cell)
    missing = [target for target in expected if target not in by_target]
    foreign = [target for target in by_target if target not in expected]
    if missing or foreign:
        problems = []
        if missing:
            problems.append(f"has no export cells for {', '.join(missing)}")
        if foreign:
            problems.append(f"exports {', '.join(foreign)}, which module {module} does not own")
        raise NotebookError(f"{notebook} " + " and ".join(problems))
    joined = {target: _join_cells(group) for target, group in by_target.items()}
    needs, undefined = sibling_imports({target: code for target, (code, _) in joined.items()})
    warnings = [
        f"{target}: {', '.join(names)} {'is' if len(names) == 1 else 'are'} used but defined by no export cell "
        "(names from other cells of the notebook are not part of your library)"
        for target, names in undefined.items()
    ]
    header = EXPORT_HEADER.format(notebook=_display_path(notebook), module=module, number=module[:2])
    texts, origins = {}, {}
    for target, (code, lines) in joined.items():
        restored = _restore_imports(code, needs[target])
        added = restored.count("\n") - code.count("\n")  # imports that no cell held, put after the first imports
        position = _import_position(code)
        lines = lines[:position] + [None] * added + lines[position:]
        marked, marker_lines = markers.mark(restored, _students_functions(module, target, package), module[:2])
        for index in marker_lines:  # ascending: each index counts the marker lines above it
            lines.insert(index, None)
        texts[target] = f"{header}\n\n{marked}\n"
        origins[target] = [None, None] + lines
    return texts, warnings, origins


def _students_functions(module: str, target: str, package: Path) -> list[str]:
    """The functions of ``module``'s ``target`` that the package's reference marks as the student's:
    the reference file that an earlier export kept, else the file installed now."""
    for path in (reference_backup(module, target, package), target_path(target, package)):
        if path.is_file():
            return [function for _, function in markers.marked_functions(path.read_text(encoding="utf-8"))]
    return []


def _join_cells(cells: list[ExportCell]) -> tuple[str, LineOrigins]:
    """The cells' code, two blank lines apart and without blank lines at either end, and its line origins."""
    lines: list[str] = []
    origins: LineOrigins = []
    for cell in cells:
        source = cell.source.split("\n")
        start, end = 0, len(source)
        while start < end and not source[start]:
            start += 1
        while end > start and not source[end - 1]:
            end -= 1
        if lines:
            lines += ["", ""]
            origins += [None, None]
        lines += source[start:end]
        origins += [(cell, number + 1) for number in range(start, end)]
    return "\n".join(lines), origins


def _display_path(path: Path) -> str:
    """``path`` relative to the working directory when it is below it (headers stay short)."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def _restore_imports(code: str, needs: dict[str, list[str]]) -> str:
    """Turn the build's "(names from X are defined above)" comments back into imports."""
    lines = code.split("\n")
    placed = set()
    for index, line in enumerate(lines):
        match = _OWN_IMPORT.match(line.strip())
        if match is None:
            continue
        target = match[1].removeprefix("tinytrain.").replace(".", "/")
        indent = line[: len(line) - len(line.lstrip())]
        if target in needs:
            lines[index] = f"{indent}from {match[1]} import {', '.join(needs[target])}"
            placed.add(target)
        else:
            lines[index] = f"{indent}# (nothing from {match[1]} is used here)"
    rest = [target for target in needs if target not in placed]
    if rest:
        extra = [f"from {dotted(target)} import {', '.join(needs[target])}" for target in rest]
        lines[_import_position(code):_import_position(code)] = extra
    return "\n".join(lines)


def _import_position(code: str) -> int:
    """Index of the line after the first cell's docstring and top-level imports."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return 0
    position = 0
    for index, node in enumerate(body):
        is_docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant)
        if is_docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
            position = node.end_lineno or position
        else:
            break
    return position


def _backup_folder(module: str, package: Path) -> Path:
    return package / BACKUP_DIR / module


def export(notebook: Path, module: str, package: Path = PACKAGE_DIR) -> ExportResult:
    """Write the notebook's code for ``module`` into the package, keeping a backup.

    Refuses (:class:`NotebookError`, nothing written) when the code does not compile,
    or when the package with it does not import.
    """
    texts, warnings, origins = _exported_files(notebook, module, package)
    for target, text in texts.items():
        try:
            compile(text, str(target_path(target, package)), "exec", dont_inherit=True)
        except SyntaxError as error:
            raise NotebookError(f"the exported {target}.py would not compile (line {error.lineno}: {error.msg})") from None
    problem = import_check(texts, package)
    if problem:
        where = _origin_of_failure(problem, notebook, origins)
        raise NotebookError(f"with this code, the package does not import{where}:\n{problem}")
    backups = _backup_folder(module, package)
    (backups / "reference").mkdir(parents=True, exist_ok=True)
    (backups / "previous").mkdir(parents=True, exist_ok=True)
    (package / BACKUP_DIR / ".gitignore").write_text("*\n", encoding="utf-8")
    written = []
    for target, text in texts.items():
        path = target_path(target, package)
        reference = reference_backup(module, target, package)
        if path.exists():
            current = path.read_text(encoding="utf-8")
            if BUILD_HEADER.match(current):
                write_atomic(reference, current)
            write_atomic(backups / "previous" / reference.name, current)
        write_atomic(path, text)
        written.append(path)
    importlib.invalidate_caches()
    return ExportResult(module, written, backups, warnings)


def _origin_of_failure(traceback: str, notebook: Path, origins: dict[str, LineOrigins]) -> str:
    """", raised in <notebook> cell N, line L" for the last line of the exported code in ``traceback``."""
    found = ""
    for match in re.finditer(r'File "(?:[^"]*/)?tinytrain/([\w/]+)\.py", line (\d+)', traceback):
        lines = origins.get(match[1], [])
        line = int(match[2])
        if 0 < line <= len(lines) and lines[line - 1] is not None:
            cell, number = lines[line - 1]
            found = f", raised in {_display_path(notebook)} {cell.label}, line {number}"
    return found


def import_check(texts: dict[str, str], package: Path = PACKAGE_DIR, timeout: float = 120) -> str | None:
    """Whether the package imports with ``texts`` in place: None, or what went wrong.

    Runs in a fresh interpreter, on a copy of the package in a temporary folder.
    """
    with tempfile.TemporaryDirectory(prefix="tinytrain-export-") as temporary:
        copy = Path(temporary) / "tinytrain"
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", BACKUP_DIR))
        for target, text in texts.items():
            target_path(target, copy).write_text(text, encoding="utf-8")
        modules = [dotted(target) for target in texts]
        script = (
            "import importlib, tinytrain\n"
            f"for name in {modules!r} + list(getattr(tinytrain, '__all_modules__', ())):\n"
            "    importlib.import_module(name)\n"
            "for name in getattr(tinytrain, '__all__', ()):\n"
            "    getattr(tinytrain, name)\n"
        )
        environment = dict(os.environ, PYTHONPATH=temporary + os.pathsep + os.environ.get("PYTHONPATH", ""))
        environment.pop(NOTEBOOK_ENV, None)
        try:
            result = subprocess.run([sys.executable, "-c", script], cwd=temporary, env=environment,
                                    capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"importing took more than {timeout:.0f} s"
        if result.returncode == 0:
            return None
        return (result.stderr or result.stdout).strip().replace(temporary + os.sep, "")[-3000:]


def reset(module: str, root: Path | None = None, package: Path = PACKAGE_DIR) -> list[tuple[Path, str]]:
    """Put the reference code of ``module`` back; returns (file, how) for each file changed.

    First restores the backup that ``tinytrain export`` kept, then, when the project's
    ``modules/`` source is there, regenerates the files with :mod:`tinytrain.course.build`
    (which itself imports library code, so it runs only once the backups are back).
    """
    info = installed_modules(package).get(module)
    backups = _backup_folder(module, package) / "reference"
    targets = list(info.targets) if info else []
    if backups.is_dir():
        targets += [p.name.removesuffix(".py.orig").replace(".", "/") for p in sorted(backups.glob("*.py.orig"))]
    targets = list(dict.fromkeys(targets))
    if not targets:
        raise UnknownModule(f"the package has no files of module {module} and no backup of them")
    changed: dict[Path, str] = {}

    def put(target: str, text: str, how: str) -> None:
        path = target_path(target, package)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            write_atomic(path, text)
            changed[path] = how

    unrestored = []
    for target in targets:
        backup = reference_backup(module, target, package)
        if backup.is_file():
            put(target, backup.read_text(encoding="utf-8"), f"restored from {backup}")
        elif (info and info.targets.get(target, "reference") != "reference") or not target_path(target, package).exists():
            unrestored.append(target)
    source = Path(root) / "modules" / module / f"{module}.py" if root is not None else None
    if source is not None and source.is_file():
        importlib.invalidate_caches()
        try:
            from tinytrain.course import build

            parsed = build.load_module(source)
            for target in parsed.targets():
                put(target, build.library_file(parsed, target), f"regenerated from {parsed.source}")
                if target in unrestored:
                    unrestored.remove(target)
        except Exception as error:
            if unrestored:
                raise NotebookError(
                    f"cannot regenerate module {module} from {source}: tinytrain.course.build failed "
                    f"({type(error).__name__}: {error}); reset the other modules you exported first"
                ) from error
    if unrestored:
        raise NotebookError(
            f"cannot restore {', '.join(t + '.py' for t in unrestored)}: no backup in {backups} and no module "
            f"source modules/{module}/; reinstall tinytrain (pip install --force-reinstall tinytrain)"
        )
    importlib.invalidate_caches()
    return list(changed.items())
