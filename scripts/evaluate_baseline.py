"""Rule evaluate_baseline: score the untouched base model once per task x model."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.evaluation import evaluate_model
from rlbench.grader.checks import fingerprint
from rlbench.jsonio import read_json, write_json
from rlbench.provenance import provenance

settings, evaluation = snakemake.params.task, snakemake.params.evaluation
model_dir = Path(snakemake.input.model)
digest = fingerprint(model_dir)
result = evaluate_model(settings, model_dir, Path(snakemake.input.eval).parent, evaluation)
result.update(
    task=snakemake.wildcards.task,
    model=snakemake.wildcards.model,
    fingerprint=digest,
    provenance=provenance(
        settings, data={"eval": read_json(Path(snakemake.input.eval_manifest))}, models={"base": digest}, evaluation=evaluation
    ),
)
print(f"baseline {snakemake.wildcards.task}/{snakemake.wildcards.model}: {result['score']}", file=sys.stderr)
write_json(Path(snakemake.output.baseline), result)
