"""A training run's state between steps and across restarts (chapter 10): :class:`RunState`.

:func:`gptlib.train.train` keeps its loop short by handing everything that is not a step to a
``RunState``: where the checkpoint goes, the step reached, the loss history, the batch
generator, and the work around them:

* **seeding** a fresh run (:meth:`RunState.seed`): dropout draws from PyTorch's global generator,
  seeded with ``seed + rank``; batches come from the run's own generator (:func:`batch_seed`);
* **resuming** (:meth:`RunState.resume`): a checkpoint's weights, step, history, vocabulary and
  every rank's random states, after checking that it fits the model;
* **saving** (:meth:`RunState.save`): an atomic checkpoint with every rank's random states, so
  that a resumed run continues exactly where the first one stopped;
* **stopping** on a non-finite loss or weights (:meth:`RunState.check_loss`,
  :meth:`RunState.check_record`, and before every save) without touching the last good
  checkpoint;
* **keeping the best** checkpoint, the one with the lowest validation loss, beside the last one
  (:meth:`RunState.keep_if_best`, ``best.pt`` beside ``checkpoint.pt``).

:class:`Clock` measures training time without the evaluations and saves.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptlib import distributed
from gptlib.checkpoint import (
    BEST_NAME,
    DEFAULT_NAME,
    CheckpointError,
    config_from_dict,
    load_state_into,
    save_checkpoint,
    vocab_from_checkpoint,
)
from gptlib.config import TrainConfig
from gptlib.model import GPT
from gptlib.tokenizer import Vocabulary

HISTORY_KEYS = ("step", "train_loss", "val_loss", "lr", "tokens_per_sec", "elapsed_s")
RESEED_STRIDE = 7919  # a run re-seeded at step s uses seed + 7919 * s: other draws than step 0's


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
    best: dict | None = None  # {"step", "val_loss"} of the best evaluation so far
    corpus: str | None = None  # what the run trains on, for people (the web page names it)

    @property
    def best_path(self) -> Path | None:
        """Where the best checkpoint goes: ``best.pt`` beside ``checkpoint.pt`` (for another
        name, ``NAME.best.pt``)."""
        if self.path is None:
            return None
        if self.path.name == DEFAULT_NAME:
            return self.path.with_name(BEST_NAME)
        return self.path.with_name(f"{self.path.stem}.best{self.path.suffix}")

    @property
    def elapsed(self) -> float:
        """Training seconds of the whole run so far (including the runs it resumed)."""
        return self.history["elapsed_s"][-1] if self.history["elapsed_s"] else 0.0

    def seed(self, config: TrainConfig) -> None:
        """A fresh run: seed dropout's (global) generator and the batch generator of this rank."""
        self.check_same_step()
        rank = distributed.current().rank
        torch.manual_seed(config.seed + rank)
        self.batch_gen.manual_seed(batch_seed(config.seed, rank))

    def resume(self, raw: dict, model: GPT, config: TrainConfig, device: torch.device) -> None:
        """Load a checkpoint's contents ``raw`` (read with ``read_checkpoint``) into ``model``
        and this state, random states included."""
        check_resumable(raw, model, self.vocab, self.path)
        load_state_into(model, raw["model_state"], self.path)
        extra = raw.get("extra") or {}
        old = extra.get("history") or {}
        self.step = self.last_saved = int(raw["step"])
        self.history = {k: [float(v) for v in old.get(k, [])] for k in HISTORY_KEYS}
        self.vocab = self.vocab or vocab_from_checkpoint(raw, self.path)
        self.encoding = self.encoding or extra.get("encoding")
        self.corpus = self.corpus or extra.get("corpus")
        best = extra.get("best")
        self.best = best if isinstance(best, dict) and {"step", "val_loss"} <= set(best) else None
        self.optimizer_state = raw.get("optimizer_state")
        self.check_same_step()
        self._restore_rng(extra.get("rng"), config, device)

    def check_same_step(self) -> None:
        """Every rank must start at the same step (one may have found a checkpoint that another
        could not see), or the ranks would wait for each other forever."""
        starts = distributed.all_gather_objects(self.step)
        if len(set(starts)) > 1:
            raise CheckpointError(
                f"cannot resume: the ranks found different checkpoints at {self.path} (steps by "
                f"rank: {starts}); put the checkpoint on a file system every machine shares, or "
                "copy it to the same path on each machine"
            )

    def _restore_rng(self, rngs: object, config: TrainConfig, device: torch.device) -> None:
        info = distributed.current()
        if isinstance(rngs, list) and len(rngs) == info.world_size:
            mine = rngs[info.rank]
            torch.set_rng_state(mine["torch"])
            self.batch_gen.set_state(mine["batch"])
            if device.type == "cuda" and mine.get("cuda") is not None:
                torch.cuda.set_rng_state(mine["cuda"], device)
            return
        saved_world = len(rngs) if isinstance(rngs, list) else "an unknown number of"
        if info.is_main:
            warnings.warn(
                f"the checkpoint was written by {saved_world} process(es) and this run has "
                f"{info.world_size}: random states are re-seeded, so the losses will differ from "
                "an uninterrupted run",
                stacklevel=5,  # the caller of train()
            )
        offset = RESEED_STRIDE * self.step
        torch.manual_seed(config.seed + info.rank + offset)
        self.batch_gen.manual_seed(batch_seed(config.seed, info.rank) + offset)

    def load_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Give the optimizer the state of the checkpoint resumed from (once)."""
        if self.optimizer_state is None:
            return
        try:
            optimizer.load_state_dict(self.optimizer_state)
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(
                f"cannot resume from {self.path}: its optimizer state does not fit this model "
                f"({err})"
            ) from None
        self.optimizer_state = None

    def due(self, config: TrainConfig, stop: int) -> tuple[bool, bool]:
        """Whether to evaluate, and whether to save a checkpoint, after step ``self.step``."""
        last = self.step == stop
        every = config.checkpoint_interval
        save = self.path is not None and (last or (every > 0 and self.step % every == 0))
        return last or self.step % config.eval_interval == 0, save

    def save(
        self,
        model: GPT,
        optimizer: torch.optim.Optimizer,
        config: TrainConfig,
        device: torch.device,
        path: Path | None = None,
    ) -> None:
        """Write the checkpoint (rank 0) with every rank's random states; all ranks call this.
        Weights that are no longer finite are never written: FloatingPointError instead."""
        self.check_weights(model)
        rng = {
            "torch": torch.get_rng_state(),
            "batch": self.batch_gen.get_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        }
        rngs = distributed.all_gather_objects(rng)  # every rank's states, indexed by rank
        info = distributed.current()
        if info.is_main:
            extra = {
                "rng": rngs,
                "world_size": info.world_size,
                "history": self.history,
                "encoding": self.encoding,
                "corpus": self.corpus,
                "best": self.best,
            }
            save_checkpoint(
                path or self.path, model, optimizer=optimizer, train_config=config,
                vocab=self.vocab, step=self.step, extra=extra,
            )  # fmt: skip
        distributed.barrier()
        if path is None:
            self.last_saved = self.step

    def keep_if_best(
        self,
        model: GPT,
        optimizer: torch.optim.Optimizer,
        config: TrainConfig,
        device: torch.device,
    ) -> bool:
        """After an evaluation: when its validation loss is the lowest so far, write the best
        checkpoint (``best_path``) and return True."""
        val_loss = self.history["val_loss"][-1]
        if self.path is None or (self.best is not None and val_loss >= self.best["val_loss"]):
            return False
        self.best = {"step": self.step, "val_loss": val_loss}
        self.save(model, optimizer, config, device, path=self.best_path)
        return True

    def _kept(self) -> str:
        if self.last_saved is not None and self.path is not None:
            return (
                f"the last good checkpoint, {self.path} (step {self.last_saved}), was left intact"
            )
        return "no checkpoint was written by this run"

    def _diverged(self, what: str) -> FloatingPointError:
        return FloatingPointError(
            f"training stopped: {what} at step {self.step}; {self._kept()}. Try a lower learning "
            "rate, a warm-up, gradient clipping, or bf16 off"
        )

    def check_loss(self, loss: float, device: torch.device, what: str = "non-finite loss") -> None:
        """Stop on a non-finite loss (all ranks agree: the verdict uses the mean over ranks)."""
        if distributed.current().enabled:
            loss = float(distributed.all_reduce_mean(torch.tensor(loss, device=device)))
        if not math.isfinite(loss):
            raise self._diverged(f"{what} ({loss})")

    def check_record(self, record: dict[str, float]) -> None:
        """Stop when an evaluation gives a non-finite loss (the last update broke the weights)."""
        for key in ("train_loss", "val_loss"):
            if not math.isfinite(record[key]):
                raise self._diverged(f"non-finite {key.replace('_', ' ')} ({record[key]})")

    def check_weights(self, model: GPT) -> None:
        """Stop before writing weights that hold NaN or infinity."""
        bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:
            raise self._diverged(f"the weights became non-finite ({', '.join(bad[:3])})")

    def record(self, record: dict[str, float]) -> None:
        """Append one evaluation's record (the keys of HISTORY_KEYS) to the history."""
        for key in HISTORY_KEYS:
            self.history[key].append(float(record[key]))


def check_resumable(raw: dict, model: GPT, vocab: Vocabulary | None, path: Path) -> None:
    """Raise CheckpointError unless the checkpoint ``raw`` was saved for ``model``'s config and
    for the vocabulary given (if any)."""
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Clock:
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

    def lap(self) -> tuple[float, int]:
        """The seconds and steps since the last lap, and start counting anew."""
        seconds, steps = self.seconds, self.steps
        self.seconds, self.steps = 0.0, 0
        return seconds, steps
