"""Data in and state out: DataLoader throughput and checkpoint save/load times.

* DataLoader: one shuffled epoch of an MNIST-shaped dataset (float32 784-vectors
  and int64 labels) in batches of 128 — ``tinytrain.data.DataLoader`` over a
  ``TensorDataset``, a hand-written NumPy loop (a permutation, then one fancy
  index per array and batch) and ``torch.utils.data.DataLoader`` over a
  ``TensorDataset`` with default settings (no worker processes).
* Checkpoints: a 50 MB model (three 2048x2048 linear layers, 12.6 M float32
  parameters) with its SGD momentum buffers (another 50 MB): ``Trainer.save_checkpoint``
  / ``load_checkpoint`` against ``torch.save`` / ``torch.load`` of the model's and
  optimizer's state dicts and against ``np.savez`` / ``np.load`` of the arrays.
  Files go to a RAM-backed directory (``/dev/shm`` where it exists), so the
  figures measure serialisation, not the disk (tinytrain's fsync, which makes a
  checkpoint survive a power cut, is nearly free there).

Each side runs in processes of its own (``_timing.lockstep_medians``).

    python benchmarks/data_io.py [--quick]
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from _timing import lockstep_medians, torch_or_none  # noqa: E402  (pins BLAS threads first)

import numpy as np  # noqa: E402

SAMPLES, FEATURES, BATCH = 20_000, 784, 128
WIDTH, LAYERS = 2048, 3  # checkpoint model: LAYERS linear layers of WIDTH x WIDTH (+ bias)


def dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((SAMPLES, FEATURES), dtype=np.float32), rng.integers(0, 10, SAMPLES)


# -- DataLoader: each builder returns a closure that runs one epoch and returns the sample count --
def tinytrain_loader() -> Callable[[], int]:
    import tinytrain as tt

    loader = tt.data.DataLoader(tt.data.TensorDataset(*dataset()), batch_size=BATCH, shuffle=True, seed=0)

    def epoch() -> int:
        return sum(len(x) for x, _ in loader)

    return epoch


def numpy_loader() -> Callable[[], int]:
    x, y = dataset()
    rng = np.random.default_rng(0)

    def epoch() -> int:
        count = 0
        order = rng.permutation(len(x))
        for start in range(0, len(order), BATCH):
            indices = order[start:start + BATCH]
            xb, _ = x[indices], y[indices]
            count += len(xb)
        return count

    return epoch


def torch_loader() -> Callable[[], int]:
    torch = torch_or_none()
    x, y = dataset()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                                         batch_size=BATCH, shuffle=True)

    def epoch() -> int:
        return sum(len(xb) for xb, _ in loader)

    return epoch


LOADERS = {"tinytrain": tinytrain_loader, "numpy": numpy_loader, "torch": torch_loader}


def build_loader(name: str) -> Callable[[], int]:
    """Entry point of a benchmark process: one epoch of loader ``name``."""
    return LOADERS[name]()


def loader_throughput(quick: bool = False, with_torch: bool = True) -> dict[str, dict[str, Any]]:
    """Per side: ``seconds`` per epoch and ``samples_per_second``."""
    names = ["tinytrain", "numpy"] + (["torch"] if with_torch else [])
    results = lockstep_medians({name: ("data_io:build_loader", (name,)) for name in names},
                               repeats=3 if quick else 9, warmup=1, inner=1)
    for found in results.values():
        found["samples_per_second"] = SAMPLES / found["seconds"]
    return results


# -- checkpoints ------------------------------------------------------------------------------
def _checkpoint_path(name: str) -> Path:
    directory = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    path = directory / f"tinytrain-bench-{os.getpid()}-{name}.ckpt"
    atexit.register(lambda: path.unlink(missing_ok=True))
    return path


def _weights() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(WIDTH)
    arrays = []
    for _ in range(LAYERS):
        arrays += [rng.uniform(-bound, bound, (WIDTH, WIDTH)).astype(np.float32),
                   rng.uniform(-bound, bound, WIDTH).astype(np.float32)]
    return arrays


def tinytrain_checkpoint(operation: str) -> Callable[[], None]:
    import tinytrain as tt

    model = tt.nn.Sequential(*[tt.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    optimizer = tt.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for param, value in zip(model.parameters(), _weights()):
        param.data[...] = value
        param.grad = tt.tensor(value)  # one step creates the momentum buffers
    optimizer.step()
    trainer = tt.Trainer(model, optimizer, tt.nn.CrossEntropyLoss())
    path = _checkpoint_path("tinytrain")
    trainer.save_checkpoint(path)
    if operation == "save":
        return lambda: trainer.save_checkpoint(path)
    return lambda: trainer.load_checkpoint(path)


def torch_checkpoint(operation: str) -> Callable[[], None]:
    torch = torch_or_none()
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with torch.no_grad():
        for param, value in zip(model.parameters(), _weights()):
            param.copy_(torch.from_numpy(value))
            param.grad = torch.from_numpy(value).clone()
    optimizer.step()
    path = _checkpoint_path("torch")

    def save() -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    def load() -> None:
        state = torch.load(path)  # weights_only: a safe loader, like tinytrain's
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    save()
    return save if operation == "save" else load


def numpy_checkpoint(operation: str) -> Callable[[], None]:
    params = _weights()
    buffers = [p.copy() for p in params]  # stand-ins for the momentum buffers
    arrays = {f"param{i}": p for i, p in enumerate(params)} | {f"momentum{i}": b for i, b in enumerate(buffers)}
    path = _checkpoint_path("numpy").with_suffix(".npz")

    def save() -> None:
        np.savez(path, **arrays)

    def load() -> None:
        with np.load(path) as saved:
            for key, array in arrays.items():
                array[...] = saved[key]

    save()
    return save if operation == "save" else load


CHECKPOINTS = {"tinytrain": tinytrain_checkpoint, "numpy": numpy_checkpoint, "torch": torch_checkpoint}


def build_checkpoint(name: str, operation: str) -> Callable[[], None]:
    """Entry point of a benchmark process: ``operation`` ("save" or "load") of side ``name``."""
    return CHECKPOINTS[name](operation)


def checkpoint_bytes() -> dict[str, int]:
    params = LAYERS * (WIDTH * WIDTH + WIDTH)
    return {"model": 4 * params, "optimizer_state": 4 * params}


def checkpoint_times(quick: bool = False, with_torch: bool = True) -> dict[str, dict[str, dict[str, Any]]]:
    """``{"save": {side: {"seconds": ...}}, "load": {...}}``."""
    names = ["tinytrain", "numpy"] + (["torch"] if with_torch else [])
    return {
        operation: lockstep_medians({name: ("data_io:build_checkpoint", (name, operation)) for name in names},
                                    repeats=3 if quick else 9, warmup=1, inner=1)
        for operation in ("save", "load")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    with_torch = torch_or_none() is not None
    print(f"DataLoader: {SAMPLES} samples of {FEATURES} float32 + an int64 label, batch {BATCH}, shuffled")
    for name, found in loader_throughput(args.quick, with_torch).items():
        print(f"  {name:10s} {found['samples_per_second']:12,.0f} samples/s")
    size = checkpoint_bytes()
    print(f"checkpoint: model {size['model'] / 1e6:.0f} MB + optimizer state {size['optimizer_state'] / 1e6:.0f} MB")
    for operation, results in checkpoint_times(args.quick, with_torch).items():
        for name, found in results.items():
            print(f"  {operation} {name:10s} {found['seconds'] * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
