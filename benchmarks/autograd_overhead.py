"""Autograd overhead: 200 chained small elementwise operations, forward + backward.

Each figure is measured in this run: tinytrain, the same computation written by
hand in NumPy (forward and the chain rule spelled out — the floor for any NumPy
framework) and, when installed, PyTorch. Printed as times and as ratios.

    python benchmarks/autograd_overhead.py [--size 64] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import median_seconds, torch_or_none  # noqa: E402  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import tinytrain as tt  # noqa: E402

ROUNDS = 40  # five operations per round: 200 in all


def chain(x):
    """The benchmark's computation; works on tinytrain and PyTorch tensors alike."""
    for _ in range(ROUNDS):
        x = ((x * 1.01 + 0.1).tanh() - 0.05) * 0.99
    return x.sum()


def tinytrain_step(x: tt.Tensor) -> None:
    x.grad = None
    chain(x).backward()


def numpy_step(x: np.ndarray) -> np.ndarray:
    """Forward, keeping what backward needs, then the chain rule by hand."""
    saved = []
    for _ in range(ROUNDS):
        t = np.tanh(x * np.float32(1.01) + np.float32(0.1))
        saved.append(t)
        x = (t - np.float32(0.05)) * np.float32(0.99)
    grad = np.ones_like(x)
    for t in reversed(saved):
        grad = grad * np.float32(0.99)
        grad = grad * (1 - t * t)
        grad = grad * np.float32(1.01)
    return grad


def build(name: str, size: int = 64):
    """Entry point of a benchmark process (``benchmarks/run.py``): one side's step on ``size`` values."""
    start = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    if name == "tinytrain":
        x = tt.tensor(start, requires_grad=True)
        return lambda: tinytrain_step(x)
    if name == "numpy":
        def step() -> None:
            numpy_step(start)

        return step
    torch = torch_or_none()
    xt = torch.tensor(start, requires_grad=True)

    def torch_step() -> None:
        xt.grad = None
        chain(xt).backward()

    return torch_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="elements per tensor (default 64)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()

    start = np.random.default_rng(0).standard_normal(args.size).astype(np.float32)
    x = tt.tensor(start, requires_grad=True)
    results = {
        "ops": 5 * ROUNDS,
        "size": args.size,
        "tinytrain_s": median_seconds(lambda: tinytrain_step(x), inner=5),
        "numpy_s": median_seconds(lambda: numpy_step(start), inner=5),
    }
    torch = torch_or_none()
    if torch is not None:
        xt = torch.tensor(start, requires_grad=True)

        def torch_step() -> None:
            xt.grad = None
            chain(xt).backward()

        results["torch_s"] = median_seconds(torch_step, inner=5)
        results["torch_version"] = torch.__version__

    ops = results["ops"]
    print(f"{ops} chained elementwise ops on {args.size} float32 values, forward + backward, one thread")
    for name in ("tinytrain", "numpy", "torch"):
        if f"{name}_s" in results:
            seconds = results[f"{name}_s"]
            print(f"  {name:10s} {seconds * 1e3:8.3f} ms   {seconds / ops * 1e6:6.2f} µs/op")
    print(f"  tinytrain / hand-written NumPy: {results['tinytrain_s'] / results['numpy_s']:.2f}x")
    if "torch_s" in results:
        results["ratio_vs_torch"] = results["tinytrain_s"] / results["torch_s"]
        print(f"  tinytrain / PyTorch:            {results['ratio_vs_torch']:.2f}x  (target <= 1.0x)")
    else:
        print("  PyTorch not installed: no PyTorch ratio (pip install torch to compare)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
