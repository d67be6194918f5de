"""Synthetic ledgers, run records and code directories for the analysis tests (no model, no grader)."""

from __future__ import annotations

from pathlib import Path

from rlbench.fileio.jsonio import append_jsonl, write_json
from rlbench.recording.ledger import iso_timestamp

START = 1_700_000_000  # run_meta start_time (int, as the reference stores it)
BASELINE = 40.0
BASE_FP = "b" * 64
BASE = "models/org/base"  # the base model's directory in the workspace
META = {"start_time": START, "timeout_s": 3600, "end_time": START + 1800, "last_submit_time": START + 1500}
PAPER_NAMES = [
    "valid_submission_rate",
    "first_valid_idx",
    "first_valid_delay",
    "score_trajectory",
    "time_to_first_improvement",
    "time_to_best",
    "monotonic_ratio",
    "copy_model_count",
    "time_used_ratio",
    "last_submit_gap",
]


def entry(sid, at, score=0.0, status="scored", path=None, fp=None, reason=None, error=None, **extra):
    """A ledger entry in the new field meanings; its evaluation finished `at` s after START."""
    finished = START + at
    record = {
        "submission_id": sid,
        "timestamp": iso_timestamp(finished),
        "submitted_at": finished - 10,
        "responded_at": finished,
        "since_start_s": round(at - 10, 3),
        "model_path": path or f"output/v{sid}",
        "score": score,
        "baseline_score": BASELINE,
        "improvement": round(score - BASELINE, 4),
        "elapsed_seconds": 10.0,
        "status": status,
        "fingerprint": fp if fp is not None else (f"{sid:064x}" if status in ("scored", "cached") else None),
        "error": error,
    }
    if reason:
        record["reason"] = reason
    record.update(extra)
    return record


def failed(sid, at, **kw):
    return entry(sid, at, 0.0, status="failed", reason="evaluation_failed", error="CUDA error: device-side assert", **kw)


def refused(sid, at, reason, **kw):
    return entry(sid, at, 0.0, status="refused", reason=reason, error=f"refused: {reason}", **kw)


def code(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    root = tmp_path / name
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def make_run(tmp_path: Path, ledger: list[dict], snapshots: dict[int, dict[str, str]], final_code: dict[str, str]):
    run_dir = tmp_path / "runs" / "gsm8k" / "tiny" / "agent" / "0"
    ws, grader = run_dir / "workspace", run_dir / "grader"
    (ws / BASE).mkdir(parents=True)
    (ws / BASE / "config.json").write_text("{}")
    code(ws, "code", final_code)
    write_json(ws / "run_meta.json", META)
    grader.mkdir(parents=True)
    (grader / "ledger.jsonl").touch()
    for e in ledger:
        append_jsonl(grader / "ledger.jsonl", e)
    for sid, files in snapshots.items():
        code(grader / "snapshots" / f"{sid:04d}", "code", files)  # model/ deleted for non-best entries
    run = {
        "status": "timeout",
        "exit_code": -15,
        "timed_out": True,
        "start_time": START + 0.4,
        "end_time": START + 1800.2,
        "time_limit_s": 3600.0,
        "labels": {"task": "gsm8k", "model": "tiny", "agent": "agent", "seed": 0},
        "best": None,
    }
    write_json(run_dir / "run.json", run)
    return run_dir, run

