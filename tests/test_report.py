"""The leaderboard: one row per run, scores rounded by report.decimals, blanks for missing scores."""

from __future__ import annotations

import csv

from rlbench.fileio.jsonio import write_json
from rlbench.analysis.report import LEADERBOARD_COLUMNS, write_leaderboard


def summary(agent: str, best: float | None) -> dict:
    return {
        "labels": {"task": "gsm8k", "model": "tiny", "agent": agent, "seed": "0"},
        "level": "L1",
        "baseline": 12.3456,
        "best": best,
        "delta": None if best is None else best - 12.3456,
        "submissions": 0 if best is None else 2,
        "status": "completed" if best is not None else "timeout",
    }


def test_leaderboard_rounds_and_leaves_missing_scores_blank(tmp_path):
    paths = []
    for agent, best in (("sft", 20.0), ("grpo", None)):
        paths.append(tmp_path / f"{agent}.json")
        write_json(paths[-1], summary(agent, best))
    out = tmp_path / "leaderboard.csv"
    assert write_leaderboard(paths, out, decimals=1) == 2
    rows = {row["agent"]: row for row in csv.DictReader(open(out))}
    assert tuple(csv.DictReader(open(out)).fieldnames) == LEADERBOARD_COLUMNS
    assert rows["sft"]["baseline"] == "12.3" and rows["sft"]["delta"] == "7.7"
    assert rows["grpo"]["best"] == "" and rows["grpo"]["delta"] == "" and rows["grpo"]["status"] == "timeout"


def test_leaderboard_flags_deltas_inside_the_grader_noise_band(tmp_path):
    paths = []
    # deltas 0.3 (band 0.5: inside), 7.7 (band 0.5: outside), 0.3 with no band recorded (blank).
    for agent, best, noise in (("inside", 12.6456, {"band": 0.5}), ("outside", 20.0, {"band": 0.5}), ("unknown", 12.6456, None)):
        paths.append(tmp_path / f"{agent}.json")
        write_json(paths[-1], summary(agent, best) | {"grader_noise": noise})
    out = tmp_path / "leaderboard.csv"
    write_leaderboard(paths, out)
    rows = {row["agent"]: row for row in csv.DictReader(open(out))}
    assert LEADERBOARD_COLUMNS.index("within_noise") == LEADERBOARD_COLUMNS.index("grader_noise") + 1
    assert rows["inside"]["within_noise"] == "yes" and rows["inside"]["grader_noise"] == "0.5"
    assert rows["outside"]["within_noise"] == "no"
    assert rows["unknown"]["within_noise"] == "" and rows["unknown"]["grader_noise"] == ""


def test_the_leaderboard_says_which_protocol_and_baseline_each_row_is_in(tmp_path):
    """A score means what its protocol variant means: the leaderboard names it (blank when the task has
    none), the baseline Δ used and the mean of the baseline's repeats beside it."""
    from rlbench.analysis.report import leaderboard_row

    summary = {
        "labels": {"task": "webshop", "model": "m", "agent": "copy", "seed": "0"}, "level": "L3",
        "status": "completed", "submissions": 1, "baseline": 4.0, "baseline_choice": "mean", "baseline_mean": 4.0,
        "best": 4.5, "delta": 0.5, "eval_metrics": {"goals": "synthetic", "success_rate": 4.5},
        "decoding": {"temperature": 0.6},
    }
    row = leaderboard_row(summary)
    assert row["protocol"] == "goals=synthetic; decoding=sampled"
    assert (row["baseline"], row["baseline_choice"], row["baseline_mean"]) == (4.0, "mean", 4.0)
    plain = leaderboard_row({**summary, "eval_metrics": {"accuracy": 1.0}, "decoding": {"temperature": 0.0},
                             "baseline_choice": None, "baseline_mean": None})
    assert plain["protocol"] == "" and plain["baseline_choice"] == "first" and plain["baseline_mean"] == ""
