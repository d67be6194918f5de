"""Rule summarize_run: process metrics (summary.json) and the per-iteration report."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.diagnostics import failure_type, iterations, process_metrics, run_route, summary_markdown
from rlbench.jsonio import read_json, read_jsonl, write_json, write_jsonl

run = read_json(Path(snakemake.input.run))
ledger = list(read_jsonl(Path(snakemake.input.run).parent / "grader" / "ledger.jsonl"))
artifacts = read_json(Path(snakemake.input.artifacts))
final = read_json(Path(snakemake.input.final))
base_fingerprint = read_json(Path(snakemake.input.baseline))["fingerprint"]
metrics = process_metrics(ledger, run, base_fingerprint)
records = iterations(ledger, run, base_fingerprint, artifacts["route"])
summary = {
    "labels": run["labels"],
    "level": snakemake.params.level,
    "status": run["status"],
    "exit_code": run["exit_code"],
    "timed_out": run["timed_out"],
    "baseline": final["baseline_score"],
    "best": final["score"],
    "delta": final["delta"],
    "submissions": run["submissions"],
    "valid_submissions": run["valid_submissions"],
    "route": run_route(artifacts["route"], metrics),
    "failure_type": None,
    "metrics": metrics,
}
summary["failure_type"] = failure_type(run, metrics, final)
write_json(Path(snakemake.output.summary), summary)
write_jsonl(Path(snakemake.output.iterations), records)
Path(snakemake.output.markdown).write_text(summary_markdown(summary, records))
