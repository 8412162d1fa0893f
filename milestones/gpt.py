"""Milestone, after Module 15: a character-level GPT learns to write like Shakespeare, on your library.

    python milestones/gpt.py                      # nanoGPT's CPU recipe, offline, a few minutes
    python milestones/gpt.py --steps 200          # a quick look
    python milestones/gpt.py --help               # every option: each setting below is one
    tinytrain milestone gpt                       # the same script

nanoGPT's recipe for Tiny Shakespeare on a CPU, read top to bottom: its
settings, the text and its tokenizer, the model, the loss, the optimizer with
its parameter groups, the schedule, the Trainer, the callbacks, the training
by optimizer steps, the final validation loss with its pass mark, and a sample.
What every milestone shares -- options and ``--config``, ``--resume``, the
output folder, which MPI rank writes, ``result.json``, the plot, naming your
module when the run fails in it -- is in ``tinytrain/course/milestones.py``,
behind ``start`` and ``finish``.
"""
import sys
import time
from dataclasses import dataclass

import tinytrain as tt
from tinytrain.course.milestones import PrintRow, start


@dataclass(frozen=True)
class Settings:
    """The recipe's settings; each is also an option (``--batch-size 32``) and a key of ``--config run.toml``."""

    dataset: str = "shakespeare"  # ships with tinytrain
    steps: int = 2000  # optimizer steps: a language model trains on a stream of windows, not by epochs
    batch_size: int = 12  # windows per step (per MPI rank with --distributed)
    context: int = 64  # characters per window: the most the model looks back
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 128  # channels of every position's vector
    dropout: float = 0.0
    checkpointing: bool = False
    lr: float = 1e-3  # the schedule's peak
    min_lr: float = 1e-4  # where its cosine ends
    warmup: int = 100  # steps
    weight_decay: float = 0.1
    accumulation_steps: int = 1  # micro-batches per optimizer step
    clip_norm: float = 1.0  # 0: no clipping
    validation_fraction: float = 0.1
    eval_every: int = 250  # steps
    eval_batches: int = 20
    sample_length: int = 300  # characters
    temperature: float = 0.8
    top_k: int = 40
    device: str = "cpu"
    precision: str = "32-true"  # or 16-mixed
    seed: int = 0
    out: str = ""  # default runs/gpt-shakespeare


PASS_MARKS = {"shakespeare": 1.95}  # the validation loss per character to get below

run = start("gpt", "a character-level GPT (Modules 01-15)", Settings(), datasets=tuple(PASS_MARKS), unit="step")
settings = run.settings  # the defaults above, as --config, a resumed run's settings and the options change them

# -- data and tokenizer ----------------------------------------------------------------------------------------------
text = tt.datasets.shakespeare()  # one string of 1,115,394 characters
# One id per distinct character (65 of them), taken from the whole text: its held-out end has no new ones.
tokenizer = tt.text.CharTokenizer().train(text)
# The first 90% of the text trains, the last 10% validates: text the model has never seen, not shuffled into it.
cut = int(len(text) * (1 - settings.validation_fraction))
train_text, val_text = text[:cut], text[cut:]
# A sample is a window of context ids, (T,), and its targets, the same window one character on, (T,): every position
# learns to predict the character after it. Training takes a window at every start (stride 1), shuffled; validation
# lays them side by side, so each character is predicted once.
train = tt.data.TokenWindows(tokenizer.encode(train_text), settings.context)
validation = tt.data.TokenWindows(tokenizer.encode(val_text), settings.context, stride=settings.context)
# The training loader is read as one stream of batches (--resume continues in the middle of an epoch). Periodic
# evaluations read eval_batches batches of validation at a time, going round; the final one reads all of it.
train_loader = run.data_loader(train, batch_size=settings.batch_size, shuffle=True, seed=settings.seed,
                               device=settings.device)
val_loader = tt.data.DataLoader(validation, batch_size=64, device=settings.device)
final_loader = tt.data.DataLoader(validation, batch_size=64, device=settings.device)

# -- model -----------------------------------------------------------------------------------------------------------
# (B, T) ids -> token and position embeddings (B, T, 128) -> n_layer blocks, each causal self-attention and an MLP,
# (B, T, 128) -> LayerNorm -> lm_head, sharing the token embedding's weights -> (B, T, 65): a score per character
# for the next position. --checkpointing recomputes each block's activations in backward instead of keeping them.
config = tt.nn.GPTConfig(tokenizer.vocab_size, settings.context, settings.n_layer, settings.n_head, settings.n_embd,
                         dropout=settings.dropout, checkpointing=settings.checkpointing)
model = tt.nn.GPT(config).to(settings.device)


# -- loss ------------------------------------------------------------------------------------------------------------
def language_model_loss(logits: tt.Tensor, targets: tt.Tensor) -> tt.Tensor:
    """The mean cross-entropy of every next-character prediction: (B, T, V) logits against (B, T) ids, each
    position counted as one sample of (B*T, V) against (B*T,)."""
    return tt.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- optimizer -------------------------------------------------------------------------------------------------------
# AdamW: each parameter's step is scaled by its own gradient history, and weight decay shrinks the weights directly.
# Two parameter groups, as nanoGPT has them: the matrices (Linear weights, the embeddings) decay; the vectors (biases,
# LayerNorm gains and shifts) do not -- shrinking those only scales and shifts a layer's output. beta2 is 0.99 as in
# nanoGPT's Shakespeare recipe (its default is 0.95): 768 tokens a step give noisy gradients, and a longer average of
# their squares steadies the step sizes.
optimizer = tt.optim.AdamW(tt.optim.weight_decay_groups(model.parameters(), settings.weight_decay), lr=settings.lr,
                           betas=(0.9, 0.99))

# -- schedule --------------------------------------------------------------------------------------------------------
# A linear warm-up while Adam's averages are still noisy, then a cosine down to min_lr, changed at every step.
schedule = tt.CosineSchedule(max_lr=settings.lr, min_lr=settings.min_lr, total_epochs=settings.steps,
                             warmup_epochs=settings.warmup)

# -- trainer ---------------------------------------------------------------------------------------------------------
trainer = tt.Trainer(
    model, optimizer, language_model_loss, scheduler=schedule, scheduler_interval="step",
    grad_clip_norm=settings.clip_norm or None,  # a rare huge gradient is scaled down to this norm, not followed
    precision=settings.precision,  # 16-mixed: float16 compute, float32 master weights, dynamic loss scaling
    strategy=run.strategy,  # --distributed: every MPI rank's gradients averaged before each step
)

# -- callbacks -------------------------------------------------------------------------------------------------------
# After every evaluation (every eval_every steps, and at the end): a line on the screen, a row of log.csv and a
# checkpoint -- the last one, which --resume continues from, and best.pkl, the lowest validation loss. Over MPI,
# rank 0 alone writes them.
checkpoints = tt.callbacks.ModelCheckpoint(run.out / "checkpoints", keep_last=1, monitor="eval_loss", unit="step")
callbacks = [PrintRow("step"), tt.callbacks.CSVLogger(run.out / "log.csv"), checkpoints] if run.is_writer else []

# -- training --------------------------------------------------------------------------------------------------------
# --resume loads the last checkpoint: weights, optimizer, schedule, the loader's place and every random generator,
# so the run goes on exactly as if it had never stopped. --stop-after N ends this invocation N steps on.
run.resume(trainer, checkpoints)
started = time.perf_counter()
trainer.fit(train_loader, val_loader, max_steps=run.until(settings.steps, trainer.step),
            eval_every=settings.eval_every, eval_batches=settings.eval_batches, callbacks=callbacks,
            accumulation_steps=settings.accumulation_steps)
train_seconds = time.perf_counter() - started

# -- final evaluation and a sample -----------------------------------------------------------------------------------
val_loss, _ = trainer.evaluate(final_loader)  # all of the held-out text, in eval mode, without gradients
tt.manual_seed(settings.seed)  # the same sample from the same weights, resumed or not
prompt = tt.tensor([tokenizer.encode("\n")], device=settings.device)  # (1, 1): begin as a new line would
tokens = model.generate(prompt, settings.sample_length, temperature=settings.temperature, top_k=settings.top_k)
sample = tokenizer.decode(tokens.numpy()[0, 1:])  # (1, 1 + sample_length) ids, less the prompt, as text
print(f"sample (temperature {settings.temperature}, top_k {settings.top_k}):\n{sample}\n")
pass_mark = PASS_MARKS[settings.dataset]
result = {"val_loss": val_loss, "pass_mark": pass_mark, "passed": val_loss <= pass_mark, "sample": sample,
          "train_seconds_this_run": train_seconds}
sys.exit(run.finish(trainer, result, f"validation loss {val_loss:.4f} on the last {settings.validation_fraction:.0%} "
                                     f"of the text (pass mark <= {pass_mark:.2f})"))
