"""Rule judge_config: the judge's record, checked ready before any evaluation asks it anything."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import write_json
from rlbench.scoring.judges import judge_record

judge_model = snakemake.input.get("judge_model")
record = judge_record(snakemake.params.judge, model_dir=Path(judge_model) if judge_model else None)
print(f"judge for {snakemake.params.task}: {record}", file=sys.stderr)
write_json(Path(snakemake.output.judge), record)
