"""Chosen host loopback ports, reachable at the same address from a sandbox with its own network namespace.

The sandbox (bwrap --unshare-net) has only its own loopback: no routes, no DNS, none of the host's loopback
services. To let the agent reach a few host services at their usual address (GRADING_SERVER_URL is
http://127.0.0.1:PORT/<secret> inside as outside), each allowed port P is bridged through a Unix socket:

    agent --TCP--> 127.0.0.1:P (sandbox)  [forwarder, `inside`]
          --Unix--> <socket_dir>/P.sock     [HostBridge, in the runner]
          --TCP--> 127.0.0.1:P (host)

- HostBridge (host side, a context manager the runner holds for the agent's lifetime): one Unix listener per
  port in a private directory (mode 0700, outside the workspace); each connection is relayed to 127.0.0.1:P.
- `python D/netbridge.py inside --socket-dir D --port P ... -- <argv>` (the sandbox's command; HostBridge puts
  this script's copy in D, since the repository is hidden in the sandbox, and an empty scripts/rlbench/ there
  holding a bound netbridge.py would make `import rlbench` succeed as a namespace package): starts a
  forwarder process that listens on 127.0.0.1:P in the sandbox's namespace and relays each connection to
  D/P.sock (D is bind-mounted read-only: connect() on a socket needs no write access to its file system),
  waits until it listens, then execs argv. The agent's command thus replaces this process: its exit status
  and signals are what bwrap reports, as without the bridge. The forwarder is detached (its parent is the
  sandbox's init, not the agent, so an agent waiting for its children never sees it), ignores SIGTERM/SIGINT/
  SIGHUP (the agent keeps its connections during the grace period) and exits with the agent (the PID
  namespace ends; outside one, it watches the agent's pid).

Relays are full duplex (one thread per direction), pass half-closes on (shutdown(SHUT_WR) after EOF), never time
out (an LLM gateway's streamed answer may last minutes) and are independent of one another. A side that stops
taking data ends only its own direction: a server's early answer (413 to a huge upload, then close) still
reaches the agent; a side that resets ends both.

Standard library only: the script runs inside the sandbox under `python -I -S`, where the repository's
packages are hidden.
"""

from __future__ import annotations

import argparse
import errno
import os
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

BUFFER_BYTES = 1 << 18
BACKLOG = 128
# The most connections the host side relays at once, all ports together (each costs the runner two threads and
# three descriptors): past it a new one is closed at once, so an agent opening thousands of idle connections
# costs the runner a bounded number of threads, not one pair each.
MAX_CONNECTIONS = 256
SUN_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes, the terminating NUL included
FORWARDER_FAILED = 70  # exit status when the forwarder cannot start (EX_SOFTWARE)
SCRIPT_NAME = "netbridge.py"  # this script's copy in the socket directory, run inside the sandbox


def socket_name(port: int) -> str:
    return f"{int(port)}.sock"


def _unix_address(socket_dir: Path, port: int, dir_fd: int | None) -> str:
    """The address of the port's socket; through /proc/self/fd when the plain path is too long for sun_path."""
    path = str(Path(socket_dir) / socket_name(port))
    if len(os.fsencode(path)) <= SUN_PATH_MAX or dir_fd is None:
        return path
    return f"/proc/self/fd/{dir_fd}/{socket_name(port)}"


def _open_dir(socket_dir: Path) -> int | None:
    """A descriptor of socket_dir when its socket paths may exceed sun_path (see _unix_address), else None."""
    if len(os.fsencode(str(Path(socket_dir) / socket_name(65535)))) <= SUN_PATH_MAX:
        return None
    return os.open(socket_dir, os.O_RDONLY | os.O_DIRECTORY)


def _nodelay(sock: socket.socket) -> None:
    """A relay passes chunks on as they come: Nagle would hold back the small ones of a streamed answer."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Relay:
    """Two connected sockets relayed both ways, one thread per direction; both closed when both directions end.

    EOF on one side is passed on as a half-close of the other. A side that can no longer be read (a reset) ends both
    directions; a side that can no longer be written ends only the direction towards it (see _pump).
    """

    def __init__(self, a: socket.socket, b: socket.socket, live: set | None = None, lock: threading.Lock | None = None):
        self.sockets = (a, b)
        for sock in self.sockets:  # blocking, never timing out (even under a socket.setdefaulttimeout)
            sock.settimeout(None)
        self._left = 2
        self._lock = threading.Lock()
        self._live, self._live_lock = live, lock
        if live is not None:
            with lock:
                live.add(self)

    def start(self) -> None:
        a, b = self.sockets
        for src, dst in ((a, b), (b, a)):
            threading.Thread(target=self._pump, args=(src, dst), name="netbridge-relay", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        buffer = bytearray(BUFFER_BYTES)
        view = memoryview(buffer)
        try:
            while True:
                try:
                    n = src.recv_into(buffer)
                except OSError:  # src is gone (reset): nothing more can reach it, both directions end
                    self.abort()
                    return
                if not n:  # src's half-close, passed on
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                try:
                    dst.sendall(view[:n])
                except OSError:
                    # dst takes no more (a server that answered early, e.g. 413 to a huge body, and closed). What it
                    # sent before still comes back through the other direction, which must not be cut: only this
                    # one ends, and src's sender is told (a Unix peer gets EPIPE; a TCP one a reset once all closes).
                    try:
                        src.shutdown(socket.SHUT_RD)
                    except OSError:
                        pass
                    return
        finally:
            with self._lock:
                self._left -= 1
                last = self._left == 0
            if last:
                self.close()

    def abort(self) -> None:
        """End both directions now (their threads see EOF or an error and finish)."""
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        if self._live is not None:
            with self._live_lock:
                self._live.discard(self)


class HostBridge:
    """Host side: <socket_dir>/<port>.sock for each port, relayed to host:port. A context manager.

    socket_dir is created with mode 0700 (only the runner's user, hence its sandboxed agent, may connect); stale
    sockets of an earlier attempt are replaced. It also gets a copy of this script (SCRIPT_NAME), which the
    sandbox runs as its forwarder. On exit the listeners stop, open relays are cut, and the sockets, the copy and
    the directory are removed.
    """

    def __init__(
        self,
        socket_dir: Path,
        ports: Iterable[int],
        host: str = "127.0.0.1",
        connect_timeout_s: float = 10,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.socket_dir = Path(socket_dir)
        self.ports = list(dict.fromkeys(int(p) for p in ports))
        self.host = host
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.connections = 0  # accepted so far, all ports together
        self.refused = 0  # closed at once: max_connections were open
        self._connecting = 0  # accepted, their upstream connection not made yet
        self._listeners: dict[socket.socket, int] = {}
        self._live: set[_Relay] = set()
        self._lock = threading.Lock()
        self._dir_fd: int | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> HostBridge:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.socket_dir, 0o700)
        script = self.socket_dir / SCRIPT_NAME
        partial = script.with_suffix(".partial")
        partial.write_bytes(Path(__file__).read_bytes())
        partial.chmod(0o444)
        os.replace(partial, script)
        self._dir_fd = _open_dir(self.socket_dir)
        try:
            for port in self.ports:
                address = _unix_address(self.socket_dir, port, self._dir_fd)
                try:
                    os.unlink(address)
                except FileNotFoundError:
                    pass
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._listeners[listener] = port
                listener.bind(address)
                listener.listen(BACKLOG)
            self._wake_r, self._wake_w = os.pipe()
        except BaseException:
            self._close_listeners()
            raise
        self._thread = threading.Thread(target=self._serve, name="netbridge-host", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            for listener in self._listeners:
                selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj == self._wake_r:
                        return
                    try:
                        conn, _ = key.fileobj.accept()
                    except OSError:
                        continue
                    with self._lock:
                        full = len(self._live) + self._connecting >= self.max_connections
                        if not full:
                            self._connecting += 1
                    if full:
                        self.refused += 1
                        conn.close()  # the agent's side sees its connection closed
                        continue
                    self.connections += 1
                    port = self._listeners[key.fileobj]
                    threading.Thread(
                        target=self._connect, args=(conn, port), name="netbridge-connect", daemon=True
                    ).start()

    def _connect(self, conn: socket.socket, port: int) -> None:
        try:
            try:
                upstream = socket.create_connection((self.host, port), timeout=self.connect_timeout_s)
            except OSError:
                conn.close()  # the agent's side sees its connection closed
                return
            _nodelay(upstream)
            relay = _Relay(conn, upstream, self._live, self._lock)  # counted live from here on
        finally:
            with self._lock:
                self._connecting -= 1
        relay.start()

    def _close_listeners(self) -> None:
        for listener, port in self._listeners.items():
            listener.close()
            try:
                os.unlink(_unix_address(self.socket_dir, port, self._dir_fd))
            except OSError:
                pass
        self._listeners.clear()
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def stop(self) -> None:
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            self._thread.join(timeout=10)
            self._thread = None
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._close_listeners()
        with self._lock:
            live = list(self._live)
        for relay in live:
            relay.abort()
        try:
            (self.socket_dir / SCRIPT_NAME).unlink(missing_ok=True)
            self.socket_dir.rmdir()
        except OSError:
            pass

    def __enter__(self) -> HostBridge:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- inside the sandbox ----------------------------------------------------------------------------------


def _agent_gone_fd(pid: int) -> int | None:
    """A descriptor that becomes readable when pid exits (a pidfd); None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _forward(socket_dir: Path, ports: list[int], ready_fd: int, agent_pid: int) -> None:
    """The forwarder's life (never returns): listen on 127.0.0.1:port for each port, report on ready_fd, relay
    each connection to socket_dir/<port>.sock until the agent is gone."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # stderr stays: the agent's log, for the rare diagnostic
    listeners: dict[socket.socket, int] = {}
    try:
        dir_fd = _open_dir(socket_dir)
        for port in ports:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(("127.0.0.1", port))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on 127.0.0.1:{port} in the sandbox: {exc.strerror}") from None
            listener.listen(BACKLOG)
            listeners[listener] = port
    except OSError as exc:
        os.write(ready_fd, f"netbridge: {exc.strerror or exc}".encode())
        os._exit(1)
    os.write(ready_fd, b"ok")
    os.close(ready_fd)
    agent_fd = _agent_gone_fd(agent_pid)
    with selectors.DefaultSelector() as selector:
        for listener in listeners:
            selector.register(listener, selectors.EVENT_READ)
        if agent_fd is not None:
            selector.register(agent_fd, selectors.EVENT_READ)
        while True:
            events = selector.select(timeout=None if agent_fd is not None else 1.0)
            if agent_fd is None:
                try:
                    os.kill(agent_pid, 0)
                except ProcessLookupError:
                    os._exit(0)
            for key, _ in events:
                if key.fileobj == agent_fd:
                    os._exit(0)
                try:
                    conn, _ = key.fileobj.accept()
                except OSError:
                    continue
                _nodelay(conn)
                address = _unix_address(socket_dir, listeners[key.fileobj], dir_fd)
                threading.Thread(target=_inside_connect, args=(conn, address), daemon=True).start()


def _inside_connect(conn: socket.socket, address: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(address)
    except OSError as exc:
        print(f"netbridge: {address}: {exc}", file=sys.stderr, flush=True)
        upstream.close()
        conn.close()
        return
    _Relay(conn, upstream).start()


def inside(socket_dir: Path, ports: list[int], argv: list[str]) -> None:
    """Start the forwarder, wait until it listens, exec argv (never returns)."""
    agent_pid = os.getpid()
    ready_r, ready_w = os.pipe()
    middle = os.fork()
    if middle == 0:  # double fork: the forwarder's parent becomes the sandbox's init, not the agent
        try:
            os.close(ready_r)
            os.setsid()  # out of the agent's process group: its `kill 0` does not reach the forwarder
            if os.fork() == 0:
                _forward(socket_dir, ports, ready_w, agent_pid)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.waitpid(middle, 0)
    answer = b""
    while chunk := os.read(ready_r, 4096):
        answer += chunk
    os.close(ready_r)
    if answer != b"ok":
        print(answer.decode(errors="replace") or "netbridge: the forwarder did not start", file=sys.stderr)
        sys.exit(FORWARDER_FAILED)
    # What Python itself set up must not leak into the agent: ignored dispositions survive exec.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:  # as a shell would say it
        print(f"netbridge: {argv[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(126 if exc.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR) else 127)


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="side", required=True)
    run = sub.add_parser("inside", help="forward 127.0.0.1:PORT to SOCKET_DIR/PORT.sock, then exec the command")
    run.add_argument("--socket-dir", required=True, type=Path)
    run.add_argument("--port", type=int, action="append", default=[])
    run.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(args)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command to run after --")
    inside(options.socket_dir, options.port, command)


if __name__ == "__main__":
    main()
