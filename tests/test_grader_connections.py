"""Connections the grading server does not hold open forever (issue 25, item 8), over real sockets.

A request whose line and headers never complete, a body that never arrives in full (a declared
length or a huge chunk size), an HTTP/0.9 request line (no version: its client never sends the
blank line that ends a head), a connection that sends nothing: each is answered (408 or 400) and
closed, or just closed, within the server's timeouts, and the server answers other clients
meanwhile. The timeouts are shortened here (module constants of rlbench.grader.http, read when
a GradingServer is made), so that each test takes seconds.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
import requests

from rlbench.grader import http as grader_http
from support.grader import assert_consistent, strict_json

# Slack on top of a timeout before a test calls the connection held: a loaded two-core machine.
SLACK_S = 4.0


def set_timeouts(monkeypatch, header: float = 30.0, body: float = 30.0, idle: float = 30.0) -> None:
    """Timeouts for the servers started from now on (raising=False: the test runs, and fails on the
    behaviour, where the constants do not exist yet)."""
    monkeypatch.setattr(grader_http, "HEADER_TIMEOUT_S", header, raising=False)
    monkeypatch.setattr(grader_http, "BODY_TIMEOUT_S", body, raising=False)
    monkeypatch.setattr(grader_http, "IDLE_TIMEOUT_S", idle, raising=False)


def connect(server) -> socket.socket:
    parts = urlsplit(server.url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, bool, float]:
    """(what the server sent, whether it closed the connection, seconds until it did) within limit_s."""
    started = time.monotonic()
    sock.settimeout(0.2)
    data = b""
    while time.monotonic() - started < limit_s:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data, True, time.monotonic() - started
        if not chunk:
            return data, True, time.monotonic() - started
        data += chunk
    return data, False, time.monotonic() - started


def status_and_body(reply: bytes) -> tuple[int, bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def recv_response(sock) -> bytes:
    """One whole HTTP response: the server may send its head and body in separate writes, so one recv
    can return the head alone."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(65536)
        if not chunk:
            return reply
        reply += chunk
    head_part, _, body = reply.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head_part.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
        reply += chunk
    return reply


def head(server, method: str, path: str, *headers: str) -> bytes:
    secret = server.grader.config.secret
    lines = [f"{method} /{secret}/{path} HTTP/1.1", "Host: grader", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- stalled requests are answered and closed -------------------------------------------------------
def test_partial_head_is_answered_408_and_closed(workspace, start_grader, monkeypatch):
    set_timeouts(monkeypatch, header=1.0)
    server = start_grader(workspace)
    with connect(server) as sock:
        sock.sendall(f"POST /{server.grader.config.secret}/submit HTTP/1.1\r\nHost: grader\r\nContent-Le".encode())
        reply, closed, seconds = read_until_closed(sock, 1.0 + SLACK_S)
    assert closed, f"a partial head was held open {seconds:.1f} s: {reply!r}"
    status, body = status_and_body(reply)
    assert status == 408 and strict_json(body)["reason"] == "request_timeout", reply
    assert_consistent(server)  # nothing was submitted, nothing recorded


@pytest.mark.parametrize(
    "headers, sent",
    [
        (("Content-Type: application/json", "Content-Length: 100"), b'{"model_path": '),
        (("Content-Type: application/json", "Transfer-Encoding: chunked"), b"fffffffff\r\nab"),
        (("Content-Type: application/json", "Transfer-Encoding: chunked"), b"5\r\n{\"mod"),
    ],
    ids=["declared-length", "huge-chunk-size", "chunk-cut-short"],
)
def test_partial_body_is_answered_408_and_closed(workspace, start_grader, monkeypatch, headers, sent):
    set_timeouts(monkeypatch, body=1.0)
    server = start_grader(workspace)
    with connect(server) as sock:
        sock.sendall(head(server, "POST", "submit", *headers) + sent)
        reply, closed, seconds = read_until_closed(sock, 1.0 + SLACK_S)
    assert closed, f"a partial body was held open {seconds:.1f} s: {reply!r}"
    status, body = status_and_body(reply)
    assert status == 408 and strict_json(body)["reason"] == "request_timeout", reply
    assert "body" in strict_json(body)["error"]
    assert_consistent(server)  # the submission never arrived: not recorded


def test_http09_request_line_is_answered_400_at_once(workspace, start_grader, monkeypatch):
    """No HTTP version: its client waits for an answer after one line, and never sends a blank line."""
    set_timeouts(monkeypatch, header=60.0)
    server = start_grader(workspace)
    with connect(server) as sock:
        sock.sendall(f"GET /{server.grader.config.secret}/health\r\n".encode())
        reply, closed, seconds = read_until_closed(sock, SLACK_S)
    assert closed, f"an HTTP/0.9 request line was held open {seconds:.1f} s: {reply!r}"
    status, body = status_and_body(reply)
    assert status == 400 and strict_json(body)["reason"] == "bad_request_line", reply
    assert "HTTP/1.1" in strict_json(body)["error"]


def test_silent_and_idle_connections_are_closed(workspace, start_grader, monkeypatch):
    set_timeouts(monkeypatch, header=1.0, idle=1.0)
    server = start_grader(workspace)
    with connect(server) as silent:
        reply, closed, seconds = read_until_closed(silent, 1.0 + SLACK_S)
    assert closed and reply == b"", f"a connection that sent nothing was held open {seconds:.1f} s"
    with connect(server) as idle:  # a keep-alive connection after its answer
        idle.sendall(head(server, "GET", "health"))
        reply, closed, seconds = read_until_closed(idle, 1.0 + SLACK_S)
    assert closed, f"an idle keep-alive connection was held open {seconds:.1f} s"
    assert status_and_body(reply)[0] == 200


# -- valid requests are served as before --------------------------------------------------------
def test_slow_but_timely_requests_and_keep_alive_are_served(workspace, start_grader, monkeypatch):
    """A head and a body each sent in pieces within their timeouts, then a second request on the same
    connection before the idle timeout: all answered, the connection kept."""
    set_timeouts(monkeypatch, header=3.0, body=3.0, idle=3.0)
    server = start_grader(workspace)
    payload = json.dumps({"model_path": "output/nope"}).encode()
    request = head(server, "POST", "submit", "Content-Type: application/json", f"Content-Length: {len(payload)}")
    with connect(server) as sock:
        sock.sendall(request[:20])
        time.sleep(1.0)
        sock.sendall(request[20:] + payload[:5])
        time.sleep(1.0)
        sock.sendall(payload[5:])
        sock.settimeout(10)
        reply = recv_response(sock)
        assert status_and_body(reply)[0] == 404 and b"missing_path" in reply, reply
        time.sleep(1.0)
        sock.sendall(head(server, "GET", "health"))
        reply = recv_response(sock)
        assert status_and_body(reply)[0] == 200, reply
    entries = assert_consistent(server)
    assert [e["reason"] for e in entries] == ["missing_path"]


def test_stalled_connections_do_not_hold_up_other_clients(workspace, start_grader, monkeypatch):
    set_timeouts(monkeypatch, header=60.0, body=60.0, idle=60.0)
    server = start_grader(workspace)
    stalled = []
    try:
        for i in range(20):
            sock = connect(server)
            if i % 2:
                sock.sendall(b"POST /x/submit HTTP/1.1\r\nHost: gra")
            else:
                sock.sendall(head(server, "POST", "submit", "Content-Length: 1000") + b"{")
            stalled.append(sock)
        started = time.monotonic()
        health = requests.get(f"{server.url}/health", timeout=10)
        assert health.status_code == 200 and time.monotonic() - started < 5
        response = requests.post(f"{server.url}/submit", json={"model_path": "output/nope"}, timeout=10)
        assert response.status_code == 404 and response.json()["reason"] == "missing_path"
    finally:
        for sock in stalled:
            sock.close()
    assert_consistent(server)
