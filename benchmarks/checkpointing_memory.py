"""Gradient checkpointing: peak memory and time of a training step on a deep MLP.

A stack of ``--depth`` Linear+ReLU layers of width ``--width`` at batch
``--batch``, float32; one forward + backward. Plain, then with every block of
``--every`` layers wrapped in ``nn.Checkpoint`` (default: about sqrt(depth)).
Peak memory is what ``tracemalloc`` sees NumPy allocate during the step (the
weights exist before tracing starts, so it is activations + gradients +
temporaries); time is the median of ``--repeats`` steps. With PyTorch installed,
``torch.utils.checkpoint.checkpoint_sequential`` is timed the same way.

    python benchmarks/checkpointing_memory.py [--depth 32 --width 256 --batch 1024] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import torch_or_none  # noqa: E402  (pins BLAS threads first)

import tinytrain as tt  # noqa: E402
from tinytrain import nn  # noqa: E402


def deep_mlp(depth: int, width: int, every: int) -> nn.Module:
    tt.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
    if every:
        layers = [nn.Checkpoint(nn.Sequential(*layers[i:i + every])) for i in range(0, depth, every)]
    return nn.Sequential(*layers)


def step(model: nn.Module, x: tt.Tensor) -> None:
    model.zero_grad()
    (model(x) ** 2).mean().backward()


def measure(model: nn.Module, x: tt.Tensor, repeats: int) -> dict[str, float]:
    step(model, x)  # warm up: gradients exist from now on, as in training
    tracemalloc.start()
    step(model, x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(model, x)
        times.append(time.perf_counter() - start)
    return {"peak_mib": peak / 2**20, "seconds": statistics.median(times)}


def torch_seconds(depth: int, width: int, batch: int, segments: int, repeats: int) -> dict[str, float] | None:
    torch = torch_or_none()
    if torch is None:
        return None
    from torch.utils.checkpoint import checkpoint_sequential

    model = torch.nn.Sequential(*[m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
    x = torch.randn(batch, width)
    result = {}
    for name, forward in (("plain", model), ("checkpointed", lambda t: checkpoint_sequential(
            model, segments, t, use_reentrant=False))):
        times = []
        for _ in range(repeats + 1):
            model.zero_grad()
            start = time.perf_counter()
            (forward(x) ** 2).mean().backward()
            times.append(time.perf_counter() - start)
        result[name] = statistics.median(times[1:])
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--every", type=int, default=0, help="layers per checkpointed segment (0: ~sqrt(depth))")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    every = args.every or max(1, round(math.sqrt(args.depth)))
    x = tt.randn(args.batch, args.width)
    plain = measure(deep_mlp(args.depth, args.width, 0), x, args.repeats)
    ckpt = measure(deep_mlp(args.depth, args.width, every), x, args.repeats)
    result = {
        "depth": args.depth, "width": args.width, "batch": args.batch, "layers_per_segment": every,
        "plain": plain, "checkpointed": ckpt,
        "peak_reduction": 1 - ckpt["peak_mib"] / plain["peak_mib"],
        "time_ratio": ckpt["seconds"] / plain["seconds"],
        "torch": torch_seconds(args.depth, args.width, args.batch, math.ceil(args.depth / every), args.repeats),
    }
    print(f"deep MLP {args.depth}x{args.width}, batch {args.batch}, segments of {every} layers")
    print(f"  plain         peak {plain['peak_mib']:7.1f} MiB   step {plain['seconds'] * 1e3:7.1f} ms")
    print(f"  checkpointed  peak {ckpt['peak_mib']:7.1f} MiB   step {ckpt['seconds'] * 1e3:7.1f} ms")
    print(f"  peak memory {result['peak_reduction']:.0%} lower, step time x{result['time_ratio']:.2f}")
    if result["torch"]:
        t = result["torch"]
        print(f"  PyTorch checkpoint_sequential: step time x{t['checkpointed'] / t['plain']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
