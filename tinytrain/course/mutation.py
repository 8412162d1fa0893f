"""Mutation testing of the graded checks: which wrong versions of a module still earn full marks.

For every function a student writes, the reference's body (its solution region)
is changed in one small way -- an operator, a comparison, a constant, an axis,
two arguments swapped, an argument or a statement deleted, a condition negated,
``sum`` for ``mean`` -- and the student notebook, filled with that body
and the reference everywhere else, is graded. A *mutant* that loses points is
**killed**: the checks notice that bug. One that keeps full marks **survives**:
either the checks miss a bug a student could make (strengthen them), or the
change does not change what the function computes (an *equivalent* mutant,
such as ``x * 1.0`` for ``x / 1.0``). Equivalent ones are listed, each with the
reason, in ``modules/NN_name/equivalent_mutants.toml``::

    [[equivalent]]
    mutant = "sum_to_shape: `grad.shape == shape` -> `grad.shape != shape` ..."
    reason = "the early return only saves work"

and are left out of the score: killed / (all - equivalent).

    tinytrain mutants 02 [--jobs 2] [--function NAME] [--json PATH] [--fail-under 95]
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import multiprocessing
import os
import tempfile
import textwrap
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat

from tinytrain.course.solutions import fill, reference_bodies

EQUIVALENT_FILE = "equivalent_mutants.toml"

_BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
           ast.Pow: ast.Mult, ast.MatMult: ast.Mult, ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr,
           ast.BitOr: ast.BitAnd}
_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
            ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_METHODS = {"sum": "mean", "mean": "sum", "max": "min", "min": "max", "argmax": "argmin", "argmin": "argmax",
            "maximum": "minimum", "minimum": "maximum", "any": "all", "all": "any"}


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One wrong version of one function: ``body`` replaces the reference's."""

    function: str  # qualified name, e.g. "Mul.backward"
    change: str  # e.g. "`grad * b` -> `grad / b`"
    body: str

    @property
    def key(self) -> str:
        return f"{self.function}: {self.change}"


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    failed: list[str]  # the checks that caught it (or why grading failed)


def _sites(tree: ast.AST) -> Iterator[tuple[ast.AST, Callable[[ast.AST], ast.AST | list | None]]]:
    """Each place that can be changed, with a function that makes the changed copy of that node.

    A function returning a list replaces a statement by those statements (``[]`` deletes it).
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            yield node, lambda n: ast.BinOp(n.left, _BINARY[type(n.op)](), n.right)
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINARY:
            yield node, lambda n: ast.AugAssign(n.target, _BINARY[type(n.op)](), n.value)
        elif isinstance(node, ast.Compare):
            for index, op in enumerate(node.ops):
                if type(op) in _COMPARE:
                    yield node, lambda n, i=index: ast.Compare(
                        n.left, [*n.ops[:i], _COMPARE[type(n.ops[i])](), *n.ops[i + 1:]], n.comparators)
        elif isinstance(node, ast.BoolOp):
            yield node, lambda n: ast.BoolOp(ast.Or() if isinstance(n.op, ast.And) else ast.And(), n.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            yield node, lambda n: n.operand
        elif isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)) and node.value is not None:
            yield node, lambda n: ast.Constant(_changed_constant(n.value))
        elif isinstance(node, ast.Call):
            if len(node.args) >= 2 and ast.dump(node.args[0]) != ast.dump(node.args[1]):
                yield node, lambda n: ast.Call(n.func, [n.args[1], n.args[0], *n.args[2:]], n.keywords)
            if node.args:  # an argument ignored: the last positional one dropped
                yield node, lambda n: ast.Call(n.func, n.args[:-1], n.keywords)
            for index in range(len(node.keywords)):
                yield node, lambda n, i=index: ast.Call(n.func, n.args, [*n.keywords[:i], *n.keywords[i + 1:]])
            if isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS:
                yield node, lambda n: ast.Call(ast.Attribute(n.func.value, _METHODS[n.func.attr], n.func.ctx),
                                               n.args, n.keywords)
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            yield node, lambda n: _with_test(n, ast.UnaryOp(ast.Not(), n.test))
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            yield node, lambda n: []


def _changed_constant(value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 1.0
    return value


def _with_test(node: ast.AST, test: ast.expr) -> ast.AST:
    changed = copy.copy(node)
    changed.test = test
    return changed


class _Replace(ast.NodeTransformer):
    """Replace the ``target``-th node that ``_sites`` yields (the same walk order) by ``make(node)``."""

    def __init__(self, target: ast.AST, make: Callable) -> None:
        self.target, self.make = target, make

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field, old in ast.iter_fields(node):
            if isinstance(old, list):
                new: list = []
                for item in old:
                    if item is self.target:
                        made = self.make(item)
                        new.extend(made if isinstance(made, list) else [made])
                    else:
                        new.append(self.visit(item) if isinstance(item, ast.AST) else item)
                if old and not new and field in ("body", "orelse", "finalbody"):
                    new = [ast.Pass()]  # a block cannot be empty
                setattr(node, field, new)
            elif old is self.target:
                setattr(node, field, self.make(old))
            elif isinstance(old, ast.AST):
                self.visit(old)
        return node


def mutants(function: str, body: str) -> list[Mutant]:
    """Every one-change mutant of ``body`` that reads differently from it (duplicates once)."""
    tree = ast.parse(body)
    original = ast.unparse(tree)
    seen, found = set(), []
    for index, (node, make) in enumerate(list(_sites(tree))):
        changed = copy.deepcopy(tree)
        target, changer = list(_sites(changed))[index]
        _Replace(target, changer).visit(changed)
        ast.fix_missing_locations(changed)
        try:
            text = ast.unparse(changed)
            compile("def body():\n" + textwrap.indent(text, "    "), "<mutant>", "exec")  # a body: `return` is fine
        except (SyntaxError, ValueError, TypeError):
            continue
        if text == original or text in seen:
            continue
        seen.add(text)
        change = _describe(body, node, make)
        repeats = sum(m.change.split(" #")[0] == change for m in found)
        found.append(Mutant(function, f"{change} #{repeats + 1}" if repeats else change, text))
    return found


def _describe(body: str, node: ast.AST, make: Callable) -> str:
    before = ast.get_source_segment(body, node) or ast.unparse(node)
    made = make(copy.deepcopy(node))
    after = "(deleted)" if made == [] else ast.unparse(made)
    before, after = " ".join(before.split()), " ".join(after.split())
    clip = lambda text: text if len(text) <= 80 else text[:77] + "..."  # noqa: E731
    return f"`{clip(before)}` -> `{clip(after)}` (line {node.lineno}:{node.col_offset})"


def module_mutants(source: Path, only: str | None = None) -> tuple[dict[str, str], list[Mutant]]:
    """The reference bodies of a module source and all their mutants (of function ``only`` if given)."""
    bodies = reference_bodies(source)
    if only is not None and only not in bodies:
        raise ValueError(f"{source.stem} has no solution region in {only!r}; its functions: {', '.join(bodies)}")
    found = [m for name, body in bodies.items() if only in (None, name) for m in mutants(name, body)]
    return bodies, found


def equivalent_mutants(source: Path) -> dict[str, str]:
    """Mutant key -> the reason it is equivalent, from ``equivalent_mutants.toml`` beside ``source``."""
    path = Path(source).parent / EQUIVALENT_FILE
    if not path.is_file():
        return {}
    with open(path, "rb") as file:
        entries = tomllib.load(file).get("equivalent", [])
    return {entry["mutant"]: entry["reason"] for entry in entries}


def _lost_points(root: Path, module: str, notebook_path: Path, bodies: dict[str, str]) -> list[str] | None:
    """Fill the student notebook with ``bodies`` and grade it (stopping at the first failing check): the failed
    checks (or the first error), an empty list when some points are lost otherwise, None at full marks."""
    from tinytrain.course import grading

    notebook = fill(nbformat.read(notebook_path, as_version=4), bodies)
    with tempfile.TemporaryDirectory(prefix="tinytrain-mutant-") as folder:
        path = Path(folder) / f"{module}.ipynb"
        nbformat.write(notebook, path)
        report = grading.grade(module, root, path, stop_at_first_failure=True)
    failed = [check.name for check in report.checks if check.outcome == "failed"] or report.errors[:1]
    return failed if failed or report.earned < report.possible else None


def _grade_mutant(args: tuple[Path, str, Path, dict[str, str], Mutant]) -> Outcome:
    """Worker: fill the student notebook with the mutant and grade it (stops at the first failing check)."""
    root, module, notebook_path, bodies, mutant = args
    failed = _lost_points(root, module, notebook_path, {**bodies, mutant.function: mutant.body})
    return Outcome(mutant, failed is not None, failed or [])


def run(root: Path, module: str, jobs: int = 2, only: str | None = None,
        progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Grade every mutant of ``module`` (``NN_name``) in ``jobs`` worker processes."""
    source = root / "modules" / module / f"{module}.py"
    bodies, found = module_mutants(source, only)
    notebook = root / "notebooks" / f"{module}.ipynb"
    os.environ.setdefault("TINYTRAIN_CHECK_TIMEOUT", "20")  # a mutant that loops forever fails its check
    # The reference first: where it loses points itself, every mutant would count as killed.
    failed = _lost_points(root, module, notebook, bodies)
    if failed is not None:
        lost = f"failed: {', '.join(failed)}" if failed else "no check failed, but points are missing"
        raise ValueError(f"module {module}'s reference does not earn full marks ({lost}): its mutants cannot be "
                         f"scored until it does (pytest tests/graded/test_{module}.py)")
    tasks = [(root, module, notebook, bodies, mutant) for mutant in found]
    outcomes = []
    # Fresh workers now and then: a mutant may leave a process's state changed.
    with multiprocessing.Pool(jobs, maxtasksperchild=25) as pool:
        for outcome in pool.imap(_grade_mutant, tasks):
            outcomes.append(outcome)
            if progress is not None:
                progress(len(outcomes), len(tasks))
    return outcomes


@dataclasses.dataclass
class Summary:
    module: str
    mutants: int
    killed: int
    equivalent: list[Outcome]
    survivors: list[Outcome]
    stale: list[str]  # equivalent_mutants.toml entries that match no surviving mutant

    @property
    def score(self) -> float:
        """Killed as a share of the non-equivalent mutants, in percent."""
        counted = self.mutants - len(self.equivalent)
        return 100.0 * self.killed / counted if counted else 100.0

    def as_dict(self) -> dict:
        return {"module": self.module, "mutants": self.mutants, "killed": self.killed, "score": round(self.score, 2),
                "equivalent": [{"mutant": o.mutant.key, "body": o.mutant.body} for o in self.equivalent],
                "survivors": [{"mutant": o.mutant.key, "body": o.mutant.body} for o in self.survivors],
                "stale_equivalents": self.stale}


def summarize(module: str, outcomes: list[Outcome], equivalent: dict[str, str]) -> Summary:
    surviving = [outcome for outcome in outcomes if not outcome.killed]
    keys = {outcome.mutant.key for outcome in surviving}
    return Summary(module, len(outcomes), sum(outcome.killed for outcome in outcomes),
                   [o for o in surviving if o.mutant.key in equivalent],
                   [o for o in surviving if o.mutant.key not in equivalent],
                   sorted(set(equivalent) - keys))
