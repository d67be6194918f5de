"""Rule aggregate: the leaderboard, one row per run."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.report import write_leaderboard

rows = write_leaderboard(
    [Path(p) for p in snakemake.input.summaries], Path(snakemake.output.leaderboard), snakemake.params.report["decimals"]
)
print(f"leaderboard with {rows} rows", file=sys.stderr)
