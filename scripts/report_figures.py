"""Rule report_figures: the figures across runs (rlbench.analysis.figures; PNG + SVG each) and the standalone
page results/report/index.html (rlbench.analysis.html) from the tables rule aggregate wrote."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.analysis.tables import settings_with_defaults
from rlbench.analysis.figures import budget_scaling, delta_heatmap, route_distribution, score_trajectories
from rlbench.analysis.html import FIGURES, write_index
from rlbench.fileio.jsonio import read_json

settings = settings_with_defaults(snakemake.params.report)
summaries = [read_json(Path(p)) for p in snakemake.input.summaries]
output = snakemake.output


def paths(name):
    return Path(output[f"{name}_png"]), Path(output[f"{name}_svg"])


draw = {
    "delta_heatmap": lambda png, svg: delta_heatmap(summaries, png, svg, decimals=int(settings["decimals"])),
    "score_trajectories": lambda png, svg: score_trajectories(summaries, png, svg),
    "budget_scaling": lambda png, svg: budget_scaling(summaries, settings["budget_cuts"], png, svg),
    "route_distribution": lambda png, svg: route_distribution(summaries, png, svg),
}
for name in FIGURES:
    draw[name](*paths(name))
    print(f"{name}: {len(summaries)} runs -> {', '.join(str(p) for p in paths(name))}", file=sys.stderr)

index = Path(output.index)
tables = {Path(p).stem: Path(p) for p in snakemake.input.tables}
figures = {name: paths(name)[0] for name in FIGURES}
written = write_index(index.parent, tables, figures)
if written.resolve() != index.resolve():
    raise RuntimeError(f"index.html written to {written}, expected {index}")
print(f"{written}: {len(tables)} tables, {len(figures)} figures", file=sys.stderr)
