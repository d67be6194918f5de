"""Shared setup of the grader benchmarks: a model, a task's offline splits, a workspace and a live
grading server, all in a temporary directory (bench_submit_roundtrip.py, bench_eval_efficiency.py)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))  # support: the tests' helpers
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")

import yaml  # noqa: E402

from rlbench.grader.grading import Grader, GraderConfig  # noqa: E402
from rlbench.grader.fingerprint import fingerprint  # noqa: E402
from rlbench.grader.server import GradingServer, new_secret  # noqa: E402
from rlbench.models.materialise import prepare_model  # noqa: E402
from rlbench.tasks import get_task  # noqa: E402
from rlbench.agent_run.workspace import prepare_workspace  # noqa: E402
from support.models import base_resources  # noqa: E402

TEST_SALT = "rlbench-benchmark-salt"


def model_spec(name: str) -> dict:
    """A model registry entry (config/models/NAME.yaml)."""
    return yaml.safe_load((REPO / "config" / "models" / f"{name}.yaml").read_text())


def task_settings(task: str, prompts: int, max_new_tokens: int) -> dict:
    """A task's registry entry (config/tasks/TASK.yaml) on its offline source, with `prompts`
    held-out rows and at most `max_new_tokens` new tokens."""
    settings = yaml.safe_load((REPO / "config" / "tasks" / f"{task}.yaml").read_text())
    settings.update(source="offline", eval_size=prompts, max_new_tokens=max_new_tokens, data_seed=0)
    if task == "gsm8k":
        settings["train_size"] = 16
    return settings


def gsm8k_settings(prompts: int, max_new_tokens: int) -> dict:
    return task_settings("gsm8k", prompts, max_new_tokens)


def prepare(root: Path, model: str, settings: dict) -> tuple[Path, Path, Path]:
    """(model dir, train split, held-out split) under root."""
    model_dir = root / "models" / model
    prepare_model(model_spec(model), model_dir)
    get_task(settings).prepare(settings, root / "data" / "train", root / "data" / "eval", salt=TEST_SALT)
    return model_dir, root / "data" / "train", root / "data" / "eval"


def variant(model_dir: Path, dest: Path, k: int) -> Path:
    """A copy of the model with other weights (one tensor shifted by k * 1e-3): a new fingerprint,
    so the grader evaluates it instead of answering from its cache."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, dest)
    weights = load_file(dest / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + k * 1e-3
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def start_server(root: Path, model_dir: Path, model_id: str, train: Path, eval_dir: Path, settings: dict, evaluation: dict):
    """A live grading server over a fresh workspace, its worker warmed up as the runner does."""
    workspace = root / "run" / "workspace"
    prepare_workspace(workspace, get_task(settings), settings, model_dir, model_id, train)
    grader = Grader(
        GraderConfig(
            workspace=workspace,
            grader_dir=workspace.parent / "grader",
            task_settings=settings,
            eval_dir=eval_dir,
            baseline_score=0.0,
            baseline_fingerprint=fingerprint(model_dir),
            start_time=time.time(),
            timeout_s=24 * 3600,
            secret=new_secret(),
            evaluation=evaluation,
            resources=base_resources(model_dir),
        )
    )
    grader.warm_up()
    grader.workers.wait_ready(timeout=600)  # as a run's first submission finds it (fresh mode: no-op)
    return GradingServer(grader).start(), workspace
