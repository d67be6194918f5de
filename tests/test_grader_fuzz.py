"""Property-based fuzzing of the grading API over real HTTP to a live GradingServer.

Hypothesis generates request bodies (random bytes, arbitrary JSON with deep nesting and huge
strings, valid-looking submissions with odd model_path/gpu values, sizes around and above the
body limit), URL paths (secret or not, repeated slashes, percent-encoding, trailing slashes),
methods and HTTP framing sent over a raw socket (Content-Length wrong, missing, huge or invalid,
chunked, both, oversized headers). Properties:

* no response is a 5xx (a bad request is never the grader's failure), every JSON response is
  strict JSON in UTF-8, and a response comes back whenever the request was complete;
* afterwards every ledger line is strict JSON, there is one per /health `requests`, none is
  pending, every answered submission id is in the ledger and vice versa, and scores.json is
  ledger.reference_view of the ledger.

Only the base model (a copy in output/base, and models/<hf_id>) is ever a valid checkpoint: it
is cached, so no evaluation runs and the fuzzing stays fast. The default run is derandomized (a
fixed seed: reproducible in CI) and sized for a minute or two on a loaded two-core machine; the
`slow`-marked variant sends about four times as many requests. The figures (requests sent, responses by status class, 5xx count) are printed
and, when RLBENCH_FIGURES_DIR is set, written to $RLBENCH_FIGURES_DIR/fuzz.json.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlbench.grader.http import DRAIN_MAX_BYTES, MAX_BODY_BYTES
from rlbench.recording.ledger import reference_view

GPUS = ["0", "1"]
SURROGATES = ["\ud800", "\udbff", "\udc80", "\udfff"]
REASONS = {
    "malformed_request",
    "outside_workspace",
    "invalid_gpu",
    "deadline_passed",
    "request_too_large",
    "invalid_path",
    "missing_path",
    "not_a_directory",
    "lora_adapter",
    "pickle_weights",
    "no_safetensors",
    "no_config",
    "bad_config",
    "remote_code",
}


# -- helpers ---------------------------------------------------------------------------------
def strict_json(raw: bytes) -> object:
    """Strict JSON: UTF-8 only, no NaN/Infinity."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(raw.decode("utf-8"), parse_constant=refuse)


@dataclass
class Figures:
    """What the fuzzing sent and got back; `answered_ids` are submission ids seen in responses."""

    sent: int = 0
    by_class: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    answered_ids: set = field(default_factory=set)

    def summary(self, entries: list[dict], seconds: float) -> dict:
        return {
            "requests_sent": self.sent,
            "responses_by_status_class": dict(sorted(self.by_class.items())),
            "5xx": self.by_class.get("5xx", 0),
            "requests_by_kind": dict(sorted(self.by_kind.items())),
            "ledger_entries": len(entries),
            "ledger_reasons": dict(sorted(Counter(e.get("reason") or e.get("status") for e in entries).items())),
            "submissions_in_scores_json": len(reference_view(entries)),
            "seconds": round(seconds, 1),
        }


class Fuzzer:
    """Sends requests to one live server and checks each response."""

    def __init__(self, server):
        self.server = server
        parts = urlsplit(server.url)
        self.host, self.port = parts.hostname, parts.port
        self.secret = server.grader.config.secret
        self.figures = Figures()

    def check(self, kind: str, status: int | None, content_type: str, body: bytes, expected: bool = True) -> None:
        self.figures.sent += 1
        self.figures.by_kind[kind] += 1
        if status is None:
            self.figures.by_class["no response"] += 1
            assert not expected, f"{kind}: no response to a complete request"
            return
        self.figures.by_class[f"{status // 100}xx"] += 1
        assert status < 500, f"{kind}: {status} {body[:500]!r}"
        if content_type.startswith("application/json") and body:
            parsed = strict_json(body)
            if isinstance(parsed, dict) and "submission_id" in parsed:
                self.figures.answered_ids.add(parsed["submission_id"])
                assert parsed.get("reason") in REASONS | {None}, parsed
                assert parsed.get("status") != "grader_error", parsed

    # -- three ways to send --------------------------------------------------------------------
    def post_body(self, body: bytes, content_type: str | None) -> None:
        headers = {"Content-Type": content_type} if content_type is not None else {}
        response = requests.post(f"{self.server.url}/submit", data=body, headers=headers, timeout=60)
        self.check("body", response.status_code, response.headers.get("content-type", ""), response.content)

    def request(self, method: str, path: str, body: bytes | None) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=body)
            response = conn.getresponse()
            data = response.read()
            self.check("path", response.status, response.getheader("content-type", ""), data)
        finally:
            conn.close()

    def raw(self, data: bytes, method: str, expected: bool) -> None:
        """Send bytes as they are; read one response (briefly, when none is due)."""
        with socket.create_connection((self.host, self.port), timeout=60) as sock:
            try:
                sock.sendall(data)
            except OSError:
                pass  # the server may answer (413) and close before all is sent
            sock.settimeout(60 if expected else 0.3)
            response = http.client.HTTPResponse(sock, method=method)
            try:
                response.begin()
                body = response.read()
            except (OSError, http.client.HTTPException):
                self.check("raw", None, "", b"", expected)
                return
            self.check("raw", response.status, response.getheader("content-type", ""), body)


# -- strategies ------------------------------------------------------------------------------
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
odd_text = st.lists(
    st.one_of(st.characters(), st.sampled_from(SURROGATES + ["\x00", "/", "..", "\\", "%", "~", " "])), max_size=30
).map("".join)


def model_paths(workspace: Path) -> st.SearchStrategy:
    known = [
        "output/base",
        "./output/base/",
        "output//base",
        "output/base/../base",
        str(workspace / "output" / "base"),
        "models/rlbench/tiny-qwen2",
        "output",
        ".",
        "data",
        "code",
        "models",
        "output/nope",
        "output/base/config.json",
        "../grader",
        "../grader/snapshots",
        "/",
        "/etc",
        "~",
        "",
        "   ",
    ]
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known),
        st.sampled_from(known).map(lambda p: p + "\x00"),
        st.text(max_size=60),
        odd_text,
        st.lists(st.sampled_from(["output", "base", "..", ".", "", "models", "x" * 300, "\ud800"]), max_size=6).map(
            "/".join
        ),
        st.integers(min_value=200, max_value=6000).map(lambda n: "output/" + "a" * n),
        json_values,
    )


gpu_values = st.one_of(
    st.none(),
    st.sampled_from(["0", "1", "0,1", "1,0", " 1 ", "2", "", ",", "0,,1", "cuda:0", "-1"]),
    st.integers(min_value=-3, max_value=3),
    odd_text,
    json_values,
)


def sized(size: int, pattern: bytes) -> bytes:
    return (pattern * (size // len(pattern) + 1))[:size]


def bodies(workspace: Path) -> st.SearchStrategy:
    """Request bodies for POST /submit."""
    submissions = st.fixed_dictionaries(
        {"model_path": model_paths(workspace)}, optional={"gpu": gpu_values, "note": json_values}
    )
    return st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        submissions.map(lambda d: json.dumps(d).encode()),
        submissions.map(lambda d: json.dumps(d).encode()),
        submissions.map(lambda d: json.dumps(d).replace('"', '\\"').encode()),  # the reference's escaped form
        st.tuples(st.integers(min_value=1, max_value=70_000), st.sampled_from([b"[", b"{", b'{"a":', b"[1,"])).map(
            lambda t: sized(t[0], t[1])
        ),
        st.integers(min_value=MAX_BODY_BYTES - 40, max_value=MAX_BODY_BYTES + 40).map(
            lambda n: json.dumps({"model_path": "a" * n}).encode()
        ),
        st.tuples(
            st.one_of(
                st.integers(min_value=MAX_BODY_BYTES - 8, max_value=MAX_BODY_BYTES + 8),
                st.integers(min_value=0, max_value=3 * MAX_BODY_BYTES),
            ),
            st.binary(min_size=1, max_size=8),
        ).map(lambda t: sized(*t)),
    )


content_types = st.sampled_from(
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=utf-16",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/octet-stream",
        "",
        "*/*",
    ]
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])


def url_paths(secret: str) -> st.SearchStrategy:
    segment = st.one_of(
        st.sampled_from(
            [secret, secret, "submit", "submit", "time", "health", "", "", ".", "..", "wrong", secret + "x"]
        ),
        st.sampled_from(["%73ubmit", "submit%2F", "%2F", "%00", "%ff", "%", "%zz", "submit;x", "submit?x=1"]),
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~%", max_size=12),
    )
    return st.tuples(st.lists(segment, max_size=5), st.sampled_from(["/", "//", "///"]), st.booleans()).map(
        lambda t: t[1] + "/".join(t[0]) + ("/" if t[2] else "")
    )


@st.composite
def raw_requests(draw, secret: str) -> tuple[bytes, str, bool]:
    """(bytes on the wire, method, whether a response is due before the client gives up)."""
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]))
    target = draw(st.sampled_from([f"/{secret}/submit", f"//{secret}//submit/", f"/{secret}/time", "/x/submit"]))
    version = draw(st.sampled_from(["HTTP/1.1"] * 6 + ["HTTP/1.0"] * 2 + ["HTTP/2.0", "HTTX/1.1"]))
    body = draw(
        st.one_of(
            st.sampled_from([b'{"model_path": "output/base"}', b'{"model_path": "output/nope"}', b"{}", b""]),
            st.binary(max_size=200),
        )
    )
    framing = draw(
        st.sampled_from(
            ["exact", "short", "long", "huge", "invalid", "duplicate", "none", "chunked", "bad_chunked", "both"]
        )
    )
    headers = [("Host", "fuzz")]
    headers.append(("Content-Type", draw(st.sampled_from(["application/json", "text/plain", "", "x" * 200]))))
    expected = True
    wire_body = body
    if framing == "exact":
        headers.append(("Content-Length", str(len(body))))
    elif framing == "short":  # fewer declared than sent: the rest reads as a (bad) next request
        headers.append(("Content-Length", str(draw(st.integers(0, max(0, len(body) - 1))))))
    elif framing == "long":  # more declared than sent: the server waits for the rest
        declared = len(body) + draw(st.integers(1, 2 * MAX_BODY_BYTES))
        headers.append(("Content-Length", str(declared)))
        expected = declared > DRAIN_MAX_BYTES
    elif framing == "huge":  # answered at once with a 413, without reading
        headers.append(("Content-Length", str(draw(st.integers(DRAIN_MAX_BYTES + 1, 10**30)))))
    elif framing == "invalid":
        headers.append(("Content-Length", draw(st.sampled_from(["abc", "-1", "1e3", "0x10", "", " ", "+5", "1 2"]))))
    elif framing == "duplicate":
        headers += [("Content-Length", str(len(body))), ("Content-Length", str(len(body) + draw(st.integers(0, 1))))]
    elif framing in ("chunked", "bad_chunked", "both"):
        headers.append(("Transfer-Encoding", "chunked"))
        if framing == "both":
            headers.append(("Content-Length", str(len(body))))
        sizes = draw(st.lists(st.integers(1, 64), max_size=8))
        chunks, rest = [], body
        for size in sizes:
            if rest:
                chunks.append(rest[:size])
                rest = rest[size:]
        if rest:
            chunks.append(rest)
        wire_body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        if framing == "bad_chunked":
            wire_body = draw(st.sampled_from([b"zz\r\n", b"5\r\nab\r\n0\r\n\r\n", b"-1\r\n", b"fffffffff\r\nab"]))
            expected = not wire_body.startswith(b"fffffffff")  # that one leaves the server waiting for data
    extra = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["X-Fuzz", "Expect", "Connection", "Accept", "X-" + "h" * 40]),
                st.sampled_from(["1", "100-continue", "close", "keep-alive", "*/*", "v" * 100]),
            ),
            max_size=3,
        )
    )
    headers += extra
    if draw(st.booleans()) and draw(st.booleans()):  # a header over h11's 16 KiB limit, now and then
        headers.append(("X-Huge", "h" * draw(st.sampled_from([1000, 20_000]))))
    if ("Expect", "100-continue") in extra and framing in ("long", "bad_chunked"):
        expected = False
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("latin-1") + wire_body, method, expected


# -- the run -------------------------------------------------------------------------------------
def copy_model(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    for path in dest.rglob("*"):
        path.chmod(0o644)
    return dest


def run_fuzz(server, n_bodies: int, n_paths: int, n_raw: int) -> tuple[Figures, list[dict]]:
    fuzzer = Fuzzer(server)
    workspace = server.grader.config.workspace
    common = dict(
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )

    @settings(max_examples=n_bodies, **common)
    @given(body=bodies(workspace), content_type=content_types)
    def fuzz_bodies(body: bytes, content_type: str | None) -> None:
        fuzzer.post_body(body, content_type)

    # Small bodies only: sizes are fuzz_bodies' job, and uvicorn resets a connection it closes
    # with a large unread body (a 404 or 405 never reads it), before the client reads the answer.
    small = st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()))

    @settings(max_examples=n_paths, **common)
    @given(method=methods, path=url_paths(fuzzer.secret), body=st.one_of(st.none(), small))
    def fuzz_paths(method: str, path: str, body: bytes | None) -> None:
        fuzzer.request(method, path, body)

    @settings(max_examples=n_raw, **common)
    @given(request=raw_requests(fuzzer.secret))
    def fuzz_raw(request: tuple[bytes, str, bool]) -> None:
        fuzzer.raw(*request)

    fuzz_bodies()
    fuzz_paths()
    fuzz_raw()
    time.sleep(0.5)  # a request whose client gave up may still be finishing
    server.grader.drain()
    return fuzzer.figures, check_records(server, fuzzer.figures)


def check_records(server, figures: Figures) -> list[dict]:
    """The ledger after fuzzing: strict JSON, complete, consistent with /health and scores.json."""
    grader = server.grader
    lines = [line for line in grader.ledger_path.read_bytes().splitlines() if line.strip()]
    entries = [strict_json(line) for line in lines]
    health = requests.get(f"{server.url}/health", timeout=30).json()
    assert health["requests"] == len(entries) == len(grader.entries)
    assert not any(e.get("pending") for e in entries) and not any(e.get("pending") for e in grader.entries)
    ids = sorted(e["submission_id"] for e in entries)
    assert ids == list(range(1, len(entries) + 1))
    assert set(ids) == figures.answered_ids  # every recorded request was answered, and vice versa
    by_id = sorted(entries, key=lambda e: e["submission_id"])
    workspace = grader.config.workspace
    assert strict_json((workspace / "scores.json").read_bytes()) == reference_view(by_id)
    strict_json((workspace / "submissions.json").read_bytes())
    assert not any(e.get("status") == "grader_error" for e in entries)
    assert not list(grader.snapshots.glob("*/eval")), "the fuzzing must never run an evaluation"
    return entries


def report(figures: Figures, entries: list[dict], seconds: float, capsys, name: str) -> dict:
    summary = figures.summary(entries, seconds)
    with capsys.disabled():
        print(f"\n{name} figures: {json.dumps(summary, sort_keys=True)}")
    out = os.environ.get("RLBENCH_FIGURES_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


@pytest.fixture
def fuzz_server(workspace, start_grader, tiny_model):
    copy_model(tiny_model, workspace / "output" / "base")
    # A deadline far away: a long run must not turn into a run of deadline_passed refusals.
    return start_grader(workspace, timeout_s=10**6, gpus=GPUS)


def test_fuzz_grading_api(fuzz_server, capsys):
    started = time.time()
    figures, entries = run_fuzz(fuzz_server, n_bodies=900, n_paths=450, n_raw=650)
    summary = report(figures, entries, time.time() - started, capsys, "fuzz")
    assert summary["5xx"] == 0 and summary["ledger_entries"] > 0


@pytest.mark.slow
def test_fuzz_grading_api_long(fuzz_server, capsys):
    started = time.time()
    figures, entries = run_fuzz(fuzz_server, n_bodies=2400, n_paths=1200, n_raw=1400)
    summary = report(figures, entries, time.time() - started, capsys, "fuzz_long")
    assert summary["5xx"] == 0
