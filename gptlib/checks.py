"""The two checks on token ids that every entry point shares, each written once.

:func:`check_token_ids` says which id falls outside a vocabulary; :func:`check_window_fits` says
when a token stream is too short for one training window. The model, the data sampler, the
training loop and generation all call these, so a bad input gets the same clear message wherever
it enters.
"""

from __future__ import annotations

import torch


def check_token_ids(ids: torch.Tensor, vocab_size: int, what: str = "token ids") -> None:
    """Raise a clear error unless ``ids`` is an integer tensor of ids in 0..vocab_size-1."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{what} must be an integer tensor, got {ids.dtype}")
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(
            f"{what}: token id {lo if lo < 0 else hi} is outside the model's vocabulary (valid "
            f"ids are 0..{vocab_size - 1}); encode the text with the tokenizer/vocabulary the "
            "model was built for"
        )


def check_window_fits(n_tokens: int, context_length: int, what: str = "the data") -> None:
    """Raise ValueError unless ``n_tokens`` hold one training window: context_length + 1 tokens
    (the inputs and, shifted by one, their targets)."""
    if n_tokens < context_length + 1:
        raise ValueError(
            f"{what} has {n_tokens} tokens, but one training window needs context_length + 1 = "
            f"{context_length + 1}; use more text or a shorter context_length"
        )
