"""Rule run_page / run_page_multi: the run explorer's page, reports/run.html (rlbench.explorer): the
agent's turns, its submissions with their code diffs, checkpoints and metrics, the budget, the resource
trace, the summary's iterations and the audits' verdicts, on one standalone page. The records it reads
beside the declared inputs (the ledger, code.git, the transcript, agent.log, resources.jsonl) are the
run's own, as for summarize_run."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.explorer.build import build_page

run_dir = Path(snakemake.input.run).parent
page = build_page(run_dir, Path(snakemake.output.page))
print(f"{page}: {page.stat().st_size} bytes", file=sys.stderr)
