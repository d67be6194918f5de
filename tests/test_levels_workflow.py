"""The static (execution) and judge levels through the real workflow: HumanEval and AlpacaEval
on the tiny model with the copy agent, then a judge change that reruns evaluations only."""

from __future__ import annotations

import copy
import csv

import pytest

from rlbench.jsonio import read_json, read_jsonl
from test_workflow import make_workdir, planned_jobs, snakemake

CONFIG = {
    "sweep": {"tasks": ["humaneval", "alpaca-eval"], "models": ["tiny"], "agents": ["copy"], "seeds": [0]},
    "budget": {"time_limit_s": 120, "kill_grace_s": 2},
    "tasks": {
        "humaneval": {"max_new_tokens": 8},
        "alpaca-eval": {
            "source": "offline",
            "eval_size": 6,
            "max_new_tokens": 8,
            # The tiny model as a local judge: the judge's whole path, offline, in seconds.
            "judge": {"backend": "local", "model": "tiny"},
        },
    },
    "evaluation": {"backend": "hf", "batch_size": 16, "eval_timeout_s": 300},
}


@pytest.fixture(scope="module")
def levels_sweep(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("levels"), CONFIG)
    plan = planned_jobs(workdir)
    assert plan.get("judge_config") == 1 and plan.get("check_execution") == 1, plan
    snakemake(workdir, "--cores", "2")
    return workdir


def test_copy_scores_delta_zero_on_both_levels_with_their_metrics(levels_sweep):
    rows = {r["task"]: r for r in csv.DictReader(open(levels_sweep / "results/report/leaderboard.csv"))}
    assert rows["humaneval"]["metric"] == "pass@1" and rows["alpaca-eval"]["metric"] == "length_controlled_winrate"
    for row in rows.values():
        assert float(row["delta"]) == 0.0 and row["status"] == "completed", row
    baseline = read_json(levels_sweep / "results/baselines/alpaca-eval/tiny.json")
    assert baseline["grader_noise"]["repeats"] == 3 and baseline["metrics"]["judge_failures"] == 0
    assert baseline["provenance"]["judge"]["backend"] == "local"
    assert "tasks/alpaca_eval/winrate.py" in baseline["provenance"]["code"]["task_files"]
    humaneval = read_json(levels_sweep / "results/baselines/humaneval/tiny.json")
    assert humaneval["n"] == 82 and humaneval["provenance"]["execution"]["checks"]["loop_times_out"] is True
    ledger = list(read_jsonl(levels_sweep / "results/runs/alpaca-eval/tiny/copy/0/grader/ledger.jsonl"))
    assert ledger[-1]["metrics"]["lc_method"] and ledger[-1]["primary_metric"] == "length_controlled_winrate"
    assert any((levels_sweep / "results/judgments/alpaca-eval").rglob("*.json"))


def test_a_judge_change_reruns_evaluations_never_an_agent(levels_sweep):
    changed = copy.deepcopy(CONFIG)
    changed["tasks"]["alpaca-eval"]["judge"]["batch_size"] = 2
    (levels_sweep / "config" / "config.yaml").write_text(__import__("yaml").safe_dump(changed))
    plan = planned_jobs(levels_sweep)
    assert plan.get("judge_config") == 1 and plan.get("evaluate_baseline") == 1, plan
    for rule in ("run_agent", "prepare_workspace", "prepare_data", "check_execution"):
        assert rule not in plan, plan


# -- the interactive level: WebShop and DeepSearchQA through the real workflow ------------------
ONLINE_CONFIG = {
    "sweep": {"tasks": ["webshop", "deepsearchqa"], "models": ["tiny"], "agents": ["copy"], "seeds": [0]},
    "budget": {"time_limit_s": 120, "kill_grace_s": 2},
    "tasks": {
        "webshop": {
            "source": "offline", "catalogue_size": 40, "train_size": 8, "eval_size": 4, "max_new_tokens": 8,
            "environment": {"max_steps": 4},
        },
        "deepsearchqa": {
            "source": "offline", "kb_size": 60, "train_size": 8, "eval_size": 4, "max_new_tokens": 8,
            "grader_noise_repeats": 2, "judge": {"backend": "match", "model": "string-match"},
        },
    },
    "evaluation": {"backend": "hf", "batch_size": 16, "eval_timeout_s": 300},
}  # fmt: skip


@pytest.fixture(scope="module")
def online_sweep(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("online"), ONLINE_CONFIG)
    plan = planned_jobs(workdir)
    assert plan.get("generate_games") == 4 and plan.get("judge_config") == 1, plan
    snakemake(workdir, "--cores", "2")
    return workdir


def test_webshop_and_deepsearchqa_end_to_end_with_copy(online_sweep):
    rows = {r["task"]: r for r in csv.DictReader(open(online_sweep / "results/report/leaderboard.csv"))}
    assert rows["webshop"]["metric"] == "success_rate" and rows["deepsearchqa"]["metric"] == "accuracy"
    for row in rows.values():
        assert float(row["delta"]) == 0.0 and row["status"] == "completed", row
    webshop = read_json(online_sweep / "results/baselines/webshop/tiny.json")
    assert webshop["n"] == 4 and {"mean_reward", "full_success_rate"} <= set(webshop["metrics"])
    search = read_json(online_sweep / "results/baselines/deepsearchqa/tiny.json")
    assert search["n"] == 4 and search["grader_noise"]["repeats"] == 2
    assert search["metrics"]["judge_backend"] == "match" and "official_f1" in search["metrics"]
    # The held-out instructions and questions are in no file of any workspace.
    for task, field in (("webshop", "instruction"), ("deepsearchqa", "problem")):
        held_out = [row[field] for row in read_jsonl(online_sweep / f"results/data/{task}/eval/eval.jsonl")]
        workspace = online_sweep / f"results/runs/{task}/tiny/copy/0/workspace"
        texts = [p.read_text(errors="ignore") for p in workspace.rglob("*") if p.is_file() and p.stat().st_size < 5e7]
        assert held_out and not [q for q in held_out if any(q in text for text in texts)]
