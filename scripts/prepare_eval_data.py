"""Rule prepare_eval_data: write a task's held-out split, disjoint from its training split."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.jsonio import write_json
from rlbench.tasks import get_task

settings = snakemake.params.task
manifest = get_task(settings).prepare_eval(
    settings, Path(snakemake.input.train).parent, Path(snakemake.output.eval).parent
)
print(f"prepared the {settings['name']} held-out split: {manifest}", file=sys.stderr)
write_json(Path(snakemake.output.manifest), manifest)
