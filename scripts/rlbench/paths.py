"""Where things are in the repository checkout: the one place that computes these paths.

The library lives at scripts/rlbench/ of the checkout (Snakemake puts scripts/ on sys.path; `pip install
-e .` maps the package to the same directory), so every path below follows from this file's place.

Builds on: nothing in the library.
"""

from __future__ import annotations

from pathlib import Path

LIBRARY_DIR = Path(__file__).resolve().parent      # scripts/rlbench/
SCRIPTS_DIR = LIBRARY_DIR.parent                   # scripts/: rule scripts, the library, reference agents
REPO_ROOT = SCRIPTS_DIR.parent                     # the checkout: Snakefile, config/, workflow/, rules/
AGENTS_DIR = SCRIPTS_DIR / "agents"                # the reference agents (external clients of the grader)
ASSETS_DIR = LIBRARY_DIR / "assets"                # files the library ships (tiny tokenizer, chat template)
CONFIG_DIR = REPO_ROOT / "config"                  # config.yaml and the task / model / agent registries
SCHEMA_DIR = REPO_ROOT / "workflow" / "schemas"    # the JSON schemas: the one source of defaults and allowed values
REPORT_CAPTIONS_DIR = REPO_ROOT / "workflow" / "report"  # the captions (.rst) of the report's tables and figures

# Inside a run's directory (results/runs/<task>/<model>/<agent>/<seed>/ or a multi-task run's).
RUN_PAGE = Path("reports") / "run.html"           # the run explorer's page (rlbench.explorer)
