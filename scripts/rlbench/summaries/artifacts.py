"""What a run left behind, collected for artifacts.json: its submissions, code, base model, the model
versions under output/ (fingerprinted without following a link), snapshots, logs, and the records of
runtime recording (final workspace state, code revisions, resource trace summary).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rlbench.fileio import nofollow
from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.grader.fingerprint import workspace_checkpoint_manifest
from rlbench.recording.ledger import is_scored
from rlbench.recording.repository import code_revisions
from rlbench.recording.trace import summarize_trace
from rlbench.recording.workspace_state import workspace_usage
from rlbench.summaries.agent_code import code_files, final_code_methods
from rlbench.summaries.routes import MISSING, route_of
from rlbench.summaries.submissions import recorded_submissions

# collect_artifacts: the model versions under output/ (directories holding a checkpoint), found
# without following a link: at most this many, in a walk of at most this many entries, and the
# bytes read to fingerprint them all (beyond: listed with sizes, fingerprint null).
MODEL_VERSIONS_MAX = 200
OUTPUT_WALK_MAX_ENTRIES = 100_000
OUTPUT_WALK_MAX_DEPTH = 8
MODEL_HASH_MAX_BYTES = 32 << 30
# Files of the final workspace listed one by one in artifacts.json (all are counted).
FINAL_LISTING_MAX = 2000


def base_model_dir(workspace: Path, base_model: str | None = None) -> str | None:
    """models/<hf_id> relative to the workspace: as given, else the one model under models/."""
    if base_model:
        return base_model
    models = Path(workspace) / "models"
    found = sorted({p.parent for p in models.rglob("config.json")}) if models.is_dir() else []
    return str(found[0].relative_to(workspace)) if len(found) == 1 else None


def _checkpoint_dirs(workspace: Path) -> tuple[list[Path], bool]:
    """The directories under workspace/output that hold a checkpoint (a config.json or a
    *.safetensors regular file directly inside), found without following a link, sorted; and
    whether the search stopped early (OUTPUT_WALK_MAX_ENTRIES, MODEL_VERSIONS_MAX)."""
    root = Path(os.path.realpath(workspace))
    try:
        top = nofollow.open_directory_inside(root, root / "output")
    except (OSError, ValueError):
        return [], False
    found: set[Path] = set()
    truncated = False
    try:
        walk = nofollow.walk(top, OUTPUT_WALK_MAX_DEPTH, skip_unreadable=True)
        try:
            for count, entry in enumerate(walk, 1):
                if count > OUTPUT_WALK_MAX_ENTRIES or len(found) > MODEL_VERSIONS_MAX:
                    truncated = True
                    break
                weights = entry.name == "config.json" or entry.name.endswith(".safetensors")
                if weights and stat.S_ISREG(entry.st.st_mode):
                    found.add(root / "output" / entry.rel.parent)
        finally:
            walk.close()
    finally:
        os.close(top)
    dirs = sorted(found, key=lambda p: p.relative_to(root).parts)
    return dirs[:MODEL_VERSIONS_MAX], truncated or len(dirs) > MODEL_VERSIONS_MAX


def model_versions(workspace: Path, ledger: list[dict] | None = None, max_bytes: int = MODEL_HASH_MAX_BYTES) -> dict:
    """Every checkpoint directory under workspace/output: path (relative to the workspace), files
    (name, size, sha256), bytes, the fingerprint the grader would give it (grader.fingerprint, no link
    followed; null when over the byte budget or when a file was a link or unreadable: see
    skipped/truncated), and the submissions whose weights it holds (`submitted_as`, by fingerprint)."""
    workspace = Path(workspace)
    root = Path(os.path.realpath(workspace))
    dirs, truncated = _checkpoint_dirs(workspace)
    by_fingerprint: dict[str, list[int]] = {}
    for entry in ledger or []:
        if entry.get("fingerprint") and isinstance(entry.get("submission_id"), int):
            by_fingerprint.setdefault(entry["fingerprint"], []).append(entry["submission_id"])
    versions, left = [], max_bytes
    for directory in dirs:
        manifest = workspace_checkpoint_manifest(workspace, directory, max_bytes=max(left, 0))
        left -= manifest["bytes"]
        versions.append(
            {
                "path": str(directory.relative_to(root)),
                "files": manifest["files"],
                "bytes": manifest["bytes"],
                "fingerprint": manifest["fingerprint"],
                "skipped": manifest["skipped"],
                "truncated": manifest["truncated"],
                "submitted_as": by_fingerprint.get(manifest["fingerprint"], []) if manifest["fingerprint"] else [],
            }
        )
    return {"versions": versions, "truncated": truncated}


def model_version_count(workspace: Path) -> int:
    """How many model versions the workspace left under output/: the checkpoint directories
    (_checkpoint_dirs, no link followed) holding a config.json regular file, as artifacts.json
    lists them in `model_versions`; nothing is read or hashed."""
    count = 0
    for directory in _checkpoint_dirs(Path(workspace))[0]:
        try:
            count += stat.S_ISREG(os.lstat(directory / "config.json").st_mode)
        except OSError:
            pass
    return count


def collect_artifacts(run_dir: Path, manifest: dict | None = None) -> dict:
    """What a run left behind: submissions, code, model versions, best checkpoint, logs; and the
    records of runtime recording: the final state of the workspace (files and bytes per top-level
    directory, the first FINAL_LISTING_MAX files), every model version under output/ (models), the
    code revisions (grader/code.git), the resource trace summary (resources.jsonl)."""
    workspace, grader = run_dir / "workspace", run_dir / "grader"
    run = read_json(run_dir / "run.json")
    ledger_path = grader / "ledger.jsonl"
    ledger = list(read_jsonl(ledger_path)) if ledger_path.exists() else []
    submissions = recorded_submissions(ledger)
    best_model = grader / "best_model"
    log = workspace / "agent.log"
    models = model_versions(workspace, ledger)
    final_methods = final_code_methods(workspace)
    return {
        "status": run["status"],
        "requests": len(ledger),
        "submissions": len(submissions),
        "scored_submissions": sum(1 for e in submissions if is_scored(e)),
        "base_model": base_model_dir(workspace, (manifest or {}).get("model")),
        "code_files": [str(p.relative_to(workspace)) for p in code_files(workspace / "code")],
        # Directories under output/ holding a config.json (no link followed); `models` has the detail.
        "model_versions": [
            v["path"] for v in models["versions"] if any(f["name"] == "config.json" for f in v["files"])
        ],
        "best": run.get("best"),
        "best_model": str(best_model) if best_model.is_dir() else None,
        "snapshots": sorted(p.name for p in (grader / "snapshots").iterdir()) if (grader / "snapshots").is_dir() else [],
        "agent_log_bytes": log.stat().st_size if log.exists() else 0,
        "final_code_route": route_of(final_methods) or MISSING,
        # Ours, runtime recording:
        "mode": (manifest or {}).get("mode"),
        "final_state": workspace_usage(workspace, listing=FINAL_LISTING_MAX),
        "models": models,
        "code_revisions": [
            {"sha": r["sha"], "submission": r["submission"], "time": r["time"]} for r in code_revisions(grader)
        ],
        "resources": summarize_trace(run_dir / "resources.jsonl", run.get("gpus")),
    }
