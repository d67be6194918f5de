"""Rule prepare_data: write a task's training split (what agents get)."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import write_json
from rlbench.tasks import get_task

settings = snakemake.params.task
# What a level plug-in built for the split (an L3 task's games): every named input.
sources = {name: Path(path) for name, path in snakemake.input.items()}
extra = {"sources": sources} if sources else {}
manifest = get_task(settings).prepare_train(settings, Path(snakemake.output.train).parent, **extra)
print(f"prepared the {settings['name']} training split: {manifest}", file=sys.stderr)
write_json(Path(snakemake.output.manifest), manifest)
