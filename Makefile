# The README's two commands: `make demo` (report.html from sample_traces/) and `make test`.
# Both create the virtual environment .venv on first use; only Python 3.11+ and make are needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

# pip's own output goes to .venv/pip.log (printed only when an install fails), so `make demo`
# ends with the verdict and the report's path
PIP = $(BIN)/pip install --quiet --disable-pip-version-check
QUIETLY = > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }

$(VENV)/.base: pyproject.toml
	@echo "setting up $(VENV) (first use only; pip's output: $(VENV)/pip.log)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) --upgrade pip $(QUIETLY)
	@$(PIP) -e . $(QUIETLY)
	@touch $@

$(VENV)/.test: $(VENV)/.base
	@echo "installing the test dependencies into $(VENV)"
	@$(PIP) -e '.[test]' $(QUIETLY)
	@touch $@

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
