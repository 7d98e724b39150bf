"""The book's interactive pages, as a small local Sphinx extension (listed in ``_config.yml``).

* The scripts and style sheet of ``_static/interactive/`` (the kernel-free sliders of chapters 3,
  5 and 6 in ``gpt-figures.js``; the "Try the model" page in ``gpt-tokenizer.js``,
  ``gpt-model.js`` and ``gpt-playground.js``; the helpers they share in ``gpt-common.js``):
  Jupyter Book adds every ``.js`` and ``.css`` file under ``_static/`` to every page, in the
  order the folder happens to list them. The others take ``gpt-common.js``'s helpers when they
  load, so this extension moves it to the front; beyond that, each script only defines functions
  when it loads and starts its work once the page is parsed.
* After every HTML build, exports the model trained in chapter 10b into
  ``<html>/_static/web-model/`` with ``tools/export_web_model.py``. The checkpoint is the config
  value ``gptbook_web_checkpoint`` (default ``chapters/runs/ch10/checkpoint.pt``, relative to the
  book's folder): the weights after the run's last step, the model that chapter 11 and the
  appendix *After training* also load. Without it, the page says to run chapter 10b first.
* Writes each of a page's scripts once. sphinx-thebe (which Jupyter Book always loads) registers
  its inline ``const THEBE_JS_URL = ...`` script while the build is under way, and Sphinx then
  lists it twice (once named ``None``, once ``''``), so every page threw "Identifier
  'THEBE_JS_URL' has already been declared". Thebe itself stays off: the launch buttons (Binder,
  Colab) run the chapters, and the site's own figures need no kernel.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging

logger = logging.getLogger(__name__)

DEFAULT_CHECKPOINT = "chapters/runs/ch10/checkpoint.pt"
FIRST_SCRIPT = "interactive/gpt-common.js"  # what the other page scripts use when they load


def _exporter(srcdir: Path):
    """tools/export_web_model.py, imported from the book's folder."""
    path = srcdir / "tools" / "export_web_model.py"
    spec = importlib.util.spec_from_file_location("export_web_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shared_script_first(app: Sphinx, config: Config) -> None:
    """Put :data:`FIRST_SCRIPT` ahead of the other scripts Jupyter Book listed."""
    scripts = list(config.html_js_files)
    name = [s if isinstance(s, str) else s[0] for s in scripts]  # a file, or (file, attributes)
    if FIRST_SCRIPT in name:
        config.html_js_files = [scripts.pop(name.index(FIRST_SCRIPT)), *scripts]


def _script_key(script: object) -> tuple:
    """What makes two of Sphinx's script entries the same script (no file counts as '')."""
    attributes = getattr(script, "attributes", {})
    return (getattr(script, "filename", script) or "", tuple(sorted(attributes.items())))


def one_copy_of_each_script(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: object
) -> None:
    """Drop repeated entries from the page's script list, keeping the first of each."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique  # the builder's own list: it restores it after each page


def export_model(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    srcdir = Path(app.srcdir)
    checkpoint = srcdir / app.config.gptbook_web_checkpoint
    out_dir = Path(app.outdir) / "_static" / "web-model"
    exporter = _exporter(srcdir)
    if not checkpoint.is_file():
        exporter.write_missing(out_dir, checkpoint)
        logger.info(f"gptbook_web: no {checkpoint}; the model page will ask to run chapter 10b")
        return
    sizes = exporter.export(checkpoint, out_dir)
    logger.info(f"gptbook_web: exported {checkpoint} for the model page: {sizes}")


def setup(app: Sphinx) -> dict:
    app.add_config_value("gptbook_web_checkpoint", DEFAULT_CHECKPOINT, "html")
    app.connect("config-inited", shared_script_first)
    app.connect("html-page-context", one_copy_of_each_script, priority=900)
    app.connect("build-finished", export_model)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
