"""Rule prepare_data: write a task's training split and its held-out split."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.jsonio import write_json
from rlbench.tasks import get_task

settings = snakemake.params.task
manifest = get_task(settings).prepare(
    settings, Path(snakemake.output.train).parent, Path(snakemake.output.eval).parent
)
print(f"prepared {settings['name']}: {manifest}", file=sys.stderr)
write_json(Path(snakemake.output.manifest), manifest)
