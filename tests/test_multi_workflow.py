"""A multi-task run through the real workflow (the default tier's session sweep: support.workflow.MULTI_GRID): one
run over HumanEval (L1), AlpacaEval (L2) and ALFWorld (L3) on the tiny model, with the copy control (Δ exactly 0 on
every task) and the multi reference agent; each task's view, final evaluation, audit and summary; the run's own
summary; the mode-ablation table and the leaderboard."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rlbench.fileio.jsonio import read_json, read_jsonl
from support.workflow import MULTI_GRID, MULTI_GROUP

TASKS = sorted(MULTI_GRID["tasks"])


def run_dir(sweep: Path, agent: str) -> Path:
    return sweep / "results" / "runs" / "multi" / MULTI_GROUP / "tiny" / agent / "0"


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_copy_scores_every_task_exactly_at_its_baseline(session_sweep):
    run = run_dir(session_sweep, "copy")
    record = read_json(run / "run.json")
    assert record["status"] == "completed" and record["tasks"] == TASKS
    workspace = read_json(run / "workspace.json")
    assert workspace["tasks"] == TASKS
    for task in TASKS:
        final = read_json(run / "tasks" / task / "final.json")
        assert final["status"] == "evaluated", (task, final)
        assert final["delta"] == 0.0, (task, final["score"], final["baseline_score"])
        summary = read_json(run / "tasks" / task / "summary.json")
        assert summary["labels"] == {"task": task, "model": "tiny", "agent": "copy", "seed": "0", "multi": MULTI_GROUP}
        assert summary["mode"] == "multi" and summary["delta"] == 0.0
        assert summary["integrity"]["status"] == "clean", summary["integrity"]
    # the base model's copy, submitted once with the default "all": every task from the cache, none evaluated
    (entry,) = [e for e in read_jsonl(run / "grader" / "ledger.jsonl")]
    assert entry["task"] == "all" and sorted(entry["tasks"]) == TASKS and entry["status"] == "cached"
    overall = read_json(run / "summary.json")
    assert overall["multi"]["mean_delta"] == 0.0 and overall["multi"]["distinct_best_models"] == 1
    assert overall["targets"] == {"all": 1} and set(overall["tasks"]) == set(TASKS)
    assert "mean Δ over the tasks: 0.00" in (run / "summary.md").read_text()


def test_multi_reference_agent_trains_one_model_and_is_scored_on_every_task(session_sweep):
    run = run_dir(session_sweep, "multi-sft")
    record = read_json(run / "run.json")
    assert record["status"] == "completed", record.get("error")
    ledger = list(read_jsonl(run / "grader" / "ledger.jsonl"))
    scored = [e for e in ledger if e["status"] == "scored"]
    assert scored and all(e["task"] == "all" and sorted(e["tasks"]) == TASKS for e in scored)
    for entry in scored:  # the top level is the mean over the tasks evaluated
        mean = sum(t["score"] for t in entry["tasks"].values()) / len(TASKS)
        assert entry["score"] == pytest.approx(mean, abs=1e-6)
    for task in TASKS:
        best = record["best_by_task"][task]
        assert (run / "grader" / "best_models" / task / "config.json").is_file()
        final = read_json(run / "tasks" / task / "final.json")
        assert final["status"] == "evaluated" and final["best_submission"]["submission_id"] == best["submission_id"]
        assert final["delta"] == pytest.approx(final["score"] - final["baseline_score"], abs=1e-3)
    # the agent's code: a snapshot per submission, as for single-task runs
    assert (run / "grader" / "code.git").is_dir()
    overall = read_json(run / "summary.json")
    deltas = [read_json(run / "tasks" / t / "final.json")["delta"] for t in TASKS]
    assert overall["multi"]["mean_delta"] == pytest.approx(sum(deltas) / len(deltas), abs=1e-4)


def test_mode_ablation_table_and_leaderboard_show_the_multi_runs(session_sweep):
    report = session_sweep / "results" / "report"
    table = rows(report / "mode_ablation.csv")
    multi = [r for r in table if r["mode"] == "multi"]
    assert {r["agent"] for r in multi} >= {"copy", "multi-sft"}
    assert any(r["agent"] == "baseline" for r in table)
    assert any(r["agent"] == "copy" and r["mode"] == "free" for r in table)  # the single-task copy runs beside them
    markdown = (report / "mode_ablation.md").read_text()
    assert "multi" in markdown and "alfworld" in markdown
    leaderboard = rows(report / "leaderboard.csv")
    members = [r for r in leaderboard if r.get("multi") == MULTI_GROUP]
    assert sorted((r["agent"], r["task"]) for r in members) == sorted((a, t) for a in ("copy", "multi-sft") for t in TASKS)
    assert all(not r.get("multi") for r in leaderboard if r not in members)
