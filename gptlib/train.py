"""Training a GPT: the loop, its configuration, and the ``python -m gptlib.train`` command.

One training step draws a batch of windows from the token stream, computes the next-token
cross-entropy, back-propagates it and lets AdamW update the weights. Around that core,
:func:`train` adds what a real run needs: a learning-rate schedule (warm-up, cosine decay),
gradient clipping, a periodic estimate of the training and validation loss, a progress bar,
atomic checkpoints that can be resumed exactly, a clear stop on a non-finite loss, bf16 autocast
on CUDA, and several processes under ``torchrun`` (DistributedDataParallel) without code changes.

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
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from gptlib import distributed
from gptlib.checkpoint import (
    DEFAULT_NAME,
    CheckpointError,
    atomic_write,
    config_from_dict,
    load_state_into,
    read_checkpoint,
    resolve_path,
    save_checkpoint,
    unwrap,
)
from gptlib.data import (
    CORPORA,
    ChecksumError,
    CorpusUnavailableError,
    get_batch,
    load_corpus,
    train_val_split,
)
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import Tokenizer, TokenizerUnavailableError, UnknownTokenError, Vocabulary

LR_SCHEDULES = ("constant", "cosine")
HISTORY_KEYS = ("step", "train_loss", "val_loss", "lr", "tokens_per_sec", "elapsed_s")
EVAL_SEED_OFFSET = 1_000_003  # evaluation batches use their own, fixed seed


@dataclass
class TrainConfig:
    """Every knob of a training run. Defaults suit the book's small model on a CPU."""

    batch_size: int = 4
    max_iters: int = 2000  # optimizer steps in the whole run (the schedule's horizon)
    learning_rate: float = 1e-3
    warmup_iters: int = 0  # linear warm-up steps
    lr_schedule: str = "constant"  # "constant" | "cosine" (cosine decays to min_lr at max_iters)
    min_lr: float = 1e-4
    weight_decay: float = 0.1  # applied to weight matrices and embeddings, not biases or norms
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    eval_interval: int = 100  # estimate the losses every this many steps (and at the last)
    eval_iters: int = 20  # batches per loss estimate
    seed: int = 1337
    device: str = "auto"  # "auto" = cuda > mps > cpu, or an explicit device string
    autocast_bf16: bool = True  # bf16 autocast, used only on CUDA
    checkpoint_interval: int = 0  # 0 = save only at the end (when a checkpoint path is given)

    def __post_init__(self) -> None:
        problems = []
        for name in ("batch_size", "max_iters", "eval_interval", "eval_iters"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("warmup_iters", "checkpoint_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            problems.append(f"seed must be an integer, got {self.seed!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            problems.append(f"learning_rate must be a positive number, got {self.learning_rate}")
        if self.lr_schedule not in LR_SCHEDULES:
            problems.append(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not (math.isfinite(self.min_lr) and self.min_lr >= 0):
            problems.append(f"min_lr must be >= 0, got {self.min_lr}")
        elif self.lr_schedule == "cosine" and self.min_lr > self.learning_rate:
            problems.append(
                f"min_lr ({self.min_lr}) must not exceed learning_rate ({self.learning_rate})"
            )
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            problems.append(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if not isinstance(self.device, str) or not self.device:
            problems.append(f"device must be a string such as 'auto' or 'cpu', got {self.device!r}")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``"auto"`` -> the best available device (cuda > mps > cpu); else the named one, checked.

    Under torchrun, a bare ``"cuda"`` means this process's GPU, ``cuda:LOCAL_RANK``.
    """
    mps = getattr(torch.backends, "mps", None)
    mps_ok = mps is not None and mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("mps") if mps_ok else torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but CUDA is not available; use cpu/auto")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    elif device.type == "mps" and not mps_ok:
        raise ValueError("device 'mps' was requested but MPS is not available; use cpu or auto")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    return device


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


def make_optimizer(model: torch.nn.Module, config: TrainConfig, device: torch.device):
    """AdamW with weight decay on matrices and embeddings only (not biases or LayerNorm gains).

    Uses the fused implementation (one kernel for all parameters) on CPU and CUDA, and the
    multi-tensor ``foreach`` one elsewhere.
    """
    params = [p for p in unwrap(model).parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kind = {"fused": True} if device.type in ("cpu", "cuda") else {"foreach": True}
    return torch.optim.AdamW(
        groups, lr=config.learning_rate, betas=(config.beta1, config.beta2), **kind
    )


def batch_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s batch generator: every process draws different batches."""
    return seed + rank


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy whose softmax work stays in the CPU cache (see :func:`cross_entropy`)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        N, V = logits.shape
        rows = max(1, (1 << 18) // V)  # ~1 MB of logits per chunk
        lse = torch.empty(N, dtype=logits.dtype, device=logits.device)  # (N,)
        for i in range(0, N, rows):
            lse[i : i + rows] = torch.logsumexp(logits[i : i + rows], dim=-1)
        ctx.save_for_backward(logits, lse, targets)
        ctx.rows = rows
        picked = logits.gather(1, targets[:, None]).squeeze(1)  # (N,) the targets' logits
        return (lse - picked).mean()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, lse, targets = ctx.saved_tensors
        N = logits.shape[0]
        scale = grad_out / N
        grad = torch.empty_like(logits)  # (N, V): (softmax - one_hot) * scale
        for i in range(0, N, ctx.rows):
            chunk = grad[i : i + ctx.rows]
            torch.sub(logits[i : i + ctx.rows], lse[i : i + ctx.rows, None], out=chunk)
            chunk.exp_().mul_(scale)
        grad[torch.arange(N, device=grad.device), targets] -= scale
        return grad, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits`` (..., V) against ``targets`` (...).

    The same value and gradient as :func:`torch.nn.functional.cross_entropy` (up to float
    rounding), computed as ``logsumexp(logits) - logits[target]`` with the gradient
    ``softmax(logits) - one_hot(target)`` written in one pass, a few rows at a time. PyTorch's
    version materialises ``log_softmax`` and a zero-filled gradient of the full (N, V) size,
    which dominates a CPU training step when V is large (100,070 for the book's full
    vocabulary); this one runs about twice as fast there. :func:`train` uses it on CPU.
    """
    V = logits.shape[-1]
    return _CrossEntropy.apply(logits.reshape(-1, V).float(), targets.reshape(-1))


def _autocast(device: torch.device, config: TrainConfig):
    if config.autocast_bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


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
            x, y = get_batch(data, config.batch_size, T, generator=g)
            _, loss = model(x.to(device), y.to(device))
            total += loss.float()
    model.train(was_training)
    return float(distributed.all_reduce_mean(total / config.eval_iters))


def _check_data(data: torch.Tensor, name: str, model_config: GPTConfig) -> None:
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        shape = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
        raise ValueError(f"{name} must be a 1-D tensor of token ids, got {shape}")
    if data.dtype.is_floating_point or data.dtype == torch.bool or data.is_complex():
        raise TypeError(f"{name} must hold integer token ids, got {data.dtype}")
    T = model_config.context_length
    if len(data) < T + 1:
        raise ValueError(
            f"{name} has {len(data)} tokens, but one training window needs context_length + 1 = "
            f"{T + 1}; use more text or a shorter context_length"
        )
    lo, hi = int(data.min()), int(data.max())
    if lo < 0 or hi >= model_config.vocab_size:
        raise ValueError(
            f"{name} holds token id {lo if lo < 0 else hi}, outside the model's vocabulary "
            f"0..{model_config.vocab_size - 1}; encode the data with the vocabulary the model "
            "was built for"
        )


def _check_resumable(raw: dict, model: GPT, vocab: Vocabulary | None, path: Path) -> None:
    saved = config_from_dict(raw["model_config"], path)
    if saved != model.config:
        a, b = saved.to_dict(), model.config.to_dict()
        diff = ", ".join(f"{k}: checkpoint {a[k]!r} vs model {b[k]!r}" for k in a if a[k] != b[k])
        raise CheckpointError(
            f"cannot resume from {path}: it was saved for a different model ({diff}); build the "
            "model from the checkpoint's config or train into another folder"
        )
    saved_vocab = raw.get("vocab")
    if vocab is not None and saved_vocab is not None and list(vocab.ids) != list(saved_vocab):
        raise CheckpointError(
            f"cannot resume from {path}: its vocabulary differs from the one given, so the token "
            "ids would mean different things; encode the data with the checkpoint's vocabulary"
        )


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------


def train(
    model: GPT,
    train_data: torch.Tensor,
    val_data: torch.Tensor,
    config: TrainConfig,
    *,
    checkpoint_path: str | Path | None = None,
    resume: bool = False,
    vocab: Vocabulary | None = None,
    quiet: bool = False,
    stop_at: int | None = None,
    encoding: str | None = None,
) -> dict[str, list[float]]:
    """Train ``model`` on ``train_data`` and return its loss history.

    ``train_data`` / ``val_data`` are 1-D tensors of model ids. The history has one entry per
    evaluation (every ``eval_interval`` steps and at the last step) with the keys ``step``,
    ``train_loss`` and ``val_loss`` (means over ``eval_iters`` batches in eval mode), ``lr``,
    ``tokens_per_sec`` (training throughput since the previous evaluation, evaluation excluded;
    all processes together) and ``elapsed_s`` (training seconds so far, evaluation excluded).

    ``checkpoint_path``: where to save (at the end, and every ``checkpoint_interval`` steps).
    ``resume=True`` continues from that checkpoint if it exists (model, optimizer, step, random
    states and history; the model must have the checkpoint's config); without one, training
    starts from scratch. ``stop_at`` ends this call after that step although the schedule runs to
    ``max_iters``, so a run can be split into pieces that resume into exactly the same losses.
    ``vocab`` and ``encoding`` (a tiktoken name) are stored in the checkpoint for generation.

    A non-finite loss raises :class:`FloatingPointError` naming the step (steps count from 1);
    checkpoints are only written after the losses up to that step were checked, so the last
    good checkpoint stays intact. Under torchrun the model is wrapped in DistributedDataParallel,
    each rank draws different batches and only rank 0 writes files or shows progress. The model
    is left in the train/eval mode it had before.
    """
    if not isinstance(config, TrainConfig) and type(config).__name__ != "TrainConfig":
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    raw = unwrap(model)
    if not isinstance(raw, GPT):
        raise TypeError(f"train expects a gptlib GPT model, got {type(raw).__name__}")
    _check_data(train_data, "train_data", raw.config)
    _check_data(val_data, "val_data", raw.config)
    info = distributed.current()
    device = resolve_device(config.device, info.local_rank)
    stop = config.max_iters if stop_at is None else min(int(stop_at), config.max_iters)
    path = Path(checkpoint_path) if checkpoint_path is not None else None
    if resume and path is None:
        raise ValueError("resume=True needs a checkpoint_path to resume from")
    show = not quiet and info.is_main

    was_training = raw.training
    raw.to(device)
    history: dict[str, list[float]] = {k: [] for k in HISTORY_KEYS}
    start = 0
    saved: dict | None = None
    if resume and resolve_path(path).exists():
        path = resolve_path(path)
        saved = read_checkpoint(path, map_location="cpu")
        _check_resumable(saved, raw, vocab, path)
        load_state_into(raw, saved["model_state"], path)
        start = int(saved["step"])
        extra = saved.get("extra") or {}
        old = extra.get("history") or {}
        history = {k: [float(v) for v in old.get(k, [])] for k in HISTORY_KEYS}
        if vocab is None and saved.get("vocab") is not None:
            vocab = Vocabulary(tuple(int(i) for i in saved["vocab"]))
        encoding = encoding or extra.get("encoding")
    elif resume and show:
        print(f"no checkpoint at {path} yet: starting from scratch", file=sys.stderr)

    if info.enabled:  # every rank must resume from the same step, or the ranks would hang
        starts = distributed.all_gather_objects(start)
        if len(set(starts)) > 1:
            raise CheckpointError(
                f"cannot resume: the ranks found different checkpoints at {path} (steps by rank: "
                f"{starts}); put the checkpoint on a file system every machine shares, or copy it "
                "to the same path on each machine"
            )

    # random states: dropout uses the global generator, batches their own one
    batch_gen = torch.Generator()
    if saved is None:
        torch.manual_seed(config.seed + info.rank)
        batch_gen.manual_seed(batch_seed(config.seed, info.rank))
    else:
        _restore_rng(saved, info, device, batch_gen, config, start)

    ddp_model = distributed.wrap(raw, device)
    optimizer = make_optimizer(raw, config, device)
    if saved is not None and saved.get("optimizer_state") is not None:
        try:
            optimizer.load_state_dict(saved["optimizer_state"])
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(
                f"cannot resume from {path}: its optimizer state does not fit this model ({err})"
            ) from None

    B, T = config.batch_size, raw.config.context_length
    tokens_per_step = B * T * info.world_size
    check_every = 1 if device.type == "cpu" else 16  # losses are checked (synced) this often
    amp = _autocast(device, config)
    own_loss = device.type == "cpu"  # the cache-friendly loss; CUDA's own kernel is fine
    last_saved = start if saved is not None else None
    elapsed = history["elapsed_s"][-1] if history["elapsed_s"] else 0.0
    pending: list[torch.Tensor] = []
    last_loss = float("nan")
    lr = learning_rate_at(start, config)

    def save(step: int) -> None:
        nonlocal last_saved
        rng = {
            "torch": torch.get_rng_state(),
            "batch": batch_gen.get_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        }
        rngs = distributed.all_gather_objects(rng)  # every rank's states, indexed by rank
        if info.is_main:
            extra = {
                "rng": rngs,
                "world_size": info.world_size,
                "history": history,
                "encoding": encoding,
            }
            save_checkpoint(
                path, raw, optimizer=optimizer, train_config=config, vocab=vocab, step=step,
                extra=extra,
            )  # fmt: skip
        distributed.barrier()
        last_saved = step

    def check(upto: int) -> float:
        # all ranks reach this at the same steps; averaging makes them agree on the verdict
        values = distributed.all_reduce_mean(torch.stack(pending).float()).cpu()
        first = upto - len(values) + 1
        pending.clear()
        bad = (~torch.isfinite(values)).nonzero()
        if len(bad):
            i = int(bad[0])
            kept = (
                f"the last checkpoint, {path} (step {last_saved}), was left intact"
                if last_saved is not None and path is not None
                else "no checkpoint was written by this run"
            )
            raise FloatingPointError(
                f"training stopped: non-finite loss ({float(values[i])}) at step {first + i}; "
                f"{kept}. Try a lower learning rate, a warm-up, gradient clipping, or bf16 off"
            )
        return float(values[-1])

    bar = tqdm(
        total=stop, initial=min(start, stop), disable=not show, unit="step", desc="train",
        dynamic_ncols=True, leave=True,
    )  # fmt: skip
    last_shown = 0.0
    try:
        ddp_model.train()
        interval_steps = 0
        t0 = time.perf_counter()
        for step in range(start, stop):
            done = step + 1  # steps count from 1: "step 100" = after 100 updates
            lr = learning_rate_at(step, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = get_batch(train_data, B, T, generator=batch_gen)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with amp:
                if own_loss:
                    logits, _ = ddp_model(x)  # (B, T, V)
                    loss = cross_entropy(logits, y)
                else:
                    _, loss = ddp_model(x, y)
            pending.append(loss.detach())
            is_eval = done % config.eval_interval == 0 or done == stop
            is_save = path is not None and (
                done == stop
                or (config.checkpoint_interval > 0 and done % config.checkpoint_interval == 0)
            )
            if len(pending) >= check_every or is_eval or is_save:
                last_loss = check(done)  # before backward: a bad loss never reaches the weights
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(raw.parameters(), config.grad_clip)
            optimizer.step()
            interval_steps += 1
            bar.update(1)
            if show and not is_eval and time.perf_counter() - last_shown > 0.5:
                bar.set_postfix_str(_postfix(last_loss, history), refresh=False)
                last_shown = time.perf_counter()
            if is_eval:
                _sync(device)
                seconds = time.perf_counter() - t0
                elapsed += seconds
                train_loss = estimate_loss(raw, train_data, config, device=device, rank=info.rank)
                val_loss = estimate_loss(raw, val_data, config, device=device, rank=info.rank)
                for key, value in zip(
                    HISTORY_KEYS,
                    (
                        done,
                        train_loss,
                        val_loss,
                        lr,
                        interval_steps * tokens_per_step / max(seconds, 1e-9),
                        elapsed,
                    ),
                    strict=True,
                ):
                    history[key].append(float(value))
                interval_steps = 0
                bar.set_postfix_str(_postfix(last_loss, history), refresh=True)
            if is_save:
                save(done)
            if is_eval or is_save:
                t0 = time.perf_counter()  # evaluation and saving are not training time
    finally:
        bar.close()
        raw.train(was_training)
    if start >= stop and show:
        print(f"nothing to train: the checkpoint is at step {start} >= {stop}", file=sys.stderr)
    return {k: list(v) for k, v in history.items()}


def _postfix(last_loss: float, history: dict[str, list[float]]) -> str:
    text = f"loss {last_loss:.4f}"
    if history["step"]:
        text += f" | train {history['train_loss'][-1]:.4f} val {history['val_loss'][-1]:.4f}"
        text += f" | {history['tokens_per_sec'][-1]:,.0f} tok/s"
    return text


def _restore_rng(
    saved: dict,
    info: distributed.DistInfo,
    device: torch.device,
    batch_gen: torch.Generator,
    config: TrainConfig,
    step: int,
) -> None:
    rngs = (saved.get("extra") or {}).get("rng")
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
            stacklevel=3,
        )
    torch.manual_seed(config.seed + info.rank + 7919 * step)
    batch_gen.manual_seed(batch_seed(config.seed, info.rank) + 7919 * step)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


class UsageError(Exception):
    """A bad command-line value found after parsing (exit status 2)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (and only on rank 0 under torchrun)."""

    def error(self, message: str):  # type: ignore[override]
        usage_error(self.prog, f"{message} (see --help)")
        raise SystemExit(2)


def usage_error(prog: str, message: str) -> int:
    """Print ``prog: error: message`` as one line on stderr (rank 0 only); returns 2."""
    if distributed.is_main_process():
        sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
    return 2


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def nonneg_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = nonneg_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def unit_float(text: str) -> float:
    value = nonneg_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show defaults, keep the examples' line breaks."""


H = {
    "T": "the most tokens the model sees",
    "sched": "cosine decays to --min-lr at --max-iters",
    "wd": "AdamW decay of weight matrices and embeddings",
    "ei": "estimate the losses every this many steps",
    "eit": "batches per loss estimate",
    "ci": "also save every this many steps (0: only at the end)",
}
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
    t, m = TrainConfig(), GPTConfig()
    p = OneLineParser(
        prog="python -m gptlib.train",
        description=(
            "Train a small GPT on a text corpus and save a checkpoint (OUT/checkpoint.pt) and its "
            "loss history (OUT/history.json). The same command runs under torchrun for several "
            "processes or machines; only rank 0 writes files and logs."
        ),
        epilog=EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    p.add_argument(
        "corpus", nargs="?", default="sales-textbook",
        help=f"a corpus name ({', '.join(CORPORA)}) or the path of a UTF-8 text file",
    )  # fmt: skip
    p.add_argument("--out", default="out", help="output folder for checkpoint.pt / history.json")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--param-digest", metavar="PATH",
        help="write a JSON file PATH.rank<R> with a sha256 of each rank's final parameters",
    )  # fmt: skip

    d = p.add_argument_group("data")
    d.add_argument("--encoding", default="cl100k_base", help="tiktoken encoding")
    d.add_argument(
        "--full-vocab", action="store_true",
        help="model every id of the encoding instead of only the tokens the corpus uses",
    )  # fmt: skip
    d.add_argument("--val-fraction", type=unit_float, default=0.1, help="share held out")

    g = p.add_argument_group("model (ignored with --resume: the checkpoint's model is used)")
    g.add_argument("--context-length", type=positive_int, default=m.context_length, help=H["T"])
    g.add_argument("--d-model", type=positive_int, default=m.d_model, help="width of token vectors")
    g.add_argument("--n-heads", type=positive_int, default=m.n_heads, help="must divide d-model")
    g.add_argument("--n-blocks", type=positive_int, default=m.n_blocks, help="transformer blocks")
    g.add_argument("--ffn-mult", type=positive_int, default=m.ffn_mult, help="hidden = mult*d")
    g.add_argument("--dropout", type=unit_float, default=m.dropout, help="dropout rate")
    g.add_argument("--norm", choices=("pre", "post"), default=m.norm, help="LayerNorm placement")
    g.add_argument("--positions", choices=("sinusoidal", "learned"), default=m.positions, help=" ")
    g.add_argument(
        "--activation", choices=("relu", "gelu", "gelu_tanh"), default=m.activation, help=" "
    )
    g.add_argument("--no-bias", action="store_true", help="no biases in Linear/LayerNorm")
    g.add_argument("--tie-embeddings", action="store_true", help="share input/output embedding")
    g.add_argument(
        "--attention", choices=("auto", "fused", "explicit"), default="auto",
        help="attention path: auto = explicit on CPU (measured faster there for these small "
        "models, see python -m gptlib.bench), fused (F.scaled_dot_product_attention) elsewhere",
    )  # fmt: skip

    o = p.add_argument_group("training")
    o.add_argument("--batch-size", type=positive_int, default=t.batch_size, help="per process")
    o.add_argument("--max-iters", type=positive_int, default=t.max_iters, help="optimizer steps")
    o.add_argument("--lr", type=positive_float, default=t.learning_rate, help="learning rate")
    o.add_argument("--warmup-iters", type=nonneg_int, default=t.warmup_iters, help="linear warm-up")
    o.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=t.lr_schedule, help=H["sched"])
    o.add_argument("--min-lr", type=nonneg_float, default=t.min_lr, help="end of the cosine")
    o.add_argument("--weight-decay", type=nonneg_float, default=t.weight_decay, help=H["wd"])
    o.add_argument("--beta1", type=unit_float, default=t.beta1, help="AdamW beta1")
    o.add_argument("--beta2", type=unit_float, default=t.beta2, help="AdamW beta2")
    o.add_argument("--grad-clip", type=nonneg_float, default=t.grad_clip, help="0 disables")
    o.add_argument("--eval-interval", type=positive_int, default=t.eval_interval, help=H["ei"])
    o.add_argument("--eval-iters", type=positive_int, default=t.eval_iters, help=H["eit"])
    o.add_argument(
        "--checkpoint-interval", type=nonneg_int, default=t.checkpoint_interval, help=H["ci"]
    )
    o.add_argument("--seed", type=_int, default=t.seed, help="seeds weights, batches, dropout")
    o.add_argument("--device", default=t.device, help="auto (cuda > mps > cpu), cpu, cuda[:N], mps")
    o.add_argument("--no-bf16", action="store_true", help="no bf16 autocast on CUDA")
    return p


def _train_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        batch_size=args.batch_size,
        max_iters=args.max_iters,
        learning_rate=args.lr,
        warmup_iters=args.warmup_iters,
        lr_schedule=args.lr_schedule,
        min_lr=args.min_lr,
        weight_decay=args.weight_decay,
        beta1=args.beta1,
        beta2=args.beta2,
        grad_clip=args.grad_clip,
        eval_interval=args.eval_interval,
        eval_iters=args.eval_iters,
        seed=args.seed,
        device=args.device,
        autocast_bf16=not args.no_bf16,
        checkpoint_interval=args.checkpoint_interval,
    )


def _model_config(args: argparse.Namespace, vocab_size: int, device_type: str = "cpu") -> GPTConfig:
    return GPTConfig(
        vocab_size=vocab_size,
        context_length=args.context_length,
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_blocks=args.n_blocks,
        ffn_mult=args.ffn_mult,
        dropout=args.dropout,
        norm=args.norm,
        positions=args.positions,
        activation=args.activation,
        bias=not args.no_bias,
        tie_embeddings=args.tie_embeddings,
        fused_attention=args.attention == "fused"
        or (args.attention == "auto" and device_type != "cpu"),
    )


def _say(show: bool, message: str) -> None:
    if show:
        print(message, file=sys.stderr)


def _run(args: argparse.Namespace, config: TrainConfig, info: distributed.DistInfo) -> int:
    show = info.is_main and not args.quiet
    out = Path(args.out)
    ckpt = out / DEFAULT_NAME
    saved = read_checkpoint(ckpt) if args.resume and ckpt.exists() else None

    text = load_corpus(args.corpus)
    encoding_name = args.encoding
    if saved is not None:
        encoding_name = (saved.get("extra") or {}).get("encoding") or encoding_name
    tokenizer = Tokenizer(encoding_name)
    raw_ids = tokenizer.encoding.encode_ordinary(text)
    if not raw_ids:
        raise UsageError(f"the corpus {args.corpus!r} is empty")

    if saved is not None:  # the checkpoint decides the model and the vocabulary
        model_config = config_from_dict(saved["model_config"], ckpt)
        vocab = Vocabulary(tuple(int(i) for i in saved["vocab"])) if saved["vocab"] else None
        _say(show, f"resuming from {ckpt} (step {saved['step']}); model options are ignored")
    else:
        vocab = None if args.full_vocab else Vocabulary.from_ids(raw_ids)
        vocab_size = tokenizer.encoding.n_vocab if vocab is None else len(vocab)
        device_type = resolve_device(config.device, info.local_rank).type
        model_config = _model_config(args, vocab_size, device_type)
    ids = torch.tensor(vocab.encode(raw_ids) if vocab is not None else raw_ids, dtype=torch.long)
    train_ids, val_ids = train_val_split(ids, args.val_fraction)
    need = model_config.context_length + 1
    if len(train_ids) < need or len(val_ids) < need:
        raise UsageError(
            f"the corpus is too short: {len(train_ids)} training and {len(val_ids)} validation "
            f"tokens, but each split needs at least --context-length + 1 = {need}; use a longer "
            "text, a smaller --context-length or another --val-fraction"
        )

    torch.manual_seed(config.seed)  # the initial weights (DDP then copies rank 0's to all ranks)
    model = GPT(model_config)
    kind = f"compact vocabulary of {len(vocab):,}" if vocab else f"full {encoding_name}"
    _say(
        show,
        f"model: {model.num_parameters():,} parameters ({kind} tokens); data: "
        f"{len(train_ids):,} training / {len(val_ids):,} validation tokens; device "
        f"{resolve_device(config.device, info.local_rank)}; processes: {info.world_size}",
    )
    history = train(
        model, train_ids, val_ids, config, checkpoint_path=ckpt, resume=args.resume,
        vocab=vocab, quiet=args.quiet, encoding=encoding_name,
    )  # fmt: skip
    if info.is_main:
        text = json.dumps(history, indent=1).encode()
        atomic_write(out / "history.json", lambda f: f.write(text))
    if args.param_digest:
        record = {
            "rank": info.rank,
            "world_size": info.world_size,
            "batch_seed": batch_seed(config.seed, info.rank),
            "params": distributed.parameter_digest(model),
        }
        Path(f"{args.param_digest}.rank{info.rank}").write_text(json.dumps(record))
    if history["step"]:
        _say(
            show,
            f"step {int(history['step'][-1])}: train loss {history['train_loss'][-1]:.4f}, "
            f"val loss {history['val_loss'][-1]:.4f}; saved {ckpt} and {out / 'history.json'}",
        )
    return 0


def _error(message: str) -> None:
    if distributed.is_main_process():
        print(f"error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m gptlib.train``: returns the exit status (0 ok, 1 failure, 2 bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = _train_config(args)
        _model_config(args, vocab_size=1)  # checks the model options before any work
    except ValueError as err:
        message = str(err).replace("invalid GPTConfig: ", "").replace("invalid TrainConfig: ", "")
        parser.error(message)
    if args.corpus not in CORPORA and not Path(args.corpus).is_file():
        parser.error(
            f"corpus {args.corpus!r} is neither a known corpus ({', '.join(CORPORA)}) nor an "
            "existing text file"
        )
    try:
        device = resolve_device(config.device)
    except ValueError as err:
        parser.error(f"argument --device: {err}")
    try:
        info = distributed.init_from_env(device.type)
        return _run(args, config, info)
    except UsageError as err:
        return usage_error(parser.prog, str(err))
    except (
        CheckpointError,
        FloatingPointError,
        TokenizerUnavailableError,
        CorpusUnavailableError,
        ChecksumError,
        UnknownTokenError,
        OSError,
        ValueError,
    ) as err:
        _error(str(err))
        return 1
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    from gptlib.train import main as _main  # the package's module, not a second __main__ copy

    sys.exit(_main())
