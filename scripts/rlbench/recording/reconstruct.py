"""A run reconstructed from its record alone: prompt, transcript, each request the grader recorded with
its code revision and checkpoint, the resource trace summary and the final evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlbench.fileio.jsonio import read_jsonl
from rlbench.recording.repository import CODE_GIT, CodeRepository, RecordingError, code_revisions
from rlbench.recording.trace import summarize_trace

PROMPT_MAX_CHARS = 100_000


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ledger(path: Path) -> list[dict]:
    """The ledger's entries (jsonio.read_jsonl: a torn last line is skipped, a corrupt one elsewhere raises)."""
    return list(read_jsonl(path)) if path.is_file() else []


def reconstruct(run_dir: Path) -> dict:
    """A run as its record under results/runs/... tells it: the agent's prompt
    (agent/prompt.md), its transcript (gateway/transcript.jsonl: path and size), and for every
    request the grader recorded, its outcome with the code revision (code.git: sha and files) and
    the checkpoint (snapshots/NNNN/checkpoint.json); then the resource trace summary and the final
    evaluation. `missing` names the records that are not there."""
    run_dir = Path(run_dir)
    grader = run_dir / "grader"
    missing = []
    prompt_path = run_dir / "agent" / "prompt.md"
    prompt = None
    if prompt_path.is_file():
        text = prompt_path.read_text(errors="replace")
        prompt = {"path": str(prompt_path), "chars": len(text), "text": text[:PROMPT_MAX_CHARS]}
    else:
        missing.append("agent/prompt.md")
    transcript_path = run_dir / "gateway" / "transcript.jsonl"
    transcript = None
    if transcript_path.is_file():
        with open(transcript_path, "rb") as handle:
            lines = sum(1 for line in handle if line.strip())
        transcript = {"path": str(transcript_path), "records": lines, "bytes": transcript_path.stat().st_size}
    else:
        missing.append("gateway/transcript.jsonl")
    ledger_path = grader / "ledger.jsonl"
    if not ledger_path.is_file():
        missing.append("grader/ledger.jsonl")
    repo = CodeRepository(grader / CODE_GIT)
    revisions = code_revisions(grader)
    if not revisions:
        missing.append(f"grader/{CODE_GIT}")
    by_sha = {r["sha"]: r for r in revisions}
    submissions = []
    for entry in _ledger(ledger_path):
        if entry.get("pending"):
            continue
        sid = entry.get("submission_id")
        revision = entry.get("code_revision")
        code = None
        if revision and revision in by_sha:
            try:
                code = [f["path"] for f in repo.files(revision)]
            except RecordingError:
                code = None
        checkpoint = (
            _json_or_none(grader / "snapshots" / f"{sid:04d}" / "checkpoint.json") if isinstance(sid, int) else None
        )
        submissions.append(
            {
                "submission_id": sid,
                "submitted_at": entry.get("submitted_at"),
                "since_start_s": entry.get("since_start_s"),
                "model_path": entry.get("model_path"),
                "status": entry.get("status"),
                "reason": entry.get("reason"),
                "score": entry.get("score"),
                "improvement": entry.get("improvement"),
                "error": entry.get("error"),
                "code_revision": revision,
                "code_files": code,
                "checkpoint": (
                    None
                    if checkpoint is None
                    else {
                        "fingerprint": checkpoint.get("fingerprint"),
                        "files": len(checkpoint.get("files") or []),
                        "bytes": sum(f.get("size", 0) for f in checkpoint.get("files") or []),
                    }
                ),
            }
        )
    run = _json_or_none(run_dir / "run.json") or {}
    manifest = _json_or_none(run_dir / "workspace.json") or {}
    final = _json_or_none(run_dir / "final.json")
    return {
        "run_dir": str(run_dir),
        "labels": run.get("labels"),
        "status": run.get("status"),
        "exit_code": run.get("exit_code"),
        "start_time": run.get("start_time"),
        "end_time": run.get("end_time"),
        "mode": manifest.get("mode"),
        "prompt": prompt,
        "transcript": transcript,
        "submissions": submissions,
        "code_revisions": revisions,
        "resources": summarize_trace(run_dir / "resources.jsonl", run.get("gpus")),
        "final": None if final is None else {k: final.get(k) for k in ("score", "baseline_score", "delta")},
        "missing": missing,
    }
