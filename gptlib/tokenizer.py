"""Text <-> token ids: tiktoken encodings and a compact vocabulary.

The book uses OpenAI's ``cl100k_base`` byte-pair encoding through ``tiktoken``. Its ids run up to
100,276, but a given corpus only uses a few thousand of them. :class:`Vocabulary` maps the ids a
corpus actually uses onto dense ids ``0..n-1`` so that a model's embedding and output layers can
be much smaller; :class:`Tokenizer` puts the two together so text goes straight to model ids.

Unknown ids: a :class:`Vocabulary` has **no** reserved "unknown" entry. Asking it for an id it
was not built from raises :class:`UnknownTokenError`, which names the offending tokens. This keeps
the vocabulary exactly the corpus's ids (3,771 for the sales textbook) and never silently changes
a prompt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import tiktoken

# Where tiktoken downloads each encoding's files from; tiktoken caches a file under the sha1 of
# its URL, which is how we can tell a user exactly which file is missing.
_BLOB = "https://openaipublic.blob.core.windows.net"
ENCODING_URLS: dict[str, tuple[str, ...]] = {
    "cl100k_base": (f"{_BLOB}/encodings/cl100k_base.tiktoken",),
    "gpt2": (
        f"{_BLOB}/gpt-2/encodings/main/vocab.bpe",
        f"{_BLOB}/gpt-2/encodings/main/encoder.json",
    ),
    "r50k_base": (f"{_BLOB}/encodings/r50k_base.tiktoken",),
    "p50k_base": (f"{_BLOB}/encodings/p50k_base.tiktoken",),
    "p50k_edit": (f"{_BLOB}/encodings/p50k_base.tiktoken",),
    "o200k_base": (f"{_BLOB}/encodings/o200k_base.tiktoken",),
    "o200k_harmony": (f"{_BLOB}/encodings/o200k_base.tiktoken",),
}
# How many ids each encoding has (its n_vocab), known without loading its files: a stored
# vocabulary is checked against it.
ENCODING_SIZES: dict[str, int] = {
    "gpt2": 50_257,
    "r50k_base": 50_257,
    "p50k_base": 50_281,
    "p50k_edit": 50_284,
    "cl100k_base": 100_277,
    "o200k_base": 200_019,
    "o200k_harmony": 201_088,
}


class TokenizerUnavailableError(RuntimeError):
    """The files of a tiktoken encoding are neither cached nor downloadable."""


class UnknownTokenError(KeyError):
    """A token id is not part of a :class:`Vocabulary`."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


def tiktoken_cache_dir() -> str:
    """The folder tiktoken reads its cached files from (same rule tiktoken itself uses)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def cache_path_for(url: str) -> str:
    """The path where tiktoken expects the cached copy of ``url``."""
    return os.path.join(tiktoken_cache_dir(), hashlib.sha1(url.encode()).hexdigest())


def get_encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    """Load a tiktoken encoding, with a clear error when its files cannot be had.

    tiktoken honours ``TIKTOKEN_CACHE_DIR``; offline, point it at a folder that holds the cached
    files (their names are the sha1 of the download URL, see :func:`cache_path_for`).
    """
    try:
        return tiktoken.get_encoding(name)
    except Exception as err:  # network errors come from requests/urllib and vary by version
        if isinstance(err, ValueError) and name not in tiktoken.list_encoding_names():
            known = ", ".join(tiktoken.list_encoding_names())
            raise ValueError(
                f"unknown tiktoken encoding {name!r}; known encodings: {known}"
            ) from err
        # a known name can still fail with a ValueError (tiktoken's download hash check)
        raise _unavailable(name, err) from err


def _unavailable(name: str, err: Exception) -> TokenizerUnavailableError:
    """The error for a known encoding whose files failed to load: which are missing (and where
    each goes), or which cached ones may be damaged."""
    urls = ENCODING_URLS.get(name, ())
    paths = [(u, cache_path_for(u)) for u in urls]
    missing = [(u, p) for u, p in paths if not os.path.exists(p)]
    why = f"({type(err).__name__}: {err})"
    if not urls:  # an encoding from a tiktoken plug-in: we do not know its files
        return TokenizerUnavailableError(
            f"could not load the tiktoken encoding {name!r} {why}. Its files are not in "
            f"{tiktoken_cache_dir()} and could not be downloaded: connect to the internet once, or "
            "set TIKTOKEN_CACHE_DIR to a folder that holds them"
        )
    if not missing:  # cached but still failing: those very files are damaged
        files = ", ".join(p for _, p in paths)
        return TokenizerUnavailableError(
            f"could not load the tiktoken encoding {name!r} {why}. Its cached file(s) {files} may "
            "be damaged: delete just these (nothing else in the cache) and retry with network "
            "access, or copy them again from a machine where the encoding loads"
        )
    lines = "\n".join(f"  {u}\n    -> save as {p}" for u, p in missing)
    return TokenizerUnavailableError(
        f"could not load the tiktoken encoding {name!r}: it is not cached and could not be "
        f"downloaded {why}. Missing file(s):\n{lines}\n"
        "Either connect to the internet, or download each URL above to the path shown, or set "
        "TIKTOKEN_CACHE_DIR to a folder that already holds these files."
    )


def token_strings(encoding: tiktoken.Encoding, ids: Iterable[int]) -> list[str]:
    """Readable text of each token, for table and plot labels.

    Spaces are shown as ``␣``, newlines as ``↵`` and tabs as ``⇥`` so that whitespace is visible; a
    token that is only part of a multi-byte character is shown with the replacement character.
    """
    out = []
    for i in ids:
        s = encoding.decode_single_token_bytes(int(i)).decode("utf-8", errors="replace")
        out.append(s.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥"))
    return out


@dataclass(frozen=True)
class Vocabulary:
    """A dense re-numbering of the token ids a corpus uses.

    ``ids[k]`` is the original (e.g. cl100k) id of dense id ``k``; the ids are kept in increasing
    order so that the mapping is the same whatever order the corpus visits them in.
    """

    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.ids) == 0:
            raise ValueError("a Vocabulary needs at least one token id")
        if list(self.ids) != sorted(set(self.ids)):
            raise ValueError("Vocabulary ids must be distinct and sorted; use Vocabulary.from_ids")
        object.__setattr__(self, "_index", {t: k for k, t in enumerate(self.ids)})

    @classmethod
    def from_ids(cls, token_ids: Iterable[int]) -> Vocabulary:
        """Build the vocabulary of every distinct id in ``token_ids``."""
        return cls(tuple(sorted({int(t) for t in token_ids})))

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, token_id: object) -> bool:
        return token_id in self._index  # type: ignore[attr-defined]

    @property
    def max_id(self) -> int:
        """The largest original id in the vocabulary."""
        return self.ids[-1]

    def encode(self, token_ids: Iterable[int]) -> list[int]:
        """Original ids -> dense ids. Raises :class:`UnknownTokenError` for ids not in the vocab."""
        index: dict[int, int] = self._index  # type: ignore[attr-defined]
        token_ids = [int(t) for t in token_ids]
        try:
            return [index[t] for t in token_ids]
        except KeyError:
            unknown = sorted({t for t in token_ids if t not in index})
            shown = ", ".join(map(str, unknown[:10])) + (" ..." if len(unknown) > 10 else "")
            raise UnknownTokenError(
                f"{len(unknown)} token id(s) are not in this {len(self)}-token vocabulary: "
                f"{shown}. The vocabulary only knows the tokens of the text it was built from; "
                "rephrase the input, or build the vocabulary from a corpus that contains them."
            ) from None

    def decode(self, dense_ids: Iterable[int]) -> list[int]:
        """Dense ids -> original ids. Raises :class:`UnknownTokenError` for ids out of range."""
        out = []
        for k in dense_ids:
            k = int(k)
            if not 0 <= k < len(self.ids):
                raise UnknownTokenError(
                    f"dense id {k} is out of range for a vocabulary of {len(self)} tokens "
                    f"(valid ids are 0..{len(self) - 1})"
                )
            out.append(self.ids[k])
        return out


class Tokenizer:
    """Text <-> model ids: a tiktoken encoding, optionally followed by a compact Vocabulary."""

    def __init__(
        self, encoding: tiktoken.Encoding | str = "cl100k_base", vocab: Vocabulary | None = None
    ) -> None:
        self.encoding = get_encoding(encoding) if isinstance(encoding, str) else encoding
        self.vocab: Vocabulary | None = vocab

    @classmethod
    def from_corpus(cls, text: str, encoding: tiktoken.Encoding | str = "cl100k_base") -> Tokenizer:
        """A tokenizer whose compact vocabulary holds exactly the tokens of ``text``."""
        tok = cls(encoding)
        tok.vocab = Vocabulary.from_ids(tok.encoding.encode_ordinary(text))
        return tok

    @property
    def vocab_size(self) -> int:
        """How many rows a model's embedding needs for these ids."""
        return len(self.vocab) if self.vocab is not None else self.encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        """Text -> model ids (special-token text like ``<|endoftext|>`` stays plain text)."""
        ids = self.encoding.encode_ordinary(text)
        return self.vocab.encode(ids) if self.vocab is not None else ids

    def decode(self, ids: Sequence[int] | Iterable[int]) -> str:
        """Model ids -> text."""
        ids = [int(i) for i in ids]
        if self.vocab is not None:
            ids = self.vocab.decode(ids)
        else:
            bad = [i for i in ids if not 0 <= i < self.encoding.n_vocab]
            if bad:
                raise UnknownTokenError(
                    f"token id(s) {bad[:10]} are outside the {self.encoding.name} range "
                    f"0..{self.encoding.n_vocab - 1}"
                )
        return self.encoding.decode(ids)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Readable text of each model id (see :func:`token_strings`)."""
        ids = list(ids)
        if self.vocab is not None:
            ids = self.vocab.decode(ids)
        return token_strings(self.encoding, ids)
