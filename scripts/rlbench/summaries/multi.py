"""A multi-task run's results: each task's view of it (its artifacts, as a single-task run's), the run's `multi`
block (the mean Δ over its tasks, how many distinct checkpoints their bests are, the joint best), the run-level
summary (summary.json / summary.md beside run.json) and which tasks each submission targeted.

A multi-task run (one workspace, one base model, one budget, several tasks; config grids with mode multi) is
this benchmark's own arrangement of the paper's "multi" mode: per task its result is the best submission on that
task within the run, re-evaluated at the end as a single-task run's (tasks/<task>/final.json), and the run's
headline is the mean of those Δs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rlbench.grader.targets import BEST_MODELS
from rlbench.recording.ledger import is_scored, is_submission

MULTI_MODE = "multi"


def member_mode(agent_mode: str | None) -> str:
    """A member's `mode` in the tables: multi for an agent in free mode, else multi/<its mode> (multi/sft-only)."""
    agent_mode = agent_mode or "free"
    return MULTI_MODE if agent_mode == "free" else f"{MULTI_MODE}/{agent_mode}"


def member_artifacts(artifacts: dict, run: dict, run_dir: Path, task: str) -> dict:
    """One task's artifacts.json: the run's, with that task's best submission (run.json best_by_task) and its
    snapshot (grader/best_models/<task>/) as `best` and `best_model`, what its final evaluation re-evaluates."""
    best = (run.get("best_by_task") or {}).get(task)
    model = Path(run_dir) / "grader" / BEST_MODELS / task
    return {
        **artifacts,
        "task": task,
        "best": best,
        "best_model": str(model) if best is not None and model.is_dir() else None,
        "joint_best": run.get("best"),
    }


def multi_block(group: str, tasks: list[str], finals: dict[str, dict], run: dict) -> dict:
    """summary.json's `multi` (a member's and the run's): the run's tasks, each one's Δ, their mean (None when a
    task has none: a task without a scored submission has no result), how many distinct checkpoints the tasks'
    bests are (1: one model is the best on every task), and the joint best: the submission with the best mean
    score over all the tasks among those evaluated on all of them, as the grader scored it (not re-evaluated)."""
    deltas = {task: (finals.get(task) or {}).get("delta") for task in tasks}
    known = [d for d in deltas.values() if d is not None]
    best_by_task = run.get("best_by_task") or {}
    joint = run.get("best") if isinstance(run.get("best"), dict) else None
    return {
        "group": group,
        "tasks": list(tasks),
        "deltas": deltas,
        "mean_delta": round(sum(known) / len(known), 4) if known and len(known) == len(tasks) else None,
        "distinct_best_models": len({b.get("fingerprint") for b in best_by_task.values() if isinstance(b, dict)}),
        "joint": None if joint is None else {
            "submission_id": joint.get("submission_id"),
            "mean_score": joint.get("score"),
            "mean_improvement": joint.get("improvement"),
            "re_evaluated": False,
        },
    }


def submission_targets(ledger: list[dict]) -> list[dict]:
    """Which tasks each submission asked for and was evaluated on (the mode audit's record of a multi-task run)."""
    return [
        {
            "submission_id": entry.get("submission_id"),
            "task": entry.get("task"),
            "evaluated": list(entry.get("tasks") or {}),
            "status": entry.get("status"),
        }
        for entry in ledger
        if is_submission(entry)
    ]


def run_summary(group: str, labels: dict, run: dict, members: dict[str, dict], ledger: list[dict]) -> dict:
    """The run-level summary.json of a multi-task run, from its members' summaries (tasks/<task>/summary.json)."""
    tasks = list(members)
    finals = {task: {"delta": summary.get("delta")} for task, summary in members.items()}
    targets = submission_targets(ledger)
    first = next(iter(members.values()), {})
    return {
        "labels": {**labels, "tasks": group},
        "mode": first.get("mode"),
        "scaffold": first.get("scaffold"),
        "driver": first.get("driver"),
        "status": run.get("status"),
        "budget_s": run.get("time_limit_s"),
        "duration_s": run.get("duration_s"),
        "tokens": first.get("tokens"),
        "cost_usd": first.get("cost_usd"),
        "submissions": len(targets),
        "scored_submissions": sum(1 for e in ledger if is_submission(e) and is_scored(e)),
        "targets": dict(Counter(t["task"] or "all" for t in targets)),
        "submission_targets": targets,
        "tasks": {
            task: {
                "level": summary.get("level"),
                "baseline": summary.get("baseline"),
                "best": summary.get("best"),
                "delta": summary.get("delta"),
                "best_submission": ((run.get("best_by_task") or {}).get(task) or {}).get("submission_id"),
                "submissions": summary.get("submissions"),
                "integrity": (summary.get("integrity") or {}).get("status"),
                "failure_type": summary.get("failure_type"),
            }
            for task, summary in members.items()
        },
        "multi": multi_block(group, tasks, finals, run),
    }


def run_markdown(summary: dict) -> str:
    """summary.md of a multi-task run: the per-task table and the run's headline figures."""
    labels = summary["labels"]
    multi = summary["multi"]
    lines = [
        f"# Multi-task run {labels.get('tasks')} / {labels.get('model')} / {labels.get('agent')} / seed {labels.get('seed')}",
        "",
        "One workspace, one base model, one budget for every task (this benchmark's arrangement of the paper's "
        "multi mode). Per task: the best submission on that task within the run, re-evaluated.",
        "",
        f"- status: {summary['status']}; budget {summary['budget_s']} s; duration {summary['duration_s']} s",
        f"- submissions: {summary['submissions']} ({summary['scored_submissions']} scored); targets: "
        + (", ".join(f"{k}: {v}" for k, v in sorted(summary["targets"].items())) or "none"),
        f"- mean Δ over the tasks: {_num(multi['mean_delta'])}",
        f"- distinct checkpoints among the tasks' bests: {multi['distinct_best_models']}",
    ]
    joint = multi.get("joint")
    if joint:
        lines.append(
            f"- joint best (best mean over all tasks, the grader's scores, not re-evaluated): submission "
            f"{joint['submission_id']}, mean score {_num(joint['mean_score'])}, mean improvement {_num(joint['mean_improvement'])}"
        )
    lines += ["", "| task | level | baseline | best | Δ | best submission | integrity |", "|---|---|---|---|---|---|---|"]
    for task, row in summary["tasks"].items():
        lines.append(
            f"| {task} | {row['level']} | {_num(row['baseline'])} | {_num(row['best'])} | {_num(row['delta'])} | "
            f"{row['best_submission'] if row['best_submission'] is not None else ''} | {row['integrity'] or ''} |"
        )
    return "\n".join(lines) + "\n"


def _num(value) -> str:
    return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)
