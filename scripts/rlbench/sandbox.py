"""Agent isolation with bubblewrap: the agent sees its workspace and the tools it runs, nothing of the harness.

What the agent sees inside the sandbox (built by `plan`, in this order; a later mount covers an earlier one):

1. the host's root file system, read-only, with a minimal /dev (plus the GPU device nodes), a fresh /proc
   and a private, empty /tmp;
2. `masked` paths replaced by empty tmpfs: the runner passes the repository (its `.snakemake/` metadata,
   `config/`, the tasks' private code that generates held-out splits), the host's home and every cache
   location that can hold held-out data (Hugging Face, torch, XDG caches); the agent never sees them;
3. `visible` paths bound back read-only on top: what the agent's command needs, i.e. the interpreter
   prefixes (the venv may live inside the repository, the base interpreter inside the home) and the
   reference agents' code (scripts/agents);
4. `hidden` paths replaced by empty tmpfs: the results tree (held-out splits, ledgers, other runs);
5. the run's workspace, writable, and its read-only parts (training data, base model) on top.

A mask that would hide the system itself (`/`, /usr, /etc, ...) is refused and named in the plan's note.
The agent's HOME is a private directory in the workspace (set by the runner). It has no capabilities, even
when the runner is root, so it cannot undo any of these mounts. The agent runs in its own
PID namespace as the child of bwrap: when its command ends or bwrap is killed, every process inside dies.
The network is shared with the host: the grader listens on loopback, an LLM agent calls its API.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("auto", "bubblewrap", "none")
# Directories the interpreter and every tool need (libraries, loader cache, users, devices): a path equal to one
# of them or above one is never masked, whatever the environment says (HOME=/ on some service accounts).
SYSTEM_DIRS = tuple("/ /bin /sbin /lib /lib32 /lib64 /libx32 /usr /etc /dev /proc /sys /run /opt /var /tmp".split())


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


def _within(path: Path, other: Path) -> bool:
    """path is other or below it."""
    return path == other or other in path.parents


def _existing(paths: Sequence[Path]) -> list[Path]:
    """Resolved, existing, de-duplicated, in order: bwrap cannot bind a missing source, nor mount on a missing
    path of the read-only root (and a missing path hides nothing)."""
    out: list[Path] = []
    for path in paths:
        resolved = Path(path).resolve()
        if resolved.exists() and resolved not in out:
            out.append(resolved)
    return out


def split_masks(masked: Sequence[Path], visible: Sequence[Path]) -> tuple[list[Path], list[Path], list[str]]:
    """(masks mounted before the visible binds, masks mounted after them, why some masks were refused).

    A mask above a visible path goes first, so the visible path is bound back on top of it. A mask inside a
    visible path (a cache inside the venv, say) goes after, or the visible bind would show it again; if it
    also holds another visible path it is refused, since it would hide what the agent needs.
    """
    system = _existing([Path(p) for p in SYSTEM_DIRS])
    before, after, refused = [], [], []
    for mask in _existing(masked):
        if any(_within(s, mask) for s in system):
            refused.append(f"{mask} (would hide the system)")
        elif not any(_within(mask, v) and mask != v for v in visible):
            before.append(mask)
        elif any(_within(v, mask) for v in visible):
            refused.append(f"{mask} (would hide a path the agent needs)")
        else:
            after.append(mask)
    # Parents first: a tmpfs mounted over an earlier, deeper one would make that one pointless.
    return sorted(before, key=lambda p: len(p.parts)), after, refused


def plan(
    argv: list[str],
    workspace: Path,
    hidden: list[Path],
    readonly_inside: list[Path],
    backend: str = "auto",
    visible: Sequence[Path] = (),
    masked: Sequence[Path] = (),
) -> SandboxPlan:
    """The command line that runs argv sandboxed (or plainly, with the reason, when impossible).

    Mount order matters (see the module docstring): the read-only root and a private /tmp, the `masked` paths
    as empty tmpfs, the `visible` paths bound back read-only on top, the `hidden` paths as empty tmpfs, then
    the workspace (writable) and `readonly_inside`.
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
    shown = _existing(visible)
    masks_before, masks_after, refused = split_masks(masked, shown)
    wrapped = [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # --dev gives a minimal /dev: pass the GPU device nodes through so CUDA works inside.
    for device in sorted(Path("/dev").glob("nvidia*")) + sorted(Path("/dev/dri").glob("*")):
        wrapped += ["--dev-bind", str(device), str(device)]
    # A private PID namespace: when the agent's init exits or is killed, every process in it dies.
    # No capabilities: run as root (CI, containers), bwrap would otherwise leave the agent CAP_SYS_ADMIN (unmount
    # every mask, remount / read-write) and CAP_NET_RAW (sniff other runs' grading secrets off loopback).
    wrapped += ["--tmpfs", "/tmp", "--unshare-pid", "--die-with-parent", "--cap-drop", "ALL"]
    for path in masks_before:
        wrapped += ["--tmpfs", str(path)]
    # What the agent's command needs (interpreter, agent code) stays visible under the masks and /tmp.
    for path in shown:
        wrapped += ["--ro-bind", str(path), str(path)]
    for path in [*masks_after, *(Path(p).resolve() for p in hidden)]:
        wrapped += ["--tmpfs", str(path)]
    wrapped += ["--bind", str(workspace), str(workspace)]
    for path in readonly_inside:
        wrapped += ["--ro-bind", str(path.resolve()), str(path.resolve())]
    wrapped += ["--chdir", str(workspace), "--"]
    note = "bubblewrap: workspace writable; repository, home, caches and results hidden"
    if refused:
        note += "; not masked: " + ", ".join(refused)
    return SandboxPlan("bubblewrap", wrapped + list(argv), note)
