"""The catalogue of the report's tables and figures: the one list every other part reads.

Each item has a name (its files' stem), a kind (table or figure), a title (the heading of its section on
the page, and a table's Markdown heading), a caption (its workflow/report/<file>.rst, the one wording,
which Snakemake's report shows and the page prints under a figure) and a builder (the function that
computes it from the runs' summaries and the validated `report:` settings). The items are in report
order: the order of results/report/index.html, the paper's leaderboard first, then the figures, then
the other tables. The rules (rules/common.smk: the outputs of aggregate and report_figures and their
report() entries), the rule scripts, the page (rlbench.analysis.html) and the tests read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlbench.analysis import figures, tables
from rlbench.analysis.stats import apply_flag_policy
from rlbench.analysis.tablefiles import Table
from rlbench.config import report_settings
from rlbench.paths import REPORT_CAPTIONS_DIR

TABLE = "table"
FIGURE = "figure"


@dataclass(frozen=True)
class Item:
    """One table or figure of the report. A table's builder is (summaries, settings) -> Table; a figure's
    is (summaries, settings, png, svg) -> None and writes both files. `group` is the subcategory of a table
    in Snakemake's report; `caption_file` names the caption when it is not <name>.rst."""

    name: str
    kind: str
    title: str
    builder: Callable
    group: str = ""
    caption_file: str = ""

    @property
    def caption_path(self) -> Path:
        """The caption's file, workflow/report/<name>.rst unless the item names another."""
        return REPORT_CAPTIONS_DIR / (self.caption_file or f"{self.name}.rst")

    @property
    def caption(self) -> str:
        """The caption as one line of plain text (the .rst file's lines joined)."""
        return " ".join(self.caption_path.read_text(encoding="utf-8").split())

    @property
    def files(self) -> dict[str, str]:
        """The item's files under results/report/ by output name (the names the rules give them), the one
        Snakemake's report shows first: a table's <name>_csv and <name>_md, a figure's <name>_png and
        <name>_svg (under figures/)."""
        if self.kind == TABLE:
            return {f"{self.name}_csv": f"{self.name}.csv", f"{self.name}_md": f"{self.name}.md"}
        return {f"{self.name}_png": f"figures/{self.name}.png", f"{self.name}_svg": f"figures/{self.name}.svg"}


ITEMS = (
    Item(
        "leaderboard_paper",
        TABLE,
        "Leaderboard (best score per task, mean over seeds)",
        lambda summaries, settings: tables.leaderboard_paper(summaries),
        group="Leaderboard",
    ),
    Item(
        "delta_heatmap",
        FIGURE,
        "Δ heatmap",
        lambda summaries, settings, png, svg: figures.delta_heatmap(
            summaries, png, svg, decimals=int(settings["decimals"])
        ),
    ),
    Item(
        "score_trajectories",
        FIGURE,
        "Score trajectories",
        lambda summaries, settings, png, svg: figures.score_trajectories(summaries, png, svg),
    ),
    Item(
        "budget_scaling",
        FIGURE,
        "Budget scaling",
        lambda summaries, settings, png, svg: figures.budget_scaling(summaries, settings["budget_cuts"], png, svg),
        caption_file="budget_scaling_figure.rst",
    ),
    Item(
        "route_distribution",
        FIGURE,
        "Route distribution",
        lambda summaries, settings, png, svg: figures.route_distribution(summaries, png, svg),
    ),
    Item("delta_matrix", TABLE, "Δ matrix (mean Δ over seeds per task)", tables.delta_matrix, group="Leaderboard"),
    Item(
        "mode_ablation",
        TABLE,
        "Mode ablation (free, sft-only, rl-only, multi): mean best score per task",
        lambda summaries, settings: tables.mode_ablation(summaries),
        group="Leaderboard",
    ),
    Item(
        "selection_gap",
        TABLE,
        "Selection gap (Δ on the feedback split, on the final split the agent never saw, and the oracle's)",
        tables.selection_gap,
        group="Leaderboard",
    ),
    Item(
        "multirun_stats",
        TABLE,
        "Multi-run statistics per configuration, task and model",
        tables.multirun_stats,
        group="Statistics",
    ),
    Item(
        "budget_scaling",
        TABLE,
        "Budget scaling (Δ when runs are cut at a fraction of their budget)",
        tables.budget_scaling,
        group="Statistics",
    ),
    Item("pass_at_k", TABLE, "pass@k (expected best Δ over k seeds)", tables.pass_at_k_table, group="Statistics"),
    Item(
        "workspace_stats",
        TABLE,
        "Workspace statistics per run",
        lambda summaries, settings: tables.workspace_stats(summaries),
        group="Runs",
    ),
    Item(
        "routes",
        TABLE,
        "Route distribution per task",
        lambda summaries, settings: tables.routes(summaries),
        group="Runs",
    ),
    Item(
        "tokens_cost",
        TABLE,
        "Token usage and cost per run",
        lambda summaries, settings: tables.tokens_cost(summaries, int(settings["decimals"])),
        group="Runs",
    ),
    Item(
        "failures",
        TABLE,
        "Failure types per task",
        lambda summaries, settings: tables.failures(summaries),
        group="Runs",
    ),
)
# The items of each kind by name, in report order (a table and a figure may share a name: budget_scaling).
TABLES = {item.name: item for item in ITEMS if item.kind == TABLE}
FIGURES = {item.name: item for item in ITEMS if item.kind == FIGURE}


def build_tables(summaries: list[dict], settings: dict | None = None) -> dict[str, Table]:
    """Every table of the catalogue from the runs' summaries, by name in report order, each with the
    catalogue's name and title; settings: config `report:` (validated, missing keys take the schema's
    defaults: rlbench.config.report_settings)."""
    settings = report_settings(settings)
    summaries = [s for s in summaries if isinstance(s, dict)]
    # Flagged runs (the audit's integrity verdict) enter the tables as report.flagged says, noted in each.
    summaries, flag_note = apply_flag_policy(summaries, settings["flagged"])
    decimals = int(settings["decimals"])
    built = {}
    for item in TABLES.values():
        table = item.builder(summaries, settings)
        table.name, table.title, table.decimals = item.name, item.title, decimals
        table.notes = [*table.notes, *flag_note]
        built[item.name] = table
    return built
