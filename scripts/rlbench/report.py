"""Tables regenerated from recorded runs."""

from __future__ import annotations

import csv
from pathlib import Path

from rlbench.jsonio import read_json

LEADERBOARD_COLUMNS = ("task", "level", "model", "agent", "seed", "baseline", "best", "delta", "submissions", "status")


def leaderboard_row(summary: dict) -> dict:
    labels = summary["labels"]
    return {
        "task": labels["task"],
        "level": summary["level"],
        "model": labels["model"],
        "agent": labels["agent"],
        "seed": labels["seed"],
        "baseline": summary["baseline"],
        "best": "" if summary["best"] is None else summary["best"],
        "delta": "" if summary["delta"] is None else summary["delta"],
        "submissions": summary["submissions"],
        "status": summary["status"],
    }


def write_leaderboard(summary_paths: list[Path], out: Path) -> int:
    """leaderboard.csv from per-run summary.json files; returns the number of rows."""
    rows = [leaderboard_row(read_json(p)) for p in summary_paths]
    rows.sort(key=lambda r: (r["task"], r["model"], r["agent"], int(r["seed"])))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=LEADERBOARD_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)
