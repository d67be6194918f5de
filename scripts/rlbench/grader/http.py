"""The grading API (FastAPI): POST /submit, GET /time, GET /health under a per-run secret prefix.

The secret is the first path segment of GRADING_SERVER_URL, so agents written for the reference
harness (`curl -X POST "$GRADING_SERVER_URL/submit" -d '{"model_path": ...}'`) work unchanged.
What each request is answered, and what is recorded, is the grader's (rlbench.grader.grading); here
are the HTTP concerns only. Bodies are read incrementally and refused over MAX_BODY_BYTES (413
request_too_large); grader errors carry a Retry-After header. Paths are normalised before routing
("//submit", "/submit/"), so clients that join URLs sloppily work.

Connections are bounded in time (GuardedH11Protocol, uvicorn's h11 protocol with deadlines): a
request's line and headers must arrive within HEADER_TIMEOUT_S, its declared body within
BODY_TIMEOUT_S (408 request_timeout, and closed), an idle keep-alive connection is closed after
IDLE_TIMEOUT_S, and a request line without an HTTP version (HTTP/0.9) is answered 400 at once.
A stalled client holds nothing but its own socket: the server answers the others meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from http import HTTPStatus

import h11
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from rlbench.grader.grading import RETRY_AFTER_S, Grader
from rlbench.grader.submission import SubmissionRefused

# A submission is a small JSON object; anything much bigger is a mistake (or an attack on memory).
MAX_BODY_BYTES = 64 * 1024
# An oversized body up to this size is read to its end and dropped before the 413 is sent: closing
# a connection with unread data resets it, and the client would see the reset, not the answer.
DRAIN_MAX_BYTES = 1 << 20
# How long a connection may take (seconds; GradingServer reads these when it is made, through
# connection_timeouts). An agent's client on the loopback sends a request in milliseconds: these
# only end connections that stall, partial heads and bodies that would otherwise be held forever.
# A request's line and headers, from its first byte (from the connection's opening for the first):
HEADER_TIMEOUT_S = 15.0
# Its declared body (Content-Length bytes, or chunks up to the last one), from the end of the head;
# a huge chunk size that is never filled ends here too (past DRAIN_MAX_BYTES it is a 413 at once):
BODY_TIMEOUT_S = 30.0
# A keep-alive connection that sends nothing after an answer (uvicorn's timeout_keep_alive default):
IDLE_TIMEOUT_S = 5.0
# A request line as h11 accepts it, loosely (h11 checks the details once the head is complete): method,
# target, HTTP version. One without a version is HTTP/0.9's, whose client sends no blank line after it.
_REQUEST_LINE = re.compile(rb"\S+ \S+ HTTP/[0-9]\.[0-9]")


@dataclass(frozen=True)
class ConnectionTimeouts:
    """Seconds a connection may take: see HEADER_TIMEOUT_S, BODY_TIMEOUT_S, IDLE_TIMEOUT_S."""

    header_s: float
    body_s: float
    idle_s: float


def connection_timeouts() -> ConnectionTimeouts:
    """The module's timeouts as they are now (a test shortens them before it starts a server)."""
    return ConnectionTimeouts(HEADER_TIMEOUT_S, BODY_TIMEOUT_S, IDLE_TIMEOUT_S)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 connection with deadlines, so that no client holds a connection forever.

    A connection awaiting a request's head (open, or bytes of a new request arrived) must complete
    it within header_s; a request with a body must send it within body_s: else 408 request_timeout
    (a JSON answer, as the API's others) and closed; a connection that opened and sent nothing is
    just closed. A first line without an HTTP version is answered 400 bad_request_line at once. The
    idle keep-alive connection is uvicorn's (timeout_keep_alive: idle_s, GradingServer sets it).
    Everything runs on the server's event loop, never blocking it: others are answered meanwhile.
    An answer the application gives after a 408 goes nowhere, and a body read ends (ClientDisconnect):
    an unfinished submission is not recorded, as one whose client left."""

    def __init__(self, *args, timeouts: ConnectionTimeouts, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeouts = timeouts
        self._deadline: asyncio.TimerHandle | None = None
        self._awaiting: str | None = None  # "head" or "body": what the deadline is for

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._await(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already buffered
        self._watch()

    def _watch(self) -> None:
        """Set the deadline for what the connection now awaits from the client."""
        if self.transport.is_closing():
            self._await(None)
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            buffered = self.conn.trailing_data[0]
            if not buffered:
                return  # between requests: uvicorn's keep-alive timeout (or the first head's deadline) runs
            line, newline, _ = buffered.partition(b"\n")
            if newline and not _REQUEST_LINE.fullmatch(line.removesuffix(b"\r")):
                self._refuse(
                    400,
                    "bad_request_line",
                    "the request line has no HTTP version (an HTTP/0.9 request, or not HTTP): send HTTP/1.1 "
                    'requests, e.g. curl -X POST "$GRADING_SERVER_URL/submit" -d \'{"model_path": "output/v1"}\'',
                )
                return
            if self._awaiting != "head":
                self._await("head")
        elif state is h11.SEND_BODY:
            if self._awaiting != "body":
                self._await("body")
        else:
            self._await(None)  # the request is complete (or the connection is done with HTTP)

    def _await(self, what: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._awaiting = what
        if what is not None:
            seconds = self.timeouts.header_s if what == "head" else self.timeouts.body_s
            self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _timed_out(self) -> None:
        what, self._awaiting, self._deadline = self._awaiting, None, None
        if self.transport.is_closing():
            return
        if what == "head":
            if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                self.transport.close()  # opened and sent nothing: there is no request to answer
                return
            self._refuse(
                408,
                "request_timeout",
                f"the request line and headers did not arrive within {self.timeouts.header_s:g} s: "
                "send each request whole, at once",
            )
        elif self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # answered already (a 404 or 413 that read no body): nothing to add
        else:
            self._refuse(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.timeouts.body_s:g} s: send the whole body "
                "with the request, exactly as long as its Content-Length says (or chunked, up to the 0-size chunk)",
            )

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer status with the API's JSON error body and close; the application, if it is still
        reading the request, reads a disconnect and answers no one."""
        body = json.dumps({"error": message, "reason": reason}).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self._await(None)
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()


def parse_payload(body: bytes) -> object:
    """The request's JSON, whatever the content type says (`curl -d` sends form-encoded headers).

    The reference's CLI wrappers show the submit command with escaped quotes
    ('{\\"model_path\\": ...}'), which a shell passes on verbatim: that body is read as meant.
    None when the body is not JSON (refused as malformed, and recorded): that includes JSON the
    parser gives up on, nested too deeply (RecursionError) or with an over-long integer (ValueError).
    """
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        pass
    try:
        text = body.decode()
        if '\\"' in text:
            payload = json.loads(text.replace('\\"', '"'))
            return payload if isinstance(payload, dict) else None
    except (ValueError, RecursionError):
        pass
    return None


class BodyTooLarge(Exception):
    """The request body is over MAX_BODY_BYTES; `drained` when it was read to its end."""

    def __init__(self, size: int, drained: bool):
        super().__init__(size)
        self.size, self.drained = size, drained


async def read_body(request: Request, limit: int = MAX_BODY_BYTES, drain: int = DRAIN_MAX_BYTES) -> bytes:
    """The body, read chunk by chunk and never held beyond `limit` bytes.

    Raises BodyTooLarge when the declared Content-Length or the bytes actually sent (chunked, or
    more than declared) exceed the limit; a body up to `drain` bytes is read to its end first so
    that the client, still sending, can read the 413. ClientDisconnect when the client left."""
    try:  # h11 has already refused malformed lengths; this only guards against surprises
        declared = int(request.headers.get("content-length", "0"))
    except ValueError:
        declared = 0
    if declared > drain:
        raise BodyTooLarge(declared, drained=False)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > drain:
            raise BodyTooLarge(size, drained=False)
        if size <= limit:
            chunks.append(chunk)
    if size > limit or declared > limit:
        raise BodyTooLarge(max(size, declared), drained=True)
    return b"".join(chunks)


class NormalizePath:
    """ASGI middleware: repeated slashes collapse and a trailing slash goes, before routing.

    `$GRADING_SERVER_URL/` + `/submit` and `.../submit/` then reach /submit (no 404, no redirect
    that curl would not follow); the secret is still checked as the first segment."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "/")
            normal = "/" + "/".join(segment for segment in path.split("/") if segment)
            if normal != path:
                scope = {**scope, "path": normal}
        await self.app(scope, receive, send)


def respond(status: int, body: dict, close: bool = False) -> JSONResponse:
    """A /submit answer; grader errors carry Retry-After, cut-off bodies close the connection."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if body.get("retryable") else {}
    if close:
        headers["Connection"] = "close"
    return JSONResponse(status_code=status, content=body, headers=headers)


def create_app(grader: Grader) -> FastAPI:
    app = FastAPI(title="Agent² RL-Bench grading server", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(NormalizePath)
    secret = grader.config.secret

    def check(token: str) -> None:
        if token != secret:
            raise HTTPException(status_code=404, detail="unknown path: use GRADING_SERVER_URL as given")

    @app.post("/{token}/submit")
    async def submit(token: str, request: Request):
        check(token)
        try:
            body = await read_body(request)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is left to answer, and nothing was submitted
        except BodyTooLarge as too_large:
            refusal = SubmissionRefused(
                413,
                "request_too_large",
                f"the request body is {too_large.size} bytes; the limit is {MAX_BODY_BYTES} bytes. "
                'Send only {"model_path": "output/v1"} (and "gpu"), never the model itself',
            )
            status, response = await run_in_threadpool(grader.submit, None, refusal)
            return respond(status, response, close=not too_large.drained)
        payload = parse_payload(body)
        status, response = await run_in_threadpool(grader.submit, payload)
        return respond(status, response)

    @app.get("/{token}/time")
    def time_endpoint(token: str):
        check(token)
        return grader.time_info()

    @app.get("/{token}/health")
    def health(token: str):
        check(token)
        return grader.health()

    return app
