"""Rule summarize_multi: a multi-task run's own summary.json and summary.md (rlbench.summaries.multi.run_summary),
from its tasks' summaries: per task the best submission's re-evaluated score and Δ, the mean Δ over the tasks, the
joint best, and which tasks each submission targeted."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import read_json, read_jsonl, write_json
from rlbench.summaries.multi import run_markdown, run_summary

run_json = Path(snakemake.input.run)
ledger_path = run_json.parent / "grader" / "ledger.jsonl"
members = {task: read_json(Path(path)) for task, path in zip(snakemake.params.tasks, snakemake.input.members)}
wildcards = snakemake.wildcards
summary = run_summary(
    wildcards.tasks,
    {"model": wildcards.model, "agent": wildcards.agent, "seed": wildcards.seed},
    read_json(run_json),
    members,
    list(read_jsonl(ledger_path)) if ledger_path.exists() else [],
)
write_json(Path(snakemake.output.summary), summary)
Path(snakemake.output.markdown).write_text(run_markdown(summary))
print(f"mean delta {summary['multi']['mean_delta']} over {', '.join(members)}", file=sys.stderr)
