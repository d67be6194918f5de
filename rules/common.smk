# Config validation, registries, path helpers and wildcard constraints. No rules here.

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))

from rlbench.config import (
    ConfigError,
    Registries,
    sweep_runs,
    task_settings,
    validate_config,
)
from rlbench.analysis.catalogue import FIGURE, ITEMS as REPORT_ITEMS, TABLE
from rlbench.tasks import get_task, split_size_problems
from rlbench.tasks.base import ensure_salt

# Checked first, before any job starts: the config against the schema and the registries, and every task's split sizes
# against what its data source can give (a config that cannot work never rewrites a split or archives a run).
try:
    REGISTRIES = Registries.load(Path(workflow.basedir) / "config")
    VALIDATED = validate_config(config, REGISTRIES, task_problems=split_size_problems)
except ConfigError as error:
    raise SystemExit(f"Agent² RL-Bench: {error}")
config.update(VALIDATED)

RESULTS = "results"
RUN_DIR = "results/runs/{task}/{model}/{agent}/{seed}"
# The installation's secret: generated held-out splits are drawn with it (rule eval_salt).
EVAL_SALT = "results/secrets/eval_salt"


def _alternatives(names):
    return "|".join(re.escape(name) for name in sorted(names))


wildcard_constraints:
    task=_alternatives(REGISTRIES.tasks),
    model=_alternatives(REGISTRIES.models),
    agent=_alternatives(REGISTRIES.agents),
    seed=r"\d+",


def run_path(name):
    """A file of one run, as a wildcard pattern: run_path('run.json')."""
    return f"{RUN_DIR}/{name}"


# The task settings each data split depends on: changing eval_size never touches the training split.
# catalogue_size / kb_size: the shop (WebShop) or knowledge base (DeepSearchQA) both splits use.
SPLIT_KEYS = (
    "name",
    "module",
    "level",
    "source",
    "data_seed",
    "hub",
    "catalogue_size",
    "kb_size",
)
TRAIN_KEYS = SPLIT_KEYS + ("train_size",)
EVAL_DATA_KEYS = SPLIT_KEYS + ("eval_size",)


def get_task_settings(wildcards, keys=None):
    """The task's registry entry with the sweep's overrides (only `keys`, when given)."""
    settings = task_settings(config, REGISTRIES, wildcards.task)
    return settings if keys is None else {k: settings[k] for k in keys if k in settings}


def get_eval_data_input(wildcards):
    """The training split, and the salt when the held-out split is generated: a hub test split is
    public, so it neither needs the salt nor reruns when the salt is created."""
    inputs = {"train": f"results/data/{wildcards.task}/train/train.jsonl"}
    if get_task_settings(wildcards).get("source") != "hub":
        inputs["salt"] = EVAL_SALT
    return inputs


# Levels are plug-ins (rules/levels/*.smk): each appends to LEVEL_INPUTS a function
# (wildcards, stage) -> {name: path} giving the extra inputs its tasks need at a stage ("evaluate":
# baseline and final evaluations; "agent": the grader inside run_agent; "train_data" and
# "eval_data": the splits' sources, such as an L3 task's games), fed to the common rules
# through unpack(level_inputs(stage)). The judgment cache is not an input: it only ever grows.
LEVEL_INPUTS = []
JUDGMENT_CACHE = "results/judgments/{task}"


def level_inputs(stage):
    """An input function: the extra inputs every level plug-in asks for at `stage`."""

    def inputs(wildcards):
        merged = {}
        for plugin in LEVEL_INPUTS:
            merged.update(plugin(wildcards, stage))
        return merged

    return inputs


def get_agent_runtime_minutes(wildcards):
    """SLURM runtime of run_agent: the budget, the kill grace and the overhead (grader, last evaluation)."""
    budget = config["budget"]
    seconds = budget["time_limit_s"] + budget["kill_grace_s"] + budget["overhead_s"]
    return int(-(-seconds // 60))


# Settings of how the grader runs its evaluations (rlbench.evaluation.workers), not of what they compute:
# they never rerun a baseline or a final evaluation.
WORKER_SETTINGS = ("worker", "worker_idle_s")


def get_scoring_settings(baseline=False):
    """config["evaluation"] as the baseline and final evaluations' params: what decides a score.

    The baseline's leave out baseline_score (which of its scores Δ uses: the final evaluation's).
    """
    left_out = WORKER_SETTINGS + (("baseline_score",) if baseline else ())
    return {k: v for k, v in config["evaluation"].items() if k not in left_out}


def get_model_spec(wildcards):
    return REGISTRIES.models[wildcards.model]


def get_agent_spec(wildcards):
    return REGISTRIES.agents[wildcards.agent]


def get_level(wildcards):
    return REGISTRIES.tasks[wildcards.task]["level"]


def get_run_files(name):
    """One file per run of the sweep, e.g. every summary.json."""
    return [run_path(name).format(**run) for run in sweep_runs(config)]


# The analysis stage's tables (aggregate; CSV and Markdown) and figures (report_figures; PNG and SVG)
# under results/report/: the items of rlbench.analysis.catalogue, each with its caption in workflow/report/.
REPORT_DIR = "results/report"


def report_outputs(kind, category):
    """The outputs of aggregate (kind TABLE) or report_figures (kind FIGURE), for each catalogue item of
    that kind: its first file (a table's CSV, a figure's PNG) in the HTML report under `category` (a
    table's group as subcategory) with the item's caption, and its second file (the Markdown, the SVG).
    """
    outputs = {}
    for item in REPORT_ITEMS:
        if item.kind != kind:
            continue
        (shown, shown_path), (other, other_path) = item.files.items()
        outputs[shown] = report(
            f"{REPORT_DIR}/{shown_path}",
            caption=f"../workflow/report/{item.caption_path.name}",
            category=category,
            subcategory=item.group or None,
        )
        outputs[other] = f"{REPORT_DIR}/{other_path}"
    return outputs


def report_files(kind):
    """Every file of the catalogue's items of `kind` (a table's CSV and Markdown, a figure's PNG and SVG)."""
    return [
        f"{REPORT_DIR}/{path}"
        for item in REPORT_ITEMS
        if item.kind == kind
        for path in item.files.values()
    ]


def get_narrative_model_input(wildcards):
    """The local judge's model when the optional LLM narrative of summarize_run is on."""
    narrative = config["report"]["narrative"]
    judge = narrative.get("judge") or {}
    if narrative.get("enabled") and judge.get("backend") == "local":
        return {"judge_model": f"results/models/{judge['model']}"}
    return {}


def get_audit_judge_model_input(wildcards):
    """The local judge's model when the optional trace judge of audit_run is on."""
    judge = config["audit"].get("judge") or {}
    if judge.get("backend") == "local":
        return {"judge_model": f"results/models/{judge['model']}"}
    return {}


def get_final_output():
    """The report and every run's final evaluation and summary: requested explicitly, so that a
    deleted final.json is recomputed even though the summary built from it still exists.
    """
    return (
        ["results/report/leaderboard.csv", "results/report/index.html"]
        + get_run_files("final.json")
        + get_run_files("summary.json")
    )
