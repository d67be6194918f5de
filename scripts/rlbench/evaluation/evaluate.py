"""Evaluate one model on one task's held-out split in this process.

The grader, the baseline and the final evaluation all go through `evaluate_model`, so the three
agree by construction; the grader runs it in a fresh child (rlbench.evaluation.child) or a warm
worker (rlbench.evaluation.workers), both through `serve_request`.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Callable

from rlbench.evaluation.request import MODEL_PHASES
from rlbench.generation.chat_format import USED_OWN, USED_PLAIN
from rlbench.fileio.jsonio import read_json, write_json


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
        decoding=task.decoding((resources or {}).get("model_generation")),
    )
    try:
        evaluated = task.evaluate(ctx)
        evaluated.check_metric(task_settings)  # the registry's `metric:` is what Δ will be computed on
        result = evaluated.to_dict()
    finally:
        ctx.close()
    report(None)
    result.update(
        backend=ctx.backend_name,
        chat_template=ctx.chat_template,
        decoding=ctx.decoding,
        replicate=replicate,
        eval_seconds=round(time.time() - started, 3),
        phase_seconds={name: round(seconds, 3) for name, seconds in phase_seconds.items()},
    )
    return result


def evaluation_resources(inputs, judgments: str | Path | None = None, baseline: dict | None = None) -> dict:
    """What a task's evaluation may use beyond its split, from a rule's inputs (the level
    plug-ins' `judge_model`), the task's judgment cache directory and, for a submission, the
    baseline's result: the base model's chat template, the protocol's, and its registry
    `generation:` (tasks.base.EvalContext)."""
    resources = {}
    if baseline is not None:
        resources["base_chat_template"] = base_chat_template(baseline)
        resources["model_generation"] = baseline.get("model_generation")
    judge_model = inputs.get("judge_model") if hasattr(inputs, "get") else None
    if judge_model:
        resources["judge_model_dir"] = str(Path(judge_model).resolve())
    if judgments:
        resources["judgment_cache"] = str(Path(judgments).resolve())
    return resources


def base_chat_template(baseline: dict) -> str | None:
    """The chat template the base model was evaluated with (its own; None: it has none), from the
    baseline's result (evaluate_model's `chat_template` record)."""
    record = baseline.get("chat_template")
    if not isinstance(record, dict) or record.get("used") not in (USED_OWN, USED_PLAIN):
        raise ValueError(
            "the baseline result does not say which chat template the base model was evaluated with "
            "(recorded by an older harness, or not the base model's own evaluation): rerun the baseline, "
            "e.g. snakemake --forcerun evaluate_baseline"
        )
    return record.get("template")


BASELINE_CHOICES = ("first", "mean")


def delta_baseline(baseline: dict, evaluation: dict | None) -> tuple[float, str]:
    """(the baseline score Δ is computed against, which one) by config evaluation.baseline_score:
    "first" (default; the reference's single evaluation, and what a resubmitted base model gets
    from the grader's cache) or "mean" (the mean of the K grader-noise repeats, as some of the
    paper's baselines are: ALFWorld 4.85 = 6.5/134, DeepSearchQA 11.75)."""
    choice = (evaluation or {}).get("baseline_score") or "first"
    if choice not in BASELINE_CHOICES:
        raise ValueError(f"evaluation.baseline_score {choice!r}: allowed {', '.join(BASELINE_CHOICES)}")
    if choice == "mean":
        noise = baseline.get("grader_noise") or {}
        mean = baseline.get("score_mean", noise.get("mean"))
        if mean is None:
            raise ValueError("the baseline records no mean of its repeats (an older harness): rerun evaluate_baseline")
        return float(mean), choice
    return float(baseline["score"]), choice


def delta_family(
    feedback_score: float | None,
    clean_score: float | None,
    oracle_score: float | None,
    baseline_feedback: float,
    baseline_final: float | None,
    band_feedback: float | None,
    band_final: float | None,
) -> dict:
    """The Δs of a run graded with a final split (config scoring.feedback split), each with its noise band:

    feedback_delta: the selected submission's (the best on the feedback split, which /submit reported)
    feedback-split score minus the base model's there: the paper's Δ, on the split the agent selected on;
    clean_delta: the same submission's final-split score minus the base model's there (no selection on it);
    oracle_delta: the best final-split score the grader recorded for any submission minus the base model's
    there (what the best pick could have had; from the grader's records, not re-evaluated);
    selection_gap: feedback_delta - clean_delta, how much picking on the reported scores inflated Δ.
    Bands: ± half the range of the base model's K evaluations on that split (noise_summary); the gap's is
    the sum of the two (a difference of two noisy Δs). A Δ whose score is unknown is None, its band too.
    In full mode (baseline_final None) only feedback_delta is set: the whole split is the feedback split."""

    def delta(score: float | None, base: float | None) -> float | None:
        return None if score is None or base is None else round(float(score) - float(base), 4)

    feedback, clean = delta(feedback_score, baseline_feedback), delta(clean_score, baseline_final)
    oracle = delta(oracle_score, baseline_final)
    gap = None if feedback is None or clean is None else round(feedback - clean, 4)
    gap_band = None if band_feedback is None or band_final is None else round(band_feedback + band_final, 4)
    return {
        "feedback_delta": feedback,
        "feedback_delta_band": band_feedback if feedback is not None else None,
        "clean_delta": clean,
        "clean_delta_band": band_final if clean is not None else None,
        "oracle_delta": oracle,
        "oracle_delta_band": band_final if oracle is not None else None,
        "selection_gap": gap,
        "selection_gap_band": gap_band if gap is not None else None,
    }


DELTA_FAMILY = tuple(
    name for delta in ("feedback_delta", "clean_delta", "oracle_delta", "selection_gap") for name in (delta, f"{delta}_band")
)


def base_model_bytes(baseline: dict) -> int:
    """The base model's checkpoint files' total (evaluate_baseline's `model_bytes`)."""
    value = baseline.get("model_bytes")
    if not isinstance(value, int) or value <= 0:
        raise ValueError(
            "the baseline result does not record the base model's size (model_bytes: recorded by an older "
            "harness): rerun the baseline, e.g. snakemake --forcerun evaluate_baseline"
        )
    return value


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


def serve_request(request_path: str | Path, result_path: str | Path, error_path: str | Path) -> bool:
    """Evaluate one request file (run_in_child's, or a warm worker's: rlbench.evaluation.workers), writing
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
