"""Rule prepare_model: materialise a base model as a safetensors directory."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.models.materialise import prepare_model

info = prepare_model(snakemake.params.spec, Path(snakemake.output.model))
print(f"prepared model {snakemake.wildcards.model}: {info}", file=sys.stderr)
