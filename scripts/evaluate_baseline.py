"""Rule evaluate_baseline: score the untouched base model once per task x model."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.evaluation import evaluate_model
from rlbench.grader.checks import fingerprint
from rlbench.jsonio import write_json

model_dir = Path(snakemake.input.model)
result = evaluate_model(snakemake.params.task, model_dir, Path(snakemake.input.eval).parent, snakemake.params.evaluation)
result.update(task=snakemake.wildcards.task, model=snakemake.wildcards.model, fingerprint=fingerprint(model_dir))
print(f"baseline {snakemake.wildcards.task}/{snakemake.wildcards.model}: {result['score']}", file=sys.stderr)
write_json(Path(snakemake.output.baseline), result)
