"""Grading code you did not write: each submission in a sandbox, its verdict taken from outside it.

``tinytrain grade-class`` (and ``tinytrain grade --notebook PATH``) run a student's
export cells, which is running untrusted code on the instructor's machine. Each
notebook is graded by a *child* process that this module starts and watches:

* **What the child may touch.** With ``bwrap`` (bubblewrap: Linux namespaces, no
  privileges needed) the child sees a read-only system, Python and ``tinytrain``
  package, a scratch folder with a copy of the graded checks and of its own notebook
  (read-only) and a writable work folder, a private ``/tmp``, no network, no other
  process, an empty environment and no capabilities; every process it starts dies
  with it (a PID namespace). The ``rlimit`` fallback, for machines without
  bubblewrap, gives the child the same scratch copy, an empty environment and the
  same limits, runs it in a session of its own and kills every process left over,
  but it cannot hide or protect files the instructor's user may read or write.
* **Limits** (:class:`Limits`), set by the child on itself before it runs any of
  the submission's code: wall-clock and CPU time, address space (memory), bytes
  written to any file (output included), no core dumps, and how many processes the
  graded code may start.
* **The verdict.** The checks the grade counts are collected here, in the
  instructor's process, from the project's graded test file. The child runs them and
  streams each check's outcome through a pipe; its standard output is never read
  as a report. Only a run that reaches its end counts: a child that exits early
  (``os._exit(0)``), is killed by a limit or crashes earns 0, and so does one whose
  results show tampering: after the graded checks the child runs two canary checks
  with random names, one that must pass and one that must fail with a random
  message, and it compares the graded test module's and ``tinytrain.course.checks``'
  functions with what it collected. A submission that patches pytest or the grader
  to pass everything, or prints a report of its own, earns 0 and the gradebook says
  why. Code running in the child's own process can in principle still forge a run
  aimed at this harness; what it cannot do in the ``bwrap`` sandbox is read other
  submissions, change any file outside its scratch folder, or outlive its grading.
* **What leaks out.** Messages are cut to :data:`MESSAGE_CHARACTERS` characters
  and stripped of control characters; the CSV gradebook quotes cells a spreadsheet
  would run as a formula.

``python -m tinytrain.course.sandbox`` is the child's entry point (:func:`child_main`).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tinytrain.course.diagnose import Blame, exported_note
from tinytrain.course.grading import Collector, GradeReport, run_checks
from tinytrain.course.inventory import PACKAGE_DIR, UnknownModule, graded_test_files

SANDBOXES = ("auto", "bwrap", "rlimit", "none")
MESSAGE_CHARACTERS = 500  # of each message kept in a report: enough to act on, too little to carry a file
REPORT_BYTES = 4 << 20  # of the child's report read at most
OUTPUT_TAIL = 300  # characters of the child's own output quoted when it dies


@dataclass(frozen=True)
class Limits:
    """What one graded notebook may use. ``seconds`` bounds both the wall-clock time of the
    whole grading and the CPU time of each process; ``memory`` is each process's address space."""

    seconds: float = 600
    memory: int = 4 << 30
    processes: int = 16  # that the graded code may start
    file_bytes: int = 16 << 20  # the most any file it writes may hold, its output included

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {value!r}")


# -- which sandbox -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def bwrap_status() -> tuple[bool, str]:
    """(works, why): whether bubblewrap can start a sandbox on this machine."""
    path = shutil.which("bwrap")
    if path is None:
        return False, "bubblewrap (bwrap) is not installed"
    try:
        result = subprocess.run([path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
                                 "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"{path} does not start: {error}"
    if result.returncode != 0:
        return False, f"{path} cannot make a sandbox here: {result.stderr.strip()[:200]}"
    return True, f"{path} works"


def resolve_sandbox(requested: str) -> str:
    """The sandbox a run uses: ``auto`` is ``bwrap`` where it works, else ``rlimit``; ValueError
    for an unknown name, RuntimeError for ``bwrap`` where it does not work."""
    if requested not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {requested!r}")
    works, why = bwrap_status()
    if requested == "auto":
        return "bwrap" if works else "rlimit"
    if requested == "bwrap" and not works:
        raise RuntimeError(f"--sandbox bwrap: {why}; install the package bubblewrap, or use --sandbox rlimit")
    return requested


# -- the instructor's side -----------------------------------------------------------------------
def expected_checks(root: Path, module: str) -> dict[str, dict]:
    """nodeid -> the check's fields (name, points, hint, ...) of module ``module``'s graded checks,
    collected in this process from the project's own test file: the checks a grade counts, whatever
    a child reports. (pytest runs in the main thread only: call it before starting threads.)"""
    test_file = graded_test_files(root).get(module)
    if test_file is None:
        raise UnknownModule(f"module {module} has no graded checks (tests/graded/test_{module}.py under {root})")
    collector = run_checks([test_file], root=root, collect_only=True)
    if collector.errors:
        raise RuntimeError(f"collecting {test_file} failed: {collector.errors[0]}")
    return {nodeid: asdict(result) for nodeid, result in collector.results.items()}


def grade_isolated(root: Path, module: str, notebook: Path, sandbox: str = "auto", limits: Limits = Limits(),
                   expected: dict[str, dict] | None = None) -> GradeReport:
    """Module ``module``'s graded checks on ``notebook``, run by a child process in ``sandbox``
    (``bwrap``, ``rlimit`` or ``none``: a plain child process, no limits; ``auto`` picks).
    ``expected``: :func:`expected_checks` of the module, when the caller has them already."""
    kind = resolve_sandbox(sandbox)
    if expected is None:
        expected = expected_checks(root, module)
    with tempfile.TemporaryDirectory(prefix="tinytrain-grade-") as scratch_name:
        scratch = _Scratch.make(Path(scratch_name).resolve(), graded_test_files(root)[module], Path(notebook))
        run = _run_child(scratch, module, kind, limits)
    report = _verdict(module, str(notebook), expected, run, scratch.canary, limits)
    for check in report.checks:  # the student's notebook, not its scratch copy, in what a student reads
        check.message = check.message.replace(str(scratch.notebook), str(notebook))
    report.errors = [error.replace(str(scratch.notebook), str(notebook)) for error in report.errors]
    report.sandbox = kind
    if any(check.outcome == "failed" and check.cause is None for check in report.checks):
        note = exported_note("a failure here", besides=module)
        report.notes += [note] if note else []
    return report


@dataclass(frozen=True)
class _Canary:
    passes: str  # the name of the check that must pass
    fails: str  # the name of the check that must fail ...
    secret: str  # ... with this message


@dataclass(frozen=True)
class _Scratch:
    """The child's world: read-only copies of the checks and the notebook, a writable work folder."""

    folder: Path
    checks: Path  # tests/graded/ with the conftest and the module's test file
    canary_file: Path
    canary: _Canary
    notebook: Path
    work: Path  # the child's working folder and home: the one place it may write

    @classmethod
    def make(cls, folder: Path, test_file: Path, notebook: Path) -> _Scratch:
        checks = folder / "checks" / "tests" / "graded"
        checks.mkdir(parents=True)
        for source in (test_file.parent / "conftest.py", test_file):
            shutil.copyfile(source, checks / source.name)
        token = secrets.token_hex(8)
        canary = _Canary(f"test_{token}_passes", f"test_{token}_fails", secrets.token_hex(16))
        canary_file = folder / "checks" / "canary" / f"test_canary_{token}.py"
        canary_file.parent.mkdir()
        canary_file.write_text(f"def {canary.passes}():\n    pass\n\n\n"
                               f"def {canary.fails}():\n    raise AssertionError({canary.secret!r})\n")
        (folder / "notebook").mkdir()
        copy = folder / "notebook" / notebook.name
        shutil.copyfile(notebook, copy)
        work = folder / "work"
        work.mkdir()
        for path in (*checks.iterdir(), canary_file, copy):
            path.chmod(0o444)
        return cls(folder, checks, canary_file, canary, copy, work)


@dataclass
class _ChildRun:
    events: list[dict]
    returncode: int | None  # None: stopped at the time limit
    output: str  # the tail of what the child printed
    report_too_long: bool = False


def _environment(scratch: _Scratch) -> dict[str, str]:
    """The child's whole environment: nothing of the instructor's (names and values would leak)."""
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(scratch.work), "TMPDIR": str(scratch.work),
                   "LANG": "C.UTF-8", "PYTHONPATH": str(PACKAGE_DIR.parent), "PYTHONDONTWRITEBYTECODE": "1",
                   "PYTHONNOUSERSITE": "1", "MPLBACKEND": "Agg", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if "TINYTRAIN_CHECK_TIMEOUT" in os.environ:  # the instructor's time limit per check (tests/graded/conftest.py)
        environment["TINYTRAIN_CHECK_TIMEOUT"] = os.environ["TINYTRAIN_CHECK_TIMEOUT"]
    return environment


def _run_child(scratch: _Scratch, module: str, kind: str, limits: Limits) -> _ChildRun:
    read_end, write_end = os.pipe()
    command = [sys.executable, "-m", "tinytrain.course.sandbox", "--module", module, "--checks", str(scratch.checks),
               "--canary", str(scratch.canary_file), "--notebook", str(scratch.notebook), "--report-fd",
               str(write_end)]
    if kind != "none":
        command += ["--limits", json.dumps(asdict(limits))]
    if kind == "bwrap":
        command = _bwrap_arguments(scratch) + command
    with tempfile.TemporaryFile() as output, _orphans_reaped(kind == "rlimit"):
        process = _start(command, scratch, output, write_end)
        reader = _Reader(read_end)
        try:
            returncode = process.wait(timeout=limits.seconds)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            _end(process)
        if kind == "bwrap" and returncode is not None and returncode > 128:
            returncode = 128 - returncode  # bwrap exits with 128 + the signal that killed its child
        output.seek(0, os.SEEK_END)
        output.seek(max(0, output.tell() - 4 * OUTPUT_TAIL))
        tail = output.read().decode("utf-8", errors="replace")
    return _ChildRun(reader.events(), returncode, tail, reader.too_long)


def _start(command: list[str], scratch: _Scratch, output: Any, report_fd: int) -> subprocess.Popen:
    """The child, in a session of its own, its output into ``output``, registered as a grader at once
    (a grading that ends meanwhile must not take it for an orphan)."""
    with _subreaper_lock:
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       pass_fds=(report_fd,), env=_environment(scratch), cwd=scratch.work,
                                       start_new_session=True)
        finally:
            os.close(report_fd)  # the child's copy is the only one: the report ends when the child's processes do
        _graders.add(process.pid)
    return process


def _end(process: subprocess.Popen) -> None:
    """Kill whatever the child left running in its session (with bwrap: its whole PID namespace)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    with _subreaper_lock:
        _graders.discard(process.pid)


def _bwrap_arguments(scratch: _Scratch) -> list[str]:
    """bubblewrap's command line: a read-only view of what Python needs, the scratch folder, nothing else."""
    arguments = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL",
                 "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            arguments += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            arguments += ["--ro-bind", top, top]
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives"):
        arguments += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    python = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), str(PACKAGE_DIR),
              *(sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib"))}
    for path in sorted(python):  # a parent before its children, so each bind lands inside the last
        if os.path.exists(path) and not path.startswith("/usr/"):
            arguments += ["--ro-bind", path, path]
    arguments += ["--bind", str(scratch.folder), str(scratch.folder)]
    for read_only in (scratch.checks.parent.parent, scratch.notebook.parent):
        arguments += ["--ro-bind", str(read_only), str(read_only)]
    return arguments + ["--chdir", str(scratch.work), "--"]


_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_subreaper_users = 0
_subreaper_lock = threading.Lock()
_graders: set[int] = set()  # this process's own children that are graders now running


@contextlib.contextmanager
def _orphans_reaped(enabled: bool):
    """Without a PID namespace, a process that leaves its session (a double fork and ``setsid``)
    escapes ``killpg``. While this is active, this process adopts such orphans (Linux's child
    subreaper) and kills every child of its own that is not a grader when a grading ends."""
    global _subreaper_users
    prctl = _prctl() if enabled else None
    if prctl is None:
        yield
        return
    with _subreaper_lock:
        _subreaper_users += 1
        if _subreaper_users == 1:
            prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        _kill_adopted()
        with _subreaper_lock:
            _subreaper_users -= 1
            if _subreaper_users == 0:
                prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _kill_adopted() -> None:
    """SIGKILL and reap every child of this process that is not a running grader: while
    submissions are graded, the only other children it has are orphans it adopted."""
    with _subreaper_lock:
        orphans = _children(os.getpid()) - _graders
    for pid in orphans:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _children(parent: int) -> set[int]:
    """The pids whose parent is ``parent`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (name) ": state, ppid, ...
        if int(fields[1]) == parent:
            found.add(int(entry.name))
    return found


class _Reader(threading.Thread):
    """Reads the child's report pipe to its end (or :data:`REPORT_BYTES`) while the child runs."""

    def __init__(self, descriptor: int) -> None:
        super().__init__(daemon=True)
        self.descriptor, self.data, self.too_long = descriptor, bytearray(), False
        self.start()

    def run(self) -> None:
        try:
            while chunk := os.read(self.descriptor, 1 << 16):
                if len(self.data) + len(chunk) > REPORT_BYTES:
                    self.too_long = True
                    break
                self.data += chunk
        finally:
            os.close(self.descriptor)

    def events(self) -> list[dict]:
        self.join()
        events = []
        for line in bytes(self.data).splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


def _verdict(module: str, notebook: str, expected: dict[str, dict], run: _ChildRun, canary: _Canary,
             limits: Limits) -> GradeReport:
    """The grade of a child's run: the expected checks, with the outcomes it reported when the run
    reached its end and passed its canaries; 0 points and the reason otherwise."""
    collector = Collector(notebook)
    for nodeid, fields in expected.items():
        collector.results[nodeid] = Collector.result_from(fields)
    finished = next((event for event in run.events if event.get("event") == "finished"), None)
    problem = _death(run, limits) or (None if finished else
                                      "the grading process stopped before its checks ended: nothing of it counts")
    canaries: dict[str, dict] = {}
    for event in run.events:
        if event.get("event") != "check" or not isinstance(event.get("nodeid"), str):
            continue
        nodeid, name = event["nodeid"], event["nodeid"].rpartition("::")[2]
        if name in (canary.passes, canary.fails):
            canaries.setdefault(name, {}).update({event.get("when"): event})
        elif nodeid in collector.results and problem is None:
            result = collector.record(nodeid, str(event.get("when")), str(event.get("outcome")),
                                      clean(event.get("message")))
            if event.get("hint"):
                result.hint = clean(event["hint"])
            cause = _blame_from(event.get("cause"))
            if cause is not None:
                result.cause = cause
    report = collector.report(module)
    if problem is None:
        problem = _tampering(finished, canaries, canary)
    if problem is not None:
        problem = clean(problem)  # it may quote the student's output: cut as the checks' messages are
        for check in report.checks:  # each check earns nothing, each row of the gradebook saying why
            check.outcome, check.message, check.cause, check.blocked_by = "unrun", problem, None, []
        report.errors = [problem]
    else:
        report.errors = [clean(error) for error in finished.get("errors", []) if isinstance(error, str)]
    return report


def _death(run: _ChildRun, limits: Limits) -> str | None:
    """Why a child's run does not count, from how it ended; None when it ended well."""
    if run.returncode is None:
        return f"grading stopped after {limits.seconds:g} s (the time limit; an endless loop?)"
    if run.report_too_long:
        return f"the grading process reported more than {REPORT_BYTES >> 20} MiB: nothing of it counts"
    if run.returncode == 0:
        return None
    if run.returncode < 0:  # Python's own dump of where it crashed says nothing about the student's code
        signal_number = -run.returncode
        why = {signal.SIGXCPU: f" (it used more than {limits.seconds:g} s of CPU time)",
               signal.SIGSEGV: " (a crash: the code touched memory it does not own)",
               signal.SIGKILL: " (killed, perhaps for memory)"}.get(signal_number, "")
        return f"the grading process was killed by {signal.Signals(signal_number).name}{why}"
    output = clean(run.output[-OUTPUT_TAIL:], OUTPUT_TAIL).strip()
    return f"the grading process stopped with exit status {run.returncode}" + \
        (f"; its last output: {output}" if output else "")


def _tampering(finished: dict, canaries: dict[str, dict], canary: _Canary) -> str | None:
    """Why a finished run's results cannot be trusted, or None."""
    tampered = finished.get("tampered")
    if tampered:
        return f"the graded code changed the grader ({clean(tampered, 200)}): nothing of this run counts"
    passed = canaries.get(canary.passes, {}).get("call", {})
    failed = canaries.get(canary.fails, {}).get("call", {})
    if passed.get("outcome") != "passed" or failed.get("outcome") != "failed" or \
            canary.secret not in str(failed.get("message", "")):
        return ("the grader's own control checks came back wrong (one must pass, one must fail): the graded code "
                "changed how checks are run or reported; nothing of this run counts")
    return None


def _blame_from(fields: Any) -> Blame | None:
    if not isinstance(fields, dict):
        return None
    try:
        module, line = str(fields["module"]), int(fields["line"])
    except (KeyError, TypeError, ValueError):
        return None
    if not re.fullmatch(r"\d\d_\w+", module):
        return None
    return Blame(module, Path(clean(fields.get("path"), 200)), line, clean(fields.get("function"), 100))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: Any, limit: int = MESSAGE_CHARACTERS) -> str:
    """``text`` as a string without control characters (tabs and newlines kept), cut to ``limit``
    characters, the note of how many were cut included."""
    text = _CONTROL.sub("", "" if text is None else str(text))
    if len(text) <= limit:
        return text
    kept = limit - len(f"... ({len(text)} more characters)")
    return text[:kept] + f"... ({len(text) - kept} more characters)"


# -- the child's side ----------------------------------------------------------------------------
def child_main(argv: list[str] | None = None) -> int:
    """Grade ``--notebook``'s module ``--module`` with the checks in ``--checks`` and then the
    ``--canary`` checks, streaming each check's outcome as a JSON line to ``--report-fd``."""
    parser = argparse.ArgumentParser(prog="python -m tinytrain.course.sandbox")
    parser.add_argument("--module", required=True)
    parser.add_argument("--checks", type=Path, required=True)
    parser.add_argument("--canary", type=Path, required=True)
    parser.add_argument("--notebook", type=Path, required=True)
    parser.add_argument("--report-fd", type=int, required=True)
    parser.add_argument("--limits", type=json.loads)
    args = parser.parse_args(argv)
    report = os.fdopen(args.report_fd, "w", encoding="utf-8")
    if args.limits is not None:
        _limit_self(Limits(**args.limits))
    test_file = next(args.checks.glob(f"test_{args.module}.py"))
    watcher = _Watcher(report)
    collector = run_checks([test_file, args.canary], args.notebook, root=args.checks.parent.parent,
                           plugins=[watcher], confcutdir=args.checks.parent.parent)
    watcher.send({"event": "finished", "errors": [clean(error) for error in collector.errors],
                  "tampered": watcher.tampered()})
    report.close()
    return 0


class _Watcher:
    """pytest plugin of the child: streams every check's phases, and notes whether the functions
    the checks run changed between collection and the end of the run."""

    def __init__(self, report: Any) -> None:
        self.report = report
        self.collector: Collector | None = None
        self.originals: dict[str, Any] = {}

    def send(self, event: dict) -> None:
        self.report.write(json.dumps(event) + "\n")
        self.report.flush()

    def pytest_collection_modifyitems(self, session: Any, items: list[Any]) -> None:
        from tinytrain.course import checks

        self.collector = next(plugin for plugin in session.config.pluginmanager.get_plugins()
                              if isinstance(plugin, Collector))
        modules = {id(checks): checks, **{id(item.module): item.module for item in items}}
        for module in modules.values():
            for name, value in vars(module).items():
                self.originals[f"{module.__name__}.{name}"] = (module, name, value,
                                                              getattr(value, "__code__", None))

    def pytest_runtest_logreport(self, report: Any) -> None:
        from tinytrain.course.grading import _failure_message, _skip_reason

        result = self.collector.results.get(report.nodeid) if self.collector else None
        message = _failure_message(report) if report.failed else _skip_reason(report) if report.skipped else ""
        cause = None if result is None or result.cause is None else asdict(result.cause)
        self.send({"event": "check", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                   "message": clean(message, 2000), "hint": None if result is None else clean(result.hint, 2000),
                   "cause": None if cause is None else {**cause, "path": str(cause["path"])}})

    def tampered(self) -> str | None:
        """The first function of the checks whose object or code changed since collection, or None."""
        for qualified, (module, name, value, code) in self.originals.items():
            now = vars(module).get(name)
            if now is not value or getattr(now, "__code__", None) is not code:
                return f"{qualified} was replaced"
        return None


def _limit_self(limits: Limits) -> None:
    """Apply ``limits`` to this process (and so to every process it starts); the graded code can
    lower them further but never raise them."""
    import resource

    seconds = int(limits.seconds) + 1
    wanted = {resource.RLIMIT_AS: limits.memory, resource.RLIMIT_FSIZE: limits.file_bytes, resource.RLIMIT_CORE: 0,
              resource.RLIMIT_CPU: seconds}
    if os.geteuid() != 0:  # root's processes are not counted; the audit hook below still limits them
        wanted[resource.RLIMIT_NPROC] = _processes_of_this_user() + limits.processes
    for which, value in wanted.items():
        # CPU: SIGXCPU at the soft limit, SIGKILL at the hard one for a process that ignores it
        resource.setrlimit(which, (value, value + 2 if which == resource.RLIMIT_CPU else value))
    _count_processes(limits.processes)


def _processes_of_this_user() -> int:
    uid = os.getuid()
    count = 0
    for entry in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            if any(line.split()[1:2] == [str(uid)] for line in entry.read_text().splitlines() if line.startswith("Uid:")):
                count += 1
    return count


_STARTS_A_PROCESS = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.system",
                     "pty.spawn"}


def _count_processes(limit: int) -> None:
    """Refuse the graded code's process ``limit + 1``-th start (an audit hook cannot be removed)."""
    started = 0

    def hook(event: str, arguments: tuple) -> None:
        nonlocal started
        if event in _STARTS_A_PROCESS:
            started += 1
            if started > limit:
                raise PermissionError(f"the graded code may start at most {limit} processes")

    sys.addaudithook(hook)


if __name__ == "__main__":
    sys.exit(child_main())
