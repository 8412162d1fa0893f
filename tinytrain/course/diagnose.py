"""Which of a student's exported modules broke something, so that every failure names its cause.

A student's exported code is used by every later module, the milestones and the
checks. When it is unfinished (stubs left) or wrong, the failure surfaces in
*other* code: the CNN milestone stops inside ``Conv2d`` because ``relu`` raises.
:func:`exported_stubs` finds the stubs an export left behind; :func:`blame` finds
the student's exported file that an exception's traceback ran through, so the
message can say "your module 03, ``relu``: reset it with ``tinytrain reset 03``".
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tinytrain.course.inventory import PACKAGE_DIR, installed_modules, target_path
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
    """Where ``error`` (or the error it was raised from) last ran through a student's exported file."""
    owners = {target_path(target, package).resolve(): name
              for name, info in installed_modules(package).items() for target in info.exported}
    if not owners:
        return None
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = _innermost(error.__traceback__, owners)
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None


def _innermost(traceback: TracebackType | None, owners: dict[Path, str]) -> Blame | None:
    found = None
    while traceback is not None:
        code = traceback.tb_frame.f_code
        module = owners.get(Path(code.co_filename).resolve())
        if module is not None:
            found = Blame(module, Path(code.co_filename), traceback.tb_lineno, code.co_name)
        traceback = traceback.tb_next
    return found
