"""Which functions of the library are the student's: one comment line above each.

Every function or method that holds a solution region (the body a student writes
in place of a stub) carries, in its library file, one comment line -- ``#``, then
``student: Module NN`` -- directly above its definition block (above its decorators,
if any). ``tinytrain build`` writes it into the reference, ``tinytrain export`` into
a student's code, so that a grep for that comment over ``tinytrain/`` lists exactly
the functions the student writes, whoever's code the package holds. The notebooks
do not carry it: there, the stubs say which functions are the student's.

Functions are named as :func:`tinytrain.course.solutions.definitions` names them
(``relu``, ``Sigmoid.backward``).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Collection

from tinytrain.course.solutions import definitions, solution_regions

# Spelled in two pieces, so that the grep for the comment finds the library's functions and not this file.
_WORD = "student"
_MARKER_LINE = re.compile(r"^[ \t]*# " + _WORD + r": Module (\d\d)[ \t]*$")


def marker(number: str) -> str:
    """The comment line that marks a function of module ``number`` (``"03"``) as the student's."""
    return f"# {_WORD}: Module {number}"


def solution_functions(source: str) -> list[str]:
    """The functions of ``source`` (code with its ``### BEGIN/END SOLUTION`` lines) that hold a
    solution region, in order; a region outside every function marks nothing."""
    return [name for name, _, _ in solution_regions(source) if name is not None]


def _block_starts(tree: ast.AST) -> dict[int, str]:
    """0-based index of the first line of each function's definition block (its first decorator,
    else its ``def``) -> the function's qualified name."""
    return {min([node.lineno] + [decorator.lineno for decorator in node.decorator_list]) - 1: name
            for name, node in definitions(tree)}


def mark(code: str, functions: Collection[str], number: str) -> tuple[str, list[int]]:
    """``code`` with the marker of module ``number`` above each definition of the named
    ``functions`` that has none yet, and the 0-based indices of the lines it added (in the
    returned text, ascending). Code that does not parse comes back unchanged: whoever
    compiles it reports the error."""
    try:
        starts = _block_starts(ast.parse(code))
    except SyntaxError:
        return code, []
    lines: list[str] = []
    added = []
    for index, line in enumerate(code.split("\n")):
        if starts.get(index) in functions and not (lines and _MARKER_LINE.match(lines[-1])):
            added.append(len(lines))
            lines.append(line[: len(line) - len(line.lstrip())] + marker(number))
        lines.append(line)
    return "\n".join(lines), added


def marked_functions(code: str) -> list[tuple[str, str]]:
    """``(module number, function)`` for each marker in ``code`` that sits directly above a
    definition block, in order; [] for code that does not parse."""
    try:
        starts = _block_starts(ast.parse(code))
    except SyntaxError:
        return []
    found = []
    for index, line in enumerate(code.split("\n")):
        match = _MARKER_LINE.match(line)
        if match and index + 1 in starts:
            found.append((match[1], starts[index + 1]))
    return found
