"""The glossary and the numbers in the prose: every {term} role resolves, glossary.md and
glossary_terms.yml list the same terms, the main line of chapter N uses no term that a later
chapter defines, and no {glue:text} format shows more digits than were glued.

Reads the stored files only: no notebook is executed and nothing is downloaded.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest
import yaml

from gptlib.notebook import DIGITS

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "glossary.md"
TERM_MAP = ROOT / "glossary_terms.yml"
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
PAGES = sorted([*ROOT.glob("*.md"), *(ROOT / "chapters").glob("*.md")])
GLUE_PREFIX = "application/papermill.record/"

# Pages without a number in their name: the chapter they follow in the table of contents, so a
# term that chapter (or an earlier one) defines may be used in their main line.
APPENDIX_CHAPTER = {
    "appendix_trained": 10.5,
    "appendix_gptlib": 10.6,
    "appendix_articles": 15.5,
}

TERM_ROLE = re.compile(r"\{term\}`([^`]+)`")
GLUE_TEXT_ROLE = re.compile(r"\{glue:text\}`([^`]+)`")
FENCE_OPEN = re.compile(r"^\s*(`{3,}|:{3,}|~{3,})\s*(\{([\w:-]+)\})?")


# ---- reading the files -----------------------------------------------------------------------


@functools.cache
def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _markdown_of(path: Path, main_line_only: bool = False) -> list[str]:
    """The markdown of a page: every markdown cell of a notebook (with ``main_line_only``, only the
    cells without the ``optional`` tag, with dropdowns removed), or a whole ``.md`` page."""
    if path.suffix == ".md":
        texts = [path.read_text(encoding="utf-8")]
    else:
        texts = [
            _source(c)
            for c in _cells(path)
            if c["cell_type"] == "markdown"
            and not (main_line_only and "optional" in c.get("metadata", {}).get("tags", []))
        ]
    return [without_dropdowns(t) for t in texts] if main_line_only else texts


def without_dropdowns(text: str) -> str:
    """``text`` without the content of any dropdown (``{dropdown}`` directives and admonitions
    with ``:class: dropdown``), however deeply nested: a reader sees it only on request."""
    lines, kept = text.splitlines(), []
    stack: list[tuple[str, int, bool]] = []  # (fence character, fence length, hidden)
    for i, line in enumerate(lines):
        stripped = line.strip()
        top = stack[-1] if stack else None
        if top and stripped and set(stripped) == {top[0]} and len(stripped) >= top[1]:
            stack.pop()
            continue
        opening = FENCE_OPEN.match(line)
        if opening:
            fence, name = opening.group(1), opening.group(3) or ""
            options = []
            for following in lines[i + 1 :]:  # the directive's ":key: value" option lines
                if not re.match(r"^\s*:[\w-]+:", following):
                    break
                options.append(following)
            dropdown = name == "dropdown" or any(
                re.match(r"^\s*:class:.*\bdropdown\b", o) for o in options
            )
            hidden = bool(stack and stack[-1][2]) or dropdown
            stack.append((fence[0], len(fence), hidden))
            continue
        if not (stack and stack[-1][2]):
            kept.append(line)
    return "\n".join(kept)


def chapter_number(path: Path) -> float | None:
    """The chapter a page belongs to: ``03_x`` -> 3, ``10b_x`` -> 10.1, an appendix from
    :data:`APPENDIX_CHAPTER`; ``None`` for pages outside the sequence (intro, glossary)."""
    if path.stem in APPENDIX_CHAPTER:
        return APPENDIX_CHAPTER[path.stem]
    match = re.match(r"^(\d+)([a-z]?)_", path.stem)
    if not match:
        return None
    number, letter = int(match.group(1)), match.group(2)
    return number + (ord(letter) - ord("a")) / 10 if letter else float(number)


def _normal(term: str) -> str:
    return " ".join(term.split()).lower()  # Sphinx matches terms case-insensitively


def role_target(content: str) -> str:
    """The glossary term a ``{term}`` role points at: ``x`` or the ``y`` of ``text <y>``."""
    explicit = re.fullmatch(r"(?s).*?<([^<>]+)>\s*", content)
    return _normal(explicit.group(1) if explicit else content)


def glossary_entries(text: str) -> tuple[list[str], list[str]]:
    """(the terms of glossary.md's one {glossary} block in source order, its options)."""
    blocks = re.findall(r"(?ms)^(`{3,}|:{3,})\{glossary\}[^\n]*\n(.*?)^\1\s*$", text)
    assert len(blocks) == 1, f"glossary.md needs exactly one {{glossary}} block, has {len(blocks)}"
    body = blocks[0][1]
    terms, options = [], []
    for line in body.splitlines():
        if re.match(r"^:[\w-]+:", line):
            options.append(line.strip())
        elif line.strip() and not line[0].isspace():
            terms.append(line.strip())
    return terms, options


def term_map() -> dict[str, float]:
    mapping = yaml.safe_load(TERM_MAP.read_text(encoding="utf-8"))
    assert isinstance(mapping, dict), "glossary_terms.yml must map each term to a chapter number"
    return {str(k): v for k, v in mapping.items()}


# ---- the glossary ----------------------------------------------------------------------------


def test_the_glossary_is_one_sorted_block() -> None:
    terms, options = glossary_entries(GLOSSARY.read_text(encoding="utf-8"))
    assert ":sorted:" in options
    assert terms == sorted(terms, key=str.lower), "keep glossary.md's entries in sorted order"
    duplicates = {t for t in terms if [_normal(u) for u in terms].count(_normal(t)) > 1}
    assert not duplicates, f"terms defined twice: {sorted(duplicates)}"


def test_the_glossary_and_the_chapter_map_list_the_same_terms() -> None:
    mapping = term_map()
    entries = {_normal(t) for t in glossary_entries(GLOSSARY.read_text(encoding="utf-8"))[0]}
    not_lower = [k for k in mapping if k != _normal(k)]
    assert not not_lower, f"write these keys of glossary_terms.yml in lowercase: {not_lower}"
    assert not entries - set(mapping), (
        f"add to glossary_terms.yml: {sorted(entries - set(mapping))}"
    )
    assert not set(mapping) - entries, f"define in glossary.md: {sorted(set(mapping) - entries)}"
    bad = {k: v for k, v in mapping.items() if not isinstance(v, (int, float)) or v < 0}
    assert not bad, f"chapter numbers must be numbers such as 3 or 10.5: {bad}"


def test_every_term_role_resolves_to_a_glossary_entry() -> None:
    entries = {_normal(t) for t in glossary_entries(GLOSSARY.read_text(encoding="utf-8"))[0]}
    unknown = [
        f"{path.relative_to(ROOT)}: {{term}}`{content}`"
        for path in [*NOTEBOOKS, *PAGES]
        for text in _markdown_of(path)
        for content in TERM_ROLE.findall(text)
        if role_target(content) not in entries
    ]
    assert not unknown, "terms missing from glossary.md:\n" + "\n".join(unknown)


@pytest.mark.parametrize(
    "path",
    [p for p in [*NOTEBOOKS, *PAGES] if chapter_number(p) is not None],
    ids=lambda p: p.stem,
)
def test_the_main_line_uses_no_term_from_a_later_chapter(path: Path) -> None:
    mapping, here = term_map(), chapter_number(path)
    early = sorted(
        {
            f"{role_target(c)} (chapter {mapping[role_target(c)]})"
            for text in _markdown_of(path, main_line_only=True)
            for c in TERM_ROLE.findall(text)
            if role_target(c) in mapping and mapping[role_target(c)] > here
        }
    )
    assert not early, (
        f"chapter {here:g} uses, outside optional sections and dropdowns, terms that a later "
        f"chapter defines: {early}. Define the term here, or move the passage to an optional part."
    )


def test_the_checks_see_roles_dropdowns_and_chapter_numbers() -> None:
    # the parsing the tests above rely on, on examples worked out by hand
    text = (
        "a {term}`Token` b {term}`the heads <head>`\n:::{dropdown} Why\nhidden {term}`logit`\n:::"
    )
    assert [role_target(c) for c in TERM_ROLE.findall(text)] == ["token", "head", "logit"]
    visible = without_dropdowns(text)
    assert "logit" not in visible and "the heads <head>" in visible
    nested = "::::{admonition} Solution\n:class: dropdown\n```python\nx\n```\n{term}`nat`\n::::\nz"
    assert without_dropdowns(nested) == "z"
    note = ":::{note}\n{term}`nat`\n:::"
    assert "{term}`nat`" in without_dropdowns(note)  # a plain admonition is not hidden
    assert chapter_number(Path("chapters/03_positional_encoding.ipynb")) == 3
    assert chapter_number(Path("chapters/10b_training_run.ipynb")) == pytest.approx(10.1)
    assert chapter_number(Path("chapters/appendix_trained.ipynb")) == 10.5
    assert chapter_number(Path("intro.md")) is None


# ---- glued numbers and their formats ---------------------------------------------------------


def glued_values(path: Path) -> dict[str, str]:
    """Every value a notebook glues: name -> the text/plain it stored."""
    out = {}
    for cell in _cells(path):
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get(GLUE_PREFIX + "text/plain")
            if name is not None and text is not None:
                out[name] = text if isinstance(text, str) else "".join(text)
    return out


def significant_digits(shown: str) -> int:
    """How many significant digits a formatted number shows (``4.250`` -> 4, ``0.028`` -> 2,
    ``65,500`` -> 5, ``8.3e+01`` -> 2)."""
    mantissa = re.split(r"[eE]", shown)[0]
    return len(re.sub(r"\D", "", mantissa).lstrip("0"))


def glue_digits(path: Path) -> list[tuple[re.Pattern[str], int]]:
    """(name pattern, digits) of every ``glue(name, value, digits=N)`` call in a notebook's code:
    the significant digits :func:`gptlib.notebook.glue` kept (``DIGITS`` unless told)."""
    out = []
    for cell in _cells(path):
        if cell["cell_type"] != "code":
            continue
        lines = _source(cell).splitlines()
        code = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "glue"):
                continue
            name = call.args[0] if call.args else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                pattern = re.escape(name.value)
            elif isinstance(name, ast.JoinedStr):  # f"ch1_start_{k}": any text where {k} is
                parts = [
                    re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in name.values
                ]
                pattern = "".join(parts)
            else:
                continue
            given = [k.value for k in call.keywords if k.arg == "digits"] + call.args[2:3]
            digits = DIGITS
            if given and isinstance(given[0], ast.Constant) and isinstance(given[0].value, int):
                digits = given[0].value
            out.append((re.compile(pattern + r"\Z"), digits))
    return out


def overclaims(stored: str, fmt: str, digits: int = DIGITS) -> str | None:
    """The formatted text, if ``fmt`` shows more significant digits than the ``digits`` that
    glue kept of the value (``stored`` is its text); ``None`` when the format is honest, or is
    not a number format with a precision."""
    try:
        value = ast.literal_eval(stored)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(value, float) or value == 0 or not re.search(r"\.\d+", fmt):
        return None  # integers are exact; a format without a precision shows what was stored
    if fmt[-1] not in "eEfFgG%":
        return None
    shown = format(value, fmt)
    # the stored text is itself evidence of what was kept: "11.5136" kept at least 6 digits,
    # whatever the glue call's arguments were (its trailing zeros prove nothing: "65500.0")
    kept = max(digits, len(re.sub(r"\D", "", stored).strip("0")))
    return shown if significant_digits(shown) > kept else None


def test_the_digit_check_catches_padded_zeros() -> None:
    assert overclaims("4.25", ".3f", digits=3) == "4.250"  # issue 23, error 4
    assert overclaims("23.93", ".4f") == "23.9300"  # 4 digits kept, 6 shown
    assert overclaims("65500.0", ",.0f") == "65,500"  # float16's 65,504 kept to 4 digits
    assert overclaims("4.248", ".3f") is None
    assert overclaims("11.5136", ".4f", digits=4) is None  # six digits were stored, six shown
    assert overclaims("1.0", ".3f") is None  # kept to 4 digits: 1.000 is what was measured
    assert overclaims("83.24", ".0f") is None
    assert overclaims("0.0284", ".3f", digits=3) is None and overclaims("0.832", ".1%") is None
    assert overclaims("100277", ",.2f") is None  # an integer is exact
    assert overclaims("'text'", "s") is None and overclaims("65500.0", ",") is None


def test_the_digits_of_each_glue_call_are_read_from_the_code(tmp_path: Path) -> None:
    code = 'glue("a", x, digits=3)\nglue(f"b_{k}", y)\nglue("c", z, 2)'
    notebook = tmp_path / "nb.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": code}]}))
    calls = glue_digits(notebook)
    assert [d for _, d in calls] == [3, DIGITS, 2]
    assert digits_for("a", calls) == 3 and digits_for("b_7", calls) == DIGITS
    assert digits_for("c", calls) == 2 and digits_for("unknown", calls) == DIGITS
    # a name glued by itself keeps its own digits, even where a loop's f"..." could also make it
    loop = glue_digits_of('glue("ch_x", x, digits=6)\nglue(f"ch_{k}", y)', tmp_path)
    assert digits_for("ch_x", loop) == 6 and digits_for("ch_y", loop) == DIGITS


def glue_digits_of(code: str, folder: Path) -> list[tuple[re.Pattern[str], int]]:
    """:func:`glue_digits` of a notebook holding one code cell (for the tests of the check)."""
    notebook = folder / "one_cell.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": code}]}))
    return glue_digits(notebook)


def digits_for(key: str, calls: list[tuple[re.Pattern[str], int]]) -> int:
    """The digits kept for the glued name ``key``: those of the calls that name it exactly, else
    of the f-string calls that could make it (the fewest, if several match)."""
    exact = [d for pattern, d in calls if pattern.pattern == re.escape(key) + r"\Z"]
    return min(exact or [d for pattern, d in calls if pattern.match(key)], default=DIGITS)


def glue_roles() -> list[tuple[Path, str, str, dict[str, str], int]]:
    """(notebook, glue name, format, the notebook's glued values, digits kept) for every
    {glue:text} role that pastes from its own notebook (``path::name`` roles are resolved by
    myst-nb elsewhere)."""
    out = []
    for path in NOTEBOOKS:
        values, calls = glued_values(path), glue_digits(path)
        for text in _markdown_of(path):
            for content in GLUE_TEXT_ROLE.findall(text):
                if "::" not in content:
                    key, _, fmt = content.partition(":")
                    out.append((path, key, fmt, values, digits_for(key, calls)))
    return out


def test_every_glue_role_names_a_value_its_notebook_glued() -> None:
    missing = [f"{p.name}: {key}" for p, key, _, values, _ in glue_roles() if key not in values]
    assert not missing, "glue roles with no glued value (re-execute the notebook?):\n" + "\n".join(
        missing
    )


def test_no_glue_format_shows_a_digit_that_was_not_glued() -> None:
    padded = [
        f"{p.name}: {key}:{fmt} shows {shown}, glued {values[key]}"
        for p, key, fmt, values, digits in glue_roles()
        if key in values and fmt and (shown := overclaims(values[key], fmt, digits))
    ]
    assert not padded, (
        "formats that show digits that were never glued (glue more digits, or ask the format "
        "for fewer):\n" + "\n".join(padded)
    )
