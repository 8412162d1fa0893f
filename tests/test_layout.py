"""The package's layout: the folder tells the kind of code, and no file imports another back.

* ``tinytrain/*.py`` and ``tinytrain/nn/*.py`` are the library the modules generate
  (the student's code); only the package files that name the public API
  (``__init__``, ``__main__``, ``nn/__init__``, ``nn/functional``) are written by hand there.
* ``course/`` (tooling), ``testing/`` (test devices), ``datasets/``, ``runtime/``
  (process settings and state) and ``kernels/`` (fast paths that a reference
  solution hands work to) are hand-written; no module exports into them.
* No library file imports the tooling: only ``__main__``, the ``tinytrain`` command, starts it.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tinytrain
from tinytrain.course.inventory import installed_modules, target_path

PACKAGE = Path(tinytrain.__file__).resolve().parent
LIBRARY_FOLDERS = {PACKAGE, PACKAGE / "nn"}
HAND_WRITTEN_IN_LIBRARY = {"__init__.py", "__main__.py", "nn/__init__.py", "nn/functional.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_files() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in path.parts}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (module level or inside functions).

    ``from tinytrain import autograd`` is an import of ``tinytrain.autograd``. Importing
    a module always loads its parent packages first, so those edges are left out.
    """
    files = _package_files()
    graph = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
                submodules = {f"{base}.{alias.name}" for alias in node.names} & set(files)
                found |= submodules or {base}
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {other for other in found if other in files and other != name and other not in parents}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_import_circle_among_the_package_files() -> None:
    graph = import_graph()
    assert "tinytrain.backend" in graph and "tinytrain.course.cli" in graph
    assert "tinytrain.autograd" in graph["tinytrain.tensor"]  # `from tinytrain import autograd` counts
    assert circles(graph) == []


def test_no_library_file_imports_the_course_tooling() -> None:
    """The library stands on its own (pip users never need the tooling); only ``python -m tinytrain``,
    the command itself, starts the tooling."""
    graph = import_graph()
    tooling = {name for name in graph if name == "tinytrain.course" or name.startswith("tinytrain.course.")}
    assert graph["tinytrain.__main__"] & tooling == {"tinytrain.course.cli"}  # the graph sees such imports
    importing = {name: sorted(graph[name] & tooling) for name in graph
                 if name not in tooling and name != "tinytrain.__main__" and graph[name] & tooling}
    assert importing == {}


def test_generated_files_are_exactly_the_library_folders_files() -> None:
    """A module's file (the reference, or a student's export) says so in its first line."""
    modules_files = {target_path(target) for info in installed_modules().values() for target in info.targets}
    assert PACKAGE / "tensor.py" in modules_files and PACKAGE / "nn" / "conv.py" in modules_files
    misplaced = []
    for path in _package_files().values():
        relative = path.relative_to(PACKAGE).as_posix()
        generated = path in modules_files
        belongs = path.parent in LIBRARY_FOLDERS and relative not in HAND_WRITTEN_IN_LIBRARY
        if generated != belongs:
            misplaced.append(f"{relative}: {'module file' if generated else 'hand-written'}")
    assert misplaced == [], "module files belong in tinytrain/ and tinytrain/nn/, hand-written ones in subpackages"


def test_the_command_starts_without_the_library() -> None:
    """`tinytrain reset` must run when a student's exported module does not import."""
    code = "import sys, tinytrain.course.cli; print(sorted(m for m in sys.modules if m.startswith('tinytrain.')))"
    loaded = eval(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    library = [name for name in loaded if not name.startswith(("tinytrain.course", "tinytrain.runtime"))]
    assert library == []
