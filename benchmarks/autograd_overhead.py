"""Autograd overhead: 200 chained small elementwise operations, forward + backward.

Each figure is measured in this run: tinytrain, the same computation written by
hand in NumPy (forward and the chain rule spelled out — the floor for any NumPy
framework) and, when installed, PyTorch; each side in three processes of its
own, timed in turns (``_timing.lockstep_medians``). Printed as times, the
spread between processes, and ratios.

    python benchmarks/autograd_overhead.py [--size 64] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _timing import lockstep_medians, spread_note, torch_or_none  # noqa: E402  (pins BLAS threads first)

import numpy as np  # noqa: E402

import tinytrain as tt  # noqa: E402

ROUNDS = 40  # five operations per round: 200 in all
TARGET_VS_TORCH = 0.8  # tinytrain / PyTorch, at most (benchmarks/README.md, "Targets")


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


def measure(quick: bool = False, with_torch: bool = True, size: int = 64) -> dict[str, dict[str, Any]]:
    """Per side: median seconds of one forward + backward over its processes (``_timing.lockstep_medians``)."""
    names = ["tinytrain", "numpy"] + (["torch"] if with_torch else [])
    return lockstep_medians({name: ("autograd_overhead:build", (name, size)) for name in names},
                            repeats=30 if quick else 100, warmup=5, inner=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="elements per tensor (default 64)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    results = measure(args.quick, torch_or_none() is not None, args.size)
    ops = 5 * ROUNDS
    print(f"{ops} chained elementwise ops on {args.size} float32 values, forward + backward, one thread")
    for name, found in results.items():
        processes = ", ".join(f"{seconds * 1e3:.3f}" for seconds in found["process_seconds"])
        print(f"  {name:10s} {found['seconds'] * 1e3:8.3f} ms   {found['seconds'] / ops * 1e6:6.2f} µs/op   "
              f"(processes: {processes})")
    print(f"  {spread_note(results)}")
    ours = results["tinytrain"]["seconds"]
    print(f"  tinytrain / hand-written NumPy: {ours / results['numpy']['seconds']:.2f}x")
    if "torch" in results:
        print(f"  tinytrain / PyTorch:            {ours / results['torch']['seconds']:.2f}x  "
              f"(target <= {TARGET_VS_TORCH}x)")
    else:
        print("  PyTorch not installed: no PyTorch ratio (pip install torch to compare)")
    if args.json:
        args.json.write_text(json.dumps({"ops": ops, "size": args.size, "steps": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
