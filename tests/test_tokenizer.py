"""Tokenizer and Vocabulary: round trips on the real dataset, its known numbers, unknown ids, and
the clear error when tiktoken's files are neither cached nor downloadable (network blocked)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry

from gptlib.tokenizer import (
    ENCODING_SIZES,
    ENCODING_URLS,
    Tokenizer,
    TokenizerUnavailableError,
    UnknownTokenError,
    Vocabulary,
    cache_path_for,
    get_encoding,
    token_strings,
)

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture(scope="module")
def corpus_tokenizer(corpus_text, cl100k) -> Tokenizer:
    return Tokenizer.from_corpus(corpus_text, cl100k)


# ---- the real dataset ------------------------------------------------------------------------


def test_dataset_facts(corpus_text, cl100k):
    ids = cl100k.encode_ordinary(corpus_text)
    assert len(corpus_text) == 460_319
    assert len(ids) == 77_919
    assert len(set(ids)) == 3_771
    assert max(ids) == 100_069
    assert cl100k.decode_single_token_bytes(100_069) == b"Clar"


def test_full_id_tokenizer_round_trip(corpus_text, cl100k):
    tok = Tokenizer(cl100k)
    assert tok.vocab is None and tok.vocab_size == cl100k.n_vocab
    ids = tok.encode(corpus_text)
    assert ids == cl100k.encode_ordinary(corpus_text)
    assert tok.decode(ids) == corpus_text


def test_compact_tokenizer_round_trip(corpus_text, cl100k, corpus_tokenizer):
    tok = corpus_tokenizer
    assert tok.vocab_size == len(tok.vocab) == 3_771
    assert tok.vocab.max_id == 100_069
    dense = tok.encode(corpus_text)
    assert len(dense) == 77_919
    assert min(dense) == 0 and max(dense) == 3_770
    assert tok.decode(dense) == corpus_text
    # dense id k stands for the k-th smallest cl100k id
    full = cl100k.encode_ordinary(corpus_text)
    assert tok.vocab.decode(dense) == full
    assert tok.vocab.ids == tuple(sorted(set(full)))
    assert tok.token_strings([dense[0]]) == token_strings(cl100k, [full[0]])


def test_compact_tokenizer_rejects_text_outside_its_corpus(corpus_tokenizer, cl100k):
    word = "Zyzzyva"
    unknown = [t for t in cl100k.encode_ordinary(word) if t not in corpus_tokenizer.vocab]
    assert unknown, "the test word must use a token the textbook does not"
    with pytest.raises(UnknownTokenError, match=str(unknown[0])):
        corpus_tokenizer.encode(word)


def test_tokenizer_accepts_an_encoding_name_and_keeps_special_text_plain(cl100k):
    tok = Tokenizer("cl100k_base")
    assert tok.encoding.name == "cl100k_base"
    ids = tok.encode("<|endoftext|>")
    assert 100_257 not in ids and len(ids) > 1  # not the special end-of-text token
    assert tok.decode(ids) == "<|endoftext|>"
    with pytest.raises(UnknownTokenError, match=r"outside the cl100k_base range 0..100276"):
        tok.decode([1, cl100k.n_vocab])


def test_token_strings_show_spaces_and_newlines(cl100k):
    ids = cl100k.encode_ordinary("Hello world\n")
    strings = token_strings(cl100k, ids)
    assert strings == ["Hello", "␣world", "↵"]
    # a token that is part of a multi-byte character shows the replacement character
    emoji = cl100k.encode_ordinary("🙂")
    assert len(emoji) > 1 and "\ufffd" in token_strings(cl100k, emoji[:1])[0]


# ---- Vocabulary --------------------------------------------------------------------------------


def test_vocabulary_round_trip_and_order():
    vocab = Vocabulary.from_ids([907, 5, 42, 5, 907, 13])
    assert vocab.ids == (5, 13, 42, 907) and len(vocab) == 4 and vocab.max_id == 907
    assert Vocabulary.from_ids([13, 907, 42, 5]) == vocab  # same whatever the visiting order
    assert vocab.encode([42, 5, 907, 13, 42]) == [2, 0, 3, 1, 2]
    assert vocab.decode([2, 0, 3, 1, 2]) == [42, 5, 907, 13, 42]
    assert 42 in vocab and 43 not in vocab


def test_vocabulary_unknown_ids_are_named():
    vocab = Vocabulary.from_ids([5, 13, 42])
    message = r"2 token id\(s\) are not in this 3-token vocabulary: 7, 99\b"
    with pytest.raises(UnknownTokenError, match=message) as info:
        vocab.encode([5, 99, 7, 99])
    assert isinstance(info.value, KeyError)
    assert str(info.value).startswith("2 token id(s)")  # no quotes, unlike a plain KeyError
    many = list(range(100, 112))
    with pytest.raises(UnknownTokenError, match=r"12 token id\(s\).*109 \.\.\."):
        vocab.encode(many)


@pytest.mark.parametrize("dense", [3, 10, -1])
def test_vocabulary_out_of_range_dense_ids_raise(dense):
    vocab = Vocabulary.from_ids([5, 13, 42])
    with pytest.raises(UnknownTokenError, match=rf"dense id {dense} is out of range .*0..2"):
        vocab.decode([0, dense])


def test_vocabulary_construction_errors():
    with pytest.raises(ValueError, match="at least one token id"):
        Vocabulary(())
    with pytest.raises(ValueError, match="distinct and sorted; use Vocabulary.from_ids"):
        Vocabulary((3, 1))
    with pytest.raises(ValueError, match="distinct and sorted"):
        Vocabulary((1, 1, 2))


# ---- tiktoken's files: unknown names, offline, corrupt caches --------------------------------


def test_unknown_encoding_name():
    message = "unknown tiktoken encoding 'nope'; known encodings: .*cl100k_base"
    with pytest.raises(ValueError, match=message):
        get_encoding("nope")


@pytest.fixture
def offline_empty_cache(monkeypatch, tmp_path):
    """An empty TIKTOKEN_CACHE_DIR, no in-process encodings, and every download refused."""
    attempts: list[str] = []

    def refuse(blobpath: str) -> bytes:
        attempts.append(blobpath)
        raise ConnectionError(f"network blocked by the test: {blobpath}")

    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.load, "read_file", refuse)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    return cache, attempts


def test_offline_error_names_the_url_and_the_cache_path(offline_empty_cache):
    cache, attempts = offline_empty_cache
    expected_path = cache / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    assert cache_path_for(CL100K_URL) == str(expected_path)
    with pytest.raises(TokenizerUnavailableError) as info:
        get_encoding("cl100k_base")
    message = str(info.value)
    assert attempts == [CL100K_URL]  # it did try, and only through the blocked function
    assert "not cached and could not be downloaded (ConnectionError" in message
    assert f"{CL100K_URL}\n    -> save as {expected_path}" in message
    assert "TIKTOKEN_CACHE_DIR" in message
    assert list(cache.iterdir()) == []
    with pytest.raises(TokenizerUnavailableError):  # the Tokenizer fails the same way
        Tokenizer("cl100k_base")


def test_offline_error_lists_every_missing_file(offline_empty_cache):
    cache, _ = offline_empty_cache
    with pytest.raises(TokenizerUnavailableError) as info:
        get_encoding("gpt2")
    message = str(info.value)
    assert len(ENCODING_URLS["gpt2"]) == 2
    for url in ENCODING_URLS["gpt2"]:
        assert f"{url}\n    -> save as {cache / hashlib.sha1(url.encode()).hexdigest()}" in message


def test_a_bad_download_is_not_called_an_unknown_encoding(monkeypatch, tmp_path):
    """tiktoken raises ValueError when downloaded bytes fail its hash check; that must not be
    reported as an unknown encoding name."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", lambda blobpath: b"not the real file")
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    pattern = r"(?s)could not load the tiktoken encoding 'cl100k_base'.*Hash mismatch.*"
    with pytest.raises(TokenizerUnavailableError, match=pattern + re.escape(str(tmp_path))):
        get_encoding("cl100k_base")


def test_cached_but_unreadable_files_are_called_corrupt(monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    Path(cache_path_for(CL100K_URL)).write_bytes(b"garbage")

    def broken(blobpath, expected_hash=None):
        raise OSError("cannot parse the cached file")

    monkeypatch.setattr(tiktoken.load, "read_file_cached", broken)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    with pytest.raises(TokenizerUnavailableError) as info:
        get_encoding("cl100k_base")
    message = str(info.value)
    assert f"cached file(s) {cache_path_for(CL100K_URL)} may be damaged" in message
    assert "delete just these (nothing else in the cache)" in message


def test_offline_o200k_names_its_missing_file_and_blames_no_cache(offline_empty_cache):
    """Issue 22, case 10: a missing o200k_base file was reported as a corrupt cache."""
    cache, attempts = offline_empty_cache
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    with pytest.raises(TokenizerUnavailableError) as info:
        get_encoding("o200k_base")
    message = str(info.value)
    assert attempts == [url]
    assert f"{url}\n    -> save as {cache / hashlib.sha1(url.encode()).hexdigest()}" in message
    assert "corrupt" not in message and "damaged" not in message and "delete" not in message


def test_encoding_sizes_match_tiktoken(cl100k):
    assert ENCODING_SIZES["cl100k_base"] == cl100k.n_vocab
    assert set(ENCODING_URLS) <= set(ENCODING_SIZES) <= set(tiktoken.list_encoding_names())


def test_encodings_work_again_after_the_offline_tests(cl100k):
    """The monkeypatches above are undone: the cached encoding is the usual one."""
    assert tiktoken.get_encoding("cl100k_base") is cl100k
    assert cl100k.decode(cl100k.encode_ordinary("hello there")) == "hello there"
