"""The agent's own memory and process limits, and an OOM score above the grader's.

The agent's processes go into a cgroup of their own, made under the runner's (cgroup v2 where its memory and
pids controllers can be delegated there, else cgroup v1's memory and pids hierarchies), with memory and process
limits: a memory hog is killed by the kernel inside that cgroup, never the grader or its evaluation worker, and a
fork bomb runs out of process slots. Where no cgroup can be made (no permission, no controllers) the limits are not
enforced and record() says why (run.json's `limits`: `enforced_by` null and a `note`). Either way every agent process gets oom_score_adj 1000,
so that, at the machine's limit, the OOM killer picks the agent before the grader (0).

The agent enters its cgroup before it runs anything: its command starts under LAUNCHER, which writes its own
pid into each cgroup.procs and its OOM score, then execs the command (the sandbox included): no child can be
forked outside.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
AGENT_OOM_SCORE_ADJ = 1000  # the most: the OOM killer's first choice
DEFAULT_PROCESSES = 4096
DEFAULT_MEMORY_SHARE = 0.75  # of the machine's memory, when an agent entry sets no memory_bytes
LAUNCHER = r"""
import os, sys
n = int(sys.argv[1])
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("%d" % int(sys.argv[2]))
for procs in sys.argv[3:3 + n]:
    with open(procs, "w") as f:
        f.write("0")
os.execvp(sys.argv[3 + n], sys.argv[3 + n:])
"""


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def limit_settings(limits: dict | None) -> dict:
    """memory_bytes and processes of an agent entry's `limits`, defaults filled in."""
    limits = limits or {}
    memory = limits.get("memory_bytes") or int(machine_memory_bytes() * DEFAULT_MEMORY_SHARE)
    return {"memory_bytes": int(memory), "processes": int(limits.get("processes") or DEFAULT_PROCESSES)}


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: {"": path} for v2, {"memory": path, "pids": path, ...} for v1."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


class AgentCgroup:
    """A context manager: the agent's cgroup(s), made on entry and removed on exit (once the agent is gone)."""

    def __init__(self, name: str, memory_bytes: int, processes: int, root: Path = CGROUP_ROOT):
        self.name, self.memory_bytes, self.processes, self.root = name, memory_bytes, processes, root
        self.dirs: list[Path] = []
        self.version: str | None = None
        self.why_not = ""

    # -- making it -----------------------------------------------------------------------------------------
    def __enter__(self) -> AgentCgroup:
        try:
            if (self.root / "cgroup.controllers").exists():
                self._make_v2()
            else:
                self._make_v1()
        except OSError as exc:
            self._remove()
            self.dirs, self.version = [], None
            self.why_not = f"no cgroup could be made for the agent ({exc.strerror or exc}): memory and process limits not enforced"
        return self

    def _make_v2(self) -> None:
        own = _own_cgroups().get("")
        if own is None:
            raise OSError(0, "no cgroup v2 path in /proc/self/cgroup")
        parent = self.root / own.lstrip("/")
        available = (parent / "cgroup.subtree_control").read_text().split()
        missing = [c for c in ("memory", "pids") if c not in available]
        if missing:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
        group = parent / self.name
        group.mkdir()
        self.dirs, self.version = [group], "cgroup v2"
        (group / "memory.max").write_text(str(self.memory_bytes))
        if (group / "memory.swap.max").exists():  # no swap: the limit is the agent's memory, not memory + swap
            (group / "memory.swap.max").write_text("0")
        (group / "pids.max").write_text(str(self.processes))

    def _make_v1(self) -> None:
        own = _own_cgroups()
        made = []
        for controller in ("memory", "pids"):
            if controller not in own or not (self.root / controller).is_dir():
                raise OSError(0, f"no cgroup v1 {controller} hierarchy")
            group = self.root / controller / own[controller].lstrip("/") / self.name
            group.mkdir()
            made.append(group)
            self.dirs = made
        memory, pids = made
        (memory / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
        (pids / "pids.max").write_text(str(self.processes))
        self.version = "cgroup v1"

    # -- using it ------------------------------------------------------------------------------------------
    def wrap(self, argv: list[str], python: str = sys.executable) -> list[str]:
        """argv started inside the cgroup(s) with the agent's OOM score (see LAUNCHER)."""
        procs = [str(d / "cgroup.procs") for d in self.dirs]
        return [python, "-I", "-S", "-c", LAUNCHER, str(len(procs)), str(AGENT_OOM_SCORE_ADJ), *procs, *argv]

    def oom_kills(self) -> int:
        """How many of the agent's processes the kernel killed at its memory limit."""
        if not self.dirs:
            return 0
        name = "memory.events" if self.version == "cgroup v2" else "memory.oom_control"
        try:
            for line in (self.dirs[0] / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def record(self) -> dict:
        """What run.json records: the limits and what enforced them (or why nothing did)."""
        return {
            "memory_bytes": self.memory_bytes,
            "processes": self.processes,
            "enforced_by": self.version,
            "oom_kills": self.oom_kills(),
            **({"note": self.why_not} if self.why_not else {}),
        }

    # -- removing it ---------------------------------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        self._remove()

    def _remove(self) -> None:
        """Remove the cgroup(s); a process still in one (being reaped) is waited for a few seconds."""
        for group in reversed(self.dirs):
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
