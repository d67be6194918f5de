"""Rule evaluate_final: re-evaluate the best submission's snapshot with a fresh evaluator."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.evaluation.evaluate import delta_baseline, evaluate_model, evaluation_resources
from rlbench.grader.fingerprint import fingerprint, fingerprint_matches
from rlbench.fileio.jsonio import read_json, write_json
from rlbench.recording.provenance import provenance

settings, evaluation = snakemake.params.task, snakemake.params.evaluation
artifacts = read_json(Path(snakemake.input.artifacts))
baseline = read_json(Path(snakemake.input.baseline))
baseline_score, baseline_choice = delta_baseline(baseline, evaluation)
final = {
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
    result = evaluate_model(settings, model_dir, Path(snakemake.input.eval).parent, evaluation, resources=resources)
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
print(f"final: {final['status']} score {final['score']} delta {final['delta']}", file=sys.stderr)
write_json(Path(snakemake.output.final), final)
