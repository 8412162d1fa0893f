"""CNN training steps: tinytrain against hand-written NumPy and PyTorch, and their peak memory.

Two steps, each: zero the gradients, forward, softmax cross-entropy, backward,
SGD with momentum 0.9.

* MNIST-shaped: batch 128 of 1x28x28; Conv 1->8 3x3 pad 1, ReLU, MaxPool 2,
  Conv 8->16 3x3 pad 1, ReLU, MaxPool 2, Flatten, Linear 784->10.
* CIFAR-shaped: batch 64 of 3x32x32; Conv 3->32 3x3 pad 1, ReLU, MaxPool 2,
  Conv 32->64 3x3 pad 1, ReLU, MaxPool 2, Flatten, Linear 4096->10.

All three implementations start from the same weights and batch and do the same
arithmetic in float32 (checked: their first three losses agree). One BLAS
thread; each implementation runs in processes of its own, timed in turns (see
``_timing.lockstep_medians``). tinytrain's processes run with the allocator
settings that importing tinytrain makes (``tinytrain/runtime/allocator.py``: freed
memory stays in the heap), the others with the C library's defaults. Peak memory is what ``tracemalloc`` sees (NumPy reports its
arrays to it; PyTorch's allocator does not, so PyTorch has no figure).

    python benchmarks/cnn_step.py [--quick] [--only mnist|cifar] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from _timing import lockstep_medians, run_isolated, spread_note, torch_or_none  # noqa: E402  (pins BLAS threads first)

import numpy as np  # noqa: E402

# name: (batch, in_channels, image size, channels of conv 1, channels of conv 2)
SHAPES = {"mnist": (128, 1, 28, 8, 16), "cifar": (64, 3, 32, 32, 64)}
TARGETS = {"mnist": 1.0, "cifar": 1.0}  # tinytrain / PyTorch, at most (benchmarks/README.md, "Targets")
CLASSES = 10
LR, MOMENTUM = 0.01, 0.9


def batch(shape: str) -> tuple[np.ndarray, np.ndarray]:
    """float32 images and int64 labels."""
    n, c, size, _, _ = SHAPES[shape]
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, c, size, size), dtype=np.float32), rng.integers(0, CLASSES, n)


def initial_weights(shape: str) -> list[np.ndarray]:
    """conv1 w, b, conv2 w, b, linear w, b in PyTorch's layouts, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    _, c, size, c1, c2 = SHAPES[shape]
    rng = np.random.default_rng(1)
    weights = []
    for out_shape in [(c1, c, 3, 3), (c2, c1, 3, 3), (CLASSES, c2 * (size // 4) ** 2)]:
        bound = 1 / np.sqrt(np.prod(out_shape[1:]))
        weights += [rng.uniform(-bound, bound, out_shape).astype(np.float32),
                    rng.uniform(-bound, bound, out_shape[0]).astype(np.float32)]
    return weights


# -- a convolution by hand (conv_layer.py uses it too) -------------------------------------
def numpy_conv_forward(a: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A 3x3 convolution with padding 1, by hand: the output (N, O, H, W) and the columns backward needs.

    Pad, unfold with ``sliding_window_view`` (one copy), one batched matrix
    product whose (N, O, L) result is already NCHW.
    """
    n, c, h, wd = a.shape
    padded = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    cols = windows.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * 9, h * wd)
    out = np.matmul(w.reshape(len(w), -1), cols)
    if b is not None:
        out += b[:, None]
    return out.reshape(n, len(w), h, wd), cols


def numpy_conv_backward(g: np.ndarray, cols: np.ndarray, w: np.ndarray, input_shape: tuple[int, ...],
                        need_input: bool) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Gradients of :func:`numpy_conv_forward`: input (None unless ``need_input``), weight, bias.

    The two transposed products, and col2im by one strided addition per kernel offset.
    """
    n, c, h, wd = input_shape
    g = g.reshape(n, len(w), h * wd)
    grad_w = np.matmul(g, cols.transpose(0, 2, 1)).sum(axis=0).reshape(w.shape)
    grad_b = g.sum(axis=(0, 2))
    if not need_input:
        return None, grad_w, grad_b
    grad_cols = np.matmul(w.reshape(len(w), -1).T, g).reshape(n, c, 3, 3, h, wd)
    grad_padded = np.zeros((n, c, h + 2, wd + 2), np.float32)
    for i in range(3):
        for j in range(3):
            grad_padded[:, :, i:i + h, j:j + wd] += grad_cols[:, :, i, j]
    return grad_padded[:, :, 1:-1, 1:-1], grad_w, grad_b


# -- the three implementations: each returns a step closure that returns the loss -------------
def tinytrain_step(shape: str) -> Callable[[], float]:
    import tinytrain as tt

    nn = tt.nn
    _, c, size, c1, c2 = SHAPES[shape]
    model = nn.Sequential(nn.Conv2d(c, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(c2 * (size // 4) ** 2, CLASSES))
    with tt.no_grad():
        for param, value in zip(model.parameters(), initial_weights(shape)):
            param.data[...] = value
    optimizer = tt.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    x, y = batch(shape)
    inputs, targets = tt.tensor(x), tt.tensor(y)

    def step() -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def numpy_step(shape: str) -> Callable[[], float]:
    """The same step by hand, the way a careful NumPy programmer writes it.

    Convolution: ``numpy_conv_forward`` and ``numpy_conv_backward`` (im2col, one
    batched matrix product; col2im), the input gradient skipped for the first layer. ReLU in place; max pooling by
    ``np.maximum`` over the four window offsets, remembering the winning offset
    (the first maximum, as PyTorch) in a uint8 array. float32 throughout, in-place
    updates. Like an ordinary script, it allocates its arrays afresh every step.
    """
    params = initial_weights(shape)  # conv1 w, b, conv2 w, b, linear w, b
    velocity = [np.zeros_like(p) for p in params]
    x, y = batch(shape)
    rows = np.arange(len(y))
    lr, momentum, inv_n = np.float32(LR), np.float32(MOMENTUM), np.float32(1 / len(y))
    offsets = [(0, 0), (0, 1), (1, 0), (1, 1)]

    def relu_pool_forward(a):
        np.maximum(a, 0, out=a)
        best = a[:, :, 0::2, 0::2].copy()
        winner = np.zeros(best.shape, np.uint8)
        for k, (i, j) in enumerate(offsets[1:], 1):
            part = a[:, :, i::2, j::2]
            np.maximum(winner, (part > best) * np.uint8(k), out=winner)
            np.maximum(best, part, out=best)
        return best, winner, a > 0

    def pool_relu_backward(g, winner, positive):
        n, c, h, wd = g.shape
        grad = np.empty((n, c, 2 * h, 2 * wd), np.float32)
        for k, (i, j) in enumerate(offsets):
            np.multiply(g, winner == k, out=grad[:, :, i::2, j::2])
        grad *= positive
        return grad

    def step() -> float:
        w1, b1, w2, b2, w3, b3 = params
        a1, cols1 = numpy_conv_forward(x, w1, b1)
        p1, winner1, positive1 = relu_pool_forward(a1)
        a2, cols2 = numpy_conv_forward(p1, w2, b2)
        p2, winner2, positive2 = relu_pool_forward(a2)
        features = p2.reshape(len(p2), -1)
        logits = features @ w3.T
        logits += b3
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        sums = probs.sum(axis=1, keepdims=True)
        loss = float(np.log(sums[:, 0]).mean() - logits[rows, y].mean())
        probs /= sums
        probs[rows, y] -= 1
        probs *= inv_n  # d loss / d logits
        grad_w3, grad_b3 = probs.T @ features, probs.sum(axis=0)
        grad = pool_relu_backward((probs @ w3).reshape(p2.shape), winner2, positive2)
        grad, grad_w2, grad_b2 = numpy_conv_backward(grad, cols2, w2, p1.shape, need_input=True)
        grad = pool_relu_backward(grad, winner1, positive1)
        _, grad_w1, grad_b1 = numpy_conv_backward(grad, cols1, w1, x.shape, need_input=False)
        for param, g, v in zip(params, (grad_w1, grad_b1, grad_w2, grad_b2, grad_w3, grad_b3), velocity):
            v *= momentum
            v += g
            param -= lr * v
        return loss

    return step


def torch_step(shape: str) -> Callable[[], float]:
    torch = torch_or_none()
    nn = torch.nn
    _, c, size, c1, c2 = SHAPES[shape]
    model = nn.Sequential(nn.Conv2d(c, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(c2 * (size // 4) ** 2, CLASSES))
    with torch.no_grad():
        for param, value in zip(model.parameters(), initial_weights(shape)):
            param.copy_(torch.from_numpy(value))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    x, y = batch(shape)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


BUILDERS = {"tinytrain": tinytrain_step, "numpy": numpy_step, "torch": torch_step}


def build(name: str, shape: str) -> Callable[[], float]:
    """Entry point of a benchmark process: the step of implementation ``name`` on ``shape``."""
    return BUILDERS[name](shape)


def measure(shape: str, quick: bool = False, with_torch: bool = True) -> dict[str, dict[str, Any]]:
    """Per implementation: median ``seconds`` per step, ``first`` losses, ``faults_per_step``.

    Raises AssertionError when an implementation's first three losses differ
    from tinytrain's (they would not be doing the same computation).
    """
    names = ["tinytrain", "numpy"] + (["torch"] if with_torch else [])
    results = lockstep_medians({name: ("cnn_step:build", (name, shape)) for name in names},
                               repeats=10 if quick else 40, warmup=5, inner=1)
    for name, found in results.items():
        if not np.allclose(found["first"], results["tinytrain"]["first"], rtol=1e-4, atol=1e-5):
            raise AssertionError(f"{shape} step: {name}'s losses {found['first']} differ from tinytrain's "
                                 f"{results['tinytrain']['first']}")
    return results


# -- peak memory ---------------------------------------------------------------------------
def traced_peak(name: str, shape: str) -> int:
    """Entry point of a benchmark process: peak bytes tracemalloc sees for ``name`` on ``shape``.

    A first step, built and run untraced, imports the libraries. Tracing starts
    before the step is built again, so weights, optimizer state and the batch
    count. Two warm-up steps create the momentum buffers and fill every cache
    (tinytrain's buffer cache, emptied before tracing, included); then the peak
    is reset to what is allocated at that moment and two more steps run: the
    result is what stays allocated plus the step's high-water mark.
    """
    BUILDERS[name](shape)()
    if name == "tinytrain":
        from tinytrain.runtime.buffers import buffers

        buffers.clear()  # its arrays were allocated untraced: let the traced steps allocate them again
    tracemalloc.start()
    step = BUILDERS[name](shape)
    step()
    step()
    tracemalloc.reset_peak()
    step()
    step()
    return tracemalloc.get_traced_memory()[1]


def peak_memory(shape: str) -> dict[str, int]:
    return {f"{name}_bytes": run_isolated("cnn_step:traced_peak", name, shape) for name in ("tinytrain", "numpy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--only", choices=sorted(SHAPES), help="run one of the two steps")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    with_torch = torch_or_none() is not None
    report: dict[str, Any] = {}
    for shape in [args.only] if args.only else list(SHAPES):
        times = measure(shape, args.quick, with_torch)
        memory = peak_memory(shape)
        n, c, size, c1, c2 = SHAPES[shape]
        print(f"{shape.upper()}-shaped CNN step: batch {n} of {c}x{size}x{size}, conv {c}->{c1}->{c2}, "
              f"linear {c2 * (size // 4) ** 2}->{CLASSES}, SGD momentum; one thread")
        for name, found in times.items():
            print(f"  {name:10s} {found['seconds'] * 1e3:8.2f} ms/step  "
                  f"{found['faults_per_step']:7.0f} page faults/step")
        print(f"  {spread_note(times)}")
        ours = times["tinytrain"]["seconds"]
        entry: dict[str, Any] = {"steps": times, "memory": memory,
                                 "ratio_vs_numpy": ours / times["numpy"]["seconds"]}
        print(f"  tinytrain / hand-written NumPy: {entry['ratio_vs_numpy']:.2f}x")
        if with_torch:
            entry["ratio_vs_torch"] = ours / times["torch"]["seconds"]
            entry["target_vs_torch"] = TARGETS[shape]
            print(f"  tinytrain / PyTorch:            {entry['ratio_vs_torch']:.2f}x (target <= {TARGETS[shape]}x)")
        else:
            print("  PyTorch not installed: no PyTorch ratio (pip install torch to compare)")
        print(f"  peak memory (tracemalloc): tinytrain {memory['tinytrain_bytes'] / 2**20:.1f} MiB, "
              f"NumPy {memory['numpy_bytes'] / 2**20:.1f} MiB (PyTorch's allocator is invisible to tracemalloc)")
        report[shape] = entry
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
