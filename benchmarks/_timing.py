"""Shared helpers for the benchmarks: one BLAS thread, median timings.

Import this module before NumPy (or PyTorch): it pins every BLAS and OpenMP
pool to one thread, because two-thread timings on small VMs swing by 10x.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

# Processes running the same code further apart than this make a ratio uncertain by as much.
NOISY_SPREAD = 0.10


def median_seconds(step: Callable[[], object], repeats: int = 30, warmup: int = 5, inner: int = 1) -> float:
    """Median wall time of ``step`` (called ``inner`` times per sample) after warm-up."""
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            step()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def run_isolated(target: str, *args: Any) -> Any:
    """``module:function(*args)`` called in a fresh Python process; its JSON-able result.

    The module is imported from this directory after this module (so BLAS is
    pinned to one thread there too). A fresh process has only its own heap
    history: glibc grows and trims the C heap as large arrays come and go, and a
    trimmed heap is faulted in again page by page, so what one implementation
    allocated must not change another's timings. Each side thus runs as it
    would in a script of its own.
    """
    module, function = target.split(":")
    bootstrap = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import _timing, importlib; "
        "result = getattr(importlib.import_module(sys.argv[2]), sys.argv[3])(*json.loads(sys.argv[4])); "
        "print('\\n' + json.dumps(result))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", bootstrap, str(Path(__file__).parent), module, function, json.dumps(args)],
        capture_output=True, text=True,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"benchmark process {target}{args} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


_WORKER = """
import json, os, sys, time
if sys.argv[7] != "-":
    os.sched_setaffinity(0, {int(sys.argv[7])})
sys.path.insert(0, sys.argv[1])
import _timing, importlib
try:
    import resource
except ImportError:
    resource = None
build = getattr(importlib.import_module(sys.argv[2]), sys.argv[3])
step = build(*json.loads(sys.argv[4]))
inner, warmup = int(sys.argv[5]), int(sys.argv[6])
first = [step() for _ in range(3)]
for _ in range(warmup):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0
steps = 0
print("ready", flush=True)
for command in sys.stdin:
    if command.strip() != "go":
        break
    step()  # untimed: refills the caches that the previous process on this CPU evicted
    start = time.perf_counter()
    for _ in range(inner):
        step()
    print((time.perf_counter() - start) / inner, flush=True)
    steps += inner + 1
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / max(steps, 1) if resource else None
print(json.dumps({"first": first, "faults_per_step": faults}), flush=True)
"""


def lockstep_medians(
    builders: dict[str, tuple[str, tuple]], repeats: int = 30, warmup: int = 10, inner: int = 1, processes: int = 3
) -> dict[str, dict[str, Any]]:
    """Median wall time of each implementation's step, in processes of its own, timed in turns.

    ``builders`` maps names to ``("module:function", args)``: the function,
    imported from this directory after this module (so BLAS is pinned to one
    thread there too), returns the step to time. Every implementation runs in
    fresh Python processes: glibc grows and trims the C heap as large arrays
    come and go, and a trimmed heap is faulted in again page by page, so one
    implementation's allocations must not change another's timings — each runs
    as it would in a script of its own.

    Each implementation gets ``processes`` processes, because a process's speed
    depends on where its arrays happen to land in memory (cache-set and 4 KiB
    aliasing conflicts): on a 2-core VM two runs of the same script differ by
    up to 10%. The processes are built and warmed up, then told in turn to time
    one sample of ``inner`` steps, ``repeats`` rounds, starting each round with
    the next process: a slow phase of a shared machine hits all of them alike.
    Only one runs at a time (the others wait on their pipe), and where the OS
    allows it all run on the same CPU, so that none gets a quieter core. Each
    sample starts with one untimed step: the process that ran before evicted
    the caches, and a training loop runs its steps back to back, with the
    interpreter's code and objects still cached (timing the cold step would
    more than double a framework's per-step Python cost).

    Returns per name the median over its processes of each process's median
    ``seconds`` per step, those medians (``process_seconds``) and how far they
    lie apart (``spread``, max / min - 1), the ``first`` three results of the
    step (so callers can check that implementations agree) and the mean minor
    page faults per timed step (``faults_per_step``).
    """
    cpu = str(max(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "-"
    workers: list[tuple[str, subprocess.Popen]] = []
    try:
        for _ in range(processes):
            for name, (target, args) in builders.items():
                module, function = target.split(":")
                log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty worker cannot block on it
                worker = subprocess.Popen(
                    [sys.executable, "-c", _WORKER, str(Path(__file__).parent), module, function, json.dumps(args),
                     str(inner), str(warmup), cpu],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                )
                worker.log = log  # Popen.stderr is None when stderr is a file: _expect reads this instead
                _expect(worker, name, "ready")  # built and warmed up before the next one starts
                workers.append((name, worker))
        samples: list[list[float]] = [[] for _ in workers]
        for round_number in range(repeats):
            first = round_number % len(workers)
            for index in list(range(first, len(workers))) + list(range(first)):
                name, worker = workers[index]
                worker.stdin.write("go\n")
                worker.stdin.flush()
                samples[index].append(float(_expect(worker, name)))
        medians: dict[str, list[float]] = {name: [] for name in builders}
        reports: dict[str, list[dict[str, Any]]] = {name: [] for name in builders}
        for (name, worker), timings in zip(workers, samples):
            worker.stdin.write("stop\n")
            worker.stdin.flush()
            reports[name].append(json.loads(_expect(worker, name)))
            medians[name].append(statistics.median(timings))
            worker.wait()
        results = {}
        for name in builders:
            faults = [report["faults_per_step"] for report in reports[name]]
            results[name] = {
                "seconds": statistics.median(medians[name]),
                "process_seconds": medians[name],
                "spread": max(medians[name]) / min(medians[name]) - 1,
                "first": reports[name][0]["first"],
                "faults_per_step": None if None in faults else statistics.mean(faults),
            }
        return results
    finally:
        for _, worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def spread_note(results: dict[str, dict[str, Any]]) -> str:
    """How far the processes of one implementation disagreed, and a warning when too far to compare.

    On a quiet machine they mostly lie within a few percent. A busy phase of a
    shared machine shows up as processes of the same code running 20-30% apart
    (and ratios from such a run can be off by as much); PyTorch's CNN step also
    varies by 15% from process to process on its own.
    """
    name, worst = max(((name, found["spread"]) for name, found in results.items()), key=lambda item: item[1])
    note = f"processes of one implementation differ by up to {worst:.1%} ({name})"
    if worst > NOISY_SPREAD:
        note += (f": more than {NOISY_SPREAD:.0%}, so ratios against it are uncertain by about as much "
                 "(a busy machine, or an implementation whose speed varies from process to process)")
    return note


def _expect(worker: subprocess.Popen, name: str, expected: str | None = None) -> str:
    """The next line a worker prints (``expected`` if given), or its error."""
    line = worker.stdout.readline().strip()
    if not line or (expected is not None and line != expected):
        worker.kill()
        worker.wait()
        worker.log.seek(0)
        raise RuntimeError(f"benchmark process {name!r} failed:\n{worker.log.read()}")
    return line


def torch_or_none():
    """PyTorch pinned to one thread, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch
