"""Milestone, after Module 20: the GPT milestone's model adapted to plays it never read, as QLoRA does it.

    python milestones/finetune.py                 # the GPT milestone's best checkpoint, NF4, LoRA, 300 steps
    python milestones/finetune.py --quantize none # LoRA on the float base
    python milestones/finetune.py --help          # every option: each setting below is one
    tinytrain milestone finetune                  # the same script

The recipe, read top to bottom: the base (the GPT milestone's ``best.pkl``,
trained first when it is missing), the target text, the base's loss on it,
the base frozen and quantized to 4-bit NF4, low-rank adapters injected into
its attention's query, key and value layers, the loss, the optimizer over the
adapters alone, the schedule, the Trainer, the callbacks, the training, the
target loss with its pass mark, the adapters saved on their own, and a sample.

The target text is the end of Tiny Shakespeare that the GPT milestone holds
out of training (its last 10%): *The Taming of the Shrew* and *The Tempest*,
comedies whose people (Petruchio, Katharina, Baptista, Prospero) never speak in
the text the base trained on. It ships with tinytrain (Shakespeare is in the
public domain; ``tinytrain/datasets/files`` holds the provenance note). The
first 90% of it adapts, its last 10% measures. The base chose its best
checkpoint by its loss on this same end of the text, but never trained on it.
"""
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tinytrain as tt
from tinytrain.course.milestones import PrintRow, main, saved_settings, start


@dataclass(frozen=True)
class Settings:
    """The recipe's settings; each is also an option (``--lora-r 8``) and a key of ``--config run.toml``."""

    dataset: str = "shakespeare"  # the base's text; the target is the end of it that the base did not train on
    base: str = "runs/gpt-shakespeare"  # the GPT milestone's output folder: checkpoints/best.pkl is the base
    base_options: str = ""  # options for the GPT milestone when the base must be trained first ("--steps 500")
    quantize: str = "nf4"  # the frozen base's weights: nf4 (QLoRA) or none (LoRA on float32)
    targets: str = "c_attn"  # the layers that get adapters, by the last part of their names: attention's q, k, v
    lora_r: int = 8  # the adapters' rank
    lora_alpha: float = 16.0  # their scaling is lora_alpha / lora_r
    lora_dropout: float = 0.0  # on the adapters' input
    steps: int = 300  # optimizer steps
    batch_size: int = 12  # windows per step
    lr: float = 3e-3  # the schedule's peak: adapters start at zero and take larger steps than a whole model
    min_lr: float = 3e-4
    warmup: int = 30  # steps
    clip_norm: float = 1.0  # 0: no clipping
    target_validation_fraction: float = 0.1  # the end of the target text that measures
    eval_every: int = 100  # steps
    eval_batches: int = 20
    sample_length: int = 300  # characters
    temperature: float = 0.8
    top_k: int = 40
    device: str = "cpu"
    seed: int = 0
    out: str = ""  # default runs/finetune-shakespeare


IMPROVEMENT = 0.03  # the pass mark: the target loss at least this far below the float32 base's
ADAPTER_SHARE = 0.01  # and the adapters' file under this share of the base checkpoint's

run = start("finetune", "a GPT adapted to new plays with LoRA on a 4-bit base (Modules 01-20)", Settings(),
            datasets=("shakespeare",), unit="step")
settings = run.settings
if settings.quantize not in ("nf4", "none"):
    raise SystemExit(f"bad settings: quantize must be nf4 or none, got {settings.quantize!r}")
if run.strategy is not None:  # a few thousand adapter parameters: one process is the whole job
    raise SystemExit("the fine-tuning milestone runs in one process; run it without --distributed")

# -- the base --------------------------------------------------------------------------------------------------------
# The GPT milestone's best checkpoint; when it is missing, the GPT milestone runs first (a few minutes), with
# base_options, and the random generators are seeded again afterwards so that this recipe starts as it always does.
base_folder = Path(settings.base)
best = base_folder / "checkpoints" / "best.pkl"
if not best.exists():
    print(f"no base model in {best}: training it first with `tinytrain milestone gpt --out {base_folder} "
          f"{settings.base_options}`".rstrip(), flush=True)
    status = main("gpt", ["--out", str(base_folder), *shlex.split(settings.base_options)])
    if not best.exists():
        raise SystemExit(f"the GPT milestone ended with status {status} and wrote no {best}")
    tt.manual_seed(settings.seed)
base_settings = saved_settings(base_folder)  # its context, its width and depth, where its training text ended

# -- data and tokenizer ----------------------------------------------------------------------------------------------
text = tt.datasets.shakespeare()
tokenizer = tt.text.CharTokenizer().train(text)  # the GPT milestone's: one id per character of the whole text
target = text[int(len(text) * (1 - base_settings["validation_fraction"])):]  # the end the base did not train on
cut = int(len(target) * (1 - settings.target_validation_fraction))
context = base_settings["context"]
adapt = tt.data.TokenWindows(tokenizer.encode(target[:cut]), context)
validation = tt.data.TokenWindows(tokenizer.encode(target[cut:]), context, stride=context)
train_loader = tt.data.DataLoader(adapt, batch_size=settings.batch_size, shuffle=True, seed=settings.seed,
                                  device=settings.device)
val_loader = tt.data.DataLoader(validation, batch_size=64, device=settings.device)
final_loader = tt.data.DataLoader(validation, batch_size=64, device=settings.device)


# -- loss ------------------------------------------------------------------------------------------------------------
def language_model_loss(logits: tt.Tensor, targets: tt.Tensor) -> tt.Tensor:
    """The mean cross-entropy of every next-character prediction, as in the GPT milestone."""
    return tt.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def target_loss(model: tt.nn.Module) -> float:
    """The mean loss per character of the target's held-out end, in evaluation mode, without gradients."""
    model.eval()
    total, count = 0.0, 0
    with tt.no_grad():
        for inputs, targets in final_loader:
            total += language_model_loss(model(inputs), targets).item() * targets.size
            count += targets.size
    return total / count


# -- model: the base, frozen and quantized, with adapters ------------------------------------------------------------
config = tt.nn.GPTConfig(tokenizer.vocab_size, context, base_settings["n_layer"], base_settings["n_head"],
                         base_settings["n_embd"])
model = tt.nn.GPT(config)
model.load_state_dict(tt.serialization.read_checkpoint(best)["model"])
model = model.to(settings.device)
float_bytes, parameters = tt.quantization.model_bytes(model), model.num_parameters()
float_loss = target_loss(model)
print(f"the base ({base_settings['n_layer']} blocks of {base_settings['n_embd']}) on the new plays: "
      f"loss {float_loss:.4f}", flush=True)
# NF4: every Linear weight but the output layer (it is the token embedding's) in 4 bits with block scales; the
# gradient still reaches the layers' inputs, so adapters below them train. 4-bit weights never change.
if settings.quantize == "nf4":
    tt.quantization.quantize_model(model, "nf4")
quantized_loss = target_loss(model)
# Every parameter frozen; A (r x in, random) and B (out x r, zero) beside each target layer: the model starts equal
# to the (quantized) base, and only A and B train.
tt.nn.lora.inject(model, tuple(settings.targets.split(",")), r=settings.lora_r, alpha=settings.lora_alpha,
                  dropout=settings.lora_dropout)
trainable = [p for p in model.parameters() if p.requires_grad]
adapter_count = sum(p.size for p in trainable)
base_bytes = tt.quantization.model_bytes(model) - sum(p.data.nbytes for p in trainable)
print(f"{settings.quantize} base: {base_bytes:,} bytes ({base_bytes / float_bytes:.0%} of float32's), loss "
      f"{quantized_loss:.4f}; adapters: {adapter_count:,} parameters, {adapter_count / parameters:.2%} of the "
      f"model's", flush=True)

# -- optimizer, schedule, trainer ------------------------------------------------------------------------------------
# AdamW over the adapters alone: the frozen base has no gradients and no Adam moments. No weight decay: it would
# pull the adapters back towards the base.
optimizer = tt.optim.AdamW(trainable, lr=settings.lr, betas=(0.9, 0.99), weight_decay=0.0)
schedule = tt.CosineSchedule(max_lr=settings.lr, min_lr=settings.min_lr, total_epochs=settings.steps,
                             warmup_epochs=settings.warmup)
trainer = tt.Trainer(model, optimizer, language_model_loss, scheduler=schedule, scheduler_interval="step",
                     grad_clip_norm=settings.clip_norm or None)

# -- callbacks -------------------------------------------------------------------------------------------------------
# Every eval_every steps: a line, a row of log.csv and a checkpoint of the run (the adapters, the optimizer over
# them, the 4-bit base and every random state: what --resume needs to go on exactly).
checkpoints = tt.callbacks.ModelCheckpoint(run.out / "checkpoints", keep_last=1, monitor="eval_loss", unit="step")
callbacks = [PrintRow("step"), tt.callbacks.CSVLogger(run.out / "log.csv"), checkpoints]

# -- training --------------------------------------------------------------------------------------------------------
run.resume(trainer, checkpoints)
started = time.perf_counter()
trainer.fit(train_loader, val_loader, max_steps=run.until(settings.steps, trainer.step),
            eval_every=settings.eval_every, eval_batches=settings.eval_batches, callbacks=callbacks)
train_seconds = time.perf_counter() - started

# -- the adapters on their own, the final loss and a sample ----------------------------------------------------------
adapters = run.out / "adapters.pkl"  # load with inject(...) then tt.nn.lora.load_adapters(model, path)
tt.nn.lora.save_adapters(model, adapters)
adapter_share = adapters.stat().st_size / best.stat().st_size
val_loss = target_loss(model)
tt.manual_seed(settings.seed)
prompt = tt.tensor([tokenizer.encode("\n")], device=settings.device)
tokens = model.generate(prompt, settings.sample_length, temperature=settings.temperature, top_k=settings.top_k)
sample = tokenizer.decode(tokens.numpy()[0, 1:])
print(f"sample (temperature {settings.temperature}, top_k {settings.top_k}):\n{sample}\n")
print(f"adapters: {adapters} holds {adapters.stat().st_size:,} bytes, {adapter_share:.2%} of the base checkpoint's "
      f"{best.stat().st_size:,}")
pass_mark = float_loss - IMPROVEMENT
passed = val_loss <= pass_mark and adapter_share < ADAPTER_SHARE
result = {"val_loss": val_loss, "base_val_loss": float_loss, "quantized_base_val_loss": quantized_loss,
          "pass_mark": pass_mark, "passed": passed, "trainable_parameters": adapter_count,
          "trainable_share": adapter_count / parameters, "base_bytes": base_bytes, "float_base_bytes": float_bytes,
          "adapter_file_bytes": adapters.stat().st_size, "base_checkpoint_bytes": best.stat().st_size,
          "sample": sample, "train_seconds_this_run": train_seconds}
sys.exit(run.finish(trainer, result, f"loss {val_loss:.4f} on the new plays' last "
                                     f"{settings.target_validation_fraction:.0%}, from {float_loss:.4f} (pass mark <= "
                                     f"{pass_mark:.4f}; adapters file {adapter_share:.2%} of the base checkpoint, "
                                     f"under {ADAPTER_SHARE:.0%})"))
