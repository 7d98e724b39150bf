"""Training: configuration checks, schedule, one step, the loop, history, callbacks,
reproducibility, resuming and the non-finite loss stop."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import pytest
import torch
from conftest import tiny_model

from gptlib.checkpoint import CheckpointError, load_checkpoint
from gptlib.data import get_batch
from gptlib.model import GPT
from gptlib.run import batch_seed
from gptlib.tokenizer import Vocabulary
from gptlib.train import (
    HISTORY_KEYS,
    TrainConfig,
    estimate_loss,
    learning_rate_at,
    make_optimizer,
    resolve_device,
    train,
    train_step,
)

# tiny models: one torch thread (see tests/conftest.py)
pytestmark = pytest.mark.usefixtures("single_thread")


VOCAB = 40


SIZES = {"vocab_size": VOCAB, "context_length": 8, "n_heads": 2, "dropout": 0.1}


def model_to_train(seed: int = 0, **overrides) -> GPT:
    """conftest's tiny model with this file's sizes (vocabulary 40, context 8, dropout 0.1)."""
    return tiny_model(seed, **{**SIZES, **overrides})


def pattern_data(n: int = 1200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A token stream that is mostly a repeating cycle (learnable) with a little noise."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(n) % VOCAB
    noise = torch.rand(n, generator=g) < 0.05
    ids[noise] = torch.randint(VOCAB, (int(noise.sum()),), generator=g)
    split = int(n * 0.9)
    return ids[:split], ids[split:]


def quick_config(**overrides) -> TrainConfig:
    base = TrainConfig(
        batch_size=4,
        max_iters=12,
        learning_rate=3e-3,
        eval_interval=4,
        eval_iters=2,
        device="cpu",
    )
    return replace(base, **overrides)


# ---- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_size", 0, "batch_size must be a positive integer"),
        ("max_iters", -5, "max_iters must be a positive integer"),
        ("learning_rate", 0.0, "learning_rate must be a positive number"),
        ("learning_rate", float("nan"), "learning_rate must be a positive number"),
        ("lr_schedule", "linear", "lr_schedule must be one of"),
        ("warmup_iters", -1, "warmup_iters must be an integer >= 0"),
        ("grad_clip", -1.0, "grad_clip must be >= 0"),
        ("beta2", 1.0, "beta2 must be in [0, 1)"),
        ("eval_iters", 0, "eval_iters must be a positive integer"),
        ("weight_decay", -0.1, "weight_decay must be >= 0"),
    ],
)
def test_train_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match="invalid TrainConfig") as info:
        TrainConfig(**{field: value})
    assert message in str(info.value)


def test_min_lr_above_lr_is_rejected_for_cosine():
    with pytest.raises(ValueError, match=r"min_lr \(0.01\) must not exceed learning_rate"):
        TrainConfig(lr_schedule="cosine", learning_rate=1e-3, min_lr=1e-2)


def test_learning_rate_schedule_shapes():
    c = TrainConfig(learning_rate=1e-3, warmup_iters=10, lr_schedule="cosine", min_lr=1e-4)
    c = replace(c, max_iters=110)
    warm = [learning_rate_at(s, c) for s in range(10)]
    assert warm == pytest.approx([1e-4 * (s + 1) for s in range(10)])  # linear up to lr
    assert learning_rate_at(10, c) == pytest.approx(1e-3)  # peak right after warm-up
    assert learning_rate_at(60, c) == pytest.approx(0.5 * (1e-3 + 1e-4))  # half-way down
    assert learning_rate_at(110, c) == pytest.approx(1e-4)  # reaches min_lr at max_iters
    decay = [learning_rate_at(s, c) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))
    constant = replace(c, lr_schedule="constant")
    assert learning_rate_at(100, constant) == 1e-3


def test_resolve_device():
    expected = "cuda" if torch.cuda.is_available() else None
    auto = resolve_device("auto")
    if expected:
        assert auto.type == expected
    elif not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        assert auto == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device 'gpu7'"):
        resolve_device("gpu7")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_optimizer_decays_matrices_only():
    model = model_to_train()
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in no_decay["params"])  # biases and LayerNorm gains
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == model.num_parameters()


def test_batch_seed_differs_by_rank():
    assert len({batch_seed(1337, r) for r in range(4)}) == 4
    assert batch_seed(1337, 0) == 1337


# ---- the loop --------------------------------------------------------------------------------


def test_train_returns_history_and_learns():
    tr, va = pattern_data()
    model = model_to_train().eval()
    before = estimate_loss(model, va, quick_config())
    config = quick_config(max_iters=40, eval_interval=10, learning_rate=2e-2)
    history = train(model, tr, va, config, quiet=True)
    assert set(history) == set(HISTORY_KEYS)
    assert history["step"] == [10.0, 20.0, 30.0, 40.0]
    assert all(len(v) == 4 for v in history.values())
    assert history["lr"] == [2e-2] * 4
    assert all(t > 0 for t in history["tokens_per_sec"])
    assert history["elapsed_s"] == sorted(history["elapsed_s"])
    assert history["val_loss"][-1] < before - 0.5  # the cycle is learnable
    assert history["train_loss"][-1] < history["train_loss"][0]
    assert not model.training  # the mode the model came in with


def test_last_step_is_always_evaluated():
    tr, va = pattern_data()
    history = train(
        model_to_train(), tr, va, quick_config(max_iters=10, eval_interval=4), quiet=True
    )
    assert history["step"] == [4.0, 8.0, 10.0]


def test_same_seed_same_losses_and_different_seed_differs():
    tr, va = pattern_data()
    h1 = train(model_to_train(), tr, va, quick_config(), quiet=True)
    h2 = train(model_to_train(), tr, va, quick_config(), quiet=True)
    h3 = train(model_to_train(), tr, va, quick_config(seed=7), quiet=True)
    assert h1["train_loss"] == h2["train_loss"] and h1["val_loss"] == h2["val_loss"]
    assert h1["train_loss"] != h3["train_loss"]


def test_progress_bar_shows_losses_and_throughput(capsys):
    tr, va = pattern_data()
    train(model_to_train(), tr, va, quick_config(max_iters=4), quiet=False)
    err = capsys.readouterr().err
    assert "train" in err and "val" in err and "tok/s" in err and "4/4" in err
    train(model_to_train(), tr, va, quick_config(max_iters=4), quiet=True)
    assert capsys.readouterr().err == ""


def test_bad_data_is_rejected_with_clear_errors():
    tr, va = pattern_data()
    model = model_to_train()
    with pytest.raises(ValueError, match=r"train_data: token id 79 is outside the model's vocab"):
        train(model, tr + VOCAB, va, quick_config(), quiet=True)
    with pytest.raises(ValueError, match="val_data has 5 tokens, but one training window needs"):
        train(model, tr, va[:5], quick_config(), quiet=True)
    with pytest.raises(ValueError, match="must be a 1-D tensor"):
        train(model, tr.view(-1, 4), va, quick_config(), quiet=True)
    with pytest.raises(ValueError, match="resume=True needs a checkpoint_path"):
        train(model, tr, va, quick_config(), resume=True, quiet=True)


def test_non_finite_loss_names_the_step_and_keeps_the_checkpoint(tmp_path):
    tr, va = pattern_data()
    model = model_to_train()
    calls = {"train": 0}

    def poison(module, args, output):
        if module.training:  # evaluation passes run in eval mode and are not counted
            calls["train"] += 1
            if calls["train"] >= 5:  # from the fifth step on, the last hidden states are NaN
                return output * float("nan")
        return None

    model.final_norm.register_forward_hook(poison)  # on the book's path and the fast one
    path = tmp_path / "ckpt.pt"
    config = quick_config(max_iters=10, checkpoint_interval=2, eval_interval=100)
    with pytest.raises(FloatingPointError) as info:
        train(model, tr, va, config, checkpoint_path=path, quiet=True)
    message = str(info.value)
    assert "non-finite loss (nan) at step 5" in message
    assert f"{path} (step 4), was left intact" in message
    saved = load_checkpoint(path)
    assert saved.step == 4
    assert all(torch.isfinite(p).all() for p in saved.model.parameters())
    # (train_step updates the weights before the loss is looked at: the model in memory took the
    # bad step; the checkpoint is the last good state)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary files left


def test_nothing_to_do_when_checkpoint_is_past_max_iters(tmp_path):
    tr, va = pattern_data()
    path = tmp_path / "c.pt"
    first = train(
        model_to_train(), tr, va, quick_config(max_iters=8), checkpoint_path=path, quiet=True
    )
    again = train(
        model_to_train(), tr, va, quick_config(max_iters=8), checkpoint_path=path, resume=True,
        quiet=True,
    )  # fmt: skip
    assert again["step"] == first["step"] == [4.0, 8.0]
    assert load_checkpoint(path).step == 8


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # torch.autocast on a CPU-only machine
def test_bf16_autocast_only_where_bf16_is_native(monkeypatch):
    # a T4 (compute capability 7.5): PyTorch reports bf16 support, emulated; no autocast there
    from gptlib import train as train_module

    cuda, config = torch.device("cuda", 0), quick_config(autocast_bf16=True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert not train_module.native_bf16(cuda)
    assert isinstance(train_module._autocast(cuda, config), contextlib.nullcontext)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert train_module.native_bf16(cuda)  # an A100 or newer
    assert isinstance(train_module._autocast(cuda, config), torch.autocast)
    no_bf16 = replace(config, autocast_bf16=False)  # --no-bf16
    assert isinstance(train_module._autocast(cuda, no_bf16), contextlib.nullcontext)
    assert not train_module.native_bf16(torch.device("cpu"))
    assert not train_module.native_bf16(torch.device("mps"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 autocast is used only on CUDA")
def test_bf16_autocast_trains_on_cuda():
    tr, va = pattern_data()
    config = quick_config(device="cuda", autocast_bf16=True, max_iters=20, eval_interval=10)
    history = train(model_to_train(), tr, va, config, quiet=True)
    assert all(math.isfinite(v) for v in history["val_loss"])
    assert history["val_loss"][-1] < history["val_loss"][0]


def assert_same_weights(a: GPT, b: GPT) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


def test_resume_gives_the_same_losses_as_one_run(tmp_path):
    tr, va = pattern_data()
    whole = model_to_train()
    h_whole = train(whole, tr, va, quick_config(), quiet=True)

    path = tmp_path / "checkpoint.pt"
    h_first = train(
        model_to_train(), tr, va, quick_config(max_iters=8), checkpoint_path=path, quiet=True
    )
    assert load_checkpoint(path).step == 8
    resumed = model_to_train(seed=99)  # different weights on purpose: resume must replace them
    h_resumed = train(
        resumed, tr, va, quick_config(), checkpoint_path=path, resume=True, quiet=True
    )

    assert h_first["step"] == [4.0, 8.0]
    assert h_resumed["step"] == h_whole["step"] == [4.0, 8.0, 12.0]
    assert h_resumed["train_loss"] == h_whole["train_loss"]
    assert h_resumed["val_loss"] == h_whole["val_loss"]
    assert_same_weights(resumed, whole)
    assert load_checkpoint(path).step == 12


def test_resume_with_cosine_schedule_and_stop_at(tmp_path):
    tr, va = pattern_data()
    config = quick_config(warmup_iters=3, lr_schedule="cosine", min_lr=1e-4, max_iters=12)
    whole = model_to_train()
    h_whole = train(whole, tr, va, config, quiet=True)
    path = tmp_path / "c.pt"
    train(model_to_train(), tr, va, config, checkpoint_path=path, stop_at=6, quiet=True)
    resumed = model_to_train()
    h = train(resumed, tr, va, config, checkpoint_path=path, resume=True, quiet=True)
    assert h["step"] == [4.0, 6.0, 8.0, 12.0]  # the pause at step 6 was evaluated too
    keep = [i for i, s in enumerate(h["step"]) if s != 6.0]
    assert [h["val_loss"][i] for i in keep] == h_whole["val_loss"]
    assert [h["lr"][i] for i in keep] == h_whole["lr"]
    assert_same_weights(resumed, whole)


def test_resume_into_a_different_model_is_refused(tmp_path):
    tr, va = pattern_data()
    path = tmp_path / "c.pt"
    vocab = Vocabulary(tuple(range(VOCAB)))
    train(
        model_to_train(),
        tr,
        va,
        quick_config(max_iters=4),
        checkpoint_path=path,
        vocab=vocab,
        quiet=True,
    )
    other = model_to_train(d_model=32, n_heads=4)
    with pytest.raises(
        CheckpointError, match="different model .*d_model: checkpoint 16 vs model 32"
    ):
        train(other, tr, va, quick_config(), checkpoint_path=path, resume=True, quiet=True)
    with pytest.raises(CheckpointError, match="vocabulary differs"):
        train(
            model_to_train(), tr, va, quick_config(), checkpoint_path=path, resume=True, quiet=True,
            vocab=Vocabulary(tuple(range(1, VOCAB + 1))),
        )  # fmt: skip


# ---- one step, and the loop as repeated steps -------------------------------------------------


def book_step_by_hand(model, optimizer, x, y, lr: float, clip: float) -> torch.Tensor:
    """Chapter 10's step, written out: the loss, its gradient, clipping, AdamW."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss


def test_train_step_is_the_five_operations_by_hand():
    tr, _ = pattern_data()
    config = quick_config(learning_rate=1e-2)
    x, y = get_batch(tr, 4, 8, seed=0)
    ours, theirs = model_to_train(), model_to_train()
    opt_ours, opt_theirs = make_optimizer(ours, config), make_optimizer(theirs, config)
    for step in range(3):
        torch.manual_seed(step)  # the same dropout draws for both
        loss = train_step(ours, opt_ours, x, y, lr=5e-3, grad_clip=0.5)
        torch.manual_seed(step)
        expected = book_step_by_hand(theirs, opt_theirs, x, y, 5e-3, 0.5)
        assert loss == expected.item()  # the same forward pass: the same loss
    assert_same_weights(ours, theirs)  # the same operations: bit for bit
    moved = (ours.lm_head.weight - model_to_train().lm_head.weight).abs().max().item()
    assert moved > 1e-4  # the steps did move the weights
    assert [g["lr"] for g in opt_ours.param_groups] == [5e-3, 5e-3]
    assert opt_ours.param_groups[0]["weight_decay"] == config.weight_decay
    assert opt_ours.param_groups[1]["weight_decay"] == 0.0


def test_train_is_a_loop_of_train_steps():
    tr, va = pattern_data()
    config = quick_config(max_iters=9, warmup_iters=3, lr_schedule="cosine", eval_interval=4)
    trained = model_to_train()
    history = train(trained, tr, va, config, quiet=True)
    by_hand = model_to_train()
    optimizer = make_optimizer(by_hand, config)
    torch.manual_seed(config.seed)  # rank 0's dropout seed, then its batch generator
    batches = torch.Generator().manual_seed(batch_seed(config.seed, 0))
    for step in range(config.max_iters):
        x, y = get_batch(tr, config.batch_size, 8, generator=batches)
        lr = learning_rate_at(step, config)
        train_step(by_hand, optimizer, x, y, lr=lr, grad_clip=config.grad_clip, fast=config.fast)
    assert_same_weights(trained, by_hand)  # same operations, same machine: bit for bit
    assert history["lr"][-1] == learning_rate_at(8, config)


def test_callbacks_get_a_record_after_every_evaluation():
    tr, va = pattern_data()
    records = []
    history = train(
        model_to_train(), tr, va, quick_config(max_iters=10), quiet=True,
        callbacks=[records.append, lambda record: None],
    )  # fmt: skip
    assert [r["step"] for r in records] == [4, 8, 10]
    assert all(set(r) == set(HISTORY_KEYS) for r in records)
    for key in HISTORY_KEYS:
        assert [float(r[key]) for r in records] == history[key]
