"""Supervising the agent: waiting for it until the deadline, stopping it when the runner is told to stop, and
stopping the runner when the Snakemake that started it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import psutil

from rlbench.agent_run.process_tree import kill_tree
from rlbench.proc import lifeline
from rlbench.recording.workspace_state import workspace_usage

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


class Interrupted(Exception):
    """The runner itself was told to stop (SIGTERM/SIGINT), e.g. Snakemake cancelled the job or died."""


# The process whose death stops this runner (set by stop_with_owner), named in an interrupted run's record.
_OWNER: psutil.Process | None = None


def _owner_gone() -> bool:
    if _OWNER is None:
        return False
    try:
        return not _OWNER.is_running() or _OWNER.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class StopRequest:
    """SIGTERM/SIGINT to the runner while a run is on.

    Raised as Interrupted only while the runner waits for the agent (an exception anywhere else could leave the
    grader or the record half done); at any other moment it is remembered: the agent is then not started, or
    the run ends as usual with status interrupted. Either way the agent's processes are stopped and run.json is
    written.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self.waiting = False
        self._previous: dict = {}

    def __call__(self, signum: int, frame) -> None:
        if self.reason is None:
            self.reason = signal.Signals(signum).name
            if _owner_gone():
                self.reason += f" (the process that started the runner, pid {_OWNER.pid}, is gone)"
        if self.waiting:
            self.waiting = False
            raise Interrupted(self.reason)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class DiskWatch:
    """A supervise() check that stops the agent once its workspace takes more than `limit_bytes` on
    disk (the agent entry's limits.disk_bytes; what du counts, links not followed): a run that fills
    the disk holding every run's records ends as `stopped` (stopped_by kind "disk_limit"). The
    workspace is walked at most every interval_s seconds."""

    def __init__(self, workspace, limit_bytes: int, interval_s: float = 10.0):
        self.workspace, self.limit_bytes, self.interval_s = workspace, int(limit_bytes), interval_s
        self._last = float("-inf")

    def __call__(self) -> tuple[str, str] | None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return None
        self._last = now
        used = workspace_usage(self.workspace)["allocated_bytes"]
        if used > self.limit_bytes:
            return (
                "disk_limit",
                f"the workspace takes {used:,} bytes on disk, over the agent's limits.disk_bytes ({self.limit_bytes:,})",
            )
        return None


def supervise(
    proc: subprocess.Popen,
    deadline: float,
    grace_s: float,
    marker: str,
    stop: StopRequest | None = None,
    wrapped: bool = False,
    check: Callable[[], object] | None = None,
    check_every_s: float = 1.0,
) -> tuple[int | None, str]:
    """Wait for the agent until the deadline; returns (exit code, 'exited' | 'timeout' | 'interrupted' | 'stopped').

    Whatever ends the wait, no process of the agent's tree outlives this call (detached daemons are left to the
    run's final sweep of the marker). `stop`: an installed StopRequest (one is installed for the call if None).
    `check`: polled every check_every_s while the agent runs; a true value ends the run now ('stopped'), e.g.
    the LLM gateway saying the driver endpoint is dead or a limit is reached.
    """
    if stop is None:
        with StopRequest() as own:
            return supervise(proc, deadline, grace_s, marker, own, wrapped, check, check_every_s)
    ending = "timeout"
    try:
        stop.waiting = True
        try:
            if stop.reason is not None:  # the signal came before the wait began
                raise Interrupted(stop.reason)
            while True:
                remaining = max(0.0, deadline - time.time())
                try:
                    return proc.wait(timeout=min(remaining, check_every_s) if check else remaining), "exited"
                except subprocess.TimeoutExpired:
                    if time.time() >= deadline:
                        raise
                if check is not None and check():
                    ending = "stopped"
                    break
        finally:
            stop.waiting = False
    except subprocess.TimeoutExpired:
        ending = "timeout"
    except Interrupted:
        ending = "interrupted"
    kill_tree(proc, grace_s, marker, wrapped)
    return proc.returncode, ending


def stop_with_owner(interval_s: float = 0.5) -> psutil.Process:
    """Make the runner stop its run (agent stopped, run.json written, exit) when its Snakemake dies; returns
    the process watched.

    How Snakemake starts this script (checked with Snakemake 9.27 and bash 5.2, local executor): a `script:` job
    runs in a worker thread of the Snakemake process, whose shell() starts `bash -c "set -euo pipefail; <python>
    .snakemake/scripts/tmpXXXX.run_agent.py"` in Snakemake's own process group (no new session); bash 5.1+
    execs its last command, so the runner's parent is the Snakemake process itself. On SLURM, the job's own
    `python -m snakemake` on the node runs it the same way. With an older bash, or a prefix such as conda's
    activation, the shell may stay in between, and a shell outlives a kill -9 of the Snakemake above it: so
    the process watched is the nearest ancestor that is not a shell.

    Two lifelines, both ending in a SIGTERM to the runner, which run_agent handles as an interruption: the
    kernel's parent-death signal (immediate; it fires when the parent *thread* that started us exits, and
    Snakemake's worker thread lives as long as the job), and a watchdog thread for the ancestor.
    """
    global _OWNER
    parent = psutil.Process(os.getppid())
    lifeline.die_with_parent(parent.pid, signal.SIGTERM)
    owner = parent
    try:
        while owner.name() in SHELLS and owner.parent() is not None and owner.parent().pid > 1:
            owner = owner.parent()
    except psutil.NoSuchProcess:
        pass
    _OWNER = owner

    def watch() -> None:
        while not _owner_gone() and (owner.pid != parent.pid or os.getppid() == parent.pid):
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="owner-watchdog", daemon=True).start()
    return owner
