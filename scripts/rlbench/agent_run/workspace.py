"""Build an agent's workspace: base model and training split read-only, task files, rules.

A single-task run's workspace has the task's training split in data/ and its files (task.py...) at the top; a
multi-task run's has one folder per task, tasks/<task>/ (its training split in data/, its description.md and its
files), one base model and one output/, and a description.md of its own listing the tasks. What the instructions
say is in rlbench.agent_run.instructions.

A workspace is built beside the one it replaces and takes its place only once complete (rlbench.fileio.staging).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from rlbench.agent_run.attempts import archive_previous_attempt
from rlbench.agent_run.instructions import (
    FEEDBACK_SPLIT_NOTE,
    INSTRUCTIONS,
    MODE_RULES,
    MULTI_INSTRUCTIONS,
    instructions_text,
    multi_description,
)
from rlbench.config import scoring_settings
from rlbench.fileio.jsonio import sha256_file
from rlbench.fileio.staging import building, install
from rlbench.tasks import Task, get_task

__all__ = [
    "FEEDBACK_SPLIT_NOTE",
    "INSTRUCTIONS",
    "MODE_RULES",
    "MULTI_INSTRUCTIONS",
    "TASKS_DIR",
    "WORKSPACE",
    "prepare_workspace",
    "readonly_parts",
    "rebuild_workspace",
    "replace_multi_workspace",
    "replace_workspace",
    "unshare_readonly_files",
]

WORKSPACE = "workspace"  # a run directory's workspace folder
TASKS_DIR = "tasks"  # a multi-task workspace's folder of task folders (tasks/<task>/)

# A multi-task run's member: the task, its settings, the folder of its training split.
Member = tuple[Task, dict, Path]


def _place_readonly(source: Path, dest: Path) -> None:
    """Hard-link (cheap for multi-GB models) or copy one file, then make it read-only."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)
    dest.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def _readonly_tree(source: Path, dest: Path) -> list[str]:
    placed = []
    for path in sorted(source.rglob("*")):
        if path.is_file():
            _place_readonly(path, dest / path.relative_to(source))
            placed.append(str(path.relative_to(source)))
    return placed


def readonly_parts(workspace: Path) -> list[Path]:
    """The parts of a workspace that are read-only for the agent, as far as they exist: the base model (models/),
    the training split (data/; in a multi-task workspace each tasks/<task>/data/). What the sandbox binds read-only
    inside the writable workspace."""
    workspace = Path(workspace)
    tasks = workspace / TASKS_DIR
    parts = [workspace / "data", workspace / "models"]
    parts += sorted(p / "data" for p in tasks.iterdir() if p.is_dir()) if tasks.is_dir() else []
    return [p for p in parts if p.is_dir()]


def unshare_readonly_files(workspace: Path) -> int:
    """Give the workspace its own copy of every read-only part it shares with the results tree (the base
    model and the training splits are hard links to results/models/ and results/data/); returns how many.

    For an unsandboxed run (sandbox.backend none, or auto without bubblewrap): outside the sandbox nothing
    binds those parts read-only, and an agent running as root (or one that chmods them) would write through
    the link into every run's base model and the baseline's. Inside the sandbox they stay links."""
    copied = 0
    for part in readonly_parts(workspace):
        for path in sorted(part.rglob("*")):
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode) or info.st_nlink < 2:
                continue
            private = path.with_name(f".{path.name}.private")
            shutil.copyfile(path, private)
            private.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            os.replace(private, path)
            copied += 1
    return copied


def prepare_workspace(
    workspace: Path,
    task: Task,
    task_settings: dict,
    model_dir: Path,
    hf_id: str,
    train_dir: Path,
    mode: str = "free",
) -> dict:
    """A fresh workspace at `workspace`, built beside it and put in its place (whatever was there is
    removed) only once complete; returns a manifest (every file and its sha256)."""
    workspace = Path(workspace)
    files, _ = _build(
        workspace, None, lambda staging: _fill(staging, task, task_settings, model_dir, hf_id, train_dir, mode)
    )
    return _manifest(workspace, files, task_settings, model_dir, hf_id, train_dir, mode)


def replace_workspace(
    run_dir: Path,
    task: Task,
    task_settings: dict,
    model_dir: Path,
    hf_id: str,
    train_dir: Path,
    mode: str = "free",
) -> tuple[dict, Path | None]:
    """A new attempt's workspace for the run in `run_dir`: built beside the run's files first; only once it
    is complete is the previous attempt archived (attempts/<k>/, rlbench.agent_run.attempts) and the new
    workspace put in its place. A build that fails leaves the run directory as it was.
    Returns the manifest and where the previous attempt went (None: there was none)."""
    run_dir = Path(run_dir)
    workspace = run_dir / WORKSPACE
    files, archived = _build(
        workspace, run_dir, lambda staging: _fill(staging, task, task_settings, model_dir, hf_id, train_dir, mode)
    )
    return _manifest(workspace, files, task_settings, model_dir, hf_id, train_dir, mode), archived


def replace_multi_workspace(
    run_dir: Path,
    members: Sequence[Member],
    model_dir: Path,
    hf_id: str,
    mode: str = "free",
) -> tuple[dict, Path | None]:
    """A new attempt's workspace for the multi-task run in `run_dir`, built and put in place as replace_workspace
    does. `members`: the run's tasks in run order, each (task, task_settings, train_dir). Each task gets
    tasks/<name>/ (its training split read-only in data/, its description.md and its exposed files); the
    workspace one base model (models/<hf_id>/, read-only), code/, output/, a description.md listing the tasks and
    the multi-task instructions.md. Returns the manifest and where the previous attempt went (None: there was none)."""
    run_dir = Path(run_dir)
    members = [(task, settings, Path(train_dir)) for task, settings, train_dir in members]
    names = _member_names(members)
    workspace = run_dir / WORKSPACE
    files, archived = _build(workspace, run_dir, lambda staging: _fill_multi(staging, members, model_dir, hf_id, mode))
    manifest = {
        "workspace": str(workspace),
        "model": f"models/{hf_id}",
        "mode": mode,
        "tasks": names,
        "files": files,
        # What rebuild_workspace needs to make the same workspace again for a new attempt.
        "build": {
            "members": [{"task_settings": settings, "train_dir": str(train_dir)} for _, settings, train_dir in members],
            "model_dir": str(model_dir),
            "hf_id": hf_id,
            "mode": mode,
        },
    }
    return manifest, archived


def _build(workspace: Path, archive: Path | None, fill: Callable[[Path], dict]) -> tuple[dict, Path | None]:
    """Build a workspace beside `workspace` with `fill` (which returns its files and their sha256); once complete,
    archive the previous attempt of the run in `archive` (if given), then put the new workspace in place."""
    with building(workspace) as staging:
        files = fill(staging)
        archived = archive_previous_attempt(archive) if archive is not None else None
        install(staging, workspace)
    return files, archived


def _hashes(workspace: Path) -> dict[str, str]:
    return {str(p.relative_to(workspace)): sha256_file(p) for p in sorted(workspace.rglob("*")) if p.is_file()}


def _place_exposed(folder: Path, exposed: dict[str, Path | bytes]) -> list[str]:
    """A task's exposed files (Task.exposed_files) in `folder`; returns their names."""
    for name, source in exposed.items():
        dest = folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            dest.write_bytes(source)
        else:
            shutil.copyfile(source, dest)
    return list(exposed)


def _fill(
    workspace: Path, task: Task, task_settings: dict, model_dir: Path, hf_id: str, train_dir: Path, mode: str
) -> dict[str, str]:
    """Fill an empty directory with a workspace; returns its files and their sha256."""
    for name in ("code", "data", "output"):
        (workspace / name).mkdir(parents=True)
    _readonly_tree(Path(train_dir), workspace / "data")
    _readonly_tree(Path(model_dir), workspace / "models" / hf_id)
    (workspace / "description.md").write_text(task.description(task_settings))
    split = scoring_settings(task_settings)["feedback"] == "split"
    (workspace / "instructions.md").write_text(instructions_text(hf_id, mode, split))
    _place_exposed(workspace, task.exposed_files(task_settings))
    return _hashes(workspace)


def _member_names(members: list[Member]) -> list[str]:
    """The tasks' names, in run order: each a folder name of its own under tasks/."""
    if not members:
        raise ValueError("a multi-task workspace needs at least one task")
    names = [settings["name"] for _, settings, _ in members]
    for name in names:
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"task name {name!r} cannot be a folder of tasks/")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"tasks named twice in a multi-task run: {', '.join(duplicates)}")
    return names


def _fill_multi(workspace: Path, members: list[Member], model_dir: Path, hf_id: str, mode: str) -> dict[str, str]:
    """Fill an empty directory with a multi-task workspace; returns its files and their sha256."""
    for name in ("code", "output"):
        (workspace / name).mkdir(parents=True)
    _readonly_tree(Path(model_dir), workspace / "models" / hf_id)
    listing = []
    for task, settings, train_dir in members:
        folder = workspace / TASKS_DIR / settings["name"]
        (folder / "data").mkdir(parents=True)
        _readonly_tree(train_dir, folder / "data")
        (folder / "description.md").write_text(task.description(settings))
        exposed = _place_exposed(folder, task.exposed_files(settings))
        listing.append(
            {"name": settings["name"], "level": settings.get("level"), "files": ["description.md", "data/", *exposed]}
        )
    (workspace / "description.md").write_text(multi_description(listing))
    split = any(scoring_settings(settings)["feedback"] == "split" for _, settings, _ in members)
    (workspace / "instructions.md").write_text(instructions_text(hf_id, mode, split, multi=True))
    return _hashes(workspace)


def _manifest(
    workspace: Path, files: dict, task_settings: dict, model_dir: Path, hf_id: str, train_dir: Path, mode: str
) -> dict:
    return {
        "workspace": str(workspace),
        "model": f"models/{hf_id}",
        "mode": mode,
        "files": files,
        # What rebuild_workspace needs to make the same workspace again for a new attempt.
        "build": {
            "task_settings": task_settings,
            "model_dir": str(model_dir),
            "hf_id": hf_id,
            "train_dir": str(train_dir),
            "mode": mode,
        },
    }


def rebuild_workspace(manifest: dict) -> Path | None:
    """A new attempt of the run whose workspace a manifest describes (a single-task or a multi-task one): the
    same workspace, fresh, and the previous attempt archived once it is built (replace_workspace,
    replace_multi_workspace). Returns where that attempt went."""
    build = manifest["build"]
    run_dir = Path(manifest["workspace"]).parent
    if "members" in build:
        members = [(get_task(m["task_settings"]), m["task_settings"], Path(m["train_dir"])) for m in build["members"]]
        _, archived = replace_multi_workspace(
            run_dir, members, Path(build["model_dir"]), build["hf_id"], mode=build["mode"]
        )
        return archived
    _, archived = replace_workspace(
        run_dir,
        get_task(build["task_settings"]),
        build["task_settings"],
        Path(build["model_dir"]),
        build["hf_id"],
        Path(build["train_dir"]),
        mode=build["mode"],
    )
    return archived
