"""The training steps on a student's library against the reference: what following the lessons plainly costs.

The course test's students (``tests/course/solutions``: every function the
modules ask for, written from the lessons alone, plainly, without the
reference's optimisations) are exported module by module into a scratch copy
of the package, as ``tinytrain export`` does for a student. The MLP, CNN
(MNIST- and CIFAR-shaped) and GPT training steps of ``mlp_step.py``,
``cnn_step.py`` and ``gpt_step.py`` then run on both libraries, in processes
timed in lockstep (``_timing.lockstep_medians``); their first losses must
agree. No target: the ratio is what a student's milestones cost. A large one
where the student writes little (the MLP, the GPT) would point at given code
that makes a correct solution slow (``np.add.at`` on slices, say).

    python benchmarks/student_library.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from _timing import lockstep_medians, spread_note  # noqa: E402  (pins BLAS threads first)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "tests" / "course" / "solutions"
# step -> (rounds, rounds with --quick, steps per sample): about half a second a sample
STEPS = {"mlp": (100, 30, 3), "cnn_mnist": (20, 8, 1), "cnn_cifar": (12, 5, 1), "gpt": (12, 5, 1)}


def student_library(folder: Path) -> Path:
    """A copy of the package in ``folder`` with every module's student solution exported; its parent.

    Put the returned folder first on ``sys.path`` to import the student's ``tinytrain``.
    """
    import nbformat

    from tinytrain.course.export import export
    from tinytrain.course.solutions import fill, solution_bodies

    shutil.copytree(ROOT / "tinytrain", folder / "tinytrain", ignore=shutil.ignore_patterns("__pycache__"))
    for solution in sorted(SOLUTIONS.glob("[0-9][0-9]_*.py")):
        module = solution.stem
        notebook = fill(nbformat.read(ROOT / "notebooks" / f"{module}.ipynb", as_version=4), solution_bodies(solution))
        path = folder / f"{module}.ipynb"
        nbformat.write(notebook, path)
        export(path, module, folder / "tinytrain")
    return folder


def build(library: str, step: str) -> Callable[[], float]:
    """Entry point of a benchmark process: training step ``step`` on the ``tinytrain`` in folder ``library``
    (``""``: the installed one)."""
    if library:
        sys.path.insert(0, library)
    import tinytrain

    if library and not Path(tinytrain.__file__).is_relative_to(library):
        raise RuntimeError(f"imported {tinytrain.__file__}, not the library in {library}")
    if step == "mlp":
        import mlp_step
        return mlp_step.build("tinytrain")
    if step.startswith("cnn_"):
        import cnn_step
        return cnn_step.build("tinytrain", step.removeprefix("cnn_"))
    import gpt_step
    return gpt_step.build("tinytrain")


def measure(quick: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
    """Per step: ``lockstep_medians``'s result for ``reference`` and ``student``.

    Raises AssertionError when the student's first three losses differ from the
    reference's (the two libraries would not be computing the same step).
    """
    results = {}
    with tempfile.TemporaryDirectory(prefix="tinytrain-student-") as scratch:
        library = str(student_library(Path(scratch)))
        for step, (rounds, quick_rounds, inner) in STEPS.items():
            found = lockstep_medians({"reference": ("student_library:build", ("", step)),
                                      "student": ("student_library:build", (library, step))},
                                     repeats=quick_rounds if quick else rounds, warmup=3, inner=inner, processes=3)
            ours, theirs = found["reference"]["first"], found["student"]["first"]
            if not np.allclose(theirs, ours, rtol=1e-4, atol=1e-5):
                raise AssertionError(f"{step} step: the student's losses {theirs} differ from the reference's {ours}")
            results[step] = found
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    results = measure(args.quick)
    print("Training steps on the course students' library (tests/course/solutions) and on the reference; one thread")
    print(f"  {'step':10s} {'reference':>12s} {'student':>12s}   student / reference")
    for step, found in results.items():
        reference, student = found["reference"]["seconds"], found["student"]["seconds"]
        print(f"  {step:10s} {reference * 1e3:9.2f} ms {student * 1e3:9.2f} ms   {student / reference:.2f}x")
    print(f"  {spread_note({f'{step} {side}': found[side] for step, found in results.items() for side in found})}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
