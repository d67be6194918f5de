"""Processes that must not outlive the process that started them.

A runner killed with -9 cannot stop what it started; the kernel can: an evaluation child dies
with its grader, and a runner gets SIGTERM when the Snakemake that started it is gone (the
runner adds a watchdog for shells in between: rlbench.agent_run.supervision.stop_with_owner).
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux prctl).

    Call it first thing in the child, with the parent's pid as the parent knew it: when the
    parent died before the call, the child exits at once. Returns False where prctl is missing.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != expected_parent:
        os._exit(128 + int(sig))
    return armed
