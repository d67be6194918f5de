"""The static (execution), judge and interactive levels through the real workflow: HumanEval,
AlpacaEval, ALFWorld, WebShop and DeepSearchQA on the tiny model with the copy agent (the default
tier's sweep, tests/conftest.py), then a judge change that reruns evaluations only."""

from __future__ import annotations

import csv

import yaml

from rlbench.fileio.jsonio import read_json, read_jsonl
from support.workflow import config_lock, planned_jobs


def leaderboard(sweep) -> dict[str, dict]:
    with open(sweep / "results/report/leaderboard.csv") as handle:
        return {r["task"]: r for r in csv.DictReader(handle) if r["model"] == "tiny" and r["agent"] == "copy"}


def test_copy_scores_delta_zero_on_both_levels_with_their_metrics(session_sweep):
    levels_sweep = session_sweep
    rows = leaderboard(levels_sweep)
    assert rows["humaneval"]["metric"] == "pass@1" and rows["alpaca-eval"]["metric"] == "length_controlled_winrate"
    for task in ("humaneval", "alpaca-eval"):
        assert float(rows[task]["delta"]) == 0.0 and rows[task]["status"] == "completed", rows[task]
    baseline = read_json(levels_sweep / "results/baselines/alpaca-eval/tiny.json")
    assert baseline["grader_noise"]["repeats"] == 3 and baseline["metrics"]["judge_failures"] == 0
    assert baseline["provenance"]["judge"]["backend"] == "local"
    assert "tasks/alpaca_eval/winrate.py" in baseline["provenance"]["code"]["task_files"]
    humaneval = read_json(levels_sweep / "results/baselines/humaneval/tiny.json")
    assert humaneval["n"] == 82 and humaneval["provenance"]["execution"]["checks"]["loop_times_out"] is True
    ledger = list(read_jsonl(levels_sweep / "results/runs/alpaca-eval/tiny/copy/0/grader/ledger.jsonl"))
    assert ledger[-1]["metrics"]["lc_method"] and ledger[-1]["primary_metric"] == "length_controlled_winrate"
    assert any((levels_sweep / "results/judgments/alpaca-eval").rglob("*.json"))


def test_a_judge_change_reruns_evaluations_never_an_agent(session_sweep):
    """A dry run with the judge's batch size changed (the config is restored: nothing is run)."""
    path = session_sweep / "config" / "config.yaml"
    with config_lock(session_sweep):  # the sweep is shared with tests on the other worker
        original = path.read_text()
        changed = yaml.safe_load(original)
        changed["tasks"]["alpaca-eval"]["judge"]["batch_size"] = 2
        try:
            path.write_text(yaml.safe_dump(changed))
            plan = planned_jobs(session_sweep)
        finally:
            path.write_text(original)
    assert plan.get("judge_config") == 1 and plan.get("evaluate_baseline") == 1, plan
    for rule in ("run_agent", "prepare_workspace", "prepare_data", "check_execution"):
        assert rule not in plan, plan
    assert planned_jobs(session_sweep) == {}


# -- the interactive level: ALFWorld, WebShop and DeepSearchQA ------------------------------------
def test_alfworld_webshop_and_deepsearchqa_end_to_end_with_copy(session_sweep):
    online_sweep = session_sweep
    rows = leaderboard(online_sweep)
    assert rows["webshop"]["metric"] == "success_rate" and rows["deepsearchqa"]["metric"] == "accuracy"
    assert rows["alfworld"]["metric"] == "success_rate"
    for task in ("alfworld", "webshop", "deepsearchqa"):
        assert float(rows[task]["delta"]) == 0.0 and rows[task]["status"] == "completed", rows[task]
    alfworld = read_json(online_sweep / "results/baselines/alfworld/tiny.json")
    assert alfworld["n"] == 6
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
