"""Shared fixtures: the real dataset and the cl100k encoding (each loaded once per session).

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
from gptlib.tokenizer import TokenizerUnavailableError, get_encoding


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
