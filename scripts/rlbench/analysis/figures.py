"""Figures across runs (rule report_figures): score trajectories, the Δ heatmap, budget scaling and
the route distribution, each saved as PNG (150 dpi) and SVG from the runs' summary.json dicts.

Every figure reads alone (title, axis labels with units, a legend where there are several lines)
and uses colour-blind-safe colours (the Okabe-Ito palette; a diverging blue-red map for Δ). The
output is deterministic: the SVG ids are salted with a constant, no date is written into either
file, and the text stays text in the SVG (searchable, no embedded glyph outlines), so a rerun on
the same summaries writes the same bytes. Every function accepts an empty list (the figure then
says "no runs"), a single run, runs without any submission and summaries written before the
fields timeline / budget_s / best_index existed.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

# The definitions shared with the tables (configuration, cell, Δ, Δ at a budget cut, noise band) come
# from rlbench.analysis.stats, so that a figure always shows the numbers of its table.
from rlbench.analysis.stats import (  # noqa: E402
    run_label,
    signed,
    budget_seconds,
    cell_band,
    config_key,
    config_label,
    delta_at_cut,
    group_runs,
    mean,
    number,
    run_delta,
    seed_order,
    within_noise,
)
from rlbench.summaries.routes import ROUTE_LABELS, UNKNOWN  # noqa: E402

DPI = 150
# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision
# deficiencies. Black is last so that it is used only when more than seven series share a panel.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
BASELINE_COLOUR = "#7f7f7f"
EMPTY_CELL_COLOUR = "#d9d9d9"
HEATMAP_CMAP = "RdBu"  # diverging, red = below the baseline, blue = above; safe for red-green deficiencies
# Route colours follow ROUTE_LABELS' order (five training routes, Copy, Placeholder/Missing, unknown).
ROUTE_COLOURS = dict(zip(ROUTE_LABELS, ("#0072B2", "#56B4E9", "#CC79A7", "#009E73", "#E69F00", "#D55E00", "#000000", "#999999")))
RC = {
    "svg.hashsalt": "rlbench",  # fixed ids in the SVG: byte-identical reruns
    "svg.fonttype": "none",  # text stays <text> in the SVG
    "font.size": 9,
    "axes.titlesize": 10,
    "figure.titlesize": 12,
    "legend.fontsize": 8,
}
NO_RUNS = "no runs"


# ----------------------------------------------------------------------------- helpers


def _task(summary: dict) -> str:
    return run_label(summary, "task")


def _model(summary: dict) -> str:
    return run_label(summary, "model")


def _seed(summary: dict) -> str:
    return run_label(summary, "seed")


def _run_order(summary: dict) -> tuple:
    return (_task(summary), _model(summary), config_label(config_key(summary)), seed_order(_seed(summary)))


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = max(1, min(max_cols, n))
    return math.ceil(max(n, 1) / cols), cols


@contextmanager
def _style():
    with plt.rc_context(RC):
        yield


def _save(fig, png: Path | str, svg: Path | str) -> None:
    """PNG at 150 dpi and SVG, both without a date or a software stamp, then close the figure."""
    for path in (png, svg):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=DPI, format="png", metadata={"Software": None})
    fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def _suptitle(fig, title: str) -> None:
    """The figure's title, wrapped to the figure's width so that no narrow figure clips it."""
    chars = max(30, int(fig.get_figwidth() * 72 / (0.6 * RC["figure.titlesize"])))
    fig.suptitle(textwrap.fill(title, chars))


def _empty(title: str, png, svg, message: str = NO_RUNS) -> None:
    """A figure that says there is nothing to show (still a valid, titled PNG and SVG)."""
    fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
    _suptitle(fig, title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=14, color="#444444", transform=ax.transAxes)
    ax.set_axis_off()
    _save(fig, png, svg)


def _hide_unused(axes: list, used: int) -> None:
    for ax in axes[used:]:
        ax.set_axis_off()


def _legend_below(fig, handles: list, labels: list) -> None:
    """One legend for the whole figure, under the panels, so that it never covers data."""
    if handles:
        # as many columns as fit the figure's width (an entry: marker, gap and its text at ~0.07 in a character)
        entry_width = 0.7 + 0.07 * max(len(label) for label in labels)
        ncol = max(1, min(4, len(labels), int(fig.get_figwidth() / entry_width)))
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)


# ----------------------------------------------------------------------------- score trajectories


def run_points(summary: dict) -> dict:
    """The points of one run's score trajectory.

    Returns {"x": [...], "y": [...], "failed_x": [...], "hours": bool}: x in hours since the run
    started when every submission has a time (hours=True), else the 1-based submission index;
    (x, y) are the evaluated submissions with their score (primary metric, 0-100); failed_x the
    submissions that were not evaluated (drawn at score 0). Older summaries without a timeline use
    metrics.score_trajectory (every submission, failed ones as 0) against the submission index."""
    timeline = summary.get("timeline")
    if isinstance(timeline, list):
        timeline = [item for item in timeline if isinstance(item, dict)]
        times = [number(item.get("since_start_s")) for item in timeline]
        hours = bool(timeline) and all(t is not None for t in times)
        x = [t / 3600 for t in times] if hours else list(range(1, len(timeline) + 1))
        # "scored" as delta_at_cut reads it: only an explicit true counts as evaluated
        scored = [item.get("scored") is True for item in timeline]
        return {
            "x": [xi for xi, ok in zip(x, scored) if ok],
            "y": [number(item.get("score")) or 0.0 for item, ok in zip(timeline, scored) if ok],
            "failed_x": [xi for xi, ok in zip(x, scored) if not ok],
            "hours": hours,
        }
    metrics = summary.get("metrics")
    scores = metrics.get("score_trajectory") if isinstance(metrics, dict) else None
    scores = scores if isinstance(scores, list) else []
    return {"x": list(range(1, len(scores) + 1)), "y": [number(v) or 0.0 for v in scores], "failed_x": [], "hours": False}


def _run_styles(summaries: list[dict]) -> dict:
    """(configuration label, model, seed) -> (colour, linestyle, marker): the colour and marker per
    configuration and model, the line style per seed, the same in every panel (hollow markers of
    different shapes stay visible where two runs have the same scores)."""
    groups = sorted({(config_label(config_key(s)), _model(s)) for s in summaries})
    seeds = sorted({_seed(s) for s in summaries}, key=seed_order)
    return {
        (config, model, seed): (PALETTE[g % len(PALETTE)], LINESTYLES[k % len(LINESTYLES)], MARKERS[g % len(MARKERS)])
        for g, (config, model) in enumerate(groups)
        for k, seed in enumerate(seeds)
    }


def _run_label(summary: dict, several_models: bool, ambiguous_agents: set) -> str:
    agent = run_label(summary, "agent")
    name = config_label(config_key(summary)) if agent in ambiguous_agents else agent
    label = f"{name} / seed {_seed(summary)}"
    return f"{label} ({_model(summary)})" if several_models else label


def score_trajectories(summaries: list[dict], png: Path | str, svg: Path | str) -> None:
    """One panel per task, one line per run: the score of each evaluated submission over the hours
    since the run started (minutes when a panel's runs all submitted within the first hour; the
    submission index where times are unknown), failed submissions as x at 0,
    the base model's score as a dashed grey line per model."""
    title = "Score of each evaluated submission, per run"
    with _style():
        if not summaries:
            _empty(title, png, svg)
            return
        summaries = sorted(summaries, key=_run_order)
        tasks = sorted({_task(s) for s in summaries})
        models = sorted({_model(s) for s in summaries})
        several_models = len(models) > 1
        agents_by_key = defaultdict(set)
        for s in summaries:
            agents_by_key[run_label(s, "agent")].add(config_key(s))
        ambiguous = {a for a, keys in agents_by_key.items() if len(keys) > 1}
        styles = _run_styles(summaries)
        rows, cols = _grid(len(tasks))
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.9), layout="constrained", squeeze=False)
        axes = list(axes.flat)
        legend = {}
        for ax, task in zip(axes, tasks):
            runs = [s for s in summaries if _task(s) == task]
            points = [(s, run_points(s)) for s in runs]
            with_points = [p for _, p in points if p["x"] or p["failed_x"]]
            hours = bool(with_points) and all(p["hours"] for p in with_points)
            if not hours:  # one x unit per panel: the index when any run lacks times
                points = [(s, _as_index(s, p)) for s, p in points]
            minutes = hours and max(x for p in with_points for x in p["x"] + p["failed_x"]) < 1.0  # short runs: minutes
            if minutes:
                points = [(s, {**p, "x": [x * 60 for x in p["x"]], "failed_x": [x * 60 for x in p["failed_x"]]}) for s, p in points]
            for s, p in points:
                colour, linestyle, marker = styles[(config_label(config_key(s)), _model(s), _seed(s))]
                label = _run_label(s, several_models, ambiguous)
                if p["x"]:
                    (line,) = ax.plot(p["x"], p["y"], color=colour, linestyle=linestyle, marker=marker, markersize=6,
                                      markerfacecolor="none", markeredgewidth=1.3, linewidth=1.4)
                    legend.setdefault(label, line)
                if p["failed_x"]:
                    ax.plot(p["failed_x"], [0.0] * len(p["failed_x"]), linestyle="none", marker="x", color=colour, markersize=6)
                    legend.setdefault("failed submission (score 0)", Line2D([], [], linestyle="none", marker="x", color="#444444"))
                if not p["x"] and not p["failed_x"]:
                    proxy = Line2D([], [], color=colour, linestyle=linestyle, marker=marker, markerfacecolor="none")
                    legend.setdefault(f"{label}: no submission", proxy)
            _baselines(ax, runs, several_models, legend)
            if not any(p["x"] or p["failed_x"] for _, p in points):
                ax.text(0.5, 0.5, "no submission", ha="center", va="center", color="#444444", transform=ax.transAxes)
            metric = next((s.get("primary_metric") for s in runs if s.get("primary_metric")), None)
            ax.set_title(task)
            unit = "min" if minutes else "h"
            ax.set_xlabel(f"time since the run started ({unit})" if hours else "submission (index; times unknown)")
            ax.set_ylabel(f"score ({metric}, 0-100)" if metric else "score (0-100)")
            _trajectory_limits(ax, points, runs, hours)
            ax.grid(True, color="#e5e5e5", linewidth=0.6)
        _hide_unused(axes, len(tasks))
        _suptitle(fig, title)
        shared = ("baseline (base model)", "failed submission (score 0)")
        order = [k for k in legend if k not in shared] + [k for k in shared if k in legend]
        _legend_below(fig, [legend[k] for k in order], order)
        _save(fig, png, svg)


def _trajectory_limits(ax, points: list, runs: list[dict], hours: bool) -> None:
    """x from the start (hours) or around the indices; y from 0 and at least 5 points tall, so
    that flat trajectories do not blow a rounding error up to the full height."""
    ys = [y for _, p in points for y in p["y"]] + [b for b in (number(s.get("baseline")) for s in runs) if b is not None]
    lo, hi = min(ys + [0.0]), max(ys + [0.0])
    hi = max(hi, lo + 5.0)
    pad = 0.06 * (hi - lo)
    ax.set_ylim(lo - pad, hi + pad)
    if hours:
        ax.set_xlim(left=0)
    else:
        last = max((x for _, p in points for x in p["x"] + p["failed_x"]), default=1)
        ax.set_xlim(0.5, last + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _as_index(summary: dict, points: dict) -> dict:
    """A run's points against the submission index (used when a panel cannot use hours)."""
    if not points["hours"]:
        return points
    timeline = [item for item in summary.get("timeline") or [] if isinstance(item, dict)]
    scored = [item.get("scored") is True for item in timeline]
    index = list(range(1, len(timeline) + 1))
    return {
        "x": [i for i, ok in zip(index, scored) if ok],
        "y": points["y"],
        "failed_x": [i for i, ok in zip(index, scored) if not ok],
        "hours": False,
    }


def _baselines(ax, runs: list[dict], several_models: bool, legend: dict) -> None:
    """The base model's score as a dashed grey line, one per model, named when there are several
    (models with the same baseline share one line and one name)."""
    values, seen = defaultdict(list), set()
    for s in runs:
        baseline = number(s.get("baseline"))
        if baseline is not None and _model(s) not in seen:
            seen.add(_model(s))
            values[baseline].append(_model(s))
    for value, models in sorted(values.items()):
        line = ax.axhline(value, color=BASELINE_COLOUR, linestyle="--", linewidth=1.1, zorder=0)
        legend.setdefault("baseline (base model)", line)
        if several_models:
            ax.annotate("baseline " + ", ".join(sorted(models)), (0.0, value), xycoords=("axes fraction", "data"), xytext=(3, 2),
                        textcoords="offset points", ha="left", va="bottom", fontsize=7, color="#555555")


# ----------------------------------------------------------------------------- Δ heatmap


def heatmap_cells(summaries: list[dict]) -> dict:
    """The Δ heatmap's numbers, as the Δ matrix table (rlbench.analysis.tables.delta_matrix) computes them:
    {model: {(configuration label, task): cell}} where cell =
    {"mean": mean Δ over the seeds with a Δ (None when none has one), "n": number of those seeds,
    "runs": number of runs, "band": grader-noise band or None, "inside_band": |mean| <= band
    (None when the band or the mean is unknown)}. Cells without a run are absent."""
    cells: dict = defaultdict(dict)
    for (key, task, model), runs in group_runs(summaries).items():
        deltas = [d for d in (run_delta(s) for s in runs) if d is not None]
        mean_delta, band = mean(deltas), cell_band(runs)
        cells[model][(config_label(key), task)] = {
            "mean": mean_delta,
            "n": len(deltas),
            "runs": len(runs),
            "band": band,
            "inside_band": within_noise(mean_delta, band),
        }
    return dict(cells)


def cell_text(cell: dict | None, decimals: int = 2) -> str:
    """A heatmap cell's annotation: the mean Δ written as the Δ matrix's Markdown writes it (signed,
    `decimals` decimals, no "-0.00"), "≈" when inside the grader-noise band, "n=K" when K > 1 seeds;
    "no run" for a missing cell, "no Δ" when its runs have no Δ."""
    if cell is None:
        return "no run"
    if cell["mean"] is None:
        return "no Δ"
    text = signed(cell["mean"], decimals)
    if cell["inside_band"]:
        text = f"≈ {text}"
    if cell["n"] > 1:
        text += f"\nn={cell['n']}"
    return text


def delta_heatmap(summaries: list[dict], png: Path | str, svg: Path | str, decimals: int = 2) -> None:
    """Rows = configurations, columns = tasks, cell = mean Δ over seeds; one panel per model (side by
    side, or stacked when they would hold more than ten columns together), each with the tasks its
    model ran; grey "no run" where a configuration did not run a task."""
    title = "Δ over the base model (mean over seeds; ≈ = inside the grader-noise band)"
    with _style():
        if not summaries:
            _empty(title, png, svg)
            return
        cells = heatmap_cells(summaries)
        models = sorted(cells)
        rows = sorted({c for m in models for c, _ in cells[m]})
        # each model's panel shows the tasks that model ran; the configurations are shared rows
        tasks_of = {m: sorted({t for _, t in cells[m]}) for m in models}
        columns = sum(len(t) for t in tasks_of.values())
        side_by_side = len(models) == 1 or columns <= 10
        means = [c["mean"] for m in models for c in cells[m].values() if c["mean"] is not None]
        limit = max((abs(v) for v in means), default=0.0) or 1.0
        norm = Normalize(vmin=-limit, vmax=limit)
        cmap = plt.get_cmap(HEATMAP_CMAP)
        label_width = max(len(r) for r in rows) * 0.065 + 0.6
        panel_height = max(2.8, 1.1 + 0.5 * len(rows))  # at least the height of the two-line y label
        if side_by_side:
            width = label_width + 1.15 * columns + 0.4 * len(models) + 1.4
            fig, axes = plt.subplots(1, len(models), figsize=(min(30.0, width), panel_height + 0.5), layout="constrained",
                                     squeeze=False, gridspec_kw={"width_ratios": [len(tasks_of[m]) for m in models]})
        else:
            width = label_width + 1.15 * max(len(t) for t in tasks_of.values()) + 1.4
            fig, axes = plt.subplots(len(models), 1, figsize=(min(30.0, width), panel_height * len(models) + 0.5),
                                     layout="constrained", squeeze=False)
        axes = list(axes.flat)
        for ax, model in zip(axes, models):
            tasks = tasks_of[model]
            labelled = ax is axes[0] or not side_by_side
            for i, row in enumerate(rows):
                for j, task in enumerate(tasks):
                    cell = cells[model].get((row, task))
                    value = None if cell is None else cell["mean"]
                    colour = EMPTY_CELL_COLOUR if value is None else cmap(norm(value))
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=colour, edgecolor="white", linewidth=1.5))
                    dark = value is not None and abs(norm(value) - 0.5) > 0.3
                    ax.text(j, i, cell_text(cell, decimals), ha="center", va="center", fontsize=8,
                            color="white" if dark else "black", style="italic" if value is None else "normal")
            ax.set_xlim(-0.5, len(tasks) - 0.5)
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.set_xticks(range(len(tasks)), tasks, rotation=30 if len(tasks) > 3 else 0, ha="right" if len(tasks) > 3 else "center")
            ax.set_yticks(range(len(rows)), rows if labelled else [""] * len(rows))
            ax.set_xlabel("task")
            if labelled:
                ax.set_ylabel("configuration\nagent (scaffold / driver, mode)")
            ax.set_title(f"model: {model}")
            ax.tick_params(length=0)
            for spine in ax.spines.values():
                spine.set_visible(False)
        mappable = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
        bar = fig.colorbar(mappable, ax=axes, shrink=0.9, aspect=max(10, 6 * len(rows)), pad=0.02)
        bar.set_label("Δ (points)")
        _suptitle(fig, title)
        _save(fig, png, svg)


# ----------------------------------------------------------------------------- budget scaling


def budget_points(summaries: list[dict], fractions: list[float]) -> dict:
    """Budget scaling's numbers: {(task, configuration label, model): [(fraction, mean, lo, hi, n)]}
    with mean / min / max of delta_at_cut over the seeds whose Δ at that cut is known (n of them);
    fractions where no seed has a value are left out."""
    out = {}
    for (key, task, model), runs in group_runs(summaries).items():
        points = []
        for f in fractions:
            values = [v for v in (delta_at_cut(s, f) for s in runs) if v is not None]
            if values:
                points.append((float(f), mean(values), min(values), max(values), len(values)))
        out[(task, config_label(key), model)] = points
    return out


def budget_scaling(summaries: list[dict], fractions: list[float], png: Path | str, svg: Path | str) -> None:
    """One panel per task: mean Δ at each budget cut (best evaluated submission before the cut minus
    the baseline) per configuration, error bars from the lowest to the highest seed (n >= 2)."""
    title = "Budget scaling: Δ when the run is cut at a share of its budget (mean over seeds)"
    with _style():
        fractions = sorted(float(f) for f in fractions)
        if not summaries or not fractions:
            _empty(title, png, svg, NO_RUNS if not summaries else "no budget cuts configured")
            return
        budgets = {budget_seconds(s) for s in summaries}
        common = budgets.pop() if len(budgets) == 1 else None  # the one budget every run had
        # x in the runs' own time when they all had the same budget: hours, minutes under 1 h
        unit = None if not common else "h" if common >= 3600 else "min"
        scale = None if not common else common / (3600 if unit == "h" else 60)
        points = budget_points(summaries, fractions)
        tasks = sorted({_task(s) for s in summaries})
        several_models = len({_model(s) for s in summaries}) > 1
        series = sorted({(config, model) for (_, config, model) in points})
        rows, cols = _grid(len(tasks))
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.9), layout="constrained", squeeze=False)
        axes = list(axes.flat)
        legend = {}
        xs_all = [f * scale if scale else f for f in fractions]
        for ax, task in zip(axes, tasks):
            runs = [s for s in summaries if _task(s) == task]
            band = cell_band(runs)
            if band:
                span = ax.axhspan(-band, band, color="#eeeeee", zorder=0)
                legend.setdefault("grader-noise band", span)
            ax.axhline(0.0, color=BASELINE_COLOUR, linestyle="--", linewidth=1.0, zorder=1)
            drawn = False
            for i, (config, model) in enumerate(series):
                pts = points.get((task, config, model))
                if not pts:
                    continue
                xs = [p[0] * scale if scale else p[0] for p in pts]
                ys = [p[1] for p in pts]
                errs = [[p[1] - p[2] if p[4] >= 2 else 0.0 for p in pts], [p[3] - p[1] if p[4] >= 2 else 0.0 for p in pts]]
                has_err = any(p[4] >= 2 for p in pts)
                container = ax.errorbar(xs, ys, yerr=errs if has_err else None, color=PALETTE[i % len(PALETTE)],
                                        linestyle=LINESTYLES[(i // len(PALETTE)) % len(LINESTYLES)], marker=MARKERS[i % len(MARKERS)],
                                        markersize=6, markerfacecolor="none", markeredgewidth=1.3, linewidth=1.4, capsize=3)
                legend.setdefault(f"{config} · {model}" if several_models else config, container.lines[0])
                drawn = True
            if not drawn:
                ax.text(0.5, 0.5, "no budget or submission times", ha="center", va="center", color="#444444", transform=ax.transAxes)
            _symmetric_floor(ax, band or 0.0)
            ax.set_xticks(xs_all, [f"{x:.3g}" for x in xs_all])
            ax.set_xlim(0, max(xs_all) * 1.05 if max(xs_all) > 0 else 1)
            ax.set_title(task)
            ax.set_xlabel(f"budget ({unit})" if scale else "budget (fraction of the run's budget)")
            ax.set_ylabel("Δ at the cut (points)")
            ax.grid(True, color="#e5e5e5", linewidth=0.6)
        _hide_unused(axes, len(tasks))
        legend.setdefault("base model (Δ = 0)", Line2D([], [], color=BASELINE_COLOUR, linestyle="--"))
        _suptitle(fig, title)
        _legend_below(fig, list(legend.values()), list(legend.keys()))
        _save(fig, png, svg)


def _symmetric_floor(ax, band: float) -> None:
    """At least ±1 point (and the noise band) around Δ = 0 on the y axis, so that a flat line at 0
    does not blow a rounding error up to the full height."""
    lo, hi = ax.get_ylim()
    floor = max(1.0, band * 1.15)
    ax.set_ylim(min(lo, -floor), max(hi, floor))


# ----------------------------------------------------------------------------- route distribution


def route_counts(summaries: list[dict]) -> dict:
    """{task: {route label: runs}} over every model, as the routes table counts them: a missing or
    unrecognized route counts as "unknown"."""
    counts: dict = defaultdict(lambda: defaultdict(int))
    for s in summaries:
        route = s.get("route")
        counts[_task(s)][route if route in ROUTE_LABELS else UNKNOWN] += 1
    return {task: dict(c) for task, c in counts.items()}


def route_distribution(summaries: list[dict], png: Path | str, svg: Path | str) -> None:
    """Stacked bars per task: how many runs ended on each route (GRPO, SFT, Copy, ...)."""
    title = "Route each run took, per task (route of its best trained submission)"
    with _style():
        if not summaries:
            _empty(title, png, svg)
            return
        counts = route_counts(summaries)
        tasks = sorted(counts)
        present = {r for c in counts.values() for r in c}
        routes = [r for r in ROUTE_LABELS if r in present]
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(tasks) + 3.2), 4.0), layout="constrained")
        bottoms = [0] * len(tasks)
        for route in routes:
            heights = [counts[t].get(route, 0) for t in tasks]
            ax.bar(range(len(tasks)), heights, bottom=bottoms, color=ROUTE_COLOURS[route], edgecolor="white", linewidth=0.8, label=route, width=0.6)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        for j, total in enumerate(bottoms):
            ax.annotate(str(total), (j, total), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(tasks)), tasks, rotation=30 if len(tasks) > 4 else 0, ha="right" if len(tasks) > 4 else "center")
        ax.set_xlabel("task")
        ax.set_ylabel("runs (count)")
        ax.set_ylim(0, max(bottoms) * 1.15 + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        _suptitle(fig, title)
        ax.legend(title="route", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        _save(fig, png, svg)
