"""Checkpoints: round trip, atomic writes, refusal of unsafe/truncated/mismatched files (resuming
a run is tested with training, in test_train.py)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import tiny_config, tiny_model

from gptlib import checkpoint as ckpt_module
from gptlib.checkpoint import (
    FORMAT,
    VERSION,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from gptlib.files import atomic_write
from gptlib.model import GPT
from gptlib.tokenizer import Vocabulary
from gptlib.train import TrainConfig, make_optimizer

# tiny models: one torch thread (see tests/conftest.py)
pytestmark = pytest.mark.usefixtures("single_thread")


SIZES = {"vocab_size": 30, "context_length": 8, "n_heads": 2, "n_blocks": 1, "dropout": 0.1}
CONFIG = tiny_config(**SIZES)


def small_model(seed: int = 0, **overrides) -> GPT:
    """conftest's tiny model with this file's sizes."""
    return tiny_model(seed, **{**SIZES, **overrides})


def data(n: int = 800) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = (torch.arange(n) * 7 + torch.randint(0, 3, (n,), generator=g)) % CONFIG.vocab_size
    return ids[:700], ids[700:]


def save_example(path, step: int = 3) -> tuple[GPT, TrainConfig, Vocabulary]:
    model = small_model()
    config = TrainConfig(max_iters=50, learning_rate=2e-3)
    optimizer = make_optimizer(model, config, torch.device("cpu"))
    x = torch.randint(30, (2, 8))
    model(x, x)[1].backward()
    optimizer.step()
    vocab = Vocabulary(tuple(range(100, 130)))
    save_checkpoint(
        path, model, optimizer=optimizer, train_config=config, vocab=vocab, step=step,
        extra={"note": "hello", "rng": [torch.get_rng_state()]},
    )  # fmt: skip
    return model, config, vocab


# ---- round trip ------------------------------------------------------------------------------


def test_round_trip_restores_everything(tmp_path):
    path = tmp_path / "run" / "checkpoint.pt"
    model, config, vocab = save_example(path, step=3)
    loaded = load_checkpoint(path)
    assert loaded.model_config == CONFIG
    assert loaded.train_config == config
    assert loaded.vocab == vocab
    assert loaded.step == 3
    assert loaded.extra["note"] == "hello"
    assert isinstance(loaded.extra["rng"][0], torch.Tensor)
    assert not loaded.model.training
    for (name, a), b in zip(
        model.state_dict().items(), loaded.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    x = torch.randint(30, (3, 8))
    model.eval()
    assert torch.equal(model(x)[0], loaded.model(x)[0])
    state = loaded.optimizer_state
    assert state is not None and len(state["state"]) == len(list(model.parameters()))
    # the folder works as well as the file
    assert load_checkpoint(tmp_path / "run").step == 3


def test_round_trip_with_tied_embeddings_and_no_extras(tmp_path):
    model = small_model(tie_embeddings=True, positions="learned")
    save_checkpoint(tmp_path / "t.pt", model)
    loaded = load_checkpoint(tmp_path / "t.pt")
    assert loaded.model.lm_head.weight is loaded.model.token_embedding.weight
    assert loaded.vocab is None and loaded.train_config is None and loaded.optimizer_state is None
    assert torch.equal(loaded.model.token_embedding.weight, model.token_embedding.weight)


def test_extra_must_be_plain_data(tmp_path):
    with pytest.raises(TypeError, match=r"extra\['cfg'\] is a GPTConfig"):
        save_checkpoint(tmp_path / "x.pt", small_model(), extra={"cfg": CONFIG})
    assert list(tmp_path.iterdir()) == []


# ---- atomic writes ---------------------------------------------------------------------------


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_example(path, step=1)
    before = path.read_bytes()
    real_save = torch.save

    def half_then_crash(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.seek(0)
        f.truncate(len(before) // 2)  # half a file on disk, then the "power cut"
        raise OSError("simulated crash while writing")

    monkeypatch.setattr(ckpt_module.torch, "save", half_then_crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, small_model(seed=5), step=2)
    assert path.read_bytes() == before
    assert load_checkpoint(path).step == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary file


def test_failed_rename_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_example(path, step=1)
    before = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("simulated failure of the rename")

    monkeypatch.setattr(ckpt_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="rename"):
        save_checkpoint(path, small_model(seed=5), step=2)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_checkpoints_use_the_one_atomic_write(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ckpt_module, "atomic_write", lambda path, write: calls.append(path))
    save_checkpoint(tmp_path / "c.pt", small_model())
    assert calls == [tmp_path / "c.pt"] and ckpt_module.atomic_write is not atomic_write
    monkeypatch.undo()
    assert ckpt_module.atomic_write is atomic_write  # gptlib.files', shared with downloads


def test_checkpoint_files_follow_the_umask(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", small_model())
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


# ---- refusals --------------------------------------------------------------------------------

EXECUTED = {"flag": False}


def set_flag() -> None:
    """What a malicious file would run; here it only records that it ran."""
    EXECUTED["flag"] = True


class Payload:
    def __reduce__(self):
        return (set_flag, ())


def test_malicious_pickle_is_refused_without_running_it(tmp_path):
    path = tmp_path / "evil.pt"
    good = small_model().state_dict()
    torch.save({"format": FORMAT, "version": VERSION, "model_state": good, "x": Payload()}, path)
    EXECUTED["flag"] = False
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "refusing to load" in message and "arbitrary code" in message
    assert "set_flag" in message  # names what it refused
    assert EXECUTED["flag"] is False


def test_truncated_file_is_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_example(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        load_checkpoint(path)
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        load_checkpoint(path)
    path.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)


def test_missing_file_and_foreign_files(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at .*nope.pt: check the path"):
        load_checkpoint(tmp_path / "nope.pt")
    torch.save(small_model().state_dict(), tmp_path / "bare.pt")
    with pytest.raises(CheckpointError, match="not a gptlib checkpoint .*bare state_dict"):
        load_checkpoint(tmp_path / "bare.pt")


def test_weights_that_do_not_match_the_config_are_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_example(path)
    raw = torch.load(path, weights_only=True)
    raw["model_config"]["d_model"] = 32  # the weights are still d_model 16
    raw["model_config"]["n_heads"] = 4
    torch.save(raw, path)
    with pytest.raises(
        CheckpointError, match="do not match the model configuration.*size mismatch"
    ):
        load_checkpoint(path)


def test_invalid_or_unknown_config_fields_are_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_example(path)
    raw = torch.load(path, weights_only=True)
    raw["model_config"]["n_heads"] = 3
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match="model_config is invalid.*divisible by n_heads"):
        load_checkpoint(path)
    raw["model_config"]["n_heads"] = 2
    raw["model_config"]["rotary"] = True
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match=r"does not know: \['rotary'\]"):
        load_checkpoint(path)


def test_a_checkpoint_from_before_scale_embeddings_loads_unscaled(tmp_path):
    # files written before the field existed were trained without the sqrt(d_model) factor
    path = tmp_path / "checkpoint.pt"
    save_example(path)
    raw = torch.load(path, weights_only=True)
    del raw["model_config"]["scale_embeddings"]
    torch.save(raw, path)
    assert load_checkpoint(path).model_config.scale_embeddings is False


def test_the_migration_fills_in_only_what_older_files_lack():
    old = {k: v for k, v in tiny_config().to_dict().items() if k != "scale_embeddings"}
    assert ckpt_module.migrate_model_config(old) == {**old, "scale_embeddings": False}
    new = tiny_config(scale_embeddings=True).to_dict()
    assert ckpt_module.migrate_model_config(new) == new  # today's files pass unchanged
    assert ckpt_module.migrate_model_config(new) is not new  # and the input is not modified


def _in_old_names(config: dict, ffn_mult: int = 4, ffn_hidden: int = 0) -> dict:
    """A model_config as gptlib wrote it before the renames (``norm``, ``layer_norm_eps``,
    ``ffn_mult``/``ffn_hidden``, and ``n_kv_heads=0`` for "as many as n_heads")."""
    old = {k: v for k, v in config.items() if k not in ("d_ff", "norm_placement", "norm_eps")}
    old |= {"norm": config["norm_placement"], "layer_norm_eps": config["norm_eps"]}
    old |= {"ffn_mult": ffn_mult, "ffn_hidden": ffn_hidden}
    if old["n_kv_heads"] == old["n_heads"]:
        old["n_kv_heads"] = 0
    return old


@pytest.mark.parametrize(
    ("new", "mult", "hidden"),
    [
        ({}, 4, 0),  # the book's model: d_ff = 4 * d_model, one key/value head per head
        ({"norm_placement": "post", "norm_eps": 1e-4, "d_ff": 32}, 2, 0),  # ffn_mult 2
        ({"activation": "swiglu"}, 4, 0),  # SwiGLU's default width, 2/3 of 4 * d_model
        ({"activation": "swiglu", "n_kv_heads": 2, "d_ff": 24}, 4, 24),  # an exact ffn_hidden
    ],
)
def test_configs_in_the_old_names_load_as_the_same_model(tmp_path, new, mult, hidden):
    model = tiny_model(3, **new)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, step=5)
    raw = torch.load(path, weights_only=True)
    raw["model_config"] = _in_old_names(raw["model_config"], mult, hidden)
    torch.save(raw, path)
    loaded = load_checkpoint(path)
    assert loaded.model_config == model.config
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(loaded.model(ids)[0], model(ids)[0])


def test_a_train_config_from_before_the_fast_switch_loads_with_it_on(tmp_path):
    # older files have no `fast` field: they trained through the fast paths, today's default
    path = tmp_path / "checkpoint.pt"
    model = tiny_model()
    save_checkpoint(path, model, train_config=TrainConfig(fast=False, batch_size=3))
    raw = torch.load(path, weights_only=True)
    assert raw["train_config"]["fast"] is False  # the field is saved...
    del raw["train_config"]["fast"]
    torch.save(raw, path)
    loaded = load_checkpoint(path).train_config
    assert loaded.fast is True and loaded.batch_size == 3  # ...and defaults when missing


# ---- resume ----------------------------------------------------------------------------------
