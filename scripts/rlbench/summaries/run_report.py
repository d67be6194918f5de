"""A run's reports/ directory, as the reference harness writes it beside its summaries.

* reports/metrics.json (`write_metrics_json`): the paper's ten process metrics (summary.json
  "metrics", the reference's compute_metrics output) under their own names, then the run's labels
  (task, model, agent, seed) and its baseline, best, delta, submissions, route and failure type.
* reports/figures/score_trajectory.png and .svg (`plot_score_trajectory`): the score of every
  recorded submission against the time since the run started (minutes, or hours past two hours;
  the submission index when a time is missing), the baseline dashed, failed submissions marked
  with a cross at 0, the best one circled. Byte-identical reruns: no dates or software versions in
  the files, fixed SVG ids.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from rlbench.fileio.jsonio import write_json  # noqa: E402
from rlbench.summaries.formatting import run_title  # noqa: E402

#: Past this many seconds the time axis is in hours, below it in minutes.
HOURS_FROM_S = 2 * 3600
DPI = 120
STYLE = {"svg.hashsalt": "rlbench", "svg.fonttype": "none", "font.size": 10}
#: The fields of reports/metrics.json beside the ten metrics, from summary.json.
RUN_FIELDS = ("level", "baseline", "best", "delta", "submissions", "route", "failure_type")


def metrics_record(summary: dict) -> dict:
    """reports/metrics.json's content: the ten metrics, then labels and the run's scores
    (write_json sorts the keys on disk)."""
    labels = summary.get("labels") or {}
    record = dict(summary["metrics"])
    record.update({key: labels.get(key) for key in ("task", "model", "agent", "seed")})
    record.update({key: summary.get(key) for key in RUN_FIELDS})
    return record


def write_metrics_json(path: Path, summary: dict) -> dict:
    """Write reports/metrics.json (metrics_record) and return what was written."""
    record = metrics_record(summary)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(path), record)
    return record


def trajectory_axis(timeline: list[dict]) -> tuple[list[float], str]:
    """The x values of the timeline's points and the axis label: time since start in minutes (or
    hours past HOURS_FROM_S) when every point has since_start_s, else the submission index."""
    times = [point.get("since_start_s") for point in timeline]
    if timeline and all(isinstance(t, (int, float)) for t in times):
        if max(times) > HOURS_FROM_S:
            return [t / 3600 for t in times], "time since start (hours)"
        return [t / 60 for t in times], "time since start (minutes)"
    return [float(point["iteration"]) for point in timeline], "submission (index)"


def plot_score_trajectory(summary: dict, png: Path, svg: Path) -> None:
    """Draw the run's score trajectory (summary.json "timeline") to png and svg."""
    timeline = summary.get("timeline") or []
    baseline = summary.get("baseline")
    metric = summary.get("primary_metric")
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7, 4))
        x, xlabel = trajectory_axis(timeline)
        if timeline:
            scores = [point["score"] for point in timeline]
            ax.plot(x, scores, color="tab:blue", marker="o", markersize=4, linewidth=1.2, label="submission score")
            failed = [(xi, s) for xi, s, point in zip(x, scores, timeline) if not point["scored"]]
            if failed:
                ax.scatter(
                    [f[0] for f in failed],
                    [f[1] for f in failed],
                    marker="x",
                    color="tab:red",
                    s=50,
                    zorder=3,
                    label="not evaluated (scored 0)",
                )
            best = summary.get("best_index")
            if best is not None and 1 <= best <= len(timeline):
                ax.scatter(
                    [x[best - 1]],
                    [scores[best - 1]],
                    s=140,
                    facecolors="none",
                    edgecolors="tab:green",
                    linewidths=1.8,
                    zorder=4,
                    label=f"best (submission {best})",
                )
        else:
            ax.text(0.5, 0.5, "no submissions", transform=ax.transAxes, ha="center", va="center", fontsize=14)
            ax.set_xticks([])
        if baseline is not None:
            ax.axhline(baseline, color="gray", linestyle="--", linewidth=1, label=f"baseline ({baseline:.4g})")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"score ({metric})" if metric else "score")
        ax.set_title(run_title(summary.get("labels") or {}))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        for path in (png, svg):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=DPI, format="png", metadata={"Software": None})
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
