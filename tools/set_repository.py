"""Point the book at another GitHub repository (a fork, or the book's real home).

The repository's address lives in ``_config.yml``, under ``repository: url:``: the site's
repository, issue and launch (Binder, Colab) buttons are built from it. Each chapter's first code
cell holds the one copy of it, because a notebook opened on Colab cannot read ``_config.yml``: that
cell installs gptlib from the repository. The README's links (the site, the clone command, the
Colab and Binder badges) are built from it too. This script writes a new address into all three,
and ``tests/test_publishing.py`` checks that they agree. It needs only Python's standard library, so
the publishing workflow can run it before anything is installed::

    python tools/set_repository.py https://github.com/you/your-fork
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `url:` inside the top-level `repository:` block of _config.yml (its lines are indented)
CONFIG_URL = re.compile(
    r"^(repository:[ \t]*\n(?:(?:[ \t]+.*|[ \t]*#.*)?\n)*?[ \t]+url:[ \t]*)(\S+)", re.M
)
GITHUB_URL = re.compile(r"https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
# how the set-up cell names the repository, as the line is stored in the notebook's JSON
CELL_LINE = 'repo = \\"{}\\"'


def configured_url(root: Path = ROOT) -> str:
    """The repository address in ``_config.yml``."""
    match = CONFIG_URL.search((root / "_config.yml").read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"{root / '_config.yml'} has no `url:` line under `repository:`")
    return match.group(2)


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically: a reader sees the old file or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def readme_links(text: str, old: str, new: str) -> str:
    """``text`` with the README's links moved from repository ``old`` to ``new``: the clone
    command, the folder it makes, the Colab and Binder badges and the GitHub Pages site."""
    (o_owner, o_name), (n_owner, n_name) = old.split("/")[-2:], new.split("/")[-2:]
    pairs = [
        (f"{o_owner.lower()}.github.io/{o_name}", f"{n_owner.lower()}.github.io/{n_name}"),
        (f"/{o_owner}/{o_name}", f"/{n_owner}/{n_name}"),  # github.com/, colab's github/, gh/
        (f"&& cd {o_name}\n", f"&& cd {n_name}\n"),
    ]
    for before, after in pairs:
        text = text.replace(before, after)
    return text


def set_repository(url: str, root: Path = ROOT) -> list[Path]:
    """Write ``url`` into ``_config.yml``, every chapter's set-up cell and the README's links;
    return the files changed. Raises ValueError, saying what to pass, for anything but a GitHub
    repository URL."""
    url = url.rstrip("/").removesuffix(".git")
    if not GITHUB_URL.fullmatch(url):
        raise ValueError(
            f"{url!r} is not a GitHub repository address: pass one like "
            "https://github.com/OWNER/NAME (Binder and Colab open notebooks from GitHub)"
        )
    old = configured_url(root)
    config = root / "_config.yml"
    changes = {config: CONFIG_URL.sub(lambda m: m.group(1) + url, config.read_text("utf-8"), 1)}
    for notebook in sorted((root / "chapters").glob("*.ipynb")):
        text = notebook.read_text(encoding="utf-8")
        if CELL_LINE.format(old) in text:
            changes[notebook] = text.replace(CELL_LINE.format(old), CELL_LINE.format(url))
    readme = root / "README.md"
    if readme.exists():
        changes[readme] = readme_links(readme.read_text(encoding="utf-8"), old, url)
    changed = [path for path, text in changes.items() if text != path.read_text("utf-8")]
    for path in changed:
        _write(path, changes[path])
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the repository's address, https://github.com/OWNER/NAME")
    args = parser.parse_args(argv)
    try:
        changed = set_repository(args.url)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{len(changed)} file(s) now name {configured_url()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
