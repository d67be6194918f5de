"""Rule evaluate_baseline: score the untouched base model once per task x model.

A noisy grader (a judge, a nondeterministic environment: the task's grader_noise_repeats K > 1;
sampled decoding: K >= 3) evaluates it K times; the first evaluation is the baseline score (the one a resubmitted base
model gets from the grader's cache) and the spread of all K is stored as the task's grader noise.

In scoring.feedback split (a partition.json input) the base model is scored on each part of the held-out
split, K times each: the feedback part is the top level (score, metrics, n, grader_noise: what the grader
reports and improvements are computed against), the final part is `final_split` (the same fields), and
`feedback_mode` and `partition` (counts, share, the salt's sha256, the digest; never the items) say so.
"""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.evaluation.evaluate import evaluate_model, evaluation_resources, noise_summary
from rlbench.grader.fingerprint import checkpoint_manifest
from rlbench.fileio.jsonio import read_json, write_json
from rlbench.recording.provenance import provenance
from rlbench.tasks import get_task
from rlbench.tasks.base import FEEDBACK, FINAL, partition_record

settings, evaluation = snakemake.params.task, snakemake.params.evaluation
model_dir, eval_dir = Path(snakemake.input.model), Path(snakemake.input.eval).parent
resources = evaluation_resources(snakemake.input, snakemake.params.judgments)
# The model registry's decoding (generation:), for the tasks that take it; the grader and the final
# evaluation read it back from this result, so that a submission decodes as its base model.
model_generation = snakemake.params.model_generation
resources["model_generation"] = model_generation
manifest = checkpoint_manifest(model_dir)
digest = manifest["fingerprint"]
task = get_task(settings)
repeats = task.noise_repeats(settings, task.decoding(model_generation))
partition = read_json(Path(snakemake.input.partition)) if snakemake.input.get("partition") else None


def evaluate_repeats(items=None, label=""):
    """The first evaluation's result and the scores of all K (on `items` only, when given)."""
    given = resources if items is None else {**resources, "items": items}
    first = evaluate_model(settings, model_dir, eval_dir, evaluation, resources=given)
    scores = [first["score"]]
    for replicate in range(1, repeats):
        scores.append(evaluate_model(settings, model_dir, eval_dir, evaluation, resources=given, replicate=replicate)["score"])
        print(f"baseline{label} repeat {replicate}: {scores[-1]}", file=sys.stderr)
    return first, scores


result, scores = evaluate_repeats(partition[FEEDBACK]["items"] if partition else None, " (feedback)" if partition else "")
if partition is not None:
    final_result, final_scores = evaluate_repeats(partition[FINAL]["items"], " (final)")
    final_noise = noise_summary(final_scores)
    result.update(
        feedback_mode="split",
        partition=partition_record(partition),
        final_split={
            **{k: final_result[k] for k in ("score", "primary_metric", "metrics", "n")},
            "grader_noise": final_noise,
            "score_first": final_scores[0],
            "score_mean": final_noise["mean"],
        },
    )
noise = noise_summary(scores)
result.update(
    task=snakemake.wildcards.task,
    model=snakemake.wildcards.model,
    fingerprint=digest,
    # the checkpoint files' total: what bounds a submission's size (grader.checkpoint_size_factor)
    model_bytes=sum(f["size"] for f in manifest["files"]),
    model_generation=model_generation,
    grader_noise=noise,
    # score is the first evaluation (the reference's single one); the mean of the K repeats beside it
    # (config evaluation.baseline_score chooses which Δ uses: evaluation.evaluate.delta_baseline)
    score_first=scores[0],
    score_mean=noise["mean"],
    provenance=provenance(
        settings,
        data={"eval": read_json(Path(snakemake.input.eval_manifest))},
        models={"base": digest},
        evaluation=evaluation,
        judge=read_json(Path(snakemake.input.judge_config)) if snakemake.input.get("judge_config") else None,
        execution=read_json(Path(snakemake.input.execution_check)) if snakemake.input.get("execution_check") else None,
    ),
)
print(f"baseline {snakemake.wildcards.task}/{snakemake.wildcards.model}: {result['score']} ({result['primary_metric']})", file=sys.stderr)
write_json(Path(snakemake.output.baseline), result)
