"""The audit records a submission that reaches scoring leaves: its copy of code/, that copy's commit, checkpoint.json.

They are the grader's copy of code/ (snapshots/NNNN/code), committed to the shadow repository
grader/code.git as "submission N" (the ledger's `code_revision`, null when git failed; see
rlbench.recording.repository), and snapshots/NNNN/checkpoint.json (the fingerprint, each checkpoint
file's size and sha256, config.json). An audit record never fails a submission: its failures are logged.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

from rlbench.fileio.jsonio import write_json
from rlbench.grader.snapshot import snapshot_code
from rlbench.recording.ledger import json_safe
from rlbench.recording.repository import CodeRepository

# checkpoint.json keeps config.json up to this size (null beyond: the fingerprint covers it anyway).
CHECKPOINT_CONFIG_MAX_BYTES = 1 << 20


def copy_code(workspace: Path, dest: Path) -> None:
    """The agent's code at submission time (small files only, bounded, no link followed:
    grader.snapshot.snapshot_code); an audit record, so its failures are logged, not raised."""
    try:
        snapshot_code(workspace, dest)
    except Exception:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)


def commit_code(
    repository: CodeRepository, submission_id: int, snapshot: Path, submitted_at: float | None
) -> str | None:
    """Commit the grader's copy of code/ (never the workspace itself) to grader/code.git as
    "submission N", dated when the submission was received; its sha, or None (logged) when git
    is missing or fails."""
    try:
        return repository.commit(snapshot, f"submission {submission_id}", submitted_at or time.time())
    except Exception as exc:  # noqa: BLE001 - RecordingError or a bug: an audit record only
        print(f"grader: submission {submission_id}: no code revision recorded: {exc}", file=sys.stderr)
        return None


def write_checkpoint_record(pending: Path, model_copy: Path, manifest: dict) -> None:
    """snapshots/NNNN/checkpoint.json: the fingerprint, each checkpoint file's name, size and
    sha256, and config.json (the copy's, already checked to be a JSON object); failures logged."""
    try:
        config_path = model_copy / "config.json"
        try:
            too_big = config_path.stat().st_size > CHECKPOINT_CONFIG_MAX_BYTES
            config = None if too_big else json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            config = None
        record = {**manifest, "config": config, "recorded_at": time.time()}
        write_json(pending / "checkpoint.json", json_safe(record))
    except Exception:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
