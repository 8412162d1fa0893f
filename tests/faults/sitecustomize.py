"""Fault injection for tests/test_faults.py: put this folder first on PYTHONPATH.

Every file-system step a save takes -- opening a file for writing, ``os.fsync``,
``os.replace``, ``os.rename``, ``os.unlink`` -- is counted. With
``TINYTRAIN_KILL_AT=N`` the process SIGKILLs itself just before its N-th step
(nothing after it reaches the disk, as when the machine loses power); with
``TINYTRAIN_COUNT_STEPS=PATH`` it writes how many steps it took to PATH at exit.
Python imports ``sitecustomize`` at start-up, so the process under test needs no
change.
"""
import atexit
import builtins
import os
import signal

_kill_at = int(os.environ.get("TINYTRAIN_KILL_AT", "0"))
_count_file = os.environ.get("TINYTRAIN_COUNT_STEPS")
_steps = 0


def _step() -> None:
    global _steps
    _steps += 1
    if _steps == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def _counted(function):
    def step(*args, **kwargs):
        _step()
        return function(*args, **kwargs)

    return step


if _kill_at or _count_file:
    for _name in ("fsync", "replace", "rename", "unlink"):
        setattr(os, _name, _counted(getattr(os, _name)))
    _open = builtins.open

    def _open_counted(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wxa"):
            _step()
        return _open(file, mode, *args, **kwargs)

    builtins.open = _open_counted
    if _count_file:
        atexit.register(lambda: _open(_count_file, "w").write(str(_steps)))
