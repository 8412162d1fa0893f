"""CPU against GPU: seconds per training step of three MLPs and a CNN on each device.

A step is what a training loop does per batch: zero the gradients, forward,
loss, backward, an SGD-with-momentum update, and reading the loss (``item()``,
which waits for the GPU to finish). The models run unchanged on both devices
(``model.to(device)``, batches made on the device); the first step's losses are
checked to agree. The tiny models show launch overhead (the GPU can lose), the
wide ones show throughput (Module 12, section 3).

    python benchmarks/gpu.py [--quick] [--device cuda:N] [--json [PATH]]

Without a usable GPU it says why and times the CPU only (``"gpu": null`` and a
``"skipped"`` reason in the JSON). Unlike the other benchmarks, BLAS keeps its
default thread count: the comparison is with the CPU as a user would run it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

import tinytrain as tt
from tinytrain import nn

# name -> (builder of the model, input shape of one sample, classes, batch size)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], int, int]] = {
    "mlp-digits 64-32-10": (lambda: _mlp(64, 32, 10), (64,), 10, 64),
    "mlp-mnist 784-256-128-10": (lambda: _mlp(784, 256, 128, 10), (784,), 10, 128),
    "mlp-wide 1024-2048-2048-10": (lambda: _mlp(1024, 2048, 2048, 10), (1024,), 10, 512),
    "cnn-mnist 2 conv + linear": (lambda: _cnn(), (1, 28, 28), 10, 64),
}


def _mlp(*sizes: int) -> nn.Module:
    layers: list[nn.Module] = []
    for n_in, n_out in zip(sizes, sizes[1:]):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )


def step_closure(name: str, device: str) -> Callable[[], float]:
    """One training step of model ``name`` on ``device``, from seed 0 (same weights and batch everywhere)."""
    build, shape, classes, batch = MODELS[name]
    tt.manual_seed(0)
    model = build().to(device)
    optimizer = tt.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = tt.tensor(rng.standard_normal((batch, *shape), dtype=np.float32), device=device)
    y = tt.tensor(rng.integers(0, classes, batch), device=device)

    def step() -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def median_seconds(step: Callable[[], Any], repeats: int, warmup: int) -> float:
    for _ in range(warmup):  # on a GPU the first calls compile and cache kernels
        step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def find_gpu(device: str) -> tuple[Any, str | None]:
    """The backend of ``device``, or None and why there is none."""
    try:
        return tt.get_backend(device), None
    except (RuntimeError, ValueError) as error:
        return None, str(error)


def gpu_description(backend: Any) -> dict[str, Any]:
    cupy = backend.cupy
    properties = cupy.cuda.runtime.getDeviceProperties(backend.index)
    name = properties["name"].decode() if isinstance(properties["name"], bytes) else str(properties["name"])
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    return {"device": backend.device, "name": name,
            "compute_capability": f"{properties['major']}.{properties['minor']}",
            "cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}", "cupy": cupy.__version__}


def measure(quick: bool = False, device: str = "cuda") -> dict[str, Any]:
    """Median seconds per step of every model on the CPU and, when there is one, on the GPU."""
    gpu, reason = find_gpu(device)
    report: dict[str, Any] = {
        "cpu": {"machine": platform.machine(), "processor": platform.processor() or None, "cores": os.cpu_count(),
                "numpy": np.__version__},
        "gpu": None if gpu is None else gpu_description(gpu),
        "skipped": reason,
        "results": [],
    }
    for name, (_, _, _, batch) in MODELS.items():
        heavy = name.startswith(("mlp-wide", "cnn"))
        repeats = (3 if heavy else 10) if quick else (10 if heavy else 50)
        cpu_step = step_closure(name, "cpu")
        row: dict[str, Any] = {"model": name, "batch": batch, "cpu_ms": None, "gpu_ms": None, "speedup": None}
        if gpu is not None:
            gpu_step = step_closure(name, gpu.device)
            cpu_loss, gpu_loss = cpu_step(), gpu_step()
            if not np.isclose(cpu_loss, gpu_loss, rtol=1e-3, atol=1e-4):
                raise AssertionError(f"{name}: the first loss is {cpu_loss} on the CPU but {gpu_loss} on {gpu.device}")
            row["gpu_ms"] = 1e3 * median_seconds(gpu_step, repeats, warmup=3)
        row["cpu_ms"] = 1e3 * median_seconds(cpu_step, repeats, warmup=1)
        if row["gpu_ms"] is not None:
            row["speedup"] = row["cpu_ms"] / row["gpu_ms"]
        report["results"].append(row)
    return report


def print_report(report: dict[str, Any]) -> None:
    gpu = report["gpu"]
    if gpu is None:
        print(f"No GPU: {report['skipped']}")
        print("Timing the CPU only; on a machine with an NVIDIA GPU and CuPy this prints both.\n")
    else:
        print(f"GPU {gpu['device']}: {gpu['name']} (compute capability {gpu['compute_capability']}, "
              f"CUDA {gpu['cuda_runtime']}, CuPy {gpu['cupy']})\n")
    print(f"{'model':28s} {'batch':>5s} {'cpu ms':>10s} {'gpu ms':>10s} {'speed-up':>9s}")
    for row in report["results"]:
        gpu_ms = "-" if row["gpu_ms"] is None else f"{row['gpu_ms']:.3f}"
        speedup = "-" if row["speedup"] is None else f"{row['speedup']:.1f}x"
        print(f"{row['model']:28s} {row['batch']:5d} {row['cpu_ms']:10.3f} {gpu_ms:>10s} {speedup:>9s}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--device", default="cuda", help="the GPU to compare with (default: cuda, i.e. cuda:0)")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="write the results as JSON to PATH (no PATH: to standard output, instead of the table)")
    args = parser.parse_args(argv)
    report = measure(quick=args.quick, device=args.device)
    if args.json == "-":
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print_report(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(report, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
