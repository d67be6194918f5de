"""Rule prepare_data: write a task's training split (what agents get).

The split is built beside the recorded one and takes its place only once complete (manifest included):
a build that fails leaves the recorded split as it was."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import write_json
from rlbench.fileio.staging import building, install
from rlbench.tasks import get_task

settings = snakemake.params.task
# What a level plug-in built for the split (an L3 task's games): every named input.
sources = {name: Path(path) for name, path in snakemake.input.items()}
extra = {"sources": sources} if sources else {}
train_dir = Path(snakemake.output.train).parent
with building(train_dir) as staging:
    manifest = get_task(settings).prepare_train(settings, staging, **extra)
    write_json(staging / Path(snakemake.output.manifest).name, manifest)
    install(staging, train_dir)
print(f"prepared the {settings['name']} training split: {manifest}", file=sys.stderr)
