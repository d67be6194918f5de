"""The paper's tables across runs (SPEC §5), computed from the runs' summary.json files: one builder per
table, each giving a `Table` (rlbench.analysis.tablefiles) of its columns, rows and notes. Which tables
the report has, their names and titles, is the catalogue's (rlbench.analysis.catalogue, which also
builds them all); the definitions and statistics they share with the figures are rlbench.analysis.stats'.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from rlbench.analysis.stats import (
    as_dict,
    bootstrap_ci,
    budget_seconds,
    cell_band,
    config_key,
    delta_at_cut,
    group_runs,
    mean,
    mode_rank,
    number,
    pass_at_k,
    percent,
    protocol_text,
    run_delta,
    run_label,
    run_multi,
    sample_std,
    seed_order,
    signed,
    within_noise,
)
from rlbench.analysis.tablefiles import BLANK_MD, Table
from rlbench.recording.trace import GPU_BUSY_ABOVE_PERCENT
from rlbench.summaries.failures import FAILURE_TYPES
from rlbench.summaries.routes import ROUTE_LABELS, TRAINING_ROUTES

# The interactive (L3) failure types of summary.json["interactive_failure"]["type"] (SPEC §4).
INTERACTIVE_FAILURE_TYPES = (
    "rollout_construction_failure",
    "reward_data_design_failure",
    "training_collapse",
    "early_coding_failure",
    "static_shortcut_without_transfer",
)
CONFIG_COLUMNS = ("model", "agent", "scaffold", "driver", "mode")
# The column of the multi-task run's group (its tasks sorted, joined by +): in the configuration tables and the
# per-run tables only when the sweep has multi-task runs, so that a single-task sweep's tables keep their columns.
MULTI_COLUMN = "multi"


def _yes_no(flag: bool | None) -> str | None:
    return None if flag is None else "yes" if flag else "no"


def _has_multi(summaries: list[dict]) -> bool:
    return any(run_multi(s) for s in summaries)


def _config_columns(summaries: list[dict]) -> list[str]:
    """The configuration columns: CONFIG_COLUMNS, and `multi` when the sweep has multi-task runs."""
    return [*CONFIG_COLUMNS, *([MULTI_COLUMN] if _has_multi(summaries) else [])]


def _config_cells(key: tuple[str, str, str, str, str], model: str) -> dict:
    agent, scaffold, driver, mode, multi = key
    return {"model": model, "agent": agent, "scaffold": scaffold, "driver": driver, "mode": mode, "multi": multi or None}


def _tasks(summaries: list[dict]) -> list[str]:
    return sorted({run_label(s, "task") for s in summaries})


def _n_label(counts: list[int]) -> str | None:
    """n of a wide row: the seeds per cell, "lo-hi" when the tasks differ."""
    counts = [c for c in counts if c]
    if not counts:
        return None
    return str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"


def _metric_notes(summaries: list[dict], tasks: list[str]) -> list[str]:
    """Per task: the primary metric the scores are in, and the protocol variants they were measured
    with (stats.protocol_labels: WebShop's goals, AlpacaEval's annotator and length-controlled method, ...)."""
    notes = []
    for task in tasks:
        runs = [s for s in summaries if run_label(s, "task") == task]
        metrics = sorted({str(s["primary_metric"]) for s in runs if s.get("primary_metric")})
        text = f"{task}: " + (" / ".join(metrics) if metrics else "metric not recorded")
        variants = sorted({protocol_text(s) for s in runs} - {""})
        if variants:
            text += f" (protocol: {' | '.join(variants)})"
        notes.append(text)
    return notes


CONFIG_NOTE = (
    "A configuration is (agent, scaffold, driver, mode): scaffold is the coding-agent tool or `reference` "
    "for the scripted reference agents, driver the driver LLM (blank for reference agents), mode the "
    "operating mode (free, sft-only, rl-only, ...)."
)
MULTI_CONFIG_NOTE = (
    "multi (the column): the tasks of a multi-task run (one agent run, one workspace, one base model and one budget "
    "for several tasks), sorted and joined by +; each of its tasks is a row of its own (mode multi, or "
    "multi/<mode> for an agent with its own mode), and two multi-task runs over different tasks are two "
    "configurations. Blank: a single-task run."
)


MULTI_COUNT_NOTE = (
    "A multi-task run counts as a run of each of its tasks (its result there: the best submission on that task "
    "within the run)."
)


def _config_notes(summaries: list[dict]) -> list[str]:
    return [CONFIG_NOTE, *([MULTI_CONFIG_NOTE] if _has_multi(summaries) else [])]

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
        baseline_row = {"model": model, "agent": "baseline", "scaffold": None, "driver": None, "mode": None,
                        "multi": None, "n": None}
        baseline_row.update({task: _baseline_score(summaries, task, model) for task in tasks})
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
        *_config_notes(summaries),
        "Each task column: the mean over seeds of the runs' best score (final evaluation of the best submission); "
        "the baseline row holds the base model's score.",
        "n: seeds per cell with a known best score (a range when the tasks differ).",
        "Blank: no run of that configuration on that task, or no evaluated submission.",
        "Metrics per task:",
        *[f"  {note}" for note in _metric_notes(summaries, tasks)],
    ]
    return Table(
        [*_config_columns(summaries), *tasks, "n"],
        rows,
        notes,
    )


def _baseline_score(summaries: list[dict], task: str, model: str) -> float | None:
    """The base model's score on a task: the mean of the baselines its runs recorded (they normally agree)."""
    return mean([
        b
        for s in summaries
        if run_label(s, "task") == task and run_label(s, "model") == model
        for b in [number(s.get("baseline"))]
        if b is not None
    ])


def _ablation_order(key: tuple[str, str, str, str, str]) -> tuple:
    """The mode ablation's row order within a base model: by scaffold and driver, then the mode (mode_rank:
    free, sft-only, rl-only, multi, multi/<mode>, others), the multi-task run's tasks, the agent."""
    agent, scaffold, driver, mode, multi = key
    return (scaffold, driver, mode_rank(mode), multi, agent)


def mode_ablation(summaries: list[dict]) -> Table:
    """The paper's Table 3 layout (mode ablation): per base model a baseline row, then one row per configuration,
    the modes of one scaffold and driver together in the order free, sft-only, rl-only, multi, multi/<mode>; per
    task the mean best score over seeds, the mean Δ over the row's own tasks and the seeds per cell."""
    tasks = _tasks(summaries)
    by_row: dict = defaultdict(dict)
    for (key, task, model), runs in group_runs(summaries).items():
        by_row[(model, key)][task] = runs
    multi = _has_multi(summaries)
    rows = []
    for model in sorted({model for model, _ in by_row}):
        baseline_row = {"mode": None, "model": model, "agent": "baseline", "scaffold": None, "driver": None,
                        "multi": None, "mean_delta": None, "n": None}
        baseline_row.update({task: _baseline_score(summaries, task, model) for task in tasks})
        rows.append(baseline_row)
        for key in sorted((k for m, k in by_row if m == model), key=_ablation_order):
            cells = by_row[(model, key)]
            row, counts, task_deltas = _config_cells(key, model), [], []
            for task in tasks:
                runs = cells.get(task, [])
                best = [b for b in (number(s.get("best")) for s in runs) if b is not None]
                row[task] = mean(best)
                counts.append(len(best))
                if runs:  # the row's own tasks (a multi-task run's: its tasks), the ones its mean_delta is over
                    task_deltas.append(mean([d for d in (run_delta(s) for s in runs) if d is not None]))
            known = [d for d in task_deltas if d is not None]
            row["mean_delta"] = mean(known) if known and len(known) == len(task_deltas) else None
            row["n"] = _n_label(counts)
            rows.append(row)
    notes = [
        "Rows: per base model the baseline row (the base model's score), then one row per configuration; the "
        "configurations of one scaffold and driver sit together, their modes in the order free, sft-only, rl-only, "
        "multi, multi/<mode>, then any other.",
        *_config_notes(summaries),
        "multi (the mode): one agent run with one workspace, one base model and one budget for several tasks at once; "
        "per task its score is the best submission on that task within the run, re-evaluated at the end on the "
        "held-out split as a single-task run's best is. multi/<mode>: the same with an agent that has its own mode "
        "(multi/sft-only: SFT only, on every task of the run).",
        "The multi arrangement is this benchmark's own design: the paper lists a multi mode but does not publish "
        "how its multi runs were set up or scored, so the multi rows are not a reproduction of the paper's numbers.",
        "Each task column: the mean over seeds of the runs' best score (final evaluation of the best submission, "
        "the task's primary metric); the baseline row holds the base model's score.",
        DELTA_NOTE,
        "mean_delta: the mean, over the row's own tasks (those it has runs on: a multi-task run's are its tasks), of "
        "the row's mean Δ over seeds (a multi-task run's headline); blank when one of them has no known Δ (nothing "
        "evaluated). Rows over different tasks are means over different tasks: compare them task by task.",
        "n: seeds per cell with a known best score (a range when the tasks differ).",
        "Blank task cell: no run of that configuration on that task, or no evaluated submission.",
        "Metrics per task:",
        *[f"  {note}" for note in _metric_notes(summaries, tasks)],
    ]
    columns = ["mode", "model", "agent", "scaffold", "driver", *([MULTI_COLUMN] if multi else []), *tasks, "mean_delta", "n"]
    return Table(columns, rows, notes)


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
        *_config_notes(summaries),
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
        [*_config_columns(summaries), "task", "n", "mean_delta", "ci_low", "ci_high", "noise_band", "within_noise"],
        rows,
        notes,
        display_columns=[*_config_columns(summaries), *tasks, "n"],
        display_rows=display_rows,
    )


# The Δ family of runs graded with a final split (config scoring.feedback: split; summary.json, from
# evaluation.evaluate.delta_family): the selection_gap table's columns, each with its noise band.
SELECTION_COLUMNS = ("feedback_delta", "clean_delta", "oracle_delta", "selection_gap")


def _largest(values: list) -> float | None:
    found = [v for v in (number(x) for x in values) if v is not None]
    return max(found) if found else None


def selection_gap(summaries: list[dict], settings: dict) -> Table:
    """Per (configuration, task, model), over the runs graded with a final split: the mean of each Δ of the
    family (feedback Δ, clean Δ, oracle Δ, selection gap) and its noise band (the largest its runs recorded).
    Runs in full mode (the reference's) have no final split and are left out."""
    decimals = int(settings["decimals"])
    rows = []
    split = [s for s in summaries if s.get("feedback_mode") == "split"]
    for (key, task, model), runs in group_runs(split).items():
        row = {**_config_cells(key, model), "task": task}
        known = [s for s in runs if number(s.get("clean_delta")) is not None]
        row["n"] = len(known)
        for name in SELECTION_COLUMNS:
            row[f"mean_{name}"] = mean([v for v in (number(s.get(name)) for s in known) if v is not None])
            row[f"{name}_band"] = _largest([s.get(f"{name}_band") for s in known])
        row["gap_within_noise"] = _yes_no(within_noise(row["mean_selection_gap"], row["selection_gap_band"]))
        rows.append(row)
    notes = [
        *_config_notes(summaries),
        "Only runs graded with a final split (config scoring.feedback: split): a salted share of the held-out items "
        "is evaluated privately for every submission and never reported to the agent; /submit reports on the rest "
        "(the feedback split). Runs in full mode, the reference's, are left out.",
        "feedback_delta: the paper's Δ on the feedback split (the best submission by the scores the agent was told, "
        "re-evaluated, minus the base model's feedback-split score; the leaderboard's delta for these runs).",
        "clean_delta: the same submission's final-split score minus the base model's final-split score: Δ without "
        "selection on the scored items.",
        "oracle_delta: the best final-split score the grader recorded for any of the run's submissions minus the "
        "base model's final-split score (from the grader's records, not re-evaluated).",
        "selection_gap: feedback_delta - clean_delta, how much choosing the submission on the scores it was told "
        "inflated Δ; gap_within_noise: yes when |mean gap| <= its band.",
        "*_band: ± points, half the range of the base model's repeated evaluations on that split (0 for a "
        "deterministic grader); the gap's is the sum of the feedback and final bands.",
        "n: runs with a known clean Δ (a run with no evaluated submission has none and is left out); the means are "
        f"over those runs, in points, {decimals} decimals.",
    ]
    columns = [*_config_columns(summaries), "task", "n"]
    for name in SELECTION_COLUMNS:
        columns += [f"mean_{name}", f"{name}_band"]
    return Table([*columns, "gap_within_noise"], rows, notes)


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
        *_config_notes(summaries),
        DELTA_NOTE,
        "runs: runs of the cell (seeds); " + N_NOTE,
        "mean_delta, std_delta (sample standard deviation, blank when n < 2), max_delta: over the runs with a known Δ.",
        "improve_sr: % of runs with Δ > 0 (a run without Δ counts as no improvement); "
        "exec_sr: % of runs with at least one evaluated submission of trained weights scoring > 0 "
        "(a valid train -> submit cycle), blank when a run predates this field.",
        "ci_low / ci_high: bootstrap CI of the mean Δ (blank when n < 2); noise_band / within_noise: as in delta_matrix.",
    ]
    return Table(
        [*_config_columns(summaries), "task", "runs", "n", "mean_delta", "std_delta", "max_delta", "improve_sr", "exec_sr",
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
        *_config_notes(summaries),
        "fraction: the cut as a fraction of each run's budget (the paper: 6 / 12 / 24 h of a 24 h run); "
        "cut_hours: fraction x the cell's mean budget, in hours.",
        "mean_delta: mean over runs of Δ at the cut = best score among the submissions evaluated before the cut minus "
        "the baseline (0 when none came before it: the base model stands).",
        "n: runs whose Δ at the cut is known (it is not for runs recorded without a submission timeline or budget); "
        "blank mean_delta when n is 0; ci_low / ci_high: bootstrap CI of the mean (blank when n < 2).",
    ]
    return Table(
        [*_config_columns(summaries), "task", "fraction", "cut_hours", "n", "mean_delta", "ci_low", "ci_high"],
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
        *_config_notes(summaries),
        "pass_at_k: the expected best Δ over k runs drawn without replacement from the cell's n runs "
        "(unbiased: Δ sorted ascending x_1..x_n, sum over i >= k of C(i-1, k-1) / C(n, k) x_i); pass_at_1 is the mean Δ.",
        N_NOTE + " Blank pass_at_k when n < k.",
    ]
    return Table(
        [*_config_columns(summaries), "task", "n", *[f"pass_at_{k}" for k in ks]],
        rows,
        notes,
    )


def _run_order(summary: dict) -> tuple:
    return (run_label(summary, "task"), run_label(summary, "model"), config_key(summary), seed_order(run_label(summary, "seed")))


def _int(value) -> int | None:
    return None if isinstance(value, bool) or not isinstance(value, int) else value


def _run_cells(summary: dict, multi: bool) -> dict:
    """A per-run row's first cells: task, model, agent, seed, and multi (the run's group) when the sweep has
    multi-task runs."""
    cells = {name: run_label(summary, name) for name in ("task", "model", "agent", "seed")}
    if multi:
        cells[MULTI_COLUMN] = run_multi(summary) or None
    return cells


def workspace_stats(summaries: list[dict]) -> Table:
    """Per run: submissions, code files, model versions, zero-score %, index of the best submission, strategies.
    A multi-task run has a row per task (its view of the run)."""
    rows = []
    multi = _has_multi(summaries)
    for s in sorted(summaries, key=_run_order):
        share = number(s.get("zero_score_share"))
        routes = s.get("routes_used")
        rows.append(
            {
                **_run_cells(s, multi),
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
    if multi:
        notes.append(
            "multi: the tasks of a multi-task run (blank for a single-task run); such a run has a row per task, its "
            "view of the run: the submissions evaluated on that task, their scores and routes; code_files and "
            "model_versions are the one shared workspace's, the same in each of its rows."
        )
    return Table(
        ["task", "model", "agent", "seed", *([MULTI_COLUMN] if multi else []), "submissions", "code_files",
         "model_versions", "zero_score_pct", "best_index", "strategies", "route", "failure_type"],
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
        *([MULTI_COUNT_NOTE] if _has_multi(summaries) else []),
    ]
    return Table(
        ["task", "model", "runs", *ROUTE_LABELS, "coding_sr", "improve_sr"],
        rows,
        notes,
    )


TOKEN_FIELDS = ("calls", "input_tokens", "output_tokens", "total_tokens")
GPU_HOUR_FIELDS = ("gpu_hours_busy", "gpu_hours_idle")  # summary.json's (summaries.summary.run_overview)


def _one_per_run(summaries: list[dict]) -> list[dict]:
    """The summaries with one member per multi-task run (the first of its tasks), in run order with a multi-task
    run's tasks (its group) in place of its task: the members of a run share its LLM gateway, so each carries the
    whole run's usage."""
    seen, kept = set(), []
    for s in sorted(summaries, key=_run_order):
        if run_multi(s):
            run = (run_label(s, "model"), run_label(s, "seed"), config_key(s))
            if run in seen:
                continue
            seen.add(run)
        kept.append(s)
    return sorted(kept, key=lambda s: (run_multi(s) or run_label(s, "task"), *_run_order(s)[1:]))


def tokens_cost(summaries: list[dict], decimals: int) -> Table:
    """Per run: LLM calls, tokens and cost from the run's gateway (blank for reference agents) and the GPU-hours its
    GPUs were busy and idle (blank without a GPU trace); a multi-task run once (its task cell is the run's tasks),
    not once per task."""
    rows = []
    multi = _has_multi(summaries)
    for s in _one_per_run(summaries):
        tokens = as_dict(s.get("tokens"))
        cost = number(s.get("cost_usd"))
        if cost is None:
            cost = number(tokens.get("cost_usd"))
        cells = _run_cells(s, multi)
        if run_multi(s):
            cells["task"] = run_multi(s)
        rows.append(
            {
                **cells,
                "scaffold": str(s.get("scaffold") or "reference"),
                "driver": s.get("driver") or None,
                **{name: _int(tokens.get(name)) for name in TOKEN_FIELDS},
                "cost_usd": cost,
                **{name: number(s.get(name)) for name in GPU_HOUR_FIELDS},
            }
        )
    cost_decimals = max(decimals, 4)
    hour_decimals = max(decimals, 3)
    notes = [
        "One row per run: the LLM gateway's usage (calls, input / output / total tokens) and cost in USD "
        f"(rounded to {cost_decimals} decimals).",
        "Blank: no LLM usage recorded (scripted reference agents, or a gateway that did not report it).",
        "gpu_hours_busy / gpu_hours_idle: hours of the run's GPUs, summed over them, in which the resource trace "
        f"(nvidia-smi) saw each GPU's utilisation above {GPU_BUSY_ABOVE_PERCENT} % (busy) or not (idle), rounded to "
        f"{hour_decimals} decimals; blank where the run had no GPU trace (no nvidia-smi, e.g. a CPU-only run).",
    ]
    if multi:
        notes.append(
            "multi: the tasks of a multi-task run (blank for a single-task run). A multi-task run is one row, its task "
            "cell the run's tasks: its tasks share one gateway, so its usage is counted once."
        )
    return Table(
        ["task", "model", "agent", "seed", *([MULTI_COLUMN] if multi else []), "scaffold", "driver", *TOKEN_FIELDS,
         "cost_usd", *GPU_HOUR_FIELDS],
        rows,
        notes,
        column_decimals={"cost_usd": cost_decimals, **{name: hour_decimals for name in GPU_HOUR_FIELDS}},
    )


def failures(summaries: list[dict]) -> Table:
    """Per task and model: runs per failure type, and per interactive (L3) failure type."""
    cells: dict = defaultdict(list)
    for s in summaries:
        cells[(run_label(s, "task"), run_label(s, "model"))].append(s)
    seen = {str(s.get("failure_type")) for s in summaries if s.get("failure_type")}
    seen_interactive = {
        str(as_dict(s.get("interactive_failure")).get("type"))
        for s in summaries
        if as_dict(s.get("interactive_failure")).get("type")
    }
    failure_columns = [*FAILURE_TYPES, *sorted(seen - set(FAILURE_TYPES))]
    interactive_columns = [*INTERACTIVE_FAILURE_TYPES, *sorted(seen_interactive - set(INTERACTIVE_FAILURE_TYPES))]
    rows = []
    for (task, model), runs in sorted(cells.items()):
        kinds = Counter(str(s.get("failure_type")) for s in runs if s.get("failure_type"))
        interactive = Counter(
            str(as_dict(s.get("interactive_failure")).get("type"))
            for s in runs
            if as_dict(s.get("interactive_failure")).get("type")
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
        *([MULTI_COUNT_NOTE] if _has_multi(summaries) else []),
    ]
    return Table(
        ["task", "model", "runs", "no_failure", *failure_columns, *interactive_columns],
        rows,
        notes,
    )
