"""Attempts of one agent run: an interrupted attempt is archived, never overwritten.

A run directory holds the current attempt (workspace/, grader/, attempt.json, run.json) and
earlier ones under attempts/<k>/. Starting a new attempt archives the previous one and stops
any process it left behind (a runner killed with Snakemake, an agent that outlived it).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from rlbench.fileio.jsonio import read_json, write_json

ATTEMPT_FILE = "attempt.json"
# What one attempt leaves in its run directory: archived together when a new attempt starts (an LLM agent's
# logs and prompt in agent/, the gateway's transcript and usage in gateway/, the network bridge's sockets).
ATTEMPT_PARTS = ("workspace", "grader", "run.json", "agent", "gateway", "net", "resources.jsonl", ATTEMPT_FILE)
RUN_MARKER = "RLBENCH_RUN_MARKER"


def previous_attempts(run_dir: Path) -> list[str]:
    """Archived attempts, oldest first, as paths relative to the run directory."""
    root = run_dir / "attempts"
    if not root.is_dir():
        return []
    return [f"attempts/{p.name}" for p in sorted(root.iterdir(), key=lambda p: int(p.name)) if p.name.isdigit()]


def marked_processes(marker: str) -> list[psutil.Process]:
    """Every process (but this one) whose environment carries the run marker: the agent and
    whatever it started, detached daemons included."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(RUN_MARKER) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited; returns those still alive after timeout_s.

    A zombie counts as gone: it runs nothing, and where pid 1 does not reap orphans (some containers) it
    would never disappear. Never waits with waitpid, so a child of this process stays for its Popen to reap
    (psutil.wait_procs would reap it, and Popen would then read exit code 0 for a killed agent).
    """
    end = time.monotonic() + timeout_s
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= end:
            return alive
        procs = alive
        time.sleep(0.05)


def kill_marked(marker: str, timeout_s: float = 10, rounds: int = 3, settle_s: float = 0.2) -> int:
    """SIGKILL every process carrying the run marker, until none is left; returns how many were killed.

    Several rounds: a process may fork between the listing and its kill. None is left only after two
    empty listings settle_s apart: a process between fork and exec (a daemon its agent just started)
    shows no environment for that moment, so one empty listing can miss it.
    """
    killed: set[int] = set()
    kill_rounds = empty = 0
    while kill_rounds < rounds:
        victims = [p for p in marked_processes(marker) if p.pid not in killed]
        if not victims:
            empty += 1
            if empty >= 2:
                break
            time.sleep(settle_s)
            continue
        empty = 0
        kill_rounds += 1
        for proc in victims:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        killed.update(p.pid for p in victims)
        wait_gone(victims, timeout_s)
    return len(killed)


def stop_leftovers(info: dict) -> int:
    """Kill the recorded runner (if it is still the same process) and every process carrying the marker."""
    stopped = 0
    try:
        runner = psutil.Process(info["runner_pid"])
        if abs(runner.create_time() - info["runner_create_time"]) < 1 and runner.pid != os.getpid():
            runner.send_signal(signal.SIGKILL)
            wait_gone([runner], 10)
            stopped += 1
    except (psutil.NoSuchProcess, KeyError):
        pass
    return stopped + kill_marked(info["marker"])


def attempt_recorded(run_dir: Path) -> bool:
    """Whether an attempt of this run has started (and is not archived yet)."""
    return (run_dir / ATTEMPT_FILE).exists()


def archive_previous_attempt(run_dir: Path) -> Path | None:
    """Move the last attempt's files to attempts/<k>/ (k = its attempt number); None if there was none."""
    marker_file = run_dir / ATTEMPT_FILE
    if not marker_file.exists():
        return None
    info = read_json(marker_file)
    stopped = stop_leftovers(info)
    dest = run_dir / "attempts" / str(info["attempt"])
    dest.mkdir(parents=True, exist_ok=True)
    for name in ATTEMPT_PARTS:
        if (run_dir / name).exists():
            os.replace(run_dir / name, dest / name)
    write_json(dest / "archived.json", {"archived_at": time.time(), "stopped_processes": stopped})
    return dest


def begin_attempt(run_dir: Path, marker: str) -> int:
    """Record that a new attempt starts now; returns its number (1 for the first)."""
    number = len(previous_attempts(run_dir)) + 1
    me = psutil.Process()
    write_json(
        run_dir / ATTEMPT_FILE,
        {
            "attempt": number,
            "marker": marker,
            "runner_pid": me.pid,
            "runner_create_time": me.create_time(),
            "started": time.time(),
        },
    )
    return number
