"""Which names an exported library file needs from its siblings (static analysis, no code runs).

In a notebook every cell shares one namespace; in the package each export target
is a file of its own. ``tinytrain export`` uses :func:`sibling_imports` to write
the imports that connect them again.
"""
from __future__ import annotations

import builtins
import symtable

def _bound_names(code: str) -> tuple[set[str], set[str]]:
    """(names a module's code binds at top level, of those the ones it defines itself)."""
    table = symtable.symtable(code, "<code>", "exec")
    bound, defined = set(), set()
    for symbol in table.get_symbols():
        if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace():
            bound.add(symbol.get_name())
            if not symbol.is_imported():
                defined.add(symbol.get_name())
    return bound, defined


def bound_names(code: str) -> set[str]:
    """The names a module's code binds at top level (defines, assigns or imports)."""
    return _bound_names(code)[0]


def _global_references(code: str) -> set[str]:
    """Names the code looks up as globals anywhere (module level, functions, classes)."""
    found: set[str] = set()

    def walk(table: symtable.SymbolTable, top: bool) -> None:
        for symbol in table.get_symbols():
            if not symbol.is_referenced():
                continue
            if top:
                if not (symbol.is_assigned() or symbol.is_imported()):
                    found.add(symbol.get_name())
            elif symbol.is_global() and not symbol.is_local():
                found.add(symbol.get_name())
            elif table.get_type() == "class" and not symbol.is_local() and not symbol.is_free():
                found.add(symbol.get_name())
        for child in table.get_children():
            walk(child, False)

    walk(symtable.symtable(code, "<code>", "exec"), True)
    return found


def free_names(code: str) -> set[str]:
    """Globals the code uses but does not bind itself (builtins and dunders left out)."""
    bound, _ = _bound_names(code)
    return {
        name
        for name in _global_references(code) - bound
        if not hasattr(builtins, name) and not (name.startswith("__") and name.endswith("__"))
    }


def _import_order(name: str) -> tuple[int, str]:
    """isort's order within an import: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def sibling_imports(codes: dict[str, str]) -> tuple[dict[str, dict[str, list[str]]], dict[str, list[str]]]:
    """For each target: {sibling target: names it needs from it}; and the names nothing defines."""
    bound = {target: _bound_names(code) for target, code in codes.items()}
    needs: dict[str, dict[str, list[str]]] = {}
    missing: dict[str, list[str]] = {}
    for target, code in codes.items():
        imports: dict[str, list[str]] = {}
        for name in sorted(free_names(code)):
            owners = [other for other in codes if other != target and name in bound[other][0]]
            if not owners:
                missing.setdefault(target, []).append(name)
                continue
            definers = [other for other in owners if name in bound[other][1]]
            imports.setdefault((definers or owners)[0], []).append(name)
        needs[target] = {other: sorted(names, key=_import_order) for other, names in imports.items()}
    return needs, missing
