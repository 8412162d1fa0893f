"""The ``tinytrain`` command line.

    tinytrain build [--check] [--force]        notebooks and library files from modules/
    tinytrain grade NN [--notebook P] [--json] module NN's graded checks on the student's notebook
                                               (--installed: on the code installed in the package;
                                               --notebook P: in a sandbox, see --sandbox)
    tinytrain export NN [--notebook P]         the notebook's code into the installed package (--force: with stubs)
    tinytrain reset NN | --all                 the reference code back into the package
    tinytrain status                           per module: whose code is installed, do its checks pass
    tinytrain milestone mlp|cnn|gpt|finetune [options]  train a real model end to end
    tinytrain quantize RUN_DIR                 a trained GPT run's bytes and validation loss in float32, int8, NF4
    tinytrain doctor                           check the installation; a fix for each problem
    tinytrain grade-class NN FOLDER            for instructors: a folder of notebooks into a gradebook (CSV, JSON),
                                               each notebook in a sandbox (--sandbox auto|bwrap|rlimit|none)
    tinytrain mutants NN [--jobs N]            for instructors: wrong versions the graded checks miss

Each subcommand is a function ``_name(args) -> int`` plus one ``_command(...)`` line in
:func:`main` (followed by its arguments). Problems the user can fix raise
:class:`UsageError`: printed without a traceback, exit status 2.

This module imports no optional dependency at import time; a subcommand imports what
it needs when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tinytrain.course import diagnose, export, grading, inventory, notebooks
from tinytrain.course.doctor import doctor


class UsageError(Exception):
    """A problem the user can fix (bad source, missing extra, no project): exit status 2."""


def find_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding ``pyproject.toml`` and ``modules/``."""
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "modules").is_dir():
            return folder
    raise UsageError(
        f"no tinytrain project (a folder with pyproject.toml and modules/) at or above {start}; pass --root"
    )


def _root(args: argparse.Namespace) -> Path:
    """The project root: ``--root`` when given, else found from the working directory."""
    if args.root is None:
        return find_root(Path.cwd().resolve())
    root = Path(args.root).resolve()
    if not (root / "modules").is_dir():
        raise UsageError(f"--root {args.root}: no modules/ folder there")
    return root


def _build(args: argparse.Namespace) -> int:
    """``tinytrain build [--check]``: regenerate (or verify) library files and notebooks."""
    try:
        from tinytrain.course import build
    except ModuleNotFoundError as error:
        if (error.name or "").startswith("tinytrain"):
            raise
        raise UsageError(f"tinytrain build needs {error.name}: pip install 'tinytrain[notebooks]'") from None
    root = _root(args)
    try:
        if args.check:
            return _report_stale(root, build.stale(root))
        if args.nbgrader_source:
            for path in build.write_nbgrader_source(root, Path(args.nbgrader_source)):
                print(f"wrote {_shown(path)}")
            return 0
        result = build.write(root, force=args.force)
    except build.BuildError as error:
        raise UsageError(str(error)) from None
    for path in result.written:
        print(f"wrote {path.relative_to(root).as_posix()}")
    for path in result.removed:
        print(f"removed {path.relative_to(root).as_posix()} (no module source or milestone makes it any more)")
    if not result.written and not result.removed:
        print("up to date")
    return 0


def _report_stale(root: Path, stale: dict[Path, str]) -> int:
    """Print the stale files of ``build --check``; 1 when there are any."""
    if not stale:
        print("up to date")
        return 0
    for path in sorted(stale):
        print(f"{path.relative_to(root).as_posix()}: {stale[path]}")
    print(f"{len(stale)} generated file(s) differ from their sources (modules/, milestones/); run `tinytrain build`")
    return 1


# -- the student workflow: grade, export, reset, status ------------------------------------------
def _project_root(args: argparse.Namespace) -> Path | None:
    """The project folder, or None when there is none (a plain ``pip install``).

    ``--root``, else the nearest project at or above the working directory, else the
    folder above the installed package when that is a project (an editable install).
    """
    if args.root is not None:
        return _root(args)
    try:
        return find_root(Path.cwd().resolve())
    except UsageError:
        pass
    parent = inventory.PACKAGE_DIR.parent
    return parent if (parent / "modules").is_dir() and (parent / "pyproject.toml").is_file() else None


def _needs_root(args: argparse.Namespace, what: str) -> Path:
    root = _project_root(args)
    if root is None:
        raise UsageError(
            f"{what} needs the tinytrain project (its notebooks/ and tests/graded/): run it inside the project "
            "folder, or pass --root PATH"
        )
    return root


def _module(args: argparse.Namespace, root: Path | None) -> str:
    try:
        return inventory.resolve_module(args.module, root)
    except inventory.UnknownModule as error:
        raise UsageError(str(error)) from None


def _notebook(args: argparse.Namespace, root: Path, module: str) -> Path:
    """``--notebook``, else ``notebooks/NN_name.ipynb`` of the project; it must exist."""
    if args.notebook is not None:
        path = Path(args.notebook)
        try:
            path = notebooks.find_notebook(path, module)
        except notebooks.NotebookError as error:
            raise UsageError(str(error)) from None
        if not path.is_file():
            raise UsageError(f"notebook {args.notebook} does not exist")
        return path
    path = root / "notebooks" / f"{module}.ipynb"
    if not path.is_file():
        raise UsageError(f"notebook {path} does not exist; pass --notebook PATH to use another file, or get a "
                         f"fresh copy with `git checkout -- notebooks/{module}.ipynb` in the project folder")
    return path


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when below it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _grade(args: argparse.Namespace) -> int:
    """``tinytrain grade NN``: run module NN's graded checks on the student's notebook."""
    root = _needs_root(args, "tinytrain grade")
    module = _module(args, root)
    if module not in inventory.graded_test_files(root):
        raise UsageError(f"module {module} has no graded checks yet (tests/graded/test_{module}.py)")
    notebook = None if args.installed else _notebook(args, root, module)
    if notebook is not None:
        try:
            belongs = notebooks.notebook_module(notebook, notebooks.read_export_cells(notebook))
        except notebooks.NotebookError as error:
            raise UsageError(str(error)) from None
        if belongs is not None and belongs != module:
            raise UsageError(f"{notebook} is the notebook of module {belongs}, not {module}; "
                             f"grade it with `tinytrain grade {belongs[:2]}`")
    _require("pytest", "tinytrain grade")
    sandbox = args.sandbox or ("auto" if args.notebook is not None else "none")
    if sandbox != "none" and notebook is not None:
        from tinytrain.course import sandbox as sandboxes

        try:
            report = sandboxes.grade_isolated(root, module, notebook, sandbox)
        except (ValueError, RuntimeError) as error:
            raise UsageError(str(error)) from None
    else:
        # Anything the student's code prints outside the checks goes to stderr: stdout is the JSON alone.
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            report = grading.grade(module, root, notebook)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        _print_report(report)
    return 0 if report.passed else 1


def _print_report(report) -> None:
    what = _shown(Path(report.notebook)) if report.notebook else "the installed package"
    print(f"Module {report.module}: graded checks on {what}")
    if report.notebook and report.errors:  # the notebook did not load: that is all there is to say
        for error in report.errors:
            print(f"error: {error}")
        print(f"Total: 0/{report.possible} points (fix the notebook so that its code runs, then grade again)")
        return
    for error in report.errors:
        print(f"error: {error}")
    width = max((len(_check_name(check.name)) for check in report.checks), default=10)
    for check in report.checks:
        label = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP", "unrun": "----"}[check.outcome]
        score = f"{check.earned}/{check.points}" if check.outcome != "skipped" else f"-/{check.points}"
        line = f"  {label}  {_check_name(check.name):<{width}}  {score:>5}"
        if check.outcome == "failed":
            line += f"  {check.message}"
        elif check.outcome == "skipped":
            line += f"  ({check.message})"
        elif check.outcome == "unrun":
            line += "  (did not run)"
        print(line)
        if check.outcome != "failed":
            continue
        if check.cause is not None:
            print(f"        cause: {check.cause} raised this; {diagnose.reset_advice(check.cause.module)}")
        elif check.blocked_by:
            first = ", ".join(_check_name(name) for name in check.blocked_by)
            verb = "fails" if len(check.blocked_by) == 1 else "fail"
            print(f"        fails because {first} {verb}: fix that first")
        else:
            print(f"        hint: {check.hint}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"Total: {report.earned}/{report.possible} points")


def _check_name(name: str) -> str:
    return name.removeprefix("test_")


def _require(distribution: str, what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(distribution) is None:
        raise UsageError(f"{what} needs {distribution}: pip install {distribution}")


def _export(args: argparse.Namespace) -> int:
    """``tinytrain export NN``: write the notebook's code for module NN into the package."""
    root = _needs_root(args, "tinytrain export")
    module = _module(args, root)
    notebook = _notebook(args, root, module)
    try:
        stubs = notebooks.stubbed_functions(notebook)
        if stubs and not args.force:
            raise UsageError(
                f"not exported: {_shown(notebook)} still has stubs that raise NotImplementedError: {', '.join(stubs)}. "
                "Later modules and the milestones would fail in them; fill them in first, or pass --force"
            )
        result = export.export(notebook, module)
    except (notebooks.NotebookError, inventory.UnknownModule) as error:
        raise UsageError(f"not exported: {error}") from None
    print(f"exported module {module} from {_shown(notebook)} into the package:")
    for path in result.written:
        print(f"  {_shown(path)}")
    print(f"the replaced files are kept in {_shown(result.backups)}")
    for warning in result.warnings:
        print(f"warning: {warning}")
    if stubs:
        print(f"warning: still stubs (they raise NotImplementedError): {', '.join(stubs)}; later modules and the "
              "milestones that call them will fail")
    print(f"`tinytrain grade {module[:2]} --installed` checks it; `tinytrain reset {module[:2]}` puts the reference back.")
    return 0


def _reset(args: argparse.Namespace) -> int:
    """``tinytrain reset NN`` / ``--all``: put module NN's (every module's) reference code back into the package."""
    root = _project_root(args)
    if args.all == (args.module is not None):
        raise UsageError("name one module to reset (tinytrain reset 03), or pass --all")
    if args.all:
        modules = [name for name, info in inventory.installed_modules().items() if info.exported]
        if not modules:
            print("the package already holds the reference code of every module")
    else:
        modules = [_module(args, root)]
    for module in modules:
        try:
            changed = export.reset(module, root)
        except (notebooks.NotebookError, inventory.UnknownModule) as error:
            raise UsageError(str(error)) from None
        if not changed:
            print(f"module {module}: the package already holds the reference code")
        for path, how in changed:
            print(f"reset {_shown(path)} ({how})")
    return 0


def _status(args: argparse.Namespace) -> int:
    """``tinytrain status``: per module, whose code is installed and whether its checks pass."""
    root = _project_root(args)
    installed = inventory.installed_modules()
    tests = inventory.graded_test_files(root) if root is not None else {}
    reports = {}
    if tests and not args.no_checks:
        _require("pytest", "tinytrain status (use --no-checks to skip the graded checks)")
        collector = grading.run_checks(list(tests.values()), None, root)
        for module in tests:
            reports[module] = grading.GradeReport(module, None, [])
        for result in collector.results.values():
            module = inventory.module_of_test_file(result.nodeid.split("::")[0])
            reports.setdefault(module, grading.GradeReport(module, None, [])).checks.append(result)
        for error in collector.errors:
            for module, path in tests.items():
                if path.name in error:
                    reports[module].errors.append(error)
    names = sorted(set(installed) | set(tests) | set(inventory.source_modules(root)))
    rows = []
    for module in names:
        info = installed.get(module)
        if info is None:
            code = "not installed"
        elif info.exported:
            origins = sorted(set(info.exported.values()))
            partly = "" if len(info.exported) == len(info.targets) else " (partly)"
            code = f"student{partly}: {', '.join(origins)}"
        else:
            code = "reference"
        if module in reports:
            report = reports[module]
            failing = [c for c in report.checks if c.outcome == "failed"]
            unrun = [c for c in report.checks if c.outcome == "unrun"]
            checks = f"{report.earned}/{report.possible} points"
            if report.errors and not report.checks:
                checks += ", checks do not load"
            elif failing:
                checks += f", {len(failing)} check(s) fail: {', '.join(_check_name(c.name) for c in failing[:4])}"
                checks += ", ..." if len(failing) > 4 else ""
            elif unrun:
                checks += f", {len(unrun)} check(s) did not run"
            else:
                checks += ", all pass"
        elif module in tests:
            checks = "not run (--no-checks)"
        else:
            checks = "no graded checks"
        rows.append((module, code, checks))
    advice = _causes(reports)
    if args.json:
        print(json.dumps({"modules": [{"module": m, "code": c, "checks": k} for m, c, k in rows], "advice": advice},
                         indent=2))
        return 0
    width = max((len(m) for m, _, _ in rows), default=6)
    code_width = max([len("installed code")] + [len(c) for _, c, _ in rows])
    print(f"{'module':<{width}}  {'installed code':<{code_width}}  graded checks on the installed code")
    for module, code, checks in rows:
        print(f"{module:<{width}}  {code:<{code_width}}  {checks}")
    for line in advice:
        print(line)
    return 0


def _causes(reports: dict) -> list[str]:
    """What the student's exported code breaks: its stubs, and other modules' checks that fail in it."""
    lines = []
    for module, stubs in diagnose.exported_stubs().items():
        lines.append(f"module {module} holds your exported code with stubs left: {', '.join(stubs)}; fill them and "
                     f"export again, or {diagnose.reset_advice(module)}")
    broken: dict[str, tuple[object, set[str]]] = {}
    for module, report in reports.items():
        for check in report.checks:
            if check.outcome == "failed" and check.cause is not None:
                cause, victims = broken.setdefault(check.cause.module, (check.cause, set()))
                victims.add(module)
    for module, (cause, victims) in sorted(broken.items()):
        lines.append(f"the checks of {', '.join(sorted(victims))} fail in {cause}: {diagnose.reset_advice(module)}")
    return lines


# -- instructors -----------------------------------------------------------------------------------
def _grade_class(args: argparse.Namespace) -> int:
    """``tinytrain grade-class NN FOLDER``: every student's notebook of module NN into a gradebook."""
    from tinytrain.course import classroom

    root = _needs_root(args, "tinytrain grade-class")
    module = _module(args, root)
    if module not in inventory.graded_test_files(root):
        raise UsageError(f"module {module} has no graded checks (tests/graded/test_{module}.py)")
    _require("pytest", "tinytrain grade-class")
    try:
        limits = classroom.Limits(seconds=args.timeout, memory=int(args.memory * 2**30))
        grades = classroom.grade_class(root, module, Path(args.folder), jobs=args.jobs, sandbox=args.sandbox,
                                       limits=limits)
    except (ValueError, RuntimeError) as error:
        raise UsageError(str(error)) from None
    csv_path, json_path = classroom.write_gradebook(grades, Path(args.out or f"gradebook-{module}"))
    width = max(len(grade["student"]) for grade in grades)
    for grade in grades:
        problem = f"  ({grade['errors'][0].splitlines()[0][:100]})" if grade["errors"] else ""
        print(f"{grade['student']:<{width}}  {grade['earned']:>3}/{grade['possible']}{problem}")
    sandbox = grades[0]["sandbox"]
    print(f"{len(grades)} notebooks of module {module} graded, each in a sandbox ({sandbox}); gradebook: "
          f"{_shown(csv_path)}, {_shown(json_path)}")
    return 0


def _mutants(args: argparse.Namespace) -> int:
    """``tinytrain mutants NN``: which wrong versions of module NN's reference earn full marks."""
    import time

    from tinytrain.course import mutation

    root = _needs_root(args, "tinytrain mutants")
    module = _module(args, root)
    _require("pytest", "tinytrain mutants")
    source = root / "modules" / module / f"{module}.py"
    if not source.is_file():
        raise UsageError(f"tinytrain mutants needs the module source {source}")
    start = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\r{done}/{total} mutants graded", end="", file=sys.stderr, flush=True)

    try:
        outcomes = mutation.run(root, module, jobs=args.jobs, only=args.function, progress=progress)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if sys.stderr.isatty():
        print(file=sys.stderr)
    summary = mutation.summarize(module, outcomes, mutation.equivalent_mutants(source))
    if args.json:
        Path(args.json).write_text(json.dumps(summary.as_dict(), indent=2) + "\n", encoding="utf-8")
    functions = len({outcome.mutant.function for outcome in outcomes})
    print(f"Module {module}: {summary.mutants} mutants of {functions} functions, graded in "
          f"{time.perf_counter() - start:.0f} s")
    print(f"  killed {summary.killed}, equivalent {len(summary.equivalent)} "
          f"(modules/{module}/{mutation.EQUIVALENT_FILE}), survived {len(summary.survivors)}")
    print(f"  score {summary.score:.1f}% of the non-equivalent mutants lose points")
    if summary.survivors:
        print("Survivors -- wrong versions that earn full marks (strengthen a check, or list the mutant as "
              "equivalent with the reason):")
        for outcome in summary.survivors:
            print(f"  {outcome.mutant.key}")
    for key in summary.stale:
        print(f"note: {mutation.EQUIVALENT_FILE} lists {key!r}, which no longer survives (or exists): remove it")
    return 0 if args.fail_under is None or summary.score >= args.fail_under else 1


# -- milestones, quantized runs and doctor ------------------------------------------------------------
def _milestone(args: argparse.Namespace) -> int:
    """``tinytrain milestone NAME [options]``: run the milestone recipe ``milestones/NAME.py``.

    In this process, as ``python milestones/NAME.py [options]`` would: the recipe of
    the project the package lives in, else the copy installed with the package (see
    :func:`tinytrain.course.milestones.recipe_folder`). Importing the milestones
    module asks for one BLAS thread, which works because NumPy is not loaded yet.
    """
    try:
        from tinytrain.course import milestones
    except ModuleNotFoundError as error:
        if (error.name or "").startswith("tinytrain"):
            raise UsageError("this tinytrain has no milestones module") from None
        raise
    available = milestones.available()
    if args.name not in available:
        raise UsageError(f"no milestone {args.name!r}; available: {', '.join(available) or 'none'}")
    return int(milestones.main(args.name, args.options) or 0)


def _quantize(args: argparse.Namespace) -> int:
    """``tinytrain quantize RUN_DIR``: a GPT milestone run's best weights in float32, int8 (dynamic and static)
    and NF4 -- the bytes and the validation loss of each. Importing the quantize module asks for one BLAS
    thread, as the milestone trained, which works because NumPy is not loaded yet."""
    from tinytrain.course import quantize

    try:
        report = quantize.quantize_run(Path(args.run_dir), args.calibration_batches, args.observer, args.percentile)
    except quantize.RunError as error:
        raise UsageError(str(error)) from None
    print("\n".join(report.lines()))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """``tinytrain doctor``: check the installation; print a fix for each problem."""
    findings = doctor(_project_root(args))
    for finding in findings:
        print(finding.text())
    failed = sum(finding.level == "FAIL" for finding in findings)
    warned = sum(finding.level == "WARN" for finding in findings)
    if failed:
        print(f"{failed} problem(s) to fix, {warned} warning(s); each says how to fix it")
    else:
        print("tinytrain is ready" + (f" ({warned} warning(s))" if warned else ""))
    return 1 if failed else 0


def _command(
    commands: argparse._SubParsersAction,
    name: str,
    run: Callable[[argparse.Namespace], int],
    help: str,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` that calls ``run(args)``; every subcommand takes ``--root``."""
    parser = commands.add_parser(name, help=help, description=help)
    parser.add_argument("--root", metavar="PATH", help="the project folder (default: found from the working directory)")
    parser.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tinytrain`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="tinytrain", description="Build, check and grade tinytrain modules.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    module_help = "the module: its number (03) or name (03_activations)"
    build_parser = _command(commands, "build", _build, "generate tinytrain/ library files and notebooks/ from modules/")
    build_parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any generated file is stale")
    build_parser.add_argument("--force", action="store_true",
                              help="replace notebooks even when they hold work (filled-in solutions or outputs)")
    build_parser.add_argument("--nbgrader-source", metavar="DIR",
                              help="instead, write nbgrader's source notebooks (solutions between their markers) "
                                   "as DIR/NN_name/NN_name.ipynb, e.g. into a course's source/ folder")
    grade_parser = _command(commands, "grade", _grade, "run module NN's graded checks on the code in your notebook")
    grade_parser.add_argument("module", metavar="NN", help=module_help)
    grade_parser.add_argument("--notebook", metavar="PATH",
                              help="the notebook to grade (default: notebooks/NN_name.ipynb)")
    grade_parser.add_argument("--installed", action="store_true",
                              help="grade the code installed in the package instead")
    grade_parser.add_argument("--json", action="store_true",
                              help='print {"module", "earned", "possible", "checks"} as JSON')
    grade_parser.add_argument("--sandbox", choices=("auto", "bwrap", "rlimit", "none"),
                              help="where the notebook's code runs: auto (bubblewrap where it works, else limits), "
                                   "bwrap, rlimit, or none (in this process: your own work, at full speed); "
                                   "default: none for your notebook, auto for --notebook PATH")
    export_parser = _command(commands, "export", _export, "write your notebook's code for module NN into the package")
    export_parser.add_argument("module", metavar="NN", help=module_help)
    export_parser.add_argument("--notebook", metavar="PATH",
                               help="the notebook to export (default: notebooks/NN_name.ipynb)")
    export_parser.add_argument("--force", action="store_true", help="export even when stubs are left")
    reset_parser = _command(commands, "reset", _reset, "put module NN's reference code back into the package")
    reset_parser.add_argument("module", metavar="NN", nargs="?", help=module_help)
    reset_parser.add_argument("--all", action="store_true", help="reset every module that holds your exported code")
    status_parser = _command(commands, "status", _status,
                             "per module: whose code is installed, and do its graded checks pass")
    status_parser.add_argument("--no-checks", action="store_true", help="only say whose code is installed")
    status_parser.add_argument("--json", action="store_true", help="print the table as JSON")
    class_parser = _command(commands, "grade-class", _grade_class,
                            "for instructors: grade a folder of students' notebooks of module NN into a gradebook")
    class_parser.add_argument("module", metavar="NN", help=module_help)
    class_parser.add_argument("folder", metavar="FOLDER",
                              help="<student>.ipynb files, or <student>/.../NN_name.ipynb (nbgrader's submitted/)")
    class_parser.add_argument("--out", metavar="PREFIX", help="writes PREFIX.csv and PREFIX.json "
                                                              "(default: gradebook-NN_name)")
    class_parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks graded at once")
    class_parser.add_argument("--timeout", type=float, default=600, help="seconds per notebook (default 600)")
    class_parser.add_argument("--memory", type=float, default=4, help="GiB of memory per process (default 4)")
    class_parser.add_argument("--sandbox", choices=("auto", "bwrap", "rlimit", "none"), default="auto",
                              help="auto (default): bubblewrap where it works, else rlimit (limits, a scratch copy); "
                                   "none: a plain process per notebook (trusted notebooks only)")
    mutants_parser = _command(commands, "mutants", _mutants,
                              "for instructors: grade one-change mutants of module NN's reference; list the survivors")
    mutants_parser.add_argument("module", metavar="NN", help=module_help)
    mutants_parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    mutants_parser.add_argument("--function", metavar="NAME", help="only the mutants of this function (Mul.backward)")
    mutants_parser.add_argument("--json", metavar="PATH", help="also write the summary, every survivor with its body")
    mutants_parser.add_argument("--fail-under", type=float, metavar="PERCENT",
                                help="exit 1 when the score is below this")
    milestone_parser = _command(commands, "milestone", _milestone, "train a real model with the library: mlp, cnn, gpt, finetune")
    milestone_parser.add_argument("name", metavar="NAME", help="mlp (after Module 09), cnn (after Module 11), gpt (after Module 15) or finetune (after Module 20)")
    milestone_parser.add_argument("options", nargs=argparse.REMAINDER, help="the milestone's options (see NAME --help)")
    quantize_parser = _command(commands, "quantize", _quantize, "a trained GPT milestone run in float32, int8 and NF4: "
                               "bytes and validation loss side by side")
    quantize_parser.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of a `python milestones/gpt.py` run "
                                                                "(runs/gpt-shakespeare by default)")
    quantize_parser.add_argument("--calibration-batches", type=int, default=8, metavar="N",
                                 help="batches of 64 training windows that calibrate static int8 (default 8)")
    quantize_parser.add_argument("--observer", choices=("minmax", "percentile"), default="minmax",
                                 help="how static int8 records each layer's input range (default minmax)")
    quantize_parser.add_argument("--percentile", type=float, default=99.99,
                                 help="with --observer percentile: the percentile of the high end (default 99.99)")
    _command(commands, "doctor", _doctor, "check Python, NumPy, CuPy/GPU, Jupyter, the dataset cache and the install")
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
