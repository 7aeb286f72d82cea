# The README's two commands: `make demo` (report.html from sample_traces/) and `make test`.
# Both create the virtual environment .venv on first use; only Python 3.11+ and make are needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

.PHONY: demo test lint format bench clean
demo: $(VENV)/.base
	$(BIN)/tracelake run sample_traces/ --lake .tracelake --force -o report.html

test: $(VENV)/.test lint
	bash scripts/install-browser.sh
	$(BIN)/python -m pytest -n 2 tests

# ruff (configured in pyproject.toml): lint and formatting, checked; `make format` applies them
lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.test
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(VENV)/.test
	$(BIN)/python benchmarks/ingest_vs_hta.py

clean:
	rm -rf $(VENV) .tracelake report.html
