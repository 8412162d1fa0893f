"""``tinytrain doctor``: check the installation, and say how to fix each problem.

Each check is a function ``_check_<what>(root) -> list[Finding]``; a check that
itself breaks becomes a FAIL finding, never a crash, because a student runs
``doctor`` exactly when something is broken.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from tinytrain.course.diagnose import blame, exported_stubs, reset_advice
from tinytrain.course.gpu import gpu_report
from tinytrain.course.inventory import PACKAGE_DIR, dotted, installed_modules


class Finding(NamedTuple):
    """One line of ``tinytrain doctor``: ``level`` is "ok", "info", "WARN" or "FAIL"."""

    level: str
    what: str
    fix: str = ""

    def text(self) -> str:
        line = f"[{self.level:^4}] {self.what}"
        return line + (f"\n       fix: {self.fix}" if self.fix else "")



def doctor(root: Path | None) -> list[Finding]:
    """Every check of ``tinytrain doctor``, in order."""
    checks = (_check_python, _check_numpy, _check_cupy, _check_install, _check_library, _check_training,
              _check_tools, _check_kernel, _check_data, _check_sandbox)
    findings: list[Finding] = []
    for check in checks:
        try:
            findings += check(root)
        except Exception as error:  # a check that breaks is itself a finding, never a crash
            findings.append(Finding("FAIL", f"{check.__name__.removeprefix('_check_')}: the check itself failed: "
                                    f"{type(error).__name__}: {error}", "report this as a tinytrain bug"))
    return findings


def _check_python(root: Path | None) -> list[Finding]:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 10):
        return [Finding("FAIL", f"Python {version} is too old: tinytrain needs 3.10 or newer",
                        "install Python 3.11 (python.org, pyenv or conda) and reinstall tinytrain with it")]
    return [Finding("ok", f"Python {version} ({sys.executable})")]


def _check_numpy(root: Path | None) -> list[Finding]:
    try:
        import numpy
    except ImportError as error:
        return [Finding("FAIL", f"NumPy does not import: {error}", f"{sys.executable} -m pip install 'numpy>=1.24'")]
    parts = tuple(int(part) for part in numpy.__version__.split(".")[:2] if part.isdigit())
    if parts < (1, 24):
        return [Finding("FAIL", f"NumPy {numpy.__version__} is too old: tinytrain needs 1.24 or newer",
                        f"{sys.executable} -m pip install -U 'numpy>=1.24'")]
    return [Finding("ok", f"NumPy {numpy.__version__}")]


def _check_cupy(root: Path | None) -> list[Finding]:
    """The GPU findings of :func:`tinytrain.course.gpu.gpu_report` (driver, CuPy wheel, devices)."""
    return [Finding("FAIL" if not ok else "info" if fix else "ok", line, fix or "") for ok, line, fix in gpu_report()]


def _install_kind() -> tuple[str, str | None]:
    """("editable" | "regular" | "not installed", version) of the tinytrain distribution."""
    try:
        distribution = metadata.distribution("tinytrain")
    except metadata.PackageNotFoundError:
        return "not installed", None
    direct = distribution.read_text("direct_url.json")
    editable = bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))
    return ("editable" if editable else "regular"), distribution.version


def _check_install(root: Path | None) -> list[Finding]:
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


def _check_library(root: Path | None) -> list[Finding]:
    import tinytrain

    installed = installed_modules()
    owner = {dotted(target): name for name, info in installed.items() for target in info.targets}
    broken = []
    for name in dict.fromkeys([*tinytrain.__all_modules__, *owner]):  # and the files imported on demand (cuda)
        try:
            importlib.import_module(name)
        except Exception as error:
            broken.append((name, error))
    findings = []
    for name, error in broken:
        culprit = blame(error)
        module = culprit.module if culprit is not None else owner.get(name)
        if module and installed[module].exported:
            fix = reset_advice(module)
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


def _check_training(root: Path | None) -> list[Finding]:
    """A few steps of a small CNN, in float32 and in 16-mixed: every module's code on the way is used."""
    findings = [Finding("FAIL", f"module {module} holds your exported code with stubs left: {', '.join(stubs)}",
                        f"fill them in and export again, or {reset_advice(module)}")
                for module, stubs in exported_stubs().items()]
    try:
        _train_a_little()
    except Exception as error:
        culprit = blame(error)
        if culprit is None:
            return findings + [Finding("FAIL", f"a small training run fails: {type(error).__name__}: {error}",
                                       "report this as a tinytrain bug (with the output of tinytrain doctor)")]
        return findings + [Finding("FAIL", f"a small training run fails in {culprit}: {type(error).__name__}: {error}",
                                   reset_advice(culprit.module))]
    return findings + [Finding("ok", "a small CNN trains (tensor, autograd, layers, losses, optimizer, data, Trainer, "
                                     "convolutions, mixed precision)")]


def _train_a_little() -> None:
    import numpy as np

    import tinytrain as tt

    rng = np.random.default_rng(0)
    data = tt.data.TensorDataset(rng.standard_normal((24, 1, 6, 6)).astype(np.float32), rng.integers(0, 3, 24))
    loader = tt.data.DataLoader(data, batch_size=8, shuffle=True, seed=0)
    for precision in ("32-true", "16-mixed"):
        nn = tt.nn
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Dropout(0.1), nn.Linear(36, 3))
        trainer = tt.Trainer(model, tt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                             scheduler=tt.CosineSchedule(0.1, 0.01, total_epochs=2), grad_clip_norm=1.0,
                             precision=precision)
        trainer.fit(loader, loader, epochs=2, accumulation_steps=2, progress=False)


def _check_tools(root: Path | None) -> list[Finding]:
    needed = {
        "pytest": "tinytrain grade and status",
        "jupytext": "tinytrain build",
        "nbformat": "tinytrain build",
        "nbclient": "running notebooks headless",
        "matplotlib": "the lessons' plots",
        "tqdm": "progress bars",
        "ipywidgets": "progress bars as widgets in JupyterLab",
        "numba": "LayerNorm's compiled loops, Module 05 (without it, your Normalize runs every LayerNorm)",
    }
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if not missing:
        return [Finding("ok", "notebook and grading tools: " + ", ".join(needed))]
    uses = "; ".join(f"{name} ({needed[name]})" for name in missing)
    return [Finding("WARN", f"missing: {uses}", f"{sys.executable} -m pip install 'tinytrain[notebooks]' pytest")]


def _check_kernel(root: Path | None) -> list[Finding]:
    fix = f"{sys.executable} -m pip install 'tinytrain[notebooks]' && {sys.executable} -m ipykernel install --user"
    if importlib.util.find_spec("ipykernel") is None or importlib.util.find_spec("jupyter_client") is None:
        return [Finding("FAIL", "no Jupyter kernel: ipykernel / jupyter_client are not installed", fix)]
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return [Finding("FAIL", "no Jupyter kernel named python3", fix)]
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


def _check_data(root: Path | None) -> list[Finding]:
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


def _check_sandbox(root: Path | None) -> list[Finding]:
    """Where ``grade-class`` runs each submission (see tinytrain.course.sandbox)."""
    from tinytrain.course.sandbox import bwrap_status

    works, why = bwrap_status()
    if works:
        return [Finding("ok", f"grading sandbox: bubblewrap ({why}): grade-class runs each notebook in namespaces "
                              "of its own, with limits")]
    return [Finding("info", f"grading sandbox: {why}; grade-class falls back to limits and a scratch copy, which "
                            "cannot hide the instructor's files from a hostile submission",
                    "install bubblewrap (Debian/Ubuntu: apt install bubblewrap) for a real sandbox")]
