"""Evaluate one model on one task's held-out split, in this process or in a fresh child.

The grader, the baseline and the final evaluation all go through `evaluate_model`, so the three
agree by construction. `run_in_child` runs it in a new interpreter: a crashing or leaking
checkpoint cannot take the grader down, and GPU memory is released when the child exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rlbench.jsonio import read_json, write_json

SCRIPTS_DIR = Path(__file__).resolve().parents[1]


class EvaluationError(RuntimeError):
    """The model could not be evaluated (load failure, crash, timeout)."""


def evaluate_model(task_settings: dict, model_dir: Path, eval_dir: Path, evaluation: dict) -> dict:
    """Score model_dir on the held-out split; returns EvalResult fields plus timing and backend."""
    from rlbench.generation import load_backend
    from rlbench.tasks import get_task

    started = time.time()
    task = get_task(task_settings)
    backend = load_backend(evaluation.get("backend", "auto"), Path(model_dir), evaluation.get("batch_size", 32))
    result = task.evaluate(Path(model_dir), Path(eval_dir), backend, task_settings).to_dict()
    result.update(backend=backend.name, eval_seconds=round(time.time() - started, 3))
    return result


def run_in_child(
    task_settings: dict,
    model_dir: Path,
    eval_dir: Path,
    evaluation: dict,
    work_dir: Path,
    gpu: str | None = None,
) -> dict:
    """evaluate_model in a fresh Python process; raises EvaluationError with the child's log tail."""
    work_dir.mkdir(parents=True, exist_ok=True)
    request, result_path, log_path = work_dir / "request.json", work_dir / "result.json", work_dir / "eval.log"
    result_path.unlink(missing_ok=True)
    write_json(
        request,
        {"task": task_settings, "model_dir": str(model_dir), "eval_dir": str(eval_dir), "evaluation": evaluation},
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS_DIR), env.get("PYTHONPATH")]))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    timeout = evaluation.get("eval_timeout_s", 3600)
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "rlbench.evaluation", str(request), str(result_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise EvaluationError(f"evaluation took longer than {timeout} s and was stopped") from None
    if proc.returncode != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
        raise EvaluationError(f"evaluation failed (exit code {proc.returncode}): " + " | ".join(tail))
    return read_json(result_path)


def _child_main(request_path: str, result_path: str) -> None:
    request = read_json(Path(request_path))
    result = evaluate_model(request["task"], Path(request["model_dir"]), Path(request["eval_dir"]), request["evaluation"])
    write_json(Path(result_path), result)


if __name__ == "__main__":
    _child_main(*sys.argv[1:3])
