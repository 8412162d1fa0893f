"""Milestone, after Module 11: a convolutional network learns to read handwritten digits, on your library.

    python milestones/cnn.py                      # Digits, offline: about 20 s on 2 CPU cores
    python milestones/cnn.py --dataset mnist      # downloads MNIST once
    python milestones/cnn.py --dataset cifar10    # downloads CIFAR-10 once; hours on a CPU
    python milestones/cnn.py --help               # every option: each setting below is one
    tinytrain milestone cnn                       # the same script

The recipe reads top to bottom, as ``milestones/mlp.py`` does, with the same
training; the model is what changes. What every milestone shares -- options and
``--config``, ``--resume``, the output folder, which MPI rank writes,
``result.json``, the plot, naming your module when the run fails in it -- is in
``tinytrain/course/milestones.py``, behind ``start`` and ``finish``.
"""
import sys
import time
from dataclasses import dataclass

import tinytrain as tt
from tinytrain.course.milestones import PrintRow, load_dataset, split_train_validation, start


@dataclass(frozen=True)
class Settings:
    """The recipe's settings; each is also an option (``--batch-size 32``) and a key of ``--config run.toml``."""

    dataset: str = "digits"  # digits ships with tinytrain; mnist, fashion-mnist and cifar10 download once
    epochs: int = 20
    batch_size: int = 64  # per MPI rank with --distributed
    lr: float = 0.05  # the schedule's peak
    min_lr: float = 0.0005  # where its cosine ends
    warmup: int = 2  # epochs
    momentum: float = 0.9
    weight_decay: float = 5e-4
    accumulation_steps: int = 1  # micro-batches per optimizer step
    clip_norm: float = 5.0  # 0: no clipping
    validation_fraction: float = 0.1
    device: str = "cpu"
    precision: str = "32-true"  # or 16-mixed
    seed: int = 0
    out: str = ""  # default runs/cnn-<dataset>
    data_root: str = ""  # a folder with the dataset's files: no download


PASS_MARKS = {"digits": 0.98, "mnist": 0.99, "fashion-mnist": 0.90, "cifar10": 0.70}  # the test accuracy to reach
# Per dataset, the output channels of each convolution of each stage: larger images get more stages (each one
# halves the height and width) and two convolutions per stage.
STAGES = {"digits": ((32, 32), (64,)), "mnist": ((32, 32), (64, 64)), "fashion-mnist": ((32, 32), (64, 64)),
          "cifar10": ((32, 32), (64, 64), (128, 128))}

run = start("cnn", "a convolutional network (Modules 01-11)", Settings(), datasets=tuple(PASS_MARKS))
settings = run.settings  # the defaults above, as --config, a resumed run's settings and the options change them

# -- data ------------------------------------------------------------------------------------------------------------
# Images (N, 1, 8, 8), float32 pixels in [0, 1] (MNIST: 1x28x28, CIFAR-10: 3x32x32), and their labels, int64 class
# ids 0-9, (N,).
full_train = load_dataset(settings.dataset, train=True, root=settings.data_root)
test = load_dataset(settings.dataset, train=False, root=settings.data_root)
# A random tenth of the training images is held out to pick the best epoch. The test images pick nothing: read once,
# at the end, they say how the model does on images it has never seen.
train, validation = split_train_validation(full_train, settings.validation_fraction, settings.seed)
# Shuffled anew every epoch, from the seed: the loader's place travels in the checkpoints, so a resumed run sees the
# same batches. Evaluation keeps no activations for a backward pass, so its batches can be larger -- though smaller
# than the MLP's: a convolutional network's activations take far more memory per image.
train_loader = run.data_loader(train, batch_size=settings.batch_size, shuffle=True, seed=settings.seed,
                               device=settings.device)
val_loader = tt.data.DataLoader(validation, batch_size=128, device=settings.device)
test_loader = tt.data.DataLoader(test, batch_size=128, device=settings.device)

# -- model -----------------------------------------------------------------------------------------------------------
# Stages of 3x3 convolutions, each followed by BatchNorm2d and ReLU; each stage ends in a 2x2 max pool. Then dropout
# and one Linear layer from the last feature maps to the classes. On Digits:
#   (B, 1, 8, 8) -> conv 1->32, conv 32->32 -> (B, 32, 8, 8) -> pool -> (B, 32, 4, 4)
#   -> conv 32->64 -> (B, 64, 4, 4) -> pool -> (B, 64, 2, 2) -> flatten (B, 256) -> Linear -> (B, 10)
# MNIST ends at (B, 64, 7, 7), CIFAR-10 at (B, 128, 4, 4).
channels, height, width = full_train.pixels.shape[1:]
layers = []
for stage in STAGES[settings.dataset]:
    for out_channels in stage:
        # padding 1 keeps the height and width; no bias, since the BatchNorm2d after it adds a shift per channel
        layers += [tt.nn.Conv2d(channels, out_channels, 3, padding=1, bias=False), tt.nn.BatchNorm2d(out_channels),
                   tt.nn.ReLU()]
        channels = out_channels
    layers.append(tt.nn.MaxPool2d(2))
    height, width = height // 2, width // 2
# Dropout zeroes a random quarter of the features in training, so the classifier cannot lean on a few of them.
layers += [tt.nn.Flatten(), tt.nn.Dropout(0.25), tt.nn.Linear(channels * height * width, len(full_train.classes))]
model = tt.nn.Sequential(*layers).to(settings.device)

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
