"""The book's running example, built the same way in every chapter.

The sales textbook tokenized with cl100k_base, split 90/10, and one batch of 4 windows of 16
tokens drawn with a fixed seed; a model of the book's size (d_model 64, 4 heads, 8 blocks) whose
weights are also fixed by a seed. Every chapter calls :func:`running_example` so they all look at
the same sentences and the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptlib.config import TrainConfig
from gptlib.data import get_batch, load_corpus, train_val_split
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import Tokenizer

BOOK_MODEL = GPTConfig()  # the defaults are the book's model: gptlib.config defines it once
BATCH_SIZE = 4
CONTEXT_LENGTH = BOOK_MODEL.context_length  # 16
D_MODEL = BOOK_MODEL.d_model  # 64
N_HEADS = BOOK_MODEL.n_heads  # 4
N_BLOCKS = BOOK_MODEL.n_blocks  # 8
BATCH_SEED = 1337  # seeds the draw of the example batch
MODEL_SEED = 0  # seeds the example model's random weights
# chapter 10's training run of the book's model (compact vocabulary, CPU); chapter 13's ablation
# (tools/modern_ablation.py) trains every variant with the same settings
TRAINING_RUN = TrainConfig(
    batch_size=32,
    max_iters=2500,
    learning_rate=2e-3,
    warmup_iters=100,
    lr_schedule="cosine",
    min_lr=2e-4,
    weight_decay=0.1,
    grad_clip=1.0,
    eval_interval=250,
    eval_iters=20,
    seed=1337,
    device="cpu",
)


@dataclass
class RunningExample:
    """Everything the chapters share. ``ids`` are cl100k ids of the whole corpus."""

    text: str
    tokenizer: Tokenizer
    ids: torch.Tensor  # (N,) the whole corpus
    train: torch.Tensor  # (0.9 N,)
    val: torch.Tensor  # (0.1 N,)
    x: torch.Tensor  # (BATCH_SIZE, CONTEXT_LENGTH) input ids
    y: torch.Tensor  # (BATCH_SIZE, CONTEXT_LENGTH) next-token targets
    config: GPTConfig

    def tokens(self, row: int = 0) -> list[str]:
        """Readable token strings of one row of the batch (for plot axes)."""
        return self.tokenizer.token_strings(self.x[row].tolist())

    def model(self, seed: int = MODEL_SEED, **overrides) -> GPT:
        """A freshly initialised model of the book's size, seeded, in eval mode (no dropout).

        Keyword arguments override :class:`GPTConfig` fields, e.g. ``norm_placement="post"``;
        the widths the config works out (``d_ff``, ``n_kv_heads``) follow them.
        """
        overrides.setdefault("vocab_size", self.config.vocab_size)
        torch.manual_seed(seed)
        model = GPT(book_config(**overrides))
        return model.eval()


def book_config(vocab_size: int = BOOK_MODEL.vocab_size, **overrides) -> GPTConfig:
    """The running example's model configuration: :class:`GPTConfig`'s defaults (the book's
    steps, explicit attention) with ``vocab_size`` and any other field overridden. It is built
    afresh, so ``d_ff`` and ``n_kv_heads`` are worked out for the overridden sizes."""
    return GPTConfig(vocab_size=vocab_size, **overrides)


def running_example(seed: int = BATCH_SEED) -> RunningExample:
    """Load (or download once) the sales textbook and draw the book's example batch."""
    text = load_corpus("sales-textbook")
    tokenizer = Tokenizer("cl100k_base")
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train, val = train_val_split(ids, 0.1)
    x, y = get_batch(train, BATCH_SIZE, CONTEXT_LENGTH, seed=seed)
    config = book_config(vocab_size=int(ids.max()) + 1)
    return RunningExample(text, tokenizer, ids, train, val, x, y, config)
