"""A table of the report (`Table`) and its two files: <name>.csv (tidy: one header, raw numbers rounded to
`report.decimals`, empty cells for unknown values) and <name>.md (a title, the table, notes that define the
columns and say what a blank means). rlbench.analysis.html reads both back for the page.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

BLANK_MD = "–"  # how the Markdown shows an unknown / not applicable value (the CSV leaves the cell empty)


@dataclass
class Table:
    """A table: `rows` map column names to raw values (None = unknown, shown blank). The Markdown shows
    `display_columns` / `display_rows` instead of the tidy rows when set (the Δ matrix's wide view).
    A table builder (rlbench.analysis.tables) gives the columns, rows and notes; its name (the files'),
    title (the Markdown's heading) and decimals come from the catalogue (rlbench.analysis.catalogue)."""

    columns: list[str]
    rows: list[dict]
    notes: list[str] = field(default_factory=list)
    name: str = ""
    title: str = ""
    decimals: int = 2
    display_columns: list[str] | None = None
    display_rows: list[dict] | None = None
    # Columns rounded to other decimals than `decimals` (cost in USD).
    column_decimals: dict[str, int] = field(default_factory=dict)


def _rounded(value: float, decimals: int) -> float:
    value = round(value, decimals)
    return 0.0 if value == 0 else value  # no -0.0


def csv_value(value, decimals: int):
    """A cell of the CSV: empty for unknown, floats rounded, booleans yes/no."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "" if not math.isfinite(value) else _rounded(value, decimals)
    return value


def markdown_value(value, decimals: int) -> str:
    """A cell of the Markdown table: BLANK_MD for unknown, floats with exactly `decimals` decimals."""
    if value is None or value == "":
        return BLANK_MD
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return BLANK_MD if not math.isfinite(value) else f"{_rounded(value, decimals):.{decimals}f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def write_csv(table: Table, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=table.columns, extrasaction="ignore")
        writer.writeheader()
        for row in table.rows:
            writer.writerow(
                {c: csv_value(row.get(c), table.column_decimals.get(c, table.decimals)) for c in table.columns}
            )
    return path


def _numeric(rows: list[dict], column: str) -> bool:
    values = [r.get(column) for r in rows if r.get(column) is not None]
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def markdown(table: Table) -> str:
    """The table as Markdown: title, table (the wide view when the table has one), notes."""
    columns = table.display_columns or table.columns
    rows = table.display_rows if table.display_rows is not None else table.rows
    lines = [f"# {table.title}", ""]
    if rows:
        lines.append("| " + " | ".join(columns) + " |")
        lines.append("|" + "|".join("---:" if _numeric(rows, c) else "---" for c in columns) + "|")
        for row in rows:
            cells = [markdown_value(row.get(c), table.column_decimals.get(c, table.decimals)) for c in columns]
            lines.append("| " + " | ".join(cells) + " |")
    else:
        lines.append("_No runs._")
    lines += ["", "Notes:", ""]
    lines += [f"- {note}" if not note.startswith("  ") else f"  - {note.strip()}" for note in table.notes]
    lines.append(f"- {BLANK_MD} in the table (an empty cell in the CSV): unknown or not applicable.")
    return "\n".join(lines) + "\n"


def write_markdown(table: Table, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(table), encoding="utf-8")
    return path


def write_table(table: Table, csv_path: Path, md_path: Path) -> list[Path]:
    """One table to the given CSV and Markdown paths."""
    return [write_csv(table, csv_path), write_markdown(table, md_path)]


def write_tables(tables: dict[str, Table], out_dir: Path) -> list[Path]:
    """Every table as <out_dir>/<name>.csv and <name>.md; returns the paths written."""
    out_dir = Path(out_dir)
    paths = []
    for name, table in tables.items():
        paths += write_table(table, out_dir / f"{name}.csv", out_dir / f"{name}.md")
    return paths
