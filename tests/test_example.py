"""The running example every chapter shares: its batch, its configuration and its seeded model."""

from __future__ import annotations

import math

import pytest
import torch

from gptlib.example import (
    BATCH_SIZE,
    CONTEXT_LENGTH,
    D_MODEL,
    N_BLOCKS,
    N_HEADS,
    RunningExample,
    book_config,
    running_example,
)
from gptlib.model import GPTConfig

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def ex(corpus_text, cl100k) -> RunningExample:  # the fixtures skip when the data is missing
    return running_example()


def test_corpus_tokens_and_split(ex, corpus_text):
    assert ex.text == corpus_text
    assert ex.ids.dtype == torch.long and ex.ids.shape == (77_919,)
    assert len(ex.train) == 70_127 and len(ex.val) == 7_792
    assert torch.equal(torch.cat([ex.train, ex.val]), ex.ids)
    assert ex.tokenizer.decode(ex.ids.tolist()) == corpus_text


def test_batch_shape_and_shift(ex):
    assert (BATCH_SIZE, CONTEXT_LENGTH) == (4, 16)
    assert ex.x.shape == ex.y.shape == (4, 16)
    windows = ex.train.unfold(0, 17, 1)  # every window of 17 consecutive training tokens
    for b in range(4):
        found = (windows[:, :16] == ex.x[b]).all(1) & (windows[:, 1:] == ex.y[b]).all(1)
        assert found.any(), f"row {b} is not a window of the train stream followed by its shift"
    assert torch.equal(ex.x[:, 1:], ex.y[:, :-1])


def test_batch_is_the_same_every_time(ex):
    again = running_example()
    assert torch.equal(again.x, ex.x) and torch.equal(again.y, ex.y)
    other = running_example(seed=7)
    assert not torch.equal(other.x, ex.x)


def test_tokens_are_readable_strings(ex):
    tokens = ex.tokens(0)
    assert len(tokens) == 16 and all(isinstance(t, str) for t in tokens)
    assert "".join(tokens).replace("␣", " ").replace("↵", "\n") == ex.tokenizer.decode(
        ex.x[0].tolist()
    )


def test_config_is_the_books(ex):
    c = ex.config
    assert c.vocab_size == 100_070 == int(ex.ids.max()) + 1
    assert (c.context_length, c.d_model, c.n_heads, c.n_blocks) == (16, 64, 4, 8)
    assert (D_MODEL, N_HEADS, N_BLOCKS) == (64, 4, 8)
    assert c.d_ff == 256 and c.n_kv_heads == 4 and c.dropout == 0.1 and c.fused_attention is False
    assert book_config(vocab_size=100_070) == c
    assert book_config() == GPTConfig()  # GPTConfig's defaults are the book's model
    assert book_config(vocab_size=10, norm_placement="post").norm_placement == "post"


def test_model_is_seeded_and_in_eval_mode(ex):
    a, b, other = ex.model(), ex.model(0), ex.model(seed=1)
    assert not a.training
    assert a.config == ex.config
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(a.token_embedding.weight, other.token_embedding.weight)
    with torch.no_grad():
        logits, loss = a(ex.x, ex.y)
        logits_b, _ = b(ex.x)
    assert logits.shape == (4, 16, 100_070)
    torch.testing.assert_close(logits, logits_b, rtol=0, atol=0)  # eval mode: no dropout
    assert abs(loss.item() - math.log(100_070)) < 0.1  # an untrained model is guessing


def test_model_overrides(ex):
    post = ex.model(norm_placement="post", n_blocks=2)
    assert post.config.norm_placement == "post" and len(post.blocks) == 2
    assert ex.model(vocab_size=10).config.vocab_size == 10  # any field, vocab_size too
    swiglu = ex.model(activation="swiglu").config
    assert swiglu.d_ff == round(8 * 64 / 3)  # the width is worked out for the overrides
    # the shared config is unchanged
    assert ex.config.norm_placement == "pre" and ex.config.n_blocks == 8


def test_model_vocab_size_override(ex):
    # the chapters build the compact-vocabulary model this way (chapters 2, 9, 10)
    compact = ex.model(vocab_size=3771, fused_attention=True)
    assert compact.config.vocab_size == 3771 and compact.config.fused_attention
    assert compact.token_embedding.weight.shape == (3771, ex.config.d_model)
    assert ex.model().config.vocab_size == ex.config.vocab_size  # the default: cl100k's ids
