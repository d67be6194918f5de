"""What a submission is evaluated on: the run's task, or in a multi-task run one or all of its tasks.

A single-task run has one target, its task (GraderConfig's own fields), and keeps the reference's request and
response exactly; an optional `"task"` naming that task (or `"all"`) is accepted, anything else is refused.
A multi-task run (GraderConfig.tasks) evaluates a submission on every task (`"task": "all"`, the default) or on
the one task it names, one evaluation after another; its response gives each task's numbers under `tasks` and
the mean over the tasks evaluated at the top level (`score`, `baseline_score`, `improvement`), with `summary`.
The grader keeps, per task, the best really scored submission's snapshot (grader/best_models/<task>/), what the
final evaluation of that task re-evaluates.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rlbench.fileio.jsonio import write_json
from rlbench.grader.submission import SubmissionRefused
from rlbench.recording.ledger import is_scored

ALL = "all"  # a multi-task submission's default target: every task of the run
BEST_MODELS = "best_models"  # grader/best_models/<task>/: the best snapshot of each task (multi-task runs)
BEST_BY_TASK = "best_by_task.json"


@dataclass
class TaskTarget:
    """One task a grader evaluates submissions on (a multi-task run has several; see GraderConfig.tasks)."""

    task_settings: dict
    eval_dir: Path
    baseline_score: float
    baseline_fingerprint: str
    # the base model's numbers on the task (score, primary_metric, metrics, n: tasks.base.public_metrics)
    baseline_metrics: dict = field(default_factory=dict)
    # tasks.base.EvalContext's resources for this task (judge, judgment cache, base_chat_template: required)
    resources: dict = field(default_factory=dict)
    partition: dict | None = None  # scoring.feedback split (GraderConfig.partition)
    baseline_final_metrics: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.task_settings["name"]


def requested_tasks(payload: dict, targets: dict[str, TaskTarget], multi: bool) -> list[str]:
    """The tasks a request asks to be evaluated on, in the run's order; refused (400) when `task` is not a string
    naming a task of the run or "all"."""
    task = payload.get("task", ALL)
    names = list(targets)
    allowed = ", ".join(repr(n) for n in [ALL, *names])
    if not isinstance(task, str):
        raise SubmissionRefused(400, "malformed_request", f'"task" must be a string: one of {allowed} (or leave it out)')
    if task == ALL:
        return names
    if task not in targets:
        shown = task if len(task) <= 80 else task[:80] + "..."
        what = "this multi-task run's tasks" if multi else "this run's task"
        raise SubmissionRefused(400, "unknown_task", f"unknown task {shown!r}: use one of {allowed} ({what}), or leave \"task\" out")
    return [task]


def combined(per_task: dict[str, dict]) -> dict:
    """A multi-task submission's top level from its tasks' numbers: the mean score, baseline and improvement over
    the tasks evaluated, and `summary` (which tasks, how many improved, the statistic)."""
    n = len(per_task)
    score = sum(t["score"] for t in per_task.values()) / n
    baseline = sum(t["baseline_score"] for t in per_task.values()) / n
    return {
        "score": round(score, 6),
        "baseline_score": round(baseline, 6),
        "summary": {
            "tasks": list(per_task),
            "improved": sum(1 for t in per_task.values() if t["score"] > t["baseline_score"]),
            "statistic": "mean",
        },
    }


def task_entry(numbers: dict, baseline_score: float, cached: bool) -> dict:
    """One task's part of a multi-task response (`tasks[<task>]`)."""
    return {
        **numbers,
        "score": float(numbers["score"]),
        "baseline_score": baseline_score,
        "improvement": round(float(numbers["score"]) - baseline_score, 6),
        "cached": cached,
    }


class BestPerTask:
    """Per task of a multi-task run, the best really scored submission: {task: {submission_id, model_path, score,
    improvement, fingerprint}} (grader/best_by_task.json), its snapshot hard-linked (else copied) to
    grader/best_models/<task>/. One snapshot may be the best of several tasks."""

    def __init__(self, grader_dir: Path):
        self.grader_dir = Path(grader_dir)
        self.best: dict[str, dict] = {}

    def update(self, entry: dict, snapshot: Path) -> None:
        """Promote `snapshot` (the entry's model copy) for every task it is now the best of."""
        if not is_scored(entry):
            return
        changed = False
        for name, numbers in (entry.get("tasks") or {}).items():
            current = self.best.get(name)
            if current is not None and numbers["score"] <= current["score"]:
                continue
            self._place(snapshot, self.grader_dir / BEST_MODELS / name)
            self.best[name] = {
                "submission_id": entry["submission_id"],
                "model_path": entry.get("model_path"),
                "score": numbers["score"],
                "improvement": numbers["improvement"],
                "fingerprint": entry.get("fingerprint"),
            }
            changed = True
        if changed:
            write_json(self.grader_dir / BEST_BY_TASK, self.best)

    @staticmethod
    def _place(snapshot: Path, dest: Path) -> None:
        staging = dest.with_name(dest.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        for source in sorted(snapshot.rglob("*")):
            target = staging / source.relative_to(snapshot)
            if source.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
        staging.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
