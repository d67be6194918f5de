"""Rule prepare_workspace_multi: a multi-task run's fresh workspace: every task's training split, description and
task files under tasks/<task>/ (never a held-out split), one base model, one output/ (rlbench.agent_run.workspace).
As prepare_workspace, the previous attempt is archived only once the new workspace is complete."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.agent_run.workspace import replace_multi_workspace
from rlbench.config import current_task_settings
from rlbench.fileio.jsonio import write_json
from rlbench.tasks import get_task

members = []
for k, task in enumerate(snakemake.params.tasks):
    # Read here, not as params (as prepare_workspace does): evaluation settings never rebuild a workspace.
    settings = current_task_settings(snakemake.config, task)
    members.append((get_task(settings), settings, Path(snakemake.input[f"m{k}_train"]).parent))
manifest, archived = replace_multi_workspace(
    Path(snakemake.output.manifest).parent,
    members,
    Path(snakemake.input.model),
    snakemake.params.hf_id,
    mode=snakemake.params.mode,
)
if archived is not None:
    print(f"archived the previous attempt to {archived}", file=sys.stderr)
print(f"multi-task workspace ({', '.join(snakemake.params.tasks)}) with {len(manifest['files'])} files", file=sys.stderr)
write_json(Path(snakemake.output.manifest), manifest)
