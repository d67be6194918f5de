"""Figures across runs (rlbench.analysis.figures) and the standalone HTML page (rlbench.analysis.html), on
hand-made summary.json dicts: two tasks, two configurations, several seeds, a run without a
submission, a summary written before the timeline / budget_s fields existed, and no runs at all."""

from __future__ import annotations

import csv
import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from rlbench.analysis.catalogue import FIGURES, ITEMS, TABLES, build_tables
from rlbench.analysis.figures import budget_points, cell_text, heatmap_cells, route_counts, run_points
from rlbench.analysis.html import write_index
from rlbench.analysis.stats import config_key, config_label, delta_at_cut
from rlbench.analysis.tablefiles import BLANK_MD, write_tables
from rlbench.config import report_settings

BUDGET = 3600.0
BAND = 0.5


def item(i: int, since: float | None, score: float, scored: bool = True, train_type: str = "SFT-only") -> dict:
    return {"iteration": i, "since_start_s": since, "score": score if scored else 0.0, "scored": scored, "train_type": train_type}


def run(task, agent, seed, delta, timeline, *, model="tiny", baseline=10.0, route="SFT-only", mode="free", band=BAND) -> dict:
    """A summary.json as summary.summarize writes it, with the new fields."""
    scores = [t["score"] for t in timeline]
    return {
        "labels": {"task": task, "model": model, "agent": agent, "seed": str(seed)},
        "level": "L1",
        "status": "completed",
        "baseline": baseline,
        "best": None if delta is None else baseline + delta,
        "delta": delta,
        "submissions": len(timeline),
        "route": route,
        "mode": mode,
        "scaffold": "reference",
        "driver": None,
        "primary_metric": "accuracy",
        "grader_noise": {"band": band, "repeats": 3},
        "run_meta": {"start_time": 1000, "timeout_s": BUDGET, "end_time": 1000 + BUDGET},
        "metrics": {"score_trajectory": scores},
        "budget_s": BUDGET,
        "duration_s": BUDGET,
        "timeline": timeline,
    }


def old_run(task, agent, seed, delta, scores) -> dict:
    """A summary written before budget_s, timeline, best_index, ... existed."""
    summary = run(task, agent, seed, delta, [], route=None)
    for key in ("budget_s", "duration_s", "timeline", "route", "grader_noise", "mode"):
        summary.pop(key)
    summary["metrics"] = {"score_trajectory": scores}
    summary["submissions"] = len(scores)
    return summary


def sft_gsm8k(seed: int, late: float) -> dict:
    # baseline 10; scores 12 at 10 min, `late` at 30 min, a failed submission at 50 min
    timeline = [item(1, 600, 12.0), item(2, 1800, late), item(3, 3000, 0.0, scored=False)]
    return run("gsm8k", "sft", seed, late - 10.0, timeline)


SFT = [sft_gsm8k(0, 15.0), sft_gsm8k(1, 17.0), sft_gsm8k(2, 19.0)]  # Δ 5, 7, 9: mean 7, n=3
COPY_GSM8K = run("gsm8k", "copy", 0, 0.0, [item(1, 30, 10.0, train_type="Copy")], route="Copy")
SFT_ALF = run("alfworld", "sft", 0, 0.3, [item(1, 1200, 40.3)], baseline=40.0)  # inside the ±0.5 band
NO_SUBMISSION = run("alfworld", "copy", 0, 0.0, [], baseline=40.0, route="Placeholder/Missing")
OLD = old_run("gsm8k", "grpo", 0, 2.0, [11.0, 0.0, 12.0])
ALL = SFT + [COPY_GSM8K, SFT_ALF, NO_SUBMISSION, OLD]

SETTINGS = report_settings()  # the schema's defaults: budget cuts 0.25, 0.5, 1; 2 decimals
# The start of the title each figure of the catalogue draws (text of its SVG).
DRAWN_TITLES = {
    "score_trajectories": "Score of each evaluated submission",
    "delta_heatmap": "Δ over the base model",
    "budget_scaling": "Budget scaling",
    "route_distribution": "Route each run took",
}
CASES = {
    "all": ALL,
    "one_run": [SFT[0]],
    "no_submission": [NO_SUBMISSION],
    "old_summary": [OLD],
    "empty": [],
}


def label(summary: dict) -> str:
    return config_label(config_key(summary))


def svg_text(path: Path) -> str:
    """All text of an SVG (parses it: a malformed file fails here)."""
    return " ".join("".join(ET.parse(path).getroot().itertext()).split())


def draw(name: str, summaries: list[dict], out: Path) -> tuple[Path, Path]:
    """The catalogue's figure `name` drawn by its builder with the default settings."""
    png, svg = out / f"{name}.png", out / f"{name}.svg"
    FIGURES[name].builder(summaries, SETTINGS, png, svg)
    return png, svg


def test_every_figure_of_the_catalogue_draws_a_known_title():
    assert set(DRAWN_TITLES) == set(FIGURES)


@pytest.fixture(scope="module")
def drawn_all(tmp_path_factory) -> dict:
    """Every figure drawn once from ALL: name -> (png, svg)."""
    out = tmp_path_factory.mktemp("all")
    return {name: draw(name, ALL, out) for name in FIGURES}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_figure_writes_a_png_and_an_svg(tmp_path, drawn_all, name, case):
    png, svg = drawn_all[name] if case == "all" else draw(name, CASES[case], tmp_path)
    assert png.stat().st_size > 0
    with Image.open(png) as image:
        assert image.format == "PNG"
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24)
        assert len(colours) > 1, "a single-colour image"
    text = svg_text(svg)
    assert DRAWN_TITLES[name] in text
    if case == "empty":
        assert "no runs" in text


def test_heatmap_cells_are_the_mean_delta_over_seeds():
    cells = heatmap_cells(ALL)
    assert set(cells) == {"tiny"}
    tiny = cells["tiny"]
    sft_gsm = tiny[(label(SFT[0]), "gsm8k")]
    assert sft_gsm["mean"] == pytest.approx(7.0) and sft_gsm["n"] == 3 and sft_gsm["inside_band"] is False
    copy_gsm = tiny[(label(COPY_GSM8K), "gsm8k")]
    assert copy_gsm["mean"] == 0.0 and copy_gsm["n"] == 1 and copy_gsm["inside_band"] is True
    alf = tiny[(label(SFT_ALF), "alfworld")]
    assert alf["mean"] == pytest.approx(0.3) and alf["inside_band"] is True
    old = tiny[(label(OLD), "gsm8k")]
    assert old["mean"] == 2.0 and old["band"] is None and old["inside_band"] is None  # band unknown: no flag
    assert (label(OLD), "alfworld") not in tiny  # no run there
    assert cell_text(sft_gsm) == "+7.00\nn=3"
    assert cell_text(alf) == "≈ +0.30"
    assert cell_text(old) == "+2.00"
    assert cell_text(None) == "no run"


def test_heatmap_cells_match_the_delta_matrix_table():
    """The figure and the table show the same numbers (both from rlbench.analysis.stats)."""
    cells = heatmap_cells(ALL)["tiny"]
    rows = build_tables(ALL)["delta_matrix"].rows
    assert len(rows) == len(cells)
    for row in rows:
        key = (row["agent"], row["scaffold"], row["driver"], row["mode"])
        cell = cells[(config_label(key), row["task"])]
        assert cell["mean"] == row["mean_delta"] and cell["n"] == row["n"] and cell["band"] == row["noise_band"]
        assert {True: "yes", False: "no", None: None}[cell["inside_band"]] == row["within_noise"]


def test_heatmap_cell_text_never_shows_minus_zero():
    assert cell_text({"mean": -0.001, "n": 1, "inside_band": None}) == "+0.00"
    assert cell_text({"mean": -1.234, "n": 2, "inside_band": False}, decimals=1) == "-1.2\nn=2"
    assert cell_text({"mean": None, "n": 0, "inside_band": None}) == "no Δ"


def test_every_figure_has_a_title_axis_labels_with_units_and_a_legend(drawn_all):
    texts = {name: svg_text(svg) for name, (_, svg) in drawn_all.items()}
    expected = {
        "score_trajectories": ["gsm8k", "alfworld", "score (accuracy, 0-100)", "submission (index; times unknown)",
                               "baseline (base model)", "failed submission (score 0)", "sft / seed 0", "grpo / seed 0"],
        "delta_heatmap": ["task", "configuration", "agent (scaffold / driver, mode)", "Δ (points)",
                          label(SFT[0]), label(COPY_GSM8K)],
        "budget_scaling": ["gsm8k", "alfworld", "budget (h)", "Δ at the cut (points)", "grader-noise band",
                           "base model (Δ = 0)", label(SFT[0])],
        "route_distribution": ["task", "runs (count)", "route", "SFT-only", "Copy", "Placeholder/Missing", "unknown"],
    }
    for name, strings in expected.items():
        for string in strings:
            assert string in texts[name], (name, string)


def test_heatmap_annotations_in_the_svg(drawn_all):
    _, svg = drawn_all["delta_heatmap"]
    text = svg_text(svg)
    for expected in ("+7.00", "n=3", "≈ +0.30", "≈ +0.00", "+2.00", "no run", "Δ (points)", "model: tiny"):
        assert expected in text, expected


def test_heatmap_one_panel_per_model(tmp_path):
    other = run("gsm8k", "sft", 0, -3.0, [item(1, 60, 7.0)], model="small")
    cells = heatmap_cells(SFT + [other])
    assert cells["small"][(label(other), "gsm8k")]["mean"] == -3.0
    _, svg = draw("delta_heatmap", SFT + [other], tmp_path)
    text = svg_text(svg)
    assert "model: tiny" in text and "model: small" in text and "-3.00" in text


def test_run_points_hours_failures_and_fallbacks():
    points = run_points(SFT[0])
    assert points["hours"] is True
    assert points["x"] == [pytest.approx(600 / 3600), pytest.approx(0.5)]
    assert points["y"] == [12.0, 15.0]
    assert points["failed_x"] == [pytest.approx(3000 / 3600)]
    untimed = run("gsm8k", "sft", 0, 1.0, [item(1, None, 11.0), item(2, None, 0.0, scored=False)])
    assert run_points(untimed) == {"x": [1], "y": [11.0], "failed_x": [2], "hours": False}
    assert run_points(OLD) == {"x": [1, 2, 3], "y": [11.0, 0.0, 12.0], "failed_x": [], "hours": False}
    assert run_points(NO_SUBMISSION) == {"x": [], "y": [], "failed_x": [], "hours": False}


def test_trajectory_axis_says_when_times_are_unknown(tmp_path):
    _, svg = draw("score_trajectories", [SFT[0]], tmp_path)  # every submission within the first hour
    assert "time since the run started (min)" in svg_text(svg)
    long = run("gsm8k", "sft", 0, 1.0, [item(1, 600, 11.0), item(2, 5400, 0.0, scored=False)])
    _, svg = draw("score_trajectories", [long], tmp_path)
    assert "time since the run started (h)" in svg_text(svg)
    _, svg = draw("score_trajectories", [SFT[0], OLD], tmp_path)
    assert "submission (index; times unknown)" in svg_text(svg)


def test_budget_points_mean_and_range_over_seeds():
    points = budget_points(SFT, [0.25, 0.5, 1.0])
    # cut at 900 s: best so far 12 for every seed (Δ 2); at 1800 s and later: 15 / 17 / 19 (Δ 5 / 7 / 9)
    assert points[("gsm8k", label(SFT[0]), "tiny")] == [
        (0.25, pytest.approx(2.0), 2.0, 2.0, 3),
        (0.5, pytest.approx(7.0), 5.0, 9.0, 3),
        (1.0, pytest.approx(7.0), 5.0, 9.0, 3),
    ]
    assert budget_points([OLD], [0.5]) == {("gsm8k", label(OLD), "tiny"): []}  # no budget_s: nothing to cut


def test_budget_points_are_delta_at_cut_and_match_the_budget_table():
    cuts = [0.25, 0.5, 1.0]
    points = budget_points(ALL, cuts)
    # hand-computed: COPY_GSM8K scored 10 at 30 s (Δ 0 at every cut); SFT_ALF 40.3 at 1200 s (Δ 0 at
    # 900 s: nothing evaluated yet, the base model stands; 0.3 from 1800 s); NO_SUBMISSION: 0 everywhere
    assert points[("gsm8k", label(COPY_GSM8K), "tiny")] == [(f, 0.0, 0.0, 0.0, 1) for f in cuts]
    assert points[("alfworld", label(SFT_ALF), "tiny")] == [
        (0.25, 0.0, 0.0, 0.0, 1), (0.5, pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3), 1),
        (1.0, pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3), 1),
    ]
    assert points[("alfworld", label(NO_SUBMISSION), "tiny")] == [(f, 0.0, 0.0, 0.0, 1) for f in cuts]
    assert [delta_at_cut(s, 0.25) for s in SFT] == [2.0, 2.0, 2.0]
    table = build_tables(ALL, {"budget_cuts": cuts})["budget_scaling"].rows
    for row in table:
        key = (row["agent"], row["scaffold"], row["driver"], row["mode"])
        drawn = {p[0]: p for p in points[(row["task"], config_label(key), row["model"])]}
        if row["n"]:
            assert drawn[row["fraction"]][1] == pytest.approx(row["mean_delta"]) and drawn[row["fraction"]][4] == row["n"]
        else:
            assert row["fraction"] not in drawn


def test_budget_axis_in_hours_when_every_run_has_the_same_budget(tmp_path):
    _, svg = draw("budget_scaling", SFT, tmp_path)
    assert "budget (h)" in svg_text(svg)
    _, svg = draw("budget_scaling", SFT + [OLD], tmp_path)  # OLD has the same timeout_s in run_meta
    assert "budget (h)" in svg_text(svg)
    other = run("gsm8k", "sft", 9, 1.0, [item(1, 60, 11.0)])
    other["budget_s"] = other["run_meta"]["timeout_s"] = 7200.0
    _, svg = draw("budget_scaling", SFT + [other], tmp_path)
    assert "budget (fraction of the run's budget)" in svg_text(svg)


def test_route_counts():
    assert route_counts(ALL) == {"gsm8k": {"SFT-only": 3, "Copy": 1, "unknown": 1}, "alfworld": {"SFT-only": 1, "Placeholder/Missing": 1}}
    odd = run("gsm8k", "sft", 5, 1.0, [item(1, 60, 11.0)], route="something new")  # counted as the routes table does
    assert route_counts([odd]) == {"gsm8k": {"unknown": 1}}
    routes_row = build_tables(ALL)["routes"].rows
    assert {r["task"]: {k: r[k] for k in ("SFT-only", "Copy", "unknown")} for r in routes_row}["gsm8k"] == {
        "SFT-only": 3, "Copy": 1, "unknown": 1}


def test_figures_accept_odd_summaries(tmp_path):
    """Missing labels, a timeline with junk items, a non-numeric baseline: still a valid figure."""
    odd = {"labels": {}, "baseline": "n/a", "delta": None, "timeline": [None, item(1, "soon", 5.0), {"scored": True}]}
    assert run_points(odd) == {"x": [1, 2], "y": [5.0, 0.0], "failed_x": [], "hours": False}
    for name in FIGURES:
        png, svg = draw(name, [odd], tmp_path)
        assert png.stat().st_size > 0 and DRAWN_TITLES[name] in svg_text(svg)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_rerun_writes_the_same_bytes(tmp_path, drawn_all, name):
    # the SVG ids are salted with a constant and neither file carries a date: same input, same bytes
    for a, b in zip(drawn_all[name], draw(name, ALL, tmp_path)):
        assert a.read_bytes() == b.read_bytes(), a.name


def write_table(directory: Path, name: str, rows: list[list[str]], notes: list[str]) -> Path:
    with open(directory / f"{name}.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    md = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    md += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    (directory / f"{name}.md").write_text("\n".join(md + [""] + notes) + "\n")
    return directory / f"{name}.csv"


def test_write_index_is_one_standalone_escaped_page(tmp_path, drawn_all):
    report = tmp_path / "report"
    report.mkdir()
    write_table(
        report,
        "leaderboard_paper",
        [["configuration", "model", "alfworld", "gsm8k"], ["baseline", "tiny", "40.00", "10.00"], ["sft <b>", "tiny", "40.30", "19.00"]],
        ["Best score per task; <script>alert(1)</script> is text."],
    )
    tables = {
        "delta_matrix": write_table(report, "delta_matrix", [["configuration", "gsm8k"], ["sft", "+9.00"]], ["Δ in points."]),
        "routes": write_table(report, "routes", [["task", "GRPO"], ["gsm8k", "0"]], []).with_suffix(".md"),  # either file
    }
    figures = {name: png for name, (png, _) in drawn_all.items()}
    index = write_index(report, tables, figures)
    assert index == report / "index.html"
    page = index.read_text()
    assert not re.search(r"https?://", page), "no external URL"
    assert "<script" not in page and "&lt;script&gt;" in page and "sft &lt;b&gt;" in page
    headers = re.findall(r"<thead><tr>(.*?)</tr></thead>", page)
    assert any("<th>alfworld</th>" in h and "<th>gsm8k</th>" in h for h in headers)
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,[A-Za-z0-9+/=]+"', page)) == 4
    # the paper's leaderboard first, then the figures (each with its title), then the other tables
    anchors = ("table-leaderboard-paper", "figure-delta-heatmap", "figure-score-trajectories",
               "figure-budget-scaling", "figure-route-distribution", "table-delta-matrix", "table-routes")
    order = [page.index(f'id="{a}"') for a in anchors]
    assert order == sorted(order)
    assert page.index("<table>") > page.index('id="table-leaderboard-paper"')  # the first table is the leaderboard
    assert page.index("<table>") < page.index('id="table-delta-matrix"')
    for title in ("Δ heatmap", "Score trajectories", "Budget scaling", "Route distribution"):
        assert f"<h2>{title}</h2>" in page
    assert "Δ in points." in page and "Best score per task" in page


def test_write_index_without_tables_or_figures(tmp_path):
    page = write_index(tmp_path, {}, {}).read_text()
    assert "<html" in page and "no rows" in page and not re.search(r"https?://", page)


def test_write_index_from_the_analysis_tables(tmp_path, drawn_all):
    """The page from the tables rule aggregate writes (rlbench.analysis.tables): the paper's leaderboard with
    the tasks as columns, each table's title as its heading and its notes under it."""
    report = tmp_path / "report"
    paths = write_tables(build_tables(ALL), report)
    tables = {p.stem: p for p in paths if p.suffix == ".csv"}
    index = write_index(report, tables, {name: png for name, (png, _) in drawn_all.items()})
    page = index.read_text()
    leaderboard = page[page.index('id="table-leaderboard-paper"') : page.index('id="table-delta-matrix"')]
    assert "<h2>Leaderboard (best score per task, mean over seeds)</h2>" in leaderboard  # the Markdown's title
    header = re.search(r"<thead><tr>(.*?)</tr></thead>", leaderboard).group(1)
    assert "<th>alfworld</th>" in header and "<th>gsm8k</th>" in header
    assert "<td>baseline</td>" in leaderboard
    assert "Notes:" not in page and "A configuration is" in page
    assert "<code>reference</code>" in page  # the notes' inline code
    # the metric notes are a nested list under "Metrics per task:"
    assert re.search(r"<li>Metrics per task:<ul><li>alfworld: accuracy</li><li>gsm8k: accuracy</li></ul></li>", leaderboard)
    # an empty CSV cell (unknown) shows as the Markdown's blank mark: the baseline row has no scaffold
    assert f'<td class="blank">{BLANK_MD}</td>' in leaderboard
    assert page.count("<table>") == len(tables)
    assert not re.search(r"https?://", page)
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 4


def test_write_index_escapes_labels_from_runs(tmp_path):
    """Labels come from agent runs: a task or agent named like markup stays text in tables and figures."""
    nasty = run('<img src=x onerror="alert(1)">', "a&b <script>", 0, 1.0, [item(1, 60, 11.0)])
    report = tmp_path / "report"
    paths = write_tables(build_tables([nasty]), report)
    figures = {name: draw(name, [nasty], tmp_path)[0] for name in FIGURES}
    page = write_index(report, {p.stem: p for p in paths if p.suffix == ".csv"}, figures).read_text()
    assert "<script" not in page and "<img src=x" not in page
    assert "a&amp;b &lt;script&gt;" in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert not re.search(r"https?://", page)


def test_index_tables_show_the_markdown_cells_with_the_configured_decimals(tmp_path):
    """index.html shows a table as its Markdown does: 68.00 (not the CSV's 68.0), 4 decimals where
    the table asks for them, blanks as the blank mark, an escaped pipe as a pipe."""
    from rlbench.analysis.html import read_markdown_table, render_index
    from rlbench.analysis.tablefiles import Table

    report = tmp_path / "report"
    table = Table(
        ["agent", "score", "cost_usd", "n"],
        [{"agent": "sft | v2", "score": 68.0, "cost_usd": 0.00123, "n": 3}, {"agent": "copy", "score": None, "cost_usd": None, "n": 1}],
        ["A note."],
        name="leaderboard_paper",
        title="Leaderboard",
        decimals=2,
        column_decimals={"cost_usd": 4},
    )
    write_tables({"leaderboard_paper": table}, report)
    header, rows = read_markdown_table(report / "leaderboard_paper.md")
    assert header == ["agent", "score", "cost_usd", "n"]
    assert rows == [["sft | v2", "68.00", "0.0012", "3"], ["copy", BLANK_MD, BLANK_MD, "1"]]
    page = render_index(report, {"leaderboard_paper": report / "leaderboard_paper.csv"}, {})
    assert '<td class="num">68.00</td>' in page and '<td class="num">0.0012</td>' in page
    assert "<td>sft | v2</td>" in page and page.count('<td class="blank">') == 2


def test_every_catalogue_item_is_written_and_on_the_page(tmp_path):
    """What rules aggregate and report_figures do, from the catalogue alone: every item's files are written
    and non-empty, and the page shows every item in the catalogue's order, each figure with its caption."""
    report = tmp_path / "report"
    tables = build_tables(ALL, SETTINGS)
    for name, item in TABLES.items():
        write_tables({name: tables[name]}, report)
    for name, item in FIGURES.items():
        png, svg = (report / path for path in item.files.values())
        item.builder(ALL, SETTINGS, png, svg)
    page = write_index(report, {name: report / f"{name}.csv" for name in TABLES},
                       {name: report / next(iter(item.files.values())) for name, item in FIGURES.items()}).read_text()
    written = [report / path for item in ITEMS for path in item.files.values()]
    assert sorted(written) == sorted(p for p in report.rglob("*") if p.is_file() and p.name != "index.html")
    assert all(p.stat().st_size > 0 for p in written)
    positions = []
    for item in ITEMS:
        assert item.caption and item.caption_path.parent.name == "report", item.name
        section = page.index(f'<section id="{item.kind}-{item.name.replace("_", "-")}">')
        positions.append(section)
        # a table's heading is its Markdown's title, which the catalogue gives; a figure's caption follows it
        assert page.startswith(f"<h2>{html.escape(item.title)}</h2>", page.index("<h2>", section))
        if item.kind == "figure":
            assert html.escape(item.caption, quote=True) in page
    assert positions == sorted(positions)
