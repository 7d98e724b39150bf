"""Training a GPT (chapter 10): one step, and the loop around it.

A training step (:func:`train_step`) computes the next-token loss on a batch, back-propagates it,
clips the gradient's global norm and lets AdamW update the weights: the code chapter 10 writes.
:func:`train` repeats it with what a real run needs: a learning-rate schedule
(:func:`learning_rate_at`), a periodic estimate of the training and validation losses
(:func:`estimate_loss`) handed to ``callbacks``, a progress bar, atomic checkpoints that resume
exactly, a clear stop on a non-finite loss, bf16 autocast on CUDA, and several processes under
``torchrun`` (DistributedDataParallel) without code changes. The run's state between steps and
across restarts (seeding, resuming, saving) is :class:`gptlib.run.RunState`.

``TrainConfig.fast`` (on by default) trains through :mod:`gptlib.fast`: the same maths, computed
faster on a CPU. ``train_step`` called by hand runs the book's code unless given ``fast=True``.

Reproducibility: :func:`train` seeds PyTorch's global generator (dropout draws from it) with
``config.seed + rank`` and draws batches from its own ``torch.Generator``; both states go into the
checkpoint, so the same seed and config give the same losses on the same machine, and a resumed
run continues exactly where the first one stopped.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from gptlib import distributed
from gptlib import fast as _fast
from gptlib.checkpoint import read_checkpoint, resolve_path
from gptlib.checks import check_token_ids, check_window_fits
from gptlib.config import GPTConfig, TrainConfig, resolve_device
from gptlib.data import get_batch
from gptlib.interrupt import DeferredInterrupt, TrainingInterrupted
from gptlib.memory import check_fits, training_bytes
from gptlib.model import GPT
from gptlib.run import HISTORY_KEYS, Clock, RunState
from gptlib.rundir import check_writable
from gptlib.tokenizer import Vocabulary

__all__ = [
    "HISTORY_KEYS",
    "TrainConfig",
    "estimate_loss",
    "learning_rate_at",
    "make_optimizer",
    "resolve_device",
    "train",
    "train_step",
]

EVAL_SEED_OFFSET = 1_000_003  # evaluation batches use their own, fixed seed

# ---- one step -----------------------------------------------------------------------------------


def learning_rate_at(step: int, config: TrainConfig) -> float:
    """The learning rate for optimizer step ``step`` (0-based).

    Linear warm-up from ``lr / warmup_iters`` to ``lr`` over the first ``warmup_iters`` steps;
    then constant, or a half cosine from ``lr`` down to ``min_lr`` at ``max_iters``.
    """
    c = config
    if step < c.warmup_iters:
        return c.learning_rate * (step + 1) / c.warmup_iters
    if c.lr_schedule == "constant":
        return c.learning_rate
    span = max(1, c.max_iters - c.warmup_iters)
    progress = min(1.0, (step - c.warmup_iters) / span)
    return c.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (c.learning_rate - c.min_lr)


def make_optimizer(
    model: torch.nn.Module, config: TrainConfig, device: torch.device | str | None = None
) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings only (group 0), not on biases or
    LayerNorm gains (group 1). Uses the fused implementation on CPU and CUDA (the parameters'
    device when ``device`` is None) and the multi-tensor ``foreach`` one elsewhere."""
    params = [p for p in distributed.unwrap(model).parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    device_type = torch.device(device).type if device is not None else params[0].device.type
    kind = {"fused": True} if device_type in ("cpu", "cuda") else {"foreach": True}
    betas = (config.beta1, config.beta2)
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=betas, **kind)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float | None = None,
    grad_clip: float = 0.0,
    fast: bool = False,
) -> float:
    """One optimizer step on the batch ``x`` -> ``y`` (B, T); returns the batch's loss.

    The book's step: the loss, its gradient, the gradient's global norm clipped to ``grad_clip``
    (0: no clipping), and AdamW's update. ``fast=True`` computes the same through
    :func:`gptlib.fast.train_step`.
    """
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    if fast:
        return _fast.train_step(model, optimizer, x, y, grad_clip)
    model.train()
    _, loss = model(x, y)  # the mean next-token cross-entropy
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA GPU that computes in bf16 natively (compute capability 8.0 and
    newer, or ROCm). ``torch.cuda.is_bf16_supported()`` also says yes where bf16 is only emulated
    (a T4, for one): there it costs precision and brings no speed, so gptlib stays in float32."""
    if device.type != "cuda" or not torch.cuda.is_bf16_supported():
        return False
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device) >= (8, 0)


def _autocast(device: torch.device, config: TrainConfig):
    if config.autocast_bf16 and native_bf16(device):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def estimate_loss(
    model: GPT,
    data: torch.Tensor,
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    rank: int = 0,
) -> float:
    """Mean loss over ``config.eval_iters`` batches in eval mode (averaged over all ranks).

    The batches come from a generator seeded the same way at every call, so estimates made at
    different steps are measured on the same windows and compare fairly. With ``config.fast``
    the loss goes through :class:`gptlib.fast.FastLoss` (the same value).
    """
    device = torch.device(device)
    model = distributed.unwrap(model)
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(config.seed + EVAL_SEED_OFFSET + rank)
    T = model.config.context_length
    total = torch.zeros((), device=device)
    with _autocast(device, config):
        for _ in range(config.eval_iters):
            x, y = get_batch(data, config.batch_size, T, generator=g, device=device)
            loss = _fast.loss_of(model, x, y) if config.fast else model(x, y)[1]
            total += loss.float()
    model.train(was_training)
    return float(distributed.all_reduce_mean(total / config.eval_iters))


# ---- the loop -----------------------------------------------------------------------------------


def train(
    model: GPT,
    train_data: torch.Tensor,
    val_data: torch.Tensor,
    config: TrainConfig,
    *,
    checkpoint_path: str | Path | None = None,
    resume: bool | dict = False,
    vocab: Vocabulary | None = None,
    encoding: str | None = None,
    corpus: str | None = None,
    stop_at: int | None = None,
    quiet: bool = False,
    progress: bool | None = None,
    callbacks: Iterable[Callable[[dict], object]] = (),
) -> dict[str, list[float]]:
    """Train ``model`` on ``train_data`` (1-D model ids) and return its loss history.

    Every ``eval_interval`` steps and at the last step, both losses are estimated and each
    ``callback(record)`` gets the record: a dict with the keys of :data:`HISTORY_KEYS`.
    ``checkpoint_path``: where to save (at the end, and every ``checkpoint_interval`` steps); the
    evaluation with the lowest validation loss so far is also saved, beside it, as ``best.pt``.
    ``resume=True`` continues from it if it exists (or pass its contents, already read with
    :func:`~gptlib.checkpoint.read_checkpoint`). ``stop_at`` ends this call after that step.
    ``vocab``, ``encoding``, ``corpus`` (a name for people) go into the checkpoint; ``progress``
    (default: not ``quiet``) shows a bar. A non-finite loss raises FloatingPointError naming the
    step and the last good checkpoint (never overwritten). Ctrl-C stops after the current step,
    saves if it can and raises :class:`~gptlib.interrupt.TrainingInterrupted` saying so."""
    data, state = (train_data, val_data), RunState(vocab=vocab, encoding=encoding, corpus=corpus)
    raw_model, device, resumed = _setup(model, data, config, checkpoint_path, resume, state)
    stop = config.max_iters if stop_at is None else min(int(stop_at), config.max_iters)
    show = distributed.current().is_main and (not quiet if progress is None else progress)
    _note(show and resume is True and not resumed, f"no checkpoint at {state.path}: starting anew")
    _note(show and state.step >= stop, f"nothing to train: the checkpoint is at step {state.step}")
    stepped = distributed.wrap(_fast.FastLoss(raw_model) if config.fast else raw_model, device)
    run = _Run(raw_model, make_optimizer(raw_model, config, device), data, config, state, device)
    state.load_optimizer(run.optimizer)
    B, T, clip = config.batch_size, raw_model.config.context_length, config.grad_clip
    amp, was_training = _autocast(device, config), raw_model.training
    bar = tqdm(total=stop, initial=min(state.step, stop), disable=not show, desc="train")
    interrupt = DeferredInterrupt(enabled=not distributed.current().enabled)
    try:
        with interrupt:
            for step in range(state.step, stop):
                x, y = get_batch(train_data, B, T, generator=state.batch_gen, device=device)
                lr = learning_rate_at(step, config)
                with amp:  # bf16 on CUDA, nothing elsewhere
                    loss = train_step(
                        stepped, run.optimizer, x, y, lr=lr, grad_clip=clip, fast=config.fast
                    )
                state.step, run.clock.steps = step + 1, run.clock.steps + 1
                state.check_loss(loss, device)
                bar.update(1)
                _after_step(run, stop, loss, bar, callbacks, (x, y))
                if interrupt.requested:  # Ctrl-C came during this step: it is complete now
                    _stop_interrupted(run, (x, y))
    finally:
        bar.close()
        raw_model.train(was_training)
    return {k: list(v) for k, v in state.history.items()}


@dataclass
class _Run:
    """What the steps of one :func:`train` call share."""

    model: GPT
    optimizer: torch.optim.Optimizer
    data: tuple[torch.Tensor, torch.Tensor]
    config: TrainConfig
    state: RunState
    device: torch.device
    clock: Clock = field(init=False)

    def __post_init__(self) -> None:
        self.clock = Clock(self.device)


def _after_step(run: _Run, stop: int, loss: float, bar, callbacks, batch) -> None:
    """Evaluate, keep the best checkpoint and save, when due after this step. Weights are saved
    only when they still give a finite loss: the step's own loss was computed before its update,
    so an evaluation or a ``batch`` passed through the updated model checks them."""
    state, args = run.state, (run.model, run.optimizer, run.config, run.device)
    evaluate, save = state.due(run.config, stop)
    if evaluate or save:
        run.clock.stop()  # evaluating and saving are not training time
    if evaluate:
        record = _evaluate(run.model, run.data, run.config, state, run.clock, run.device)
        state.check_record(record)
        bar.set_postfix_str(_postfix(loss, state.history))
        state.keep_if_best(*args)
        for callback in callbacks:
            callback(record)
    if save:
        if not evaluate:
            _check_updated(run, batch)
        state.save(*args)
    run.clock.go()


@torch.no_grad()
def _check_updated(run: _Run, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Stop unless the weights after this step's update still give a finite loss on its batch."""
    was_training = run.model.training
    run.model.eval()
    loss = run.model(*batch)[1].item()
    run.model.train(was_training)
    run.state.check_loss(loss, run.device, "the updated weights give a non-finite loss")


def _stop_interrupted(run: _Run, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """After Ctrl-C: save the step just finished (when there is somewhere to save it) and raise
    TrainingInterrupted with what was kept."""
    state = run.state
    if state.path is None:
        raise TrainingInterrupted(
            f"interrupted at step {state.step}; nothing was saved: give train() a "
            "checkpoint_path (the command line always has one, --out) to keep the work"
        )
    if state.last_saved != state.step:
        _check_updated(run, batch)
        state.save(run.model, run.optimizer, run.config, run.device)
    raise TrainingInterrupted(
        f"interrupted at step {state.step}: saved {state.path} (step {state.step}); train "
        "again with resume=True (the command line's --resume) to continue"
    )


def _setup(
    model: GPT,
    data: tuple[torch.Tensor, torch.Tensor],
    config: TrainConfig,
    checkpoint_path: str | Path | None,
    resume: bool | dict,
    state: RunState,
) -> tuple[GPT, torch.device, bool]:
    """Check the arguments, move the model to its device and resume from the checkpoint (read
    once) or seed a fresh run; returns the bare model, the device and whether it resumed."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    raw_model = distributed.unwrap(model)
    if not isinstance(raw_model, GPT):
        raise TypeError(f"train expects a gptlib GPT model, got {type(raw_model).__name__}")
    _check_data(data[0], "train_data", raw_model.config)
    _check_data(data[1], "val_data", raw_model.config)
    if resume is not False and checkpoint_path is None:
        raise ValueError("resume=True needs a checkpoint_path to resume from")
    state.path = resolve_path(checkpoint_path) if checkpoint_path is not None else None
    if state.path is not None and distributed.current().is_main:
        check_writable(state.path.parent)  # before the first step, not after the last
    raw = resume if isinstance(resume, dict) else None
    if resume is True and state.path.exists():
        raw = read_checkpoint(state.path, map_location="cpu")
    device = resolve_device(config.device, distributed.current().local_rank)
    _check_memory(raw_model.config, config, device)
    raw_model.to(device)
    if raw is None:
        state.seed(config)
    else:
        state.resume(raw, raw_model, config, device)
    return raw_model, device, raw is not None


def _check_memory(model_config: GPTConfig, config: TrainConfig, device: torch.device) -> None:
    """Refuse a batch whose training step cannot fit, before the first step allocates it."""
    need = training_bytes(model_config, config.batch_size, device.type)
    check_fits(
        need.total - need.weights,  # the weights exist already
        f"a training step of batch size {config.batch_size}",
        "use a smaller batch_size (--batch-size) or a smaller model",
        device,
    )


def _check_data(data: torch.Tensor, name: str, model_config: GPTConfig) -> None:
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        shape = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
        raise ValueError(f"{name} must be a 1-D tensor of token ids, got {shape}")
    check_window_fits(len(data), model_config.context_length, name)
    check_token_ids(data, model_config.vocab_size, name)


def _evaluate(
    model: GPT,
    data: tuple[torch.Tensor, torch.Tensor],
    config: TrainConfig,
    state: RunState,
    clock: Clock,
    device: torch.device,
) -> dict[str, float]:
    """Estimate both losses, append them to the history and return the record."""
    seconds, steps = clock.lap()
    tokens = steps * config.batch_size * model.config.context_length
    info = distributed.current()
    record = {
        "step": state.step,
        "train_loss": estimate_loss(model, data[0], config, device=device, rank=info.rank),
        "val_loss": estimate_loss(model, data[1], config, device=device, rank=info.rank),
        "lr": learning_rate_at(state.step - 1, config),
        "tokens_per_sec": tokens * info.world_size / max(seconds, 1e-9),
        "elapsed_s": state.elapsed + seconds,
    }
    state.record(record)
    return record


def _postfix(loss: float, history: dict[str, list[float]]) -> str:
    text = f"loss {loss:.4f}"
    if history["step"]:
        text += f" | train {history['train_loss'][-1]:.4f} val {history['val_loss'][-1]:.4f}"
        text += f" | {history['tokens_per_sec'][-1]:,.0f} tok/s"
    return text


def _note(condition: bool, message: str) -> None:
    """Tell the user (on stderr) when ``condition`` holds."""
    if condition:
        print(message, file=sys.stderr)


if __name__ == "__main__":  # ``python -m gptlib.train``: the command lives in gptlib.commands
    from gptlib.commands.train import main

    sys.exit(main())
