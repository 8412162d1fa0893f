"""Which of a student's exported modules broke something, so that every failure names its cause.

A student's exported code is used by every later module, the milestones and the
checks. When it is unfinished (stubs left) or wrong, the failure surfaces in
*other* code: the CNN milestone stops inside ``Conv2d`` because ``relu`` raises.
:func:`exported_stubs` finds the stubs an export left behind; :func:`blame` finds
the student's exported file that an exception's traceback ran through, so the
message can say "your module 03, ``relu``: reset it with ``tinytrain reset 03``".
"""
from __future__ import annotations

import ast
import functools
import traceback
from dataclasses import dataclass
from pathlib import Path

from tinytrain.course.inventory import PACKAGE_DIR, installed_modules, reference_backup, target_path
from tinytrain.course.notebooks import stubs_in


def exported_stubs(package: Path = PACKAGE_DIR) -> dict[str, list[str]]:
    """Module -> the functions its exported (student) files still leave as stubs."""
    found: dict[str, list[str]] = {}
    for name, info in installed_modules(package).items():
        for target in info.exported:
            stubs = stubs_in(target_path(target, package).read_text(encoding="utf-8", errors="replace"))
            if stubs:
                found[name] = list(dict.fromkeys(found.get(name, []) + stubs))
    return found


def exported_note(failure: str, besides: str | None = None, package: Path = PACKAGE_DIR) -> str | None:
    """For a ``failure`` no traceback can pin on a module (a wrong value, not an exception): which
    modules' exported code the package holds (but ``besides``), and how to check them; None if none."""
    modules = sorted(name for name, info in installed_modules(package).items() if info.exported and name != besides)
    if not modules:
        return None
    return (f"the package holds your exported code of {', '.join(modules)}: {failure} may come from a wrong result "
            "there; `tinytrain status` runs each module's graded checks on it")


def reset_advice(module: str) -> str:
    return f"`tinytrain reset {module[:2]}` puts the reference back (then fix your notebook and export it again)"


@dataclass(frozen=True)
class Blame:
    """The innermost place where a traceback ran a student's exported code."""

    module: str  # e.g. "03_activations"
    path: Path
    line: int
    function: str

    def __str__(self) -> str:
        return (f"your exported code of module {self.module} ({self.path.name}, line {self.line}, "
                f"in {self.function})")


def blame(error: BaseException | None, package: Path = PACKAGE_DIR) -> Blame | None:
    """The student's exported code that ``error`` (or the error it was raised from) comes from.

    Where the error was raised decides. Raised by the package's reference code (code
    identical to the reference, exported or not) it is one of the package's own checks
    reporting somebody's mistake -- the optimizer refusing a gradient of the wrong shape --
    and the traceback cannot say whose: no blame. Raised elsewhere (NumPy refusing an
    argument, a stub's ``NotImplementedError``), it is blamed on the innermost function of
    a student's exported file that differs from the reference. A ``SyntaxError`` in an
    exported file is blamed on that file.
    """
    owners = {target_path(target, package).resolve(): (name, target)
              for name, info in installed_modules(package).items() for target in info.exported}
    if not owners:
        return None
    package = package.resolve()
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, SyntaxError) and error.filename:  # an exported file that does not compile
            owner = owners.get(Path(error.filename).resolve())
            if owner is not None:
                return Blame(owner[0], Path(error.filename), error.lineno or 0, "<module>")
        frames = [(Path(frame.f_code.co_filename).resolve(), line, frame.f_code.co_name)
                  for frame, line in traceback.walk_tb(error.__traceback__)]
        for depth, (path, line, function) in enumerate(reversed(frames)):
            if not path.is_relative_to(package):
                continue  # NumPy, the standard library, a test: whoever called it decides
            owner = owners.get(path)
            if owner is not None and _differs_from_reference(path, line, *owner, package):
                return Blame(owner[0], path, line, function)
            if depth == 0:
                break  # raised by the package's reference code itself
        error = error.__cause__ or error.__context__
    return None


def _differs_from_reference(path: Path, line: int, module: str, target: str, package: Path) -> bool:
    """Whether the function of exported file ``path`` around ``line`` is not the reference's own
    (module-level code, or no reference kept to compare with, counts as the student's)."""
    backup = reference_backup(module, target, package)
    if not backup.is_file():
        return True
    exported, reference = _functions(path, path.stat().st_mtime_ns), _functions(backup, backup.stat().st_mtime_ns)
    around = [(name, node) for name, node in exported.items() if node.lineno <= line <= node.end_lineno]
    if not around:
        return True
    name, node = max(around, key=lambda item: item[1].lineno)  # the innermost: it starts last
    return name not in reference or ast.dump(reference[name]) != ast.dump(node)


@functools.lru_cache(maxsize=64)  # one grade or status run asks about the same files for every failing check
def _functions(path: Path, mtime_ns: int) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function in ``path`` (as of ``mtime_ns``) by qualified name (``Sigmoid.backward``);
    {} if it does not parse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + child.name] = child
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found
