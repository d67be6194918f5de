"""Rule evaluate_final: re-evaluate the best submission's snapshot with a fresh evaluator.

`delta` is the paper's: the best submission's re-evaluated score minus the base model's, on the split /submit
reported on. In scoring.feedback split (a partition.json input) the best submission (the best on the feedback
split) is re-evaluated on each part: the feedback part is the top level (score, metrics, n, delta), the final
part is `final_split` (score, metrics, n, the base model's final-split score); the oracle is the best final-split
score among the grader's private records (its ledger's `final`, on the same partition; not re-evaluated). The Δ
family (evaluation.evaluate.delta_family: feedback_delta, clean_delta, oracle_delta, selection_gap and their
*_band) is in both modes; in full mode only feedback_delta (= delta) is set.
"""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.evaluation.evaluate import delta_baseline, delta_family, evaluate_model, evaluation_resources
from rlbench.grader.fingerprint import fingerprint, fingerprint_matches
from rlbench.fileio.jsonio import read_json, read_jsonl, write_json
from rlbench.recording.ledger import is_scored
from rlbench.recording.provenance import provenance
from rlbench.tasks.base import FEEDBACK, FINAL, partition_record

settings, evaluation = snakemake.params.task, snakemake.params.evaluation
artifacts = read_json(Path(snakemake.input.artifacts))
baseline = read_json(Path(snakemake.input.baseline))
baseline_score, baseline_choice = delta_baseline(baseline, evaluation)
partition = read_json(Path(snakemake.input.partition)) if snakemake.input.get("partition") else None
if partition is not None and not isinstance(baseline.get("final_split"), dict):
    raise RuntimeError("the baseline has no final-split score (scoring.feedback split): rerun evaluate_baseline")
final_base = delta_baseline(baseline["final_split"], evaluation)[0] if partition is not None else None
final = {
    "feedback_mode": "split" if partition is not None else "full",
    # what Δ is computed against (evaluation.baseline_score: the first evaluation, or the repeats' mean)
    "baseline_score": baseline_score,
    "baseline_choice": baseline_choice,
    "baseline_first": baseline["score"],
    "baseline_mean": baseline.get("score_mean"),
    "baseline_metrics": baseline.get("metrics"),
    "primary_metric": baseline.get("primary_metric"),
    "grader_noise": baseline.get("grader_noise"),
    "score": None,
    "delta": None,
    "best_submission": artifacts["best"],
}
if artifacts["best_model"] is None:
    final["status"] = "no_valid_submission"
else:
    model_dir = Path(artifacts["best_model"])
    digest = fingerprint(model_dir)
    if not fingerprint_matches(model_dir, artifacts["best"]["fingerprint"], current=digest):
        raise RuntimeError(f"{model_dir} changed since it was graded (fingerprint mismatch); rerun the agent")
    # Rendered with the base model's chat template, as the grader rendered it (generation.chat_format).
    resources = evaluation_resources(snakemake.input, snakemake.params.judgments, baseline=baseline)
    eval_dir = Path(snakemake.input.eval).parent
    if partition is None:
        result = evaluate_model(settings, model_dir, eval_dir, evaluation, resources=resources)
    else:
        result = evaluate_model(settings, model_dir, eval_dir, evaluation, resources={**resources, "items": partition[FEEDBACK]["items"]})
        clean = evaluate_model(settings, model_dir, eval_dir, evaluation, resources={**resources, "items": partition[FINAL]["items"]})
        final["final_split"] = {
            **{k: clean[k] for k in ("score", "primary_metric", "metrics", "n")},
            "baseline_score": final_base,
        }
    final.update(result, status="evaluated", fingerprint=digest)
    final["delta"] = round(result["score"] - baseline_score, 4)
    final["provenance"] = provenance(
        settings,
        data={"eval": read_json(Path(snakemake.input.eval_manifest))},
        models={"base": baseline["fingerprint"], "submission": digest},
        evaluation=evaluation,
        judge=read_json(Path(snakemake.input.judge_config)) if snakemake.input.get("judge_config") else None,
        execution=read_json(Path(snakemake.input.execution_check)) if snakemake.input.get("execution_check") else None,
    )
if partition is not None:
    # The oracle: the best final-split score the grader recorded (privately) for any scored submission.
    # (a multi-task run's task: that task's view of the run's ledger, rule member_artifacts)
    ledger_path = Path(snakemake.input.get("ledger") or Path(snakemake.output.final).parent / "grader" / "ledger.jsonl")
    recorded = [
        e["final"]["score"]
        for e in (read_jsonl(ledger_path) if ledger_path.exists() else [])
        if is_scored(e) and isinstance(e.get("final"), dict) and e["final"].get("partition") == partition["digest"]
    ]
    final["partition"] = partition_record(partition)
    final.setdefault("final_split", {"score": None, "baseline_score": final_base})
    final["final_split"]["oracle_score"] = max(recorded, default=None)
    final["final_split"]["grader_noise"] = baseline["final_split"].get("grader_noise")
final.update(
    delta_family(
        final["score"],
        (final.get("final_split") or {}).get("score"),
        (final.get("final_split") or {}).get("oracle_score"),
        baseline_score,
        final_base,
        (baseline.get("grader_noise") or {}).get("band"),
        ((baseline.get("final_split") or {}).get("grader_noise") or {}).get("band"),
    )
)
print(f"final: {final['status']} score {final['score']} delta {final['delta']}", file=sys.stderr)
write_json(Path(snakemake.output.final), final)
