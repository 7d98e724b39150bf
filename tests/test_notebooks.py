"""The stored chapters: portable glue records, one set-up cell, every cell run, the site's
sliders set up from the chapters' numbers; gptlib.notebook."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gptlib.notebook import portable

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("*.ipynb"))
GLUE_PREFIX = "application/papermill.record/"
# a float stored with more significant digits than any prose needs: another CPU's last bits show
FULL_FLOAT = re.compile(r"^-?(\d+\.\d*|\.\d+)(e[-+]?\d+)?$")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _code(path: Path) -> list[dict]:
    return [c for c in _cells(path) if c["cell_type"] == "code"]


def _significant_digits(text: str) -> int:
    mantissa = text.lower().split("e")[0].lstrip("-").replace(".", "")
    return len(mantissa.lstrip("0").rstrip("0")) or 1


def test_there_are_chapters() -> None:
    assert len(CHAPTERS) >= 11, [p.name for p in CHAPTERS]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_glue_records_hold_no_full_precision_floats(path: Path) -> None:
    # the full repr of a float32 result (e.g. 23.934362411499023) changes with the CPU; glue
    # through gptlib.notebook.glue, which keeps 4 significant digits
    bad = []
    for cell in _code(path):
        for out in cell.get("outputs", []):
            for mime, value in out.get("data", {}).items():
                text = "".join(value).strip() if mime.startswith(GLUE_PREFIX) else ""
                if FULL_FLOAT.match(text) and _significant_digits(text) > 6:
                    bad.append(text)
    assert not bad, f"{path.name}: glue records at full precision: {bad[:5]}"


def test_the_colab_setup_cell_is_the_same_in_every_chapter() -> None:
    first = {p.name: _code(p)[0] for p in CHAPTERS}
    for name, cell in first.items():
        tags = set(cell.get("metadata", {}).get("tags", []))
        assert {"remove-cell", "colab-setup"} <= tags, f"{name}: first code cell is not the set-up"
    sources = {"".join(c["source"]) for c in first.values()}
    assert len(sources) == 1, "the chapters' set-up cells differ; copy chapter 1's everywhere"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_code_cell_is_stored_executed(path: Path) -> None:
    unrun = [
        i
        for i, c in enumerate(_cells(path))
        if c["cell_type"] == "code"
        and "".join(c["source"]).strip()
        and c["execution_count"] is None
    ]
    assert not unrun, f"{path.name}: cells {unrun} were stored without being run"


# ---- gptlib.notebook ---------------------------------------------------------------------------


def test_portable_keeps_significant_digits() -> None:
    assert portable(23.934362411499023) == 23.93
    assert portable(23.93436050415039) == 23.93  # the other CPU's value: the same record
    assert portable(0.00012345678, digits=3) == 0.000123
    assert portable(-1234567.0) == -1235000.0
    assert portable(torch.tensor(2.718281828)) == 2.718
    assert portable(np.float32(0.1)) == 0.1


def test_portable_leaves_exact_values_alone() -> None:
    assert portable(7) == 7 and isinstance(portable(7), int)
    assert portable(np.int64(3)) == 3 and isinstance(portable(np.int64(3)), int)
    assert portable(torch.tensor(5)) == 5
    assert portable(True) is True
    assert portable("␣the") == "␣the"
    assert portable(0.0) == 0.0
    assert math.isinf(portable(float("inf")))


def test_portable_refuses_what_it_cannot_glue() -> None:
    with pytest.raises(TypeError, match="one number at a time"):
        portable(torch.ones(3))
    with pytest.raises(TypeError, match="numbers and strings"):
        portable([1.0, 2.0])


# ---- the site's slider figures ----------------------------------------------------------------

SLIDER_DIV = re.compile(r'<div class="gptbook-figure" data-figure="([\w-]+)"([^>]*)>')
ATTRIBUTE = re.compile(r"""data-([\w-]+)=(?:"([^"]*)"|'([^']*)')""")


def _glued(path: Path, name: str) -> object:
    for cell in _code(path):
        for out in cell.get("outputs", []):
            if out.get("metadata", {}).get("scrapbook", {}).get("name") == name:
                return ast.literal_eval("".join(out["data"][GLUE_PREFIX + "text/plain"]))
    raise AssertionError(f"{path.name} glues no value {name!r}")


def _slider(path: Path, figure: str) -> dict[str, str]:
    for cell in _cells(path):
        if cell["cell_type"] == "markdown":
            for name, attributes in SLIDER_DIV.findall("".join(cell["source"])):
                if name == figure:
                    return {k: a or b for k, a, b in ATTRIBUTE.findall(attributes)}
    raise AssertionError(f"{path.name} has no slider figure {figure!r}")


def test_the_slider_figures_use_the_chapters_numbers() -> None:
    # the site's sliders of chapters 5 and 6 are typed into markdown: they must start from the
    # numbers the chapter computes, or the web figure would silently differ from the static one
    chapters = {p.stem: p for p in CHAPTERS}
    ch5, ch6 = chapters["05_attention_scores"], chapters["06_mask_and_softmax"]
    scaling = _slider(ch5, "scaling")
    assert int(scaling["keys"]) == _glued(ch5, "ch5_T")
    assert int(scaling["d-k"]) == _glued(ch5, "ch5_d_show")
    temperature = _slider(ch6, "temperature")
    assert json.loads(temperature["scores"]) == json.loads(_glued(ch6, "ch6_z"))
    assert json.loads(temperature["labels"]) == json.loads(_glued(ch6, "ch6_z_labels"))
