"""The evaluation request and what its outcome means: the request file, the errors, their classification.

A failed evaluation is classified by whose fault it was, because the agent is told different things:
the submitted model's (it failed while loading it or generating with it: EvaluationError, "fix your
model") or the harness's (the process was killed by a signal, failed before or after the model's part,
or exited without a result: GraderFault, "submit again"). The evaluating process records each phase as
it enters it (a phase file) and the phase it failed in (an error file).

What the agent is told never quotes the held-out split. Once the evaluation has started generating, it
has read the split, and anything it prints or raises may quote it: a chat template can
`raise_exception(messages[-1]['content'])`, a jinja error names the key it could not find. Errors
from those phases therefore carry, in their message (the agent's), only the exception type and
advice; the log tail goes to `detail`, which the grader keeps in its private ledger. Errors while
loading involve only the agent's own files and keep their detail.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from rlbench.fileio.jsonio import read_json, write_json

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


def write_request(
    task_settings: dict,
    model_dir: Path,
    eval_dir: Path,
    evaluation: dict,
    work_dir: Path,
    resources: dict | None = None,
    replicate: int = 0,
) -> Path:
    """work_dir/request.json, what evaluate.serve_request evaluates (in a fresh child or a warm worker:
    rlbench.evaluation.workers); the result, error and phase files of an earlier attempt are removed."""
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
    return name if isinstance(name, str) and _TYPE_NAME.fullmatch(name) else "an unrecorded error"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_outcome(
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
