"""MLP training step: tinytrain against hand-written NumPy and PyTorch, and its peak memory.

One step of 784-256-128-10 with ReLU, batch 128, softmax cross-entropy and SGD
with momentum 0.9: zero the gradients, forward, loss, backward, update. All
implementations start from the same weights and do the same arithmetic in
float32 (checked: their first three losses agree). One BLAS thread; each side
runs in processes of its own (see ``_timing.lockstep_medians``). Hand-written
NumPy runs twice: with row-major weights (the target's reference) and with
tinytrain's column-major ones, whose ratio is the framework's own cost. A fifth
side, ``framework_free``, runs tinytrain's own Functions and optimizer update
straight on the arrays: the floor that no change to the framework gets below.

    python benchmarks/mlp_step.py [--quick] [--json PATH]
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

SIZES = (784, 256, 128, 10)
TARGETS = {"vs_numpy": 1.0, "vs_torch": 0.85}  # tinytrain's time over theirs, at most (benchmarks/README.md)
BATCH = 128
LR, MOMENTUM = 0.01, 0.9


def batch() -> tuple[np.ndarray, np.ndarray]:
    """An MNIST-shaped batch: float32 inputs and int64 labels."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, SIZES[0]), dtype=np.float32), rng.integers(0, SIZES[-1], BATCH)


def initial_weights() -> list[np.ndarray]:
    """W1, b1, W2, b2, W3, b3 in PyTorch's layout and initialisation, U(-1/sqrt(in), 1/sqrt(in))."""
    rng = np.random.default_rng(1)
    weights = []
    for n_in, n_out in zip(SIZES, SIZES[1:]):
        bound = 1 / np.sqrt(n_in)
        weights += [rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32),
                    rng.uniform(-bound, bound, n_out).astype(np.float32)]
    return weights


# -- the three implementations: each returns a step closure that returns the loss ------------
def tinytrain_step() -> Callable[[], float]:
    import tinytrain as tt

    layers: list[Any] = []
    for n_in, n_out in zip(SIZES, SIZES[1:]):
        layers += [tt.nn.Linear(n_in, n_out), tt.nn.ReLU()]
    model = tt.nn.Sequential(*layers[:-1])
    with tt.no_grad():
        for param, value in zip(model.parameters(), initial_weights()):
            param.data[...] = value
    optimizer = tt.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = tt.nn.CrossEntropyLoss()
    x, y = batch()
    inputs, targets = tt.tensor(x), tt.tensor(y)

    def step() -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def framework_free_step() -> Callable[[], float]:
    """tinytrain's own array work with no framework around it: the floor of any change to the framework.

    The step the engine runs, spelled out: the reference Functions' ``forward`` and
    ``backward`` (Linear, ReLU, cross-entropy) and SGD's ``update`` called straight on
    the arrays, newest node first, with no tensors, graph, engine, modules, checks
    or optimizer loop. Capturing the graph once and replaying it could at best do
    this, so its time over hand-written NumPy's says what no framework change can win.
    """
    import tinytrain as tt
    from tinytrain.nn.layers import LinearFunction
    from tinytrain.nn.losses import CrossEntropy
    from tinytrain.ops import ReLU

    x, y = batch()
    params = [tt.tensor(value, requires_grad=True) for value in initial_weights()]
    for weight in params[::2]:
        weight.data = np.asfortranarray(weight.data)  # as tinytrain's Linear stores it
    optimizer = tt.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    group, xp = optimizer.param_groups[0], np
    states = [optimizer.init_state(param.data, group, xp) for param in params]
    backend = params[0]._backend
    given = tt.tensor(x)  # what each node's backward asks of its inputs: whether they need a gradient
    hidden = tt.zeros(1, requires_grad=True)
    seed = np.ones((), dtype=np.float32)

    def node(function: type, *inputs: Any) -> Any:
        """A Function set up as ``Function.apply`` and the engine set it up."""
        fn = function()
        fn.backend, fn.xp, fn.inputs, fn.owns_grad = backend, xp, inputs, True
        return fn

    def step() -> float:
        h, nodes = x, []
        for k in range(len(params) // 2):
            weight, bias = params[2 * k], params[2 * k + 1]
            nodes.append(node(LinearFunction, given if k == 0 else hidden, weight, bias))
            h = nodes[-1].forward(h, weight.data, bias.data)
            if 2 * k + 2 < len(params):
                nodes.append(node(ReLU, hidden))
                h = nodes[-1].forward(h)
        loss_node = node(CrossEntropy, hidden)
        loss = loss_node.forward(h, y, "mean")
        (grad,) = loss_node.backward(seed)
        grads = []
        for fn in reversed(nodes):
            grad, *param_grads = fn.backward(grad)
            grads = param_grads + grads
        for param, param_grad, state in zip(params, grads, states):
            optimizer.update(param.data, param_grad, state, group, xp)
        return float(loss)

    return step


def numpy_step(weight_order: str = "C") -> Callable[[], float]:
    """The same step written by hand: forward, the chain rule and the update spelled out.

    Written the way a careful NumPy programmer would: float32 throughout, the
    bias and ReLU applied in place, softmax's gradient built in the
    probabilities' array, weight gradients straight from one matrix product,
    momentum updated in place. Fresh arrays come from the matrix products.

    ``weight_order="F"`` stores the weights (and so their gradients and momentum
    buffers) column-major, as tinytrain's ``Linear`` does: BLAS runs ``x @ W.T``
    faster that way. Against that version, tinytrain's time over NumPy's is the
    framework's own cost: graph, engine, modules, checks and optimizer loop.
    """
    params = [np.asarray(p, order=weight_order) for p in initial_weights()]  # W1, b1, W2, b2, W3, b3
    buffers = [np.zeros_like(p) for p in params]
    x, y = batch()
    rows = np.arange(len(y))
    lr, momentum, inv_n = np.float32(LR), np.float32(MOMENTUM), np.float32(1 / len(y))
    layers = len(params) // 2

    def step() -> float:
        activations = [x]
        h = x
        for k in range(layers):
            h = h @ params[2 * k].T
            h += params[2 * k + 1]
            if k < layers - 1:
                np.maximum(h, 0, out=h)
            activations.append(h)
        logits = activations.pop()
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        sums = probs.sum(axis=1, keepdims=True)
        loss = float(np.log(sums[:, 0]).mean() - shifted[rows, y].mean())
        probs /= sums
        probs[rows, y] -= 1
        probs *= inv_n  # d loss / d logits
        grad, grads = probs, [None] * len(params)
        for k in reversed(range(layers)):
            grads[2 * k] = np.matmul(grad.T, activations[k], out=np.empty_like(params[2 * k]))  # W's order
            grads[2 * k + 1] = grad.sum(axis=0)
            if k > 0:
                grad = grad @ params[2 * k]
                grad *= activations[k] > 0  # ReLU's derivative, from its output
        for param, g, buffer in zip(params, grads, buffers):
            buffer *= momentum
            buffer += g
            param -= lr * buffer
        return loss

    return step


def torch_step() -> Callable[[], float]:
    torch = torch_or_none()
    layers: list[Any] = []
    for n_in, n_out in zip(SIZES, SIZES[1:]):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for param, value in zip(model.parameters(), initial_weights()):
            param.copy_(torch.from_numpy(value))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = batch()
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


BUILDERS = {"tinytrain": tinytrain_step, "framework_free": framework_free_step, "numpy": numpy_step,
            "numpy_column_major": lambda: numpy_step("F"), "torch": torch_step}


def build(name: str) -> Callable[[], float]:
    """Entry point of a benchmark process: implementation ``name``'s step."""
    return BUILDERS[name]()


def measure(quick: bool = False, with_torch: bool = True) -> dict[str, dict[str, Any]]:
    """Per implementation: median ``seconds`` per step, ``first`` losses, ``faults_per_step``.

    Raises AssertionError when an implementation's first three losses differ
    from tinytrain's (they would not be doing the same computation).
    """
    names = ["tinytrain", "framework_free", "numpy", "numpy_column_major"] + (["torch"] if with_torch else [])
    results = lockstep_medians({name: ("mlp_step:build", (name,)) for name in names},
                               repeats=30 if quick else 100, warmup=10, inner=3, processes=3 if quick else 5)
    for name, found in results.items():
        if not np.allclose(found["first"], results["tinytrain"]["first"], rtol=1e-4, atol=1e-5):
            raise AssertionError(f"MLP step: {name}'s losses {found['first']} differ from tinytrain's "
                                 f"{results['tinytrain']['first']}")
    return results


# -- peak memory ------------------------------------------------------------------------
def theoretical_bytes() -> dict[str, int]:
    """What one step must hold, in float32: the sum the measured peak is compared with.

    parameters + gradients + momentum buffers (one number each per parameter) +
    activations: the input batch and every layer's output (three Linear and two
    ReLU outputs), which backward needs. (The int64 labels, 1 KB, are left out.)
    """
    params = sum(n_in * n_out + n_out for n_in, n_out in zip(SIZES, SIZES[1:]))
    outputs = sum(SIZES[1:]) + sum(SIZES[1:-1])  # Linear outputs + ReLU outputs, per sample
    parts = {
        "parameters": 4 * params,
        "gradients": 4 * params,
        "optimizer_state": 4 * params,
        "activations": 4 * BATCH * (SIZES[0] + outputs),
    }
    parts["total"] = sum(parts.values())
    return parts


def traced_peak(name: str) -> int:
    """Entry point of a benchmark process: peak bytes tracemalloc sees for implementation ``name``.

    A first step, built and run untraced, imports the libraries. Tracing starts
    before the step is built again, so weights, optimizer state and the batch
    count. Two warm-up steps create the momentum buffers and fill every cache;
    then the peak is reset to what is allocated at that moment and two more
    steps run: the result is what stays allocated plus the step's high-water mark.
    """
    BUILDERS[name]()()
    tracemalloc.start()
    step = BUILDERS[name]()
    step()
    step()
    tracemalloc.reset_peak()
    step()
    step()
    return tracemalloc.get_traced_memory()[1]


def peak_memory() -> dict[str, Any]:
    """Peak traced bytes of the tinytrain and hand-written NumPy steps and the theoretical sum."""
    theory = theoretical_bytes()
    return {
        "tinytrain_bytes": run_isolated("mlp_step:traced_peak", "tinytrain"),
        "numpy_bytes": run_isolated("mlp_step:traced_peak", "numpy"),
        "theoretical_bytes": theory["total"],
        "theoretical_parts": theory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    times = measure(args.quick, with_torch=torch_or_none() is not None)
    memory = peak_memory()
    print("MLP 784-256-128-10, batch 128, SGD momentum, cross-entropy; one thread")
    for name, found in times.items():
        spread = ", ".join(f"{seconds * 1e3:.3f}" for seconds in found["process_seconds"])
        print(f"  {name:18s} {found['seconds'] * 1e3:7.3f} ms/step   {found['faults_per_step']:6.1f} page faults/step"
              f"   (processes: {spread})")
    print(f"  {spread_note(times)}")
    ours = times["tinytrain"]["seconds"]
    print(f"  tinytrain / NumPy: {ours / times['numpy']['seconds']:.2f}x (target <= {TARGETS['vs_numpy']}x)")
    print(f"  tinytrain / NumPy with column-major weights: {ours / times['numpy_column_major']['seconds']:.2f}x "
          "(the framework's own cost; no target)")
    print(f"  tinytrain's array work with no framework / NumPy: "
          f"{times['framework_free']['seconds'] / times['numpy']['seconds']:.2f}x (the floor of any framework change)")
    if "torch" in times:
        print(f"  tinytrain / PyTorch: {ours / times['torch']['seconds']:.2f}x (target <= {TARGETS['vs_torch']}x)")
    theory = memory["theoretical_bytes"]
    print(f"  peak memory: tinytrain {memory['tinytrain_bytes'] / 1e6:.2f} MB, NumPy {memory['numpy_bytes'] / 1e6:.2f} MB, "
          f"theoretical {theory / 1e6:.2f} MB -> {memory['tinytrain_bytes'] / theory:.2f}x (target <= 1.5x)")
    if args.json:
        args.json.write_text(json.dumps({"steps": times, "memory": memory}, indent=2) + "\n")


if __name__ == "__main__":
    main()
