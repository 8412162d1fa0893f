"""The GPT milestone end to end: ``milestones/gpt.py`` against the same recipe written in PyTorch.

tinytrain's side is the milestone itself (``tinytrain milestone gpt``: its model,
data, AdamW with two parameter groups, cosine schedule with warm-up, clipping,
``Trainer``, evaluations, checkpoints and callbacks); its time is the
``train_seconds_this_run`` it writes to ``result.json``: the training with its
periodic evaluations, without the final evaluation and the sample.

PyTorch's side is nanoGPT's recipe written here, the way nanoGPT's ``train.py``
runs it: nanoGPT's model (``gpt_step.torch_model``: 4 layers x 4 heads x 128,
context 64, no dropout, the output layer tied to the token embedding, fused
causal attention), batch 12 of windows drawn from the same training text,
``torch.optim.AdamW`` (betas (0.9, 0.99), weight decay 0.1 on the matrices
only), the milestone's schedule (a linear warm-up over 100 steps, or half the
steps of a run shorter than 200, then a cosine from 1e-3 to 1e-4), the
gradient clipped to norm 1.0. Its evaluations are the
milestone's: every 250 steps and at the last one, the next 20 batches of 64
validation windows (side by side, going round), in eval mode without
gradients, each followed by a checkpoint of the model and the optimizer. Its
final validation loss, like the milestone's, is the mean over every validation
window, outside the timed part.

Each side runs in a fresh process of its own with one BLAS thread (PyTorch:
``torch.set_num_threads(1)``); with ``--repeats N`` they take turns, N runs
each, and the medians are compared.

    python benchmarks/gpt_milestone.py                  # the whole milestone: 2,000 steps a side
    python benchmarks/gpt_milestone.py --steps 200      # a quick look (the validation loss is not the pass mark's)
    python benchmarks/gpt_milestone.py [--repeats N] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _timing import run_isolated, torch_or_none  # noqa: E402  (pins BLAS threads first)

import numpy as np  # noqa: E402

import gpt_step  # noqa: E402

STEPS = 2000  # the milestone's default
LR, MIN_LR, WARMUP = 1e-3, 1e-4, 100
EVAL_EVERY, EVAL_BATCHES, EVAL_BATCH_SIZE = 250, 20, 64
VALIDATION_FRACTION = 0.1
PASS_MARK = 1.95  # the milestone's, for the default steps
TARGET = 1.0  # tinytrain's training time over PyTorch's, at most


def warmup_steps(steps: int) -> int:
    """The recipe's 100 warm-up steps; half of a quick run's steps when it has fewer than 200 (the milestone
    needs its warm-up to end before the last step)."""
    return min(WARMUP, steps // 2)


def tinytrain_run(steps: int) -> dict[str, float]:
    """``milestones/gpt.py --steps steps`` in this process: its ``train_seconds`` and final ``val_loss``."""
    from tinytrain.course import milestones

    with tempfile.TemporaryDirectory() as out:
        status = milestones.main("gpt", ["--steps", str(steps), "--warmup", str(warmup_steps(steps)), "--out", out])
        written = Path(out) / milestones.RESULT_FILE
        if not written.exists():  # status 1 with a result is a missed pass mark: the figures still count
            raise RuntimeError(f"the GPT milestone ended with exit status {status} and no {milestones.RESULT_FILE}")
        result = json.loads(written.read_text())
    return {"train_seconds": result["train_seconds_this_run"], "val_loss": result["val_loss"]}


def learning_rate(step: int, steps: int) -> float:
    """The milestone's ``CosineSchedule(LR, MIN_LR, total_epochs=steps, warmup_epochs=warmup_steps(steps))`` at
    ``step``: a linear ramp, then a cosine down to ``MIN_LR``."""
    warmup = warmup_steps(steps)
    if step < warmup:
        return LR * (step + 1) / (warmup + 1)
    if step >= steps:
        return MIN_LR
    progress = (step - warmup) / (steps - warmup)
    return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * progress)) / 2


def text_ids() -> tuple[np.ndarray, np.ndarray]:
    """The milestone's training and validation ids: its text, its character tokenizer, its 90/10 cut."""
    import tinytrain as tt

    text = tt.datasets.shakespeare()
    tokenizer = tt.text.CharTokenizer().train(text)
    cut = int(len(text) * (1 - VALIDATION_FRACTION))
    return (np.asarray(tokenizer.encode(text[:cut]), dtype=np.int64),
            np.asarray(tokenizer.encode(text[cut:]), dtype=np.int64))


def torch_run(steps: int) -> dict[str, float]:
    """nanoGPT's recipe for ``steps`` steps in PyTorch: its ``train_seconds`` and final ``val_loss``."""
    torch = torch_or_none()
    torch.manual_seed(0)
    context, batch = gpt_step.CONTEXT, gpt_step.BATCH
    train_ids, val_ids = text_ids()
    # Validation windows side by side (stride = context), each with its targets one character on.
    starts = np.arange(0, len(val_ids) - context, context)
    val_inputs = torch.from_numpy(np.stack([val_ids[s:s + context] for s in starts]))
    val_targets = torch.from_numpy(np.stack([val_ids[s + 1:s + 1 + context] for s in starts]))
    val_batches = [(val_inputs[i:i + EVAL_BATCH_SIZE], val_targets[i:i + EVAL_BATCH_SIZE])
                   for i in range(0, len(starts), EVAL_BATCH_SIZE)]
    train_inputs = torch.from_numpy(train_ids)
    offsets = torch.arange(context)

    model = gpt_step.torch_model(context)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": gpt_step.WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=gpt_step.BETAS)
    generator = torch.Generator().manual_seed(0)

    @torch.no_grad()
    def mean_loss(batches: list) -> float:
        """The mean cross-entropy per window over ``batches``, in eval mode."""
        model.eval()
        total = sum(model(inputs, targets)[1].item() * len(inputs) for inputs, targets in batches)
        model.train()
        return total / sum(len(inputs) for inputs, _ in batches)

    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        next_batch = 0
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps)
            windows = torch.randint(len(train_ids) - context, (batch,), generator=generator)[:, None] + offsets
            _, loss = model(train_inputs[windows], train_inputs[windows + 1])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, gpt_step.CLIP)
            optimizer.step()
            if (step + 1) % EVAL_EVERY == 0 or step + 1 == steps:
                chosen = [val_batches[(next_batch + i) % len(val_batches)] for i in range(EVAL_BATCHES)]
                next_batch = (next_batch + EVAL_BATCHES) % len(val_batches)
                print(f"step {step + 1}: train loss {loss.item():.4f}, val loss {mean_loss(chosen):.4f}", flush=True)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, Path(out) / "ckpt.pt")
        train_seconds = time.perf_counter() - started
    return {"train_seconds": train_seconds, "val_loss": mean_loss(val_batches)}


RUNS = {"tinytrain": "gpt_milestone:tinytrain_run", "torch": "gpt_milestone:torch_run"}


def measure(steps: int = STEPS, repeats: int = 1, with_torch: bool = True) -> dict[str, Any]:
    """Per side: the median ``train_seconds`` and ``val_loss`` over ``repeats`` runs, and every run's figures.

    The sides take turns, each run in a fresh process, the first side alternating, so that a slow phase of a
    shared machine falls on both alike.
    """
    sides = ["tinytrain"] + (["torch"] if with_torch else [])
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for repeat in range(repeats):
        for side in sides if repeat % 2 == 0 else sides[::-1]:
            runs[side].append(run_isolated(RUNS[side], steps))
    report: dict[str, Any] = {"steps": steps, "repeats": repeats}
    for side, found in runs.items():
        report[side] = {"train_seconds": statistics.median(run["train_seconds"] for run in found),
                        "val_loss": statistics.median(run["val_loss"] for run in found), "runs": found}
    if with_torch:
        report["vs_torch"] = report["tinytrain"]["train_seconds"] / report["torch"]["train_seconds"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps a side (default {STEPS})")
    parser.add_argument("--repeats", type=int, default=1, help="runs a side, taking turns (default 1)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.steps < 2 or args.repeats < 1:
        parser.error(f"--steps must be at least 2 and --repeats at least 1, got {args.steps} and {args.repeats}")
    with_torch = torch_or_none() is not None
    report = measure(args.steps, args.repeats, with_torch)
    print(f"GPT milestone: {args.steps} steps, batch {gpt_step.BATCH} x {gpt_step.CONTEXT}, {gpt_step.LAYERS} layers x "
          f"{gpt_step.HEADS} heads x {gpt_step.EMBED}, evaluations every {EVAL_EVERY} steps; one thread, "
          f"{args.repeats} run(s) a side")
    for side in ["tinytrain"] + (["torch"] if with_torch else []):
        found = report[side]
        print(f"  {side:10s} training {found['train_seconds']:8.1f} s   final validation loss {found['val_loss']:.4f}"
              f"  (runs: " + ", ".join(f"{run['train_seconds']:.1f} s" for run in found["runs"]) + ")")
    if with_torch:
        print(f"  tinytrain / PyTorch: {report['vs_torch']:.2f}x (target <= {TARGET}x"
              + (f"; pass mark: validation loss <= {PASS_MARK})" if args.steps == STEPS else ")"))
    else:
        print("  PyTorch not installed: no PyTorch ratio (pip install torch to compare)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
