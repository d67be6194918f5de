"""The agent's network: isolated by default (only its grader, its gateway and allowed ports, bridged in from the
host's loopback at the same address), the host's with sandbox.network: host.

Through the real runner and the real sandbox where bubblewrap can create one (skipped otherwise), plus the bridge
on its own: half-close, many connections at once, long socket paths, the agent's exit status and signals.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlbench.fileio.jsonio import read_json
from rlbench.sandbox.netbridge import HostBridge
from rlbench.agent_run.runner import run_agent
from rlbench.sandbox.bubblewrap import (
    NetworkPolicy,
    bubblewrap_available,
    network_namespace_available,
    network_policy,
    plan,
)
from support.runs import spec_for

BWRAP_OK, BWRAP_WHY = bubblewrap_available()
NETNS_OK, NETNS_WHY = network_namespace_available() if BWRAP_OK else (False, BWRAP_WHY)
needs_netns = pytest.mark.skipif(not NETNS_OK, reason=f"bubblewrap cannot isolate the network here: {NETNS_WHY}")
TRICKLE_CHUNKS, TRICKLE_EVERY_S = 6, 0.5

# Run by the agent in the sandbox: what it can reach, with timings, as JSON in code/net.json.
PROBE = r"""
import json, os, socket, sys, time, urllib.request
gateway, other, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
result = {}

def timed(name, fn):
    start = time.monotonic()
    try:
        result[name] = {"ok": True, "value": fn()}
    except Exception as exc:
        result[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result[name]["s"] = round(time.monotonic() - start, 3)

url = os.environ["GRADING_SERVER_URL"]
result["grader_url"] = url
timed("grader", lambda: urllib.request.urlopen(url + "/health", timeout=30).status)
timed("gateway", lambda: urllib.request.urlopen(f"http://127.0.0.1:{gateway}/hello", timeout=30).read().decode())

def stream():
    start, arrivals = time.monotonic(), []
    with urllib.request.urlopen(f"http://127.0.0.1:{gateway}/stream", timeout=30) as response:
        while line := response.readline():
            arrivals.append([line.decode().strip(), round(time.monotonic() - start, 3)])
    return arrivals
timed("stream", stream)
timed("other", lambda: socket.create_connection(("127.0.0.1", other), timeout=20).close())
timed("web", lambda: urllib.request.urlopen("https://huggingface.co", timeout=5).status)
timed("dns", lambda: socket.getaddrinfo("pypi.org", 443))
timed("route", lambda: socket.create_connection(("1.1.1.1", 443), timeout=5).close())  # no DNS needed


def hub():
    os.environ["HF_HUB_OFFLINE"] = "0"
    from huggingface_hub import snapshot_download
    return snapshot_download("gpt2", cache_dir=os.path.join(os.environ["WORKSPACE"], "hub-cache"))
timed("hub", hub)
json.dump(result, open(out, "w"), indent=1)
"""


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A stand-in for the LLM gateway: a short answer, and a streamed one that trickles in for a few seconds."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        if self.path == "/stream":  # server-sent-events style: one line every TRICKLE_EVERY_S, then close
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(TRICKLE_CHUNKS):
                self.wfile.write(f"data: {i}\n".encode())
                self.wfile.flush()
                time.sleep(TRICKLE_EVERY_S)
            return
        body = b"hello from the gateway"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def other_listener():
    """A host loopback service the agent must not reach (another run's grader, say)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def probe_run(workspace, tiny_model, gsm8k_data, gateway: int, other: int, network: str):
    probe = workspace / "code" / "probe.py"
    probe.write_text(PROBE)
    out = workspace / "code" / "net.json"
    spec = spec_for(
        workspace,
        tiny_model,
        gsm8k_data,
        ["{python}", str(probe), str(gateway), str(other), str(out)],
        sandbox_backend="bubblewrap",
        time_limit_s=120,
        network=network,
    )
    spec.agent["network"] = {"allow_ports": [gateway]}
    record = run_agent(spec)
    log = (workspace / "agent.log").read_text()
    assert record.status == "completed", log
    return record, json.loads(out.read_text()), read_json(workspace.parent / "run.json")


@needs_netns
@pytest.mark.sandbox
def test_isolated_agent_reaches_its_grader_and_gateway_and_nothing_else(
    workspace, tiny_model, gsm8k_data, gateway, other_listener
):
    record, seen, run = probe_run(workspace, tiny_model, gsm8k_data, gateway, other_listener, "isolated")
    assert seen["grader"] == {"ok": True, "value": 200, "s": seen["grader"]["s"]}, seen
    assert seen["gateway"]["value"] == "hello from the gateway", seen
    # Streamed: each line arrives as it is sent, not all at once at the end.
    arrivals = seen["stream"]["value"]
    assert [line for line, _ in arrivals] == [f"data: {i}" for i in range(TRICKLE_CHUNKS)], seen
    assert arrivals[-1][1] - arrivals[0][1] >= (TRICKLE_CHUNKS - 2) * TRICKLE_EVERY_S, arrivals
    # Everything else: refused or unresolvable, at once.
    assert not seen["other"]["ok"] and "ConnectionRefused" in seen["other"]["error"], seen["other"]
    assert seen["other"]["s"] < 2, seen["other"]
    for name in ("web", "dns", "route", "hub"):
        assert not seen[name]["ok"] and seen[name]["s"] < 10, (name, seen[name])
    assert "name resolution" in seen["dns"]["error"] and "unreachable" in seen["route"]["error"], seen
    grader_port = int(seen["grader_url"].split(":")[2].split("/")[0])
    network = run["network"]
    assert network["isolated"] is True and record.network == network
    assert network["reachable"] == [
        f"127.0.0.1:{grader_port} (grader)",
        f"127.0.0.1:{gateway} (allowed by the agent's config)",
    ]
    assert "network isolated" in run["sandbox_note"] and run["stray_processes"] == 0  # the forwarder died with it
    assert not (workspace.parent / "net").exists()  # the bridge's sockets are gone with the run


@needs_netns
@pytest.mark.sandbox
def test_host_network_restores_the_shared_network(workspace, tiny_model, gsm8k_data, gateway, other_listener):
    _, seen, run = probe_run(workspace, tiny_model, gsm8k_data, gateway, other_listener, "host")
    assert seen["grader"]["ok"] and seen["gateway"]["ok"], seen
    assert seen["other"]["ok"], seen["other"]  # what the host reaches, the agent reaches
    assert run["network"]["isolated"] is False and run["network"]["reachable"] == ["*"]
    assert "shared with the host" in run["network"]["note"] and "network shared" in run["sandbox_note"]


def test_backend_none_cannot_isolate_and_says_so(tmp_path):
    policy = NetworkPolicy({12345: "grader"}, tmp_path / "net")
    unsandboxed = plan(["true"], tmp_path, hidden=[], readonly_inside=[], backend="none", network=policy)
    assert unsandboxed.argv == ["true"] and unsandboxed.policy is None
    assert unsandboxed.network["isolated"] is False and unsandboxed.network["reachable"] == ["*"]
    assert "NETWORK NOT ISOLATED" in unsandboxed.note
    with unsandboxed.bridge():  # nothing to hold
        assert not (tmp_path / "net").exists()


def test_network_policy_from_config():
    assert network_policy("host", Path("/x"), {1234: "grader"}) is None
    policy = network_policy("isolated", Path("/x/net"), {40000: "grader", 40001: "LLM gateway"}, extra=[40000, 3141])
    assert policy.reachable() == [
        "127.0.0.1:40000 (grader)",
        "127.0.0.1:40001 (LLM gateway)",
        "127.0.0.1:3141 (allowed by the agent's config)",
    ]
    with pytest.raises(ValueError, match="sandbox.network"):
        network_policy("open", Path("/x"), {})
    with pytest.raises(RuntimeError, match="1024"):
        plan(["true"], Path("/x"), [], [], backend="none", network=NetworkPolicy([80], Path("/x/net")))


# --- the bridge itself --------------------------------------------------------------------------------------


class _EchoAfterEof(threading.Thread):
    """A host service that reads its request to EOF (the client's half-close), then answers with its SHA-256 and
    its length, and closes: proof that half-close and the bytes both ways pass through."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    @staticmethod
    def serve(conn):
        with conn:
            digest, size = hashlib.sha256(), 0
            while chunk := conn.recv(1 << 16):
                digest.update(chunk)
                size += len(chunk)
            conn.sendall(f"{digest.hexdigest()} {size}\n".encode())


@pytest.fixture
def echo():
    server = _EchoAfterEof()
    server.start()
    yield server.port
    server.sock.close()


def _half_close_exchange(connect, payload: bytes) -> str:
    with connect() as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer.decode()


def test_host_bridge_relays_with_half_close_and_cleans_up(tmp_path, echo):
    # A run directory deep enough that its socket paths exceed sun_path (108 bytes): still bridged.
    socket_dir = tmp_path / ("d" * 60) / ("e" * 60) / "net"
    payload = os.urandom(3 << 20)
    expected = f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n"
    with HostBridge(socket_dir, [echo]) as bridge:
        assert oct(socket_dir.stat().st_mode & 0o777) == "0o700"
        address = str(socket_dir / f"{echo}.sock")
        dir_fd = os.open(socket_dir, os.O_RDONLY)

        def connect():
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(f"/proc/self/fd/{dir_fd}/{echo}.sock" if len(address) > 107 else address)
            return sock

        results = []
        threads = [
            threading.Thread(target=lambda: results.append(_half_close_exchange(connect, payload))) for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        os.close(dir_fd)
        assert results == [expected] * 8 and bridge.connections == 8
    assert not socket_dir.exists()


INSIDE_CLIENT = r"""
import hashlib, os, socket, sys, threading
port, count, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
payload = os.urandom(size)
expected = f"{hashlib.sha256(payload).hexdigest()} {size}\n"
answers = []


def one():
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    answers.append(answer.decode() == expected)
threads = [threading.Thread(target=one) for _ in range(count)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(answers), "of", count)
try:
    os.wait()
    print("a child to wait for")
except ChildProcessError:
    print("no children")
"""


def sandboxed(argv, tmp_path, ports=(), **kwargs) -> subprocess.CompletedProcess:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    the_plan = plan(
        argv,
        workspace,
        hidden=[],
        readonly_inside=[],
        backend="bubblewrap",
        visible=[Path(sys.prefix), Path(sys.base_prefix)],
        network=NetworkPolicy(list(ports), tmp_path / "net"),
    )
    with the_plan.bridge():
        return subprocess.run(the_plan.argv, cwd=workspace, capture_output=True, text=True, timeout=120, **kwargs)


@needs_netns
@pytest.mark.sandbox
def test_many_concurrent_connections_with_half_close_through_the_sandbox(tmp_path, echo):
    done = sandboxed([sys.executable, "-c", INSIDE_CLIENT, str(echo), "40", str(1 << 20)], tmp_path, [echo])
    assert done.returncode == 0, done.stderr
    # Every answer intact; the forwarder is not a child the agent could wait for.
    assert done.stdout.split("\n")[:2] == ["40 of 40", "no children"], done.stdout + done.stderr


@needs_netns
@pytest.mark.sandbox
def test_agent_exit_status_and_signals_pass_through_the_bridge(tmp_path, echo):
    assert sandboxed(["bash", "-c", "exit 7"], tmp_path, [echo]).returncode == 7
    assert sandboxed(["bash", "-c", "kill -TERM $$"], tmp_path, [echo]).returncode == 128 + 15
    missing = sandboxed(["no-such-binary-4711"], tmp_path, [echo])
    assert missing.returncode == 127 and "no-such-binary-4711" in missing.stderr
    # Python's own ignored signals (SIGPIPE, SIGXFSZ) do not leak into the agent through exec.
    ignored = sandboxed(["grep", "SigIgn", "/proc/self/status"], tmp_path, [echo]).stdout
    assert ignored == subprocess.run(["grep", "SigIgn", "/proc/self/status"], capture_output=True, text=True).stdout
    # No port bridged: the agent still runs, with its own loopback only.
    assert sandboxed(["true"], tmp_path, []).returncode == 0


@needs_netns
@pytest.mark.sandbox
def test_socket_directory_is_read_only_inside(tmp_path, echo):
    script = f"touch {tmp_path / 'net' / 'x'} 2>&1; ls {tmp_path / 'net'}"
    done = sandboxed(["bash", "-c", script], tmp_path, [echo])
    assert "Read-only file system" in done.stdout and f"{echo}.sock" in done.stdout, done.stdout + done.stderr


EARLY_ANSWER_CLIENT = r"""
import socket, sys
port, rounds = int(sys.argv[1]), int(sys.argv[2])
got = 0
for _ in range(rounds):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        try:
            for _ in range(32):
                conn.sendall(b"x" * (1 << 20))
        except OSError:
            pass  # the server answered and closed before the body was sent
        data = b""
        try:
            while block := conn.recv(1 << 16):
                data += block
        except OSError:
            pass
    got += data.startswith(b"HTTP/1.1 413")
print(got, "of", rounds)
"""


@needs_netns
@pytest.mark.sandbox
def test_an_early_answer_to_a_huge_upload_is_not_lost(tmp_path):
    """A server that answers (413) after the first bytes of a huge body and closes with the rest unread (the
    kernel then resets the connection): the answer still reaches the agent, as it does without the bridge."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(1 << 16)
                conn.sendall(b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    port = server.getsockname()[1]
    try:
        done = sandboxed([sys.executable, "-c", EARLY_ANSWER_CLIENT, str(port), "10"], tmp_path, [port])
    finally:
        server.close()
    assert done.stdout.strip() == "10 of 10", done.stdout + done.stderr


CONNECT_UNIX = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
    print("connected", s.recv(16).decode())
except OSError as error:
    print("refused", type(error).__name__)
"""


@needs_netns
@pytest.mark.sandbox
def test_host_unix_sockets_under_run_are_hidden_from_an_isolated_agent(tmp_path, echo):
    """A network namespace does not cover file-system sockets: a host daemon's socket under /run (D-Bus, a
    database, docker.sock) must not be reachable from the sandbox."""
    directory = Path("/run") / f"rlbench-test-{os.getpid()}"
    try:
        directory.mkdir()
    except OSError as error:
        pytest.skip(f"cannot create a socket under /run here ({error}); run the tests as root")
    path = directory / "daemon.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen(4)
        threading.Thread(target=lambda: [c.sendall(b"host daemon") for c, _ in iter(server.accept, None)],
                         daemon=True).start()
        probe = [sys.executable, "-c", CONNECT_UNIX, str(path)]
        assert subprocess.run(probe, capture_output=True, text=True).stdout.startswith("connected host daemon")
        inside = sandboxed(probe, tmp_path, [echo])
        assert inside.stdout.startswith("refused"), inside.stdout + inside.stderr
    finally:
        server.close()
        path.unlink(missing_ok=True)
        directory.rmdir()


def test_host_bridge_caps_open_connections_and_the_threads_they_cost(tmp_path):
    """2,000 idle connections (issue 26, item 4: 1,500 of them cost the runner 3,007 threads and 4,515
    descriptors): past the cap each is closed at once, the runner's threads stay bounded, and a connection
    closed by the agent frees its place."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 5000:
        pytest.skip(f"2,000 connections need more descriptors than the hard limit ({hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)) if hard != resource.RLIM_INFINITY else 8192, hard))
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held = []

    def accept_all() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # the server closed at the end of the test
                return

    threading.Thread(target=accept_all, daemon=True).start()
    cap = 64
    threads_before = threading.active_count()
    clients = []
    try:
        with HostBridge(tmp_path / "net", [port], max_connections=cap) as bridge:
            for _ in range(2000):
                sock = socket.socket(socket.AF_UNIX)
                sock.connect(str(tmp_path / "net" / f"{port}.sock"))
                clients.append(sock)
            deadline = time.time() + 60
            while bridge.connections + bridge.refused < 2000 and time.time() < deadline:
                time.sleep(0.1)
            assert (bridge.connections, bridge.refused) == (cap, 2000 - cap)
            assert threading.active_count() - threads_before <= 2 * cap + 2, threading.active_count()
            # The refused ones see their connection closed; the relayed ones stay open.
            clients[-1].settimeout(10)
            assert clients[-1].recv(1) == b""
            clients[0].settimeout(0.2)
            with pytest.raises(socket.timeout):
                clients[0].recv(1)
            # Connections that end (both sides closed) free their places.
            for sock in clients + held:
                sock.close()
            clients, held[:] = [], []
            deadline = time.time() + 20
            while bridge._live and time.time() < deadline:
                time.sleep(0.05)
            assert not bridge._live
            late = socket.socket(socket.AF_UNIX)
            late.connect(str(tmp_path / "net" / f"{port}.sock"))
            clients.append(late)
            deadline = time.time() + 10
            while bridge.connections < cap + 1 and time.time() < deadline:
                time.sleep(0.05)
            assert bridge.connections == cap + 1 and bridge.refused == 2000 - cap
    finally:
        for sock in clients + held:
            sock.close()
        server.close()
