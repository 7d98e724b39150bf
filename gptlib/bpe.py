"""Byte-pair encoding built by hand: training, encoding with cl100k_base's ranks, decoding.

Chapter 1 builds the tokenizer this way before trusting tiktoken with it. Everything here is
plain Python, written to be read; :mod:`gptlib.tokenizer` stays the fast path the rest of the
book uses, and the tests check that the two give exactly the same ids.

*Training* (:func:`train_bpe`) starts from a text's bytes, so every text can be written with the
256 byte values and nothing is ever unknown. It counts every pair of neighbouring ids, replaces
the most frequent pair everywhere by a new id, and repeats. The merges, in the order they were
learned, are the tokenizer.

*Encoding* (:class:`BytePairEncoder`) replays learned merges on new text. cl100k_base's merges
are stored as a rank per token (its position in the order of learning), so a text is encoded by

1. splitting it into chunks with the pre-tokenizer's regular expression (:data:`CL100K_PATTERN`:
   words with their leading space, numbers of up to three digits, punctuation, whitespace), so a
   token never spans two words;
2. writing each chunk as its bytes, one token per byte;
3. merging, again and again, the neighbouring pair whose joined bytes have the lowest rank (the
   merge that was learned first), until no neighbouring pair forms a token.

*Special tokens* such as ``<|endoftext|>`` are not learned from text: they are extra ids, put
between documents. As in tiktoken, :meth:`BytePairEncoder.encode` refuses text that contains one
unless it is named in ``allowed_special`` (text from a user could otherwise forge a document
boundary), and :meth:`BytePairEncoder.encode_ordinary` treats such text as ordinary characters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

import regex

from gptlib.tokenizer import get_encoding

# cl100k_base's pre-tokenizer, as tiktoken 0.14 writes it. The alternatives, tried in order:
# English contractions ('s 't 're 've 'm 'll 'd, any case); a word, with at most one leading
# character that is not a letter, digit or line break (usually its space); one to three digits;
# punctuation with an optional leading space and any line breaks after it; whitespace that ends
# the text; whitespace up to and including a line break; whitespace not followed by a
# non-space (so a run of spaces leaves its last space to the next word); any other whitespace.
# The possessive quantifiers (``?+``, ``++``) never give back what they matched; in this pattern
# that makes matching faster without changing any match. The ``regex`` package understands them,
# and ``\p{L}`` / ``\p{N}`` (any letter / digit, in every script).
CL100K_PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
)

# The pre-tokenizer of each encoding this module can rebuild from tiktoken's files.
PATTERNS: dict[str, str] = {"cl100k_base": CL100K_PATTERN}


# ---- training --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Merge:
    """One learned merge: ``pair`` becomes ``new_id``; it was replaced ``count`` times."""

    pair: tuple[int, int]
    new_id: int
    count: int


def pair_counts(ids: Sequence[int]) -> Counter[tuple[int, int]]:
    """How often each pair of neighbouring ids occurs (overlapping pairs each count)."""
    return Counter(pairwise(ids))


def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``ids`` with every occurrence of ``pair`` replaced by ``new_id``, scanning left to right
    (so ``a a a`` with pair ``(a, a)`` becomes ``new a``)."""
    out, i, n = [], 0, len(ids)
    first, second = pair
    while i < n:
        if ids[i] == first and i + 1 < n and ids[i + 1] == second:  # cheapest test first
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def most_frequent_pair(counts: Counter[tuple[int, int]]) -> tuple[int, int]:
    """The pair with the highest count; among equal counts, the smallest pair of ids
    (compared as tuples), so training gives the same merges on every machine."""
    return min(counts, key=lambda pair: (-counts[pair], pair))


def train_bpe(data: bytes, n_merges: int) -> list[Merge]:
    """Learn ``n_merges`` merges from ``data``'s bytes (chapter 1): new ids are 256, 257, ...

    Stops early, with fewer merges, when no pair occurs twice (a merge would not shorten the
    text by more than one id, and a pair seen once says nothing about other texts).
    """
    if not isinstance(data, (bytes, bytearray)):
        hint = " (encode text first: text.encode('utf-8'))" if isinstance(data, str) else ""
        raise TypeError(f"train_bpe expects bytes, got {type(data).__name__}{hint}")
    if n_merges < 0:
        raise ValueError(f"n_merges must be 0 or more, got {n_merges}")
    ids, merges = list(data), []
    for new_id in range(256, 256 + n_merges):
        counts = pair_counts(ids)
        if not counts or max(counts.values()) < 2:
            break
        pair = most_frequent_pair(counts)
        merged = merge_pair(ids, pair, new_id)
        merges.append(Merge(pair, new_id, len(ids) - len(merged)))
        ids = merged
    return merges


def sequence_lengths(n_bytes: int, merges: Sequence[Merge]) -> list[int]:
    """The training text's length in ids before any merge and after each one
    (``n_bytes`` is the length of the bytes the merges were learned from)."""
    lengths = [n_bytes]
    for merge in merges:
        lengths.append(lengths[-1] - merge.count)
    return lengths


def merge_vocabulary(merges: Iterable[Merge]) -> dict[int, bytes]:
    """The bytes each id stands for: the 256 single bytes, then one entry per merge."""
    vocab = {i: bytes([i]) for i in range(256)}
    for merge in merges:
        vocab[merge.new_id] = vocab[merge.pair[0]] + vocab[merge.pair[1]]
    return vocab


# ---- encoding and decoding with learned ranks ------------------------------------------------


class BytePairEncoder:
    """Encode and decode with a learned rank table (chapter 1), written for reading, not speed.

    ``ranks`` maps the bytes of every learned token to its id, which is also the order in which
    it was learned; ``pattern`` is the pre-tokenizer; ``special_tokens`` maps each special
    token's text to its id. Chunks already encoded are remembered (``self.cache``): a text
    repeats its words, and the merges of a chunk never depend on its neighbours.
    """

    def __init__(self, ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int]):
        self.ranks = ranks
        self.pattern = regex.compile(pattern)
        self.special_tokens = special_tokens
        self.token_bytes = {i: b for b, i in ranks.items()}
        self.token_bytes.update({i: s.encode("utf-8") for s, i in special_tokens.items()})
        self.cache: dict[bytes, tuple[int, ...]] = {}

    @classmethod
    def from_tiktoken(cls, name: str = "cl100k_base") -> BytePairEncoder:
        """The encoder for one of tiktoken's encodings, rebuilt from its public token table."""
        if name not in PATTERNS:
            raise ValueError(
                f"no hand-built pre-tokenizer for the encoding {name!r}; known: "
                f"{', '.join(PATTERNS)}. For another encoding, pass its rank table and pattern "
                "to BytePairEncoder(ranks, pattern, special_tokens) yourself."
            )
        encoding = get_encoding(name)
        special = {s: encoding.encode_single_token(s) for s in encoding.special_tokens_set}
        ranks: dict[bytes, int] = {}
        for i in range(encoding.n_vocab):
            if i in special.values():
                continue
            try:
                ranks[encoding.decode_single_token_bytes(i)] = i
            except KeyError:  # an id the encoding leaves unused (cl100k_base has 16)
                continue
        return cls(ranks, PATTERNS[name], special)

    def encode_chunk(self, chunk: bytes) -> list[int]:
        """One pre-tokenized chunk's ids: merge the lowest-ranked neighbouring pair until no
        pair forms a token. When the same pair occurs twice, the leftmost is merged first, as in
        tiktoken (in ``!!!!!!`` the order changes the ids).

        tiktoken also takes a chunk that is itself a token as that token without merging; for
        cl100k_base that changes nothing, since the bytes of every one of its tokens merge back
        into it, so this function leaves the shortcut out.
        """
        if chunk in self.cache:
            return list(self.cache[chunk])
        parts = [bytes([b]) for b in chunk]
        while len(parts) > 1:
            pair_ranks = [self.ranks.get(a + b) for a, b in pairwise(parts)]
            known = [(rank, i) for i, rank in enumerate(pair_ranks) if rank is not None]
            if not known:
                break
            _, i = min(known)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids = [self.ranks[part] for part in parts]
        self.cache[chunk] = tuple(ids)
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids, with special-token text encoded as ordinary characters."""
        text = self._checked_text(text)
        ids = []
        for chunk in self.pattern.findall(text):
            ids.extend(self.encode_chunk(chunk.encode("utf-8")))
        return ids

    def encode(
        self, text: str, *, allowed_special: Literal["all"] | Collection[str] = ()
    ) -> list[int]:
        """Text -> ids. A special token's text becomes its id when named in ``allowed_special``
        (or ``"all"``); any other special token's text in ``text`` is an error, as in tiktoken."""
        text = self._checked_text(text)
        if isinstance(allowed_special, str) and allowed_special != "all":
            raise TypeError(
                f"allowed_special takes a set of names or 'all', not the string "
                f"{allowed_special!r}; write allowed_special={{{allowed_special!r}}}"
            )
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            known = ", ".join(sorted(self.special_tokens))
            raise ValueError(f"not special tokens: {sorted(unknown)}; known: {known}")
        refused = sorted(s for s in set(self.special_tokens) - allowed if s in text)
        if refused:
            raise ValueError(
                f"the text contains the special token(s) {refused}. Pass them in allowed_special "
                "to encode them as special ids, or use encode_ordinary to encode them as text."
            )
        if not allowed:
            return self.encode_ordinary(text)
        longest_first = sorted(allowed, key=len, reverse=True)
        splitter = "(" + "|".join(regex.escape(s) for s in longest_first) + ")"
        ids = []
        for k, piece in enumerate(regex.split(splitter, text)):
            # split keeps the separators at the odd positions: those are the special tokens
            ids.extend([self.special_tokens[piece]] if k % 2 else self.encode_ordinary(piece))
        return ids

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Ids -> the bytes they stand for."""
        out = []
        for i in ids:
            if i not in self.token_bytes:
                raise ValueError(f"{i!r} is not a token id of this encoding")
            out.append(self.token_bytes[i])
        return b"".join(out)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text. A cut through a multi-byte character shows as U+FFFD, as in tiktoken."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    @staticmethod
    def _checked_text(text: str) -> str:
        if not isinstance(text, str):
            hint = " (decode it first: data.decode('utf-8'))" if isinstance(text, bytes) else ""
            raise TypeError(f"encode expects a str, got {type(text).__name__}{hint}")
        # a lone surrogate (from a broken UTF-16 source) has no UTF-8 bytes; tiktoken replaces
        # it with U+FFFD, and so do we
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
