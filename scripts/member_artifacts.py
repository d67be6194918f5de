"""Rule member_artifacts: one task's view of a multi-task run, read downstream as a single-task run's: its
artifacts.json (the task's best submission and snapshot, rlbench.summaries.multi.member_artifacts) and its
ledger.jsonl (rlbench.recording.ledger.task_view: the submissions evaluated on that task, with its numbers)."""

import json
import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import read_json, read_jsonl, write_json
from rlbench.recording.ledger import task_view
from rlbench.summaries.multi import member_artifacts

run_json = Path(snakemake.input.run)
run_dir = run_json.parent
task = snakemake.wildcards.task
ledger_path = run_dir / "grader" / "ledger.jsonl"
view = task_view(list(read_jsonl(ledger_path)) if ledger_path.exists() else [], task)
Path(snakemake.output.ledger).write_text("".join(json.dumps(entry) + "\n" for entry in view))
artifacts = member_artifacts(read_json(Path(snakemake.input.artifacts)), read_json(run_json), run_dir, task)
write_json(Path(snakemake.output.artifacts), artifacts)
print(f"{task}: {len(view)} entries, best {artifacts['best']}", file=sys.stderr)
