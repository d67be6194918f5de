"""Rule generate_games: build the games of one split of an interactive (L3) task."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.tasks import get_task
from rlbench.tasks.base import read_salt

settings = snakemake.params.task
split = snakemake.wildcards.split
# The salt is an input file, never a param: params are stored in .snakemake/metadata.
salt = read_salt(Path(snakemake.input.salt)) if snakemake.input.get("salt") else None
manifest = get_task(settings).build_games(
    settings, split, Path(snakemake.output.games), salt=salt, workers=max(1, snakemake.threads)
)
print(f"built the {split} games of {settings['name']}: {manifest.get('summary', {})}", file=sys.stderr)
