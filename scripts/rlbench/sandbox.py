"""Agent isolation with bubblewrap: the agent sees its workspace, not the results tree around it.

Inside the sandbox the whole file system is read-only except the workspace and a private /tmp;
the results directory (held-out splits, ledgers, other runs) is replaced by an empty tmpfs with
only this run's workspace mounted back. Loopback networking stays, so the grader is reachable.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("auto", "bubblewrap", "none")


@dataclass
class SandboxPlan:
    backend: str  # what is actually used: "bubblewrap" or "none"
    argv: list[str]
    note: str


def bubblewrap_available() -> tuple[bool, str]:
    """Whether bwrap exists and can create a sandbox here (user namespaces may be disabled)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, "bwrap not found (install the bubblewrap package)"
    probe = subprocess.run(
        [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return False, f"bwrap cannot create a sandbox here: {probe.stderr.strip()[:200]}"
    return True, "bubblewrap works"


def plan(
    argv: list[str],
    workspace: Path,
    hidden: list[Path],
    readonly_inside: list[Path],
    backend: str = "auto",
    visible: list[Path] = (),
) -> SandboxPlan:
    """The command line that runs argv sandboxed (or plainly, with the reason, when impossible).

    Mount order matters: the read-only root, a private /tmp, the `visible` paths back on top,
    then the `hidden` paths replaced by empty tmpfs, then the workspace and `readonly_inside`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "none":
        return SandboxPlan("none", list(argv), "sandbox disabled by config (sandbox.backend: none)")
    ok, why = bubblewrap_available()
    if not ok:
        if backend == "bubblewrap":
            raise RuntimeError(f"sandbox.backend is bubblewrap but {why}")
        return SandboxPlan("none", list(argv), f"UNSANDBOXED: {why}")
    workspace = workspace.resolve()
    wrapped = [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # --dev gives a minimal /dev: pass the GPU device nodes through so CUDA works inside.
    for device in sorted(Path("/dev").glob("nvidia*")) + sorted(Path("/dev/dri").glob("*")):
        wrapped += ["--dev-bind", str(device), str(device)]
    # A private PID namespace: when the agent's init exits or is killed, every process in it dies.
    wrapped += ["--tmpfs", "/tmp", "--unshare-pid", "--die-with-parent"]
    # What the agent's command needs (interpreter, agent code) stays visible even under /tmp.
    for path in visible:
        wrapped += ["--ro-bind", str(Path(path).resolve()), str(Path(path).resolve())]
    for path in hidden:
        wrapped += ["--tmpfs", str(path.resolve())]
    wrapped += ["--bind", str(workspace), str(workspace)]
    for path in readonly_inside:
        wrapped += ["--ro-bind", str(path.resolve()), str(path.resolve())]
    wrapped += ["--chdir", str(workspace), "--"]
    return SandboxPlan("bubblewrap", wrapped + list(argv), "bubblewrap: workspace writable, results hidden")
