"""Bits per byte (chapter 13): a loss that compares models with different tokenizers.

A model's loss is in nats *per token*, and tokens are not the same size for two tokenizers: a
model whose tokens are longer needs fewer predictions for the same text, each harder. Adding up
all of a text's token losses gives the information the model needs to write the whole text, in
nats, whatever the tokens; dividing by ``ln 2`` and by the text's length in UTF-8 bytes gives
**bits per byte**, a number any two models of the same text can be ranked by.

:func:`token_losses` scores every token of a long text after the first, in windows that fill the
model's whole context, each token seeing as much of the text before it as the window allows.
"""

from __future__ import annotations

import math

import torch

from gptlib.model import GPT


def _windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first) per window of ``window`` ids: the model reads ids[begin:end-1] and the
    targets ``first..end-1`` are scored (each target of the text exactly once, after the first)."""
    out, scored = [], 1  # targets below `scored` have their loss already
    for begin in range(0, n - 1, stride):
        end = min(begin + window, n)
        if end > scored:
            out.append((begin, end, scored))
            scored = end
        if end == n:
            break
    return out


@torch.no_grad()
def token_losses(
    model: GPT,
    ids: list[int] | torch.Tensor,
    stride: int | None = None,
    batch_size: int = 8,
    window: int | None = None,
) -> torch.Tensor:
    """The loss (nats) of every token ``ids[1:]`` given the tokens before it: shape (n - 1,).

    The model reads windows of ``window`` tokens (default and at most: its context length), which
    start every ``stride`` tokens (default: half a window); each scores the targets the previous
    ones did not. A window of ``window`` inputs predicts ``window`` targets, so every target after
    the first window sees between ``window - stride + 1`` and ``window`` tokens before it.
    """
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    window = min(window or model.config.context_length, model.config.context_length)
    stride = stride or max(1, window // 2)
    if not 1 <= stride <= window:
        raise ValueError(f"stride must be between 1 and the window ({window} tokens), got {stride}")
    if len(ids) < 2:
        raise ValueError("need at least two tokens: the first one is never predicted")
    was_training = model.training
    model.eval()
    losses = torch.empty(len(ids) - 1)  # losses[j - 1] is target j's
    plan = _windows(len(ids), window + 1, stride)  # window inputs + 1 more target
    try:
        for i in range(0, len(plan), batch_size):
            group = plan[i : i + batch_size]
            width = max(end - begin for begin, end, _ in group) - 1
            for (begin, end, first), rows in _group_logits(model, ids, group, width):
                targets = ids[first:end]
                lp = torch.log_softmax(rows[first - begin - 1 : end - begin - 1].float(), dim=-1)
                losses[first - 1 : end - 1] = -lp.gather(1, targets[:, None]).squeeze(1)
    finally:
        model.train(was_training)
    return losses


def _group_logits(model: GPT, ids: torch.Tensor, group: list, width: int):
    """Run windows of equal length as one batch; a shorter (last) window runs on its own."""
    same = [w for w in group if w[1] - w[0] - 1 == width]
    rest = [w for w in group if w[1] - w[0] - 1 != width]
    device = next(model.parameters()).device
    if same:
        x = torch.stack([ids[b : e - 1] for b, e, _ in same]).to(device)  # (n, width)
        logits = model(x)[0].cpu()  # (n, width, V)
        yield from zip(same, logits, strict=True)
    for w in rest:
        yield w, model(ids[w[0] : w[1] - 1][None].to(device))[0][0].cpu()


def bits_per_byte(total_nats: float, n_bytes: int) -> float:
    """Information per byte of text: ``total_nats / ln 2 / n_bytes``."""
    if n_bytes < 1:
        raise ValueError(f"the text must have at least one byte, got {n_bytes}")
    return total_nats / math.log(2) / n_bytes
