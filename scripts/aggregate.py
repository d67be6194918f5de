"""Rule aggregate: leaderboard.csv (one row per run) and every table of the catalogue (rlbench.analysis.catalogue)
as CSV and Markdown, written to the paths the rule declares (the item's files: <name>_csv, <name>_md)."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.analysis.catalogue import TABLES, build_tables
from rlbench.analysis.report import write_leaderboard_rows
from rlbench.analysis.tablefiles import write_table
from rlbench.fileio.jsonio import read_json

settings = snakemake.params.report  # config["report"], validated with the schema's defaults (rules/common.smk)
summaries = [read_json(Path(p)) for p in snakemake.input.summaries]
leaderboard = Path(snakemake.output.leaderboard)
rows = write_leaderboard_rows(summaries, leaderboard, int(settings["decimals"]))
print(f"leaderboard with {rows} rows", file=sys.stderr)

for name, table in build_tables(summaries, settings).items():
    csv_path, md_path = (Path(snakemake.output[key]) for key in TABLES[name].files)
    write_table(table, csv_path, md_path)
    print(f"{name}: {len(table.rows)} rows -> {csv_path}, {md_path}", file=sys.stderr)
