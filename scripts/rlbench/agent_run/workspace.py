"""Build an agent's workspace: base model and training split read-only, task files, rules.

A workspace is built beside the one it replaces and takes its place only once complete (rlbench.fileio.staging).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from rlbench.agent_run.attempts import archive_previous_attempt
from rlbench.config import scoring_settings
from rlbench.fileio.jsonio import sha256_file
from rlbench.fileio.staging import building, install
from rlbench.tasks import Task

WORKSPACE = "workspace"  # a run directory's workspace folder

INSTRUCTIONS = """\
# Instructions

You are inside an isolated workspace. Your job: post-train the base model so that it scores
higher on the task in `description.md`, within the time budget. Use any method (SFT, DPO, GRPO,
PPO, rollouts with the task's reward...).

## Layout (use relative paths)

- `code/` — your code (writable).
- `data/` — the training split (read-only). The evaluation split is held out: you never see it.
- `models/{hf_id}/` — the base model (read-only).
- `output/` — save trained checkpoints here, one directory per version (`output/v1`, `output/v2`...).
- `task.py` — the task's prompt format, answer extraction and reward, exactly as the grader uses them.
- `run_meta.json` — the time budget, the single source of truth: `start_time`, `timeout_s`,
  `last_submit_time` (your last submission), `end_time` (null until the run is over), `deadline`
  (`start_time + timeout_s`, when everything you started is stopped); unix seconds.
- `timer.sh` — `bash timer.sh` prints the time left as `Remaining: H:MM` (or `Timer expired!`).
- `scores.json` — your submissions so far, a list of `submission_id`, `timestamp`, `model_path`,
  `score`, `baseline_score`, `improvement`, `elapsed_seconds` and, for one that failed, `error`.
- `submissions.json` — the same with the grader's details: your most recent 1000 requests
  (refused ones too) with their `status` and `reason` (`requests` and `total_submissions` count
  them all), and `best`, your best really scored submission.

Environment variables: TASK, BASE_MODEL, WORKSPACE, MODEL_PATH, DATA_PATH, OUTPUT_DIR,
GRADING_SERVER_URL.

## Submitting

A checkpoint is a full model directory saved with `model.save_pretrained(dir)` and
`tokenizer.save_pretrained(dir)`: safetensors weights only (no .bin/pickle files), no custom
code (`auto_map`), not a LoRA adapter (merge it first with `merge_and_unload()`). Its files must
be real files, not symbolic links, and the files it names (a sharded checkpoint's
`model.safetensors.index.json`) must be in the directory itself. The path must be inside the
workspace: relative (`output/v1`) or absolute (`$OUTPUT_DIR/v1`). The grader copies the
checkpoint when it receives the request: leave it alone until the answer comes.

    curl -X POST "$GRADING_SERVER_URL/submit" -H "Content-Type: application/json" -d '{{"model_path": "output/v1"}}'

    import os, requests
    requests.post(f"{{os.environ['GRADING_SERVER_URL']}}/submit", json={{"model_path": "output/v1"}}).json()

Optional `"gpu"`: the GPU(s) to evaluate on, e.g. `"0"` or `"2,3"`, chosen from `available_gpus`
of `GET $GRADING_SERVER_URL/health` (without it the first one is used; on a grader without GPUs,
leave it out). Evaluations on the same GPU run one after another, beside whatever you run there:
leave that GPU the memory to load and run the submitted model (the grader's vLLM backend takes a
fixed share of the GPU's memory, 45% unless the benchmark is configured otherwise).

The response: `submission_id`, `timestamp` (ISO 8601, when the evaluation finished), `model_path`,
`score` (0-100; 0.0 when the submission could not be scored), `baseline_score` (the base model's),
`improvement` (`score - baseline_score`), `elapsed_seconds` (how long this evaluation took),
`best` (the entry of `scores.json` with the highest score), `total_submissions` (entries in
`scores.json`), and `error` when the submission was refused or its evaluation failed: it says why
and what to change. Also `status` (`scored`, `cached`, `refused`, `failed`, `grader_error`),
`reason` (a stable code for a refusal) and `since_start_s`. HTTP 200 means the weights were
scored; a refusal, or a model that failed to load or generate, has a 4xx status: e.g. 404
`missing_path`, 400 `invalid_path` (a path no file can have: a NUL byte, a name over 255 bytes),
413 `request_too_large` (the body is over 64 KiB: send only the JSON above, never the model).
HTTP 503 with `status` `grader_error` and `"retryable": true` means the grader itself failed: it
is not your model's fault and does not count as a submission; wait `Retry-After` seconds and
send the same request again (weights whose evaluation is killed three times, e.g. out of memory,
get a 422 instead). When generation fails on the held-out split, the error names only the
exception's type, since its details could quote held-out data: reproduce it with task.py's
`format_prompt` on the training data.
Submitting the same weights twice returns the cached score without a new evaluation; the
untouched base model scores the baseline (improvement 0).

`GET $GRADING_SERVER_URL/time` returns `start_time`, `timeout_s`, `last_submit_time`, `end_time`,
`deadline`, `now` and `remaining` (seconds); `GET $GRADING_SERVER_URL/health` returns `status`,
`task`, `workspace` and `available_gpus`. Your result is the best submission made before the
deadline. At the deadline every process you started is stopped.
"""


# Added to instructions.md when the task's scoring.feedback is split (rlbench.config.scoring_settings): the
# agent is told that its reported scores are on a part of the held-out split, never which part or its size.
FEEDBACK_SPLIT_NOTE = """
## What your scores are measured on

In this run the held-out split has two parts. `/submit`, `scores.json` and `submissions.json` report
each submission's score on one of them (the feedback split). Every new submission is also scored on
the other part, which you are never told about: the benchmark reports both, and how much choosing a
submission by its reported score overstates it.
"""


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


def unshare_readonly_files(workspace: Path) -> int:
    """Give the workspace its own copy of every read-only part it shares with the results tree (the base
    model and the training split are hard links to results/models/ and results/data/); returns how many.

    For an unsandboxed run (sandbox.backend none, or auto without bubblewrap): outside the sandbox nothing
    binds those parts read-only, and an agent running as root (or one that chmods them) would write through
    the link into every run's base model and the baseline's. Inside the sandbox they stay links."""
    copied = 0
    for part in ("data", "models"):
        for path in sorted((Path(workspace) / part).rglob("*")):
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode) or info.st_nlink < 2:
                continue
            private = path.with_name(f".{path.name}.private")
            shutil.copyfile(path, private)
            private.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            os.replace(private, path)
            copied += 1
    return copied


MODE_RULES = {
    "free": "",
    "sft-only": "\n## Mode: SFT only\n\nUse supervised fine-tuning only (no RL, no preference optimisation).\n",
    "rl-only": "\n## Mode: RL only\n\nImprove the model with reinforcement learning (GRPO, PPO, ...); "
    "SFT may only warm up an RL run.\n",
}


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
    manifest, _ = _build(Path(workspace), None, task, task_settings, model_dir, hf_id, train_dir, mode)
    return manifest


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
    return _build(run_dir / WORKSPACE, run_dir, task, task_settings, model_dir, hf_id, train_dir, mode)


def _build(
    workspace: Path,
    archive: Path | None,
    task: Task,
    task_settings: dict,
    model_dir: Path,
    hf_id: str,
    train_dir: Path,
    mode: str,
) -> tuple[dict, Path | None]:
    """Build a workspace beside `workspace`; once complete, archive the previous attempt of the run in
    `archive` (if given), then put the new workspace in place."""
    with building(workspace) as staging:
        files = _fill(staging, task, task_settings, model_dir, hf_id, train_dir, mode)
        archived = archive_previous_attempt(archive) if archive is not None else None
        install(staging, workspace)
    return _manifest(workspace, files, task_settings, model_dir, hf_id, train_dir, mode), archived


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
    (workspace / "instructions.md").write_text(
        INSTRUCTIONS.format(hf_id=hf_id) + (FEEDBACK_SPLIT_NOTE if split else "") + MODE_RULES[mode]
    )
    for name, source in task.exposed_files(task_settings).items():
        if isinstance(source, bytes):
            (workspace / name).write_bytes(source)
        else:
            shutil.copyfile(source, workspace / name)
    return {str(p.relative_to(workspace)): sha256_file(p) for p in sorted(workspace.rglob("*")) if p.is_file()}


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
    """A new attempt of the run whose workspace a manifest describes: the same workspace, fresh, and the
    previous attempt archived once it is built (replace_workspace). Returns where that attempt went."""
    from rlbench.tasks import get_task

    build = manifest["build"]
    workspace = Path(manifest["workspace"])
    _, archived = replace_workspace(
        workspace.parent,
        get_task(build["task_settings"]),
        build["task_settings"],
        Path(build["model_dir"]),
        build["hf_id"],
        Path(build["train_dir"]),
        mode=build["mode"],
    )
    return archived
