"""The run explorer's data: one JSON document (the schema is the package's docstring) read from a run
directory's own records, whatever the run left behind.

Read: run.json, workspace.json, final.json, summary.json and summary.jsonl, integrity.json,
grader/ledger.jsonl, grader/code.git (the code diff of each submission against the previous one with
a recorded revision), grader/snapshots/NNNN/checkpoint.json, resources.jsonl, and the agent's turns
(explorer.turns). Nothing is required: what a run does not have is named in `missing`, and a file
that cannot be read counts as missing. The run directory is partly the agent's (its code, its
log): every value is data for the page, never markup (explorer.render escapes it).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlbench.fileio.jsonio import read_jsonl
from rlbench.recording.repository import CODE_GIT, CodeRepository, RecordingError
from rlbench.recording.trace import read_trace
from rlbench.summaries.formatting import run_title
from rlbench.summaries.summary import integrity_summary
from rlbench.explorer.turns import run_turns, tool_names

SCHEMA = 1
#: A submission's diff is cut after this many characters (a last line says how many were left out).
DIFF_MAX_CHARS = 200_000
#: The resource trace is thinned to at most this many points (the largest value of each bucket kept).
RESOURCE_POINTS = 3000
#: summary.json's run-level fields the page shows.
SUMMARY_FIELDS = (
    "best", "delta", "baseline", "baseline_choice", "primary_metric", "route", "failure_type", "feedback_mode",
    "clean_delta", "oracle_delta", "selection_gap", "submissions", "valid_submissions", "metrics", "coding_success",
    "improvement_success", "interactive_failure", "grader_noise",
)  # fmt: skip
#: summary.jsonl's fields the page's iteration table shows.
ITERATION_FIELDS = (
    "iteration", "task", "timestamp", "since_start_s", "duration_s", "status", "grader_status", "score",
    "improvement", "best_so_far", "train_type", "failure_type", "what_was_done", "why",
)  # fmt: skip
#: A ledger entry's fields a submission shows as they are.
ENTRY_FIELDS = ("status", "reason", "error", "score", "improvement", "model_path", "code_revision", "task")


def _json(path: Path):
    """The JSON value in a regular file, else None (missing, unreadable, not JSON, a link)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return None


def _object(path: Path) -> dict | None:
    value = _json(path)
    return value if isinstance(value, dict) else None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _since(ts, start: float | None) -> float | None:
    ts = _number(ts)
    return None if ts is None or start is None else round(ts - start, 3)


def run_header(run: dict, manifest: dict, summary: dict | None) -> dict:
    """The page's `run`: who and what ran, how it ended, the budget and the LLM's totals."""
    llm = run.get("llm") if isinstance(run.get("llm"), dict) else {}
    start, end = _number(run.get("start_time")), _number(run.get("end_time"))
    return {
        "labels": run.get("labels") if isinstance(run.get("labels"), dict) else {},
        "status": run.get("status"),
        "exit_code": run.get("exit_code"),
        "timed_out": run.get("timed_out"),
        "error": run.get("error"),
        "stopped_by": run.get("stopped_by"),
        "start_time": start,
        "end_time": end,
        "budget_s": _number(run.get("time_limit_s")),
        "duration_s": _number(run.get("duration_s")) or (end - start if start is not None and end is not None else None),
        "mode": (summary or {}).get("mode") or manifest.get("mode"),
        "scaffold": (summary or {}).get("scaffold") or ((llm.get("agent_tool") or {}).get("name")) or "reference",
        "driver": (summary or {}).get("driver") or (llm.get("driver") or {}).get("model"),
        "tokens": llm.get("tokens") if isinstance(llm.get("tokens"), dict) else None,
        "sandbox": run.get("sandbox"),
        "attempt": run.get("attempt"),
    }


def budget_cuts(header: dict) -> list[dict]:
    """Where the budget ends and what ended the run, on the time axis."""
    cuts = []
    if header["budget_s"] is not None:
        cuts.append({"t": header["budget_s"], "kind": "budget", "detail": f"budget {header['budget_s']:.0f} s"})
    if header["duration_s"] is not None:
        status = header["status"]
        stopped = header["stopped_by"] if isinstance(header["stopped_by"], dict) else {}
        if header["timed_out"] or status == "timeout":
            kind, detail = "timeout", "the budget ran out: the agent was killed"
        elif status == "stopped":
            kind, detail = "stopped", f"stopped: {stopped.get('detail') or stopped.get('kind') or header['error']}"
        elif status in ("interrupted", "error"):
            kind, detail = status, f"{status}: {header['error'] or ''}".rstrip(": ")
        else:
            kind, detail = "end", f"the agent ended ({status}, exit code {header['exit_code']})"
        cuts.append({"t": round(header["duration_s"], 3), "kind": kind, "detail": detail})
    return cuts


def _checkpoint(grader: Path, sid) -> dict | None:
    if not isinstance(sid, int) or isinstance(sid, bool):
        return None
    record = _object(grader / "snapshots" / f"{sid:04d}" / "checkpoint.json")
    if record is None:
        return None
    files = [
        {"name": f.get("name"), "size": f.get("size"), "sha256": f.get("sha256")}
        for f in record.get("files") or []
        if isinstance(f, dict)
    ]
    return {
        "fingerprint": record.get("fingerprint"),
        "method": record.get("method"),
        "files": files,
        "config": record.get("config") if isinstance(record.get("config"), dict) else None,
    }


def _cut(text: str) -> str:
    if len(text) <= DIFF_MAX_CHARS:
        return text
    return text[:DIFF_MAX_CHARS] + f"\n... ({len(text) - DIFF_MAX_CHARS} more characters of the diff not shown)"


def _metrics(entry: dict) -> dict | None:
    """The evaluation's numbers a ledger entry kept: its metrics, n and the primary metric's name; a
    multi-task entry's per-task scores."""
    metrics = dict(entry["metrics"]) if isinstance(entry.get("metrics"), dict) else {}
    for key in ("primary_metric", "n"):
        if entry.get(key) is not None:
            metrics[key] = entry[key]
    if isinstance(entry.get("tasks"), dict):
        for task, part in entry["tasks"].items():
            if isinstance(part, dict):
                metrics[f"{task}.score"] = part.get("score")
                metrics[f"{task}.improvement"] = part.get("improvement")
    return metrics or None


def submissions(run_dir: Path, start: float | None) -> tuple[list[dict], bool]:
    """Every recorded submission (the ledger's final entries, pending ones left out) with its code diff
    against the latest earlier submission that has a code revision, its code files, checkpoint and
    metrics; and whether the code repository was there."""
    grader = run_dir / "grader"
    ledger = grader / "ledger.jsonl"
    entries = [e for e in (read_jsonl(ledger) if ledger.is_file() else []) if isinstance(e, dict) and not e.get("pending")]
    repo = CodeRepository(grader / CODE_GIT)
    has_repo = repo.exists()
    out, previous = [], None  # previous: (submission id, revision)
    for entry in entries:
        sid = entry.get("submission_id")
        item = {"id": sid, "t": _since(entry.get("submitted_at"), start)}
        item.update({key: entry.get(key) for key in ENTRY_FIELDS})
        item.update(code_files=None, diff_against=None, diff=None)
        revision = entry.get("code_revision")
        if has_repo and isinstance(revision, str) and revision:
            try:
                item["code_files"] = [f["path"] for f in repo.files(revision)]
                item["diff"] = _cut(repo.diff(previous[1] if previous else None, revision))
                item["diff_against"] = previous[0] if previous else None
                previous = (sid, revision)
            except RecordingError as exc:
                item["diff"], item["code_files"] = None, None
                item["error"] = item["error"] or f"code revision unreadable: {exc}"
        item["checkpoint"] = _checkpoint(grader, sid)
        item["metrics"] = _metrics(entry)
        out.append(item)
    return out, has_repo


def _thin(times: list[float], columns: dict[str, list]) -> tuple[list[float], dict[str, list]]:
    """At most RESOURCE_POINTS points: consecutive samples grouped, each group's first time and the
    largest value of each column (peaks stay visible)."""
    if len(times) <= RESOURCE_POINTS:
        return times, columns
    size = -(-len(times) // RESOURCE_POINTS)
    thinned_t = [times[i] for i in range(0, len(times), size)]
    thinned = {}
    for name, values in columns.items():
        groups = [[v for v in values[i : i + size] if v is not None] for i in range(0, len(values), size)]
        thinned[name] = [max(g) if g else None for g in groups]
    return thinned_t, thinned


def resources(run_dir: Path, start: float | None) -> dict | None:
    """The resource trace as series on the time axis: CPU %, RSS, workspace bytes, and per GPU its
    utilisation and memory; None without a trace."""
    read = read_trace(run_dir / "resources.jsonl")
    if read is None or not read[0]:
        return None
    samples = read[0]
    origin = start if start is not None else samples[0]["ts"]
    times = [round(s["ts"] - origin, 3) for s in samples]
    columns = {name: [_number(s.get(name)) for s in samples] for name in ("cpu_percent", "rss_bytes", "workspace_bytes")}
    gpu_ids = sorted({str(g) for s in samples for g in (s.get("gpu_utilization_percent") or {})}, key=str)
    for gpu in gpu_ids:
        for key in ("gpu_utilization_percent", "gpu_memory_used_mib"):
            columns[f"{gpu}:{key}"] = [
                _number((s.get(key) or {}).get(gpu)) if isinstance(s.get(key), dict) else None for s in samples
            ]
    times, columns = _thin(times, columns)
    totals = {}
    for s in samples:
        if isinstance(s.get("gpu_memory_total_mib"), dict):
            totals.update({str(g): v for g, v in s["gpu_memory_total_mib"].items()})
    return {
        "t": times,
        "cpu_percent": columns["cpu_percent"],
        "rss_bytes": columns["rss_bytes"],
        "workspace_bytes": columns["workspace_bytes"],
        "gpus": {
            gpu: {
                "utilization_percent": columns[f"{gpu}:gpu_utilization_percent"],
                "memory_used_mib": columns[f"{gpu}:gpu_memory_used_mib"],
                "memory_total_mib": totals.get(gpu),
            }
            for gpu in gpu_ids
        },
        "unreadable_lines": read[1],
    }


def _iterations(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    try:
        records = [r for r in read_jsonl(path) if isinstance(r, dict)]
    except ValueError:
        return []
    return [{key: r.get(key) for key in ITERATION_FIELDS if key in r} for r in records]


def summary_part(run_dir: Path, summary: dict | None) -> dict | None:
    """The summary's run-level numbers and its iterations (summary.jsonl; a multi-task run: each task's,
    labelled with its task)."""
    if summary is None:
        return None
    part = {key: summary.get(key) for key in SUMMARY_FIELDS if key in summary}
    iterations = _iterations(run_dir / "summary.jsonl")
    members = run_dir / "tasks"
    if not iterations and members.is_dir():
        for member in sorted(p for p in members.iterdir() if p.is_dir()):
            iterations += [{**r, "task": member.name} for r in _iterations(member / "summary.jsonl")]
    part["iterations"] = iterations
    return part


def verdicts(run_dir: Path, summary: dict | None) -> dict:
    """The integrity audit's verdict (summary.json's, else integrity.json's) and the mode audit; a
    multi-task run's are its tasks' (`members`: task -> {integrity, mode_audit})."""
    integrity = (summary or {}).get("integrity")
    if integrity is None:
        integrity = integrity_summary(_object(run_dir / "integrity.json"))
    found = {"integrity": integrity, "mode_audit": (summary or {}).get("mode_audit")}
    members = run_dir / "tasks"
    if members.is_dir():
        found["members"] = {}
        for member in sorted(p for p in members.iterdir() if p.is_dir()):
            member_summary = _object(member / "summary.json") or {}
            found["members"][member.name] = {
                "integrity": member_summary.get("integrity") or integrity_summary(_object(member / "integrity.json")),
                "mode_audit": member_summary.get("mode_audit"),
            }
    return found


def page_data(run_dir: Path) -> dict:
    """The page's data for the run at run_dir (the package docstring's schema)."""
    run_dir = Path(run_dir)
    run = _object(run_dir / "run.json") or {}
    manifest = _object(run_dir / "workspace.json") or {}
    summary = _object(run_dir / "summary.json")
    final = _object(run_dir / "final.json")
    header = run_header(run, manifest, summary)
    start = header["start_time"]
    turns = run_turns(run_dir, start)
    items, has_repo = submissions(run_dir, start)
    missing = [name for name in ("run.json", "grader/ledger.jsonl", "resources.jsonl") if not (run_dir / name).is_file()]
    if not has_repo:
        missing.append(f"grader/{CODE_GIT}")
    if run.get("agent_kind") == "cli" and not (run_dir / "gateway" / "transcript.jsonl").is_file():
        missing.append("gateway/transcript.jsonl")
    if run.get("agent_kind", "script") != "cli" and not (run_dir / "workspace" / "agent.log").is_file():
        missing.append("workspace/agent.log")
    # A multi-task run's final evaluations and audits are its tasks' (tasks/<task>/).
    own = ("summary.json",) if run.get("tasks") else ("final.json", "summary.json", "integrity.json")
    missing += [name for name in own if not (run_dir / name).is_file()]
    return {
        "schema": SCHEMA,
        "title": run_title(header["labels"]),
        "run": header,
        "cuts": budget_cuts(header),
        "final": None if final is None else {
            key: final.get(key) for key in ("score", "baseline_score", "delta", "primary_metric", "metrics")
        },
        "summary": summary_part(run_dir, summary),
        "verdicts": verdicts(run_dir, summary),
        "turns": turns,
        "tools": tool_names(turns),
        "submissions": items,
        "resources": resources(run_dir, start),
        "missing": missing,
    }
