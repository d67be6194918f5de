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
The network (`network`, from sandbox.network): with a NetworkPolicy (`isolated`, the default) the agent gets its
own network namespace with only a loopback: no routes, no DNS, none of the host's loopback services (other runs'
graders included). The policy's ports, host loopback services such as its grader and LLM gateway, stay reachable
at the same address (127.0.0.1:PORT) through a bridge (rlbench.sandbox.netbridge): the runner holds the host side
(`SandboxPlan.bridge()`) for the agent's lifetime; inside, the bridge's copy of netbridge.py forwards and then
execs the agent's command. With None (`host`), or without bubblewrap, the network is the host's. `SandboxPlan.network` says which,
for run.json.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlbench.sandbox.netbridge import SCRIPT_NAME, HostBridge

BACKENDS = ("auto", "bubblewrap", "none")
# Directories the interpreter and every tool need (libraries, loader cache, users, devices): a path equal to one
# of them or above one is never masked, whatever the environment says (HOME=/ on some service accounts).
SYSTEM_DIRS = tuple("/ /bin /sbin /lib /lib32 /lib64 /libx32 /usr /etc /dev /proc /sys /run /opt /var /tmp".split())
NETWORK_MODES = ("isolated", "host")
# Inside the sandbox the forwarder runs without capabilities: it cannot listen below this port.
MIN_BRIDGED_PORT = 1024


@dataclass(frozen=True)
class NetworkPolicy:
    """An isolated network: the host loopback ports the agent may reach, and where their bridge sockets live.

    ports: {port: what it is ("grader", "LLM gateway", ...)}, or a plain list of ports. socket_dir: a directory of
    the run outside the workspace (created with mode 0700 by the bridge), bound read-only into the sandbox.
    """

    ports: Mapping[int, str] | Sequence[int]
    socket_dir: Path

    def __post_init__(self) -> None:
        named = self.ports if isinstance(self.ports, Mapping) else dict.fromkeys(self.ports, "")
        object.__setattr__(self, "ports", {int(p): str(what) for p, what in named.items()})
        object.__setattr__(self, "socket_dir", Path(self.socket_dir).resolve())

    def reachable(self) -> list[str]:
        return [f"127.0.0.1:{p}" + (f" ({what})" if what else "") for p, what in self.ports.items()]


def network_policy(
    mode: str, socket_dir: Path, named: Mapping[int, str], extra: Sequence[int] = ()
) -> NetworkPolicy | None:
    """The policy for sandbox.network `mode`: None for `host`; for `isolated`, the `named` ports ({port: what})
    and the agent's `extra` ports (its registry entry's network.allow_ports), in that order."""
    if mode not in NETWORK_MODES:
        raise ValueError(f"unknown sandbox.network {mode!r}; allowed: {', '.join(NETWORK_MODES)}")
    if mode == "host":
        return None
    ports = {int(p): what for p, what in named.items()}
    for port in extra:
        ports.setdefault(int(port), "allowed by the agent's config")
    return NetworkPolicy(ports=ports, socket_dir=socket_dir)


def shared_network(why: str) -> dict:
    """run.json's `network` when the agent shares the host's network ("*": whatever the host reaches)."""
    return {"isolated": False, "reachable": ["*"], "note": why}


@dataclass
class SandboxPlan:
    backend: str  # what is actually used: "bubblewrap" or "none"
    argv: list[str]
    note: str
    # run.json's `network`: {"isolated": bool, "reachable": [...], "note": str}; plan() always sets it, the default
    # is for the runner's placeholder of an agent that never started.
    network: dict = field(default_factory=lambda: {"isolated": False, "reachable": [], "note": "the agent did not start"})
    policy: NetworkPolicy | None = None  # the bridge to hold while the agent runs, when isolated

    def bridge(self) -> contextlib.AbstractContextManager:
        """The host side of the network bridge, to hold (`with`) while the agent runs; a no-op when not isolated."""
        if self.policy is None:
            return contextlib.nullcontext()
        return HostBridge(self.policy.socket_dir, list(self.policy.ports))


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


def network_namespace_available() -> tuple[bool, str]:
    """Whether bwrap can give the sandbox its own network namespace here (some containers forbid it)."""
    probe = subprocess.run(
        [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return False, f"bwrap cannot create a network namespace here: {probe.stderr.strip()[:200]}"
    return True, "network namespaces work"


def host_sockets(root: str = "/run", max_depth: int = 4, limit: int = 500) -> list[Path]:
    """Unix sockets under root (depth and count bounded; links not followed), which an isolated sandbox hides.
    The NVIDIA persistence daemon's socket is left alone (CUDA may use it)."""
    found: list[Path] = []

    def walk(directory: str, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            if len(found) >= limit:
                return
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < max_depth:
                        walk(entry.path, depth + 1)
                elif stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode) and "nvidia" not in entry.path:
                    found.append(Path(entry.path))
            except OSError:
                continue

    walk(root, 1)
    return found


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
    network: NetworkPolicy | None = None,
    python: str = sys.executable,
) -> SandboxPlan:
    """The command line that runs argv sandboxed (or plainly, with the reason, when impossible).

    Mount order matters (see the module docstring): the read-only root and a private /tmp, the `masked` paths
    as empty tmpfs, the `visible` paths bound back read-only on top, the `hidden` paths as empty tmpfs, then
    the workspace (writable) and `readonly_inside`.

    `network`: None shares the host's network. A NetworkPolicy isolates it (see the module docstring): argv then
    runs under netbridge.py (with `python`, which must be visible), and the caller holds `plan.bridge()` while it
    runs. Without bubblewrap the network cannot be isolated: the plan says so (backend auto), or it raises
    (backend bubblewrap, when bwrap works but cannot create a network namespace).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if network is not None:
        low = [p for p in network.ports if not MIN_BRIDGED_PORT <= p <= 65535]
        if low:
            raise RuntimeError(
                f"ports {low} cannot be bridged into the sandbox: only {MIN_BRIDGED_PORT}-65535 (the forwarder inside "
                "runs without capabilities)"
            )
    unisolated = "" if network is None else "; NETWORK NOT ISOLATED"
    if backend == "none":
        note = "sandbox disabled by config (sandbox.backend: none)"
        return SandboxPlan("none", list(argv), note + unisolated, shared_network(f"shared with the host: {note}"))
    ok, why = bubblewrap_available()
    if not ok:
        if backend == "bubblewrap":
            raise RuntimeError(f"sandbox.backend is bubblewrap but {why}")
        return SandboxPlan("none", list(argv), f"UNSANDBOXED: {why}{unisolated}", shared_network(f"UNSANDBOXED: {why}"))
    network_refused = ""
    if network is not None:
        ok, why = network_namespace_available()
        if not ok:
            if backend == "bubblewrap":
                raise RuntimeError(f"sandbox.network is isolated but {why} (set sandbox.network: host to share it)")
            network, network_refused = None, why
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
    if network is not None:
        # Own network namespace (bwrap brings its loopback up). The bridge's directory (its sockets and the
        # forwarder's script, put there by the bridge: the repository stays hidden) is bound back on top of the
        # masks (the run's directory sits in the hidden results), read-only: connecting to a socket does not write
        # to its file system.
        wrapped += ["--unshare-net", "--ro-bind", str(network.socket_dir), str(network.socket_dir)]
        # A network namespace does not cover Unix sockets on the file system: the host's daemons (D-Bus, a
        # database, docker.sock) would stay reachable through /run. Each is replaced by /dev/null.
        sockets = host_sockets()
        for path in sockets:
            wrapped += ["--ro-bind", "/dev/null", str(path)]
        script = network.socket_dir / SCRIPT_NAME
        bridge = [python, "-I", "-S", str(script), "inside", "--socket-dir", str(network.socket_dir)]
        for port in network.ports:
            bridge += ["--port", str(port)]
        argv = [*bridge, "--", *argv]
    wrapped += ["--chdir", str(workspace), "--"]
    note = "bubblewrap: workspace writable; repository, home, caches and results hidden"
    if refused:
        note += "; not masked: " + ", ".join(refused)
    if network is not None:
        reachable = network.reachable()
        net = {
            "isolated": True,
            "reachable": reachable,
            "note": "own network namespace: loopback only, no routes, no DNS; host loopback ports bridged in: "
            + (", ".join(reachable) or "none"),
        }
        note += "; network isolated: only " + (", ".join(reachable) or "its own loopback")
        if sockets:
            net["note"] += f"; {len(sockets)} host Unix socket(s) under /run hidden"
    elif network_refused:
        net = shared_network(f"NOT ISOLATED: {network_refused}")
        note += f"; NETWORK NOT ISOLATED: {network_refused}"
    else:
        net = shared_network("shared with the host (sandbox.network: host)")
        note += "; network shared with the host"
    return SandboxPlan("bubblewrap", wrapped + list(argv), note, net, network)
