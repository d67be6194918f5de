"""summary.json and the summary.jsonl records of one run directory, built from its route, process
metrics, iterations, failure types, mode audit and iteration stories; the run-level overview fields.
"""

from __future__ import annotations

from pathlib import Path

from rlbench.evaluation.evaluate import DELTA_FAMILY
from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.recording.ledger import SCORED, is_scored
from rlbench.recording.trace import summarize_trace
from rlbench.summaries.agent_code import code_files
from rlbench.summaries.artifacts import base_model_dir, model_version_count
from rlbench.summaries.failures import failure_type, improvement_success, interactive_failure
from rlbench.summaries.iterations import iterations
from rlbench.summaries.metrics import extra_metrics, load_run_meta, paper_metrics
from rlbench.summaries.mode_audit import audit_run_mode
from rlbench.summaries.routes import TRAINING_ROUTES, coding_success, run_route
from rlbench.summaries.stories import add_iteration_stories
from rlbench.summaries.submissions import entry_score, recorded_submissions


def summarize(
    run_dir: Path,
    run: dict,
    final: dict,
    baseline: dict,
    level: str | None = None,
    base_model: str | None = None,
    mode: str | None = None,
    integrity: dict | None = None,
    ledger: list[dict] | None = None,
    resources: dict | None = None,
) -> tuple[dict, list[dict]]:
    """summary.json and the summary.jsonl records of one run directory.

    baseline: the grader's baseline (score, fingerprint); final: final.json; base_model:
    models/<hf_id> (artifacts.json "base_model"); mode: the agent's operating mode (its registry
    entry, recorded in workspace.json; read from there when not given); ledger: the entries to summarize (a
    multi-task run's task: its view of the run's ledger, recording.ledger.task_view), else grader/ledger.jsonl;
    resources: the resource trace's summary (artifacts.json "resources", recording.trace.summarize_trace),
    read from resources.jsonl when not given.
    summary.json's `mode` and
    `mode_audit` (modes.audit_mode over the recorded code revisions) are ours, beside the
    reference's fields."""
    run_dir = Path(run_dir)
    workspace, grader = run_dir / "workspace", run_dir / "grader"
    ledger_path = grader / "ledger.jsonl"
    if ledger is None:
        ledger = list(read_jsonl(ledger_path)) if ledger_path.exists() else []
    submissions = recorded_submissions(ledger)
    base_model = base_model_dir(workspace, base_model)
    meta = load_run_meta(workspace, run, submissions, grader)
    records = iterations(
        submissions,
        grader_dir=grader,
        workspace=workspace,
        base_model=base_model,
        baseline_score=baseline.get("score"),
        baseline_fingerprint=baseline.get("fingerprint"),
        start_time=meta["start_time"],
        exit_code=run.get("exit_code"),
        level=level,
    )
    route = run_route(records)
    summary = {
        "labels": run.get("labels", {}),
        "level": level,
        "status": run["status"],
        "exit_code": run.get("exit_code"),
        "timed_out": run.get("timed_out"),
        "baseline": final.get("baseline_score", baseline.get("score")),
        # which baseline Δ is computed against (config evaluation.baseline_score), and both of them
        "baseline_choice": final.get("baseline_choice") or "first",
        "baseline_first": final.get("baseline_first", baseline.get("score")),
        "baseline_mean": final.get("baseline_mean", baseline.get("score_mean")),
        "best": final.get("score"),
        "delta": final.get("delta"),
        # config scoring.feedback: full (the reference: /submit reports on the whole held-out split) or split
        # (a final part the agent never sees scores of); the Δ family beside the paper's delta
        # (evaluation.evaluate.delta_family: clean_delta, oracle_delta, selection_gap are None in full mode)
        "feedback_mode": final.get("feedback_mode") or "full",
        **{name: final.get(name) for name in DELTA_FAMILY},
        "final_split": final.get("final_split"),
        "submissions": len(submissions),
        "valid_submissions": sum(1 for e in submissions if entry_score(e) > 0),  # the paper's "valid"
        "scored_submissions": sum(1 for e in submissions if is_scored(e)),
        "route": route,
        "coding_success": coding_success(route),
        "improvement_success": improvement_success(records),
        "failure_type": failure_type(run, records, level),
        "run_meta": meta,
        "metrics": paper_metrics(submissions, meta, baseline.get("score"), workspace, base_model),
        "metrics_extra": extra_metrics(ledger, submissions, baseline.get("score"), baseline.get("fingerprint")),
    }
    if mode is None and (run_dir / "workspace.json").is_file():
        manifest = read_json(run_dir / "workspace.json")
        mode = manifest.get("mode") if isinstance(manifest, dict) else None
    summary["mode"] = mode or "free"
    summary["mode_audit"] = audit_run_mode(run_dir, mode, ledger, baseline.get("fingerprint"), base_model)
    summary["integrity"] = integrity_summary(integrity)
    # The paper's leaderboard groups by (scaffold, driver LLM, mode): the coding-agent tool and its driver for
    # LLM agents (run.json `llm`), "reference" and no driver for the scripted reference agents. Token totals
    # come from the run's LLM gateway.
    llm = run.get("llm") if isinstance(run.get("llm"), dict) else {}
    summary["scaffold"] = (llm.get("agent_tool") or {}).get("name") or "reference"
    summary["driver"] = (llm.get("driver") or {}).get("model")
    summary["tokens"] = llm.get("tokens")
    summary["stopped_by"] = run.get("stopped_by")
    # The evaluation's own metrics (ours; "metrics" above are the paper's process metrics): which
    # metric the scores are (the primary one, delta's), the final evaluation's and the baseline's
    # whole metrics dicts, and the grader's noise measured on the baseline (its band goes beside delta).
    summary["primary_metric"] = final.get("primary_metric") or baseline.get("primary_metric")
    summary["eval_metrics"] = final.get("metrics")
    summary["decoding"] = final.get("decoding") or baseline.get("decoding")  # the model's (generation.decoding)
    summary["baseline_metrics"] = final.get("baseline_metrics") or baseline.get("metrics")
    summary["grader_noise"] = final.get("grader_noise") or baseline.get("grader_noise")
    if resources is None:
        resources = summarize_trace(run_dir / "resources.jsonl", run.get("gpus"))
    summary.update(run_overview(run_dir, run, meta, submissions, records, resources))
    summary["interactive_failure"] = interactive_failure(
        run_dir, run, records, level, baseline.get("score"), summary["failure_type"]
    )
    add_iteration_stories(grader, records)
    # The optional LLM narrative (rlbench.summaries.narrative.add_narrative) fills these in when it is on.
    summary["narrative"] = None
    for record in records:
        record["narrative"] = None
    return summary, records


def integrity_summary(integrity: dict | None) -> dict | None:
    """summary.json's `integrity` (ours): the audit's verdict (integrity.json: status clean / flagged /
    incomplete, its label and reasons) and the lineage verdict and contamination counts it rests on;
    None for a run audited before the audit existed."""
    if not isinstance(integrity, dict):
        return None
    contamination = integrity.get("contamination") if isinstance(integrity.get("contamination"), dict) else {}
    lineage = integrity.get("lineage") if isinstance(integrity.get("lineage"), dict) else {}
    judge = integrity.get("trace_judge") if isinstance(integrity.get("trace_judge"), dict) else None
    return {
        "status": integrity.get("status"),
        "label": integrity.get("label"),
        "reasons": integrity.get("reasons") or [],
        "incomplete": integrity.get("incomplete") or [],
        "split_notes": integrity.get("split_notes") or [],
        "contaminated_items": len({str(m.get("item")) for m in contamination.get("flagged") or []}),
        "lineage": lineage.get("verdict"),
        "trace_judge": None if judge is None else {
            "flagged": [v.get("kind") for v in judge.get("verdicts") or [] if isinstance(v, dict) and v.get("flagged")],
            "failed": judge.get("judge_failed") or 0,
        },
    }


def run_overview(
    run_dir: Path, run: dict, meta: dict, submissions: list[dict], records: list[dict], resources: dict | None
) -> dict:
    """summary.json's run-level overview fields (ours, beside the reference's):

    budget_s (run_meta timeout_s), duration_s (run_meta end_time - start_time), best_index (1-based
    index of the best evaluated submission, the first of ties), code_files (code files in the
    final code/), model_versions (checkpoint directories with a config.json under output/),
    zero_score_share (share of submissions scoring 0, failed ones included), exec_success (any
    submission evaluated), cost_usd (the LLM gateway's cost), gpu_hours_busy and gpu_hours_idle
    (GPU-hours of the run's GPUs in which the resource trace saw them busy or idle, summed over its
    GPUs: `resources` gpu_hours, the trace's summary; None without a GPU trace, i.e. without nvidia-smi), timeline (per
    submission: iteration, since_start_s, score, scored, train_type) and routes_used (the training
    routes of the iterations, in order of first use)."""
    workspace = Path(run_dir) / "workspace"
    start, end = meta.get("start_time"), meta.get("end_time")
    scored = [(i, e) for i, e in enumerate(submissions, start=1) if is_scored(e)]
    best = max(scored, key=lambda pair: entry_score(pair[1]), default=None)
    llm = run.get("llm") if isinstance(run.get("llm"), dict) else {}
    tokens = llm.get("tokens") if isinstance(llm.get("tokens"), dict) else {}
    cost = tokens.get("cost_usd")
    hours = (resources or {}).get("gpu_hours")
    routes: list[str] = []
    for record in records:
        if record["train_type"] in TRAINING_ROUTES and record["train_type"] not in routes:
            routes.append(record["train_type"])
    return {
        "budget_s": meta.get("timeout_s"),
        "duration_s": end - start if start is not None and end is not None else None,
        "best_index": best[0] if best else None,
        "code_files": 0 if (workspace / "code").is_symlink() else len(code_files(workspace / "code")),
        "model_versions": model_version_count(workspace),
        "zero_score_share": (
            sum(1 for e in submissions if entry_score(e) == 0) / len(submissions) if submissions else None
        ),
        "exec_success": bool(scored),
        "cost_usd": float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
        "gpu_hours_busy": hours["busy"] if hours else None,
        "gpu_hours_idle": hours["idle"] if hours else None,
        "timeline": [
            {
                "iteration": record["iteration"],
                "since_start_s": record["since_start_s"],
                "score": record["score"],
                "scored": record["grader_status"] in SCORED,
                "train_type": record["train_type"],
            }
            for record in records
        ],
        "routes_used": routes,
    }
