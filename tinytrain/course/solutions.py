"""Solutions as code: fill a student notebook's stubs from a solutions file.

A solutions file (the course test keeps independent students' ones in
``tests/course/solutions/NN_name.py``) holds, for every function
the module's notebook leaves as a stub, a definition with that function's name
(methods inside a ``class`` block of their class's name) whose body is what the
student typed in place of the stub::

    def relu(x):
        return x.relu()

    class Sigmoid:
        def backward(self, grad):
            return (grad * self.out * (1 - self.out),)

A body replaces exactly the stub (``# YOUR CODE HERE`` and its ``raise
NotImplementedError``), so it may use the names the given code around the stub
defines, and define helper functions of its own; a docstring on it is dropped
(the notebook keeps its own). Every stub
needs a solution and every solution a stub, or :class:`FillError` says which.

:func:`reference_bodies` reads the same from a module source's solution regions,
so the reference itself, or a changed copy of it, can be filled in the same way.

    python -m tinytrain.course.solutions notebooks/03_activations.ipynb FILE.py [--out DIR]
"""
from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
import tempfile
from pathlib import Path

import nbformat

_STUB = re.compile(r'^(\s*)raise NotImplementedError\("(\w+): your code here"\)\s*$')
_MARKER = "# YOUR CODE HERE"


class FillError(Exception):
    """A stub without a solution, a solution without a stub, or a solution that does not parse."""


def definitions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of ``tree`` that is not inside another function, with its qualified name
    (``relu``, ``Sigmoid.backward``). A function defined inside one is part of its body."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _dedent(lines: list[str]) -> str:
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)


def solution_bodies(path: Path) -> dict[str, str]:
    """Qualified name (``Sigmoid.backward``) -> the body's source, dedented, without a docstring."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as error:
        raise FillError(f"{path}:{error.lineno}: {error.msg}") from None
    lines = text.splitlines()
    bodies: dict[str, str] = {}
    for name, node in definitions(tree):
        body = node.body
        if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]
        if name in bodies:
            raise FillError(f"{path}:{node.lineno}: a second solution for {name}")
        bodies[name] = _dedent(lines[body[0].lineno - 1: node.end_lineno])
    return bodies


def stubs(source: str) -> list[tuple[str, int]]:
    """(qualified name, line index of the ``raise``) of every stub in a cell's source."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    found = []
    for name, node in definitions(tree):
        for statement in ast.walk(node):
            if isinstance(statement, ast.Raise) and _STUB.match(lines[statement.lineno - 1]):
                found.append((name, statement.lineno - 1))
    return found


def fill(notebook: nbformat.NotebookNode, bodies: dict[str, str]) -> nbformat.NotebookNode:
    """A copy of ``notebook`` with each stub replaced by its solution body."""
    filled = copy.deepcopy(notebook)
    used = set()
    for cell in filled.cells:
        if cell.cell_type != "code":
            continue
        lines = cell.source.split("\n")
        for name, index in sorted(stubs(cell.source), key=lambda stub: -stub[1]):
            if name not in bodies:
                raise FillError(f"no solution for {name} (cell {cell.get('id')})")
            indent = _STUB.match(lines[index])[1]
            start = index - 1 if index and lines[index - 1].strip() == _MARKER else index
            lines[start: index + 1] = [indent + line if line else line for line in bodies[name].split("\n")]
            used.add(name)
        cell.source = "\n".join(lines)
    unused = sorted(set(bodies) - used)
    if unused:
        raise FillError(f"solutions for functions the notebook does not stub: {', '.join(unused)}")
    return filled


def solution_regions(text: str, filename: str = "<source>") -> list[tuple[str | None, int, int]]:
    """Every solution region of ``text`` (a module source, or one of its cells), in order, as
    ``(function, begin, end)``: the qualified name of the function that holds it (None for a
    region outside every function) and the 1-based lines of its ``### BEGIN SOLUTION`` and
    ``### END SOLUTION``."""
    functions = [(node.lineno, node.end_lineno, name) for name, node in definitions(ast.parse(text, filename))]
    regions: list[tuple[str | None, int, int]] = []
    begin = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() == "### BEGIN SOLUTION":
            begin = number
        elif line.strip() == "### END SOLUTION" and begin is not None:
            holders = [name for first, last, name in functions if first < begin <= last]
            regions.append((holders[0] if holders else None, begin, number))  # definitions never nest
            begin = None
    return regions


def reference_bodies(source: Path) -> dict[str, str]:
    """The solution regions of a module source (``modules/NN_name/NN_name.py``), by qualified name."""
    text = Path(source).read_text(encoding="utf-8")
    lines = text.splitlines()
    bodies: dict[str, str] = {}
    for name, begin, end in solution_regions(text, str(source)):
        if name is None:
            raise FillError(f"{source}:{begin}: a solution region outside every function")
        if name in bodies:
            raise FillError(f"{source}:{begin}: a second solution region in {name}")
        bodies[name] = _dedent(lines[begin: end - 1])
    return bodies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinytrain.course.solutions", description=__doc__.split("\n")[0])
    parser.add_argument("notebook", type=Path, help="the student notebook, e.g. notebooks/03_activations.ipynb")
    parser.add_argument("solutions", type=Path, help="the solutions file")
    parser.add_argument("--out", type=Path, default=None, help="folder for the filled notebook (default: a new temporary one)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tinytrain-filled-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        notebook = fill(nbformat.read(args.notebook, as_version=4), solution_bodies(args.solutions))
    except FillError as error:
        print(f"{args.notebook.name}: {error}", file=sys.stderr)
        return 1
    path = out / args.notebook.name
    nbformat.write(notebook, path)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
