"""A run's integrity verdict (rlbench.integrity.verdict) and how it reaches the tables: the
leaderboard's integrity column, summary.md, and report.flagged (keep | baseline | drop)."""

from __future__ import annotations

import pytest

from rlbench.analysis.catalogue import build_tables
from rlbench.analysis.report import leaderboard_row
from rlbench.analysis.stats import apply_flag_policy, integrity_text
from rlbench.integrity.verdict import run_integrity
from rlbench.summaries.summary import integrity_summary

PLANTED = {
    "flagged": [
        {"item": f"heldout-{i}", "score": 1.0, "where": {"kind": "code_revision", "revision": "a1b2c3d4e5f6", "path": "data/train.jsonl"}}
        for i in range(5)
    ],
    "training_split": {"flagged": []},
}
RECITED = {"flagged": [{"item": "heldout-7", "score": 0.93, "where": {"kind": "transcript", "turn": 12}}]}


def test_the_verdict_names_what_was_found_and_where():
    clean = run_integrity({"flagged": []}, {"verdict": "descends from the base"}, None)
    assert clean["status"] == "clean" and clean["label"] == "clean" and clean["reasons"] == []
    planted = run_integrity(PLANTED, {"verdict": "descends from the base"}, None)
    assert planted["status"] == "flagged"
    assert planted["reasons"] == ["contamination (5 held-out items: code revision a1b2c3d4e5 data/train.jsonl)"]
    recited = run_integrity(RECITED, None, None)
    assert recited["label"] == "flagged: contamination (1 held-out item: transcript turn 12)"
    unrelated = run_integrity({"flagged": []}, {"verdict": "unrelated", "reason": "another vocabulary"}, None)
    assert unrelated["reasons"] == ["lineage: the best submission is unrelated to the base model (another vocabulary)"]
    split = run_integrity({"flagged": [], "training_split": RECITED}, None, None)  # the split's, not the run's
    assert split["status"] == "clean" and split["split_notes"][0].startswith("the training split itself holds 1 held-out item")
    # The agent's copy of the benchmark's training data, which holds that item: still the split's fault.
    copied = [{**RECITED["flagged"][0], "in_training_split": True}]
    assert run_integrity({"flagged": copied, "training_split": RECITED}, None, None)["status"] == "clean"


def test_a_failed_judge_or_a_check_that_did_not_run_is_never_clean():
    failed = run_integrity({"flagged": []}, None, {"verdicts": [], "judge_failed": 2})
    assert failed["status"] == "incomplete" and failed["label"] == "incomplete: the trace judge failed 2 times"
    assert run_integrity(None, None, None)["status"] == "incomplete"
    judged = run_integrity({"flagged": []}, None, {"verdicts": [{"kind": "outside_api", "flagged": True}], "judge_failed": 0})
    assert judged["status"] == "flagged" and judged["reasons"] == ["trace judge: outside_api"]
    unsupported = {"verdicts": [{"kind": "contamination", "flagged": True, "supported": False}], "judge_failed": 0}
    assert run_integrity({"flagged": []}, None, unsupported)["reasons"] == [
        "trace judge: contamination (evidence not found in the trace)"]
    undetermined = run_integrity({"flagged": []}, {"verdict": "undetermined", "reason": "only pickle weights"}, None)
    assert undetermined["label"] == "incomplete: lineage undetermined (only pickle weights)"


def _summary(agent: str, seed: str, integrity: dict | None, best: float) -> dict:
    return {
        "labels": {"task": "gsm8k", "model": "m", "agent": agent, "seed": seed}, "level": "L1", "status": "completed",
        "submissions": 1, "baseline": 10.0, "best": best, "delta": best - 10.0, "primary_metric": "accuracy",
        "integrity": integrity_summary(integrity),
    }


def test_flagged_runs_enter_the_tables_as_report_flagged_says():
    clean = _summary("sft", "0", run_integrity({"flagged": []}, None, None), 12.0)
    flagged = _summary("claude", "0", run_integrity(PLANTED, None, None), 40.0)
    assert integrity_text(clean) == "clean" and integrity_text(flagged).startswith("flagged: contamination (5")
    assert leaderboard_row(flagged)["integrity"] == integrity_text(flagged) and leaderboard_row(flagged)["best"] == 40.0
    assert integrity_text({"labels": {}}) == ""  # summarized before the audit existed
    kept, note = apply_flag_policy([clean, flagged], "keep")
    assert kept == [clean, flagged] and "kept as scored" in note[0] and "gsm8k/m/claude/0" in note[0]
    rescored, note = apply_flag_policy([clean, flagged], "baseline")
    assert rescored[1]["best"] == 10.0 and rescored[1]["delta"] == 0.0 and rescored[0] is clean and "base model" in note[0]
    dropped, note = apply_flag_policy([clean, flagged], "drop")
    assert dropped == [clean] and "left out" in note[0]
    assert apply_flag_policy([clean], "drop") == ([clean], [])
    with pytest.raises(ValueError, match="keep, baseline, drop"):
        apply_flag_policy([clean], "hide")
    for policy, best in (("keep", 40.0), ("baseline", 10.0), ("drop", None)):
        table = build_tables([clean, flagged], {"flagged": policy})["leaderboard_paper"]
        claude = [r for r in table.rows if r["agent"] == "claude"]
        assert (claude[0]["gsm8k"] if claude else None) == best
        assert any(note.startswith("Integrity: 1 flagged run") for note in table.notes)
