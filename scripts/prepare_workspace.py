"""Rule prepare_workspace: a fresh workspace with the training split only (never the held-out one)."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.jsonio import write_json
from rlbench.tasks import get_task
from rlbench.workspace import prepare_workspace

settings = snakemake.params.task
manifest = prepare_workspace(
    Path(snakemake.params.workspace),
    get_task(settings),
    settings,
    Path(snakemake.input.model),
    snakemake.params.hf_id,
    Path(snakemake.input.train).parent,
    mode=snakemake.params.mode,
)
print(f"workspace with {len(manifest['files'])} files", file=sys.stderr)
write_json(Path(snakemake.output.manifest), manifest)
