"""Milestone, after Module 09: a multi-layer perceptron learns to read handwritten digits, on your library.

    python milestones/mlp.py                      # Digits, offline, about 10 s
    python milestones/mlp.py --dataset mnist      # downloads MNIST once
    python milestones/mlp.py --epochs 10 --lr 0.05
    python milestones/mlp.py --help               # every option: each setting below is one
    tinytrain milestone mlp                       # the same script

The recipe reads top to bottom: its settings, the data, the model, the
optimizer, the schedule, the Trainer, the callbacks, the training and the test
with its pass mark. What every milestone shares -- options and ``--config``,
``--resume``, the output folder, which MPI rank writes, ``result.json``, the
plot, naming your module when the run fails in it -- is in
``tinytrain/course/milestones.py``, behind ``start`` and ``finish``.
"""
import math
import sys
import time
from dataclasses import dataclass

import tinytrain as tt
from tinytrain.course.milestones import PrintRow, load_dataset, split_train_validation, start


@dataclass(frozen=True)
class Settings:
    """The recipe's settings; each is also an option (``--batch-size 32``) and a key of ``--config run.toml``."""

    dataset: str = "digits"  # digits ships with tinytrain; mnist and fashion-mnist download once
    epochs: int = 30
    batch_size: int = 64  # per MPI rank with --distributed
    lr: float = 0.1  # the schedule's peak
    min_lr: float = 0.001  # where its cosine ends
    warmup: int = 2  # epochs
    momentum: float = 0.9
    weight_decay: float = 5e-4
    accumulation_steps: int = 1  # micro-batches per optimizer step
    clip_norm: float = 5.0  # 0: no clipping
    validation_fraction: float = 0.1
    device: str = "cpu"
    precision: str = "32-true"  # or 16-mixed
    seed: int = 0
    out: str = ""  # default runs/mlp-<dataset>
    data_root: str = ""  # a folder with the dataset's files: no download


PASS_MARKS = {"digits": 0.97, "mnist": 0.98, "fashion-mnist": 0.88}  # the test accuracy to reach
HIDDEN_SIZES = {"digits": (128, 64), "mnist": (256, 128), "fashion-mnist": (256, 128)}

run = start("mlp", "a multi-layer perceptron (Modules 01-09)", Settings(), datasets=tuple(PASS_MARKS))
settings = run.settings  # the defaults above, as --config, a resumed run's settings and the options change them

# -- data ------------------------------------------------------------------------------------------------------------
# Images (N, 1, 8, 8), float32 pixels in [0, 1] (MNIST: 1x28x28), and their labels, int64 class ids 0-9, (N,).
full_train = load_dataset(settings.dataset, train=True, root=settings.data_root)
test = load_dataset(settings.dataset, train=False, root=settings.data_root)
# A random tenth of the training images is held out to pick the best epoch. The test images pick nothing: read once,
# at the end, they say how the model does on images it has never seen.
train, validation = split_train_validation(full_train, settings.validation_fraction, settings.seed)
# Shuffled anew every epoch, from the seed: the loader's place travels in the checkpoints, so a resumed run sees the
# same batches. Evaluation keeps no activations for a backward pass, so its batches can be larger.
train_loader = run.data_loader(train, batch_size=settings.batch_size, shuffle=True, seed=settings.seed,
                               device=settings.device)
val_loader = tt.data.DataLoader(validation, batch_size=512, device=settings.device)
test_loader = tt.data.DataLoader(test, batch_size=512, device=settings.device)

# -- model -----------------------------------------------------------------------------------------------------------
pixels = math.prod(full_train.pixels.shape[1:])  # 1 * 8 * 8 = 64
hidden_1, hidden_2 = HIDDEN_SIZES[settings.dataset]
model = tt.nn.Sequential(
    tt.nn.Flatten(),  # (B, 1, 8, 8) -> (B, 64)
    tt.nn.Linear(pixels, hidden_1), tt.nn.ReLU(),  # -> (B, 128)
    tt.nn.Linear(hidden_1, hidden_2), tt.nn.ReLU(),  # -> (B, 64)
    tt.nn.Linear(hidden_2, len(full_train.classes)),  # -> (B, 10): a score per class; the loss takes its softmax
).to(settings.device)

# -- optimizer -------------------------------------------------------------------------------------------------------
# SGD with Nesterov momentum: each step follows a running average of the gradients, measured where that average is
# about to take the weights. Weight decay pulls every weight a little towards 0, so that no few weights dominate.
optimizer = tt.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum, nesterov=True,
                         weight_decay=settings.weight_decay)

# -- schedule --------------------------------------------------------------------------------------------------------
# A linear warm-up first (large steps from random weights can throw training off), then a cosine from lr down to
# min_lr: big steps while the loss falls fast, small ones to settle at the end. The rate changes once per epoch.
schedule = tt.CosineSchedule(max_lr=settings.lr, min_lr=settings.min_lr, total_epochs=settings.epochs,
                             warmup_epochs=settings.warmup)

# -- trainer ---------------------------------------------------------------------------------------------------------
trainer = tt.Trainer(
    model, optimizer, tt.nn.CrossEntropyLoss(), scheduler=schedule,
    grad_clip_norm=settings.clip_norm or None,  # a rare huge gradient is scaled down to this norm, not followed
    precision=settings.precision,  # 16-mixed: float16 compute, float32 master weights, dynamic loss scaling
    strategy=run.strategy,  # --distributed: every MPI rank's gradients averaged before each step
)

# -- callbacks -------------------------------------------------------------------------------------------------------
# After every epoch: a line on the screen, a row of log.csv, and a checkpoint -- the last epoch's, which --resume
# continues from, and best.pkl, the best by validation accuracy. Over MPI, rank 0 alone writes them.
checkpoints = tt.callbacks.ModelCheckpoint(run.out / "checkpoints", keep_last=1, monitor="eval_accuracy")
callbacks = [PrintRow("epoch"), tt.callbacks.CSVLogger(run.out / "log.csv"), checkpoints] if run.is_writer else []

# -- training --------------------------------------------------------------------------------------------------------
# --resume loads the last checkpoint: weights, optimizer, schedule, the loader's place and every random generator,
# so the run goes on exactly as if it had never stopped. --stop-after N ends this invocation N epochs on.
run.resume(trainer, checkpoints)
started = time.perf_counter()
trainer.fit(train_loader, val_loader, epochs=run.until(settings.epochs, trainer.epoch), callbacks=callbacks,
            accumulation_steps=settings.accumulation_steps)
train_seconds = time.perf_counter() - started

# -- test ------------------------------------------------------------------------------------------------------------
test_loss, test_accuracy = trainer.evaluate(test_loader)  # the last epoch's model, in eval mode, without gradients
pass_mark = PASS_MARKS[settings.dataset]
result = {"test_loss": test_loss, "test_accuracy": test_accuracy, "pass_mark": pass_mark,
          "passed": test_accuracy >= pass_mark, "train_seconds_this_run": train_seconds}
sys.exit(run.finish(trainer, result, f"test accuracy {test_accuracy:.4f} (pass mark {pass_mark:.2f})"))
