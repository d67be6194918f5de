"""The definitions the tables and the figures share, and the paper's statistics, over the runs' summary.json dicts.

* a configuration is (agent, scaffold, driver, mode, multi) (`config_key`): multi is the group of a
  multi-task run's member summaries (its tasks sorted, joined by +), "" for single-task runs; a cell is
  (configuration, task, model) over its seeds (`group_runs`);
* the Δ of a run is summary["delta"] (final evaluation of the best submission minus the baseline);
* `delta_at_cut`: Δ when the run is cut at a fraction of its budget;
* `pass_at_k`: expected best Δ over k seeds drawn without replacement (unbiased estimator);
* `bootstrap_ci`: percentile bootstrap CI of the mean Δ over seeds;
* `within_noise`: |Δ| <= the task's grader-noise band;
* `signed`: a Δ as the Markdown tables and the figures write it.

The tables (rlbench.analysis.tables) and the figures (rlbench.analysis.figures) both import them from here,
so that a figure always shows the numbers of its table.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

# |Δ| <= band is tested with this absolute slack, so that a Δ computed as best - baseline in floating
# point (0.30000000000000004) is not pushed out of a band it sits on (0.3).
NOISE_TOLERANCE = 1e-9


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


def as_dict(value) -> dict:
    """value when it is a dict, else {} (a summary field of another type reads as empty)."""
    return value if isinstance(value, dict) else {}


#: Metric keys that name which variant of a task's protocol a score was measured with (the reference's
#: or one of ours): WebShop's goal set, DeepSearchQA's prompt and judge prompt, AlpacaEval's annotator and
#: length-controlled method, the judge's model, the search provider.
PROTOCOL_LABELS = ("goals", "prompt", "judge_prompt", "annotator", "judge_model", "lc_method", "search_provider")


def protocol_labels(summary: dict) -> dict:
    """The protocol variant a run's scores are in: its evaluation's PROTOCOL_LABELS (the final
    evaluation's, else the baseline's) and `decoding: sampled` when the model was sampled."""
    labels = {}
    for part in ("eval_metrics", "baseline_metrics"):
        metrics = as_dict(summary.get(part))
        for key in PROTOCOL_LABELS:
            if isinstance(metrics.get(key), str) and key not in labels:
                labels[key] = metrics[key]
    decoding = as_dict(summary.get("decoding"))
    if float(decoding.get("temperature") or 0) > 0:
        labels["decoding"] = "sampled"
    return labels


def protocol_text(summary: dict) -> str:
    """protocol_labels as "key=value; ..." (blank: the task has no variants)."""
    return "; ".join(f"{k}={v}" for k, v in protocol_labels(summary).items())


FLAG_POLICIES = ("keep", "baseline", "drop")


def is_flagged(summary: dict) -> bool:
    """Whether the run's audit flagged it (summary.json `integrity`, from integrity.json)."""
    return as_dict(summary.get("integrity")).get("status") == "flagged"


def integrity_text(summary: dict) -> str:
    """The leaderboard's integrity cell: "clean", "flagged: <reasons>", "incomplete: ...", blank when the
    run was summarized before the audit existed."""
    integrity = as_dict(summary.get("integrity"))
    return str(integrity.get("label") or integrity.get("status") or "")


def apply_flag_policy(summaries: list[dict], policy: str) -> tuple[list[dict], list[str]]:
    """The summaries the paper tables use under config report.flagged, and the note that says so:
    keep (as they are), baseline (a flagged run scored as the base model: best = baseline, delta 0, as
    PostTrainBench scores them) or drop (left out)."""
    if policy not in FLAG_POLICIES:
        raise ValueError(f"report.flagged {policy!r}: allowed {', '.join(FLAG_POLICIES)}")
    flagged = [s for s in summaries if is_flagged(s)]
    if not flagged:
        return summaries, []
    names = ", ".join(run_name(s) for s in flagged)
    if policy == "drop":
        kept = [s for s in summaries if not is_flagged(s)]
        return kept, [f"Integrity: {len(flagged)} flagged run(s) left out (report.flagged: drop): {names}."]
    if policy == "baseline":
        rescored = [
            {**s, "best": s.get("baseline"), "delta": 0.0 if s.get("baseline") is not None else None} if is_flagged(s) else s
            for s in summaries
        ]
        return rescored, [f"Integrity: {len(flagged)} flagged run(s) scored as the base model (report.flagged: baseline): {names}."]
    return summaries, [f"Integrity: {len(flagged)} flagged run(s) kept as scored (report.flagged: keep; see the leaderboard's integrity column): {names}."]


def seed_order(seed: str) -> tuple:
    """Numeric seeds in numeric order, then any other seed label in text order."""
    return (0, int(seed), "") if str(seed).lstrip("-").isdigit() else (1, 0, str(seed))


def run_multi(summary: dict) -> str:
    """The multi-task run a summary is a member of: its `multi` label, the run's tasks sorted and joined by +
    (e.g. "alfworld+alpaca-eval+gsm8k"); "" for a single-task run."""
    return run_label(summary, "multi")


def run_name(summary: dict) -> str:
    """A run as task/model/agent/seed, with "(multi <group>)" for a member of a multi-task run."""
    name = "/".join(run_label(summary, k) or "?" for k in ("task", "model", "agent", "seed"))
    return f"{name} (multi {run_multi(summary)})" if run_multi(summary) else name


def config_key(summary: dict) -> tuple[str, str, str, str, str]:
    """The configuration of a run: (agent, scaffold, driver or "", mode or "free", multi). Reference agents
    have scaffold "reference" and no driver; multi is run_multi (the member summaries of a multi-task run
    have mode multi or multi/<the agent's mode>, and their group, so that two multi-task runs over different
    tasks are two configurations and a cell never holds one seed twice), "" for single-task runs."""
    return (
        run_label(summary, "agent"),
        str(summary.get("scaffold") or "reference"),
        str(summary.get("driver") or ""),
        str(summary.get("mode") or "free"),
        run_multi(summary),
    )


def config_label(key: tuple[str, ...]) -> str:
    """A short readable name of a configuration (config_key; its first four parts alone name a single-task
    one): "sft (reference, free)", "claude-sonnet (claude-code / claude-sonnet-4, free)",
    "copy (reference, multi: alfworld+gsm8k)"."""
    agent, scaffold, driver, mode = key[:4]
    multi = key[4] if len(key) > 4 else ""
    tool = f"{scaffold} / {driver}" if driver else scaffold
    return f"{agent} ({tool}, {mode}: {multi})" if multi else f"{agent} ({tool}, {mode})"


# The operating modes in the order the mode ablation lists them: the single-task modes, then the multi-task
# runs (multi: an agent in free mode; multi/<mode>: an agent with its own mode), then any other mode.
MODE_ORDER = ("free", "sft-only", "rl-only")
MULTI_MODE = "multi"


def mode_rank(mode: str) -> tuple:
    """Sort key of an operating mode: free, sft-only, rl-only, multi, multi/free, multi/sft-only, multi/rl-only,
    other multi/<mode> by name, then any other mode by name."""
    mode = str(mode or "free")
    if mode in MODE_ORDER:
        return (0, MODE_ORDER.index(mode), "")
    if mode == MULTI_MODE:
        return (1, 0, "")
    if mode.startswith(f"{MULTI_MODE}/"):
        inner = mode[len(MULTI_MODE) + 1:]
        return (2, MODE_ORDER.index(inner), "") if inner in MODE_ORDER else (2, len(MODE_ORDER), inner)
    return (3, 0, mode)


def group_runs(summaries: list[dict]) -> dict[tuple[tuple[str, str, str, str, str], str, str], list[dict]]:
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
        budget = number(as_dict(summary.get("run_meta")).get("timeout_s"))
    return budget if budget is not None and budget > 0 else None


def noise_band(summary: dict) -> float | None:
    """The task's grader-noise band (± points) recorded with the run; None when unknown."""
    return number(as_dict(summary.get("grader_noise")).get("band"))


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


def signed(value: float, decimals: int) -> str:
    """A Δ with its sign and `decimals` decimals, as the Δ matrix's Markdown and the Δ heatmap write it."""
    text = f"{value:+.{decimals}f}"
    return text.replace("-", "+", 1) if float(text) == 0 else text  # no "-0.00"

