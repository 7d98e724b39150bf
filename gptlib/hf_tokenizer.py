"""A Hugging Face tokenizer behind gptlib's tokenizer interface (chapter 13, "A real model writes").

gptlib's own :class:`~gptlib.tokenizer.Tokenizer` wraps tiktoken. A pretrained model such as
SmolLM2 comes with its own vocabulary, its own special tokens and a *chat template*: the text
format its instruction tuning used to mark who speaks. :class:`HFTokenizer` gives such a tokenizer
the methods gptlib's generation and command line use (``encode``, ``decode``, ``token_strings``,
``vocab_size``) and adds :meth:`HFTokenizer.chat`, which wraps a question in the template, and
:meth:`HFTokenizer.answer`, which cuts a generated answer at the model's end-of-turn token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class HFTokenizer:
    """gptlib's tokenizer interface over a ``transformers`` tokenizer (``AutoTokenizer``)."""

    def __init__(self, hf_tokenizer: Any) -> None:
        if not callable(getattr(hf_tokenizer, "convert_ids_to_tokens", None)):
            raise TypeError(
                f"expected a Hugging Face tokenizer (from transformers.AutoTokenizer), got "
                f"{type(hf_tokenizer).__name__}"
            )
        self.hf = hf_tokenizer
        # the ids that end an answer: the end-of-sequence token (SmolLM2's "<|im_end|>")
        eos = hf_tokenizer.eos_token_id
        self.stop_ids: frozenset[int] = frozenset() if eos is None else frozenset([int(eos)])

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce, special tokens included."""
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """Text -> ids, as the text reads: no special tokens are added around it."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int] | Iterable[int]) -> str:
        """Ids -> text, special tokens written out (``<|im_start|>`` ...)."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Each id's text on its own, for display (spaces shown as they decode)."""
        return [self.hf.decode([int(i)], skip_special_tokens=False) for i in ids]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def chat(self, question: str, system: str | None = None) -> list[int]:
        """The ids of ``question`` as a user's turn in the model's chat template, followed by the
        start of the assistant's turn, so that what the model writes next is its answer."""
        if not self.has_chat_template:
            raise ValueError(
                "this tokenizer has no chat template, so it cannot format a chat turn; continue "
                "plain text instead (without --chat)"
            )
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": question})
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def answer(self, new_ids: Iterable[int]) -> str:
        """The text of generated ids up to (without) the first end-of-turn token."""
        kept = []
        for i in new_ids:
            if int(i) in self.stop_ids:
                break
            kept.append(int(i))
        return self.decode(kept)
