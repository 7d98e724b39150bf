"""Damaged, edited and unsafe checkpoints (issue 22, cases 4, 7 and 11): a checksum of the tensors
catches flipped bytes, every field is checked on load, and pickled code is refused as such."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from gptlib.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from gptlib.config import TrainConfig
from gptlib.integrity import DIGEST_KEY, pickle_imports, tensor_digest
from gptlib.tokenizer import Vocabulary

pytestmark = pytest.mark.usefixtures("single_thread")

V = 30


def saved(tmp_path: Path) -> Path:
    """A small checkpoint with every field filled in, as training writes it."""
    model = tiny_model(vocab_size=V, context_length=8, n_blocks=1)
    path = tmp_path / "checkpoint.pt"
    extra = {"encoding": "cl100k_base", "history": {"step": [1.0], "val_loss": [3.2]}}
    save_checkpoint(
        path, model, train_config=TrainConfig(), vocab=Vocabulary(tuple(range(100, 100 + V))),
        step=7, extra=extra,
    )  # fmt: skip
    return path


def entry_span(path: Path, suffix: str) -> tuple[int, int]:
    """Where the bytes of the zip entry ending in ``suffix`` lie in the file (start, length)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len = int.from_bytes(f.read(2), "little")
        extra_len = int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def largest_tensor_entry(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        data = [i for i in z.infolist() if "/data/" in i.filename]
    return max(data, key=lambda i: i.file_size).filename


# ---- case 4: flipped bytes -------------------------------------------------------------------


def test_flipped_bytes_in_the_weights_are_caught_and_name_the_file(tmp_path):
    path = saved(tmp_path)
    start, length = entry_span(path, largest_tensor_entry(path))
    assert length >= 128
    data = bytearray(path.read_bytes())
    for i in range(start + length // 2, start + length // 2 + 64):
        data[i] ^= 0xFF  # 64 bytes inside the largest weight matrix
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert f"{path} is damaged" in message and "checksum" in message
    assert "restore it from a backup" in message


def test_a_checkpoint_without_a_checksum_still_loads(tmp_path):
    path = saved(tmp_path)
    raw = torch.load(path, weights_only=True)
    assert set(raw[DIGEST_KEY]) == {"sha256"} and len(raw[DIGEST_KEY]["sha256"]) == 64
    del raw[DIGEST_KEY]  # as written by gptlib before checksums
    torch.save(raw, path)
    assert load_checkpoint(path).step == 7


def test_the_digest_covers_names_shapes_and_bytes():
    a = {"w": torch.zeros(2, 3), "b": torch.ones(3)}
    base = tensor_digest(a)
    assert tensor_digest({"w": torch.zeros(2, 3), "b": torch.ones(3)}) == base
    assert tensor_digest({"w": torch.zeros(3, 2), "b": torch.ones(3)}) != base  # shape
    assert tensor_digest({"v": torch.zeros(2, 3), "b": torch.ones(3)}) != base  # name
    b = {"w": torch.zeros(2, 3), "b": torch.ones(3)}
    b["w"][1, 2] = 1e-30  # one value, far below any printed precision
    assert tensor_digest(b) != base
    assert tensor_digest({**a, DIGEST_KEY: {"sha256": "x"}}) == base  # the digest is left out


# ---- case 7: edited fields -------------------------------------------------------------------


def edit(path: Path, change) -> None:
    """Load the raw contents, change them, save them back with a fresh checksum (as if a user
    had edited the file with torch.load / torch.save and gptlib's own digest)."""
    raw = torch.load(path, weights_only=True)
    change(raw)
    raw[DIGEST_KEY] = {"sha256": tensor_digest(raw)}
    torch.save(raw, path)


def nan_weight(raw: dict) -> None:
    raw["model_state"]["lm_head.weight"][0, 0] = float("nan")


EDITS = {
    "step": (lambda r: r.update(step="abc"), r"step must be an integer >= 0, got 'abc'"),
    "negative step": (lambda r: r.update(step=-1), "step must be an integer >= 0"),
    "version": (lambda r: r.update(version="1"), "version must be a positive integer"),
    "extra list": (lambda r: r.update(extra=[1, 2]), "extra must be a dict"),
    "encoding bogus": (
        lambda r: r["extra"].update(encoding="bogus"),
        r"extra\['encoding'\] must be a tiktoken encoding",
    ),
    "encoding 5": (lambda r: r["extra"].update(encoding=5), r"extra\['encoding'\] .*got 5"),
    "history": (lambda r: r["extra"].update(history=[1]), r"extra\['history'\]"),
    "train_config str": (lambda r: r.update(train_config="x"), "train_config must be a dict"),
    "train_config field": (
        lambda r: r["train_config"].update(batch_size="4"),
        r"train_config\['batch_size'\] must be a int, got '4'",
    ),
    "train_config range": (
        lambda r: r["train_config"].update(batch_size=0),
        "train_config is invalid .*batch_size must be a positive integer",
    ),
    "model_config bool": (
        lambda r: r["model_config"].update(bias="yes"),
        r"model_config\['bias'\] must be a bool",
    ),
    "model_config float": (
        lambda r: r["model_config"].update(dropout=float("inf")),
        r"model_config\['dropout'\] must be a float, got inf",
    ),
    "norm_eps": (
        lambda r: r["model_config"].update(norm_eps=-1.0),
        "model_config is invalid .*norm_eps",
    ),
    "model_state list": (
        lambda r: r.update(model_state=list(r["model_state"].values())),
        "model_state must be a dict of tensors",
    ),
    "nan weights": (nan_weight, r"model_state\['lm_head.weight'\] holds 1 non-finite value"),
    "vocab -1": (
        lambda r: r.update(vocab=[-1, *r["vocab"][1:]]),
        r"vocab holds ids outside cl100k_base's range 0..100276: \[-1\]",
    ),
    "vocab 10^7": (
        lambda r: r.update(vocab=[*r["vocab"][:-1], 10**7]),
        r"vocab holds ids outside .*\[10000000\]",
    ),
    "vocab unsorted": (
        lambda r: r.update(vocab=r["vocab"][::-1]),
        "vocab ids must be distinct and sorted",
    ),
    "vocab strings": (lambda r: r.update(vocab=["a"] * V), "vocab must be a list of integer"),
    "vocab length": (lambda r: r.update(vocab=r["vocab"][:-1]), "vocab has 29 ids but"),
    "optimizer": (lambda r: r.update(optimizer_state=[1]), "optimizer_state must be a dict"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_an_edited_field_gets_one_error_that_names_it(tmp_path, case):
    path = saved(tmp_path)
    change, message = EDITS[case]
    edit(path, change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_read_checkpoint_checks_the_fields_too(tmp_path):
    path = saved(tmp_path)
    edit(path, lambda r: r.update(step=2.5))
    with pytest.raises(CheckpointError, match="step must be an integer"):
        read_checkpoint(path)


def test_a_full_vocabulary_model_is_checked_against_its_encoding(tmp_path):
    path = saved(tmp_path)
    edit(path, lambda r: r["extra"].update(encoding="gpt2"))
    assert load_checkpoint(path).vocab.max_id == 100 + V - 1  # fine: below gpt2's 50,257
    edit(path, lambda r: r.update(vocab=[*r["vocab"][:-1], 50_257]))
    with pytest.raises(CheckpointError, match=r"outside gpt2's range 0..50256: \[50257\]"):
        load_checkpoint(path)


# ---- case 11: pickled code -------------------------------------------------------------------

RAN = {"flag": False}


def mark_ran() -> None:
    RAN["flag"] = True


class Code:
    def __reduce__(self):
        return (mark_ran, ())


@pytest.mark.parametrize("how", ["torch.save", "pickle protocol 4", "pickle protocol 2"])
def test_pickled_code_is_refused_for_safety_and_not_called_corrupt(tmp_path, how):
    path = tmp_path / "evil.pt"
    if how == "torch.save":
        torch.save({"format": "gptlib-checkpoint", "x": Code()}, path)
    else:
        path.write_bytes(pickle.dumps({"x": Code()}, protocol=int(how[-1])))
    RAN["flag"] = False
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert RAN["flag"] is False
    assert f"refusing to load {path}" in message and "refused for safety" in message
    assert "test_integrity.mark_ran" in message or "mark_ran" in message  # what it would call
    assert "corrupt" not in message


def test_pickle_imports_reads_opcodes_without_running_them(tmp_path):
    path = tmp_path / "p.pkl"
    path.write_bytes(pickle.dumps(Code(), protocol=4))
    RAN["flag"] = False
    assert pickle_imports(path) == ["test_integrity.mark_ran"]
    assert RAN["flag"] is False
    path.write_bytes(b"definitely not a pickle")
    assert pickle_imports(path) == []
    path.write_bytes(pickle.dumps({"a": [1, 2.0, "x"]}))
    assert pickle_imports(path) == []  # plain data imports nothing


def test_a_damaged_file_is_still_called_damaged_not_unsafe(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt") as info:
        load_checkpoint(path)
    assert "refused for safety" not in str(info.value)


def test_a_hugging_face_bin_with_pickled_code_is_refused_clearly(tmp_path):
    pytest.importorskip("transformers")
    from gptlib.hf import PretrainedUnavailableError, from_pretrained, gpt2_config, to_hf
    from gptlib.model import GPT

    torch.manual_seed(0)
    model = GPT(gpt2_config(vocab_size=V, d_model=16, n_heads=2, n_blocks=1, context_length=8))
    to_hf(model).save_pretrained(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    torch.save({"x": Code()}, tmp_path / "pytorch_model.bin")
    RAN["flag"] = False
    with pytest.raises(PretrainedUnavailableError) as info:
        from_pretrained(tmp_path)
    message = str(info.value)
    assert RAN["flag"] is False
    assert "pytorch_model.bin" in message and "refused for safety" in message
    assert "mark_ran" in message and "model.safetensors" in message
