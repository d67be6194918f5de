"""The operating-mode audit of a run: the training methods of every recorded code revision (or code
snapshot) and of the final code/, judged by modes.audit_mode.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rlbench.recording.ledger import is_scored
from rlbench.recording.repository import CODE_GIT, CodeRepository, RecordingError, code_revisions
from rlbench.summaries.agent_code import final_code_methods, training_methods
from rlbench.summaries.modes import FINAL, audit_mode
from rlbench.summaries.submissions import is_base_path, is_base_weights, snapshot_code_dir


def _revision_methods(grader_dir: Path, revision: str, tree: str, cache: dict[str, set[str]]) -> set[str] | None:
    """training_methods of one code.git revision (exported to a temporary directory: its files
    as committed, nothing of git's checkout machinery involved); None when it cannot be read.
    cache: by tree (an unchanged code/ is read once)."""
    repo = CodeRepository(Path(grader_dir) / CODE_GIT)
    if tree in cache:
        return cache[tree]
    try:
        with tempfile.TemporaryDirectory(prefix="rlbench-rev-") as tmp:
            repo.export(revision, Path(tmp))
            methods = training_methods(Path(tmp))
    except (RecordingError, OSError, ValueError) as exc:
        print(f"diagnostics: code revision {revision}: {exc}", file=sys.stderr)
        return None
    cache[tree] = methods
    return methods


def code_methods(grader_dir: Path, ledger: list[dict]) -> tuple[list[tuple[int, set[str]]], str]:
    """(submission_id, training methods) for every recorded request whose code was recorded, in
    ledger order: from its code.git revision (`code_revision`), else from its code snapshot
    directory; and the evidence used ("code revisions", "code snapshots", or both)."""
    revisions, sources, cache = [], set(), {}
    trees = {r["sha"]: r["tree"] for r in code_revisions(grader_dir)}
    for entry in ledger:
        sid = entry.get("submission_id")
        if entry.get("pending") or not isinstance(sid, int):
            continue
        methods = None
        revision = entry.get("code_revision")
        if revision and revision in trees:
            methods = _revision_methods(grader_dir, revision, trees[revision], cache)
            if methods is not None:
                sources.add("code revisions")
        if methods is None:
            code_dir = snapshot_code_dir(grader_dir, entry)
            if code_dir is None:
                continue
            methods = training_methods(code_dir)
            sources.add("code snapshots")
        revisions.append((sid, methods))
    evidence = " and ".join(sorted(sources)) or "no code recorded"
    return revisions, evidence


def audit_run_mode(
    run_dir: Path,
    mode: str | None,
    ledger: list[dict],
    baseline_fingerprint: str | None,
    base_model: str | None,
) -> dict:
    """modes.audit_mode over the run's recorded code (code_methods) and its final code/ state;
    "trained weights" are scored submissions of weights other than the base model's."""
    run_dir = Path(run_dir)
    workspace, grader = run_dir / "workspace", run_dir / "grader"
    revisions, evidence = code_methods(grader, ledger)
    if (workspace / "code").exists() or (workspace / "code").is_symlink():
        revisions.append((FINAL, final_code_methods(workspace)))
        evidence += " + final code/"
    trained = any(
        is_scored(e)
        and not e.get("pending")
        and not is_base_weights(e, baseline_fingerprint)
        and not is_base_path(e, workspace, base_model)
        for e in ledger
    )
    return audit_mode(mode, revisions, submitted_trained_weights=trained, evidence=evidence)
