"""The agent's process tree: finding every process of a run, stopping them with a grace period, and what
its exit status says."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from rlbench.agent_run.attempts import kill_marked, marked_processes, wait_gone


def agent_processes(proc: subprocess.Popen, marker: str) -> list[psutil.Process]:
    """The agent's processes but its root (proc): descendants, and daemons it detached (found by the run marker).

    The root is left out: only its Popen may wait for it (see kill_tree).
    """
    found: dict[int, psutil.Process] = {}
    try:
        found.update({p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    found.update({p.pid: p for p in marked_processes(marker)})
    found.pop(proc.pid, None)
    return list(found.values())


def _signal_all(members: list[psutil.Process], sig: int) -> None:
    for member in members:
        try:
            member.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _wait_tree(proc: subprocess.Popen, members: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until the root has exited (reaped by its Popen) and the other members are gone; returns those alive."""
    end = time.monotonic() + timeout_s
    while True:
        alive = wait_gone(members, 0)
        if (proc.poll() is not None and not alive) or time.monotonic() >= end:
            return alive
        time.sleep(0.05)


def kill_tree(proc: subprocess.Popen, grace_s: float, marker: str, wrapped: bool = False) -> None:
    """SIGTERM the agent's processes, SIGKILL what is left after grace_s; returns once they are gone.

    The root is waited for by its Popen only: psutil.wait_procs would reap it first, and Popen would then record
    exit code 0 for an agent it never saw exit. `wrapped`: the root is bwrap and its only child the sandbox's
    init. They get no SIGTERM (bwrap would die of it at once and take the sandbox with it, leaving the agent no
    grace); the agent's processes inside do. SIGKILL goes to bwrap first, which ends everything in the sandbox.
    """
    wrappers = {proc.pid}
    if wrapped:
        try:
            wrappers.update(child.pid for child in psutil.Process(proc.pid).children())
        except psutil.NoSuchProcess:
            pass
    else:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the session leader's group: the root, children that did not detach
            if os.getpgid(proc.pid) != proc.pid:  # the root left its own group
                proc.send_signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    members = agent_processes(proc, marker)
    _signal_all([m for m in members if m.pid not in wrappers], signal.SIGTERM)  # also those that started a session
    if not _wait_tree(proc, members, grace_s) and proc.returncode is not None:
        return
    proc.kill()  # no-op once Popen has seen it exit
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    members = agent_processes(proc, marker)  # with what was started during the grace period
    _signal_all(members, signal.SIGKILL)
    _wait_tree(proc, members, 10)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def exit_signal(returncode: int | None, wrapped: bool = False) -> str | None:
    """The signal that ended the agent's command, from the runner's exit status; None when it exited by itself.

    Popen reports a process killed by signal n as -n; bwrap (`wrapped`) reports its command killed by n as 128+n.
    """
    if returncode is None:
        return None
    number = -returncode if returncode < 0 else returncode - 128 if wrapped and 128 < returncode < 128 + 65 else 0
    if number <= 0:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal
        return f"SIG{number}"


def stop_strays(marker: str, wrapped: bool) -> int:
    """Kill whatever of the run still runs after its agent ended; returns how many processes that was."""
    if wrapped:  # the kernel is already ending the sandbox's PID namespace: let it finish before counting
        wait_gone(marked_processes(marker), 2)
    return kill_marked(marker)
