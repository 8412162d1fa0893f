"""Every benchmark figure of tinytrain, measured in one run, as ratios to hand-written NumPy and PyTorch.

    python benchmarks/run.py [--json PATH] [--quick]

Figures: the MLP training step (``mlp_step.py``), the two CNN training steps
(``cnn_step.py``), the convolutions of the CNN milestone alone, forward and
backward (``conv_layer.py``), the CNN milestone's epoch on MNIST- and
CIFAR-10-shaped data (``cnn_epoch.py``, a 5% run scaled up), the GPT training iteration and a generated token with and
without the KV cache (``gpt_step.py``), the GPT milestone's whole training against nanoGPT's recipe in PyTorch
(``gpt_milestone.py``; 200 steps with ``--quick``), autograd overhead (``autograd_overhead.py``), DataLoader
throughput and checkpoint save/load (``data_io.py``), and the peak memory
(tracemalloc) of the MLP and CNN steps against the sum of parameters,
gradients, optimizer state and activations, computed here.

How it measures: one BLAS thread on every side (``_timing`` pins OpenBLAS, MKL
and OpenMP; PyTorch gets ``torch.set_num_threads(1)``); every implementation in
fresh processes of its own (three, since a process's speed depends on where
its arrays land in memory), so that one side's heap history cannot slow
another; the processes take turns, one sample each, so a slow phase of a shared
machine hits all sides alike, and each sample starts with an untimed step that
refills the caches the previous process evicted; the median over processes of
each process's median after warm-up. Ratios are tinytrain's
time (or memory) over the other side's: below 1 means tinytrain is faster
(smaller); for throughput the ratio is still one of times. PyTorch columns are
empty when it is not installed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _timing import run_isolated, spread_note, torch_or_none  # noqa: E402  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import autograd_overhead  # noqa: E402
import data_io  # noqa: E402
import gpt_milestone  # noqa: E402
import gpt_step  # noqa: E402
import mlp_step  # noqa: E402

try:  # the convolution benchmarks come with Module 11: measure(shape, quick, with_torch), peak_memory(shape)
    import cnn_epoch
    import cnn_step
    import conv_layer
except ImportError:
    cnn_step = None
if cnn_step is not None and not all(hasattr(cnn_step, name) for name in ("SHAPES", "CLASSES", "measure", "peak_memory")):
    cnn_step = None
EPOCH_FRACTION = 0.05  # of each CNN milestone epoch, scaled up (cnn_epoch.py)
QUICK_MILESTONE_STEPS = 200  # of the GPT milestone's 2,000, with --quick (gpt_milestone.py)

TARGETS = {  # tinytrain / reference, at most (benchmarks/README.md, "Targets")
    "mlp_vs_torch": 0.85,
    "mlp_vs_numpy": 1.0,
    "cnn_mnist_vs_torch": 1.0,
    "cnn_cifar_vs_torch": 1.0,
    "autograd_vs_torch": 0.8,
    "mlp_memory_vs_theory": 1.5,
    "gpt_vs_torch": 1.0,
    "gpt_cache_speedup": 3.0,  # at least: a token without the KV cache over one with it
    "gpt_milestone_vs_torch": 1.0,  # the milestone's training time, nanoGPT's recipe in PyTorch
    "checkpoint_save_vs_torch": 2.0,  # torch.save neither syncs nor checksums
    "checkpoint_load_vs_torch": 1.25,  # torch.load(weights_only=True)
}


# -- the machine ---------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """CPU model and core count (from lscpu where it exists) and the software versions."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "numpy": np.__version__}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        info["cpu"] = fields.get("Model name", platform.processor())
        info["cpus"] = int(fields.get("CPU(s)", "0") or 0)
        info["cores_per_socket"] = fields.get("Core(s) per socket")
        info["sockets"] = fields.get("Socket(s)")
        info["hypervisor"] = fields.get("Hypervisor vendor")
    except (OSError, subprocess.CalledProcessError, ValueError):
        info["cpu"] = platform.processor() or platform.machine()
    info["blas"] = blas()
    torch = torch_or_none()
    if torch is not None:
        info["torch"] = torch.__version__
    import tinytrain

    info["tinytrain"] = tinytrain.__version__
    return info


def blas() -> str:
    """NumPy's BLAS: library, version and the kernels it runs on this CPU.

    The kernels matter: on our Zen 4 VM OpenBLAS picks its SkylakeX ones, and
    ``OPENBLAS_CORETYPE=Zen`` makes large products 5-10% faster but small ones
    25-40% slower (benchmarks/README.md, "BLAS kernels"). threadpoolctl reads them where it is
    installed; otherwise NumPy's build information names the library only.
    """
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        libraries = []
    else:
        libraries = [library for library in threadpool_info() if library["user_api"] == "blas"]
    if libraries:
        library = libraries[0]
        kernels = f", {library['architecture']} kernels" if library.get("architecture") else ""
        chosen = os.environ.get("OPENBLAS_CORETYPE") if library["internal_api"] == "openblas" else None
        return f"{library['internal_api']} {library['version']}{kernels}" + (
            f" (OPENBLAS_CORETYPE={chosen})" if chosen else "")
    try:
        built = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (TypeError, KeyError):  # NumPy before 1.26 prints its configuration only
        return "unknown (pip install threadpoolctl to see it)"
    return f"{built['name']} {built.get('version', '')}".strip() + " (kernels: pip install threadpoolctl to see them)"


# -- theoretical memory of the CNN steps (the MLP's is mlp_step.theoretical_bytes) -------------
def cnn_theoretical_bytes(shape: str) -> dict[str, int]:
    """float32 parameters + gradients + momentum + activations of a cnn_step model.

    Activations: the input batch and every layer's output (two convolutions, two
    ReLUs, two poolings, the logits; Flatten is a view), which backward needs.
    """
    n, c, size, c1, c2 = cnn_step.SHAPES[shape]
    classes = cnn_step.CLASSES
    params = (c1 * c * 9 + c1) + (c2 * c1 * 9 + c2) + (classes * c2 * (size // 4) ** 2 + classes)
    outputs = (c * size**2 + 2 * c1 * size**2 + c1 * (size // 2) ** 2
               + 2 * c2 * (size // 2) ** 2 + c2 * (size // 4) ** 2 + classes)
    parts = {"parameters": 4 * params, "gradients": 4 * params, "optimizer_state": 4 * params,
             "activations": 4 * n * outputs}
    parts["total"] = sum(parts.values())
    return parts


# -- the figures ---------------------------------------------------------------------------
def collect(quick: bool) -> dict[str, Any]:
    """Every figure, as a JSON-able dict."""
    with_torch = torch_or_none() is not None
    report: dict[str, Any] = {"machine": machine(), "command": "python benchmarks/run.py" + (" --quick" if quick else ""),
                              "quick": quick, "targets": TARGETS}
    started = time.perf_counter()

    print("MLP step ...", flush=True)
    report["mlp_step"] = mlp_step.measure(quick, with_torch)
    report["mlp_memory"] = mlp_step.peak_memory()

    if cnn_step is not None:
        report["cnn"] = {}
        for shape in cnn_step.SHAPES:
            print(f"CNN step ({shape}) ...", flush=True)
            report["cnn"][shape] = {"steps": cnn_step.measure(shape, quick, with_torch),
                                    "memory": cnn_step.peak_memory(shape),
                                    "theoretical": cnn_theoretical_bytes(shape)}
        print("convolution layers ...", flush=True)
        report["conv_layers"] = conv_layer.measure(quick, with_torch)
        print("CNN milestone epochs ...", flush=True)
        report["cnn_epoch"] = {dataset: run_isolated("cnn_epoch:epoch_seconds", dataset, EPOCH_FRACTION)
                               for dataset in cnn_epoch.DATASETS}
    else:
        report["cnn"] = report["conv_layers"] = report["cnn_epoch"] = None

    print("GPT iteration, evaluation batch and token ...", flush=True)
    report["gpt"] = {"train": gpt_step.measure(quick, with_torch), "eval": gpt_step.measure_eval(quick, with_torch),
                     "token": gpt_step.measure_token(quick, with_torch)}
    print("GPT milestone ...", flush=True)
    report["gpt_milestone"] = gpt_milestone.measure(QUICK_MILESTONE_STEPS if quick else gpt_milestone.STEPS,
                                                    with_torch=with_torch)

    print("autograd overhead ...", flush=True)
    report["autograd"] = autograd_overhead.measure(quick, with_torch)
    print("DataLoader ...", flush=True)
    report["dataloader"] = data_io.loader_throughput(quick, with_torch)
    print("checkpoints ...", flush=True)
    report["checkpoint"] = data_io.checkpoint_times(quick, with_torch)
    report["checkpoint_bytes"] = data_io.checkpoint_bytes()
    report["seconds_to_run"] = time.perf_counter() - started
    return report


# -- the table -----------------------------------------------------------------------------
def _ratio(ours: float | None, other: float | None) -> float | None:
    return None if ours is None or other is None else ours / other


def rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: values in display units, ratios, the target and whether it is met."""
    table: list[dict[str, Any]] = []

    def add(figure: str, unit: str, values: dict[str, float | None], scale: float = 1.0,
            targets: dict[str, float] | None = None, throughput: bool = False) -> None:
        shown = {side: None if value is None else value * scale for side, value in values.items()}
        costs = {side: None if value is None else (1 / value if throughput else value) for side, value in values.items()}
        row = {"figure": figure, "unit": unit, **shown,
               "vs_numpy": _ratio(costs.get("tinytrain"), costs.get("numpy")),
               "vs_torch": _ratio(costs.get("tinytrain"), costs.get("torch")), "targets": {}}
        for against, limit in (targets or {}).items():
            ratio = row[f"vs_{against}"]
            row["targets"][against] = {"limit": limit, "met": None if ratio is None else ratio <= limit}
        table.append(row)

    def seconds(results: dict[str, Any]) -> dict[str, float | None]:
        return {side: results[side]["seconds"] if side in results else None for side in ("tinytrain", "numpy", "torch")}

    add("MLP step 784-256-128-10, batch 128", "ms", seconds(report["mlp_step"]), 1e3,
        {"numpy": TARGETS["mlp_vs_numpy"], "torch": TARGETS["mlp_vs_torch"]})
    mlp = report["mlp_step"]
    if "numpy_column_major" in mlp:  # the same array work as tinytrain's: the ratio is the framework's own cost
        add("MLP step against NumPy with tinytrain's column-major weights", "ms",
            {"tinytrain": mlp["tinytrain"]["seconds"], "numpy": mlp["numpy_column_major"]["seconds"], "torch": None}, 1e3)
    if "framework_free" in mlp:  # the floor of any change to the framework (graph capture and replay included)
        add("MLP step of tinytrain's Functions and update on bare arrays, no framework", "ms",
            {"tinytrain": mlp["framework_free"]["seconds"], "numpy": mlp["numpy"]["seconds"],
             "torch": mlp["torch"]["seconds"] if "torch" in mlp else None}, 1e3)
    if report["cnn"]:
        for shape, limit in (("mnist", TARGETS["cnn_mnist_vs_torch"]), ("cifar", TARGETS["cnn_cifar_vs_torch"])):
            n, c, size, _, _ = cnn_step.SHAPES[shape]
            add(f"CNN step {shape.upper()}-shaped, batch {n} of {c}x{size}x{size}", "ms",
                seconds(report["cnn"][shape]["steps"]), 1e3, {"torch": limit})
    if report.get("conv_layers"):
        layers = report["conv_layers"]
        for dataset in cnn_epoch.DATASETS:
            chosen = [index for index, layer in enumerate(conv_layer.LAYERS) if layer[0] == dataset]
            totals = {side: sum(layers[side][part][index] for index in chosen for part in ("forward", "backward"))
                      if side in layers else None for side in ("tinytrain", "numpy", "torch")}
            add(f"Convolutions of the CNN milestone on {dataset}, {len(chosen)} layers, forward + backward, "
                f"batch {conv_layer.BATCH}", "ms", totals, 1e3)
    for dataset, found in (report.get("cnn_epoch") or {}).items():
        add(f"CNN milestone epoch, {dataset}-shaped data ({found['fraction']:.0%} run, scaled)", "s",
            {"tinytrain": found["epoch_seconds"], "numpy": None, "torch": None})
    gpt_train, gpt_token = report["gpt"]["train"], report["gpt"]["token"]
    add(f"GPT iteration, {gpt_step.LAYERS} layers x {gpt_step.EMBED}, batch {gpt_step.BATCH} x {gpt_step.CONTEXT}, "
        "AdamW + clipping", "ms", seconds(gpt_train), 1e3, {"torch": TARGETS["gpt_vs_torch"]})
    batches = gpt_milestone.EVAL_BATCHES * math.ceil(gpt_milestone.STEPS / gpt_milestone.EVAL_EVERY)
    add(f"GPT evaluation batch, {gpt_step.EVAL_BATCH} x {gpt_step.CONTEXT}, no gradients ({batches} in the milestone)",
        "ms", seconds(report["gpt"]["eval"]), 1e3)
    context = gpt_step.GENERATION_CONTEXT
    add(f"GPT token at a {context}-token context, KV cache", "ms",
        {"tinytrain": gpt_token["cached"]["seconds"], "numpy": None, "torch": None}, 1e3)
    add(f"GPT token at a {context}-token context, no cache", "ms",
        {"tinytrain": gpt_token["uncached"]["seconds"], "numpy": None,
         "torch": gpt_token["torch"]["seconds"] if "torch" in gpt_token else None}, 1e3)
    speedup = gpt_token["uncached"]["seconds"] / gpt_token["cached"]["seconds"]
    table.append({"figure": "GPT token: no cache / KV cache", "unit": "x", "tinytrain": speedup, "numpy": None,
                  "torch": None, "vs_numpy": None, "vs_torch": None,
                  "targets": {"speedup": {"limit": TARGETS["gpt_cache_speedup"], "at_least": True,
                                          "met": speedup >= TARGETS["gpt_cache_speedup"]}}})
    milestone = report["gpt_milestone"]
    add(f"GPT milestone, {milestone['steps']:,} steps with its evaluations, training time "
        f"(final validation loss {milestone['tinytrain']['val_loss']:.3f}"
        + (f", PyTorch's {milestone['torch']['val_loss']:.3f})" if "torch" in milestone else ")"), "s",
        {"tinytrain": milestone["tinytrain"]["train_seconds"], "numpy": None,
         "torch": milestone["torch"]["train_seconds"] if "torch" in milestone else None},
        targets={"torch": TARGETS["gpt_milestone_vs_torch"]})
    add("Autograd overhead, 200 chained ops on 64 floats", "ms", seconds(report["autograd"]), 1e3,
        {"torch": TARGETS["autograd_vs_torch"]})
    loader = report["dataloader"]
    add(f"DataLoader, shuffled batches of {data_io.BATCH} x 784 float32", "k samples/s",
        {side: loader[side]["samples_per_second"] if side in loader else None
         for side in ("tinytrain", "numpy", "torch")}, 1e-3, throughput=True)
    size_mb = sum(report["checkpoint_bytes"].values()) / 1e6
    for operation in ("save", "load"):
        add(f"Checkpoint {operation}, {size_mb:.0f} MB (model + momentum)", "ms",
            seconds(report["checkpoint"][operation]), 1e3, {"torch": TARGETS[f"checkpoint_{operation}_vs_torch"]})
    memory = report["mlp_memory"]
    add("MLP step peak memory (tracemalloc)", "MB",
        {"tinytrain": memory["tinytrain_bytes"], "numpy": memory["numpy_bytes"], "torch": None}, 1e-6)
    theory_row = {"figure": "MLP peak memory / theoretical sum", "unit": "x",
                  "tinytrain": memory["tinytrain_bytes"] / memory["theoretical_bytes"],
                  "numpy": memory["numpy_bytes"] / memory["theoretical_bytes"], "torch": None,
                  "vs_numpy": None, "vs_torch": None,
                  "targets": {"theory": {"limit": TARGETS["mlp_memory_vs_theory"],
                                         "met": memory["tinytrain_bytes"] / memory["theoretical_bytes"]
                                         <= TARGETS["mlp_memory_vs_theory"]}}}
    table.append(theory_row)
    if report["cnn"]:
        for shape, entry in report["cnn"].items():
            theory = entry["theoretical"]["total"]
            table.append({"figure": f"CNN {shape.upper()} peak memory / theoretical sum", "unit": "x",
                          "tinytrain": entry["memory"]["tinytrain_bytes"] / theory,
                          "numpy": entry["memory"]["numpy_bytes"] / theory, "torch": None,
                          "vs_numpy": None, "vs_torch": None, "targets": {}})
    return table


def _cell(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits - 1}f}" if abs(value) < 10 else f"{value:.1f}"


def _target_text(row: dict[str, Any]) -> str:
    parts = []
    names = {"numpy": "NumPy", "torch": "PyTorch", "theory": "theory", "speedup": "speedup"}
    for against, found in row["targets"].items():
        verdict = "—" if found["met"] is None else "met" if found["met"] else "**missed**"
        parts.append(f"{'≥' if found.get('at_least') else '≤'} {found['limit']}x {names[against]}: {verdict}")
    return "; ".join(parts)


def markdown(report: dict[str, Any]) -> str:
    """The figures as a Markdown table, with the machine and the command."""
    info = report["machine"]
    lines = [
        f"Machine: {info.get('cpu')}, {info.get('cpus')} CPUs"
        + (f" ({info['hypervisor']} VM)" if info.get("hypervisor") else "")
        + f"; Python {info['python']}, NumPy {info['numpy']} (BLAS: {info.get('blas', 'unknown')})"
        + (f", PyTorch {info['torch']}" if "torch" in info else ", PyTorch not installed")
        + "; one BLAS thread on every side.",
        f"Command: `{report['command']}`",
        "",
        "| Figure | Unit | tinytrain | NumPy (by hand) | PyTorch | tinytrain / NumPy | tinytrain / PyTorch | Target |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows(report):
        ratio = lambda value: "—" if value is None else f"{value:.2f}x"  # noqa: E731
        lines.append(
            f"| {row['figure']} | {row['unit']} | {_cell(row['tinytrain'])} | {_cell(row['numpy'])} | "
            f"{_cell(row['torch'])} | {ratio(row['vs_numpy'])} | {ratio(row['vs_torch'])} | {_target_text(row)} |"
        )
    lines += ["", "Ratios compare times (memory for the memory rows): below 1x tinytrain is faster or smaller. "
              "Checkpoints: NumPy is `np.savez`/`np.load`, PyTorch `torch.save`/`torch.load`, on a RAM disk.", ""]
    timed = {"MLP step": report["mlp_step"], "GPT iteration": report["gpt"]["train"],
             "GPT evaluation batch": report["gpt"]["eval"], "GPT token": report["gpt"]["token"],
             "autograd overhead": report["autograd"]}
    timed.update({f"CNN step {shape}": figures["steps"] for shape, figures in (report["cnn"] or {}).items()})
    lines += [f"{figure}: {spread_note(results)}." for figure, results in timed.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--quick", action="store_true", help="fewer repeats: a smoke test, noisier figures")
    args = parser.parse_args()
    report = collect(args.quick)
    report["table"] = rows(report)
    print()
    print(markdown(report))
    if report["cnn"] is None:
        print("\nCNN figures missing: benchmarks/cnn_step.py (Module 11) is not there or lacks "
              "SHAPES, CLASSES, measure(shape, quick, with_torch) and peak_memory(shape).")
    memory = report["mlp_memory"]
    parts = ", ".join(f"{key} {value / 1e6:.2f} MB" for key, value in memory["theoretical_parts"].items())
    print(f"\nMLP theoretical memory: {parts}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
