"""Rule report_figures: every figure of the catalogue (rlbench.analysis.catalogue; PNG + SVG each, drawn by
rlbench.analysis.figures) and the standalone page results/report/index.html (rlbench.analysis.html) from the
tables rule aggregate wrote, with links to every run's explorer page (rule run_page)."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.analysis.catalogue import FIGURES
from rlbench.analysis.html import write_index
from rlbench.fileio.jsonio import read_json

settings = snakemake.params.report  # config["report"], validated with the schema's defaults (rules/common.smk)
summaries = [read_json(Path(p)) for p in snakemake.input.summaries]
figures = {}
for name, item in FIGURES.items():
    png, svg = (Path(snakemake.output[key]) for key in item.files)
    item.builder(summaries, settings, png, svg)
    figures[name] = png
    print(f"{name}: {len(summaries)} runs -> {png}, {svg}", file=sys.stderr)

index = Path(snakemake.output.index)
tables = {Path(p).stem: Path(p) for p in snakemake.input.tables}  # a table's CSV and Markdown: either names it
pages = [Path(p) for p in snakemake.input.pages]  # each run's explorer page, linked from the index
written = write_index(index.parent, tables, figures, pages)
if written.resolve() != index.resolve():
    raise RuntimeError(f"index.html written to {written}, expected {index}")
print(f"{written}: {len(tables)} tables, {len(figures)} figures", file=sys.stderr)
