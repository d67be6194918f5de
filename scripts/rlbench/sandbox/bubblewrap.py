"""Agent isolation with bubblewrap: the agent sees its workspace and the tools it runs, nothing of the harness.

What the agent sees inside the sandbox (built by `plan`, in this order; a later mount covers an earlier one):

1. an empty root holding only the allow-list, read-only (root_binds: /usr and the top-level links into it, /sys,
   the files of /etc programs need; never /etc/shadow, /etc/ssh, /home, /root, /run, /srv or /var), a minimal
   /dev (plus the GPU device nodes), a fresh /proc and a private, empty /tmp; where user namespaces work the agent
   runs as uid AGENT_UID, named in a synthetic /etc/passwd and /etc/group (write_identity);
2. `masked` paths replaced by empty tmpfs (where they lie inside what is shown): the runner passes the repository (its `.snakemake/` metadata,
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
# The sandbox's root is built from an allow-list (it starts empty): the system's programs and libraries, read-only,
# symbolic links kept as links (/bin -> usr/bin); /sys for the GPU stack; from /etc only what programs need to run
# (the loader, certificates, locale and time zone, name resolution), never shadow, ssh, sudoers or the host's users.
ROOT_ALLOWED = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
ETC_ALLOWED = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "localtime",
    "timezone",
    "locale.alias",
    "locale.gen",
    "default/locale",
    "mime.types",
    "os-release",
    "lsb-release",
    "debian_version",
    "bash.bashrc",
    "profile",
    "inputrc",
    "terminfo",
    "magic",
    "gitconfig",
    "fonts",
)
# The agent's identity inside: an unprivileged uid and gid (a user namespace maps them to the runner's), named in a
# synthetic /etc/passwd and /etc/group.
AGENT_UID = AGENT_GID = 1000
AGENT_USER = "agent"
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


def user_namespace_available() -> tuple[bool, str]:
    """Whether bwrap can run the agent as AGENT_UID in a user namespace of its own here."""
    probe = subprocess.run(
        [shutil.which("bwrap"), "--unshare-user", "--uid", str(AGENT_UID), "--gid", str(AGENT_GID), "--ro-bind", "/", "/",
         "--proc", "/proc", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return False, f"bwrap cannot create a user namespace here: {probe.stderr.strip()[:200]}"
    return True, "user namespaces work"


def root_binds() -> list[str]:
    """bwrap arguments that build the sandbox's root from ROOT_ALLOWED and ETC_ALLOWED (read-only; a top-level
    symbolic link such as /lib -> usr/lib is recreated as the same link)."""
    args: list[str] = []
    for name in ROOT_ALLOWED:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    for name in ETC_ALLOWED:
        path = Path("/etc") / name
        if path.exists():  # a link is bound as what it points to (resolv.conf -> /run/...)
            args += ["--ro-bind", str(path), str(path)]
    return args


def write_identity(directory: Path, home: Path) -> tuple[Path, Path]:
    """A synthetic passwd and group naming only the agent (and root, which nothing inside runs as)."""
    directory.mkdir(parents=True, exist_ok=True)
    passwd, group = directory / "passwd", directory / "group"
    passwd.write_text(
        f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
        f"{AGENT_USER}:x:{AGENT_UID}:{AGENT_GID}:agent:{home}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group.write_text(f"root:x:0:\n{AGENT_USER}:x:{AGENT_GID}:\nnogroup:x:65534:\n")
    return passwd, group


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
    identity_dir: Path | None = None,
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
    # An empty root with only the allow-listed system parts (root_binds), a minimal /dev and a fresh /proc.
    wrapped = [shutil.which("bwrap"), *root_binds(), "--dev", "/dev", "--proc", "/proc"]
    as_user, user_refused = user_namespace_available()
    if as_user:  # an unprivileged uid inside: owner-only files of other users stay closed to it
        wrapped += ["--unshare-user", "--uid", str(AGENT_UID), "--gid", str(AGENT_GID)]
        if identity_dir is not None:
            # Absolute: bwrap runs in the workspace, and the run directory may be given relative (Snakemake's).
            passwd, group = write_identity(Path(identity_dir).resolve(), workspace / ".home")
            wrapped += ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group"]
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
        # A network namespace does not cover Unix sockets on the file system; the allow-listed root holds none of
        # the host's socket directories (/run, /var/run, /srv, /tmp, homes), so no host daemon is reachable.
        script = network.socket_dir / SCRIPT_NAME
        bridge = [python, "-I", "-S", str(script), "inside", "--socket-dir", str(network.socket_dir)]
        for port in network.ports:
            bridge += ["--port", str(port)]
        argv = [*bridge, "--", *argv]
    wrapped += ["--chdir", str(workspace), "--"]
    note = "bubblewrap: allow-listed root (system directories, interpreter, tools), workspace writable"
    note += f"; uid {AGENT_UID}" if as_user else f"; agent runs as the runner's uid ({user_refused})"
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
    elif network_refused:
        net = shared_network(f"NOT ISOLATED: {network_refused}")
        note += f"; NETWORK NOT ISOLATED: {network_refused}"
    else:
        net = shared_network("shared with the host (sandbox.network: host)")
        note += "; network shared with the host"
    return SandboxPlan("bubblewrap", wrapped + list(argv), note, net, network)
