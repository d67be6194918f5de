"""The paper's tables across runs (SPEC §5), computed from the runs' summary.json files.

Every table is a `Table` (name, title, columns, rows, notes) and is written as <name>.csv (tidy:
one header, raw numbers rounded to `report.decimals`, empty cells for unknown values) and
<name>.md (a title, the table, notes that define the columns and say what a blank means).

Definitions shared with the figures (rlbench.analysis.figures imports them from here):

* a configuration is (agent, scaffold, driver, mode) (`config_key`); a cell is (configuration,
  task, model) over its seeds (`group_runs`);
* the Δ of a run is summary["delta"] (final evaluation of the best submission minus the baseline);
* `delta_at_cut`: Δ when the run is cut at a fraction of its budget;
* `pass_at_k`: expected best Δ over k seeds drawn without replacement (unbiased estimator);
* `bootstrap_ci`: percentile bootstrap CI of the mean Δ over seeds;
* `within_noise`: |Δ| <= the task's grader-noise band.
"""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlbench.summaries.diagnostics import FAILURE_TYPES, ROUTE_LABELS, TRAINING_ROUTES

# The defaults of config/config.yaml `report:`; a missing key takes its default here.
DEFAULT_SETTINGS = {
    "decimals": 2,
    "budget_cuts": [0.25, 0.5, 1.0],
    "pass_at_k": [1, 3, 5],
    "bootstrap": {"resamples": 10000, "confidence": 0.95, "seed": 0},
}
# The interactive (L3) failure types of summary.json["interactive_failure"]["type"] (SPEC §4).
INTERACTIVE_FAILURE_TYPES = (
    "rollout_construction_failure",
    "reward_data_design_failure",
    "training_collapse",
    "early_coding_failure",
    "static_shortcut_without_transfer",
)
CONFIG_COLUMNS = ("model", "agent", "scaffold", "driver", "mode")
# |Δ| <= band is tested with this absolute slack, so that a Δ computed as best - baseline in floating
# point (0.30000000000000004) is not pushed out of a band it sits on (0.3).
NOISE_TOLERANCE = 1e-9
BLANK_MD = "–"  # how the Markdown shows an unknown / not applicable value (the CSV leaves the cell empty)


# -- small readers of summary.json ---------------------------------------------------------------------
def number(value) -> float | None:
    """A finite float from a summary field, None for anything else (missing, bool, text, nan, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _labels(summary: dict) -> dict:
    labels = summary.get("labels")
    return labels if isinstance(labels, dict) else {}


def run_label(summary: dict, name: str) -> str:
    value = _labels(summary).get(name)
    return "" if value is None else str(value)


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def seed_order(seed: str) -> tuple:
    """Numeric seeds in numeric order, then any other seed label in text order."""
    return (0, int(seed), "") if str(seed).lstrip("-").isdigit() else (1, 0, str(seed))


def config_key(summary: dict) -> tuple[str, str, str, str]:
    """The configuration of a run: (agent, scaffold, driver or "", mode or "free"). Reference agents
    have scaffold "reference" and no driver."""
    return (
        run_label(summary, "agent"),
        str(summary.get("scaffold") or "reference"),
        str(summary.get("driver") or ""),
        str(summary.get("mode") or "free"),
    )


def config_label(key: tuple[str, str, str, str]) -> str:
    """A short readable name of a configuration: "sft (reference, free)",
    "claude-sonnet (claude-code / claude-sonnet-4, free)"."""
    agent, scaffold, driver, mode = key
    tool = f"{scaffold} / {driver}" if driver else scaffold
    return f"{agent} ({tool}, {mode})"


def group_runs(summaries: list[dict]) -> dict[tuple[tuple[str, str, str, str], str, str], list[dict]]:
    """The cells: (config_key, task, model) -> the cell's summaries in seed order; cells ordered by
    model, configuration, task (the column order of the tables)."""
    groups: dict = defaultdict(list)
    for summary in summaries:
        groups[(config_key(summary), run_label(summary, "task"), run_label(summary, "model"))].append(summary)
    return {
        key: sorted(runs, key=lambda s: seed_order(run_label(s, "seed")))
        for key, runs in sorted(groups.items(), key=lambda item: (item[0][2], item[0][0], item[0][1]))
    }


def run_delta(summary: dict) -> float | None:
    """The Δ of a run: summary["delta"]; None when nothing was evaluated (or the field is missing)."""
    return number(summary.get("delta"))


def budget_seconds(summary: dict) -> float | None:
    """The run's budget in seconds: summary["budget_s"], else run_meta.timeout_s (older summaries)."""
    budget = number(summary.get("budget_s"))
    if budget is None:
        budget = number(_dict(summary.get("run_meta")).get("timeout_s"))
    return budget if budget is not None and budget > 0 else None


def noise_band(summary: dict) -> float | None:
    """The task's grader-noise band (± points) recorded with the run; None when unknown."""
    return number(_dict(summary.get("grader_noise")).get("band"))


def within_noise(delta: float | None, band: float | None) -> bool | None:
    """True when |Δ| <= band (a deterministic grader has band 0: only Δ == 0 is inside); None when
    either is unknown."""
    if delta is None or band is None:
        return None
    return abs(delta) <= band + NOISE_TOLERANCE


# -- the statistics of the paper --------------------------------------------------------------------
def delta_at_cut(summary: dict, fraction: float) -> float | None:
    """Δ of a run cut at `fraction` of its budget: the best score among its evaluated submissions
    (summary["timeline"] items with scored true) with since_start_s <= fraction * budget_s, minus the
    baseline; 0.0 when no evaluated submission came before the cut (the base model stands); None when
    the budget, the baseline or the timeline is unknown. A submission without a time never counts."""
    budget, baseline = budget_seconds(summary), number(summary.get("baseline"))
    timeline = summary.get("timeline")
    if budget is None or baseline is None or not isinstance(timeline, list):
        return None
    cut = fraction * budget
    scores = []
    for item in timeline:
        if not isinstance(item, dict) or item.get("scored") is not True:
            continue
        since, score = number(item.get("since_start_s")), number(item.get("score"))
        if since is not None and score is not None and since <= cut:
            scores.append(score)
    return max(scores) - baseline if scores else 0.0


def pass_at_k(deltas: list[float], k: int) -> float | None:
    """Expected best Δ over k runs drawn without replacement from the n runs (unbiased): with Δ sorted
    ascending x_1..x_n, sum_{i=k..n} C(i-1, k-1) / C(n, k) * x_i. None when n < k (or k < 1)."""
    values = sorted(float(d) for d in deltas)
    n = len(values)
    if k < 1 or n < k:
        return None
    total = math.comb(n, k)
    return sum(math.comb(i - 1, k - 1) * values[i - 1] for i in range(k, n + 1)) / total


def bootstrap_ci(
    values: list[float], resamples: int = 10000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean: `resamples` resamples of size n with replacement drawn by
    numpy.random.default_rng(seed), bounds at the (1-confidence)/2 and 1-(1-confidence)/2 quantiles
    of the resampled means (numpy.quantile, default method). None when n < 2. The bounds are clipped
    to [min, max] of the values, which they lie in exactly (only floating-point sums could step out)."""
    data = np.asarray([float(v) for v in values], dtype=float)
    if data.size < 2 or resamples < 1:
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(int(resamples), data.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    lo_bound, hi_bound = float(data.min()), float(data.max())
    return min(max(float(low), lo_bound), hi_bound), min(max(float(high), lo_bound), hi_bound)


def sample_std(values: list[float]) -> float | None:
    """Sample standard deviation (ddof=1); None when n < 2."""
    return float(np.std(values, ddof=1)) if len(values) >= 2 else None


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def percent(hits: int, total: int) -> float | None:
    """100 * hits / total; None when total is 0."""
    return 100.0 * hits / total if total else None


def cell_band(runs: list[dict]) -> float | None:
    """The grader-noise band of a cell: the largest band recorded by its runs (they share the task's
    grader, so they normally agree); None when no run recorded one."""
    bands = [b for b in (noise_band(s) for s in runs) if b is not None]
    return max(bands) if bands else None


def settings_with_defaults(settings: dict | None) -> dict:
    """The report block with every missing key (and missing bootstrap key) taken from DEFAULT_SETTINGS."""
    settings = dict(settings or {})
    merged = {key: settings.get(key, default) for key, default in DEFAULT_SETTINGS.items() if key != "bootstrap"}
    merged["bootstrap"] = {**DEFAULT_SETTINGS["bootstrap"], **_dict(settings.get("bootstrap"))}
    for key, value in settings.items():
        merged.setdefault(key, value)
    return merged


# -- tables ----------------------------------------------------------------------------------------------
@dataclass
class Table:
    """A table: `rows` map column names to raw values (None = unknown, shown blank). The Markdown shows
    `display_columns` / `display_rows` instead of the tidy rows when set (the Δ matrix's wide view)."""

    name: str
    title: str
    columns: list[str]
    rows: list[dict]
    notes: list[str] = field(default_factory=list)
    decimals: int = 2
    display_columns: list[str] | None = None
    display_rows: list[dict] | None = None
    # Columns rounded to other decimals than `decimals` (cost in USD).
    column_decimals: dict[str, int] = field(default_factory=dict)


def _yes_no(flag: bool | None) -> str | None:
    return None if flag is None else "yes" if flag else "no"


def _config_cells(key: tuple[str, str, str, str], model: str) -> dict:
    agent, scaffold, driver, mode = key
    return {"model": model, "agent": agent, "scaffold": scaffold, "driver": driver, "mode": mode}


def _tasks(summaries: list[dict]) -> list[str]:
    return sorted({run_label(s, "task") for s in summaries})


def _n_label(counts: list[int]) -> str | None:
    """n of a wide row: the seeds per cell, "lo-hi" when the tasks differ."""
    counts = [c for c in counts if c]
    if not counts:
        return None
    return str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"


def _metric_notes(summaries: list[dict], tasks: list[str]) -> list[str]:
    """Per task: the primary metric the scores are in, and for AlpacaEval the length-controlled method."""
    notes = []
    for task in tasks:
        runs = [s for s in summaries if run_label(s, "task") == task]
        metrics = sorted({str(s["primary_metric"]) for s in runs if s.get("primary_metric")})
        text = f"{task}: " + (" / ".join(metrics) if metrics else "metric not recorded")
        lc_methods = sorted(
            {
                str(_dict(s.get(part)).get("lc_method"))
                for s in runs
                for part in ("eval_metrics", "baseline_metrics")
                if _dict(s.get(part)).get("lc_method")
            }
        )
        if lc_methods:
            text += f" (length-controlled method: {', '.join(lc_methods)})"
        notes.append(text)
    return notes


CONFIG_NOTE = (
    "A configuration is (agent, scaffold, driver, mode): scaffold is the coding-agent tool or `reference` "
    "for the scripted reference agents, driver the driver LLM (blank for reference agents), mode the "
    "operating mode (free, sft-only, rl-only, ...)."
)
DELTA_NOTE = "Δ of a run = final evaluation of its best submission minus the base model's score (the baseline)."
N_NOTE = "n: runs with a known Δ (a run with no evaluated submission has none and is left out)."


def leaderboard_paper(summaries: list[dict]) -> Table:
    """The paper's leaderboard: per base model one row per configuration (mean best score over seeds,
    per task) and one baseline row."""
    tasks = _tasks(summaries)
    groups = group_runs(summaries)
    by_row: dict = defaultdict(dict)
    for (key, task, model), runs in groups.items():
        by_row[(model, key)][task] = runs
    rows = []
    for model in sorted({model for model, _ in by_row}):
        baseline_row = {"model": model, "agent": "baseline", "scaffold": None, "driver": None, "mode": None, "n": None}
        for task in tasks:
            baselines = [
                b
                for s in summaries
                if run_label(s, "task") == task and run_label(s, "model") == model
                for b in [number(s.get("baseline"))]
                if b is not None
            ]
            baseline_row[task] = mean(baselines)
        rows.append(baseline_row)
        for row_model, key in sorted(k for k in by_row if k[0] == model):
            row, counts = _config_cells(key, model), []
            for task in tasks:
                best = [b for b in (number(s.get("best")) for s in by_row[(row_model, key)].get(task, [])) if b is not None]
                row[task] = mean(best)
                counts.append(len(best))
            row["n"] = _n_label(counts)
            rows.append(row)
    notes = [
        CONFIG_NOTE,
        "Each task column: the mean over seeds of the runs' best score (final evaluation of the best submission); "
        "the baseline row holds the base model's score.",
        "n: seeds per cell with a known best score (a range when the tasks differ).",
        "Blank: no run of that configuration on that task, or no evaluated submission.",
        "Metrics per task:",
        *[f"  {note}" for note in _metric_notes(summaries, tasks)],
    ]
    return Table(
        "leaderboard_paper",
        "Leaderboard (best score per task, mean over seeds)",
        [*CONFIG_COLUMNS, *tasks, "n"],
        rows,
        notes,
    )


def _cell_stats(runs: list[dict], bootstrap: dict) -> dict:
    """Δ statistics of one cell over the runs with a known Δ."""
    deltas = [d for d in (run_delta(s) for s in runs) if d is not None]
    ci = bootstrap_ci(deltas, int(bootstrap["resamples"]), float(bootstrap["confidence"]), int(bootstrap["seed"]))
    band = cell_band(runs)
    mean_delta = mean(deltas)
    return {
        "deltas": deltas,
        "n": len(deltas),
        "mean_delta": mean_delta,
        "ci_low": None if ci is None else ci[0],
        "ci_high": None if ci is None else ci[1],
        "noise_band": band,
        "within_noise": _yes_no(within_noise(mean_delta, band)),
    }


def signed(value: float, decimals: int) -> str:
    text = f"{value:+.{decimals}f}"
    return text.replace("-", "+", 1) if float(text) == 0 else text  # no "-0.00"


def delta_matrix(summaries: list[dict], settings: dict) -> Table:
    """Mean Δ per (configuration, task, model): tidy in the CSV, wide (tasks as columns) in the Markdown."""
    decimals, bootstrap = int(settings["decimals"]), settings["bootstrap"]
    tasks = _tasks(summaries)
    rows, wide = [], defaultdict(dict)
    for (key, task, model), runs in group_runs(summaries).items():
        stats = _cell_stats(runs, bootstrap)
        rows.append(
            {
                **_config_cells(key, model),
                "task": task,
                **{k: stats[k] for k in ("n", "mean_delta", "ci_low", "ci_high", "noise_band", "within_noise")},
            }
        )
        if stats["mean_delta"] is None:
            continue
        text = signed(stats["mean_delta"], decimals)
        if stats["ci_low"] is not None:
            text += f" [{signed(stats['ci_low'], decimals)}, {signed(stats['ci_high'], decimals)}]"
        if stats["within_noise"] == "yes":
            text = f"≈ {text}"
        wide[(model, key)][task] = text
        wide[(model, key)].setdefault("_n", []).append(stats["n"])
    display_rows = []
    for (model, key), cells in sorted(wide.items()):
        display_rows.append({**_config_cells(key, model), **{t: cells.get(t) for t in tasks}, "n": _n_label(cells["_n"])})
    confidence = float(bootstrap["confidence"])
    notes = [
        CONFIG_NOTE,
        DELTA_NOTE,
        f"mean_delta: mean Δ over seeds; ci_low / ci_high: {confidence:.0%} percentile bootstrap CI of the mean "
        f"({int(bootstrap['resamples'])} resamples, seed {int(bootstrap['seed'])}), blank when n < 2.",
        "noise_band: the task's grader-noise band (± points, half the range of repeated baseline evaluations; "
        "0 for a deterministic grader); within_noise: yes when |mean Δ| <= noise_band, blank when the band is unknown.",
        N_NOTE,
        "Markdown view: each cell is the mean Δ, [CI] where n >= 2, marked ≈ when inside the grader-noise band; "
        f"{BLANK_MD}: no run with a known Δ.",
    ]
    return Table(
        "delta_matrix",
        "Δ matrix (mean Δ over seeds per task)",
        [*CONFIG_COLUMNS, "task", "n", "mean_delta", "ci_low", "ci_high", "noise_band", "within_noise"],
        rows,
        notes,
        display_columns=[*CONFIG_COLUMNS, *tasks, "n"],
        display_rows=display_rows,
    )


def _exec_success_pct(runs: list[dict]) -> float | None:
    """exec SR in percent; None when a run of the cell did not record exec_success (older summaries)."""
    flags = [s.get("exec_success") for s in runs]
    if not runs or any(not isinstance(f, bool) for f in flags):
        return None
    return percent(sum(flags), len(runs))


def multirun_stats(summaries: list[dict], settings: dict) -> Table:
    """Per (configuration, task, model): mean, std and max Δ over seeds, improve SR, exec SR, CI, noise flag."""
    rows = []
    for (key, task, model), runs in group_runs(summaries).items():
        stats = _cell_stats(runs, settings["bootstrap"])
        deltas = stats["deltas"]
        rows.append(
            {
                **_config_cells(key, model),
                "task": task,
                "runs": len(runs),
                "n": stats["n"],
                "mean_delta": stats["mean_delta"],
                "std_delta": sample_std(deltas),
                "max_delta": max(deltas) if deltas else None,
                "improve_sr": percent(sum(1 for d in deltas if d > 0), len(runs)),
                "exec_sr": _exec_success_pct(runs),
                **{k: stats[k] for k in ("ci_low", "ci_high", "noise_band", "within_noise")},
            }
        )
    notes = [
        CONFIG_NOTE,
        DELTA_NOTE,
        "runs: runs of the cell (seeds); " + N_NOTE,
        "mean_delta, std_delta (sample standard deviation, blank when n < 2), max_delta: over the runs with a known Δ.",
        "improve_sr: % of runs with Δ > 0 (a run without Δ counts as no improvement); "
        "exec_sr: % of runs with at least one evaluated submission of trained weights scoring > 0 "
        "(a valid train -> submit cycle), blank when a run predates this field.",
        "ci_low / ci_high: bootstrap CI of the mean Δ (blank when n < 2); noise_band / within_noise: as in delta_matrix.",
    ]
    return Table(
        "multirun_stats",
        "Multi-run statistics per configuration, task and model",
        [*CONFIG_COLUMNS, "task", "runs", "n", "mean_delta", "std_delta", "max_delta", "improve_sr", "exec_sr",
         "ci_low", "ci_high", "noise_band", "within_noise"],
        rows,
        notes,
    )


def budget_scaling(summaries: list[dict], settings: dict) -> Table:
    """Per (configuration, task, model, cut): the mean Δ when each run is cut at a fraction of its budget."""
    bootstrap = settings["bootstrap"]
    rows = []
    for (key, task, model), runs in group_runs(summaries).items():
        budgets = [b for b in (budget_seconds(s) for s in runs) if b is not None]
        for fraction in settings["budget_cuts"]:
            fraction = float(fraction)
            deltas = [d for d in (delta_at_cut(s, fraction) for s in runs) if d is not None]
            ci = bootstrap_ci(deltas, int(bootstrap["resamples"]), float(bootstrap["confidence"]), int(bootstrap["seed"]))
            rows.append(
                {
                    **_config_cells(key, model),
                    "task": task,
                    "fraction": fraction,
                    "cut_hours": fraction * mean(budgets) / 3600 if budgets else None,
                    "n": len(deltas),
                    "mean_delta": mean(deltas),
                    "ci_low": None if ci is None else ci[0],
                    "ci_high": None if ci is None else ci[1],
                }
            )
    notes = [
        CONFIG_NOTE,
        "fraction: the cut as a fraction of each run's budget (the paper: 6 / 12 / 24 h of a 24 h run); "
        "cut_hours: fraction x the cell's mean budget, in hours.",
        "mean_delta: mean over runs of Δ at the cut = best score among the submissions evaluated before the cut minus "
        "the baseline (0 when none came before it: the base model stands).",
        "n: runs whose Δ at the cut is known (it is not for runs recorded without a submission timeline or budget); "
        "blank mean_delta when n is 0; ci_low / ci_high: bootstrap CI of the mean (blank when n < 2).",
    ]
    return Table(
        "budget_scaling",
        "Budget scaling (Δ when runs are cut at a fraction of their budget)",
        [*CONFIG_COLUMNS, "task", "fraction", "cut_hours", "n", "mean_delta", "ci_low", "ci_high"],
        rows,
        notes,
    )


def pass_at_k_table(summaries: list[dict], settings: dict) -> Table:
    """Per (configuration, task, model): pass@k of the runs' Δ for every k of the settings."""
    ks = [int(k) for k in settings["pass_at_k"]]
    rows = []
    for (key, task, model), runs in group_runs(summaries).items():
        deltas = [d for d in (run_delta(s) for s in runs) if d is not None]
        row = {**_config_cells(key, model), "task": task, "n": len(deltas)}
        row.update({f"pass_at_{k}": pass_at_k(deltas, k) for k in ks})
        rows.append(row)
    notes = [
        CONFIG_NOTE,
        "pass_at_k: the expected best Δ over k runs drawn without replacement from the cell's n runs "
        "(unbiased: Δ sorted ascending x_1..x_n, sum over i >= k of C(i-1, k-1) / C(n, k) x_i); pass_at_1 is the mean Δ.",
        N_NOTE + " Blank pass_at_k when n < k.",
    ]
    return Table(
        "pass_at_k",
        "pass@k (expected best Δ over k seeds)",
        [*CONFIG_COLUMNS, "task", "n", *[f"pass_at_{k}" for k in ks]],
        rows,
        notes,
    )


def _run_order(summary: dict) -> tuple:
    return (run_label(summary, "task"), run_label(summary, "model"), config_key(summary), seed_order(run_label(summary, "seed")))


def _int(value) -> int | None:
    return None if isinstance(value, bool) or not isinstance(value, int) else value


def workspace_stats(summaries: list[dict]) -> Table:
    """Per run: submissions, code files, model versions, zero-score %, index of the best submission, strategies."""
    rows = []
    for s in sorted(summaries, key=_run_order):
        share = number(s.get("zero_score_share"))
        routes = s.get("routes_used")
        rows.append(
            {
                "task": run_label(s, "task"),
                "model": run_label(s, "model"),
                "agent": run_label(s, "agent"),
                "seed": run_label(s, "seed"),
                "submissions": _int(s.get("submissions")),
                "code_files": _int(s.get("code_files")),
                "model_versions": _int(s.get("model_versions")),
                "zero_score_pct": None if share is None else 100.0 * share,
                "best_index": _int(s.get("best_index")),
                "strategies": "+".join(str(r) for r in routes) if isinstance(routes, list) and routes else None,
                "route": s.get("route") or None,
                "failure_type": s.get("failure_type") or None,
            }
        )
    notes = [
        "One row per run. submissions: recorded submissions; code_files: code files in the final workspace code/; "
        "model_versions: model versions under output/.",
        "zero_score_pct: % of submissions scoring 0 (failed ones count as 0); best_index: 1-based index of the best "
        "evaluated submission (first of ties).",
        "strategies: the training routes used over the iterations, joined by +; route: the run's route "
        f"({', '.join(ROUTE_LABELS)}); failure_type: why the run did not improve (blank when it did).",
        "Blank: not recorded (runs summarized before these fields existed) or nothing evaluated.",
    ]
    return Table(
        "workspace_stats",
        "Workspace statistics per run",
        ["task", "model", "agent", "seed", "submissions", "code_files", "model_versions", "zero_score_pct",
         "best_index", "strategies", "route", "failure_type"],
        rows,
        notes,
    )


def _coding_success(summary: dict) -> bool:
    flag = summary.get("coding_success")
    return flag if isinstance(flag, bool) else summary.get("route") in TRAINING_ROUTES


def routes(summaries: list[dict]) -> Table:
    """Per task and model: how many runs took each route, coding SR and improve SR."""
    cells: dict = defaultdict(list)
    for s in summaries:
        cells[(run_label(s, "task"), run_label(s, "model"))].append(s)
    rows = []
    for (task, model), runs in sorted(cells.items()):
        counts = Counter(s.get("route") if s.get("route") in ROUTE_LABELS else "unknown" for s in runs)
        improved = sum(1 for s in runs if (run_delta(s) or 0.0) > 0)
        rows.append(
            {
                "task": task,
                "model": model,
                "runs": len(runs),
                **{label: counts.get(label, 0) for label in ROUTE_LABELS},
                "coding_sr": percent(sum(1 for s in runs if _coding_success(s)), len(runs)),
                "improve_sr": percent(improved, len(runs)),
            }
        )
    notes = [
        "Runs per route, read from the recorded code: GRPO, PPO (and other online policy-gradient methods), "
        "DPO (and other preference methods), SFT-only, SFT+RL, Copy (base model resubmitted), "
        "Placeholder/Missing (no usable model), unknown (not recognized).",
        "coding_sr: % of runs on a real training route (coding success); improve_sr: % of runs with Δ > 0.",
    ]
    return Table(
        "routes",
        "Route distribution per task",
        ["task", "model", "runs", *ROUTE_LABELS, "coding_sr", "improve_sr"],
        rows,
        notes,
    )


TOKEN_FIELDS = ("calls", "input_tokens", "output_tokens", "total_tokens")


def tokens_cost(summaries: list[dict], decimals: int) -> Table:
    """Per run: LLM calls, tokens and cost from the run's gateway (blank for reference agents)."""
    rows = []
    for s in sorted(summaries, key=_run_order):
        tokens = _dict(s.get("tokens"))
        cost = number(s.get("cost_usd"))
        if cost is None:
            cost = number(tokens.get("cost_usd"))
        rows.append(
            {
                "task": run_label(s, "task"),
                "model": run_label(s, "model"),
                "agent": run_label(s, "agent"),
                "seed": run_label(s, "seed"),
                "scaffold": str(s.get("scaffold") or "reference"),
                "driver": s.get("driver") or None,
                **{name: _int(tokens.get(name)) for name in TOKEN_FIELDS},
                "cost_usd": cost,
            }
        )
    cost_decimals = max(decimals, 4)
    notes = [
        "One row per run: the LLM gateway's usage (calls, input / output / total tokens) and cost in USD "
        f"(rounded to {cost_decimals} decimals).",
        "Blank: no LLM usage recorded (scripted reference agents, or a gateway that did not report it).",
    ]
    return Table(
        "tokens_cost",
        "Token usage and cost per run",
        ["task", "model", "agent", "seed", "scaffold", "driver", *TOKEN_FIELDS, "cost_usd"],
        rows,
        notes,
        column_decimals={"cost_usd": cost_decimals},
    )


def failures(summaries: list[dict]) -> Table:
    """Per task and model: runs per failure type, and per interactive (L3) failure type."""
    cells: dict = defaultdict(list)
    for s in summaries:
        cells[(run_label(s, "task"), run_label(s, "model"))].append(s)
    seen = {str(s.get("failure_type")) for s in summaries if s.get("failure_type")}
    seen_interactive = {
        str(_dict(s.get("interactive_failure")).get("type"))
        for s in summaries
        if _dict(s.get("interactive_failure")).get("type")
    }
    failure_columns = [*FAILURE_TYPES, *sorted(seen - set(FAILURE_TYPES))]
    interactive_columns = [*INTERACTIVE_FAILURE_TYPES, *sorted(seen_interactive - set(INTERACTIVE_FAILURE_TYPES))]
    rows = []
    for (task, model), runs in sorted(cells.items()):
        kinds = Counter(str(s.get("failure_type")) for s in runs if s.get("failure_type"))
        interactive = Counter(
            str(_dict(s.get("interactive_failure")).get("type"))
            for s in runs
            if _dict(s.get("interactive_failure")).get("type")
        )
        rows.append(
            {
                "task": task,
                "model": model,
                "runs": len(runs),
                "no_failure": sum(1 for s in runs if not s.get("failure_type")),
                **{name: kinds.get(name, 0) for name in failure_columns},
                **{name: interactive.get(name, 0) for name in interactive_columns},
            }
        )
    notes = [
        "Runs per failure type (SPEC §4): " + ", ".join(failure_columns) + "; no_failure: runs without a failure type "
        "(they improved).",
        "Interactive (L3) runs without improvement also get an interactive failure type: "
        + ", ".join(interactive_columns) + " (0 for other levels).",
    ]
    return Table(
        "failures",
        "Failure types per task",
        ["task", "model", "runs", "no_failure", *failure_columns, *interactive_columns],
        rows,
        notes,
    )


def build_tables(summaries: list[dict], settings: dict | None = None) -> dict[str, Table]:
    """Every table of the report from the runs' summaries; settings: config `report:` (missing keys
    take DEFAULT_SETTINGS)."""
    settings = settings_with_defaults(settings)
    summaries = [s for s in summaries if isinstance(s, dict)]
    decimals = int(settings["decimals"])
    tables = [
        leaderboard_paper(summaries),
        delta_matrix(summaries, settings),
        multirun_stats(summaries, settings),
        budget_scaling(summaries, settings),
        pass_at_k_table(summaries, settings),
        workspace_stats(summaries),
        routes(summaries),
        tokens_cost(summaries, decimals),
        failures(summaries),
    ]
    for table in tables:
        table.decimals = decimals
    return {table.name: table for table in tables}


# -- writing ----------------------------------------------------------------------------------------------
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
