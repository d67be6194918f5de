"""A run's integrity verdict (integrity.json, written by the audit_run rule) from its checks: the
contamination scan (`contamination.scan_run`), the best submission's weight lineage
(`lineage.compare_models`) and the optional trace judge (`trace_judge.judge_trace`).

The verdict's `status`:

- `clean`: every check that ran found nothing;
- `flagged`: a check found something; `reasons` says what, one line each (held-out items in the
  agent's files or its driver's output, a best submission unrelated to the base model, a judge's
  flagged verdict);
- `incomplete`: nothing was found, but a check could not run or failed (a judge that failed is never
  read as clean).

`split_notes`: held-out items the benchmark's own training split holds (the scan checks the split
too): a property of the task's split that every run shares, reported, not held against the run.

`label` is what the leaderboard's and the summaries' `integrity` column shows: "clean", or the
status and its reasons ("flagged: contamination (5 held-out items: code revision 3 data/train.jsonl,
...)"). How flagged runs enter the paper tables is the report's choice (`report.flagged`), not the
verdict's.
"""

from __future__ import annotations

CLEAN, FLAGGED, INCOMPLETE = "clean", "flagged", "incomplete"
VERSION = 1
#: lineage verdicts (lineage.compare_models' `verdict`)
UNRELATED, UNDETERMINED = "unrelated", "undetermined"
#: where a contamination match was found, as a reason shows it (first few only)
REASON_PLACES = 3


def _place(match: dict) -> str:
    where = match.get("where") if isinstance(match.get("where"), dict) else match
    kind = str(where.get("kind") or "")
    if kind == "transcript":
        return f"transcript turn {where.get('turn')}"
    parts = [str(p) for p in (str(where.get("revision") or "")[:10], where.get("path")) if p]
    return " ".join(([kind.replace("_", " ")] if kind else []) + parts) or "?"


def contamination_reason(report: dict | None) -> str | None:
    flagged = (report or {}).get("flagged") or []
    if not flagged:
        return None
    items = sorted({str(m.get("item")) for m in flagged})
    places = []
    for match in flagged:
        place = _place(match)
        if place not in places:
            places.append(place)
    shown = ", ".join(places[:REASON_PLACES]) + (", ..." if len(places) > REASON_PLACES else "")
    return f"contamination ({len(items)} held-out item{'s' if len(items) != 1 else ''}: {shown})"


def lineage_reason(report: dict | None) -> str | None:
    if report and report.get("verdict") == UNRELATED:
        why = report.get("reason") or report.get("why")
        return "lineage: the best submission is unrelated to the base model" + (f" ({why})" if why else "")
    return None


def judge_reasons(report: dict | None) -> list[str]:
    """One reason per flagged kind; a flag whose cited evidence is not in the trace says so."""
    reasons = []
    for verdict in (report or {}).get("verdicts") or []:
        if isinstance(verdict, dict) and verdict.get("flagged"):
            unsupported = verdict.get("supported") is False
            reasons.append(f"trace judge: {verdict.get('kind')}" + (" (evidence not found in the trace)" if unsupported else ""))
    return reasons


def run_integrity(contamination: dict | None, lineage: dict | None, judge: dict | None, *, problems=()) -> dict:
    """integrity.json's content from the checks' reports (None: the check did not run); `problems`:
    why a check could not run (a missing best submission is not one: lineage is then None)."""
    # A held-out item the training split itself holds reaches the agent's files from the benchmark's data:
    # the split's fault (noted below), not the agent's.
    found = (contamination or {}).get("flagged") or []
    own = {**(contamination or {}), "flagged": [m for m in found if not m.get("in_training_split")]}
    reasons = [r for r in (contamination_reason(own), lineage_reason(lineage)) if r]
    # The benchmark's own training split checked against the held-out items: a property of the split, not
    # of the run (every run of the task shares it), so it is a note, not a flag.
    split = contamination_reason((contamination or {}).get("training_split"))
    notes = ["the training split itself holds " + split.split("(", 1)[1].rstrip(")")] if split else []
    reasons += judge_reasons(judge)
    incomplete = list(problems)
    if contamination is None:
        incomplete.append("the contamination scan did not run")
    if lineage and lineage.get("verdict") == UNDETERMINED:
        incomplete.append(f"lineage undetermined ({lineage.get('reason')})")
    failures = int((judge or {}).get("judge_failed") or 0)
    if failures:
        incomplete.append(f"the trace judge failed {failures} time{'s' if failures != 1 else ''}")
    status = FLAGGED if reasons else INCOMPLETE if incomplete else CLEAN
    label = status if status == CLEAN else f"{status}: " + "; ".join(reasons or incomplete)
    return {
        "version": VERSION,
        "status": status,
        "label": label,
        "reasons": reasons,
        "incomplete": incomplete,
        "split_notes": notes,
        "contamination": contamination,
        "lineage": lineage,
        "trace_judge": judge,
    }
