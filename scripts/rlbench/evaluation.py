"""Evaluate one model on one task's held-out split, in this process or in a fresh child.

The grader, the baseline and the final evaluation all go through `evaluate_model`, so the three
agree by construction. `run_in_child` runs it in a new interpreter: a crashing or leaking
checkpoint cannot take the grader down, and GPU memory is released when the child exits.

A failed child is classified by whose fault it was, because the agent is told different things:
the submitted model's (it failed while the child was loading it or generating with it:
EvaluationError, "fix your model") or the harness's (the child was killed by a signal, failed
before or after the model's part, or exited without a result: GraderFault, "submit again"). The
child records each phase as it enters it (a phase file) and the phase it failed in (an error file).

What the agent is told never quotes the held-out split. Once the child has started generating, it
has read the split, and anything it prints or raises may quote it: a chat template can
`raise_exception(messages[-1]['content'])`, a jinja error names the key it could not find. Errors
from those phases therefore carry, in their message (the agent's), only the exception type and
advice; the log tail goes to `detail`, which the grader keeps in its private ledger. Errors while
loading involve only the agent's own files and keep their detail.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from rlbench.jsonio import read_json, write_json
from rlbench.lifeline import die_with_parent

SCRIPTS_DIR = Path(__file__).resolve().parents[1]
# Phases in which a failure is the submitted model's: loading it, generating with it (and scoring
# what it generated, which runs inside the task's evaluate).
MODEL_PHASES = frozenset({"loading", "generating"})
# Phases in which the child has read the held-out split: what it prints or raises may quote it.
# "scoring" (a judge, an execution sandbox, an environment reward) and "environment" (an L3
# rollout stepping its games between generation calls) are the harness's part.
HELD_OUT_PHASES = frozenset({"generating", "environment", "scoring", "writing"})
LOG_TAIL_LINES = 5
LOG_TAIL_BYTES = 64 * 1024  # only the end of the log is read: a chatty model must not cost memory
WITHHELD = "details are withheld because they may quote held-out data"
# An exception's type name as the child recorded it; anything else is not quoted.
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,99}")


class EvaluationError(RuntimeError):
    """The submitted model could not be evaluated: it failed to load, failed while generating, or
    took longer than the evaluation timeout. The agent's to fix.

    str(error) is what the agent is told; `detail`, when set, is the full story (the child's log
    tail), which may quote held-out data: for the grader's private ledger only."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


class GraderFault(RuntimeError):
    """The evaluation failed for a reason that is not the submitted model's (the child was killed,
    the harness broke): the same submission may well succeed when sent again.

    str(fault) is what the agent is told, `detail` the private full story (see EvaluationError);
    `signal_name` is set when the child was killed by a signal, `phase` where it was then."""

    def __init__(
        self, message: str, detail: str | None = None, signal_name: str | None = None, phase: str | None = None
    ):
        super().__init__(message)
        self.detail, self.signal_name, self.phase = detail, signal_name, phase

    @property
    def killed_with_model(self) -> bool:
        """Killed while the model was being loaded or run: most likely the model's size (out of
        memory), so a grader may stop retrying the same weights after a few such kills."""
        return self.signal_name is not None and self.phase in MODEL_PHASES


def evaluate_model(
    task_settings: dict,
    model_dir: Path,
    eval_dir: Path,
    evaluation: dict,
    on_phase: Callable[[str], None] | None = None,
    resources: dict | None = None,
    replicate: int = 0,
) -> dict:
    """Score model_dir on the held-out split; returns EvalResult.to_dict() (score, primary_metric,
    metrics, n, items) plus the backend and the time taken.

    on_phase(name) is called as the evaluation enters "setup", "loading", "generating" and
    "scoring", so a caller can tell a broken model (loading, generating) from a broken harness.
    resources: what the task's parts may use beyond the split (rlbench.tasks.base.EvalContext:
    judge_model_dir, judgment_cache, work_dir); replicate: which repeat of a noisy grader this is."""
    # Seconds spent in each phase (phase_seconds in the result): where an evaluation's time goes.
    phase_seconds: dict[str, float] = {}
    current = {"name": None, "since": time.perf_counter()}

    def report(name: str | None) -> None:
        """Enter a phase (None: the evaluation is over; the caller is not told, it keeps the last)."""
        now = time.perf_counter()
        if current["name"] is not None:
            phase_seconds[current["name"]] = phase_seconds.get(current["name"], 0.0) + now - current["since"]
        current.update(name=name, since=now)
        if on_phase is not None and name is not None:
            on_phase(name)

    report("setup")
    # The heavy imports belong to the harness: a broken environment must not read as a bad model.
    import torch  # noqa: F401

    from rlbench.tasks import EvalContext, get_task

    started = time.time()
    if not Path(eval_dir).is_dir():  # the grader's data, not the model: fail before the model phases
        raise FileNotFoundError(f"the held-out split is missing: {eval_dir}")
    task = get_task(task_settings)
    ctx = EvalContext(
        settings=task_settings,
        model_dir=Path(model_dir),
        eval_dir=Path(eval_dir),
        evaluation=evaluation,
        resources=dict(resources or {}),
        on_phase=report,
        replicate=replicate,
    )
    try:
        result = task.evaluate(ctx).to_dict()
    finally:
        ctx.close()
    report(None)
    result.update(
        backend=ctx.backend_name,
        replicate=replicate,
        eval_seconds=round(time.time() - started, 3),
        phase_seconds={name: round(seconds, 3) for name, seconds in phase_seconds.items()},
    )
    return result


def evaluation_resources(inputs, judgments: str | Path | None = None) -> dict:
    """What a task's evaluation may use beyond its split, from a rule's inputs (the level
    plug-ins' `judge_model`) and the task's judgment cache directory (tasks.base.EvalContext)."""
    resources = {}
    judge_model = inputs.get("judge_model") if hasattr(inputs, "get") else None
    if judge_model:
        resources["judge_model_dir"] = str(Path(judge_model).resolve())
    if judgments:
        resources["judgment_cache"] = str(Path(judgments).resolve())
    return resources


def noise_summary(scores: list[float]) -> dict:
    """The grader's noise from K evaluations of the same model: the scores, their spread, and the
    band shown beside every Δ of the task (half the range, in points: ±band)."""
    scores = [float(s) for s in scores]
    mean = sum(scores) / len(scores)
    std = (sum((s - mean) ** 2 for s in scores) / (len(scores) - 1)) ** 0.5 if len(scores) > 1 else 0.0
    return {
        "repeats": len(scores),
        "scores": scores,
        "mean": round(mean, 4),
        "std": round(std, 4),
        "min": min(scores),
        "max": max(scores),
        "band": round((max(scores) - min(scores)) / 2, 4),
    }


def _log_tail(log_path: Path) -> str:
    try:
        with open(log_path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - LOG_TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-LOG_TAIL_LINES:])


def _last_phase(phase_path: Path | None) -> str | None:
    """The last phase the child said it entered (None when it never got that far)."""
    try:
        phase = read_json(phase_path).get("phase") if phase_path is not None else None
    except (OSError, ValueError, AttributeError):
        return None
    return phase if isinstance(phase, str) else None


def _type_name(error: dict) -> str:
    """The type of the exception the child died of, as recorded; never any of its message."""
    name = error.get("type")
    if not isinstance(name, str):  # an error file from before the type was recorded: "Type: message"
        text = error.get("error")
        name = text.split(":", 1)[0] if isinstance(text, str) else ""
    return name if _TYPE_NAME.fullmatch(name) else "an unrecorded error"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def write_request(
    task_settings: dict,
    model_dir: Path,
    eval_dir: Path,
    evaluation: dict,
    work_dir: Path,
    resources: dict | None = None,
    replicate: int = 0,
) -> Path:
    """work_dir/request.json, what serve_request evaluates (in a fresh child or a warm worker:
    rlbench.workers); the result, error and phase files of an earlier attempt are removed."""
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("result.json", "error.json", "phase.json"):
        (work_dir / stale).unlink(missing_ok=True)
    request = work_dir / "request.json"
    write_json(
        request,
        {
            "task": task_settings,
            "model_dir": str(model_dir),
            "eval_dir": str(eval_dir),
            "evaluation": evaluation,
            "phase_path": str(work_dir / "phase.json"),
            # The task's scratch space lives in the evaluation's own directory, thrown away with it.
            "resources": {"work_dir": str(work_dir / "scratch"), **(resources or {})},
            "replicate": replicate,
        },
    )
    return request


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
        finally:
            shutil.rmtree(work_dir / "scratch", ignore_errors=True)
    return _outcome(proc.returncode, result_path, error_path, log_path, phase_path)


def _outcome(
    returncode: int, result_path: Path, error_path: Path, log_path: Path, phase_path: Path | None = None
) -> dict:
    """The child's result, or the failure it stands for, classified by fault; once the child has
    read the held-out split, the failure's message (the agent's) quotes nothing it printed."""
    tail = _log_tail(log_path)
    if returncode == 0 and result_path.exists():
        try:
            return read_json(result_path)
        except (OSError, ValueError) as exc:
            raise GraderFault(f"the evaluation's result file could not be read ({exc})") from None
    try:
        error = read_json(error_path) if error_path.exists() else {}
    except (OSError, ValueError):
        error = {}
    error = error if isinstance(error, dict) else {}
    phase = error.get("phase") if isinstance(error.get("phase"), str) else _last_phase(phase_path)
    held_out = phase in HELD_OUT_PHASES

    def told(message: str) -> tuple[str, str]:
        """(what the agent is told, the full detail): the log tail only where it cannot hold held-out data."""
        detail = f"{message}: {tail}"
        return (f"{message}; {WITHHELD}" if held_out else detail), detail

    if returncode < 0:
        name = _signal_name(-returncode)
        message, detail = told(f"the evaluation process was killed by {name} while {phase or 'starting'}")
        raise GraderFault(message, detail, signal_name=name, phase=phase)
    if returncode == 0:
        raise GraderFault(*told(f"the evaluation process exited without a result (phase {phase or 'unknown'})"))
    if phase == "generating":
        detail = f"evaluation failed while generating (exit code {returncode}): {error.get('error')!s} | log: {tail}"
        raise EvaluationError(
            f"generation failed on the held-out split ({_type_name(error)}, exit code {returncode}); {WITHHELD}: "
            "check that your chat template and generation work with task.py's format_prompt on the training data "
            "(render and generate a few training prompts with your checkpoint before submitting it)",
            detail,
        )
    if phase in MODEL_PHASES:
        raise EvaluationError(f"evaluation failed while {phase} the model (exit code {returncode}): {tail}")
    where = f" in its {phase} phase" if phase else ""
    raise GraderFault(*told(f"the evaluation process failed{where} (exit code {returncode})"))


def _child_main(request_path: str, result_path: str, error_path: str, parent_pid: str) -> None:
    """The child: arm the lifeline first, then evaluate; on failure record the phase it failed in."""
    die_with_parent(int(parent_pid))
    if not serve_request(request_path, result_path, error_path):
        sys.exit(1)


def serve_request(request_path: str | Path, result_path: str | Path, error_path: str | Path) -> bool:
    """Evaluate one request file (run_in_child's, or a warm worker's: rlbench.workers), writing
    the result file, or the error file with the phase it failed in; True on success. The exception
    itself is printed (its traceback goes to the evaluation's log), never raised."""
    phase = "setup"
    phase_path: Path | None = None

    def enter(name: str) -> None:
        """Record the phase before entering it, on disk too: a child killed by a signal writes no
        error file, and the grader must still know whether it had read the held-out split."""
        nonlocal phase
        phase = name
        if phase_path is not None:
            write_json(phase_path, {"phase": name}, durable=False)

    try:
        request = read_json(Path(request_path))
        phase_path = Path(request["phase_path"]) if request.get("phase_path") else None
        result = evaluate_model(
            request["task"],
            Path(request["model_dir"]),
            Path(request["eval_dir"]),
            request["evaluation"],
            enter,
            resources=request.get("resources"),
            replicate=int(request.get("replicate", 0)),
        )
        enter("writing")
        write_json(Path(result_path), result)
    except BaseException as exc:  # noqa: BLE001 - recorded with its phase; KeyboardInterrupt/SystemExit re-raised
        fault = "model" if phase in MODEL_PHASES else "harness"
        write_json(
            Path(error_path),
            {"phase": phase, "fault": fault, "type": type(exc).__name__, "error": f"{type(exc).__name__}: {exc}"},
        )
        if not isinstance(exc, Exception):
            raise
        traceback.print_exception(exc)
        return False
    return True


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        from rlbench.workers import worker_main

        worker_main(*sys.argv[2:])
    else:
        _child_main(*sys.argv[1:5])
