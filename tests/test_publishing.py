"""Publishing the site: the workflow that deploys it to GitHub Pages, and the repository address.

The workflow's syntax is checked in ``make lint`` against GitHub's schema; here, what a schema
cannot know: that it builds with the README's command and deploys what that command builds. The
repository address lives in ``_config.yml``; the chapters' Colab set-up cells carry the one copy
of it, which ``tools/set_repository.py`` keeps in step.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "publish.yml"


def _tool():
    """tools/set_repository.py (not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location(
        "set_repository", ROOT / "tools" / "set_repository.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _setup_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


def test_workflow_builds_with_the_readme_command_and_deploys_it() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert on["push"]["branches"] == ["main"] and "workflow_dispatch" in on
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    runs = [step.get("run", "") for step in build["steps"]]
    assert "make book" in runs, "the site must be built with the README's command"
    assert "make book" in (ROOT / "README.md").read_text()
    assert "make book" in (ROOT / "Makefile").read_text()
    uploads = [s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages")]
    assert [s["with"]["path"] for s in uploads] == ["_build/html"]  # where `make book` writes
    assert runs.index("make book") < build["steps"].index(uploads[0])
    assert deploy["needs"] == "build"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]


def test_chapters_name_the_configured_repository() -> None:
    url = _tool().configured_url()
    assert url == yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    for notebook in sorted((ROOT / "chapters").glob("*.ipynb")):
        assert f'repo = "{url}"' in _setup_cell(notebook), (
            f"{notebook.name}'s set-up cell does not name {url}: run "
            "`python tools/set_repository.py URL` to write one address everywhere"
        )


@pytest.fixture
def book_copy(tmp_path: Path) -> Path:
    """_config.yml, the README and two chapters, copied."""
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    (tmp_path / "chapters").mkdir()
    for name in ("01_tokenization.ipynb", "11_generation.ipynb"):
        shutil.copy(ROOT / "chapters" / name, tmp_path / "chapters" / name)
    return tmp_path


def test_set_repository_rewrites_the_config_and_the_setup_cells(book_copy: Path) -> None:
    tool = _tool()
    old, new = tool.configured_url(book_copy), "https://github.com/reader/my-gpt-book"
    before = {p: p.read_text() for p in book_copy.rglob("*.*")}
    changed = tool.set_repository(new + "/", book_copy)  # a trailing slash is dropped
    assert sorted(changed) == sorted(before)
    config = yaml.safe_load((book_copy / "_config.yml").read_text())
    assert config["repository"]["url"] == new == tool.configured_url(book_copy)
    for path in before:
        if path.suffix == ".ipynb":
            assert f'repo = "{new}"' in _setup_cell(path)
    readme = (book_copy / "README.md").read_text()
    assert "gptlib/gpt-step-by-step" not in readme and "gptlib.github.io" not in readme
    assert f"git clone {new}.git && cd my-gpt-book\n" in readme
    assert "https://reader.github.io/my-gpt-book/" in readme
    assert "colab.research.google.com/github/reader/my-gpt-book/blob/main/" in readme
    assert "mybinder.org/v2/gh/reader/my-gpt-book/main" in readme
    assert tool.set_repository(new, book_copy) == [], "a second run has nothing to change"
    # nothing else changed: the old address, put back, gives every file as it was
    assert sorted(tool.set_repository(old, book_copy)) == sorted(before)
    assert {p: p.read_text() for p in before} == before


def test_set_repository_refuses_what_is_not_a_github_repository(book_copy: Path) -> None:
    before = (book_copy / "_config.yml").read_text()
    for bad in ("github.com/reader/book", "https://gitlab.com/reader/book", "https://github.com/x"):
        with pytest.raises(ValueError, match="https://github.com/OWNER/NAME"):
            _tool().set_repository(bad, book_copy)
    assert (book_copy / "_config.yml").read_text() == before


def _pages_not_linked_from(page: str) -> list[str]:
    """The pages of the table of contents that ``page`` does not link to; fails first if one of
    its relative links points at a file that does not exist."""
    text = (ROOT / page).read_text()
    targets = re.findall(r"\]\(((?!https?://)[^)#]+)\)", text)  # relative links
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"{page} links to files that do not exist: {missing}"
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    linked = {str(Path(t).with_suffix("")) for t in targets}
    return [p for p in pages if p not in linked]


def test_readme_links_every_page_of_the_book_and_every_link_resolves() -> None:
    unlisted = _pages_not_linked_from("README.md")
    assert not unlisted, f"README's chapter list misses {unlisted}"


def test_intro_lists_every_page_and_states_the_running_examples_sizes() -> None:
    from gptlib.example import BATCH_SIZE, CONTEXT_LENGTH, D_MODEL, N_BLOCKS, N_HEADS

    unlisted = _pages_not_linked_from("intro.md")
    assert not unlisted, f"intro.md's chapter map misses {unlisted}"
    intro = (ROOT / "intro.md").read_text()
    sizes = (  # the running example, as the intro states it: typed there, checked here
        f"a batch of {BATCH_SIZE} sequences of {CONTEXT_LENGTH} tokens, {D_MODEL} numbers per "
        f"token, {N_HEADS} attention heads and {N_BLOCKS} transformer blocks"
    )
    text = " ".join(intro.split())
    assert sizes in text and f"the depth of {N_BLOCKS} blocks" in text


def test_readme_quotes_the_measured_drift() -> None:
    """The README's *Why your numbers may differ* types the drift that tools/ch10_drift.py
    measured (chapters/data/ch10_drift.json): a new measurement must update the README too."""
    drift = json.loads((ROOT / "chapters" / "data" / "ch10_drift.json").read_text())
    readme = " ".join((ROOT / "README.md").read_text().split())  # lines joined
    default = drift["final_val_loss_default_kernels"]
    portable = drift["final_val_loss_portable_kernels"]
    difference = drift["final_val_loss_difference"]
    percent = 100 * difference / default
    assert f"moved by {difference} nats" in readme
    assert f"({default} against {portable}, about {percent:.1f}%" in readme
