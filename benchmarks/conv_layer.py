"""Convolutions alone, forward and backward, at every layer shape of the CNN milestone on MNIST and CIFAR-10.

The milestone's models (the recipe ``milestones/cnn.py``): 3x3
convolutions with padding 1 and no bias (BatchNorm follows each), batch 64 —
MNIST 1->32->32 at 28x28, 32->64->64 at 14x14; CIFAR-10 3->32->32 at 32x32,
32->64->64 at 16x16, 64->128->128 at 8x8. Per layer: the forward pass, and the
backward pass (weight gradient, and the input gradient except for the first
layer, whose input is the images). Three sides: tinytrain's ``conv2d``, the
hand-written NumPy convolution of ``cnn_step.py`` (im2col, batched matrix
product, col2im) and PyTorch's ``F.conv2d``, all float32 on the same data,
one BLAS thread. Each side runs in ``PROCESSES`` fresh processes, taken in
turns; a figure is the median over processes of each process's median.

    python benchmarks/conv_layer.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from _timing import run_isolated, torch_or_none  # noqa: E402  (pins BLAS threads first)

import numpy as np  # noqa: E402

BATCH = 64
PROCESSES = 3
# (dataset, in channels, out channels, image size): the milestone's convolutions, in order
LAYERS = [("mnist", 1, 32, 28), ("mnist", 32, 32, 28), ("mnist", 32, 64, 14), ("mnist", 64, 64, 14),
          ("cifar10", 3, 32, 32), ("cifar10", 32, 32, 32), ("cifar10", 32, 64, 16), ("cifar10", 64, 64, 16),
          ("cifar10", 64, 128, 8), ("cifar10", 128, 128, 8)]


def layer_data(index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Input, weight, output gradient of layer ``index``, and whether its input needs a gradient."""
    _, c_in, c_out, size = LAYERS[index]
    rng = np.random.default_rng(index)
    x = rng.standard_normal((BATCH, c_in, size, size), dtype=np.float32)
    w = (rng.standard_normal((c_out, c_in, 3, 3), dtype=np.float32) / np.sqrt(9 * c_in)).astype(np.float32)
    g = rng.standard_normal((BATCH, c_out, size, size), dtype=np.float32)
    first = index == 0 or LAYERS[index - 1][0] != LAYERS[index][0]
    return x, w, g, not first


# -- per side: (forward, backward) closures; each returns a float to check that the sides agree ---
def tinytrain_layer(index: int) -> tuple[Callable[[], float], Callable[[], float]]:
    import tinytrain as tt

    x_host, w_host, g_host, need_input = layer_data(index)
    x, w, g = tt.tensor(x_host, requires_grad=need_input), tt.tensor(w_host, requires_grad=True), tt.tensor(g_host)
    state: dict[str, Any] = {}

    def forward() -> float:
        state["out"] = tt.nn.functional.conv2d(x, w, padding=1)
        return float(state["out"].data[0, 0, 0, 0])

    def backward() -> float:
        x.grad = w.grad = None
        state.pop("out").backward(g)
        return float(w.grad.data[0, 0, 0, 0])

    return forward, backward


def numpy_layer(index: int) -> tuple[Callable[[], float], Callable[[], float]]:
    from cnn_step import numpy_conv_backward, numpy_conv_forward

    x, w, g, need_input = layer_data(index)
    state: dict[str, Any] = {}

    def forward() -> float:
        out, state["cols"] = numpy_conv_forward(x, w, None)
        return float(out[0, 0, 0, 0])

    def backward() -> float:
        _, grad_w, _ = numpy_conv_backward(g, state.pop("cols"), w, x.shape, need_input)
        return float(grad_w[0, 0, 0, 0])

    return forward, backward


def torch_layer(index: int) -> tuple[Callable[[], float], Callable[[], float]]:
    torch = torch_or_none()
    x_host, w_host, g_host, need_input = layer_data(index)
    x = torch.from_numpy(x_host).requires_grad_(need_input)
    w, g = torch.from_numpy(w_host).requires_grad_(), torch.from_numpy(g_host)
    state: dict[str, Any] = {}

    def forward() -> float:
        state["out"] = torch.nn.functional.conv2d(x, w, padding=1)
        return state["out"][0, 0, 0, 0].item()

    def backward() -> float:
        x.grad = w.grad = None
        state.pop("out").backward(g)
        return w.grad[0, 0, 0, 0].item()

    return forward, backward


SIDES = {"tinytrain": tinytrain_layer, "numpy": numpy_layer, "torch": torch_layer}


def time_side(side: str, repeats: int) -> dict[str, Any]:
    """Entry point of a benchmark process: per layer, the median forward and backward seconds of ``side``.

    The layers take turns within each round (so a slow phase of the machine hits
    them alike); two untimed rounds first. Also returns the checked values.
    """
    steps = [SIDES[side](index) for index in range(len(LAYERS))]
    samples = [([], []) for _ in LAYERS]
    checks = [(forward(), backward()) for forward, backward in steps]
    for round_number in range(repeats + 1):
        for (forward, backward), (forward_times, backward_times) in zip(steps, samples):
            start = time.perf_counter()
            forward()
            middle = time.perf_counter()
            backward()
            end = time.perf_counter()
            if round_number:  # the first round warms the caches up
                forward_times.append(middle - start)
                backward_times.append(end - middle)
    return {"forward": [statistics.median(times) for times, _ in samples],
            "backward": [statistics.median(times) for _, times in samples], "checks": checks}


def measure(quick: bool = False, with_torch: bool = True) -> dict[str, Any]:
    """Per side and layer: ``forward``/``backward`` seconds (median over processes) and their ``spread``.

    Raises AssertionError when a side's outputs or weight gradients differ from tinytrain's.
    """
    sides = ["tinytrain", "numpy"] + (["torch"] if with_torch else [])
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for _ in range(PROCESSES):
        for side in sides:
            runs[side].append(run_isolated("conv_layer:time_side", side, 5 if quick else 15))
    results: dict[str, Any] = {}
    for side in sides:
        if not np.allclose(runs[side][0]["checks"], runs["tinytrain"][0]["checks"], rtol=1e-3, atol=1e-4):
            raise AssertionError(f"conv layers: {side}'s values {runs[side][0]['checks']} differ from tinytrain's")
        results[side] = {}
        for part in ("forward", "backward"):
            per_process = np.array([run[part] for run in runs[side]])  # (processes, layers)
            results[side][part] = np.median(per_process, axis=0).tolist()
            results[side][f"{part}_spread"] = (per_process.max(axis=0) / per_process.min(axis=0) - 1).tolist()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    with_torch = torch_or_none() is not None
    results = measure(args.quick, with_torch)
    sides = list(results)
    print(f"3x3 convolutions, padding 1, no bias, batch {BATCH}, float32, one thread: milliseconds "
          f"(median of {PROCESSES} processes per side)")
    header = "".join(f"{side + ' ' + part[:3]:>15s}" for part in ("forward", "backward") for side in sides)
    print(f"  {'layer':26s}{header}   vs NumPy   vs PyTorch")
    totals = {side: 0.0 for side in sides}
    for index, (dataset, c_in, c_out, size) in enumerate(LAYERS):
        cells = "".join(f"{results[side][part][index] * 1e3:15.2f}" for part in ("forward", "backward") for side in sides)
        ours = results["tinytrain"]["forward"][index] + results["tinytrain"]["backward"][index]
        ratios = []
        for side in sides[1:]:
            theirs = results[side]["forward"][index] + results[side]["backward"][index]
            totals[side] += theirs
            ratios.append(f"{ours / theirs:9.2f}x")
        totals["tinytrain"] += ours
        print(f"  {dataset:8s} {c_in:3d}->{c_out:<3d} at {size}x{size}   {cells}  {' '.join(ratios)}")
    summary = ", ".join(f"{side} {totals[side] * 1e3:.1f} ms" for side in sides)
    print(f"  all layers, forward + backward: {summary}; tinytrain / NumPy "
          f"{totals['tinytrain'] / totals['numpy']:.2f}x"
          + (f", tinytrain / PyTorch {totals['tinytrain'] / totals['torch']:.2f}x" if with_torch else ""))
    spread = max(max(results[side][f"{part}_spread"]) for side in sides for part in ("forward", "backward"))
    print(f"  processes of one side differ by up to {spread:.1%} on a layer")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
