"""Rule prepare_workspace: a fresh workspace with the training split only (never the held-out one).

A new attempt's workspace is built first; only once it is complete is the previous attempt archived
(rlbench.agent_run.workspace.replace_workspace)."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.agent_run.workspace import replace_workspace
from rlbench.config import current_task_settings
from rlbench.fileio.jsonio import write_json
from rlbench.tasks import get_task

# The description may mention evaluation settings; they are read here, not as params, so that
# changing them does not rebuild workspaces of finished runs.
settings = current_task_settings(snakemake.config, snakemake.wildcards.task)
manifest, archived = replace_workspace(
    Path(snakemake.output.manifest).parent,
    get_task(settings),
    settings,
    Path(snakemake.input.model),
    snakemake.params.hf_id,
    Path(snakemake.input.train).parent,
    mode=snakemake.params.mode,
)
if archived is not None:
    print(f"archived the previous attempt to {archived}", file=sys.stderr)
print(f"workspace with {len(manifest['files'])} files", file=sys.stderr)
write_json(Path(snakemake.output.manifest), manifest)
