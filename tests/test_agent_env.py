"""The reference agents' client follows the contract: a retryable 503 is submitted again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def scripted_grader(answers: list[tuple[int, dict]]):
    """A grading server that answers /submit with `answers`, in order; yields its URL and the requests' bodies."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, body = answers[len(seen) - 1]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 503:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/secret", seen
    finally:
        server.shutdown()


def run_client(script: str, workspace: Path, url: str) -> subprocess.CompletedProcess:
    """`script` run as a reference agent's code, with agent_env importable and the contract's variables."""
    (workspace / "output" / "v1").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "WORKSPACE": str(workspace),
        "MODEL_PATH": str(workspace / "models"),
        "OUTPUT_DIR": str(workspace / "output"),
        "GRADING_SERVER_URL": url,
        "PYTHONPATH": str(REPO / "scripts" / "agents"),
    }
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=workspace, capture_output=True, text=True)


def test_submit_retries_a_retryable_grader_error_and_nothing_else(tmp_path):
    answers = [
        (503, {"status": "grader_error", "retryable": True, "score": 0.0, "error": "grader failed"}),
        (200, {"status": "scored", "score": 12.5}),
        (422, {"status": "failed", "score": 0.0, "error": "model failed"}),
    ]
    script = (
        "import json, agent_env\n"
        "first = agent_env.submit(agent_env.OUTPUT_DIR / 'v1')\n"
        "second = agent_env.submit(agent_env.OUTPUT_DIR / 'v1')\n"
        "print(json.dumps([first, second]))\n"
    )
    with scripted_grader(answers) as (url, seen):
        proc = run_client(script, tmp_path, url)
    assert proc.returncode == 0, proc.stderr
    first, second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first == {"status": "scored", "score": 12.5}  # the 503 was retried once
    assert second is None  # a model failure (422) is not retried
    assert seen == [{"model_path": "output/v1"}] * 3


def test_submit_sends_task_only_when_given(tmp_path):
    answers = [
        (200, {"status": "scored", "score": 1.0}),
        (503, {"status": "grader_error", "retryable": True, "score": 0.0, "error": "grader failed"}),
        (200, {"status": "scored", "score": 2.0}),
    ]
    script = (
        "import agent_env\n"
        "agent_env.submit(agent_env.OUTPUT_DIR / 'v1')\n"
        "agent_env.submit(agent_env.OUTPUT_DIR / 'v1', task='all')\n"
    )
    with scripted_grader(answers) as (url, seen):
        proc = run_client(script, tmp_path, url)
    assert proc.returncode == 0, proc.stderr
    # The retry of a grader error sends the same request, task included.
    assert seen == [{"model_path": "output/v1"}] + [{"model_path": "output/v1", "task": "all"}] * 2
