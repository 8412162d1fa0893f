"""The ``tinytrain`` command line.

Each subcommand is a function ``_name(args) -> int`` plus one ``_command(...)`` line in
:func:`main` (followed by its arguments). Problems the user can fix raise
:class:`UsageError`: printed without a traceback, exit status 2.

This module imports no optional dependency at import time; a subcommand imports what
it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


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
        result = build.write(root)
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
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
