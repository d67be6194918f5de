"""Evaluate one model on one task's held-out split, in this process or in a fresh child.

The grader, the baseline and the final evaluation all go through `evaluate_model`, so the three
agree by construction. `run_in_child` runs it in a new interpreter: a crashing or leaking
checkpoint cannot take the grader down, and GPU memory is released when the child exits.

A failed child is classified by whose fault it was, because the agent is told different things:
the submitted model's (it failed while the child was loading it or generating with it:
EvaluationError, "fix your model") or the harness's (the child was killed by a signal, failed
before or after the model's part, or exited without a result: GraderFault, "submit again"). The
child writes the phase it failed in to an error file; no error file means it never got to say.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from rlbench.jsonio import read_json, write_json
from rlbench.lifeline import die_with_parent

SCRIPTS_DIR = Path(__file__).resolve().parents[1]
# Phases in which a failure is the submitted model's: loading it, generating with it (and scoring
# what it generated, which runs inside the task's evaluate).
MODEL_PHASES = frozenset({"loading", "generating"})
LOG_TAIL_LINES = 5


class EvaluationError(RuntimeError):
    """The submitted model could not be evaluated: it failed to load, failed while generating, or
    took longer than the evaluation timeout. The agent's to fix."""


class GraderFault(RuntimeError):
    """The evaluation failed for a reason that is not the submitted model's (the child was killed,
    the harness broke): the same submission may well succeed when sent again."""


def evaluate_model(
    task_settings: dict,
    model_dir: Path,
    eval_dir: Path,
    evaluation: dict,
    on_phase: Callable[[str], None] | None = None,
) -> dict:
    """Score model_dir on the held-out split; returns EvalResult fields plus timing and backend.

    on_phase(name) is called as the evaluation enters "setup", "loading" and "generating", so a
    caller can tell a broken model (the last two) from a broken harness."""
    report = on_phase or (lambda phase: None)
    report("setup")
    # The heavy imports belong to the harness: a broken environment must not read as a bad model.
    import torch  # noqa: F401

    from rlbench.generation import load_backend
    from rlbench.tasks import get_task

    started = time.time()
    if not Path(eval_dir).is_dir():  # the grader's data, not the model: fail before the model phases
        raise FileNotFoundError(f"the held-out split is missing: {eval_dir}")
    task = get_task(task_settings)
    report("loading")
    backend = load_backend(evaluation.get("backend", "auto"), Path(model_dir), evaluation.get("batch_size", 32))
    report("generating")
    result = task.evaluate(Path(model_dir), Path(eval_dir), backend, task_settings).to_dict()
    result.update(backend=backend.name, eval_seconds=round(time.time() - started, 3))
    return result


def _log_tail(log_path: Path) -> str:
    try:
        return " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_in_child(
    task_settings: dict,
    model_dir: Path,
    eval_dir: Path,
    evaluation: dict,
    work_dir: Path,
    gpu: str | None = None,
) -> dict:
    """evaluate_model in a fresh Python process.

    Raises EvaluationError (the model's fault) or GraderFault (the harness's), with the child's
    log tail. The child dies with this process (lifeline.die_with_parent): a grader killed with -9
    leaves no orphan evaluation holding a GPU. The kernel ties that to the thread that started the
    child, which is this one, blocked here until the child exits."""
    work_dir.mkdir(parents=True, exist_ok=True)
    request, result_path = work_dir / "request.json", work_dir / "result.json"
    error_path, log_path = work_dir / "error.json", work_dir / "eval.log"
    result_path.unlink(missing_ok=True)
    error_path.unlink(missing_ok=True)
    write_json(
        request,
        {"task": task_settings, "model_dir": str(model_dir), "eval_dir": str(eval_dir), "evaluation": evaluation},
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS_DIR), env.get("PYTHONPATH")]))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    timeout = evaluation.get("eval_timeout_s", 3600)
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
    return _outcome(proc.returncode, result_path, error_path, log_path)


def _outcome(returncode: int, result_path: Path, error_path: Path, log_path: Path) -> dict:
    """The child's result, or the failure it stands for, classified by fault."""
    tail = _log_tail(log_path)
    if returncode == 0 and result_path.exists():
        try:
            return read_json(result_path)
        except (OSError, ValueError) as exc:
            raise GraderFault(f"the evaluation's result file could not be read ({exc})") from None
    if returncode < 0:
        raise GraderFault(f"the evaluation process was killed by {_signal_name(-returncode)}: {tail}")
    try:
        error = read_json(error_path) if error_path.exists() else {}
    except (OSError, ValueError):
        error = {}
    phase = error.get("phase") if isinstance(error, dict) else None
    if returncode == 0:
        raise GraderFault(f"the evaluation process exited without a result: {tail}")
    if phase in MODEL_PHASES:
        raise EvaluationError(f"evaluation failed while {phase} the model (exit code {returncode}): {tail}")
    where = f" in its {phase} phase" if phase else ""
    raise GraderFault(f"the evaluation process failed{where} (exit code {returncode}): {tail}")


def _child_main(request_path: str, result_path: str, error_path: str, parent_pid: str) -> None:
    """The child: arm the lifeline first, then evaluate; on failure record the phase it failed in."""
    die_with_parent(int(parent_pid))
    phase = "setup"

    def enter(name: str) -> None:
        nonlocal phase
        phase = name

    try:
        request = read_json(Path(request_path))
        result = evaluate_model(
            request["task"], Path(request["model_dir"]), Path(request["eval_dir"]), request["evaluation"], enter
        )
        phase = "writing"
        write_json(Path(result_path), result)
    except BaseException as exc:
        fault = "model" if phase in MODEL_PHASES else "harness"
        write_json(Path(error_path), {"phase": phase, "fault": fault, "error": f"{type(exc).__name__}: {exc}"})
        raise


if __name__ == "__main__":
    _child_main(*sys.argv[1:5])
