"""Evaluate in a fresh child process: a crashing or leaking checkpoint cannot take the grader down,
and GPU memory is released when the child exits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from rlbench.config import evaluation_settings
from rlbench.evaluation.evaluate import serve_request
from rlbench.evaluation.memory import keep_freed_memory
from rlbench.evaluation.request import EvaluationError, read_outcome, write_request
from rlbench.paths import SCRIPTS_DIR
from rlbench.proc.lifeline import die_with_parent


def run_in_child(
    task_settings: dict,
    model_dir: Path,
    eval_dir: Path,
    evaluation: dict,
    work_dir: Path,
    gpu: str | None = None,
    resources: dict | None = None,
    replicate: int = 0,
) -> dict:
    """evaluate_model in a fresh Python process.

    Raises EvaluationError (the model's fault) or GraderFault (the harness's), with the child's
    log tail. The child dies with this process (lifeline.die_with_parent): a grader killed with -9
    leaves no orphan evaluation holding a GPU. The kernel ties that to the thread that started the
    child, which is this one, blocked here until the child exits."""
    request = write_request(task_settings, model_dir, eval_dir, evaluation, work_dir, resources, replicate)
    result_path, error_path = work_dir / "result.json", work_dir / "error.json"
    log_path, phase_path = work_dir / "eval.log", work_dir / "phase.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS_DIR), env.get("PYTHONPATH")]))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    timeout = evaluation_settings(evaluation)["eval_timeout_s"]
    command = [sys.executable, "-m", "rlbench.evaluation", str(request), str(result_path), str(error_path)]
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                [*command, str(os.getpid())],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise EvaluationError(f"evaluation took longer than {timeout} s and was stopped") from None
        finally:
            shutil.rmtree(work_dir / "scratch", ignore_errors=True)
    return read_outcome(proc.returncode, result_path, error_path, log_path, phase_path)


def child_main(request_path: str, result_path: str, error_path: str, parent_pid: str) -> None:
    """The child: arm the lifeline first, then evaluate; on failure record the phase it failed in."""
    die_with_parent(int(parent_pid))
    keep_freed_memory()  # generation's buffers reused from step to step (rlbench.evaluation.memory)
    if not serve_request(request_path, result_path, error_path):
        sys.exit(1)
