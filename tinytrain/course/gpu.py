"""The GPU part of ``tinytrain doctor``: is the right CuPy installed, and does it reach the GPU?

CuPy ships one wheel per CUDA major version (``cupy-cuda12x``, ``cupy-cuda13x``);
the one that works depends on the NVIDIA driver's CUDA version and on the CUDA
libraries the wheel loads (Module 12, section 11, explains it). :func:`gpu_report`
reads the driver's CUDA version straight from the driver library (so it works
before CuPy is installed), the installed CuPy packages from ``importlib.metadata``,
and finally runs a tiny kernel and a cuBLAS product on ``cuda:0``; every problem
comes with the command that fixes it.

Hand-written tooling, not the student's: it imports no library module, so it
reports on the GPU even when a student's exported Module 01 or 12 does not import.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import re
import sys


_CUPY_PACKAGE = re.compile(r"^cupy(?:-cuda(\d+)(x?)|-rocm-[\d-]+)?$")


def _cuda_text(version: int) -> str:
    """CUDA's integer version as text: 12040 -> "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _cupy_packages() -> list[tuple[str, str]]:
    """``(name, version)`` of every installed CuPy distribution (cupy, cupy-cuda12x, ...)."""
    found = {}
    for distribution in importlib.metadata.distributions():
        name = (distribution.metadata["Name"] or "").lower().replace("_", "-")
        if _CUPY_PACKAGE.match(name):
            found[name] = distribution.version
    return sorted(found.items())


def _package_cuda_major(name: str) -> int | None:
    """The CUDA major version a CuPy wheel is built for (cupy-cuda12x -> 12), None if unknown."""
    match = _CUPY_PACKAGE.match(name)
    if match is None or match[1] is None:
        return None
    digits = match[1]
    return int(digits) if match[2] else int(digits[:-1])  # cupy-cuda110 was CUDA 11.0


def _driver_cuda_version() -> int | None:
    """The CUDA version the NVIDIA driver supports (12040 is 12.4), or None without a driver.

    Asks the driver library itself (``cuDriverGetVersion`` needs no ``cuInit``), so
    it works whether or not CuPy is installed.
    """
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so", "libcuda.dylib")
    for name in names:
        try:
            library = ctypes.CDLL(name)
            version = ctypes.c_int(0)
            if library.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return version.value
        except (OSError, AttributeError):
            continue
    return None


def _install_command(driver: int | None) -> str:
    """The pip command for the wheel that matches ``driver``'s CUDA version."""
    major = None if driver is None else driver // 1000
    if major is not None and major >= 13:
        return ("pip install 'tinytrain[cuda13]' (for a GPU older than Turing, compute capability < 7.5: "
                "'tinytrain[cuda12]')")
    if major == 12:
        return "pip install 'tinytrain[cuda12]'"
    if major is not None:
        return (f"the driver only supports CUDA {_cuda_text(driver)}: update the NVIDIA driver (CUDA 12 needs "
                "R525 or newer), then pip install 'tinytrain[cuda12]'")
    return ("pip install 'tinytrain[cuda12]' for CUDA 12 or 'tinytrain[cuda13]' for CUDA 13 (`nvidia-smi` shows "
            "the CUDA version your driver supports)")


def _library_fix(package: str, major: int | None, driver: int | None, error: BaseException) -> str:
    """How to repair a CuPy that cannot reach the GPU or run a kernel, from the error it raised."""
    text = f"{type(error).__name__}: {error}".lower()
    if "no cuda-capable device" in text or "nodevice" in text:
        return ("the driver sees no GPU: check that `nvidia-smi` lists one and that CUDA_VISIBLE_DEVICES "
                "(if set) names it")
    if "insufficient" in text:
        return (f"the NVIDIA driver is older than the CUDA runtime {package} uses: update the driver, or use the "
                f"wheel of the driver's CUDA: pip uninstall -y {package} && {_install_command(driver)}")
    missing = any(word in text for word in ("nvrtc", "cannot open shared object", ".so", ".dll", "libcu", "not found"))
    if missing and major is not None:
        return (f"{package} needs the CUDA {major} libraries (NVRTC, cuBLAS, ...): install CUDA Toolkit {major}.x, "
                f"or get them from PyPI with pip install '{package}[ctk]' (recent CuPy); or switch to the wheel "
                f"of the CUDA toolkit you have: pip uninstall -y {package} && {_install_command(driver)}")
    return f"reinstall CuPy for your driver: pip uninstall -y {package} && {_install_command(driver)}"


def gpu_report() -> list[tuple[bool, str, str | None]]:
    """The GPU part of ``tinytrain doctor``: ``(ok, line, fix)`` per finding.

    ``ok`` False is a problem and ``fix`` says what to do; ``ok`` True with a
    ``fix`` is advice (e.g. a GPU that tinytrain could use once CuPy is
    installed). Never raises: every failure becomes a finding.
    """
    packages, driver = _cupy_packages(), _driver_cuda_version()
    driver_text = "no NVIDIA driver" if driver is None else f"an NVIDIA driver for CUDA {_cuda_text(driver)}"
    if not packages:
        if driver is None:
            return [(True, "GPU: no NVIDIA driver and no CuPy: tinytrain computes on the CPU", None)]
        return [(True, f"GPU: {driver_text}, but CuPy is not installed: tinytrain computes on the CPU",
                 f"to use the GPU: {_install_command(driver)}")]
    package, version = packages[0]
    major = _package_cuda_major(package)
    report: list[tuple[bool, str, str | None]] = []
    if len(packages) > 1:
        names = " ".join(name for name, _ in packages)
        listing = ", ".join(f"{name} {version}" for name, version in packages)
        report.append((False, f"CuPy: {len(packages)} CuPy packages are installed ({listing}); they overwrite "
                              "each other's files",
                       f"keep one: pip uninstall -y {names} && {_install_command(driver)}"))
    else:
        report.append((True, f"CuPy {version} (package {package}, built for CUDA {major or '?'})", None))
    if driver is None:
        report.append((False, f"GPU: {package} is installed but there is no NVIDIA driver",
                       f"install the NVIDIA driver for your GPU (`nvidia-smi` must work), or without a GPU: "
                       f"pip uninstall -y {package}"))
        return report
    if major is not None and driver // 1000 < major:
        report.append((False, f"CUDA: {package} needs a driver for CUDA {major}, but this machine has {driver_text}",
                       f"update the NVIDIA driver (CUDA 13 needs R580 or newer), or use the wheel of your driver: "
                       f"pip uninstall -y {package} && {_install_command(driver)}"))
        return report
    try:
        cupy = importlib.import_module("cupy")
        count = cupy.cuda.runtime.getDeviceCount()
        runtime = cupy.cuda.runtime.runtimeGetVersion()
    except Exception as error:
        report.append((False, f"CuPy cannot reach the GPU: {type(error).__name__}: {error}",
                       _library_fix(package, major, driver, error)))
        return report
    report.append((True, f"CUDA: {driver_text}; CuPy uses the CUDA {_cuda_text(runtime)} runtime; "
                         f"{count} GPU(s) visible", None))
    for index in range(count):
        try:
            properties = cupy.cuda.runtime.getDeviceProperties(index)
        except Exception as error:
            report.append((False, f"cuda:{index}: cannot read its properties ({error})", None))
            continue
        name = properties["name"].decode() if isinstance(properties["name"], bytes) else str(properties["name"])
        capability = (int(properties["major"]), int(properties["minor"]))
        line = (f"cuda:{index}: {name}, compute capability {capability[0]}.{capability[1]}, "
                f"{properties['totalGlobalMem'] / 2**30:.1f} GiB")
        if major is not None and major >= 13 and capability < (7, 5):
            report.append((False, line + " -- too old for CUDA 13 (it needs compute capability 7.5 or newer)",
                           f"use the CUDA 12 wheel: pip uninstall -y {package} && pip install 'tinytrain[cuda12]'"))
        else:
            report.append((True, line, None))
    if count == 0:
        return report
    try:
        with cupy.cuda.Device(0):
            x = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
            value = float(((x @ x.T) * 2).sum())  # an elementwise kernel (compiled by NVRTC) and cuBLAS
        import numpy as np  # here: the tinytrain command must start without NumPy (see tinytrain/course/cli.py)

        host = np.arange(12, dtype=np.float32).reshape(3, 4)
        expected = float(((host @ host.T) * 2).sum())
        if value != expected:
            raise ArithmeticError(f"got {value}, expected {expected}")
    except Exception as error:
        report.append((False, f"CuPy cannot run a kernel on cuda:0: {type(error).__name__}: {error}",
                       _library_fix(package, major, driver, error)))
    else:
        report.append((True, "CuPy runs kernels on cuda:0 (an elementwise kernel and a cuBLAS product check out)",
                       None))
    return report
