"""Rule prepare_eval_data: write a task's held-out split, disjoint from its training split.

The split is built beside the recorded one and takes its place only once complete (manifest included):
a build that fails leaves the recorded split as it was."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import write_json
from rlbench.fileio.staging import building, install
from rlbench.tasks import get_task
from rlbench.tasks.base import read_salt

settings = snakemake.params.task
# The salt is an input file, never a param: params are stored in .snakemake/metadata. Hub sources have none.
salt = read_salt(Path(snakemake.input.salt)) if snakemake.input.get("salt") else None
# What a level plug-in built for the split (an L3 task's games): every input but the two above.
sources = {name: Path(path) for name, path in snakemake.input.items() if name not in ("train", "salt")}
extra = {"sources": sources} if sources else {}
eval_dir = Path(snakemake.output.eval).parent
with building(eval_dir) as staging:
    manifest = get_task(settings).prepare_eval(
        settings, Path(snakemake.input.train).parent, staging, salt=salt, **extra
    )
    write_json(staging / Path(snakemake.output.manifest).name, manifest)
    install(staging, eval_dir)
print(f"prepared the {settings['name']} held-out split: {manifest}", file=sys.stderr)
