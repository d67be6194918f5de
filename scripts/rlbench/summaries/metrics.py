"""The process metrics of a run and the run_meta times they are computed from.

Two sets of process metrics, kept apart so that a paper name never carries another meaning:

* `paper_metrics` -> summary.json["metrics"]: the ten process metrics of SPEC §4, computed as the
  reference harness (RD-Agent AutoRL-Bench, rdagent/scenarios/rl/autorl_bench/core/metrics.py,
  `compute_metrics`) computes them, over the submissions it would record in scores.json
  (`ledger.is_submission`), in ledger order.
* `extra_metrics` -> summary.json["metrics_extra"]: ours, under names the paper does not use
  (validity by grader status, copies by weight fingerprint, non-strict monotonicity...).
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path

from rlbench.fileio.jsonio import read_json
from rlbench.recording.ledger import is_scored
from rlbench.summaries.submissions import entry_score, finished_at, is_base_path, is_base_weights


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


def load_run_meta(workspace: Path, run: dict, submissions: list[dict], grader: Path | None = None) -> dict:
    """start_time, timeout_s, last_submit_time, end_time as the reference reads them from
    run_meta.json (int unix seconds; end_time = when the run actually ended). A field the file
    lacks comes from run.json (truncated to int, as the reference stores it) or, for
    last_submit_time, from the last recorded submission's finish time.

    The file read is the grader's own record (grader/run_meta.json, written by Grader.finish); the
    workspace's copy is the agent's to change (forge, or replace by a directory or a FIFO), and is
    read only for runs recorded before that record existed, and only when it is a regular file."""
    meta = _json_object_file(Path(grader) / "run_meta.json") if grader is not None else None
    if meta is None:
        meta = _json_object_file(Path(workspace) / "run_meta.json") or {}
    finishes = [t for t in (finished_at(e) for e in submissions) if t is not None]
    fallback = {
        "start_time": _int_or_none(run.get("start_time")),
        "timeout_s": _int_or_none(run.get("time_limit_s")),
        "end_time": _int_or_none(run.get("end_time")),
        "last_submit_time": int(max(finishes)) if finishes else None,
    }
    return {key: _int_or_none(meta.get(key)) if meta.get(key) is not None else value for key, value in fallback.items()}


def _json_object_file(path: Path) -> dict | None:
    """A JSON object from a regular file at path (not a link, directory or FIFO), else None."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        meta = read_json(path)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def paper_metrics(
    submissions: list[dict],
    run_meta: dict,
    baseline_score: float | None,
    workspace: Path,
    base_model: str | None,
) -> dict:
    """The ten process metrics exactly as core/metrics.py `compute_metrics` defines them.

    submissions: the recorded submissions (`recorded_submissions`), in order. base_model: the base
    model's directory relative to the workspace (models/<hf_id>). Delays are whole seconds since
    run_meta's start_time, truncated with int() as the reference does."""
    scores = [entry_score(e) for e in submissions]  # metrics.py:35, failed entries score 0.0
    start, end = run_meta.get("start_time"), run_meta.get("end_time")
    timeout_s, last_submit = run_meta.get("timeout_s"), run_meta.get("last_submit_time")

    def delay(entry: dict) -> int | None:
        finished = finished_at(entry)
        return None if finished is None else int(finished - start)

    valid = [s for s in scores if s and s > 0]  # metrics.py:37: valid = score > 0
    first_valid_idx = next((i for i, s in enumerate(scores, start=1) if s and s > 0), None)  # :40-44
    time_to_first_improvement = None
    if baseline_score is not None and start:  # :59-65: the first entry above the baseline, then stop
        for entry, score in zip(submissions, scores):
            if score > baseline_score:
                time_to_first_improvement = delay(entry)
                break
    time_to_best = None
    if start and submissions:  # :86-90: max() keeps the first of tied best scores
        best_index = max(range(len(scores)), key=lambda i: scores[i])
        time_to_best = delay(submissions[best_index])
    copy_model_count = None
    if base_model:  # :72-79
        copy_model_count = sum(1 for e in submissions if is_base_path(e, workspace, base_model))
    return {
        "valid_submission_rate": len(valid) / len(scores) if scores else None,  # :38
        "first_valid_idx": first_valid_idx,
        "first_valid_delay": delay(submissions[first_valid_idx - 1]) if start and first_valid_idx else None,  # :52-56
        "score_trajectory": scores,  # :100
        "time_to_first_improvement": time_to_first_improvement,
        "time_to_best": time_to_best,
        # :67-70: strict increases over all consecutive entries / (n - 1); None under 2 entries
        "monotonic_ratio": (
            sum(1 for a, b in zip(scores, scores[1:]) if b > a) / (len(scores) - 1) if len(scores) >= 2 else None
        ),
        "copy_model_count": copy_model_count,
        "time_used_ratio": (end - start) / timeout_s if start and end and timeout_s else None,  # :81-83
        "last_submit_gap": int(end - last_submit) if end and last_submit else None,  # :92-94
    }


def extra_metrics(
    ledger: list[dict],
    submissions: list[dict],
    baseline_score: float | None,
    baseline_fingerprint: str | None,
) -> dict:
    """Our process metrics, under names the paper does not use.

    scored_* : validity by grader status (scored or cached: a real evaluation of the submitted
    weights) instead of score > 0; copy_weights_count: submissions whose weights equal the base
    model's (fingerprint), wherever they were saved; nondecreasing_ratio: b >= a over consecutive
    scored submissions only; *_since_start_s: when the submission was made (since_start_s)."""
    scored = [(i, e) for i, e in enumerate(submissions, start=1) if is_scored(e)]
    scored_scores = [entry_score(e) for _, e in scored]
    best = max(scored, key=lambda pair: entry_score(pair[1]), default=None)
    first_improvement = next(
        (i for i, e in scored if baseline_score is not None and entry_score(e) > baseline_score), None
    )
    steps = list(zip(scored_scores, scored_scores[1:]))
    return {
        "requests": len(ledger),
        # Requests that are not submissions (ledger.is_submission): request errors, repeats, grader errors.
        "refused_requests": len(ledger) - len(submissions),
        "status_counts": dict(Counter(e.get("status") or "unknown" for e in submissions)),
        "scored_submissions": len(scored),
        "scored_submission_rate": len(scored) / len(submissions) if submissions else None,
        "first_scored_idx": scored[0][0] if scored else None,
        "first_scored_since_start_s": scored[0][1].get("since_start_s") if scored else None,
        "first_improvement_idx": first_improvement,
        "best_scored_idx": best[0] if best else None,
        "best_scored_since_start_s": best[1].get("since_start_s") if best else None,
        "nondecreasing_ratio": sum(1 for a, b in steps if b >= a) / len(steps) if steps else None,
        "copy_weights_count": sum(1 for e in submissions if is_base_weights(e, baseline_fingerprint)),
    }
