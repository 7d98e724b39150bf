"""Training a GPT (chapter 10): one step, the loop around it, and ``python -m gptlib.train``.

A training step (:func:`train_step`) computes the next-token loss on a batch, back-propagates it
and lets AdamW update the weights. :func:`train` repeats it with what a real run needs: a
learning-rate schedule (:func:`learning_rate_at`), a periodic estimate of the training and
validation losses (:func:`estimate_loss`) handed to ``callbacks``, a progress bar, atomic
checkpoints that resume exactly, a clear stop on a non-finite loss, bf16 autocast on CUDA, and
several processes under ``torchrun`` (DistributedDataParallel) without code changes.

Reproducibility: :func:`train` seeds PyTorch's global generator (dropout draws from it) with
``config.seed + rank`` and draws batches from its own ``torch.Generator``; both states go into the
checkpoint, so the same seed and config give the same losses on the same machine, and a resumed
run continues exactly where the first one stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from gptlib import distributed
from gptlib.checkpoint import (
    DEFAULT_NAME,
    CheckpointError,
    config_from_dict,
    load_state_into,
    read_checkpoint,
    resolve_path,
    save_checkpoint,
    unwrap,
    vocab_from_checkpoint,
)
from gptlib.cli import (
    HelpFormatter,
    OneLineParser,
    UsageError,
    add_config_options,
    config_from_args,
    float_arg,
    usage_error,
)
from gptlib.config import GPTConfig, TrainConfig, resolve_device
from gptlib.data import (
    CORPORA,
    ChecksumError,
    CorpusUnavailableError,
    atomic_write_bytes,
    get_batch,
    load_corpus,
    train_val_split,
)
from gptlib.model import GPT, check_token_ids
from gptlib.tokenizer import Tokenizer, TokenizerUnavailableError, UnknownTokenError, Vocabulary

__all__ = [
    "HISTORY_KEYS",
    "TrainConfig",
    "clip_factor",
    "estimate_loss",
    "grad_norm",
    "learning_rate_at",
    "make_optimizer",
    "main",
    "optimizer_step",
    "resolve_device",
    "train",
    "train_step",
]

HISTORY_KEYS = ("step", "train_loss", "val_loss", "lr", "tokens_per_sec", "elapsed_s")
EVAL_SEED_OFFSET = 1_000_003  # evaluation batches use their own, fixed seed

# --------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------


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
    params = [p for p in unwrap(model).parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    device_type = torch.device(device).type if device is not None else params[0].device.type
    kind = {"fused": True} if device_type in ("cpu", "cuda") else {"foreach": True}
    betas = (config.beta1, config.beta2)
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=betas, **kind)


_DOT_MIN = 1 << 16  # gradients this large get their sum of squares from one dot product


def grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """The global gradient norm (chapter 10): the square root of the sum of every gradient entry
    squared, as a 0-d tensor. Equal to ``torch.nn.utils.get_total_norm`` up to float rounding;
    a large float32/64 gradient's sum of squares is one dot product with itself (one BLAS pass,
    about twice as fast on a CPU as a norm), the small ones go through one ``_foreach_norm``."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    big, small = [], []
    for g in grads:
        g = g.coalesce().values() if g.is_sparse else g
        dot_ok = g.numel() >= _DOT_MIN and g.dtype in (torch.float32, torch.float64)
        (big if dot_ok else small).append(g.reshape(-1))
    squares = [torch.dot(g, g).float() for g in big]
    squares += [n.float().square() for n in torch._foreach_norm(small)] if small else []
    return torch.stack([s.to(grads[0].device) for s in squares]).sum().sqrt()


def clip_factor(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """What gradient clipping multiplies every gradient by: ``min(1, max_norm / (norm + 1e-6))``,
    PyTorch's formula, as a 0-d tensor (no wait for the GPU)."""
    return (max_norm / (grad_norm(parameters) + 1e-6)).clamp(max=1.0)


def optimizer_step(optimizer: torch.optim.Optimizer, factor: torch.Tensor | None = None) -> None:
    """``optimizer.step()`` with every gradient multiplied by ``factor`` first (gradient clipping).

    A fused Adam/AdamW applies the factor inside its own pass over the weights, through the
    ``grad_scale`` hook that PyTorch's ``GradScaler`` uses (it divides the gradients by it and
    stores the results back): one pass over every gradient saved. Other optimizers get an
    explicit in-place multiply.
    """
    if factor is None:
        optimizer.step()
        return
    fused = isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and optimizer.defaults.get(
        "fused"
    )
    if fused:
        optimizer.grad_scale = 1.0 / factor  # (a 0-d tensor) the gradients are divided by it
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale
        return
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    for grad in grads:
        grad.mul_(factor.to(grad.device))
    optimizer.step()


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float | None = None,
    grad_clip: float = 0.0,
) -> float:
    """One optimizer step on the batch ``x`` -> ``y`` (B, T); returns the batch's loss."""
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    model.train()
    _, loss = model(x, y, return_logits=False)  # the mean next-token cross-entropy
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    factor = clip_factor(model.parameters(), grad_clip) if grad_clip > 0 else None
    optimizer_step(optimizer, factor)
    return loss.item()


def _autocast(device: torch.device, config: TrainConfig):
    if config.autocast_bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported():
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
    different steps are measured on the same windows and compare fairly.
    """
    device = torch.device(device)
    model = unwrap(model)
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(config.seed + EVAL_SEED_OFFSET + rank)
    T = model.config.context_length
    total = torch.zeros((), device=device)
    with _autocast(device, config):
        for _ in range(config.eval_iters):
            x, y = get_batch(data, config.batch_size, T, generator=g, device=device)
            total += model(x, y, return_logits=False)[1].float()
    model.train(was_training)
    return float(distributed.all_reduce_mean(total / config.eval_iters))


# --------------------------------------------------------------------------------------------
# Around the loop: the run's state, resuming, saving, the loss check, progress
# --------------------------------------------------------------------------------------------


def batch_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s batch generator: every process draws different batches."""
    return seed + rank


@dataclass
class RunState:
    """What a run carries from step to step and into its checkpoints."""

    path: Path | None = None  # the checkpoint file (None: no checkpoints)
    step: int = 0  # optimizer steps done
    history: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in HISTORY_KEYS})
    batch_gen: torch.Generator = field(default_factory=torch.Generator)
    vocab: Vocabulary | None = None
    encoding: str | None = None
    last_saved: int | None = None  # the step of the last checkpoint written or resumed from
    optimizer_state: dict | None = None  # to load into the optimizer once it exists

    @property
    def elapsed(self) -> float:
        return self.history["elapsed_s"][-1] if self.history["elapsed_s"] else 0.0


def _check_data(data: torch.Tensor, name: str, model_config: GPTConfig) -> None:
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        shape = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
        raise ValueError(f"{name} must be a 1-D tensor of token ids, got {shape}")
    T = model_config.context_length
    if len(data) < T + 1:
        raise ValueError(
            f"{name} has {len(data)} tokens, but one training window needs context_length + 1 = "
            f"{T + 1}; use more text or a shorter context_length"
        )
    check_token_ids(data, model_config.vocab_size, name)


def _check_resumable(raw: dict, model: GPT, vocab: Vocabulary | None, path: Path) -> None:
    saved = config_from_dict(raw["model_config"], path)
    if saved != model.config:
        a, b = saved.to_dict(), model.config.to_dict()
        diff = ", ".join(f"{k}: checkpoint {a[k]!r} vs model {b[k]!r}" for k in a if a[k] != b[k])
        raise CheckpointError(
            f"cannot resume from {path}: it was saved for a different model ({diff}); build the "
            "model from the checkpoint's config or train into another folder"
        )
    saved_vocab = vocab_from_checkpoint(raw, path)
    if vocab is not None and saved_vocab is not None and vocab != saved_vocab:
        raise CheckpointError(
            f"cannot resume from {path}: its vocabulary differs from the one given, so the token "
            "ids would mean different things; encode the data with the checkpoint's vocabulary"
        )


def _start(
    model: GPT, config: TrainConfig, state: RunState, raw: dict | None, device: torch.device
) -> None:
    """Load a checkpoint's contents ``raw`` into ``model`` and ``state`` (or seed a fresh run)."""
    info = distributed.current()
    if raw is not None:
        _check_resumable(raw, model, state.vocab, state.path)
        load_state_into(model, raw["model_state"], state.path)
        extra = raw.get("extra") or {}
        old = extra.get("history") or {}
        state.step = state.last_saved = int(raw["step"])
        state.history = {k: [float(v) for v in old.get(k, [])] for k in HISTORY_KEYS}
        state.vocab = state.vocab or vocab_from_checkpoint(raw, state.path)
        state.encoding = state.encoding or extra.get("encoding")
        state.optimizer_state = raw.get("optimizer_state")
    starts = distributed.all_gather_objects(state.step)
    if len(set(starts)) > 1:  # every rank must start at the same step, or the ranks would hang
        raise CheckpointError(
            f"cannot resume: the ranks found different checkpoints at {state.path} (steps by "
            f"rank: {starts}); put the checkpoint on a file system every machine shares, or copy "
            "it to the same path on each machine"
        )
    if raw is None:  # dropout uses the global generator, batches their own one
        torch.manual_seed(config.seed + info.rank)
        state.batch_gen.manual_seed(batch_seed(config.seed, info.rank))
    else:
        _restore_rng(raw, info, device, state.batch_gen, config, state.step)


def _restore_rng(
    raw: dict,
    info: distributed.DistInfo,
    device: torch.device,
    batch_gen: torch.Generator,
    config: TrainConfig,
    step: int,
) -> None:
    rngs = (raw.get("extra") or {}).get("rng")
    if isinstance(rngs, list) and len(rngs) == info.world_size:
        mine = rngs[info.rank]
        torch.set_rng_state(mine["torch"])
        batch_gen.set_state(mine["batch"])
        if device.type == "cuda" and mine.get("cuda") is not None:
            torch.cuda.set_rng_state(mine["cuda"], device)
        return
    saved_world = len(rngs) if isinstance(rngs, list) else "an unknown number of"
    if info.is_main:
        warnings.warn(
            f"the checkpoint was written by {saved_world} process(es) and this run has "
            f"{info.world_size}: random states are re-seeded, so the losses will differ from an "
            "uninterrupted run",
            stacklevel=5,  # the caller of train()
        )
    torch.manual_seed(config.seed + info.rank + 7919 * step)
    batch_gen.manual_seed(batch_seed(config.seed, info.rank) + 7919 * step)


def _load_optimizer(optimizer: torch.optim.Optimizer, state: RunState) -> None:
    if state.optimizer_state is None:
        return
    try:
        optimizer.load_state_dict(state.optimizer_state)
    except (ValueError, KeyError, RuntimeError) as err:
        raise CheckpointError(
            f"cannot resume from {state.path}: its optimizer state does not fit this model ({err})"
        ) from None
    state.optimizer_state = None


def _save(
    state: RunState,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    device: torch.device,
) -> None:
    """Write the checkpoint (rank 0) with every rank's random states; all ranks call this."""
    rng = {
        "torch": torch.get_rng_state(),
        "batch": state.batch_gen.get_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }
    rngs = distributed.all_gather_objects(rng)  # every rank's states, indexed by rank
    info = distributed.current()
    if info.is_main:
        extra = {
            "rng": rngs,
            "world_size": info.world_size,
            "history": state.history,
            "encoding": state.encoding,
        }
        save_checkpoint(
            state.path, model, optimizer=optimizer, train_config=config, vocab=state.vocab,
            step=state.step, extra=extra,
        )  # fmt: skip
    distributed.barrier()
    state.last_saved = state.step


def _check_loss(loss: float, state: RunState, device: torch.device) -> None:
    """Stop on a non-finite loss (all ranks agree: the verdict uses the mean over ranks)."""
    if distributed.current().enabled:
        loss = float(distributed.all_reduce_mean(torch.tensor(loss, device=device)))
    if math.isfinite(loss):
        return
    kept = "no checkpoint was written by this run"
    if state.last_saved is not None and state.path is not None:
        kept = f"the last checkpoint, {state.path} (step {state.last_saved}), was left intact"
    raise FloatingPointError(
        f"training stopped: non-finite loss ({loss}) at step {state.step}; {kept}. Try a lower "
        "learning rate, a warm-up, gradient clipping, or bf16 off"
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class _Clock:
    """Training seconds and steps since the last evaluation; :meth:`stop` pauses it (evaluating
    and saving are not training time) and :meth:`go` starts it again."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds, self.steps = device, 0.0, 0
        self.started: float | None = time.perf_counter()

    def stop(self) -> None:
        if self.started is not None:
            _sync(self.device)  # wait for the device to finish the queued steps
            self.seconds += time.perf_counter() - self.started
            self.started = None

    def go(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()


def _evaluate(
    model: GPT,
    data: tuple[torch.Tensor, torch.Tensor],
    config: TrainConfig,
    state: RunState,
    clock: _Clock,
    device: torch.device,
) -> dict[str, float]:
    """Estimate both losses, append them to the history and return the record."""
    seconds, tokens = clock.seconds, clock.steps * config.batch_size * model.config.context_length
    clock.seconds, clock.steps = 0.0, 0
    rank = distributed.current().rank
    record = {
        "step": state.step,
        "train_loss": estimate_loss(model, data[0], config, device=device, rank=rank),
        "val_loss": estimate_loss(model, data[1], config, device=device, rank=rank),
        "lr": learning_rate_at(state.step - 1, config),
        "tokens_per_sec": tokens * distributed.current().world_size / max(seconds, 1e-9),
        "elapsed_s": state.elapsed + seconds,
    }
    for key in HISTORY_KEYS:
        state.history[key].append(float(record[key]))
    return record


def _postfix(loss: float, history: dict[str, list[float]]) -> str:
    text = f"loss {loss:.4f}"
    if history["step"]:
        text += f" | train {history['train_loss'][-1]:.4f} val {history['val_loss'][-1]:.4f}"
        text += f" | {history['tokens_per_sec'][-1]:,.0f} tok/s"
    return text


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------


def _setup(
    model: GPT,
    data: tuple[torch.Tensor, torch.Tensor],
    config: TrainConfig,
    checkpoint_path: str | Path | None,
    resume: bool | dict,
    state: RunState,
) -> tuple[GPT, torch.device, bool]:
    """Check the arguments, move the model to its device and load the checkpoint to resume from
    (read once); returns the bare model, the device and whether a checkpoint was resumed."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    raw_model = unwrap(model)
    if not isinstance(raw_model, GPT):
        raise TypeError(f"train expects a gptlib GPT model, got {type(raw_model).__name__}")
    _check_data(data[0], "train_data", raw_model.config)
    _check_data(data[1], "val_data", raw_model.config)
    if resume is not False and checkpoint_path is None:
        raise ValueError("resume=True needs a checkpoint_path to resume from")
    state.path = resolve_path(checkpoint_path) if checkpoint_path is not None else None
    raw = resume if isinstance(resume, dict) else None
    if resume is True and state.path.exists():
        raw = read_checkpoint(state.path, map_location="cpu")
    device = resolve_device(config.device, distributed.current().local_rank)
    _start(raw_model.to(device), config, state, raw, device)
    return raw_model, device, raw is not None


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
    stop_at: int | None = None,
    quiet: bool = False,
    progress: bool | None = None,
    callbacks: Iterable[Callable[[dict], object]] = (),
) -> dict[str, list[float]]:
    """Train ``model`` on ``train_data`` (1-D model ids) and return its loss history.

    Every ``eval_interval`` steps and at the last step, both losses are estimated and each
    ``callback(record)`` gets the record: a dict with the keys of :data:`HISTORY_KEYS`.
    ``checkpoint_path``: where to save (at the end, and every ``checkpoint_interval`` steps);
    ``resume=True`` continues from it if it exists (or pass its contents, already read with
    :func:`~gptlib.checkpoint.read_checkpoint`). ``stop_at`` ends this call after that step.
    ``vocab``, ``encoding`` go into the checkpoint. ``progress``: a progress bar (default: unless
    ``quiet``). A non-finite loss raises FloatingPointError naming the step."""
    data, state = (train_data, val_data), RunState(None, vocab=vocab, encoding=encoding)
    raw_model, device, resumed = _setup(model, data, config, checkpoint_path, resume, state)
    stop = config.max_iters if stop_at is None else min(int(stop_at), config.max_iters)
    show = distributed.current().is_main and (not quiet if progress is None else progress)
    _say(show and resume is True and not resumed, f"no checkpoint at {state.path}: starting anew")
    _say(show and state.step >= stop, f"nothing to train: the checkpoint is at step {state.step}")
    ddp_model = distributed.wrap(raw_model, device)
    optimizer = make_optimizer(raw_model, config, device)
    _load_optimizer(optimizer, state)
    B, T = config.batch_size, raw_model.config.context_length
    amp, clock, was_training = _autocast(device, config), _Clock(device), raw_model.training
    bar = tqdm(total=stop, initial=min(state.step, stop), disable=not show, desc="train")
    try:
        for step in range(state.step, stop):
            x, y = get_batch(train_data, B, T, generator=state.batch_gen, device=device)
            with amp:  # bf16 on CUDA, nothing elsewhere
                lr = learning_rate_at(step, config)
                loss = train_step(ddp_model, optimizer, x, y, lr=lr, grad_clip=config.grad_clip)
            state.step, clock.steps = step + 1, clock.steps + 1
            _check_loss(loss, state, device)
            bar.update(1)
            evaluate, save = _due(state, config, stop)
            if evaluate or save:
                clock.stop()  # evaluating and saving are not training time
            if evaluate:
                record = _evaluate(raw_model, data, config, state, clock, device)
                bar.set_postfix_str(_postfix(loss, state.history))
                for callback in callbacks:
                    callback(record)
            if save:
                _save(state, raw_model, optimizer, config, device)
            clock.go()
    finally:
        bar.close()
        raw_model.train(was_training)
    return {k: list(v) for k, v in state.history.items()}


def _due(state: RunState, config: TrainConfig, stop: int) -> tuple[bool, bool]:
    """Whether to evaluate, and whether to save a checkpoint, after step ``state.step``."""
    last = state.step == stop
    every = config.checkpoint_interval
    save = state.path is not None and (last or (every > 0 and state.step % every == 0))
    return last or state.step % config.eval_interval == 0, save


def _say(condition: bool, message: str) -> None:
    if condition:
        print(message, file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Command line: python -m gptlib.train
# --------------------------------------------------------------------------------------------

MODEL_HELP = {  # one line per GPTConfig field the command exposes (vocab_size comes from the data)
    "context_length": "the most tokens the model sees",
    "d_model": "width of token vectors",
    "n_heads": "attention heads; must divide d-model",
    "n_blocks": "transformer blocks",
    "ffn_mult": "feed-forward width = mult * d-model",
    "ffn_hidden": "exact feed-forward width; 0 = from --ffn-mult",
    "n_kv_heads": "key/value heads (grouped-query); 0 = n-heads",
    "dropout": "dropout rate",
    "norm": "LayerNorm placement",
    "norm_type": "LayerNorm or RMSNorm (chapter 13)",
    "positions": "positional encoding (rope: chapter 13)",
    "rope_base": "RoPE base of the rotation speeds",
    "scale_embeddings": "do not multiply token embeddings by sqrt(d_model) (chapter 3)",
    "activation": "feed-forward activation",
    "bias": "no biases in Linear/LayerNorm layers",
    "tie_embeddings": "share the input and output embedding",
    "final_norm": "no LayerNorm after the last block",
    "layer_norm_eps": "LayerNorm epsilon",
}
TRAIN_HELP = {  # one line per TrainConfig field
    "batch_size": "windows per step, per process",
    "max_iters": "optimizer steps",
    "learning_rate": "peak learning rate",
    "warmup_iters": "linear warm-up steps",
    "lr_schedule": "cosine decays to --min-lr at --max-iters",
    "min_lr": "end of the cosine",
    "weight_decay": "AdamW decay of weight matrices and embeddings",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "max gradient norm; 0 disables",
    "eval_interval": "estimate the losses every this many steps",
    "eval_iters": "batches per loss estimate",
    "seed": "seeds weights, batches, dropout",
    "device": "auto (cuda > mps > cpu), cpu, cuda[:N], mps",
    "autocast_bf16": "no bf16 autocast on CUDA",
    "checkpoint_interval": "also save every this many steps (0: only at the end)",
}
RENAMES = {"learning_rate": "--lr", "autocast_bf16": "--no-bf16"}
EXAMPLES = """examples:
  python -m gptlib.train sales-textbook --out runs/book --max-iters 2000
  python -m gptlib.train notes.txt --out runs/notes --d-model 128 --context-length 64 \\
      --lr-schedule cosine --warmup-iters 100 --checkpoint-interval 500
  python -m gptlib.train sales-textbook --out runs/book --max-iters 4000 --resume
  python -m gptlib.generate runs/book --prompt "The customer" -n 100

several processes (DistributedDataParallel; gloo on CPU, nccl on CUDA):
  torchrun --nproc_per_node=2 -m gptlib.train sales-textbook --out runs/ddp
several machines (run on each, with its own --node_rank):
  torchrun --nnodes=2 --node_rank=0 --nproc_per_node=4 --rdzv_backend=c10d \\
      --rdzv_endpoint=HOST:29500 -m gptlib.train sales-textbook --out runs/ddp
"""


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m gptlib.train``: run and data options, then one per field."""
    p = OneLineParser(
        prog="python -m gptlib.train",
        description=(
            "Train a small GPT on a text corpus and save a checkpoint (OUT/checkpoint.pt) and its "
            "loss history (OUT/history.json). The same command runs under torchrun for several "
            "processes or machines; only rank 0 writes files and logs."
        ),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    corpora = ", ".join(CORPORA)
    p.add_argument("corpus", nargs="?", default="sales-textbook", help=f"{corpora} or a text file")
    p.add_argument("--out", default="out", help="output folder for checkpoint.pt / history.json")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--param-digest", metavar="PATH", help="write each rank's weights' sha256")
    d = p.add_argument_group("data")
    d.add_argument("--encoding", default="cl100k_base", help="tiktoken encoding")
    d.add_argument("--full-vocab", action="store_true", help="model every id of the encoding")
    d.add_argument("--val-fraction", type=float_arg, default=0.1, help="share held out")
    g = p.add_argument_group("model (ignored with --resume: the checkpoint's model is used)")
    add_config_options(g, GPTConfig, MODEL_HELP)
    g.add_argument(
        "--attention", choices=("auto", "fused", "explicit"), default="auto",
        help="auto = explicit on CPU (faster there for small models), fused elsewhere",
    )  # fmt: skip
    add_config_options(p.add_argument_group("training"), TrainConfig, TRAIN_HELP, RENAMES)
    return p


def _prepare_data(
    args: argparse.Namespace, model_config: GPTConfig, saved: dict | None, ckpt: Path
) -> tuple[GPTConfig, Vocabulary | None, str, torch.Tensor]:
    """The model's config, vocabulary, encoding name and the corpus as model ids; a checkpoint
    to resume from decides the first three."""
    encoding = args.encoding
    if saved is not None:
        encoding = (saved.get("extra") or {}).get("encoding") or encoding
    tiktoken_encoding = Tokenizer(encoding).encoding
    raw_ids = tiktoken_encoding.encode_ordinary(load_corpus(args.corpus))
    if not raw_ids:
        raise UsageError(f"the corpus {args.corpus!r} is empty")
    if saved is not None:
        model_config = config_from_dict(saved["model_config"], ckpt)
        vocab = vocab_from_checkpoint(saved, ckpt)
    else:
        vocab = None if args.full_vocab else Vocabulary.from_ids(raw_ids)
        size = tiktoken_encoding.n_vocab if vocab is None else len(vocab)
        model_config = GPTConfig(**{**model_config.to_dict(), "vocab_size": size})
    ids = torch.tensor(vocab.encode(raw_ids) if vocab is not None else raw_ids, dtype=torch.long)
    return model_config, vocab, encoding, ids


def _split(ids: torch.Tensor, val_fraction: float, context_length: int):
    train_ids, val_ids = train_val_split(ids, val_fraction)
    need = context_length + 1
    if len(train_ids) < need or len(val_ids) < need:
        raise UsageError(
            f"the corpus is too short: {len(train_ids)} training and {len(val_ids)} validation "
            f"tokens, but each split needs at least --context-length + 1 = {need}; use a longer "
            "text, a smaller --context-length or another --val-fraction"
        )
    return train_ids, val_ids


def _run(
    args: argparse.Namespace, config: TrainConfig, model_config: GPTConfig, device: torch.device
) -> int:
    info = distributed.current()
    show = info.is_main and not args.quiet
    out = Path(args.out)
    ckpt = out / DEFAULT_NAME
    saved = read_checkpoint(ckpt) if args.resume and ckpt.exists() else None  # read once
    model_config, vocab, encoding, ids = _prepare_data(args, model_config, saved, ckpt)
    train_ids, val_ids = _split(ids, args.val_fraction, model_config.context_length)
    if saved is not None:
        _say(show, f"resuming from {ckpt} (step {saved['step']}); model options are ignored")
    torch.manual_seed(config.seed)  # the initial weights (DDP then copies rank 0's to all ranks)
    model = GPT(model_config)
    kind = f"compact vocabulary of {len(vocab):,}" if vocab else f"full {encoding}"
    _say(
        show,
        f"model: {model.num_parameters():,} parameters ({kind} tokens); data: {len(train_ids):,}"
        f" training / {len(val_ids):,} validation tokens; device {device}; processes: "
        f"{info.world_size}",
    )
    resume = saved if saved is not None else args.resume  # the checkpoint is read only once
    history = train(
        model, train_ids, val_ids, config, checkpoint_path=ckpt, resume=resume, vocab=vocab,
        quiet=args.quiet, encoding=encoding,
    )  # fmt: skip
    if info.is_main:
        atomic_write_bytes(out / "history.json", json.dumps(history, indent=1).encode())
    if args.param_digest:
        record = {"rank": info.rank, "world_size": info.world_size}
        record |= {"batch_seed": batch_seed(config.seed, info.rank)}
        record |= {"params": distributed.parameter_digest(model)}
        Path(f"{args.param_digest}.rank{info.rank}").write_text(json.dumps(record))
    if history["step"]:
        last = {k: v[-1] for k, v in history.items()}
        _say(
            show,
            f"step {int(last['step'])}: train loss {last['train_loss']:.4f}, val loss "
            f"{last['val_loss']:.4f}; saved {ckpt} and {out / 'history.json'}",
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m gptlib.train``: returns the exit status (0 ok, 1 failure, 2 bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(parser, TrainConfig, args)
    if args.corpus not in CORPORA and not Path(args.corpus).is_file():
        parser.error(
            f"corpus {args.corpus!r} is neither a known corpus ({', '.join(CORPORA)}) nor an "
            "existing text file"
        )
    if not 0.0 < args.val_fraction < 1.0:
        parser.error(f"argument --val-fraction: must be between 0 and 1, got {args.val_fraction}")
    try:
        device = resolve_device(config.device)
    except ValueError as err:
        parser.error(f"argument --device: {err}")
    fused = args.attention == "fused" or (args.attention == "auto" and device.type != "cpu")
    model_config = config_from_args(parser, GPTConfig, args, vocab_size=1, fused_attention=fused)
    errors = (CheckpointError, FloatingPointError, TokenizerUnavailableError, OSError, ValueError)
    errors += (CorpusUnavailableError, ChecksumError, UnknownTokenError)
    try:
        info = distributed.init_from_env(device.type)
        return _run(args, config, model_config, resolve_device(config.device, info.local_rank))
    except UsageError as err:
        return usage_error(parser.prog, str(err))
    except errors as err:
        _say(distributed.is_main_process(), f"error: {err}")
        return 1
    except KeyboardInterrupt:
        _say(distributed.is_main_process(), "error: interrupted")
        return 130
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
