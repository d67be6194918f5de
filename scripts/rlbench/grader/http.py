"""The grading API (FastAPI): POST /submit, GET /time, GET /health under a per-run secret prefix.

The secret is the first path segment of GRADING_SERVER_URL, so agents written for the reference
harness (`curl -X POST "$GRADING_SERVER_URL/submit" -d '{"model_path": ...}'`) work unchanged.
What each request is answered, and what is recorded, is the grader's (rlbench.grader.grading); here
are the HTTP concerns only. Bodies are read incrementally and refused over MAX_BODY_BYTES (413
request_too_large); grader errors carry a Retry-After header. Paths are normalised before routing
("//submit", "/submit/"), so clients that join URLs sloppily work.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from rlbench.grader.grading import RETRY_AFTER_S, Grader
from rlbench.grader.submission import SubmissionRefused

# A submission is a small JSON object; anything much bigger is a mistake (or an attack on memory).
MAX_BODY_BYTES = 64 * 1024
# An oversized body up to this size is read to its end and dropped before the 413 is sent: closing
# a connection with unread data resets it, and the client would see the reset, not the answer.
DRAIN_MAX_BYTES = 1 << 20


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
