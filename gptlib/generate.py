"""Text generation (chapter 11): one token at a time, with a KV cache (:mod:`gptlib.kv_cache`).

Generation repeats one step: run the model on the tokens so far, take the logits of the last
position, turn them into a choice (greedy argmax at temperature 0, otherwise a sample from the
softmax of ``logits / temperature``, optionally restricted to the ``top_k`` most likely tokens),
and append it.

**Sliding past the context, exactly.** The no-cache path always feeds the last
``context_length`` tokens at positions ``0..T-1``. Once the sequence is longer than the context,
the window slides by one token per step: every token's position changes and the oldest token drops
out, so *every* cached key and value (which depend on the positions and, from the second block on,
on the dropped token) becomes stale. Rotary positions (chapter 13) do not change this: their
scores depend only on distances, but from the second block on the keys still remember the dropped
token. There is no cheaper exact update, so this module re-runs the full window (as the no-cache
path does) for every step after the window is full. Up to the context length the cache saves most
of the work; past it the two paths cost the same and give the same tokens. (A cache that refilled
only every few steps would be faster but would no longer match the no-cache model.)
"""

from __future__ import annotations

import math
import sys

import torch

from gptlib.checks import check_token_ids
from gptlib.data import seeded_generator
from gptlib.distributed import unwrap
from gptlib.kv_cache import KVCache
from gptlib.memory import check_fits, generation_bytes
from gptlib.model import GPT

__all__ = ["KVCache", "check_options", "generate", "next_token_logits", "sample_next"]


def next_token_logits(model: GPT, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    """Logits for the token after the last one of ``idx`` (B, T): shape (B, V), float32.

    Runs the model like ``model(idx, cache=cache)`` but applies the output layer to the last
    position only (the other positions' logits are not needed to generate). With a cache, ``idx``
    holds only the new tokens and the cache is extended in place.
    """
    x = model.hidden_states(idx, cache=cache)  # (B, T, C)
    x = model.final_norm(x[:, -1, :])  # (B, C)
    return model.lm_head(x).float()  # (B, V)


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Choose one token per row of ``logits`` (B, V): returns (B,) ids.

    Temperature 0 is greedy (argmax). Otherwise the probabilities are ``softmax(logits / T)``
    over the ``top_k`` largest logits (all of them when ``top_k`` is None).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    if top_k is not None and top_k < logits.shape[-1]:
        values, candidates = torch.topk(logits, top_k, dim=-1)  # (B, k) each
    else:
        values, candidates = logits, None
    # subtract the max before dividing so a tiny temperature cannot overflow to inf - inf
    scaled = (values - values.max(dim=-1, keepdim=True).values) / temperature
    probs = torch.softmax(scaled, dim=-1)  # (B, k) or (B, V)
    choice = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
    if candidates is not None:
        choice = candidates.gather(-1, choice)
    return choice.squeeze(-1)


def _prompt_tensor(prompt_ids: torch.Tensor | list[int]) -> tuple[torch.Tensor, bool]:
    if isinstance(prompt_ids, torch.Tensor):
        idx = prompt_ids
    else:
        try:
            idx = torch.tensor(list(prompt_ids), dtype=torch.long)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"prompt_ids must be a list of ints or a tensor ({err})") from None
    if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.is_complex():
        raise TypeError(f"prompt_ids must be integer token ids, got {idx.dtype}")
    if idx.dim() not in (1, 2):
        raise ValueError(f"prompt_ids must be 1-D (T,) or 2-D (B, T), got {tuple(idx.shape)}")
    one_d = idx.dim() == 1
    idx = idx[None] if one_d else idx
    if idx.shape[1] == 0 or idx.shape[0] == 0:
        raise ValueError("the prompt is empty: give at least one token id")
    return idx.long(), one_d


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_options(max_new_tokens: int, temperature: float, top_k: int | None) -> None:
    """Raise ValueError, saying what is wrong, unless the generation options make sense."""
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")


def generate(
    model: GPT,
    prompt_ids: torch.Tensor | list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """Continue ``prompt_ids`` by ``max_new_tokens`` tokens; returns prompt + new tokens.

    ``prompt_ids``: a list or 1-D tensor (the result is 1-D) or a (B, T) tensor (the result is
    (B, T + max_new_tokens)). Only the last ``context_length`` tokens are fed to the model.
    ``temperature`` 0 is greedy; ``top_k`` keeps the k most likely tokens; ``seed`` makes the
    sampling reproducible through a local generator (PyTorch's global one is not touched).
    ``use_cache`` uses a KV cache; the tokens are the same either way in practice (up to the
    context length the cached logits differ by float rounding only; see the module docstring for
    how the cache slides past it). The model runs in eval mode and is put back in the mode it had.
    """
    # inference mode skips autograd bookkeeping; the clone gives the caller an ordinary tensor
    # (an inference-mode tensor could not be used as the input of a later training step)
    out = _generate(model, prompt_ids, max_new_tokens, temperature, top_k, seed, use_cache)
    return out.clone()


@torch.inference_mode()
def _generate(
    model: GPT,
    prompt_ids: torch.Tensor | list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int | None,
    use_cache: bool,
) -> torch.Tensor:
    model = unwrap(model)
    if not isinstance(model, GPT):
        raise TypeError(f"generate expects a gptlib GPT model, got {type(model).__name__}")
    check_options(max_new_tokens, temperature, top_k)
    idx, one_d = _prompt_tensor(prompt_ids)
    ctx = model.config.context_length
    check_token_ids(idx, model.config.vocab_size, "the prompt")
    device = next(model.parameters()).device
    B, T0 = idx.shape
    check_fits(  # before the (B, T0 + new) ids and the cache are allocated
        generation_bytes(model.config, B, T0, max_new_tokens) - 4 * model.num_parameters(),
        f"generating {max_new_tokens:,} tokens",
        "ask for fewer tokens (max_new_tokens, the command line's -n)",
        device,
    )
    out = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=device)  # (B, T0 + new)
    out[:, :T0] = idx.to(device)
    generator = seeded_generator(seed, device)

    was_training = model.training
    model.eval()
    try:
        if max_new_tokens > 0:
            cache = KVCache(max_length=ctx) if use_cache else None
            length = T0
            logits = next_token_logits(model, out[:, max(0, length - ctx) : length], cache)
            for i in range(max_new_tokens):
                out[:, length] = sample_next(logits, temperature, top_k, generator)
                length += 1
                if i == max_new_tokens - 1:
                    break
                if cache is not None and length <= ctx:
                    # the window still starts at token 0: only the new token needs computing
                    logits = next_token_logits(model, out[:, length - 1 : length], cache)
                else:
                    # no cache, or the window slid: every position moved, run the whole window
                    logits = next_token_logits(model, out[:, max(0, length - ctx) : length])
    finally:
        model.train(was_training)
    return out[0] if one_d else out


if __name__ == "__main__":  # ``python -m gptlib.generate``: the command lives in gptlib.commands
    from gptlib.commands.generate import main

    sys.exit(main())
