"""The ``tinytrain`` command line.

    tinytrain build [--check] [--force]        notebooks and library files from modules/
    tinytrain grade NN [--notebook P] [--json] module NN's graded checks on the student's notebook
                                               (--installed: on the code installed in the package)
    tinytrain export NN [--notebook P]         the notebook's code into the installed package
    tinytrain reset NN                         the reference code back into the package
    tinytrain status                           per module: whose code is installed, do its checks pass
    tinytrain milestone mlp|cnn [options]      train a real model end to end
    tinytrain doctor                           check the installation; a fix for each problem

Each subcommand is a function ``_name(args) -> int`` plus one ``_command(...)`` line in
:func:`main` (followed by its arguments). Problems the user can fix raise
:class:`UsageError`: printed without a traceback, exit status 2.

This module imports no optional dependency at import time; a subcommand imports what
it needs when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple


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
        from tinytrain import build
    except ModuleNotFoundError as error:
        if (error.name or "").startswith("tinytrain"):
            raise
        raise UsageError(f"tinytrain build needs {error.name}: pip install 'tinytrain[notebooks]'") from None
    root = _root(args)
    try:
        if args.check:
            return _report_stale(root, build.stale(root))
        result = build.write(root, force=args.force)
    except build.BuildError as error:
        raise UsageError(str(error)) from None
    for path in result.written:
        print(f"wrote {path.relative_to(root).as_posix()}")
    for path in result.removed:
        print(f"removed {path.relative_to(root).as_posix()} (no module exports it any more)")
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
    print(f"{len(stale)} generated file(s) differ from the module sources; run `tinytrain build`")
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
    from tinytrain.grading import PACKAGE_DIR

    parent = PACKAGE_DIR.parent
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
    from tinytrain import grading

    try:
        return grading.resolve_module(args.module, root)
    except grading.UnknownModule as error:
        raise UsageError(str(error)) from None


def _notebook(args: argparse.Namespace, root: Path, module: str) -> Path:
    """``--notebook``, else ``notebooks/NN_name.ipynb`` of the project; it must exist."""
    from tinytrain import grading

    if args.notebook is not None:
        path = Path(args.notebook)
        try:
            path = grading.find_notebook(path, module)
        except grading.NotebookError as error:
            raise UsageError(str(error)) from None
        if not path.is_file():
            raise UsageError(f"notebook {args.notebook} does not exist")
        return path
    path = root / "notebooks" / f"{module}.ipynb"
    if not path.is_file():
        raise UsageError(f"notebook {path} does not exist; pass --notebook PATH to grade another file")
    return path


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when below it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _grade(args: argparse.Namespace) -> int:
    """``tinytrain grade NN``: run module NN's graded checks on the student's notebook."""
    from tinytrain import grading

    root = _needs_root(args, "tinytrain grade")
    module = _module(args, root)
    if module not in grading.graded_test_files(root):
        raise UsageError(f"module {module} has no graded checks yet (tests/graded/test_{module}.py)")
    notebook = None if args.installed else _notebook(args, root, module)
    if notebook is not None:
        try:
            belongs = grading.notebook_module(notebook, grading.read_export_cells(notebook))
        except grading.NotebookError as error:
            raise UsageError(str(error)) from None
        if belongs is not None and belongs != module:
            raise UsageError(f"{notebook} is the notebook of module {belongs}, not {module}; "
                             f"grade it with `tinytrain grade {belongs[:2]}`")
    _require("pytest", "tinytrain grade")
    report = grading.grade(module, root, notebook)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        _print_report(report)
    return 0 if report.passed else 1


def _print_report(report) -> None:
    what = _shown(Path(report.notebook)) if report.notebook else "the installed package"
    print(f"Module {report.module}: graded checks on {what}")
    loads = not (report.notebook and report.errors)
    for error in report.errors:
        print(f"error: {error}")
    width = max((len(_check_name(check.name)) for check in report.checks), default=10)
    for check in report.checks:
        label = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[check.outcome]
        score = f"{check.earned}/{check.points}" if check.outcome != "skipped" else f"-/{check.points}"
        line = f"  {label}  {_check_name(check.name):<{width}}  {score:>5}"
        if check.outcome == "failed" and loads:
            line += f"  {check.message}"
        elif check.outcome == "skipped":
            line += f"  ({check.message})"
        print(line)
        if check.outcome == "failed":
            print(f"        hint: {check.hint}")
    print(f"Total: {report.earned}/{report.possible} points")


def _check_name(name: str) -> str:
    return name.removeprefix("test_")


def _require(distribution: str, what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(distribution) is None:
        raise UsageError(f"{what} needs {distribution}: pip install {distribution}")


def _export(args: argparse.Namespace) -> int:
    """``tinytrain export NN``: write the notebook's code for module NN into the package."""
    from tinytrain import grading

    root = _needs_root(args, "tinytrain export")
    module = _module(args, root)
    notebook = _notebook(args, root, module)
    try:
        result = grading.export(notebook, module)
    except (grading.NotebookError, grading.UnknownModule) as error:
        raise UsageError(f"not exported: {error}") from None
    print(f"exported module {module} from {_shown(notebook)} into the package:")
    for path in result.written:
        print(f"  {_shown(path)}")
    print(f"the replaced files are kept in {_shown(result.backups)}")
    for warning in result.warnings:
        print(f"warning: {warning}")
    stubs = grading.stubbed_functions(notebook)
    if stubs:
        print(f"warning: still stubs (they raise NotImplementedError): {', '.join(stubs)}; later modules and the "
              "milestones that call them will fail")
    print(f"`tinytrain grade {module[:2]} --installed` checks it; `tinytrain reset {module[:2]}` puts the reference back.")
    return 0


def _reset(args: argparse.Namespace) -> int:
    """``tinytrain reset NN``: put module NN's reference code back into the package."""
    from tinytrain import grading

    root = _project_root(args)
    module = _module(args, root)
    try:
        changed = grading.reset(module, root)
    except (grading.NotebookError, grading.UnknownModule) as error:
        raise UsageError(str(error)) from None
    if not changed:
        print(f"module {module}: the package already holds the reference code")
    for path, how in changed:
        print(f"reset {_shown(path)} ({how})")
    return 0


def _status(args: argparse.Namespace) -> int:
    """``tinytrain status``: per module, whose code is installed and whether its checks pass."""
    from tinytrain import grading

    root = _project_root(args)
    installed = grading.installed_modules()
    tests = grading.graded_test_files(root) if root is not None else {}
    reports = {}
    if tests and not args.no_checks:
        _require("pytest", "tinytrain status (use --no-checks to skip the graded checks)")
        collector = grading.run_checks(list(tests.values()), None, root)
        for module in tests:
            reports[module] = grading.GradeReport(module, None, [])
        for result in collector.results.values():
            module = grading.module_of_test_file(result.nodeid.split("::")[0])
            reports.setdefault(module, grading.GradeReport(module, None, [])).checks.append(result)
        for error in collector.errors:
            for module, path in tests.items():
                if path.name in error:
                    reports[module].errors.append(error)
    names = sorted(set(installed) | set(tests) | set(grading.source_modules(root)))
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
            checks = f"{report.earned}/{report.possible} points"
            if report.errors and not report.checks:
                checks += ", checks do not load"
            elif failing:
                checks += f", {len(failing)} check(s) fail: {', '.join(_check_name(c.name) for c in failing[:4])}"
                checks += ", ..." if len(failing) > 4 else ""
            else:
                checks += ", all pass"
        elif module in tests:
            checks = "not run (--no-checks)"
        else:
            checks = "no graded checks"
        rows.append((module, code, checks))
    if args.json:
        print(json.dumps([{"module": m, "code": c, "checks": k} for m, c, k in rows], indent=2))
        return 0
    width = max((len(m) for m, _, _ in rows), default=6)
    code_width = max([len("installed code")] + [len(c) for _, c, _ in rows])
    print(f"{'module':<{width}}  {'installed code':<{code_width}}  graded checks on the installed code")
    for module, code, checks in rows:
        print(f"{module:<{width}}  {code:<{code_width}}  {checks}")
    return 0


# -- milestones and doctor -----------------------------------------------------------------------
def _milestone(args: argparse.Namespace) -> int:
    """``tinytrain milestone NAME [options]``: run a milestone training script.

    Asks for one BLAS thread unless the environment already chose: the matrix
    products of these small networks are too small to share, and on a busy
    2-core machine a second thread mostly waits (epochs measured 4-15x slower).
    This must happen before NumPy is imported.
    """
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    try:
        from tinytrain import milestones
    except ModuleNotFoundError as error:
        if (error.name or "").startswith("tinytrain"):
            raise UsageError("this tinytrain has no milestones module") from None
        raise
    available = sorted(getattr(milestones, "MILESTONES", {}))
    if args.name not in available:
        later = " (the CNN milestone arrives with Module 09, convolutions)" if args.name == "cnn" else ""
        raise UsageError(f"no milestone {args.name!r} yet{later}; available: {', '.join(available) or 'none'}")
    return int(milestones.main(args.name, args.options) or 0)


class Finding(NamedTuple):
    """One line of ``tinytrain doctor``: ``level`` is "ok", "info", "WARN" or "FAIL"."""

    level: str
    what: str
    fix: str = ""

    def text(self) -> str:
        line = f"[{self.level:^4}] {self.what}"
        return line + (f"\n       fix: {self.fix}" if self.fix else "")


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


def doctor(root: Path | None) -> list[Finding]:
    """Every check of ``tinytrain doctor``, in order."""
    checks = (_doctor_python, _doctor_numpy, _doctor_cupy, _doctor_install, _doctor_library,
              _doctor_tools, _doctor_kernel, _doctor_data)
    findings: list[Finding] = []
    for check in checks:
        try:
            findings += check(root)
        except Exception as error:  # a check that breaks is itself a finding, never a crash
            findings.append(Finding("FAIL", f"{check.__name__.removeprefix('_doctor_')}: the check itself failed: "
                                    f"{type(error).__name__}: {error}", "report this as a tinytrain bug"))
    return findings


def _doctor_python(root: Path | None) -> list[Finding]:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 10):
        return [Finding("FAIL", f"Python {version} is too old: tinytrain needs 3.10 or newer",
                        "install Python 3.11 (python.org, pyenv or conda) and reinstall tinytrain with it")]
    return [Finding("ok", f"Python {version} ({sys.executable})")]


def _doctor_numpy(root: Path | None) -> list[Finding]:
    try:
        import numpy
    except ImportError as error:
        return [Finding("FAIL", f"NumPy does not import: {error}", f"{sys.executable} -m pip install 'numpy>=1.24'")]
    parts = tuple(int(part) for part in numpy.__version__.split(".")[:2] if part.isdigit())
    if parts < (1, 24):
        return [Finding("FAIL", f"NumPy {numpy.__version__} is too old: tinytrain needs 1.24 or newer",
                        f"{sys.executable} -m pip install -U 'numpy>=1.24'")]
    return [Finding("ok", f"NumPy {numpy.__version__}")]


def _doctor_cupy(root: Path | None) -> list[Finding]:
    """The GPU findings of ``tinytrain.cuda.gpu_report`` (driver, CuPy wheel, devices)."""
    try:
        from tinytrain.cuda import gpu_report
    except Exception as error:  # e.g. a broken export of Module 01 or 10
        return [Finding("FAIL", f"tinytrain.cuda does not import: {type(error).__name__}: {error}",
                        "tinytrain reset 10 (or 01) restores the reference")]
    return [Finding("FAIL" if not ok else "info" if fix else "ok", line, fix or "") for ok, line, fix in gpu_report()]


def _install_kind() -> tuple[str, str | None]:
    """("editable" | "regular" | "not installed", version) of the tinytrain distribution."""
    from importlib import metadata

    try:
        distribution = metadata.distribution("tinytrain")
    except metadata.PackageNotFoundError:
        return "not installed", None
    direct = distribution.read_text("direct_url.json")
    editable = bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))
    return ("editable" if editable else "regular"), distribution.version


def _doctor_install(root: Path | None) -> list[Finding]:
    import os

    from tinytrain.grading import PACKAGE_DIR

    kind, version = _install_kind()
    findings = []
    where = f"tinytrain package at {PACKAGE_DIR}"
    if kind == "not installed":
        findings.append(Finding("WARN", f"{where} is not installed (imported from the working directory)",
                                "in the project folder: pip install -e '.[notebooks]'"))
    else:
        findings.append(Finding("ok", f"{where}: {kind} install, version {version}"))
        if kind == "regular" and root is not None:
            findings.append(Finding("WARN", f"tinytrain is installed as a copy: `tinytrain export` changes that copy, "
                                            f"`tinytrain build` in {root} does not reach it",
                                    f"cd {root} && pip install -e '.[notebooks]'"))
    if not os.access(PACKAGE_DIR, os.W_OK):
        findings.append(Finding("WARN", f"{PACKAGE_DIR} is not writable: `tinytrain export` cannot install your code",
                                "install tinytrain where you can write, e.g. in a virtual environment: "
                                "python -m venv .venv && .venv/bin/pip install -e '.[notebooks]'"))
    if root is None:
        findings.append(Finding("info", "no tinytrain project here (notebooks/, tests/graded/): `grade` and `export` "
                                        "need one; run them in the project folder or pass --root"))
    return findings


def _doctor_library(root: Path | None) -> list[Finding]:
    import importlib

    import tinytrain
    from tinytrain import grading

    installed = grading.installed_modules()
    owner = {grading.dotted(target): name for name, info in installed.items() for target in info.targets}
    broken = []
    for name in tinytrain.__all_modules__:
        try:
            importlib.import_module(name)
        except Exception as error:
            broken.append((name, error))
    findings = []
    for name, error in broken:
        module = owner.get(name)
        if module and installed[module].exported:
            fix = f"tinytrain reset {module[:2]} (then fix your notebook and export it again)"
        elif root is not None:
            fix = f"cd {root} && tinytrain build && pip install -e ."
        else:
            fix = "pip install --force-reinstall tinytrain"
        findings.append(Finding("FAIL", f"{name} does not import: {type(error).__name__}: {error}", fix))
    exported = [info for info in installed.values() if info.exported]
    if not broken:
        findings.append(Finding("ok", f"the library imports ({len(installed)} modules installed)"))
    for info in exported:
        findings.append(Finding("info", f"module {info.name} holds your exported code (from "
                                        f"{', '.join(sorted(set(info.exported.values())))}); "
                                        f"`tinytrain reset {info.number}` puts the reference back"))
    return findings


def _doctor_tools(root: Path | None) -> list[Finding]:
    import importlib.util

    needed = {
        "pytest": "tinytrain grade and status",
        "jupytext": "tinytrain build",
        "nbformat": "tinytrain build",
        "nbclient": "running notebooks headless",
        "matplotlib": "the lessons' plots",
        "tqdm": "progress bars",
        "ipywidgets": "progress bars as widgets in JupyterLab",
    }
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if not missing:
        return [Finding("ok", "notebook and grading tools: " + ", ".join(needed))]
    uses = "; ".join(f"{name} ({needed[name]})" for name in missing)
    return [Finding("WARN", f"missing: {uses}", f"{sys.executable} -m pip install 'tinytrain[notebooks]' pytest")]


def _doctor_kernel(root: Path | None) -> list[Finding]:
    import importlib.util
    import subprocess

    from tinytrain.grading import PACKAGE_DIR

    fix = f"{sys.executable} -m pip install 'tinytrain[notebooks]' && {sys.executable} -m ipykernel install --user"
    if importlib.util.find_spec("ipykernel") is None or importlib.util.find_spec("jupyter_client") is None:
        return [Finding("FAIL", "no Jupyter kernel: ipykernel / jupyter_client are not installed", fix)]
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return [Finding("FAIL", "no Jupyter kernel named python3", fix)]
    import shutil

    python = spec.argv[0] if spec.argv else "python"
    python = sys.executable if python == "{python}" else shutil.which(python) or python
    try:
        result = subprocess.run([python, "-c", "import tinytrain; print(tinytrain.__file__)"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [Finding("FAIL", f"the python3 kernel's interpreter {python} does not run: {error}", fix)]
    if result.returncode != 0:
        return [Finding("FAIL", f"the python3 Jupyter kernel ({python}) cannot import tinytrain",
                        f"{sys.executable} -m ipykernel install --user  (a kernel for this Python, which has tinytrain)")]
    found = Path(result.stdout.strip()).resolve().parent
    if found != PACKAGE_DIR:
        return [Finding("WARN", f"the python3 Jupyter kernel ({python}) imports another tinytrain ({found})",
                        f"{sys.executable} -m ipykernel install --user  (a kernel for this Python)")]
    return [Finding("ok", f"Jupyter kernel python3 ({python}) imports this tinytrain")]


def _doctor_data(root: Path | None) -> list[Finding]:
    import os
    import tempfile

    configured = os.environ.get("TINYTRAIN_DATA")
    try:
        from tinytrain.datasets import data_dir

        folder = data_dir()
    except Exception:  # the same rule as tinytrain.datasets.data_dir, for a broken package
        cache = os.environ.get("XDG_CACHE_HOME")
        folder = Path(configured).expanduser() if configured else (Path(cache) if cache else Path.home() / ".cache") / "tinytrain"
    fix = "export TINYTRAIN_DATA=/a/folder/you/can/write (or pass root= to the dataset)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
            pass
    except OSError as error:
        return [Finding("FAIL", f"dataset cache {folder} is not writable: {error}", fix)]
    source = "$TINYTRAIN_DATA" if configured else "default"
    return [Finding("ok", f"dataset cache {folder} ({source}) is writable; Digits needs no download")]


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
    build = _command(commands, "build", _build, "generate tinytrain/ library files and notebooks/ from modules/")
    build.add_argument("--check", action="store_true", help="change nothing; exit 1 if any generated file is stale")
    build.add_argument("--force", action="store_true",
                       help="replace notebooks even when they hold work (filled-in solutions or outputs)")
    grade = _command(commands, "grade", _grade, "run module NN's graded checks on the code in your notebook")
    grade.add_argument("module", metavar="NN", help="the module: its number (03) or name (03_activations)")
    grade.add_argument("--notebook", metavar="PATH", help="the notebook to grade (default: notebooks/NN_name.ipynb)")
    grade.add_argument("--installed", action="store_true", help="grade the code installed in the package instead")
    grade.add_argument("--json", action="store_true", help='print {"module", "earned", "possible", "checks"} as JSON')
    export = _command(commands, "export", _export, "write your notebook's code for module NN into the package")
    export.add_argument("module", metavar="NN", help="the module: its number (03) or name (03_activations)")
    export.add_argument("--notebook", metavar="PATH", help="the notebook to export (default: notebooks/NN_name.ipynb)")
    reset = _command(commands, "reset", _reset, "put module NN's reference code back into the package")
    reset.add_argument("module", metavar="NN", help="the module: its number (03) or name (03_activations)")
    status = _command(commands, "status", _status, "per module: whose code is installed, and do its graded checks pass")
    status.add_argument("--no-checks", action="store_true", help="only say whose code is installed")
    status.add_argument("--json", action="store_true", help="print the table as JSON")
    milestone = _command(commands, "milestone", _milestone, "train a real model with the library: mlp, cnn")
    milestone.add_argument("name", metavar="NAME", help="mlp (after Module 08) or cnn (after Module 09)")
    milestone.add_argument("options", nargs=argparse.REMAINDER, help="the milestone's options (see NAME --help)")
    _command(commands, "doctor", _doctor, "check Python, NumPy, CuPy/GPU, Jupyter, the dataset cache and the install")
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
