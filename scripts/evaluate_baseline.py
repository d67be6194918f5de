"""Rule evaluate_baseline: score the untouched base model once per task x model.

A noisy grader (a judge, a nondeterministic environment: the task's grader_noise_repeats K > 1)
evaluates it K times; the first evaluation is the baseline score (the one a resubmitted base
model gets from the grader's cache) and the spread of all K is stored as the task's grader noise.
"""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.evaluation.evaluate import evaluate_model, evaluation_resources, noise_summary
from rlbench.grader.fingerprint import checkpoint_manifest
from rlbench.fileio.jsonio import read_json, write_json
from rlbench.recording.provenance import provenance
from rlbench.tasks import get_task

settings, evaluation = snakemake.params.task, snakemake.params.evaluation
model_dir, eval_dir = Path(snakemake.input.model), Path(snakemake.input.eval).parent
resources = evaluation_resources(snakemake.input, snakemake.params.judgments)
manifest = checkpoint_manifest(model_dir)
digest = manifest["fingerprint"]
repeats = get_task(settings).noise_repeats(settings)
result = evaluate_model(settings, model_dir, eval_dir, evaluation, resources=resources)
scores = [result["score"]]
for replicate in range(1, repeats):
    scores.append(evaluate_model(settings, model_dir, eval_dir, evaluation, resources=resources, replicate=replicate)["score"])
    print(f"baseline repeat {replicate}: {scores[-1]}", file=sys.stderr)
result.update(
    task=snakemake.wildcards.task,
    model=snakemake.wildcards.model,
    fingerprint=digest,
    # the checkpoint files' total: what bounds a submission's size (grader.checkpoint_size_factor)
    model_bytes=sum(f["size"] for f in manifest["files"]),
    grader_noise=noise_summary(scores),
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
