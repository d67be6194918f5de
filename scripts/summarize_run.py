"""Rule summarize_run: process metrics (summary.json), the per-iteration report (summary.md,
summary.jsonl) and the reference's per-run reports/ (metrics.json, figures/score_trajectory.png/.svg).

summary.json["metrics"] holds the paper's ten process metrics only (the reference's definitions);
summary.json["metrics_extra"] holds ours, and so do "mode" (the agent's operating mode, from
workspace.json) and "mode_audit" (the mode judged against the training methods of the recorded
code revisions, rlbench.summaries.modes), the run overview (budget, duration, timeline, routes used...) and
"interactive_failure" (L3 runs). The ledger, the code revisions and snapshots and run_meta.json
(grader/; the agent's copy in workspace/ only for runs recorded before the grader kept its own) are
read beside run.json. The optional LLM narrative (params.narrative, off by default) is asked through the judge backend, cached under
params.narrative_cache; a local judge's model comes as input.judge_model.
"""

import json
import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.summaries.iterations import jsonl_record
from rlbench.summaries.markdown import summary_markdown
from rlbench.summaries.multi import member_mode, multi_block
from rlbench.summaries.summary import summarize
from rlbench.fileio.jsonio import read_json, read_jsonl, write_json
from rlbench.summaries.narrative import add_narrative
from rlbench.summaries.run_report import plot_score_trajectory, write_metrics_json

run_json = Path(snakemake.input.run)
run = read_json(run_json)
artifacts = read_json(Path(snakemake.input.artifacts))
# A multi-task run's task (rules/multi.smk): its view of the run's ledger (rule member_artifacts).
ledger = list(read_jsonl(Path(snakemake.input.ledger))) if snakemake.input.get("ledger") else None
summary, records = summarize(
    run_json.parent,
    run=run,
    final=read_json(Path(snakemake.input.final)),
    baseline=read_json(Path(snakemake.input.baseline)),
    level=snakemake.params.level,
    base_model=artifacts.get("base_model"),
    mode=read_json(Path(snakemake.input.manifest)).get("mode"),
    integrity=read_json(Path(snakemake.input.integrity)),
    ledger=ledger,
    resources=artifacts.get("resources"),
)
if ledger is not None:
    # One row of the tables per task of the run, next to the single-task runs: its own task label, the run's
    # tasks as `multi`, mode multi (rlbench.summaries.multi), and the run's multi block (the mean Δ over its tasks).
    wildcards, tasks = snakemake.wildcards, snakemake.params.tasks
    summary["labels"] = {
        "task": wildcards.task,
        "model": wildcards.model,
        "agent": wildcards.agent,
        "seed": wildcards.seed,
        "multi": wildcards.tasks,
    }
    summary["mode"] = member_mode(summary["mode"])
    finals = {task: read_json(Path(path)) for task, path in zip(tasks, snakemake.input.member_finals)}
    summary["multi"] = multi_block(wildcards.tasks, tasks, finals, run)
judge_model = snakemake.input.get("judge_model")
add_narrative(
    summary,
    records,
    snakemake.params.narrative,
    Path(snakemake.params.narrative_cache),
    model_dir=Path(judge_model) if judge_model else None,
)
write_json(Path(snakemake.output.summary), summary)
# Field order kept: the reference's fields first, as its summary.jsonl lists them.
Path(snakemake.output.iterations).write_text("".join(json.dumps(jsonl_record(r)) + "\n" for r in records))
Path(snakemake.output.markdown).write_text(summary_markdown(summary, records))
write_metrics_json(Path(snakemake.output.metrics), summary)
plot_score_trajectory(summary, Path(snakemake.output.trajectory_png), Path(snakemake.output.trajectory_svg))
print(f"{len(records)} iterations, route {summary['route']}, failure type {summary['failure_type']}", file=sys.stderr)
if summary["interactive_failure"]:
    print(f"interactive failure: {summary['interactive_failure']['type']}", file=sys.stderr)
if summary["narrative"]:
    print(f"narrative by {summary['narrative']['model']} (cached: {summary['narrative']['cached']})", file=sys.stderr)
if summary["mode_audit"]["violation"]:
    print(f"mode {summary['mode']}: violation: {summary['mode_audit']['violations']}", file=sys.stderr)
