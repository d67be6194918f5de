"""Tables regenerated from recorded runs."""

from __future__ import annotations

import csv
from pathlib import Path

from rlbench.analysis.stats import (
    integrity_text,
    noise_band,
    number,
    protocol_text,
    run_multi,
    seed_order,
    within_noise,
)
from rlbench.fileio.jsonio import read_json

# scaffold: the coding-agent tool (claude-code, codex, ...) or "reference" for the scripted reference agents;
# driver: the driver LLM's model name (blank for reference agents).
# mode: the agent's operating mode (free, sft-only, rl-only); mode_violation: "yes" when the
# recorded code broke it (summary.json mode_audit), blank for runs summarized before the audit.
# metric: the primary metric baseline, best and delta are in; grader_noise: the task's grader-noise band
# (± points, half the range of K baseline evaluations; 0 for a deterministic grader, blank when unknown);
# within_noise: "yes" when |delta| <= grader_noise (rlbench.analysis.stats.within_noise), blank when either is unknown.
# integrity: the audit's verdict (integrity.json): "clean", "flagged: <reasons>" (held-out items in what the
# agent wrote or its driver said, a best submission unrelated to the base model, a trace judge's verdict) or
# "incomplete: <check that did not run>"; blank for runs summarized before the audit. The leaderboard lists
# flagged runs as scored whatever report.flagged says (that setting is the paper tables').
# protocol: which variant of the task's protocol the scores are in (rlbench.analysis.stats.protocol_labels:
# e.g. "goals=synthetic", "annotator=reference_gpt52_fn; lc_method=length_controlled_v1", "decoding=sampled");
# blank for a task without variants.
# baseline: the score delta is computed against; baseline_choice: which one it is (config evaluation.baseline_score:
# "first", the first evaluation, as the reference; "mean", the mean of the K repeats); baseline_mean: that mean
# (blank for runs summarized before it was recorded).
# clean_delta, oracle_delta, selection_gap: runs graded with a final split (config scoring.feedback: split; blank in
# full mode, the reference's): baseline, best and delta are then on the feedback split /submit reported on (delta is
# the paper's Δ there); clean_delta is the same submission's final-split score minus the base model's there (no
# selection on it), oracle_delta the best final-split score the grader recorded for any submission minus the base
# model's, selection_gap = delta - clean_delta (how much picking on the reported scores inflated Δ); their noise bands
# are in summary.json (*_band; evaluation.evaluate.delta_family).
# multi: the multi-task run a row belongs to (its tasks sorted and joined by +, e.g. "alfworld+alpaca-eval+gsm8k"):
# such a run has a row per task (its member summaries, mode multi or multi/<the agent's mode>); blank for a
# single-task run. Last, so that the columns before it keep their places.
LEADERBOARD_COLUMNS = (
    "task",
    "level",
    "metric",
    "protocol",
    "model",
    "agent",
    "scaffold",
    "driver",
    "mode",
    "seed",
    "baseline",
    "baseline_choice",
    "baseline_mean",
    "best",
    "delta",
    "clean_delta",
    "oracle_delta",
    "selection_gap",
    "grader_noise",
    "within_noise",
    "submissions",
    "status",
    "mode_violation",
    "integrity",
    "multi",
)


def _number(value: float | None, decimals: int) -> float | str:
    return "" if value is None else round(value, decimals)


def _violation(summary: dict) -> str:
    audit = summary.get("mode_audit")
    return "" if not isinstance(audit, dict) else "yes" if audit.get("violation") else "no"


def _noise_flag(summary: dict) -> str:
    flag = within_noise(number(summary.get("delta")), noise_band(summary))
    return "" if flag is None else "yes" if flag else "no"


def leaderboard_row(summary: dict, decimals: int = 2) -> dict:
    labels = summary["labels"]
    return {
        "task": labels["task"],
        "level": summary["level"],
        "metric": summary.get("primary_metric") or "",
        "protocol": protocol_text(summary),
        "model": labels["model"],
        "agent": labels["agent"],
        "scaffold": summary.get("scaffold") or "reference",
        "driver": summary.get("driver") or "",
        "mode": summary.get("mode") or "",
        "seed": labels["seed"],
        "baseline": _number(number(summary.get("baseline")), decimals),
        "baseline_choice": summary.get("baseline_choice") or "first",
        "baseline_mean": _number(number(summary.get("baseline_mean")), decimals),
        "best": _number(number(summary.get("best")), decimals),
        "delta": _number(number(summary.get("delta")), decimals),
        "clean_delta": _number(number(summary.get("clean_delta")), decimals),
        "oracle_delta": _number(number(summary.get("oracle_delta")), decimals),
        "selection_gap": _number(number(summary.get("selection_gap")), decimals),
        "grader_noise": _number(noise_band(summary), decimals),
        "within_noise": _noise_flag(summary),
        "submissions": summary["submissions"],
        "status": summary["status"],
        "mode_violation": _violation(summary),
        "integrity": integrity_text(summary),
        "multi": run_multi(summary),
    }


def write_leaderboard(summary_paths: list[Path], out: Path, decimals: int = 2) -> int:
    """leaderboard.csv from per-run summary.json files; returns the number of rows."""
    return write_leaderboard_rows([read_json(p) for p in summary_paths], out, decimals)


def write_leaderboard_rows(summaries: list[dict], out: Path, decimals: int = 2) -> int:
    """leaderboard.csv from per-run summaries already read; returns the number of rows."""
    rows = [leaderboard_row(summary, decimals) for summary in summaries]
    rows.sort(key=lambda r: (r["task"], r["model"], r["agent"], r["mode"], r["multi"], seed_order(r["seed"])))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=LEADERBOARD_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)
