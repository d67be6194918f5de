"""Rule aggregate: leaderboard.csv (one row per run) and every table of the paper (rlbench.analysis.tables) as
CSV and Markdown, written to the paths the rule declares (<name>_csv, <name>_md)."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.analysis.tables import build_tables, settings_with_defaults, write_table
from rlbench.fileio.jsonio import read_json
from rlbench.analysis.report import write_leaderboard_rows

settings = settings_with_defaults(snakemake.params.report)
summaries = [read_json(Path(p)) for p in snakemake.input.summaries]
leaderboard = Path(snakemake.output.leaderboard)
rows = write_leaderboard_rows(summaries, leaderboard, int(settings["decimals"]))
print(f"leaderboard with {rows} rows", file=sys.stderr)

for name, table in build_tables(summaries, settings).items():
    csv_path = getattr(snakemake.output, f"{name}_csv", None) or leaderboard.parent / f"{name}.csv"
    md_path = getattr(snakemake.output, f"{name}_md", None) or leaderboard.parent / f"{name}.md"
    write_table(table, Path(csv_path), Path(md_path))
    print(f"{name}: {len(table.rows)} rows -> {csv_path}, {md_path}", file=sys.stderr)
