"""What the three reference agents share: the workspace contract, and nothing from the harness.

An agent sees only environment variables, the workspace files and the grading API, exactly
like an LLM agent would: `TASK`, `BASE_MODEL`, `WORKSPACE`, `MODEL_PATH`, `DATA_PATH`,
`OUTPUT_DIR`, `GRADING_SERVER_URL` (its secret is a path prefix: append `/submit`, `/time`).
In a multi-task run `TASK` is `multi`, `TASKS` lists the run's tasks (comma-separated) and
`DATA_PATH` is the workspace's `tasks/` folder: task t's files are in `tasks/t/` (its training
split in `tasks/t/data/`, its `task.py`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

# Offline by default (the harness sets these too); must happen before transformers is imported.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import requests  # noqa: E402

WORKSPACE = Path(os.environ.get("WORKSPACE", os.getcwd())).resolve()
MODEL_PATH = Path(os.environ["MODEL_PATH"])
DATA_PATH = Path(os.environ.get("DATA_PATH", WORKSPACE / "data"))
OUTPUT_DIR = Path(os.environ.get("OUTPUT_DIR", WORKSPACE / "output"))
SERVER = os.environ.get("GRADING_SERVER_URL", "").rstrip("/")
SEED = int(os.environ.get("AGENT_SEED", "0"))
# A multi-task run's tasks, in run order (empty in a single-task run).
TASKS = [name for name in os.environ.get("TASKS", "").split(",") if name.strip()]

# Keep this agent's code in the workspace, where an LLM agent's code would be: the harness
# snapshots code/ at every submission and reads the training route from it.
_CODE = WORKSPACE / "code" / "agent"
_CODE.mkdir(parents=True, exist_ok=True)
for _source in {Path(sys.argv[0]).resolve(), Path(__file__).resolve()}:
    if _source.suffix == ".py" and _source.exists():
        shutil.copyfile(_source, _CODE / _source.name)


def log(*parts) -> None:
    print(time.strftime("[%H:%M:%S]"), *parts, flush=True)


def env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


def load_task():
    """The workspace's public task module (task.py): format_prompt, format_target, reward."""
    spec = importlib.util.spec_from_file_location("task", WORKSPACE / "task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_rows(limit: int | None = None) -> list[dict]:
    return _read_rows(DATA_PATH / "train.jsonl", limit)


def _read_rows(path: Path, limit: int | None) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return rows[:limit] if limit else rows


def task_dir(name: str) -> Path:
    """A multi-task run's folder of one task: tasks/<name>/ (DATA_PATH is tasks/)."""
    return DATA_PATH / name


def load_task_at(folder: Path):
    """The task.py of a task folder (a multi-task run's tasks/<name>/), as a module of its own name: the tasks'
    modules live side by side, and each finds its own files (task_protocol.json) beside it."""
    folder = Path(folder)
    name = "task_" + "".join(c if c.isalnum() else "_" for c in folder.name)
    spec = importlib.util.spec_from_file_location(name, folder / "task.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def load_rows_at(folder: Path, limit: int | None = None) -> list[dict]:
    """The training rows of a task folder (its data/train.jsonl)."""
    return _read_rows(Path(folder) / "data" / "train.jsonl", limit)


def time_left() -> float | None:
    """Seconds left to submit (GET /time), or None when the server does not say."""
    try:
        info = requests.get(f"{SERVER}/time", timeout=10).json()
        return float(info["remaining"])
    except Exception as exc:  # noqa: BLE001 - a reference agent keeps going
        log(f"GET /time failed: {exc!r}")
        return None


def submit(checkpoint: Path, retries: int = 3, task: str | None = None) -> dict | None:
    """POST /submit; returns the response when it carries a score, None on refusal or failure.

    `task` (a multi-task run's "all" or one of its tasks) goes in the request only when given.
    A 503 with `retryable: true` is the grader's own fault (its evaluation process died), not the
    model's: the contract says to submit again, after Retry-After seconds.
    """
    rel = os.path.relpath(Path(checkpoint).resolve(), WORKSPACE)
    payload = {"model_path": rel} if task is None else {"model_path": rel, "task": task}
    for attempt in range(retries + 1):
        try:
            response = requests.post(f"{SERVER}/submit", json=payload, timeout=(10, 3600))
            body = response.json() if response.content else {}
        except Exception as exc:  # noqa: BLE001
            log(f"submit {rel} failed: {exc!r}")
            return None
        log(f"submit {rel} -> HTTP {response.status_code}: {json.dumps(body)}")
        if response.status_code == 503 and body.get("retryable") and attempt < retries:
            wait = min(float(response.headers.get("Retry-After") or 5), 30.0)
            log(f"the grader failed on its side; submitting {rel} again in {wait:.0f}s")
            time.sleep(wait)
            continue
        break
    if response.ok and body.get("score") is not None and not body.get("error"):
        return body
    return None


def exit_unless_time_to_train(min_seconds: float = 60) -> None:
    """Stop (exit 1) when /time says too little of the budget is left to train at all."""
    left = time_left()
    if left is not None and left < min_seconds:
        log(f"only {left:.0f}s left: not training")
        sys.exit(1)


def load_base_model():
    """(model, tokenizer, on_gpu): the base model in fp32 on CPU, bf16 on GPU; never remote code."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    on_gpu = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(MODEL_PATH)
    model = AutoModelForCausalLM.from_pretrained(
        MODEL_PATH, dtype=torch.bfloat16 if on_gpu else torch.float32, trust_remote_code=False
    )
    return model, tokenizer, on_gpu


def save_checkpoint(model, tokenizer, out_dir: Path) -> Path:
    """A full model (safetensors) plus its tokenizer, as the grader wants it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    use_cache = model.config.use_cache
    model.config.use_cache = True  # the Trainer switches the KV cache off; evaluation wants it on
    model.save_pretrained(out_dir)
    model.config.use_cache = use_cache
    tokenizer.save_pretrained(out_dir)
    return out_dir


def trainer_dir(name: str) -> str:
    """Scratch folder for a trainer (nothing is saved there with save_strategy='no')."""
    return str(WORKSPACE / "code" / "trainer_runs" / name)


def _rounds_class():
    from transformers import TrainerCallback

    class Rounds(TrainerCallback):
        """Every `steps` optimizer steps: save output/v{k}, submit it (for `task`, when given: a
        multi-task run's "all" or one task), and stop training when the rounds are done or /time
        says another round would not fit."""

        def __init__(self, tokenizer, rounds: int, steps: int, margin_s: float = 30.0, task: str | None = None):
            self.tokenizer, self.rounds, self.steps, self.margin_s = tokenizer, rounds, steps, margin_s
            self.task = task
            self.scored = 0  # submissions that got a score
            self.round_started = time.time()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % self.steps:
                return control
            k = state.global_step // self.steps
            round_s = time.time() - self.round_started
            path = save_checkpoint(model, self.tokenizer, OUTPUT_DIR / f"v{k}")
            log(f"round {k}: {self.steps} steps in {round_s:.1f}s, saved {path}")
            if submit(path, task=self.task) is not None:
                self.scored += 1
            round_s = time.time() - self.round_started  # including the save and the evaluation
            left = time_left() if k < self.rounds else None
            if k >= self.rounds:
                control.should_training_stop = True
            elif left is not None and left < 1.5 * round_s + self.margin_s:
                log(f"stopping after round {k}: {left:.0f}s left is too little for another round")
                control.should_training_stop = True
            self.round_started = time.time()
            return control

    Rounds.__qualname__ = "Rounds"  # as if defined at the module's top level
    return Rounds


def __getattr__(name: str):
    """`Rounds` (a transformers TrainerCallback) is built on first use, so that importing this
    module costs no transformers import (seconds) where nothing trains (submit, time_left)."""
    if name == "Rounds":
        globals()["Rounds"] = rounds = _rounds_class()
        return rounds
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
