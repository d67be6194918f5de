# Two entry points: `make run` (set up + the embedded default sweep) and `make test`.
VENV ?= .venv
PYTHON ?= python3
CORES ?= 2
BIN := $(VENV)/bin

.PHONY: setup run test test-all lint dry-run clean

setup: $(VENV)/.installed

# Reinstall whenever pyproject.toml changes. torch first: the pin takes the CPU wheel where one is
# available instead of a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@scripts/install_sandbox.sh
	touch $@

run: setup
	$(BIN)/snakemake --profile workflow/profiles/local --cores $(CORES)

dry-run: setup
	$(BIN)/snakemake -n

test: setup
	$(BIN)/python -m pytest

test-all: setup
	$(BIN)/python -m pytest -m "slow or not slow"

lint: setup
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile rules

clean:
	rm -rf results .snakemake
