# Config validation, registries, path helpers and wildcard constraints. No rules here.

import re
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))

from rlbench.config import (
    MULTI_DIR,
    ConfigError,
    Registries,
    group_tasks,
    multi_run_budget,
    multi_runs,
    sweep_runs,
    task_settings,
    validate_config,
)
from rlbench.analysis.catalogue import FIGURE, ITEMS as REPORT_ITEMS, TABLE
from rlbench.paths import RUN_PAGE
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


def runtime_minutes(budget):
    """SLURM runtime of an agent run: the budget, the kill grace and the overhead (grader, last evaluation)."""
    seconds = budget["time_limit_s"] + budget["kill_grace_s"] + budget["overhead_s"]
    return int(-(-seconds // 60))


def get_agent_runtime_minutes(wildcards):
    """SLURM runtime of run_agent (runtime_minutes of the sweep's budget)."""
    return runtime_minutes(config["budget"])


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
    """One file per single-task run of the sweep, e.g. every summary.json."""
    return [run_path(name).format(**run) for run in sweep_runs(config)]


def get_multi_files(name, per_task=False):
    """One file per multi-task run of the sweep (rules/multi.smk), or per task of each (its tasks/<task>/ view)."""
    files = []
    for run in multi_runs(config):
        base = f"results/runs/{MULTI_DIR}/{run['tasks']}/{run['model']}/{run['agent']}/{run['seed']}"
        if per_task:
            files += [f"{base}/tasks/{task}/{name}" for task in run["task_list"]]
        else:
            files.append(f"{base}/{name}")
    return files


# The run explorer's page inside a run's directory (rlbench.paths.RUN_PAGE).
RUN_PAGE_NAME = RUN_PAGE.as_posix()


def get_run_pages(wildcards=None):
    """Every run's explorer page: one per single-task run and one per multi-task run."""
    return get_run_files(RUN_PAGE_NAME) + get_multi_files(RUN_PAGE_NAME)


def get_table_summaries(wildcards=None):
    """What the tables read: every single-task run's summary.json and every task's of each multi-task run."""
    return get_run_files("summary.json") + get_multi_files(
        "summary.json", per_task=True
    )


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
        + get_multi_files("final.json", per_task=True)
        + get_multi_files("summary.json")
    )


# -- multi-task runs (rules/multi.smk) ------------------------------------------------------------
MULTI_RUN_DIR = f"results/runs/{MULTI_DIR}/{{tasks}}/{{model}}/{{agent}}/{{seed}}"
MEMBER_DIR = f"{MULTI_RUN_DIR}/tasks/{{task}}"


wildcard_constraints:
    tasks=rf"(?:{_alternatives(REGISTRIES.tasks)})(?:\+(?:{_alternatives(REGISTRIES.tasks)}))+",


def multi_path(name):
    """A file of one multi-task run, as a wildcard pattern."""
    return f"{MULTI_RUN_DIR}/{name}"


def member_path(name):
    """A file of one task's view of a multi-task run, as a wildcard pattern."""
    return f"{MEMBER_DIR}/{name}"


def run_tasks(wildcards):
    """The tasks of the multi-task run named by the wildcards, sorted (rlbench.config.group_tasks)."""
    return group_tasks(wildcards.tasks)


def member_wildcards(wildcards, task):
    """The wildcards of one task of a multi-task run, as the single-task input functions read them."""
    return SimpleNamespace(
        task=task, model=wildcards.model, agent=wildcards.agent, seed=wildcards.seed
    )


def member_inputs(stage):
    """An input function: per task k of the run, its training and held-out splits, its baseline, its partition
    (split mode) and its level's inputs at `stage` ("agent"), named m<k>_<name> (what run_agent.py and
    prepare_workspace_multi.py read back). The held-out split, baseline and partition are ancient, as for a
    single-task run_agent: changing them never reruns an agent."""

    def inputs(wildcards):
        merged = {}
        for k, task in enumerate(run_tasks(wildcards)):
            member = member_wildcards(wildcards, task)
            files = {
                "train": f"results/data/{task}/train/train.jsonl",
                "train_manifest": f"results/data/{task}/train/manifest.json",
                "eval": ancient(f"results/data/{task}/eval/eval.jsonl"),
                "eval_manifest": ancient(f"results/data/{task}/eval/manifest.json"),
                "baseline": ancient(f"results/baselines/{task}/{wildcards.model}.json"),
            }
            if "scoring" in get_task_settings(member):
                files["partition"] = ancient(PARTITION.format(task=task))
            files.update(level_inputs(stage)(member))
            merged.update({f"m{k}_{name}": path for name, path in files.items()})
        return merged

    return inputs


def get_multi_budget(wildcards):
    """budget: with this run's time limit (its grid's time_limit_s, else budget.time_limit_s)."""
    return {
        **config["budget"],
        "time_limit_s": multi_run_budget(
            config,
            wildcards.tasks,
            wildcards.model,
            wildcards.agent,
            int(wildcards.seed),
        ),
    }


def get_multi_runtime_minutes(wildcards):
    """SLURM runtime of run_agent_multi (runtime_minutes of the run's own budget)."""
    return runtime_minutes(get_multi_budget(wildcards))


def member_check(wildcards):
    """A task's view exists only for the run's own tasks."""
    if wildcards.task not in run_tasks(wildcards):
        raise ValueError(
            f"{wildcards.task} is not a task of the multi-task run {wildcards.tasks}"
        )
    return {}
