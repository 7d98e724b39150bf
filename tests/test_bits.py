"""Bits per byte (chapter 13): every token after the first is scored exactly once, with the
context a window allows, and the sum equals the model's own loss where one window suffices."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import random_ids, tiny_model

from gptlib.bits import _windows, bits_per_byte, token_losses


@pytest.mark.parametrize(
    ("n", "window", "stride"), [(2, 4, 2), (30, 12, 6), (31, 12, 11), (100, 8, 1)]
)
def test_every_target_is_scored_once(n, window, stride):
    scored = []
    for begin, end, first in _windows(n, window, stride):
        assert end - begin <= window and begin < first <= end
        scored += range(first, end)
    assert scored == list(range(1, n))


def test_one_window_equals_the_models_loss():
    model = tiny_model(0)
    ctx = model.config.context_length
    ids = random_ids(0, 1, ctx + 1)[0]  # the model's whole context, plus the last target
    losses = token_losses(model, ids)
    _, mean = model(ids[None, :-1], ids[None, 1:])
    torch.testing.assert_close(losses.mean(), mean)


def test_long_texts_use_windows_and_batches_alike():
    model = tiny_model(1)
    ids = random_ids(1, 1, 50)[0]
    a = token_losses(model, ids, stride=6, batch_size=1)
    b = token_losses(model, ids, stride=6, batch_size=4)
    torch.testing.assert_close(a, b)
    assert a.shape == (49,) and (a > 0).all()
    # the first window fills the model's whole context: one forward pass of those tokens
    ctx = model.config.context_length
    _, first = model(ids[None, :ctx], ids[None, 1 : ctx + 1])
    torch.testing.assert_close(a[:ctx].mean(), first)
    # a later target sees the whole context too when the stride is 1
    c = token_losses(model, ids, stride=1)
    last_logits = model(ids[None, -ctx - 1 : -1])[0][0, -1]  # (V,): the last ctx tokens read
    torch.testing.assert_close(c[-1], -torch.log_softmax(last_logits, -1)[ids[-1]])
    assert model.training is False


def test_bits_per_byte_and_errors():
    assert bits_per_byte(math.log(2) * 10, 5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least one byte"):
        bits_per_byte(1.0, 0)
    with pytest.raises(ValueError, match="at least two tokens"):
        token_losses(tiny_model(0), [3])
    with pytest.raises(ValueError, match="stride must be between"):
        token_losses(tiny_model(0), [3, 4, 5], stride=10**6)
