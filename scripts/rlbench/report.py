"""Tables regenerated from recorded runs."""

from __future__ import annotations

import csv
from pathlib import Path

from rlbench.jsonio import read_json

LEADERBOARD_COLUMNS = ("task", "level", "model", "agent", "seed", "baseline", "best", "delta", "submissions", "status")


def _number(value: float | None, decimals: int) -> float | str:
    return "" if value is None else round(value, decimals)


def leaderboard_row(summary: dict, decimals: int = 2) -> dict:
    labels = summary["labels"]
    return {
        "task": labels["task"],
        "level": summary["level"],
        "model": labels["model"],
        "agent": labels["agent"],
        "seed": labels["seed"],
        "baseline": _number(summary["baseline"], decimals),
        "best": _number(summary["best"], decimals),
        "delta": _number(summary["delta"], decimals),
        "submissions": summary["submissions"],
        "status": summary["status"],
    }


def write_leaderboard(summary_paths: list[Path], out: Path, decimals: int = 2) -> int:
    """leaderboard.csv from per-run summary.json files; returns the number of rows."""
    rows = [leaderboard_row(read_json(p), decimals) for p in summary_paths]
    rows.sort(key=lambda r: (r["task"], r["model"], r["agent"], int(r["seed"])))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=LEADERBOARD_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)
