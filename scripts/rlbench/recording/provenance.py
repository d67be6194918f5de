"""Provenance: what every score rests on (code, data, models, judge, packages, hardware)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from rlbench import __version__
from rlbench.paths import LIBRARY_DIR as LIBRARY, REPO_ROOT

PACKAGES = ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "vllm", "snakemake", "fastapi")


def _tree_sha256(paths: list[Path]) -> str:
    """One hash over the names and contents of source files (independent of mtimes and checkouts)."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(LIBRARY)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _task_files(task_settings_json: str) -> list[Path]:
    """The source files of a task and of the parts its evaluation uses (Task.code_files)."""
    from rlbench.tasks import get_task

    settings = json.loads(task_settings_json)
    return get_task(settings).code_files(settings)


@functools.lru_cache(maxsize=None)
def code_version(task_settings_json: str | None = None) -> dict:
    """The grader's code and the code of the task's parts actually used, by content hash, plus the
    git commit when there is one. task_settings_json: the task's settings as canonical JSON."""
    grader_files = [path for package in ("grader", "evaluation", "generation") for path in (LIBRARY / package).glob("*.py")]
    record = {"rlbench": __version__, "grader_sha256": _tree_sha256(grader_files)}
    if task_settings_json:
        files = _task_files(task_settings_json)
        record["task_sha256"] = _tree_sha256(files)
        record["task_files"] = sorted(str(path.relative_to(LIBRARY)) for path in files)
    try:
        repo = REPO_ROOT
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "scripts"], capture_output=True, text=True)
        if commit.returncode == 0:
            record.update(git_commit=commit.stdout.strip(), git_dirty=bool(status.stdout.strip()))
    except OSError:  # git is not installed
        pass
    return record


@functools.lru_cache(maxsize=None)
def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


def _gpu_names() -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


@functools.lru_cache(maxsize=None)
def hardware() -> dict:
    return {
        "host": platform.node(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "gpus": _gpu_names(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "python": platform.python_version(),
    }


def provenance(
    task_settings: dict | None = None,
    data: dict | None = None,
    models: dict | None = None,
    evaluation: dict | None = None,
    judge: dict | None = None,
    execution: dict | None = None,
) -> dict:
    """The provenance record stored next to a score.

    data: hashes of the splits (the data manifests); models: fingerprints (base, submission);
    evaluation: generation settings; judge: the judge's record (rule judge_config: its settings,
    identity and model fingerprint), else the task's `judge` entry (L2, DeepSearchQA); execution:
    the code-execution sandbox's check (rule check_execution), for execution-scored tasks.
    """
    task_settings = task_settings or {}
    settings_json = json.dumps(task_settings, sort_keys=True, default=str) if task_settings.get("module") else None
    return {
        "code": code_version(settings_json),
        "task": {
            k: task_settings.get(k)
            for k in ("name", "level", "source", "eval_size", "max_new_tokens", "metric", "grader_noise_repeats")
        },
        "data": data or {},
        "models": models or {},
        "judge": judge if judge is not None else task_settings.get("judge"),
        **({"execution": execution} if execution is not None else {}),
        "evaluation": evaluation or {},
        "packages": package_versions(),
        "hardware": hardware(),
    }
