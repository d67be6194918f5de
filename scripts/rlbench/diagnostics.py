"""Runtime recording and post-hoc summaries: artifacts, process metrics, per-iteration reports."""

from __future__ import annotations

import re
from pathlib import Path

from rlbench.jsonio import read_json, read_jsonl

# Route labels, checked in this order against the agent's code (SPEC §4).
ROUTE_PATTERNS = (
    ("GRPO", re.compile(r"GRPOTrainer|GRPOConfig|\bgrpo\b", re.I)),
    ("PPO", re.compile(r"PPOTrainer|PPOConfig|RLOOTrainer", re.I)),
    ("DPO", re.compile(r"DPOTrainer|ORPOTrainer|KTOTrainer|CPOTrainer|SimPO", re.I)),
    ("SFT", re.compile(r"SFTTrainer|SFTConfig|Trainer\(", re.I)),
)
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".json", ".toml", ".cfg", ".txt", ".md"}


def _code_files(code_dir: Path) -> list[Path]:
    if not code_dir.is_dir():
        return []
    return sorted(p for p in code_dir.rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES)


def detect_route(code_dir: Path) -> str:
    """SFT-only, GRPO, PPO, DPO or SFT+RL from the code; 'none' when there is no training code."""
    text = ""
    for path in _code_files(code_dir):
        if path.suffix in {".py", ".sh"} and path.stat().st_size < 2_000_000:
            text += path.read_text(errors="replace") + "\n"
    found = [label for label, pattern in ROUTE_PATTERNS if pattern.search(text)]
    rl = [label for label in found if label in ("GRPO", "PPO", "DPO")]
    if rl and "SFT" in found and re.search(r"SFTTrainer", text):
        return "SFT+RL"
    if rl:
        return rl[0]
    return "SFT-only" if "SFT" in found else "none"


def run_route(code_route: str, metrics: dict) -> str:
    """The run's route label: Copy when every valid submission was the base model, Placeholder/Missing
    when nothing valid was submitted, else what the code trains with."""
    valid = sum(score is not None for score in metrics["score_trajectory"])
    if valid == 0:
        return "Placeholder/Missing"
    if metrics["copy_model_count"] >= valid:
        return "Copy"
    return code_route


def collect_artifacts(run_dir: Path) -> dict:
    """What a run left behind: submissions, code, model versions, best checkpoint, logs."""
    workspace, grader = run_dir / "workspace", run_dir / "grader"
    run = read_json(run_dir / "run.json")
    ledger = list(read_jsonl(grader / "ledger.jsonl"))
    output = workspace / "output"
    versions = sorted(str(p.parent.relative_to(workspace)) for p in output.rglob("config.json")) if output.is_dir() else []
    best_model = grader / "best_model"
    log = workspace / "agent.log"
    return {
        "status": run["status"],
        "submissions": len(ledger),
        "valid_submissions": sum(e.get("score") is not None for e in ledger),
        "code_files": [str(p.relative_to(workspace)) for p in _code_files(workspace / "code")],
        "model_versions": versions,
        "best": run.get("best"),
        "best_model": str(best_model) if best_model.is_dir() else None,
        "snapshots": sorted(p.name for p in (grader / "snapshots").iterdir()) if (grader / "snapshots").is_dir() else [],
        "agent_log_bytes": log.stat().st_size if log.exists() else 0,
        "route": detect_route(workspace / "code"),
    }


def process_metrics(ledger: list[dict], run: dict, baseline_fingerprint: str | None) -> dict:
    """The process metrics of SPEC §4, from the ledger and run.json."""
    total = len(ledger)
    valid = [i for i, e in enumerate(ledger) if e.get("score") is not None]
    scores = [e.get("score") for e in ledger]
    improved = [e for e in ledger if (e.get("improvement") or 0) > 0]
    best = max((ledger[i] for i in valid), key=lambda e: e["score"], default=None)
    valid_scores = [ledger[i]["score"] for i in valid]
    steps = list(zip(valid_scores, valid_scores[1:]))
    last_submit = max((e["timestamp"] for e in ledger), default=None)
    return {
        "valid_submission_rate": len(valid) / total if total else None,
        "first_valid_idx": valid[0] + 1 if valid else None,
        "first_valid_delay": ledger[valid[0]]["elapsed_seconds"] if valid else None,
        "score_trajectory": scores,
        "time_to_first_improvement": improved[0]["elapsed_seconds"] if improved else None,
        "time_to_best": best["elapsed_seconds"] if best else None,
        "monotonic_ratio": sum(b >= a for a, b in steps) / len(steps) if steps else None,
        "copy_model_count": sum(
            1 for e in ledger if baseline_fingerprint and e.get("fingerprint") == baseline_fingerprint
        ),
        "time_used_ratio": run["duration_s"] / run["time_limit_s"] if run.get("time_limit_s") else None,
        "last_submit_gap": run["end_time"] - last_submit if last_submit is not None else None,
    }


def failure_type(run: dict, metrics: dict, final: dict) -> str | None:
    """None for a run that improved; else the SPEC §4 failure type that best explains it."""
    if final.get("delta") is not None and final["delta"] > 0:
        return None
    if metrics["first_valid_idx"] is None:
        if run["status"] == "timeout":
            return "timeout_no_submission"
        if run["status"] in ("failed", "error"):
            return "code_error_runtime"
        return "unknown"
    valid = [s for s in metrics["score_trajectory"] if s is not None]
    if metrics["copy_model_count"] and metrics["copy_model_count"] >= len(valid):
        return "copy_model_fallback"
    if final.get("delta") is not None and final["delta"] < 0:
        return "training_diverged"
    return "unknown"


def iterations(ledger: list[dict], run: dict, baseline_fingerprint: str | None, route: str) -> list[dict]:
    """summary.jsonl: one record per submission (an iteration of train -> submit)."""
    records, previous, best = [], run["start_time"], None
    for index, entry in enumerate(ledger, start=1):
        score = entry.get("score")
        if score is not None:
            best = score if best is None else max(best, score)
        is_copy = baseline_fingerprint is not None and entry.get("fingerprint") == baseline_fingerprint
        records.append(
            {
                "iteration": index,
                "timestamp": entry["timestamp"],
                "duration_s": round(entry["timestamp"] - previous, 3),
                "status": entry.get("status"),
                "exit_code": run.get("exit_code") if index == len(ledger) else None,
                "model_path": entry.get("model_path"),
                "score": score,
                "improvement": entry.get("improvement"),
                "best_so_far": best,
                "train_type": "Copy" if is_copy else (route if score is not None else "Placeholder/Missing"),
                "failure_type": entry.get("reason") if score is None else None,
                "error": entry.get("error"),
            }
        )
        previous = entry["timestamp"]
    return records


def summary_markdown(summary: dict, records: list[dict]) -> str:
    """summary.md: the run at a glance, then one section per iteration."""
    labels = summary["labels"]
    lines = [
        f"# {labels.get('task')} / {labels.get('model')} / {labels.get('agent')} / seed {labels.get('seed')}",
        "",
        f"- status: {summary['status']} (exit code {summary['exit_code']}), route: {summary['route']}",
        f"- baseline {summary['baseline']}, best {summary['best']}, delta {summary['delta']}",
        f"- submissions: {summary['submissions']} ({summary['valid_submissions']} valid), "
        f"failure type: {summary['failure_type']}",
        f"- time used: {summary['metrics']['time_used_ratio']}",
        "",
    ]
    for record in records:
        lines += [
            f"## Iteration {record['iteration']}: {record['model_path']}",
            "",
            f"- status: {record['status']}",
            f"- score {record['score']} | improvement {record['improvement']} | best so far {record['best_so_far']}",
            f"- training type: {record['train_type']}",
        ]
        if record["error"]:
            lines.append(f"- problem: {record['failure_type']}: {record['error']}")
        lines.append("")
    if not records:
        lines.append("No submission was made.")
    return "\n".join(lines) + "\n"
