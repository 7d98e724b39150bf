"""The hand-built BPE of chapter 1 (gptlib.bpe): exactly tiktoken's ids on the whole textbook and
on random Unicode text, decoding back, training checked against a worked example and an
independent implementation, special tokens as tiktoken treats them, and clear errors."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlib.bpe import (
    BytePairEncoder,
    Merge,
    merge_pair,
    merge_vocabulary,
    sequence_lengths,
    train_bpe,
)


@pytest.fixture(scope="module")
def bpe(cl100k) -> BytePairEncoder:  # cl100k first: it skips the module when the files are missing
    return BytePairEncoder.from_tiktoken("cl100k_base")


# ---- encoding: equal to tiktoken -------------------------------------------------------------


def test_the_whole_textbook_gives_tiktokens_ids(corpus_text, cl100k, bpe):
    ids = bpe.encode_ordinary(corpus_text)
    assert ids == cl100k.encode_ordinary(corpus_text)
    assert bpe.encode(corpus_text) == ids  # the textbook holds no special-token text
    assert bpe.decode(ids) == corpus_text
    assert bpe.decode_bytes(ids) == corpus_text.encode("utf-8")


def test_the_rank_table_is_cl100ks(cl100k, bpe):
    # 256 single bytes + 100,000 merges, rebuilt through tiktoken's public API
    assert len(bpe.ranks) == 100_256
    assert all(bpe.ranks[bytes([b])] < 256 for b in range(256))
    if hasattr(cl100k, "_mergeable_ranks"):  # tiktoken's own table, where it still exposes it
        assert bpe.ranks == cl100k._mergeable_ranks
    assert bpe.special_tokens["<|endoftext|>"] == cl100k.eot_token == 100_257


def test_the_pre_tokenizer_splits_as_worked_out_by_hand(bpe):
    # contraction; word with its space; a lone space before digits; digits in threes;
    # punctuation keeps the line breaks after it; of two spaces, the last goes to the word
    text = "I'll pay 12345 now!\n\n  ok"
    expected = ["I", "'ll", " pay", " ", "123", "45", " now", "!\n\n", " ", " ok"]
    assert bpe.pattern.findall(text) == expected


def test_every_sampled_token_is_what_its_own_bytes_merge_into(bpe):
    # tiktoken takes a chunk that is itself a token as that token without merging; the merges
    # reach the same token, so the shortcut is only a speed-up (every 20th token checked here)
    sample = sorted(bpe.ranks.items(), key=lambda item: item[1])[::20]
    wrong = [(token, rank) for token, rank in sample if bpe.encode_chunk(token) != [rank]]
    assert not wrong, wrong[:5]


# pieces that stress the pre-tokenizer, mixed below with any Unicode characters
PIECES = [
    *["👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "🦜"],  # emoji: skin tone, ZWJ family, flag
    *["中文字符", "日本語", "한국어"],  # CJK and Hangul
    *["e\u0301", "a\u0308\u0323", "\u0301"],  # combining marks, one with no base letter
    *[" ", "  ", "   ", "\t", "\n", "\n\n", "\r", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028"],
    *["0", "12", "12345", "٣٤٥", "１２", "Ⅻ", "$3.50"],  # digits of several scripts
    *["'s", "'LL", "'ve", "’t", "<|", "|>", "<|endoftext|>"],  # contractions, special-looking
    *["hello", " world", "Hello,", "ÇA", "straße", "ﬁ", "!!!", "...", "--"],
]
texts = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(max_size=6), st.characters(codec="utf-8")),
    max_size=12,
).map("".join)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=texts)
def test_random_unicode_gives_tiktokens_ids_and_decodes_back(cl100k, bpe, text):
    ids = bpe.encode_ordinary(text)
    assert ids == cl100k.encode_ordinary(text)
    assert bpe.decode(ids) == text


EDGE_CASES = [
    "",
    "I'LL GO, DON'T YOU?",
    "it’s",
    "x\ry",
    "\rabc",
    "a\r\nb",
    "end   ",
    "a  b",
    "  \n  \nx",
    "1234567",
    "v2.0.13",
    "a\u00a0b",
    "\u3000\u3000z",
    "tab\tand\t\ttabs",
    "e\u0301e\u0301",
]


@pytest.mark.parametrize("text", EDGE_CASES)
def test_hand_picked_edge_cases_give_tiktokens_ids(cl100k, bpe, text):
    assert bpe.encode_ordinary(text) == cl100k.encode_ordinary(text)


def test_runs_of_one_character_give_tiktokens_ids(cl100k, bpe):
    # in "!!!!!!" the same pair occurs five times; merging the leftmost first, as tiktoken does,
    # matters here (merging the rightmost first gives other ids for 1,864 such runs)
    for char in "!-=*.#~_ \n\t0a中🦜":
        for n in range(1, 41):
            assert bpe.encode_ordinary(char * n) == cl100k.encode_ordinary(char * n), (char, n)


def test_a_lone_surrogate_becomes_the_replacement_character_as_in_tiktoken(cl100k, bpe):
    text = "a\ud800b"  # not valid Unicode text: half of a UTF-16 pair
    ids = bpe.encode_ordinary(text)
    assert ids == cl100k.encode_ordinary(text)
    assert bpe.decode(ids) == "a\ufffdb"


def test_decoding_part_of_a_character_shows_the_replacement_character(cl100k, bpe):
    ids = bpe.encode_ordinary("🦜")
    assert len(ids) > 1  # the parrot's four bytes are not one token
    assert bpe.decode(ids[:1]) == cl100k.decode(ids[:1]) and "\ufffd" in bpe.decode(ids[:1])


# ---- special tokens --------------------------------------------------------------------------


def test_special_token_text_is_refused_unless_allowed(cl100k, bpe):
    text = "one document<|endoftext|>the next"
    with pytest.raises(ValueError, match="allowed_special"):
        cl100k.encode(text)  # what we imitate
    with pytest.raises(ValueError, match=re.escape("['<|endoftext|>']")):
        bpe.encode(text)
    allowed = bpe.encode(text, allowed_special={"<|endoftext|>"})
    assert allowed == cl100k.encode(text, allowed_special={"<|endoftext|>"})
    assert allowed.count(100_257) == 1
    assert bpe.decode(allowed) == text


def test_only_the_allowed_special_tokens_are_accepted(cl100k, bpe):
    text = "<|fim_prefix|>a<|endoftext|>b<|endofprompt|>"
    with pytest.raises(ValueError, match="fim_prefix"):
        bpe.encode(text, allowed_special={"<|endoftext|>"})
    ids = bpe.encode(text, allowed_special="all")
    assert ids == cl100k.encode(text, allowed_special="all")
    assert [i for i in ids if i >= 100_257] == [100_258, 100_257, 100_276]


def test_encode_ordinary_keeps_special_token_text_as_text(cl100k, bpe):
    ids = bpe.encode_ordinary("<|endoftext|>")
    assert ids == cl100k.encode_ordinary("<|endoftext|>")
    assert 100_257 not in ids and len(ids) > 1
    assert bpe.decode([100_257]) == "<|endoftext|>"


def test_an_unknown_special_token_name_is_an_error(bpe):
    with pytest.raises(ValueError, match="not special tokens.*<\\|eot\\|>"):
        bpe.encode("hi", allowed_special={"<|eot|>"})
    with pytest.raises(TypeError, match=re.escape("allowed_special={'<|endoftext|>'}")):
        bpe.encode("hi", allowed_special="<|endoftext|>")  # a string, not a set of strings


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"bytes", None, 42, ["a"]])
def test_encoding_something_other_than_text_is_a_type_error(bpe, value):
    with pytest.raises(TypeError, match=f"expects a str, got {type(value).__name__}"):
        bpe.encode(value)
    with pytest.raises(TypeError, match="expects a str"):
        bpe.encode_ordinary(value)


def test_bytes_get_a_hint_on_how_to_decode_them(bpe):
    with pytest.raises(TypeError, match=re.escape("data.decode('utf-8')")):
        bpe.encode_ordinary(b"hi")


@pytest.mark.parametrize("bad_id", [100_256, 100_261, -1, 10**6, "7"])
def test_decoding_an_id_outside_the_encoding_is_an_error(bpe, bad_id):
    # 100,256 and 100,261..100,275 are ids cl100k_base leaves unused
    with pytest.raises(ValueError, match="is not a token id of this encoding"):
        bpe.decode([1, bad_id])


@pytest.mark.parametrize("name", ["gpt2", "no_such_encoding"])
def test_an_encoding_without_a_hand_built_pre_tokenizer_is_an_error(name):
    with pytest.raises(ValueError, match=f"no hand-built pre-tokenizer for the encoding '{name}'"):
        BytePairEncoder.from_tiktoken(name)


# ---- training --------------------------------------------------------------------------------


def test_training_reproduces_the_worked_example():
    # "aaabdaaabac": "aa" is the most frequent pair (3 overlapping times) and is replaced twice
    # (left to right: aa a b d aa a b a c). Then "Za" and "ab" both occur twice; the tie goes to
    # the smaller pair of ids, (97, 98) < (256, 97). Then "ZY" occurs twice, and after it no pair
    # repeats, so training stops: Z d Z a c.
    a, b = ord("a"), ord("b")
    expected = [Merge((a, a), 256, 2), Merge((a, b), 257, 2), Merge((256, 257), 258, 2)]
    merges = train_bpe(b"aaabdaaabac", 10)
    assert merges == expected
    assert sequence_lengths(11, merges) == [11, 9, 7, 5]
    assert merge_vocabulary(merges)[258] == b"aaab"


def reference_training(data: bytes, n_merges: int) -> list[tuple[tuple[int, int], int]]:
    """A second, independent BPE trainer: ids written as decimal text, pairs counted with an
    explicit loop, each merge a regular-expression substitution (left to right, no overlap)."""
    text = " " + " ".join(str(b) for b in data) + " "
    out = []
    for new_id in range(256, 256 + n_merges):
        ids = [int(x) for x in text.split()]
        counts: dict[tuple[int, int], int] = {}
        for i in range(len(ids) - 1):
            counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
        best = max(counts.values(), default=0)
        if best < 2:
            break
        pair = sorted(p for p, c in counts.items() if c == best)[0]
        text = re.sub(rf"(?<= ){pair[0]} {pair[1]}(?= )", str(new_id), text)
        out.append((pair, new_id))
    return out


def test_training_matches_an_independent_implementation(corpus_text):
    for data in [corpus_text[:3000].encode("utf-8"), "ça, c'est ça — 中文中文 🙂🙂".encode()]:
        merges = train_bpe(data, 40)
        assert [(m.pair, m.new_id) for m in merges] == reference_training(data, 40)


def test_the_recorded_lengths_are_the_lengths_of_the_merged_text(corpus_text):
    data = corpus_text[:5000].encode("utf-8")
    merges = train_bpe(data, 25)
    ids, lengths = list(data), [len(data)]
    for merge in merges:
        ids = merge_pair(ids, merge.pair, merge.new_id)
        lengths.append(len(ids))
    assert sequence_lengths(len(data), merges) == lengths
    assert lengths[-1] < lengths[0]
    vocab = merge_vocabulary(merges)
    assert b"".join(vocab[i] for i in ids) == data  # the merged ids still spell the text


def test_merging_overlapping_pairs_goes_left_to_right():
    assert merge_pair([1, 1, 1], (1, 1), 9) == [9, 1]
    assert merge_pair([1, 1, 1, 1], (1, 1), 9) == [9, 9]
    assert merge_pair([2, 1, 2], (1, 1), 9) == [2, 1, 2]


def test_training_stops_when_no_pair_repeats():
    assert train_bpe(b"abcdef", 5) == []
    assert train_bpe(b"", 5) == []
    assert train_bpe(b"abab", 0) == []


def test_training_rejects_text_and_negative_counts():
    with pytest.raises(TypeError, match=re.escape("text.encode('utf-8')")):
        train_bpe("some text", 3)
    with pytest.raises(ValueError, match="n_merges must be 0 or more, got -1"):
        train_bpe(b"abab", -1)
