"""Property-based tests (hypothesis): configurations, damaged and edited checkpoints.

Whatever is generated, gptlib ends in a result or in one of its documented errors (ValueError for
a configuration, CheckpointError for a checkpoint), never in another exception from deeper down,
and never loses a file. The number of examples is bounded and the search is derandomized, so the
run is the same on every machine and takes a few seconds (``--hypothesis-show-statistics``
prints what ran).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlib.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from gptlib.config import (
    ACTIVATIONS,
    NORM_PLACEMENTS,
    NORM_TYPES,
    POSITIONS,
    GPTConfig,
    TrainConfig,
)
from gptlib.integrity import DIGEST_KEY, tensor_digest
from gptlib.memory import generation_bytes, parameter_count, training_bytes
from gptlib.model import GPT
from gptlib.tokenizer import Vocabulary

pytestmark = pytest.mark.usefixtures("single_thread")


def bounded(examples: int) -> settings:
    """At most ``examples`` examples, the same ones on every run, no example database."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# ---- configurations ----------------------------------------------------------------------------

sizes = st.one_of(st.integers(-3, 70), st.sampled_from([0, 1, 2, 3, 10**6]))
floats = st.one_of(
    st.floats(-2.0, 2.0), st.sampled_from([0.0, 1e-12, 1e38, math.inf, -math.inf, math.nan])
)


def choice(allowed: tuple[str, ...]):
    return st.one_of(st.sampled_from(allowed), st.sampled_from(["", "other", "PRE"]))


WILD = {  # any value, mostly wrong ones
    "vocab_size": sizes,
    "context_length": sizes,
    "d_model": sizes,
    "n_heads": sizes,
    "n_blocks": st.integers(-1, 3),
    "d_ff": st.one_of(st.none(), st.integers(-1, 40)),
    "n_kv_heads": st.one_of(st.none(), st.integers(-1, 8)),
    "dropout": floats,
    "norm_placement": choice(NORM_PLACEMENTS),
    "norm_type": choice(NORM_TYPES),
    "positions": choice(POSITIONS),
    "rope_base": st.one_of(floats, st.floats(1.5, 1e6)),
    "activation": choice(ACTIVATIONS),
    "bias": st.booleans(),
    "tie_embeddings": st.booleans(),
    "final_norm": st.booleans(),
    "norm_eps": st.one_of(floats, st.just(1e-5)),
}
SENSIBLE = {  # values that mostly fit together
    **WILD,
    "vocab_size": st.integers(1, 70),
    "context_length": st.integers(1, 24),
    "d_model": st.sampled_from([4, 8, 12, 16, 24]),
    "n_heads": st.sampled_from([1, 2, 4]),
    "n_blocks": st.integers(1, 3),
    "d_ff": st.sampled_from([None, None, 8, 20]),
    "n_kv_heads": st.sampled_from([None, None, 1, 2]),
    "dropout": st.floats(0.0, 0.9),
    "norm_placement": st.sampled_from(NORM_PLACEMENTS),
    "norm_type": st.sampled_from(NORM_TYPES),
    "positions": st.sampled_from(POSITIONS),
    "rope_base": st.floats(2.0, 1e5),
    "activation": st.sampled_from(ACTIVATIONS),
    "norm_eps": st.floats(1e-8, 1e-2),
}


@st.composite
def configs(draw) -> dict:
    """A sensible configuration, with up to two fields replaced by wild values."""
    fields = draw(st.fixed_dictionaries(SENSIBLE))
    for name in draw(st.lists(st.sampled_from(sorted(WILD)), max_size=2)):
        fields[name] = draw(WILD[name])
    return fields


SEEN = {"configs": 0, "valid configs": 0, "flips": 0, "loaded after flips": 0, "edits": 0}


@bounded(200)
@given(fields=configs(), batch=st.integers(1, 8))
def test_any_configuration_builds_or_gets_one_value_error(fields, batch):
    SEEN["configs"] += 1
    try:
        config = GPTConfig(**fields)
    except ValueError as err:
        assert str(err).startswith("invalid GPTConfig: ")
        return
    SEEN["valid configs"] += 1
    P = parameter_count(config)
    assert training_bytes(config, batch).total > 4 * P > 0
    assert generation_bytes(config, batch, 1, 10) > 0
    if P > 300_000 or config.context_length > 64:
        return  # the estimate is enough; building it would only take time
    model = GPT(config).eval()
    assert model.num_parameters() == P
    T = min(config.context_length, 5)
    idx = torch.randint(config.vocab_size, (batch, T))
    logits, loss = model(idx, idx)
    assert logits.shape == (batch, T, config.vocab_size) and torch.isfinite(loss)


# ---- checkpoints -------------------------------------------------------------------------------

V = 24


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory) -> tuple[bytes, dict[str, torch.Tensor]]:
    """The bytes of a small, complete checkpoint and the weights it holds."""
    model = tiny_model(vocab_size=V, context_length=8, n_blocks=1, d_model=8, n_heads=2)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pt"
    extra = {"encoding": "cl100k_base", "history": {"step": [1.0]}}
    vocab = Vocabulary(tuple(range(5, 5 + V)))
    save_checkpoint(path, model, train_config=TrainConfig(), vocab=vocab, step=3, extra=extra)
    return path.read_bytes(), model.state_dict()


def load_or_refuse(path: Path):
    """load_checkpoint's result, or None when it raised CheckpointError; any other exception
    fails the test. The file itself must be left exactly as it was."""
    before = path.read_bytes()
    try:
        result = load_checkpoint(path)
    except CheckpointError as err:
        assert str(path) in str(err)  # the error names the file
        result = None
    assert path.read_bytes() == before  # nothing lost or rewritten
    return result


@bounded(200)
@given(data=st.data())
def test_flipped_bytes_load_the_same_weights_or_are_refused(tmp_path, good_checkpoint, data):
    original, weights = good_checkpoint
    damaged = bytearray(original)
    n = data.draw(st.integers(1, 64), label="bytes flipped")
    start = data.draw(st.integers(0, len(damaged) - 1), label="where")
    spread = data.draw(st.sampled_from([1, 7, 97]), label="stride")
    for i in range(n):
        damaged[(start + i * spread) % len(damaged)] ^= data.draw(st.integers(1, 255))
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(bytes(damaged))
    SEEN["flips"] += 1
    loaded = load_or_refuse(path)
    if loaded is not None:  # the damage missed everything that matters (zip padding, say)
        SEEN["loaded after flips"] += 1
        for name, tensor in loaded.model.state_dict().items():
            assert torch.equal(tensor, weights[name]), name


@bounded(60)
@given(cut=st.integers(0, 10**9))
def test_a_truncated_checkpoint_is_refused(tmp_path, good_checkpoint, cut):
    original, _ = good_checkpoint
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(original[: cut % len(original)])
    assert load_or_refuse(path) is None


plain = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(10**12), 10**12), floats, st.text(max_size=8)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)
values = st.one_of(
    plain,
    st.builds(lambda n: torch.full((n,), float("nan")), st.integers(0, 3)),
    st.builds(lambda n: torch.arange(n), st.integers(0, 30)),
)
FIELDS = [
    ("step",), ("version",), ("format",), ("vocab",), ("extra",), ("train_config",),
    ("model_config",), ("model_state",), ("optimizer_state",), (DIGEST_KEY,),
    ("extra", "encoding"), ("extra", "history"), ("vocab", 0), ("vocab", -1),
    ("model_config", "vocab_size"), ("model_config", "d_model"), ("model_config", "dropout"),
    ("model_config", "positions"), ("model_config", "bias"), ("model_config", "norm_eps"),
    ("train_config", "batch_size"), ("train_config", "learning_rate"),
    ("model_state", "lm_head.weight"), ("model_state", "token_embedding.weight"),
]  # fmt: skip


@bounded(150)
@given(where=st.sampled_from(FIELDS), value=values, digest=st.booleans())
def test_any_edited_field_loads_or_gets_one_checkpoint_error(
    tmp_path, good_checkpoint, where, value, digest
):
    original, _ = good_checkpoint
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(original)
    raw = torch.load(path, weights_only=True)
    target = raw
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    if digest:  # as if edited by someone who also refreshed the checksum
        raw[DIGEST_KEY] = {"sha256": tensor_digest(raw)}
    torch.save(raw, path)
    SEEN["edits"] += 1
    loaded = load_or_refuse(path)
    if loaded is not None:
        assert all(torch.isfinite(p).all() for p in loaded.model.parameters())


# ---- command-line arguments --------------------------------------------------------------------

CORPUS_TEXT = "The customer asks. The seller answers. A good seller listens first.\n" * 30
numbers = st.one_of(
    st.integers(-3, 40).map(str),
    st.sampled_from(["0", "1e9", "-1", "nan", "inf", "abc", "", "1.5", "0.0", "1e-300"]),
)
TRAIN_OPTIONS = {  # option -> values to try (each run trains a few steps at most)
    "--d-model": numbers, "--n-heads": numbers, "--n-blocks": st.sampled_from(["0", "1", "x"]),
    "--context-length": numbers, "--batch-size": numbers, "--lr": numbers,
    "--dropout": numbers, "--norm-eps": numbers, "--warmup-iters": numbers,
    "--eval-interval": numbers, "--eval-iters": st.sampled_from(["1", "2", "0", "-2"]),
    "--val-fraction": numbers, "--grad-clip": numbers, "--checkpoint-interval": numbers,
    "--positions": st.sampled_from(["rope", "learned", "sinusoidal", "bogus"]),
    "--encoding": st.sampled_from(["cl100k_base", "gpt2", "bogus"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def cli_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "corpus.txt"
    path.write_text(CORPUS_TEXT, encoding="utf-8")
    return path


@bounded(25)
@given(
    options=st.dictionaries(st.sampled_from(sorted(TRAIN_OPTIONS)), st.just(None), max_size=4),
    data=st.data(),
)
def test_any_train_arguments_end_in_a_status_not_a_traceback(
    tmp_path, cli_corpus, capsys, options, data
):
    from gptlib.commands import train as train_cli

    argv = [str(cli_corpus), "--out", str(tmp_path / "run"), "--quiet", "--max-iters", "2"]
    argv += ["--d-model", "8", "--n-heads", "2", "--n-blocks", "1", "--context-length", "4"]
    for name in options:  # later options win in argparse: these override the small defaults
        argv += [name, data.draw(TRAIN_OPTIONS[name], label=name)]
    SEEN["cli"] = SEEN.get("cli", 0) + 1
    try:
        code = train_cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, err)
    assert "Traceback" not in err
    if code != 0:
        assert len(err.strip().splitlines()) == 1 and "error:" in err, (argv, err)
    else:
        SEEN["cli ok"] = SEEN.get("cli ok", 0) + 1
        assert load_checkpoint(tmp_path / "run").step >= 1


def test_report_how_many_examples_ran():
    """Runs last in this file: prints the counts for the log (pytest -s shows them)."""
    print(f"\nhypothesis examples: {SEEN}")
    if SEEN["configs"]:
        assert SEEN["valid configs"] > 20  # the generator reaches valid configurations too
