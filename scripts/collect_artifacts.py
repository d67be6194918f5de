"""Rule collect_artifacts: what the run left behind (ledger, code, checkpoints, logs), with the records
of runtime recording: the final workspace state, every model version under output/ (fingerprinted
without following links), the code revisions (grader/code.git) and the resource trace summary."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.summaries.artifacts import collect_artifacts
from rlbench.fileio.jsonio import read_json, write_json

manifest = read_json(Path(snakemake.input.manifest))
write_json(Path(snakemake.output.artifacts), collect_artifacts(Path(snakemake.input.run).parent, manifest))
