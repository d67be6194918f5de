"""results/report/index.html: the analysis stage's tables and figures on one standalone page.

The page needs nothing else: the CSS is inline, the figures are embedded as base64 data URIs, there
is no JavaScript and no external URL, so the single file opens anywhere, offline, also inside
Snakemake's HTML report. Every value is escaped (html.escape): table cells come from agent runs.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import os
import re
from pathlib import Path

from rlbench.analysis.catalogue import FIGURE, FIGURES, ITEMS, TABLE, TABLES
from rlbench.analysis.tablefiles import BLANK_MD
from rlbench.summaries.formatting import run_title

# The page shows the catalogue's items (rlbench.analysis.catalogue) in its order: the paper's leaderboard (the
# catalogue's first table, always on the page), then the figures, then the other tables; a table or figure
# the catalogue does not list follows, sorted. A table's heading is the title of its Markdown; a figure's
# is its catalogue title, with its caption under it.
LEADERBOARD = next(iter(TABLES))
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; border-bottom: 2px solid #0072B2; padding-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 2em; color: #0b4f7c; }
nav ul { columns: 2; padding-left: 1.2em; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; white-space: nowrap; }
th { background: #eef3f8; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.blank { text-align: center; color: #999; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .notes { font-size: .85em; color: #555; }
.empty { color: #777; font-style: italic; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _inline(text: str) -> str:
    """Escaped text with the Markdown inline code of the notes (`reference`) as <code>."""
    parts = re.split(r"`([^`]*)`", text)
    return "".join(f"<code>{_esc(p)}</code>" if i % 2 else _esc(p) for i, p in enumerate(parts))


def _anchor(kind: str, name: str) -> str:
    return f"{kind}-" + "".join(c if c.isalnum() else "-" for c in name)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip() != ""


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """A CSV table as (header, rows); ([], []) when the file is missing or empty."""
    path = Path(path)
    if not path.is_file():
        return [], []
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    return (rows[0], rows[1:]) if rows else ([], [])


def _is_table_line(line: str) -> bool:
    return line.lstrip().startswith("|")


def read_markdown_table(path: Path) -> tuple[list[str], list[list[str]]]:
    """The table of a Markdown file as rlbench.analysis.tablefiles.markdown writes it, as (header, rows): the
    cells as shown there (numbers with the table's decimals, blanks as the blank mark, the Δ
    matrix's wide view); ([], []) when the file is missing or holds no table."""
    path = Path(path)
    if not path.is_file():
        return [], []
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if _is_table_line(line)]
    if len(lines) < 2:
        return [], []

    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip()[1:-1])
        return [part.strip().replace("\\|", "|") for part in parts]

    return cells(lines[0]), [cells(line) for line in lines[2:]]


def markdown_parts(path: Path) -> tuple[str | None, list[tuple[int, str]]]:
    """(title, notes) of a Markdown table file as rlbench.analysis.tablefiles.markdown writes it: the title from
    its "# " line; the notes from the lines after the table (after the title when the table is
    empty), without the "Notes:" line and the "_No runs._" placeholder, each as (level, text): level
    0 for "- note", 1 for an indented "  - sub-note" (text without the bullet). (None, []) when the
    file is missing."""
    path = Path(path)
    if not path.is_file():
        return None, []
    lines = path.read_text(encoding="utf-8").splitlines()
    title = next((line[2:].strip() for line in lines if line.startswith("# ")), None)
    table = [i for i, line in enumerate(lines) if _is_table_line(line)]
    if table:
        start = table[-1] + 1
    else:
        start = next((i + 1 for i, line in enumerate(lines) if line.startswith("# ")), 0)
    notes = []
    for line in lines[start:]:
        text = line.strip()
        if not text or text in ("Notes:", "_No runs._"):
            continue
        level = 1 if line[: len(line) - len(line.lstrip())] else 0
        if text.startswith(("- ", "* ")):
            text = text[2:].strip()
        notes.append((level, text))
    return title, notes


def html_table(header: list[str], rows: list[list[str]]) -> str:
    """An escaped HTML table; numeric cells are right-aligned, empty CSV cells (unknown) show as the
    Markdown's blank mark."""
    if not header:
        return '<p class="empty">no rows</p>'
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            if cell.strip() in ("", BLANK_MD):
                cells.append(f'<td class="blank">{_esc(BLANK_MD)}</td>')
            elif _is_number(cell):
                cells.append(f'<td class="num">{_esc(cell)}</td>')
            else:
                cells.append(f"<td>{_esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not rows:
        body.append(f'<tr><td colspan="{len(header)}" class="empty">no rows</td></tr>')
    return f'<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(body) + "\n</tbody></table></div>"


def _notes_html(notes: list[tuple[int, str]]) -> str:
    """The notes as a list; a sub-note becomes a nested list under the note before it."""
    tree: list[tuple[str, list[str]]] = []
    for level, text in notes:
        if level and tree:
            tree[-1][1].append(text)
        else:
            tree.append((text, []))
    if not tree:
        return ""
    items = []
    for text, subs in tree:
        nested = "<ul>" + "".join(f"<li>{_inline(sub)}</li>" for sub in subs) + "</ul>" if subs else ""
        items.append(f"<li>{_inline(text)}{nested}</li>")
    return '<ul class="notes">' + "".join(items) + "</ul>"


def _table_paths(path: Path) -> tuple[Path, Path]:
    """(CSV, Markdown) of a table given either file."""
    path = Path(path)
    return path.with_suffix(".csv"), path.with_suffix(".md")


def table_section(name: str, path: Path) -> tuple[str, str]:
    """(heading, HTML) of a table's section: the title, the table (as its Markdown shows it: the
    configured decimals) and the notes from its Markdown; the table from the CSV when there is no
    Markdown, and the table's name when there is no title."""
    csv_path, md_path = _table_paths(path)
    header, rows = read_markdown_table(md_path)
    if not header:
        header, rows = read_csv(csv_path)
    md_title, notes = markdown_parts(md_path)
    title = md_title or name.replace("_", " ").capitalize()
    return title, (
        f'<section id="{_anchor("table", name)}">\n<h2>{_esc(title)}</h2>\n'
        + html_table(header, rows)
        + "\n"
        + _notes_html(notes)
        + "\n</section>"
    )


def figure_section(name: str, png: Path) -> tuple[str, str]:
    """(heading, HTML) of a figure's section: its title, the PNG as a base64 data URI, its caption."""
    item = FIGURES.get(name)
    title, caption = (item.title, item.caption) if item else (name.replace("_", " ").capitalize(), "")
    png = Path(png)
    if png.is_file():
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        caption = f"{caption} (SVG: {png.with_suffix('.svg').name})" if caption else png.name
        body = (
            f'<figure><img alt="{_esc(title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>"
        )
    else:
        body = '<p class="empty">figure missing</p>'
    return title, f'<section id="{_anchor("figure", name)}">\n<h2>{_esc(title)}</h2>\n{body}\n</section>'


def run_label(page: Path) -> str:
    """A run page's label: the run's title (summaries.formatting.run_title) from its run.json (the page is
    <run_dir>/reports/run.html), else the run directory's path."""
    run_dir = Path(page).parent.parent
    try:
        labels = json.loads((run_dir / "run.json").read_text()).get("labels") or {}
    except (OSError, ValueError, AttributeError):
        labels = {}
    return run_title(labels) if labels else run_dir.as_posix()


def runs_section(report_dir: Path, pages: list) -> str:
    """The list of the run explorer's pages (rlbench.explorer), each linked relative to the report's directory."""
    items = "".join(
        f'<li><a href="{_esc(os.path.relpath(Path(p), Path(report_dir)))}">{_esc(run_label(Path(p)))}</a></li>'
        for p in sorted(pages, key=lambda p: run_label(Path(p)))
    )
    return (
        f'<section id="runs">\n<h2>Runs</h2>\n<p class="notes">Each run\'s page: the agent\'s turns, its submissions '
        f"with their code diffs, the budget, the resource trace and the audits' verdicts.</p>\n<ul>{items}</ul>\n</section>"
    )


def render_index(report_dir: Path, tables: dict, figures: dict, pages: list | None = None) -> str:
    """The page's HTML: the tables and figures given in the catalogue's order (the paper's leaderboard first,
    then the figures, the Δ heatmap first, then the other tables), then any the catalogue does not list;
    then the links to the runs' pages (`pages`: each run's reports/run.html)."""
    report_dir = Path(report_dir)
    tables = {name: Path(p) for name, p in tables.items()}
    tables.setdefault(LEADERBOARD, report_dir / f"{LEADERBOARD}.csv")
    given = {TABLE: tables, FIGURE: figures}
    listed = [(item.kind, item.name) for item in ITEMS if item.name in given[item.kind]]
    listed += [(FIGURE, n) for n in sorted(figures) if n not in FIGURES]
    listed += [(TABLE, n) for n in sorted(tables) if n not in TABLES]
    sections = [
        (kind, n, *(figure_section(n, figures[n]) if kind == FIGURE else table_section(n, tables[n])))
        for kind, n in listed
    ]
    nav = "".join(f'<li><a href="#{_anchor(kind, name)}">{_esc(title)}</a></li>' for kind, name, title, _ in sections)
    if pages:
        sections.append(("runs", "runs", "Runs", runs_section(report_dir, pages)))
        nav += '<li><a href="#runs">Runs</a></li>'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "<title>Agent² RL-Bench report</title>\n"
        f"<style>{CSS}</style>\n</head>\n<body>\n"
        "<h1>Agent² RL-Bench report</h1>\n"
        "<p>Tables and figures regenerated from the recorded runs' summaries (no agent or evaluation reruns). "
        "Δ is in points of each task's primary metric (0-100). "
        f"{_esc(BLANK_MD)} in a table: unknown or not applicable.</p>\n"
        f"<nav><ul>{nav}</ul></nav>\n" + "\n".join(section for *_, section in sections) + "\n</body>\n</html>\n"
    )


def write_index(report_dir: Path, tables: dict, figures: dict, pages: list | None = None) -> Path:
    """Write report_dir/index.html. tables: name -> the table's .csv or .md as
    rlbench.analysis.tablefiles.write_tables writes them (the other file is found next to it); figures:
    name -> PNG. The leaderboard in the paper's layout comes from report_dir/leaderboard_paper.csv
    when tables does not name it; pages: the runs' explorer pages, linked at the end. Returns the page's path."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    out = report_dir / "index.html"
    out.write_text(render_index(report_dir, tables, figures, pages), encoding="utf-8")
    return out
