"""Rule check_execution: probe the code-execution sandbox with the task's limits before scoring."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.scoring.execution import self_check
from rlbench.fileio.jsonio import write_json

record = self_check(snakemake.params.execution, forbidden=[Path(snakemake.params.results).resolve()])
print(f"execution sandbox: {record}", file=sys.stderr)
write_json(Path(snakemake.output.check), record)
