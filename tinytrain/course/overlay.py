"""Laying a notebook's code over the package, so the graded checks run the student's code.

The ``student`` fixture of the graded checks is a :class:`StudentCode`: every
top-level name of one module's code, as attributes.

* Plain ``pytest``: it holds what is *installed* -- the package's files for the
  module's export targets (the reference, or the student's code after
  ``tinytrain export``).
* ``pytest --notebook PATH`` or ``TINYTRAIN_STUDENT_NOTEBOOK=PATH``: it holds the
  code of the notebook's ``export`` cells, run in-process (no kernel) as fresh
  module objects that are laid over the package for the duration of the test:
  registered in ``sys.modules`` as ``tinytrain.<target>`` so that the student's
  ``nn/layers`` code gets the student's own ``Module``; restored afterwards.
  ``PATH`` may also be a folder holding ``NN_name.ipynb`` notebooks.

**How a notebook's code becomes modules.** Export cells run in notebook order,
each in the module of its target (``export="nn/layers"`` -> ``tinytrain.nn.layers``).
In a notebook every cell shares one namespace, and the build replaced imports
from the module's *own* targets by a comment; so before each cell, the names
that the module's other targets have defined so far are made visible in the
cell's module (without replacing its own), and once more after the last cell.
``tinytrain export`` turns those comments back into explicit imports.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinytrain.course.inventory import PACKAGE_DIR, dotted, module_targets, target_path
from tinytrain.course.notebooks import (
    ExportCell, NotebookError, compile_cells, compiled_name, defined_outside_export_cells, notebook_module,
    read_export_cells,
)

class StudentCode:
    """The top-level names of one module's code, as attributes (``student.relu``).

    ``_tt_module`` is the module name, ``_tt_origin`` ``"installed"`` or the notebook,
    ``_tt_modules`` maps each export target to its module object.
    """

    def __init__(self, module: str, modules: dict[str, types.ModuleType], origin: str) -> None:
        self._tt_module = module
        self._tt_origin = origin
        self._tt_modules = modules
        chosen: dict[str, tuple[Any, bool]] = {}  # name -> (value, defined in its own module)
        for mod in modules.values():
            for name, value in vars(mod).items():
                if name.startswith("__") and name.endswith("__"):
                    continue
                own = getattr(value, "__module__", None) == mod.__name__
                if name not in chosen or (own and not chosen[name][1]):
                    chosen[name] = (value, own)
        self.__dict__.update({name: value for name, (value, _) in chosen.items()})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_tt_"):
            raise AttributeError(name)
        installed = self._tt_origin == "installed"
        cell = None if installed else defined_outside_export_cells(self._tt_origin, name)
        if cell is not None:
            raise AttributeError(f"{cell} of {self._tt_origin} defines {name!r}, but it is not an export cell (its "
                                 "metadata lost export=...): the grader and your library run only export cells")
        where = "the installed package" if installed else self._tt_origin
        raise AttributeError(f"module {self._tt_module}'s export cells define no {name!r} (in {where}); "
                             "was it deleted or renamed?")

    def __repr__(self) -> str:
        return f"<StudentCode of {self._tt_module} from {self._tt_origin}: {', '.join(self._tt_modules)}>"


def installed_code(module: str, package: Path = PACKAGE_DIR) -> StudentCode:
    """``module``'s names from the installed package (the reference, or exported code)."""
    modules = {target: importlib.import_module(dotted(target)) for target in module_targets(module, package)}
    return StudentCode(module, modules, "installed")


def _preload_package() -> None:
    """Import the package as installed (best effort), so nothing of it is first imported under
    the overlay, where it would bind the student's objects and outlive the test."""
    package = importlib.import_module("tinytrain")
    for name in ("tinytrain.testing.strict", *getattr(package, "__all_modules__", ())):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


@contextlib.contextmanager
def overlay(notebook: str | os.PathLike, module: str | None = None, package: Path = PACKAGE_DIR) -> Iterator[StudentCode]:
    """Run the notebook's export cells as fresh modules laid over the package; restore on exit.

    Raises :class:`NotebookError` naming the cell and line when a cell does not compile
    or raises while it runs, and when the notebook belongs to another module.
    """
    notebook = Path(notebook)
    cells = read_export_cells(notebook)
    belongs = notebook_module(notebook, cells, package)
    if module is not None and belongs is not None and belongs != module:
        raise NotebookError(f"{notebook} is the notebook of module {belongs}, not {module}")
    module = module or belongs
    if module is None:
        raise NotebookError(f"{notebook}: cannot tell which module it belongs to (it has no export cells)")
    if not cells:
        raise NotebookError(f"{notebook} has no export cells (cells whose metadata says export=...)")
    codes = compile_cells(notebook, cells)
    _preload_package()

    targets = list(dict.fromkeys(cell.target for cell in cells))
    saved_modules = {name: sys.modules.get(name) for name in sys.modules if name.split(".")[0] == "tinytrain"}
    packages = {name: mod for name, mod in saved_modules.items() if hasattr(mod, "__path__")}
    saved_dicts = {name: dict(vars(mod)) for name, mod in packages.items()}
    fresh: dict[str, types.ModuleType] = {}
    try:
        for target in targets:
            name = dotted(target)
            mod = types.ModuleType(name, f"module {module}'s code from {notebook}")
            mod.__file__ = str(target_path(target, package))
            mod.__package__ = name.rpartition(".")[0]
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=str(notebook))
            fresh[target] = mod
            sys.modules[name] = mod
            parent = sys.modules.get(mod.__package__)
            leaf = name.rpartition(".")[2]
            old = saved_modules.get(name)
            # Bind the attribute the import system would bind, unless the package deliberately
            # binds another object under that name (``tinytrain.tensor`` is the factory function).
            if parent is not None and (not hasattr(parent, leaf) or getattr(parent, leaf) is old):
                setattr(parent, leaf, mod)
        for cell, code in zip(cells, codes):
            mod = fresh[cell.target]
            _share_names(mod, fresh)
            try:
                exec(code, vars(mod))
            except (Exception, SystemExit) as error:
                raise NotebookError(_runtime_message(notebook, cell, error)) from error
        for mod in fresh.values():
            _share_names(mod, fresh)
        yield StudentCode(module, fresh, str(notebook))
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "tinytrain"]:
            if name not in saved_modules:
                del sys.modules[name]  # first imported under the overlay: may hold the student's objects
        sys.modules.update(saved_modules)
        for name, mod in packages.items():
            namespace = vars(mod)
            namespace.clear()
            namespace.update(saved_dicts[name])


def _share_names(mod: types.ModuleType, fresh: dict[str, types.ModuleType]) -> None:
    """Make the names the module's other targets define visible in ``mod`` (its own win)."""
    namespace = vars(mod)
    for other in fresh.values():
        if other is mod:
            continue
        for name, value in vars(other).items():
            if not (name.startswith("__") and name.endswith("__")) and name not in namespace:
                namespace[name] = value


def _runtime_message(notebook: Path, cell: ExportCell, error: BaseException) -> str:
    filename = compiled_name(notebook, cell)
    line = None
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == filename:
            line = traceback.tb_lineno
        traceback = traceback.tb_next
    where = f"{cell.label}, line {line}" if line else cell.label
    return f"{notebook}: {where}: running the cell raised {type(error).__name__}: {error}"
