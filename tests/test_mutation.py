"""The mutation check of the graded checks (``tinytrain mutants``)."""
from __future__ import annotations

import json
from pathlib import Path

from tinytrain.course import mutation
from tinytrain.course.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_one_change_mutants_of_a_body() -> None:
    body = "if x.ndim == 0:\n    return None\ntotal = x.sum(axis=1, keepdims=True)\nreturn total * 2 - y"
    found = {m.change: m.body for m in mutation.mutants("f", body)}
    changes = "\n".join(found)
    for expected in ("`x.ndim == 0` -> `x.ndim != 0`", "`0` -> `1`", "`x.sum(axis=1, keepdims=True)` -> "
                     "`x.mean(axis=1, keepdims=True)`", "-> `x.sum(keepdims=True)`", "-> `x.sum(axis=1)`",
                     "`True` -> `False`", "`total * 2` -> `total / 2`", "`total * 2 - y` -> `total * 2 + y`",
                     "`if x.ndim == 0: return None` -> `(deleted)`", "-> `if not x.ndim == 0:"):
        assert expected in changes, f"missing {expected!r} in\n{changes}"
    assert len(found) == len(set(found.values())), "every mutant reads differently"
    for text in found.values():
        compile("def f():\n" + "\n".join("    " + line for line in text.splitlines()), "<mutant>", "exec")
    assert body not in found.values()


def test_every_solution_of_every_module_has_mutants() -> None:
    for source in sorted(ROOT.glob("modules/[0-9][0-9]_*/[0-9][0-9]_*.py")):
        bodies, found = mutation.module_mutants(source)
        functions = {m.function for m in found}
        assert functions == set(bodies), f"{source.stem}: no mutant of {set(bodies) - functions}"
        keys = [m.key for m in found]
        assert len(keys) == len(set(keys)), f"{source.stem}: two mutants share a key"


def test_equivalent_mutants_are_read_and_stale_ones_reported(tmp_path: Path) -> None:
    source = tmp_path / "99_demo" / "99_demo.py"
    source.parent.mkdir()
    source.write_text("")
    (source.parent / mutation.EQUIVALENT_FILE).write_text(
        '[[equivalent]]\nmutant = "f: a"\nreason = "the same"\n\n[[equivalent]]\nmutant = "f: gone"\nreason = "old"\n')
    equivalent = mutation.equivalent_mutants(source)
    assert equivalent == {"f: a": "the same", "f: gone": "old"}
    outcomes = [mutation.Outcome(mutation.Mutant("f", change, "pass"), killed, []) for change, killed in
                (("a", False), ("b", False), ("c", True), ("d", True))]
    summary = mutation.summarize("99_demo", outcomes, equivalent)
    assert (summary.mutants, summary.killed, len(summary.equivalent)) == (4, 2, 1)
    assert [o.mutant.key for o in summary.survivors] == ["f: b"] and summary.stale == ["f: gone"]
    assert round(summary.score, 1) == 66.7


def test_the_command_grades_the_mutants_of_a_function(tmp_path: Path, capsys) -> None:
    status = main(["mutants", "03", "--function", "gelu", "--jobs", "1", "--json", str(tmp_path / "m.json"),
                   "--fail-under", "100", "--root", str(ROOT)])
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "m.json").read_text())
    assert summary["module"] == "03_activations" and summary["mutants"] >= 1
    assert summary["killed"] == summary["mutants"] and status == 0, out
    assert "score 100.0%" in out


def test_a_reference_that_loses_points_stops_the_command_before_any_mutant(monkeypatch, capsys) -> None:
    """Else every mutant of a failing reference would count as killed: a 100% score that measures nothing."""
    real = mutation.module_mutants

    def broken_reference(source: Path, only: str | None = None):
        bodies, found = real(source, only)
        return {**bodies, "gelu": "raise NotImplementedError"}, found

    monkeypatch.setattr(mutation, "module_mutants", broken_reference)
    status = main(["mutants", "03", "--function", "gelu", "--jobs", "1", "--root", str(ROOT)])
    err = capsys.readouterr().err
    assert status == 2 and "reference does not earn full marks" in err and "gelu" in err, err
