"""Live grading-server helpers: the ledger's consistency, the evaluation processes, waiting."""

from __future__ import annotations

import json
import time

import psutil
import requests

from rlbench.recording.ledger import reference_view


def strict_json(raw: bytes) -> object:
    """Parse as strict JSON: UTF-8 only, no NaN/Infinity (what other languages' parsers accept)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(raw.decode("utf-8"), parse_constant=refuse)


def ledger_entries(server) -> list[dict]:
    raw = server.grader.ledger_path.read_bytes()
    return [strict_json(line) for line in raw.splitlines() if line.strip()]


def assert_consistent(server) -> list[dict]:
    """Ledger lines are strict JSON, one per request, none pending; scores.json is its reference view."""
    entries = ledger_entries(server)
    health = requests.get(f"{server.url}/health", timeout=30).json()
    assert health["requests"] == len(entries) == len(server.grader.entries)
    assert not any(e.get("pending") for e in entries)
    assert not any(e.get("pending") for e in server.grader.entries)
    assert sorted(e["submission_id"] for e in entries) == list(range(1, len(entries) + 1))
    workspace = server.grader.config.workspace
    by_id = sorted(entries, key=lambda e: e["submission_id"])
    assert strict_json((workspace / "scores.json").read_bytes()) == reference_view(by_id)
    strict_json((workspace / "submissions.json").read_bytes())
    return entries


def evaluation_children(root: psutil.Process | None = None) -> list[psutil.Process]:
    found = []
    for child in (root or psutil.Process()).children(recursive=True):
        try:
            if "rlbench.evaluation" in child.cmdline():
                found.append(child)
        except psutil.Error:
            pass
    return found


def pool_workers(server) -> list[psutil.Process]:
    """The evaluation process of this grader's own pool now ([] while it has none): other graders'
    workers, such as the session's shared one, are children of the test process too."""
    pid = server.grader.workers.worker_pid()
    try:
        return [psutil.Process(pid)] if pid is not None else []
    except psutil.Error:
        return []


def wait_for(predicate, timeout: float = 120.0, interval: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out waiting")


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True

