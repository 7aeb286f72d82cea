# Two entry points (see README): `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/tracelake: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

.PHONY: install demo test bench clean
install: $(BIN)/tracelake

demo: $(BIN)/tracelake
	$(BIN)/tracelake run sample_traces/ --lake .tracelake --force -o report.html

test: $(BIN)/tracelake
	$(BIN)/python -m pytest -n 2 tests

bench: $(BIN)/tracelake
	$(BIN)/python benchmarks/ingest_vs_hta.py

clean:
	rm -rf $(VENV) .tracelake report.html
